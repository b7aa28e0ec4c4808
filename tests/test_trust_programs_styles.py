"""Training and inference programs in styles people publish (a timm-style ViT, a torchvision-style ResNet, a CLIP-style
contrastive pair of towers, a seq2seq GRU with attention, a small U-Net, knowledge distillation), run eagerly under
torch and under tilewise (``import tilewise as torch``) from the same initial weights and batches, as in
``test_trust_programs.py``, whose helpers these use. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, N, C, H, W)

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A timm-style ViT: a patch embedding convolution, a class token and position embedding concatenated in, blocks with a
# qkv Linear split by reshape/permute/unbind into F.scaled_dot_product_attention, LayerScale (gamma * x and an in-place
# mul_ variant), DropPath (identity at rate 0, its per-sample mask kept), trunc_normal_ init through apply, AdamW with
# decay groups, a LambdaLR warmup-cosine, label smoothing, and top-k accuracy under torch.no_grad.

def vit(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional

    def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
        if drop_prob == 0.0 or not training:
            return x
        keep_prob = 1 - drop_prob
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
        if keep_prob > 0.0 and scale_by_keep:
            random_tensor.div_(keep_prob)
        return x * random_tensor

    class DropPath(nn.Module):
        def __init__(self, drop_prob=0.0):
            super().__init__()
            self.drop_prob = drop_prob

        def forward(self, x):
            return drop_path(x, self.drop_prob, self.training)

        def extra_repr(self):
            return f"drop_prob={round(self.drop_prob, 3):0.3f}"

    class LayerScale(nn.Module):
        def __init__(self, dim, init_values=1e-5, inplace=False):
            super().__init__()
            self.inplace = inplace
            self.gamma = nn.Parameter(init_values * torch.ones(dim))

        def forward(self, x):
            return x.mul_(self.gamma) if self.inplace else x * self.gamma

    class Attention(nn.Module):
        fused_attn = True

        def __init__(self, dim, num_heads=2, qkv_bias=False, qk_norm=False):
            super().__init__()
            self.num_heads = num_heads
            self.head_dim = dim // num_heads
            self.scale = self.head_dim ** -0.5
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
            self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
            self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
            self.attn_drop = nn.Dropout(0.0)
            self.proj = nn.Linear(dim, dim)
            self.proj_drop = nn.Dropout(0.0)

        def forward(self, x):
            B, N, C = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            if self.fused_attn:
                x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
            else:
                q = q * self.scale
                attn = q @ k.transpose(-2, -1)
                attn = attn.softmax(dim=-1)
                attn = self.attn_drop(attn)
                x = attn @ v
            x = x.transpose(1, 2).reshape(B, N, C)
            return self.proj_drop(self.proj(x))

    class Mlp(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, dim, num_heads, fused, inplace, qk_norm):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim, eps=1e-6)
            self.attn = Attention(dim, num_heads, qkv_bias=True, qk_norm=qk_norm)
            self.attn.fused_attn = fused
            self.ls1 = LayerScale(dim, 0.1, inplace=inplace)
            self.drop_path1 = DropPath(0.0)
            self.norm2 = nn.LayerNorm(dim, eps=1e-6)
            self.mlp = Mlp(dim, dim * 2)
            self.ls2 = LayerScale(dim, 0.1, inplace=inplace)
            self.drop_path2 = DropPath(0.0)

        def forward(self, x):
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
            x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
            return x

    class VisionTransformer(nn.Module):
        def __init__(self, img_size=8, patch_size=4, in_chans=3, num_classes=5, embed_dim=16, depth=2, num_heads=2):
            super().__init__()
            self.patch_embed = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
            num_patches = (img_size // patch_size) ** 2
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
            self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * 0.02)
            self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, fused=i % 2 == 0, inplace=i == 1, qk_norm=i == 1)
                                          for i in range(depth)])
            self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
            self.head = nn.Linear(embed_dim, num_classes)
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            nn.init.normal_(self.cls_token, std=1e-6)
            self.apply(self._init_weights)

        @staticmethod
        def _init_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

        @torch.jit.ignore
        def no_weight_decay(self):
            return {"pos_embed", "cls_token"}

        def forward_features(self, x):
            x = self.patch_embed(x).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
            x = x + self.pos_embed
            return self.norm(self.blocks(x))

        def forward(self, x):
            x = self.forward_features(x)
            return self.head(x[:, 0])

    def accuracy(output, target, topk=(1,)):
        maxk = min(max(topk), output.size()[1])
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.reshape(1, -1).expand_as(pred))
        return [correct[:min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / batch_size for k in topk]

    model = VisionTransformer()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": [], "acc": []}
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name.endswith(".bias") or name in skip else decay).append(param)
    optimizer = torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.05}],
                                  lr=2e-3, betas=(0.9, 0.999), eps=1e-8)
    warmup, total = 2, len(batches)

    def lr_lambda(step):
        if step < warmup:
            return float(step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        model.train()
        output = model(x)
        loss = criterion(output, y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, norm_type=2.0)
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(scheduler.get_last_lr())
        model.eval()
        with torch.no_grad():
            acc1, acc3 = accuracy(model(x), y, topk=(1, 3))
        record["acc"].append([acc1.item(), acc3.item()])
    path = DropPath(0.25)
    record["extra_repr"] = repr(path)
    mask = drop_path(torch.ones(64, 3, 2), 0.25, training=True)
    record["drop_path_values"] = sorted(set(np.unique(numpy_of(mask)).round(5).tolist()))
    record["drop_path_rows"] = bool((mask == mask[:, :1, :1]).all())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def vit_batches(rng, steps=5, batch=4):
    return [(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, batch)) for _ in range(steps)]


def test_timm_style_vit_with_layer_scale_drop_path_and_warmup_cosine_trains_like_torch():
    ours, theirs = run_both(vit, vit_batches(np.random.default_rng(1)))
    assert ours.pop("extra_repr") == theirs.pop("extra_repr")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A torchvision-style ResNet: BasicBlock with an nn.Sequential downsample, kaiming_normal_(mode="fan_out") through
# model.apply, zero-initialised last BatchNorm of each block, a custom Dataset with a collate_fn through
# DataLoader(num_workers=0), SGD with Nesterov momentum and decay, LinearLR warmup then MultiStepLR (SequentialLR), a
# GradScaler enabled on the CPU with accumulation and clipping, top-k accuracy with AverageMeter-style running sums,
# and a checkpoint round trip through an in-memory buffer into a model loaded with strict=False.

def resnet(torch, init, images, labels, accumulate=2):
    import io

    nn = torch.nn

    def conv3x3(in_planes, out_planes, stride=1):
        return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample
            self.stride = stride

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self, layers=(1, 1), num_classes=4, zero_init_residual=True):
            super().__init__()
            self.inplanes = 4
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(self.inplanes)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(BasicBlock, 4, layers[0])
            self.layer2 = self._make_layer(BasicBlock, 8, layers[1], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(8 * BasicBlock.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)
            if zero_init_residual:
                for m in self.modules():
                    if isinstance(m, BasicBlock) and m.bn2.weight is not None:
                        nn.init.constant_(m.bn2.weight, 0)

        def _make_layer(self, block, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * block.expansion))
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            layers.extend(block(self.inplanes, planes) for _ in range(1, blocks))
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer2(self.layer1(x))
            x = torch.flatten(self.avgpool(x), 1)
            return self.fc(x)

    class ImageSet(torch.utils.data.Dataset):
        def __init__(self, images, labels, transform=None):
            self.images, self.labels, self.transform = images, labels, transform

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, idx):
            if torch.is_tensor(idx):
                idx = idx.tolist()
            image = torch.from_numpy(self.images[idx])
            if self.transform:
                image = self.transform(image)
            return {"image": image, "label": int(self.labels[idx]), "index": idx}

    def normalize(image, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)):
        mean = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
        return image.sub(mean).div_(std)

    def collate(samples):
        images = torch.stack([s["image"] for s in samples])
        labels = torch.tensor([s["label"] for s in samples], dtype=torch.long)
        return images, labels, [s["index"] for s in samples]

    class AverageMeter:
        def __init__(self):
            self.sum, self.count = 0.0, 0

        def update(self, val, n=1):
            self.sum += val * n
            self.count += n

        @property
        def avg(self):
            return self.sum / self.count

    def accuracy(output, target, topk=(1,)):
        with torch.no_grad():
            maxk = max(topk)
            batch_size = target.size(0)
            _, pred = output.topk(maxk, 1, True, True)
            pred = pred.t()
            correct = pred.eq(target.view(1, -1).expand_as(pred))
            res = []
            for k in topk:
                correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
                res.append(correct_k.mul_(100.0 / batch_size))
            return res

    model = ResNet()
    model = model.to(memory_format=torch.channels_last)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": [], "scale": [], "acc": []}
    dataset = ImageSet(images, labels, transform=normalize)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=False, num_workers=0, collate_fn=collate,
                                         drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=2)
    steps = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1, 2], gamma=0.5)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers=[warm, steps], milestones=[2])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    criterion = nn.CrossEntropyLoss()
    loss_meter, top1 = AverageMeter(), AverageMeter()
    for _epoch in range(2):
        model.train()
        for i, (x, y, index) in enumerate(loader):
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", enabled=False):
                output = model(x)
                loss = criterion(output, y) / accumulate
            scaler.scale(loss).backward()
            loss_meter.update(loss.item() * accumulate, x.size(0))
            if (i + 1) % accumulate == 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), 2.0)
                record["grads"].append(gradients(model))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            record["loss"].append(loss.item())
            record["scale"].append(scaler.get_scale())
            record["index"] = index
        scheduler.step()
        record["lr"].append(scheduler.get_last_lr())
        model.eval()
        with torch.no_grad():
            for x, y, _ in loader:
                acc1, acc2 = accuracy(model(x), y, topk=(1, 2))
                top1.update(acc1[0], x.size(0))
                record["acc"].append([acc1.item(), acc2.item()])
    record["avg"] = [loss_meter.avg, float(top1.avg)]
    buffer = io.BytesIO()
    torch.save({"epoch": 2, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, map_location="cpu", weights_only=True)
    state = {f"module.{k}": v for k, v in checkpoint["state_dict"].items()}
    state = {k.removeprefix("module."): v for k, v in state.items() if not k.startswith("module.fc.")}
    fresh = ResNet(num_classes=4)
    result = fresh.load_state_dict(state, strict=False)
    record["missing"] = sorted(result.missing_keys)
    record["unexpected"] = sorted(result.unexpected_keys)
    record["scaler_state"] = {k: v for k, v in checkpoint["scaler"].items() if k != "_growth_tracker"}
    record["momentum"] = numpy_of(checkpoint["optimizer"]["state"][0]["momentum_buffer"])
    record["final"] = {k: numpy_of(v) for k, v in fresh.state_dict().items() if not k.startswith("fc.")}
    record["strides"] = list(model.conv1.weight.stride())
    return record


def resnet_data(rng, n=12):
    return rng.random((n, 3, 8, 8)).astype(np.float32), rng.integers(0, 4, n)


def test_torchvision_style_resnet_with_dataset_collate_grad_scaler_and_checkpoint_round_trip_trains_like_torch():
    ours, theirs = run_both(resnet, *resnet_data(np.random.default_rng(2)))
    assert ours.pop("missing") == theirs.pop("missing") and ours.pop("unexpected") == theirs.pop("unexpected")
    assert ours.pop("index") == theirs.pop("index")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A CLIP-style pair of towers: mean-pooled token embeddings with an attention mask, a small conv image tower,
# projections normalised with F.normalize, a learnable logit scale (log(1/0.07)) clamped in place after each step, the
# symmetric cross-entropy over the similarity matrix with torch.arange labels, retrieval recall@k by topk, and Adam with
# a linear three-phase OneCycleLR cycling the momentum.

def clip(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional

    class TextTower(nn.Module):
        def __init__(self, vocab=20, dim=12, out=8):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim, padding_idx=0)
            self.pos = nn.Parameter(torch.empty(6, dim).normal_(std=0.01))
            self.ln = nn.LayerNorm(dim)
            self.proj = nn.Linear(dim, out, bias=False)

        def forward(self, ids, mask):
            x = self.ln(self.tok(ids) + self.pos[: ids.size(1)])
            m = mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-6)
            return self.proj(pooled)

    class ImageTower(nn.Module):
        def __init__(self, out=8):
            super().__init__()
            self.conv = nn.Conv2d(1, 6, 3, stride=2, padding=1, bias=False)  # a bias before BatchNorm gets noise
            self.bn = nn.BatchNorm2d(6)
            self.proj = nn.Linear(6, out)

        def forward(self, x):
            x = F.relu(self.bn(self.conv(x)))
            return self.proj(F.adaptive_avg_pool2d(x, 1).flatten(1))

    class CLIP(nn.Module):
        def __init__(self):
            super().__init__()
            self.text, self.image = TextTower(), ImageTower()
            self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))

        def forward(self, images, ids, mask):
            image_features = F.normalize(self.image(images), dim=-1)
            text_features = F.normalize(self.text(ids, mask), dim=1, p=2.0, eps=1e-12)
            logit_scale = self.logit_scale.exp()
            logits_per_image = logit_scale * image_features @ text_features.t()
            return logits_per_image, logits_per_image.T

    model = CLIP()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": [], "scale": [], "recall": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-2, total_steps=len(batches),
                                                    pct_start=0.3, anneal_strategy="linear", three_phase=True,
                                                    cycle_momentum=True, base_momentum=0.8, max_momentum=0.9)
    for images, ids, mask in batches:
        images, ids, mask = torch.from_numpy(images), torch.from_numpy(ids), torch.from_numpy(mask)
        logits_per_image, logits_per_text = model(images, ids, mask)
        labels = torch.arange(images.shape[0], device=images.device, dtype=torch.long)
        loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
            torch.clamp_(model.logit_scale.data, max=2.5)
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append([optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["betas"][0]])
        record["scale"].append(model.logit_scale.item())
        model.eval()
        with torch.no_grad():
            sims, _ = model(images, ids, mask)
            ranking = sims.topk(2, dim=1).indices
            targets = torch.arange(len(sims)).view(-1, 1)
            record["recall"].append([(ranking[:, :k] == targets).any(dim=1).float().mean().item() for k in (1, 2)])
            record["argsort"] = numpy_of(torch.argsort(sims, dim=1, descending=True))
        model.train()
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def clip_batches(rng, steps=5, batch=5):
    out = []
    for _ in range(steps):
        lengths = rng.integers(2, 7, batch)
        ids = np.zeros((batch, 6), np.int64)
        for i, n in enumerate(lengths):
            ids[i, :n] = rng.integers(1, 20, n)
        out.append((rng.standard_normal((batch, 1, 8, 8)).astype(np.float32), ids, ids != 0))
    return out


def test_clip_style_contrastive_towers_with_logit_scale_and_one_cycle_train_like_torch():
    ours, theirs = run_both(clip, clip_batches(np.random.default_rng(3)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The seq2seq tutorial: an EncoderRNN (Embedding, GRU), an AttnDecoderRNN with Bahdanau attention (Linear Wa, Ua, Va,
# torch.bmm), a decoder loop step by step with teacher forcing on some batches and its own topk(1) on the others,
# log_softmax with NLLLoss, two optimizers, and greedy evaluation under no_grad.

def seq2seq(torch, init, batches, SOS=1, max_length=6):
    nn, F = torch.nn, torch.nn.functional

    class EncoderRNN(nn.Module):
        def __init__(self, input_size, hidden_size):
            super().__init__()
            self.embedding = nn.Embedding(input_size, hidden_size)
            self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
            self.dropout = nn.Dropout(0.0)

        def forward(self, input):
            embedded = self.dropout(self.embedding(input))
            return self.gru(embedded)

    class BahdanauAttention(nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.Wa = nn.Linear(hidden_size, hidden_size)
            self.Ua = nn.Linear(hidden_size, hidden_size)
            self.Va = nn.Linear(hidden_size, 1, bias=False)  # softmax cancels a bias: Adam would scale noise alone

        def forward(self, query, keys):
            scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
            scores = scores.squeeze(2).unsqueeze(1)
            weights = F.softmax(scores, dim=-1)
            context = torch.bmm(weights, keys)
            return context, weights

    class AttnDecoderRNN(nn.Module):
        def __init__(self, hidden_size, output_size):
            super().__init__()
            self.embedding = nn.Embedding(output_size, hidden_size)
            self.attention = BahdanauAttention(hidden_size)
            self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
            self.out = nn.Linear(hidden_size, output_size)

        def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
            batch_size = encoder_outputs.size(0)
            decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS)
            decoder_hidden = encoder_hidden
            decoder_outputs, attentions = [], []
            for i in range(max_length):
                decoder_output, decoder_hidden, attn_weights = self.forward_step(
                    decoder_input, decoder_hidden, encoder_outputs)
                decoder_outputs.append(decoder_output)
                attentions.append(attn_weights)
                if target_tensor is not None:
                    decoder_input = target_tensor[:, i].unsqueeze(1)
                else:
                    _, topi = decoder_output.topk(1)
                    decoder_input = topi.squeeze(-1).detach()
            decoder_outputs = torch.cat(decoder_outputs, dim=1)
            decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
            attentions = torch.cat(attentions, dim=1)
            return decoder_outputs, decoder_hidden, attentions

        def forward_step(self, input, hidden, encoder_outputs):
            embedded = self.embedding(input)
            query = hidden.permute(1, 0, 2)
            context, attn_weights = self.attention(query, encoder_outputs)
            input_gru = torch.cat((embedded, context), dim=2)
            output, hidden = self.gru(input_gru, hidden)
            return self.out(output), hidden, attn_weights

    encoder, decoder = EncoderRNN(10, 8), AttnDecoderRNN(8, 9)
    both = nn.ModuleDict({"encoder": encoder, "decoder": decoder})
    record = {"init": initial_state(torch, both, init), "loss": [], "grads": []}
    encoder_optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-2)
    decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    criterion = nn.NLLLoss()
    for step, (input_tensor, target_tensor) in enumerate(batches):
        input_tensor, target_tensor = torch.from_numpy(input_tensor), torch.from_numpy(target_tensor)
        encoder_optimizer.zero_grad()
        decoder_optimizer.zero_grad()
        encoder_outputs, encoder_hidden = encoder(input_tensor)
        teacher = target_tensor if step % 2 == 0 else None
        decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden, teacher)
        loss = criterion(decoder_outputs.view(-1, decoder_outputs.size(-1)), target_tensor.view(-1))
        loss.backward()
        encoder_optimizer.step()
        decoder_optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(both))
    with torch.no_grad():
        encoder_outputs, encoder_hidden = encoder(torch.from_numpy(batches[0][0]))
        decoder_outputs, decoder_hidden, attentions = decoder(encoder_outputs, encoder_hidden)
        _, topi = decoder_outputs.topk(1)
        record["decoded"] = numpy_of(topi.squeeze())
        record["attentions"] = numpy_of(attentions)
        record["hidden"] = numpy_of(decoder_hidden)
    record["final"] = {k: numpy_of(v) for k, v in both.state_dict().items()}
    return record


def seq2seq_batches(rng, steps=4, batch=3):
    return [(rng.integers(0, 10, (batch, 5)), rng.integers(0, 9, (batch, 6))) for _ in range(steps)]


def test_seq2seq_gru_with_bahdanau_attention_and_teacher_forcing_trains_like_torch():
    ours, theirs = run_both(seq2seq, seq2seq_batches(np.random.default_rng(4)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A small U-Net for segmentation: DoubleConv blocks, MaxPool2d down, bilinear F.interpolate up (align_corners=True) and
# ConvTranspose2d up, skip connections by torch.cat after F.pad to the skip's size, a cross-entropy over (N, C, H, W)
# with ignore_index=255 and class weights plus a soft dice loss on one_hot(...).permute, mean IoU from a confusion
# matrix by bincount, RMSprop with ReduceLROnPlateau(mode="max"), and a predicted mask by argmax.

def unet(torch, init, batches, n_classes=3):
    nn, F = torch.nn, torch.nn.functional

    class DoubleConv(nn.Module):
        def __init__(self, in_channels, out_channels, mid_channels=None):
            super().__init__()
            mid_channels = mid_channels or out_channels
            self.double_conv = nn.Sequential(
                nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(mid_channels), nn.ReLU(inplace=True),
                nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))

        def forward(self, x):
            return self.double_conv(x)

    class Up(nn.Module):
        def __init__(self, in_channels, out_channels, bilinear=True):
            super().__init__()
            self.bilinear = bilinear
            if bilinear:
                self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)
            else:
                self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
                self.conv = DoubleConv(in_channels, out_channels)

        def forward(self, x1, x2):
            if self.bilinear:
                x1 = F.interpolate(x1, scale_factor=2, mode="bilinear", align_corners=True)
            else:
                x1 = self.up(x1)
            diffY = x2.size()[2] - x1.size()[2]
            diffX = x2.size()[3] - x1.size()[3]
            x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
            return self.conv(torch.cat([x2, x1], dim=1))

    class UNet(nn.Module):
        def __init__(self, n_channels=1):
            super().__init__()
            self.inc = DoubleConv(n_channels, 4)
            self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(4, 8))
            self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(8, 8))
            self.up1 = Up(16, 8, bilinear=True)
            self.up2 = Up(8, 4, bilinear=False)
            self.outc = nn.Conv2d(4, n_classes, kernel_size=1)

        def forward(self, x):
            x1 = self.inc(x)
            x2 = self.down1(x1)
            x3 = self.down2(x2)
            x = self.up1(x3, x2)
            x = self.up2(x, x1)
            return self.outc(x)

    def dice_loss(logits, target, epsilon=1e-6):
        valid = (target != 255)
        probs = F.softmax(logits, dim=1).float() * valid.unsqueeze(1)
        onehot = F.one_hot(target.clamp(max=n_classes - 1) * valid, n_classes).permute(0, 3, 1, 2).float()
        onehot = onehot * valid.unsqueeze(1)
        inter = 2 * (probs * onehot).sum(dim=(-1, -2))
        sets_sum = probs.sum(dim=(-1, -2)) + onehot.sum(dim=(-1, -2))
        sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
        dice = (inter + epsilon) / (sets_sum + epsilon)
        return 1 - dice.mean()

    def confusion(pred, target):
        k = (target >= 0) & (target < n_classes)
        inds = n_classes * target[k].to(torch.int64) + pred[k]
        return torch.bincount(inds, minlength=n_classes ** 2).reshape(n_classes, n_classes)

    model = UNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": [], "iou": []}
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, weight_decay=1e-8, momentum=0.9, foreach=True)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=0, factor=0.5)
    criterion = nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 2.0]), ignore_index=255)
    for images, masks in batches:
        images, masks = torch.from_numpy(images), torch.from_numpy(masks)
        model.train()
        masks_pred = model(images)
        loss = criterion(masks_pred, masks) + dice_loss(masks_pred, masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = model(images).argmax(dim=1)
            mat = confusion(pred.flatten(), masks.flatten()).double()
            iu = torch.diag(mat) / (mat.sum(1) + mat.sum(0) - torch.diag(mat))
            miou = torch.nanmean(iu)
        scheduler.step(miou.item())
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(optimizer.param_groups[0]["lr"])
        record["iou"].append([numpy_of(mat), numpy_of(iu), miou.item()])
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def unet_batches(rng, steps=4, batch=2):
    out = []
    for _ in range(steps):
        masks = rng.integers(0, 3, (batch, 8, 8))
        masks[:, 0, :3] = 255
        out.append((rng.standard_normal((batch, 1, 8, 8)).astype(np.float32), masks))
    return out


def test_unet_segmentation_with_ignore_index_dice_and_confusion_matrix_iou_trains_like_torch():
    ours, theirs = run_both(unet, unet_batches(np.random.default_rng(5)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Knowledge distillation into an LSTMCell forecaster: a frozen teacher (requires_grad_(False), eval) over windows made
# by Tensor.unfold, a student stepping an LSTMCell over time, KL divergence of temperature-softened log_softmax with
# reduction="batchmean" times T**2, a Huber regression term, Adamax with a PolynomialLR, and an EMA of the student kept
# with torch._foreach_mul_ / _foreach_add_ under no_grad, buffers copied by lerp_ (weight 1).

def distill(torch, init, series, T=2.0, alpha=0.7):
    nn, F = torch.nn, torch.nn.functional

    class Teacher(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 16), nn.Mish(), nn.BatchNorm1d(16), nn.Linear(16, 4 + 1))

        def forward(self, x):
            out = self.net(x)
            return out[:, :4], out[:, 4]

    class Student(nn.Module):
        def __init__(self, hidden=8):
            super().__init__()
            self.cell = nn.LSTMCell(1, hidden)
            self.cls = nn.Linear(hidden, 4)
            self.reg = nn.Linear(hidden, 1)

        def forward(self, x):
            h = x.new_zeros(x.size(0), self.cell.hidden_size)
            c = torch.zeros_like(h)
            for t in range(x.size(1)):
                h, c = self.cell(x[:, t].unsqueeze(-1), (h, c))
            return self.cls(h), self.reg(h).squeeze(-1)

    teacher, student = Teacher(), Student()
    both = nn.ModuleDict({"teacher": teacher, "student": student})
    record = {"init": initial_state(torch, both, init), "loss": [], "grads": [], "lr": []}
    teacher.eval().requires_grad_(False)
    ema = Student()
    ema.load_state_dict(student.state_dict())
    optimizer = torch.optim.Adamax(student.parameters(), lr=2e-2)
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=4, power=2.0)
    windows = torch.from_numpy(series).unfold(0, 7, 2)
    x_all, y_all = windows[:, :6], windows[:, 6]
    labels_all = torch.bucketize(y_all, torch.tensor([-0.5, 0.0, 0.5]))
    record["windows"] = [list(windows.shape), list(windows.stride()), numpy_of(labels_all)]
    for start in range(0, len(x_all) - 3, 4):
        x, y, labels = x_all[start:start + 4], y_all[start:start + 4], labels_all[start:start + 4]
        with torch.no_grad():
            t_logits, t_reg = teacher(x)
        s_logits, s_reg = student(x)
        soft = F.kl_div(F.log_softmax(s_logits / T, dim=-1), F.softmax(t_logits / T, dim=-1),
                        reduction="batchmean") * T * T
        hard = F.cross_entropy(s_logits, labels)
        loss = alpha * soft + (1 - alpha) * hard + F.huber_loss(s_reg, y, delta=0.5) + 0.1 * F.mse_loss(s_reg, t_reg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            ema_params, params = list(ema.parameters()), list(student.parameters())
            torch._foreach_mul_(ema_params, 0.9)
            torch._foreach_add_(ema_params, params, alpha=0.1)
            for e, b in zip(ema.buffers(), student.buffers()):
                e.lerp_(b, 1.0)
        record["loss"].append([loss.item(), soft.item(), hard.item()])
        record["grads"].append(gradients(student))
        record["lr"].append(scheduler.get_last_lr()[0])
    with torch.no_grad():
        logits, _ = ema(x_all)
        probs = logits.softmax(-1)
        values, indices = probs.topk(2, dim=-1)
        record["ema_eval"] = [numpy_of(values), numpy_of(indices), numpy_of(probs.argmax(-1))]
    record["ema"] = {k: numpy_of(v) for k, v in ema.state_dict().items()}
    record["final"] = {k: numpy_of(v) for k, v in student.state_dict().items()}
    return record


def test_distillation_into_an_lstm_cell_student_with_ema_by_foreach_trains_like_torch():
    series = np.sin(np.linspace(0, 12, 41)).astype(np.float32) + np.random.default_rng(6).normal(0, 0.1, 41).astype(
        np.float32)
    ours, theirs = run_both(distill, series)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# LoRA fine-tuning as peft-style scripts do it: a pretrained MLP-mixer-like model frozen with requires_grad_(False),
# its target Linear layers found by named_modules and swapped for a LoRALinear wrapper with set_submodule, the A matrix
# kaiming_uniform_(a=sqrt(5)) and B zeros, only trainable parameters handed to AdamW (filter on requires_grad), the
# trainable count by numel, a state dict of the adapters alone, and the adapters merged into the base weights with
# addmm_ under no_grad, the merged model's output compared with the adapted one's.

def lora(torch, init, batches, rank=2, alpha=4):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dim=8):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

        def forward(self, x):
            return x + self.fc2(F.silu(self.fc1(self.norm(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(1))

    class LoRALinear(nn.Module):
        def __init__(self, base, r, lora_alpha):
            super().__init__()
            self.base = base
            self.lora_A = nn.Parameter(base.weight.new_zeros((r, base.in_features)))
            self.lora_B = nn.Parameter(base.weight.new_zeros((base.out_features, r)))
            self.scaling = lora_alpha / r
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

        def forward(self, x):
            return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling

        @torch.no_grad()
        def merged(self):
            merged = nn.Linear(self.base.in_features, self.base.out_features)
            merged.weight.copy_(self.base.weight).addmm_(self.lora_B, self.lora_A, alpha=self.scaling)
            merged.bias.copy_(self.base.bias)
            return merged

    model = Net()
    model.requires_grad_(False)
    targets = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and "fc" in name]
    for name in targets:
        model.set_submodule(name, LoRALinear(model.get_submodule(name), rank, alpha))
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    trainable = [p for p in model.parameters() if p.requires_grad]
    record["counts"] = [sum(p.numel() for p in trainable), sum(p.numel() for p in model.parameters())]
    optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()), lr=5e-2, weight_decay=0.0)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    adapters = {k: numpy_of(v) for k, v in model.state_dict().items() if "lora_" in k}
    record["adapters"] = adapters
    model.eval()
    x = torch.from_numpy(batches[0][0])
    with torch.no_grad():
        adapted = model(x)
        for name in targets:
            model.set_submodule(name, model.get_submodule(name).merged(), strict=True)
        merged = model(x)
    record["outputs"] = [numpy_of(adapted), numpy_of(merged)]
    record["merged_keys"] = sorted(model.state_dict().keys())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def lora_batches(rng, steps=4, batch=3):
    return [(rng.standard_normal((batch, 5, 4)).astype(np.float32), rng.integers(0, 3, batch)) for _ in range(steps)]


def test_lora_adapters_swapped_in_by_set_submodule_train_and_merge_like_torch():
    ours, theirs = run_both(lora, lora_batches(np.random.default_rng(8)))
    assert ours.pop("merged_keys") == theirs.pop("merged_keys")
    assert_same(ours, theirs)
    np.testing.assert_allclose(*theirs["outputs"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize(("target", "module", "strict", "error", "message"), [
    ("", "linear", False, ValueError, "Cannot set the submodule without a target name!"),
    ("0", "tensor", False, ValueError, "`module` is not an nn.Module, found"),
    ("2.x", "linear", False, AttributeError, "Sequential has no attribute `2`"),
    ("1.new", "linear", True, AttributeError, "Linear has no attribute `new`"),
    ("1.weight", "linear", False, AttributeError, "`weight` is not an nn.Module"),
])
def test_set_submodule_refuses_as_torch(torch, target, module, strict, error, message):
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()), torch.nn.Linear(2, 2))
    module = torch.nn.Linear(1, 1) if module == "linear" else torch.ones(1)
    with pytest.raises(error, match=re.escape(message)):
        model.set_submodule(target, module, strict=strict)


def test_set_submodule_adds_a_new_child_unless_strict():
    for torch in LIBRARIES:
        model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()))
        model.set_submodule("0.extra", torch.nn.Tanh())
        assert [name for name, _ in model.named_modules()] == ["", "0", "0.0", "0.extra"]


# ----------------------------------------------------------------------------------------------------------------------
# Model ensembling as torch's tutorial writes it: several models' states stacked by torch.func.stack_module_state, one
# functional_call of a base copy vmapped over them (the same minibatch for all, and a minibatch each), then the stacked
# parameters trained directly: a loss over the vmapped output, backward into the stacked leaves, Adam over them.

def ensemble(torch, init, batches, num_models=3):
    import copy

    nn, F = torch.nn, torch.nn.functional
    functional_call, stack_module_state, vmap = torch.func.functional_call, torch.func.stack_module_state, torch.vmap

    class SimpleMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.fc2(F.relu(self.norm(self.fc1(x))))

    models = nn.ModuleList([SimpleMLP() for _ in range(num_models)])
    record = {"init": initial_state(torch, models, init), "loss": [], "grads": []}
    params, buffers = stack_module_state(models)
    record["stacked"] = [sorted(params), [list(p.shape) for p in params.values()],
                         [p.requires_grad and p.is_leaf for p in params.values()], sorted(buffers)]
    base_model = copy.deepcopy(models[0])

    def fmodel(params, buffers, x):
        return functional_call(base_model, (params, buffers), (x,))

    x0 = torch.from_numpy(batches[0][0])
    same = vmap(fmodel, in_dims=(0, 0, None))(params, buffers, x0)
    record["same_minibatch"] = numpy_of(same)
    record["one_by_one"] = [numpy_of(model(x0)) for model in models]
    optimizer = torch.optim.Adam(list(params.values()), lr=1e-2)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        minibatches = x.expand(num_models, *x.shape) + torch.arange(num_models, dtype=x.dtype).view(-1, 1, 1) * 0.1
        logits = vmap(fmodel)(params, buffers, minibatches)
        loss = F.cross_entropy(logits.reshape(-1, 3), y.repeat(num_models))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append({k: numpy_of(p.grad) for k, p in params.items()})
    record["final"] = {k: numpy_of(v) for k, v in params.items()}
    return record


def ensemble_batches(rng, steps=4, batch=5):
    return [(rng.standard_normal((batch, 6)).astype(np.float32), rng.integers(0, 3, batch)) for _ in range(steps)]


def test_model_ensembling_by_stack_module_state_and_vmapped_functional_call_trains_like_torch():
    ours, theirs = run_both(ensemble, ensemble_batches(np.random.default_rng(9)))
    assert ours.pop("stacked") == theirs.pop("stacked")
    assert_same(ours, theirs)
    np.testing.assert_allclose(theirs["same_minibatch"], np.stack(theirs["one_by_one"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", ["none", "modes", "classes", "requires_grad"])
def test_stack_module_state_refuses_as_torch(torch, case):
    nn = torch.nn
    models = {"none": [], "modes": [nn.Linear(2, 2), nn.Linear(2, 2).eval()],
              "classes": [nn.Linear(2, 2), nn.Sequential()], "requires_grad": [nn.Linear(2, 2), nn.Linear(2, 2)]}[case]
    if case == "requires_grad":
        models[1].bias.requires_grad_(False)
    message = {"none": "stack_module_state: Expected at least one model, got 0.",
               "modes": "stack_module_state: Expected all models to have the same training/eval mode.",
               "classes": "stack_module_state: Expected all models to be of the same class.",
               "requires_grad": "Expected bias from each model to have the same .requires_grad"}[case]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.func.stack_module_state(models)


# ----------------------------------------------------------------------------------------------------------------------
# What the programs met, reduced.

def jit_decorated_module(torch):
    """Model code as timm and torchvision write it: TorchScript's decorators and queries, run as plain Python."""
    from typing import Final

    class Head(torch.nn.Module):
        fused: Final[bool]

        def __init__(self):
            super().__init__()
            self.fused = torch.jit.Final is Final
            self.linear = torch.nn.Linear(3, 2)

        @torch.jit.ignore
        def no_weight_decay(self):
            return {"linear.bias"}

        @torch.jit.ignore(drop=True)
        def debug(self):
            return "dropped only when scripted"

        @torch.jit.unused
        def unused(self, x):
            return x

        @torch.jit.export
        def exported(self, x):
            return x + 1

        def forward(self, x):
            if torch.jit.is_scripting() or torch.jit.is_tracing():
                return x
            out = torch.jit.annotate(list[int], [])
            out.append(x.shape[0])
            return self.linear(x), out

    head = Head()
    with torch.no_grad():
        head.linear.weight.copy_(torch.arange(6.0).reshape(2, 3))
        head.linear.bias.zero_()
    y, sizes = head(torch.ones(4, 3))
    return [head.fused, sorted(head.no_weight_decay()), head.debug(), numpy_of(head.unused(torch.ones(2))),
            numpy_of(head.exported(torch.ones(2))), numpy_of(y), sizes,
            [getattr(fn, "_torchscript_modifier", None) is not None for fn in
             (Head.no_weight_decay, Head.debug, Head.unused, Head.exported)]]


def test_torch_jit_decorators_and_queries_leave_model_code_running_as_python():
    ours, theirs = jit_decorated_module(tilewise), jit_decorated_module(real_torch)
    assert ours[:3] == theirs[:3] and ours[6:] == theirs[6:]
    assert_same(ours[3:6], theirs[3:6])


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_torch_jit_ignore_of_a_non_bool_raises_as_torch(torch):
    with pytest.raises(RuntimeError, match="Argument to @torch.jit.ignore must be a bool or a function but got 3"):
        torch.jit.ignore(3)


def causal_attention_with_a_mask(torch, mask_kind, shape=(1, 2, 3, 4), source=3, dtype="float32"):
    rng = np.random.default_rng(7)
    q = torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype), requires_grad=True)
    kv_shape = shape[:-2] + (source, shape[-1])
    k = torch.tensor(rng.standard_normal(kv_shape), dtype=getattr(torch, dtype), requires_grad=True)
    v = torch.tensor(rng.standard_normal(kv_shape), dtype=getattr(torch, dtype), requires_grad=True)
    keep = rng.random((shape[-2], source)) > 0.3
    keep[1:, 0] = True
    keep[0] = [False] + [True] * (source - 1)  # the first row: causal leaves key 0 alone, the mask removes it
    mask = {"bool": torch.tensor(keep), "float": torch.tensor(np.where(keep, 0.5, -2.0).astype(dtype)),
            "broadcast": torch.tensor(keep[:, :1])}[mask_kind]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    out.backward(torch.ones_like(out))
    return [numpy_of(out.float()), numpy_of(q.grad.float()), numpy_of(k.grad.float()), numpy_of(v.grad.float()),
            list(out.stride())]


@pytest.mark.parametrize("mask_kind", ["bool", "float", "broadcast"])
@pytest.mark.parametrize(("shape", "source"), [((1, 2, 3, 4), 3), ((2, 1, 2, 4), 4), ((1, 2, 4, 8), 2)])
def test_attention_on_the_cpu_with_a_mask_and_is_causal_masks_by_both_as_torch(mask_kind, shape, source):
    """On the CPU torch's flash kernel (4-D inputs, a 2-D or 4-D mask that needs no gradient) takes an attention
    mask together with is_causal: a key is seen where both allow it, a float mask is added where causal allows."""
    assert_same(causal_attention_with_a_mask(tilewise, mask_kind, shape, source),
                causal_attention_with_a_mask(real_torch, mask_kind, shape, source))


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("call", [
    lambda F, t: F.scaled_dot_product_attention(t.ones(2, 3, 4), t.ones(2, 3, 4), t.ones(2, 3, 4),
                                                attn_mask=t.ones(3, 3, dtype=t.bool), is_causal=True),
    lambda F, t: F.scaled_dot_product_attention(t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4),
                                                attn_mask=t.ones(1, 3, 3, dtype=t.bool), is_causal=True),
    lambda F, t: F.scaled_dot_product_attention(t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4),
                                                attn_mask=t.ones(3, 3, requires_grad=True), is_causal=True),
    lambda F, t: F.scaled_dot_product_attention(t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4), t.ones(1, 2, 3, 4),
                                                attn_mask=t.ones(3, 3, dtype=t.bool), is_causal=True, dropout_p=0.5),
], ids=["3d-inputs", "3d-mask", "mask-requiring-grad", "dropout"])
def test_attention_with_a_mask_and_is_causal_off_the_cpu_flash_kernel_raises_as_torch(torch, call):
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        call(torch.nn.functional, torch)


def autocast_with_an_unsupported_cpu_dtype(torch, dtype):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            inside = [torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu")).split(".")[-1],
                      str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype).split(".")[-1]]
    messages = [str(w.message).replace("tilewise.", "torch.") for w in caught if w.category is UserWarning]
    return inside, messages, torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_cpu_autocast_with_an_unsupported_dtype_warns_and_turns_itself_off_as_torch(dtype):
    """A training script that passes ``dtype=torch.float32`` (or float64) to CPU autocast runs in full precision
    under torch, with a warning, rather than failing."""
    assert autocast_with_an_unsupported_cpu_dtype(tilewise, dtype) == \
        autocast_with_an_unsupported_cpu_dtype(real_torch, dtype)


def encoder_with_mismatched_masks(torch, layer_only, training):
    import warnings

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    module = layer if layer_only else torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.tensor(np.linspace(-1, 1, 2 * 5 * 8, dtype=np.float32).reshape(2, 5, 8))
    padding = torch.tensor([[False, False, False, True, True], [False] * 5])
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    module.train(training)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if layer_only:
            module(x, src_mask=causal, src_key_padding_mask=padding)
        else:
            module(x, mask=causal, src_key_padding_mask=padding)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("layer_only", [False, True], ids=["encoder", "layer"])
def test_transformer_encoder_with_a_bool_padding_mask_and_a_float_mask_warns_once_as_torch(layer_only, training):
    """torch's encoder (and each encoder layer) turns a bool key padding mask into the float mask's type before its
    layers run: one deprecation warning naming the encoder's arguments, none from the attention inside."""
    assert encoder_with_mismatched_masks(tilewise, layer_only, training) == \
        encoder_with_mismatched_masks(real_torch, layer_only, training)


def checkpoint_with_args(path):
    """What many training scripts save: the weights beside their argparse arguments and a small record class."""
    import argparse

    args = argparse.Namespace(lr=0.1, epochs=3, arch="resnet", layers=[1, 2])
    real_torch.save({"args": args, "epoch": 3, "state_dict": {"w": real_torch.arange(4.0).reshape(2, 2)}}, path)


def load_trusting(torch, path, how):
    import argparse

    if how == "none":
        return torch.load(path)
    if how == "context":
        with torch.serialization.safe_globals([argparse.Namespace]):
            loaded = torch.load(path, weights_only=True)
            declared = argparse.Namespace in torch.serialization.get_safe_globals()
        return loaded, [declared, argparse.Namespace in torch.serialization.get_safe_globals()]
    entry = (argparse.Namespace, "argparse.Namespace") if how == "named" else argparse.Namespace
    before = torch.serialization.get_safe_globals()  # torch declares some of its own classes
    torch.serialization.add_safe_globals([entry])
    try:
        return torch.load(path), [entry in torch.serialization.get_safe_globals()]
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


@pytest.mark.parametrize("how", ["add", "named", "context"])
def test_a_checkpoint_holding_argparse_arguments_loads_once_its_class_is_declared_safe_as_in_torch(tmp_path, how):
    path = tmp_path / "checkpoint.pt"
    checkpoint_with_args(path)
    (ours, our_safe), (theirs, their_safe) = load_trusting(tilewise, path, how), load_trusting(real_torch, path, how)
    assert our_safe == their_safe
    assert vars(ours["args"]) == vars(theirs["args"]) and type(ours["args"]) is type(theirs["args"])
    assert ours["epoch"] == theirs["epoch"]
    assert_same(numpy_of(ours["state_dict"]["w"]), numpy_of(theirs["state_dict"]["w"]))


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_a_checkpoint_holding_an_undeclared_class_names_it_and_add_safe_globals(torch, tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint_with_args(path)
    with pytest.raises(real_torch.serialization.pickle.UnpicklingError,
                       match=r"(?s)argparse\.Namespace.*add_safe_globals\(\[argparse\.Namespace\]\)"):
        load_trusting(torch, path, "none")


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize(("entry", "error", "message"), [
    ((dict, "builtins.dict", 3), ValueError, "Expected tuple of length 2 (global, str of callable full path), but got "
                                             "tuple of length: 3"),
    ((dict, 3), TypeError, "Expected second item in tuple to be str of callable full path, but got: <class 'int'>"),
])
def test_a_malformed_safe_global_is_refused_at_load_as_in_torch(torch, tmp_path, entry, error, message):
    path = tmp_path / "checkpoint.pt"
    checkpoint_with_args(path)
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([entry])
    try:
        with pytest.raises(error, match=re.escape(message)):
            torch.load(path)
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


# A log-magnitude spectrogram front end as audio models write it (torch.stft of a batch of waveforms with a Hann
# window, the magnitude by .abs(), log1p, then a convolution); the gradient flows back to the waveform.

STFT_CASES = {
    "hann": dict(n_fft=8, hop_length=2, window="hann"),
    "default-hop-centered-constant": dict(n_fft=8, window="hann", pad_mode="constant"),
    "short-window-normalized": dict(n_fft=8, hop_length=3, win_length=5, window="hann5", normalized=True),
    "not-centered-twosided": dict(n_fft=6, hop_length=4, center=False, window="hann6", onesided=False),
    "float64-window": dict(n_fft=8, hop_length=2, window="hann64"),
    "real-pairs": dict(n_fft=8, hop_length=4, window="hann", return_complex=False),
    "method-1d": dict(n_fft=8, hop_length=2, window="hann", batch=False),
}


def spectrogram(torch, options):
    options = dict(options)
    batch = options.pop("batch", True)
    window = options.pop("window")
    size = {"hann": 8, "hann5": 5, "hann6": 6, "hann64": 8}[window]
    dtype = torch.float64 if window == "hann64" else torch.float32
    options["window"] = torch.hann_window(size, dtype=dtype)
    options.setdefault("return_complex", True)
    wave = np.sin(np.linspace(0, 20, 2 * 30)).astype(np.float32).reshape(2, 30) + np.linspace(-1, 1, 60).reshape(
        2, 30).astype(np.float32)
    x = torch.tensor(wave if batch else wave[0], requires_grad=True)
    spec = x.stft(**options) if not batch else torch.stft(x, **options)
    magnitude = spec.abs() if options["return_complex"] else spec.pow(2).sum(-1).sqrt()
    features = torch.log1p(magnitude)
    conv = torch.nn.Conv1d(features.shape[-2], 3, 3).to(features.dtype)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(np.cos(np.arange(conv.weight.numel())).reshape(tuple(conv.weight.shape))))
        conv.bias.zero_()
    out = conv(features)
    out.square().mean().backward()
    record = [numpy_of(magnitude), list(spec.shape), str(spec.dtype).split(".")[-1], list(spec.stride()),
              numpy_of(out), numpy_of(x.grad)]
    if options["return_complex"]:
        record.append(numpy_of(torch.view_as_real(spec)))
    return record


@pytest.mark.parametrize("case", STFT_CASES)
def test_stft_spectrogram_front_end_matches_torch(case):
    ours, theirs = spectrogram(tilewise, STFT_CASES[case]), spectrogram(real_torch, STFT_CASES[case])
    assert ours[1:4] == theirs[1:4]
    assert_same(ours[:1] + ours[4:], theirs[:1] + theirs[4:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize(("call", "error", "fragment"), [
    (lambda t: t.stft(t.ones(16), 8), RuntimeError, "stft requires the return_complex parameter be given for real "
                                                    "inputs"),
    (lambda t: t.stft(t.ones(16), 32, center=False, return_complex=True), RuntimeError,
     "expected 0 < n_fft < 16, but got n_fft=32"),
    (lambda t: t.stft(t.ones(16), 0, return_complex=True), RuntimeError, "but got n_fft=0"),
    (lambda t: t.stft(t.ones(16), 8, hop_length=0, return_complex=True), RuntimeError,
     "expected hop_length > 0, but got hop_length=0"),
    (lambda t: t.stft(t.ones(16), 8, win_length=10, return_complex=True), RuntimeError,
     "expected 0 < win_length <= n_fft, but got win_length=10"),
    (lambda t: t.stft(t.ones(16), 8, window=t.ones(5), return_complex=True), RuntimeError,
     "expected a 1D window tensor of size equal to win_length=8, but got window with size [5]"),
    (lambda t: t.stft(t.ones(2, 2, 8), 4, return_complex=True), RuntimeError, "expected a 1D or 2D tensor"),
    (lambda t: t.stft(t.ones(16, dtype=t.int64), 4, return_complex=True), RuntimeError,
     "expected a tensor of floating point or complex values"),
    (lambda t: t.stft(t.ones(16, dtype=t.complex64), 8, onesided=True, return_complex=True), RuntimeError,
     "Cannot have onesided output if window or input is complex"),
], ids=["no-return-complex", "n_fft-too-long", "n_fft-zero", "hop-zero", "win-too-long", "window-size", "3d",
        "integers", "complex-onesided"])
def test_stft_refuses_as_torch(torch, call, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        call(torch)


STFT_WARNINGS = """
import warnings, {library} as torch
for _ in range(2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.stft(torch.ones(16), 8, return_complex=False)
    print(sorted(str(w.message).split(".")[0] for w in caught))
"""


def test_stft_without_a_window_and_with_real_pairs_warns_once_in_a_process_as_torch():
    import os
    import subprocess
    import sys

    from childenv import python_path

    def warned(library):
        env = {**os.environ, "PYTHONPATH": python_path()}
        return subprocess.run([sys.executable, "-c", STFT_WARNINGS.format(library=library)], env=env,
                              capture_output=True, text=True, check=True, timeout=120).stdout

    assert warned("tilewise") == warned("torch")


def written_real_view_of_a_spectrum(torch, transposed, source):
    a = torch.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    if source == "view_as_complex":  # the other way round: a complex view of real pairs, written in place
        pairs = (a * 1).reshape(3, 2, 2)
        values = torch.view_as_complex(pairs.transpose(0, 1).contiguous() if transposed else pairs)
        values.mul_(torch.tensor(1.5 - 0.5j, dtype=values.dtype))
        parts = torch.view_as_real(values)
    else:
        spectrum = torch.fft.rfft(a, dim=-1) if source == "rfft" else torch.complex(a, a * 2)
        if transposed:
            spectrum = spectrum.transpose(0, 1)
        parts = torch.view_as_real(spectrum)
        parts.mul_(2)
    weights = torch.arange(float(parts.numel())).reshape(parts.shape)
    total = (parts * weights).sum()
    total.backward()
    return [numpy_of(parts), total.item(), numpy_of(a.grad)]


@pytest.mark.parametrize("source", ["rfft", "complex", "view_as_complex"])
@pytest.mark.parametrize("transposed", [False, True], ids=["as-is", "transposed"])
def test_a_view_reading_its_base_as_another_dtype_written_in_place_differentiates_as_torch(transposed, source):
    """A view of a complex result's parts (or a complex view of real pairs) written in place is recorded on its base
    and made afresh from it in the view's dtype: before, the write was scattered into the complex base with the real
    view's geometry, past the end of its memory."""
    assert_same(written_real_view_of_a_spectrum(tilewise, transposed, source),
                written_real_view_of_a_spectrum(real_torch, transposed, source))


@pytest.mark.parametrize(("shape", "strides", "offset"), [((3, 3, 2), (6, 2, 1), 0), ((2,), (1,), 8), ((2,), (-1,), 0)])
def test_view_scatter_refuses_a_view_reaching_outside_its_base(shape, strides, offset):
    """The record of an in-place write through a view never writes past its base's memory."""
    from tilewise.ops.registry import OPS

    with pytest.raises(RuntimeError, match="reaches outside the 9 elements of self"):
        OPS["view_scatter"](tilewise.zeros(9), tilewise.ones(shape), shape, strides, offset)


def cuda_autocast_on_a_machine_without_cuda(torch):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cuda"):
            inside = [torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda"),
                      str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype).split(".")[-1]]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=False):
            inside.append(torch.is_autocast_enabled("cuda"))
    return inside, [str(w.message) for w in caught]


@pytest.mark.skipif(real_torch.cuda.is_available() or tilewise.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_autocast_without_cuda_warns_and_turns_itself_off_as_torch():
    """The common ``with torch.autocast("cuda"):`` run on a machine without a GPU: torch warns once per region and
    leaves autocast off."""
    assert cuda_autocast_on_a_machine_without_cuda(tilewise) == cuda_autocast_on_a_machine_without_cuda(real_torch)


SPECIAL_CALLS = {
    "expit": lambda s, x: s.expit(x), "logit": lambda s, x: s.logit(x.sigmoid(), eps=1e-6),
    "gammaln": lambda s, x: s.gammaln(x.abs() + 0.5), "digamma": lambda s, x: s.digamma(x.abs() + 0.5),
    "psi": lambda s, x: s.psi(x.abs() + 0.5), "polygamma": lambda s, x: s.polygamma(1, x.abs() + 0.5),
    "multigammaln": lambda s, x: s.multigammaln(x.abs() + 2.0, 2), "erf": lambda s, x: s.erf(x),
    "erfc": lambda s, x: s.erfc(x), "erfinv": lambda s, x: s.erfinv(x.tanh() * 0.9), "exp2": lambda s, x: s.exp2(x),
    "expm1": lambda s, x: s.expm1(x), "log1p": lambda s, x: s.log1p(x.abs()), "i0": lambda s, x: s.i0(x),
    "i1": lambda s, x: s.i1(x), "sinc": lambda s, x: s.sinc(x), "round": lambda s, x: s.round(x * 10, decimals=1),
    "xlogy": lambda s, x: s.xlogy(x, x.abs() + 0.1), "softmax": lambda s, x: s.softmax(x, 1),
    "log_softmax": lambda s, x: s.log_softmax(x, dim=-1, dtype=None), "logsumexp": lambda s, x: s.logsumexp(x, 1),
    "ndtr": lambda s, x: s.ndtr(x), "ndtri": lambda s, x: s.ndtri(x.sigmoid()), "log_ndtr": lambda s, x: s.log_ndtr(x),
    "erfcx": lambda s, x: s.erfcx(x), "entr": lambda s, x: s.entr(x.abs() + 0.1), "i0e": lambda s, x: s.i0e(x),
    "i1e": lambda s, x: s.i1e(x), "xlog1py": lambda s, x: s.xlog1py(x, x.abs()),
}


@pytest.mark.parametrize("name", SPECIAL_CALLS)
def test_torch_special_functions_match_torch(name):
    """``torch.special``, where scripts take expit, gammaln, xlogy and the like from: values and gradients."""
    def run(torch):
        x = torch.tensor(np.linspace(-1.5, 1.3, 12).reshape(3, 4), requires_grad=True)
        y = SPECIAL_CALLS[name](torch.special, x)
        if y.requires_grad:
            y.sum().backward()
        return [numpy_of(y), str(y.dtype).split(".")[-1], numpy_of(x.grad) if x.grad is not None else None]

    ours, theirs = run(tilewise), run(real_torch)
    assert ours[1] == theirs[1]
    assert_same([ours[0]] + ours[2:], [theirs[0]] + theirs[2:], rtol=1e-6, atol=1e-8)


def custom_conv_layer_and_ddp_checkpoint(torch):
    """A custom layer written as published ones are (``from torch.nn.modules.utils import _pair``), and a checkpoint
    saved from a DistributedDataParallel model loaded into a plain one with consume_prefix_in_state_dict_if_present."""
    import importlib

    utils = importlib.import_module(f"{torch.__name__}.nn.modules.utils")

    class StdConv2d(torch.nn.Module):
        def __init__(self, cin, cout, kernel_size, stride=1, padding=0):
            super().__init__()
            self.kernel_size, self.stride, self.padding = utils._pair(kernel_size), utils._pair(stride), \
                utils._pair(padding)
            weight = torch.linspace(-1, 1, cout * cin * 9).reshape(cout, cin, *self.kernel_size)
            self.weight = torch.nn.Parameter(weight)

        def forward(self, x):
            w = self.weight
            w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / torch.sqrt(w.var(dim=(1, 2, 3), keepdim=True) + 1e-5)
            padding = utils._reverse_repeat_tuple(self.padding, 2)
            return torch.nn.functional.conv2d(torch.nn.functional.pad(x, padding), w, None, self.stride)

    layer = torch.nn.Sequential(StdConv2d(2, 3, 3, padding=1))
    x = torch.linspace(-1, 1, 2 * 2 * 5 * 5).reshape(2, 2, 5, 5)
    state = layer.state_dict()
    wrapped = type(state)()
    wrapped.update({f"module.{k}": v for k, v in state.items()})
    wrapped._metadata = type(state._metadata)({f"module.{k}" if k else k: v for k, v in state._metadata.items()})
    wrapped._metadata["module"] = {"version": 1}
    utils.consume_prefix_in_state_dict_if_present(wrapped, "module.")
    fresh = torch.nn.Sequential(StdConv2d(2, 3, 3, padding=1))
    fresh.load_state_dict(wrapped)
    return [numpy_of(fresh(x)), list(wrapped), sorted(wrapped._metadata),
            [utils._single(3), utils._triple((1, 2, 3)), utils._quadruple(0), utils._ntuple(2)(4),
             utils._reverse_repeat_tuple((1, 2), 2), utils._list_with_default([None, 4], [1, 2, 7, 8])]]


def test_nn_modules_utils_as_custom_layers_and_ddp_checkpoint_loading_use_them():
    ours, theirs = custom_conv_layer_and_ddp_checkpoint(tilewise), custom_conv_layer_and_ddp_checkpoint(real_torch)
    assert ours[1:] == theirs[1:]
    assert_same(ours[0], theirs[0])


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_list_with_default_refuses_a_size_longer_than_the_input_as_torch(torch):
    import importlib

    utils = importlib.import_module(f"{torch.__name__}.nn.modules.utils")
    with pytest.raises(ValueError, match="Input dimension should be at least 3"):
        utils._list_with_default([None, 4], [7, 8])
