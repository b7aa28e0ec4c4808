"""Training and inference programs in styles people publish (a timm-style ViT, a torchvision-style ResNet, a CLIP-style
contrastive pair of towers, a seq2seq GRU with attention, a small U-Net, knowledge distillation), run eagerly under
torch and under tilewise (``import tilewise as torch``) from the same initial weights and batches, as in
``test_trust_programs.py``, whose helpers these use. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, N, C, H, W)

from __future__ import annotations

import math

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
