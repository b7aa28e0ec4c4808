"""Vision programs in the styles their reference repositories publish, run under torch and under tilewise (``import
tilewise as torch``) from the same initial weights and batches, as in ``test_trust_programs.py``, whose helpers these
use: a ConvNeXt (depthwise 7x7 convolutions, channels-first layer norms written both ways the repositories write them,
pointwise layers as Linear on channels-last activations, layer scale, drop path, channels_last memory format), an
EfficientNet / MobileNetV3 (inverted residuals, squeeze-and-excitation, BatchNorm with TensorFlow's momentum and eps,
RMSprop, an EMA of the weights) and a PixelCNN (masked convolutions of types A and B, gated activations, a 256-way
cross entropy, greedy pixel-by-pixel sampling). Below the programs, the failures they met, each reduced to a test.
"""

# ruff: noqa: N806 — the programs keep the scripts' names (F, kH, kW)

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A ConvNeXt, as the reference repository and timm write it: a patchify stem, blocks of a depthwise 7x7 convolution,
# a layer norm over channels on channels-last activations, an inverted bottleneck of two Linear layers with GELU, layer
# scale (a gamma parameter multiplied in) and drop path; downsampling through a channels-first layer norm (timm's
# permute -> F.layer_norm -> permute back, or the repository's mean / pow / sqrt form) and a strided convolution; the
# model in channels_last memory format. AdamW with parameter groups without decay for norms, biases and gamma, a warmup
# then cosine LambdaLR, label smoothing (CrossEntropyLoss's, or timm's LabelSmoothingCrossEntropy written out). Drop
# path's Bernoulli masks come from the batches (numpy), in place of bernoulli_.

def convnext(torch, init, batches, dims=(8, 16), depths=(2, 1), classes=5, norm_form="permute", smoothing="torch",
             drop_path_rate=0.3, layer_scale=0.5, warmup=2):
    nn, F = torch.nn, torch.nn.functional

    class LayerNorm(nn.Module):
        # the ConvNeXt repository's: channels_last through F.layer_norm, channels_first written out
        def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(normalized_shape))
            self.bias = nn.Parameter(torch.zeros(normalized_shape))
            self.eps, self.data_format = eps, data_format
            self.normalized_shape = (normalized_shape,)

        def forward(self, x):
            if self.data_format == "channels_last":
                return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            return self.weight[:, None, None] * x + self.bias[:, None, None]

    class LayerNorm2d(nn.LayerNorm):
        # timm's: a LayerNorm over the channels of an NCHW tensor
        def forward(self, x):
            x = x.permute(0, 2, 3, 1)
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return x.permute(0, 3, 1, 2)

    def channels_first_norm(dim):
        return LayerNorm2d(dim, eps=1e-6) if norm_form == "permute" else LayerNorm(dim, 1e-6, "channels_first")

    def drop_path(x, keep, drop_prob=0.0, training=False, scale_by_keep=True):
        if drop_prob == 0.0 or not training:
            return x
        keep_prob = 1 - drop_prob
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        random_tensor = x.new_empty(shape).copy_(keep.reshape(shape))  # timm: .bernoulli_(keep_prob)
        if keep_prob > 0.0 and scale_by_keep:
            random_tensor.div_(keep_prob)
        return x * random_tensor

    class DropPath(nn.Module):
        def __init__(self, drop_prob=0.0):
            super().__init__()
            self.drop_prob, self.keep = drop_prob, None

        def forward(self, x):
            return drop_path(x, self.keep, self.drop_prob, self.training)

        def extra_repr(self):
            return f"drop_prob={round(self.drop_prob, 3):0.3f}"

    class Block(nn.Module):
        def __init__(self, dim, drop_path=0.0, layer_scale_init_value=1e-6):
            super().__init__()
            self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
            self.norm = LayerNorm(dim, eps=1e-6)
            self.pwconv1 = nn.Linear(dim, 4 * dim)
            self.act = nn.GELU()
            self.pwconv2 = nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True) \
                if layer_scale_init_value > 0 else None
            self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

        def forward(self, x):
            input = x
            x = self.dwconv(x)
            x = x.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
            x = self.norm(x)
            x = self.pwconv1(x)
            x = self.act(x)
            x = self.pwconv2(x)
            if self.gamma is not None:
                x = self.gamma * x
            x = x.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)
            return input + self.drop_path(x)

    class ConvNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            self.downsample_layers = nn.ModuleList()
            self.downsample_layers.append(nn.Sequential(nn.Conv2d(3, dims[0], kernel_size=2, stride=2),
                                                        channels_first_norm(dims[0])))
            for i in range(len(dims) - 1):
                self.downsample_layers.append(nn.Sequential(channels_first_norm(dims[i]),
                                                            nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2)))
            self.stages = nn.ModuleList()
            dp_rates = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
            cur = 0
            for i in range(len(dims)):
                self.stages.append(nn.Sequential(*[Block(dims[i], dp_rates[cur + j], layer_scale)
                                                   for j in range(depths[i])]))
                cur += depths[i]
            self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
            self.head = nn.Linear(dims[-1], classes)
            self.apply(self._init_weights)
            self.head.weight.data.mul_(2.0)
            self.head.bias.data.mul_(2.0)

        def _init_weights(self, m):
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.2)
                nn.init.constant_(m.bias, 0)

        def forward_features(self, x):
            for downsample, stage in zip(self.downsample_layers, self.stages):
                x = stage(downsample(x))
            return self.norm(x.mean([-2, -1]))  # global average pooling, (N, C, H, W) -> (N, C)

        def forward(self, x):
            return self.head(self.forward_features(x))

    class LabelSmoothingCrossEntropy(nn.Module):
        # timm's
        def __init__(self, smoothing=0.1):
            super().__init__()
            self.smoothing, self.confidence = smoothing, 1.0 - smoothing

        def forward(self, x, target):
            logprobs = F.log_softmax(x, dim=-1)
            nll_loss = -logprobs.gather(dim=-1, index=target.unsqueeze(1))
            nll_loss = nll_loss.squeeze(1)
            smooth_loss = -logprobs.mean(dim=-1)
            loss = self.confidence * nll_loss + self.smoothing * smooth_loss
            return loss.mean()

    model = ConvNeXt()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    model = model.to(memory_format=torch.channels_last)
    record["channels_last"] = [p.is_contiguous(memory_format=torch.channels_last)
                               for p in model.parameters() if p.ndim == 4]

    decay, no_decay = [], []  # timm's param_groups_weight_decay
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name.endswith(".bias") or name.endswith("gamma"):
            no_decay.append(param)
        else:
            decay.append(param)
    optimizer = torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.05}],
                                  lr=4e-3, betas=(0.9, 0.999))
    total = len(batches)

    def warmup_cosine(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1) if smoothing == "torch" else LabelSmoothingCrossEntropy(0.1)
    drop_paths = [m for m in model.modules() if isinstance(m, DropPath)]
    model.train()
    for images, labels, keeps in batches:
        for module, keep in zip(drop_paths, keeps):
            module.keep = torch.from_numpy(keep)
        x = torch.from_numpy(images).to(memory_format=torch.channels_last)
        output = model(x)
        loss = criterion(output, torch.from_numpy(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["lr"].append([group["lr"] for group in optimizer.param_groups])
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(batches[0][0]).to(memory_format=torch.channels_last)
        features = model.downsample_layers[0](x)
        record["stem_channels_last"] = features.is_contiguous(memory_format=torch.channels_last)
        record["eval"] = numpy_of(model(x))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def convnext_batches(rng, steps=5, batch=4, size=16, classes=5, blocks=3, drop_path_rate=0.3):
    rates = np.linspace(0, drop_path_rate, blocks)[1:]  # the first block's rate is 0: no DropPath there
    return [(rng.standard_normal((batch, 3, size, size)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int64),
             [(rng.random(batch) >= rate).astype(np.float32) for rate in rates]) for _ in range(steps)]


@pytest.mark.parametrize("norm_form,smoothing", [("permute", "torch"), ("written", "timm")])
def test_convnext_with_layer_scale_drop_path_and_channels_last_trains_like_torch(norm_form, smoothing):
    ours, theirs = run_both(convnext, convnext_batches(np.random.default_rng(0)), norm_form=norm_form,
                            smoothing=smoothing)
    assert all(theirs["channels_last"]) and theirs["stem_channels_last"]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# An EfficientNet / MobileNetV3, as torchvision writes them: a strided stem, inverted residual blocks (a 1x1 expansion,
# a depthwise convolution, squeeze-and-excitation through F.adaptive_avg_pool2d and two 1x1 convolutions gated by
# hardsigmoid or sigmoid, a 1x1 projection, the residual where shapes allow), SiLU or Hardswish, BatchNorm2d with
# TensorFlow's momentum=0.01 and eps=1e-3, the classifier on the pooled features. RMSprop as the papers train it, and an
# EMA of the weights kept by timm's ModelEmaV3 (_foreach_mul_ / _foreach_add_) or ModelEmaV2 (a loop over state_dict()
# with copy_), the EMA model evaluated after.

def _make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def efficientnet(torch, init, batches, family="mobilenetv3", ema_form="foreach", classes=4, decay=0.9):
    nn, F = torch.nn, torch.nn.functional
    norm_layer = dict(momentum=0.01, eps=1e-3)
    mobile = family == "mobilenetv3"

    class SqueezeExcitation(nn.Module):
        def __init__(self, input_channels, squeeze_channels, activation, scale_activation):
            super().__init__()
            self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
            self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
            self.activation, self.scale_activation = activation(), scale_activation()

        def _scale(self, input):
            scale = F.adaptive_avg_pool2d(input, 1)
            scale = self.fc1(scale)
            scale = self.activation(scale)
            scale = self.fc2(scale)
            return self.scale_activation(scale)

        def forward(self, input):
            scale = self._scale(input)
            return scale * input

    def conv_bn_act(inp, out, kernel, stride=1, groups=1, activation=None):
        layers = [nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(out, **norm_layer)]
        if activation is not None:
            layers.append(activation(inplace=True))
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, inp, expanded, out, kernel, stride, use_se, activation):
            super().__init__()
            self.use_res_connect = stride == 1 and inp == out
            layers = []
            if expanded != inp:
                layers.append(conv_bn_act(inp, expanded, 1, activation=activation))
            layers.append(conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, activation=activation))
            if use_se:
                if mobile:
                    layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8), nn.ReLU,
                                                    nn.Hardsigmoid))
                else:
                    layers.append(SqueezeExcitation(expanded, max(1, inp // 4), nn.SiLU, nn.Sigmoid))
            layers.append(conv_bn_act(expanded, out, 1))
            self.block = nn.Sequential(*layers)

        def forward(self, input):
            result = self.block(input)
            if self.use_res_connect:
                result += input
            return result

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            act = nn.Hardswish if mobile else nn.SiLU
            # (input, expanded, output, kernel, stride, squeeze-excite, activation)
            settings = [(8, 8, 8, 3, 1, True, nn.ReLU if mobile else act), (8, 24, 12, 3, 2, False, act),
                        (12, 36, 12, 5, 1, True, act)]
            layers = [conv_bn_act(3, 8, 3, 2, activation=act)]
            layers += [InvertedResidual(*s) for s in settings]
            layers.append(conv_bn_act(12, 32, 1, activation=act))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            if mobile:
                self.classifier = nn.Sequential(nn.Linear(32, 24), nn.Hardswish(inplace=True), nn.Dropout(p=0.0),
                                                nn.Linear(24, classes))
            else:
                self.classifier = nn.Sequential(nn.Dropout(p=0.0, inplace=True), nn.Linear(32, classes))
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out")
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.1)
                    nn.init.zeros_(m.bias)

        def forward(self, x):
            x = self.features(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.classifier(x)

    class ModelEma(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.module = copy.deepcopy(model)
            self.module.eval()
            self.module.requires_grad_(False)

        @torch.no_grad()
        def update(self, model):
            if ema_form == "foreach":  # timm's ModelEmaV3
                ema_lerp_values, model_lerp_values = [], []
                for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
                    if ema_v.is_floating_point():
                        ema_lerp_values.append(ema_v)
                        model_lerp_values.append(model_v)
                    else:
                        ema_v.copy_(model_v)
                torch._foreach_mul_(ema_lerp_values, scalar=decay)
                torch._foreach_add_(ema_lerp_values, model_lerp_values, alpha=1.0 - decay)
            else:  # timm's ModelEmaV2, num_batches_tracked included (the float result copied into int64 truncates)
                for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
                    ema_v.copy_(decay * ema_v + (1.0 - decay) * model_v)

    model = Net()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    model_ema = ModelEma(model)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, eps=1e-3, momentum=0.9, weight_decay=1e-5)
    criterion = nn.CrossEntropyLoss()
    for images, labels in batches:
        model.train()
        output = model(torch.from_numpy(images))
        loss = criterion(output, torch.from_numpy(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model_ema.update(model)
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(batches[0][0])
        record["eval"] = numpy_of(model(x))
        record["eval_ema"] = numpy_of(model_ema.module(x))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["ema"] = {k: numpy_of(v) for k, v in model_ema.module.state_dict().items()}
    record["ema_dtypes"] = [str(v.dtype).split(".")[-1] for v in model_ema.module.state_dict().values()]
    return record


def classification_batches(rng, steps=5, batch=6, size=16, classes=4):
    return [(rng.standard_normal((batch, 3, size, size)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int64)) for _ in range(steps)]


@pytest.mark.parametrize("family,ema_form", [("mobilenetv3", "foreach"), ("efficientnet", "state_dict")])
def test_efficientnet_and_mobilenetv3_with_squeeze_excitation_rmsprop_and_ema_train_like_torch(family, ema_form):
    ours, theirs = run_both(efficientnet, classification_batches(np.random.default_rng(0)), family=family,
                            ema_form=ema_form)
    assert ours.pop("ema_dtypes") == theirs.pop("ema_dtypes")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A PixelCNN, as its tutorials write it: masked convolutions (a Conv2d subclass with a registered mask buffer, applied
# by `self.weight.data *= self.mask` before the convolution, or by F.conv2d of `self.weight * self.mask`), the first of
# type A (the centre pixel hidden) and the rest of type B, gated activations (tanh * sigmoid of the two halves of the
# channels), residual connections, a 256-way F.cross_entropy over (N, 256, H, W) logits against the (N, H, W) pixel
# values, Adam with clip_grad_norm_; then greedy pixel-by-pixel sampling (argmax in place of multinomial).

def pixelcnn(torch, init, batches, mask_form="data", channels=8, layers=3, size=6, sample_pixels=4):
    nn, F = torch.nn, torch.nn.functional

    class MaskedConv2d(nn.Conv2d):
        def __init__(self, mask_type, *args, **kwargs):
            super().__init__(*args, **kwargs)
            assert mask_type in {"A", "B"}
            self.register_buffer("mask", self.weight.data.clone())
            _, _, kH, kW = self.weight.size()
            self.mask.fill_(1)
            self.mask[:, :, kH // 2, kW // 2 + (mask_type == "B"):] = 0
            self.mask[:, :, kH // 2 + 1:] = 0

        def forward(self, x):
            if mask_form == "data":
                self.weight.data *= self.mask
                return super().forward(x)
            return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)

    class GatedLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = MaskedConv2d("B", channels, 2 * channels, 3, padding=1)
            self.out = nn.Conv2d(channels, channels, 1)

        def forward(self, x):
            a, b = self.conv(x).chunk(2, dim=1)
            return x + self.out(torch.tanh(a) * torch.sigmoid(b))

    class PixelCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.input = MaskedConv2d("A", 1, channels, 7, padding=3)
            self.layers = nn.Sequential(*[GatedLayer() for _ in range(layers)])
            self.head = nn.Sequential(nn.ReLU(), nn.Conv2d(channels, 16, 1), nn.ReLU(), nn.Conv2d(16, 256, 1))

        def forward(self, x):
            return self.head(self.layers(self.input(x)))

    model = PixelCNN()
    record = {"init": initial_state(torch, model, init), "loss": [], "norms": [], "grads": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for images in batches:
        images = torch.from_numpy(images)
        target = images[:, 0].long()
        logits = model(images.float() / 255.0)
        loss = F.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        record["loss"].append(loss.item())
        record["norms"].append(norm.item())
        record["grads"].append(gradients(model))
    model.eval()
    sample = torch.zeros(2, 1, size, size)
    with torch.no_grad():
        for pixel in range(sample_pixels):
            i, j = divmod(pixel, size)
            out = model(sample)
            probs = F.softmax(out[:, :, i, j], dim=-1)
            sample[:, :, i, j] = probs.argmax(dim=1, keepdim=True).float() / 255.0
        record["logits"] = numpy_of(out)
    record["sample"] = numpy_of(sample * 255.0)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def pixel_batches(rng, steps=4, batch=3, size=6):
    # images with structure a PixelCNN can pick up: a ramp across the rows plus noise, quantised to bytes
    ramp = np.linspace(0, 200, size)[None, None, :, None]
    return [np.clip(ramp + rng.integers(0, 56, (batch, 1, size, size)), 0, 255).astype(np.uint8) for _ in range(steps)]


@pytest.mark.parametrize("mask_form", ["data", "functional"])
def test_pixelcnn_with_masked_gated_convolutions_trains_and_samples_like_torch(mask_form):
    ours, theirs = run_both(pixelcnn, pixel_batches(np.random.default_rng(0)), mask_form=mask_form)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

FOREACH_BY_NAME = {
    # timm's ModelEmaV3 names the operand as torch's overloads do: _foreach_mul_(values, scalar=decay)
    "scalar": lambda t, a, b: t._foreach_mul_(a, scalar=0.9),
    "scalars": lambda t, a, b: t._foreach_mul_(a, scalars=[0.5, 2.0]),
    "other, a list": lambda t, a, b: t._foreach_mul_(a, other=b),
    "other, a 0-dim tensor": lambda t, a, b: t._foreach_div_(a, other=t.tensor(4.0)),
    "other with alpha": lambda t, a, b: t._foreach_add_(a, other=b, alpha=0.1),
    "out of place, self by name": lambda t, a, b: t._foreach_sub(self=a, scalar=1),
    "exponent": lambda t, a, b: t._foreach_pow(a, exponent=2),
    "lerp's weights": lambda t, a, b: t._foreach_lerp_(a, tensors1=b, weights=[t.tensor(0.25), t.tensor(0.5)]),
}


@pytest.mark.parametrize("case", FOREACH_BY_NAME)
def test_foreach_functions_take_their_operand_by_torchs_keyword(case):
    seen = []
    for torch in LIBRARIES:
        a, b = [torch.ones(2), torch.full((3,), 2.0)], [torch.full((2,), 3.0), torch.ones(3)]
        result = FOREACH_BY_NAME[case](torch, a, b)
        seen.append([numpy_of(t) for t in result] + [numpy_of(t) for t in a])
    assert_same(seen[1], seen[0])


FOREACH_MISNAMED = {
    "other=, a number": lambda t, a: t._foreach_mul_(a, other=0.5),
    "scalar=, a list": lambda t, a: t._foreach_mul_(a, scalar=[0.5, 1.0]),
    "scalar= with alpha": lambda t, a: t._foreach_add_(a, scalar=1, alpha=2),
    "a number with alpha": lambda t, a: t._foreach_add(a, 1.5, alpha=2),
    "mul with alpha": lambda t, a: t._foreach_mul(a, a, alpha=2),
    "twice": lambda t, a: t._foreach_mul_(a, 0.5, scalar=1),
    "an unknown keyword": lambda t, a: t._foreach_mul_(a, foo=1),
    "no operand": lambda t, a: t._foreach_mul_(a),
}


@pytest.mark.parametrize("case", FOREACH_MISNAMED)
def test_foreach_functions_refuse_a_misnamed_operand_as_torchs_parser(case):
    theirs, ours = (raised(lambda t: FOREACH_MISNAMED[case](t, [t.ones(2), t.ones(3)]), t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is TypeError
    assert str(ours).splitlines()[0].startswith(str(theirs).splitlines()[0])


@pytest.mark.parametrize("name", ["hardsigmoid", "hardswish", "silu", "gelu", "mish", "softplus", "elu", "celu", "selu",
                                  "logsigmoid", "hardshrink", "softshrink"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_activations_refuse_integer_input_with_torchs_not_implemented_error(name, dtype):
    # met gating squeeze-and-excitation with an integer tensor: torch names its kernel, tilewise too
    def call(t):
        return getattr(t.nn.functional, name)(t.ones(2, dtype=getattr(t, dtype)))

    theirs, ours = (raised(call, t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is NotImplementedError and str(ours).startswith(str(theirs)), (ours, theirs)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_softsign_of_integers_is_a_float_as_its_division_in_torch(dtype):
    def call(t):
        return t.nn.functional.softsign(t.tensor([-3, 0, 2], dtype=getattr(t, dtype)))

    theirs, ours = (raised(call, t) for t in LIBRARIES)
    assert type(ours) is type(theirs)
    if theirs is not None:
        assert str(ours).startswith(str(theirs))
        return
    assert ours is None and call(tilewise).dtype == tilewise.float32
    np.testing.assert_allclose(call(tilewise).numpy(), call(real_torch).numpy())


INITIALISER_REFUSALS = {
    "gelu, an unknown approximation": lambda t: t.nn.functional.gelu(t.ones(2), approximate="fast"),
    "GELU, an unknown approximation": lambda t: t.nn.GELU(approximate="Tanh")(t.ones(2)),
    "trunc_normal_, bounds out of order": lambda t: t.nn.init.trunc_normal_(t.empty(3), a=2, b=-2),
    "trunc_normal_, float bounds out of order": lambda t: t.nn.init.trunc_normal_(t.empty(3), a=0.5, b=0.25),
    "init.uniform_, bounds out of order": lambda t: t.nn.init.uniform_(t.empty(3), 2.0, -2.0),
    "Tensor.uniform_, bounds out of order": lambda t: t.empty(3).uniform_(1.0, 0.5),
}


@pytest.mark.parametrize("case", INITIALISER_REFUSALS)
def test_gelu_and_initialisers_refuse_what_torch_refuses_in_its_words(case):
    theirs, ours = (raised(INITIALISER_REFUSALS[case], t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is RuntimeError and str(ours).startswith(str(theirs)), (ours, theirs)


def test_trunc_normal_warns_of_a_mean_far_outside_its_bounds_as_torch():
    for torch in LIBRARIES:
        with pytest.warns(UserWarning, match=r"^mean is more than 2 std from \[a, b\] in nn.init.trunc_normal_"):
            values = torch.nn.init.trunc_normal_(torch.empty(50), mean=5.0, std=1.0)
        assert float(values.min()) >= -2 and float(values.max()) <= 2


ADAPTIVE_POOLS = {
    "an output of zeros": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 4, 4), 0),
    "an output of zero rows": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 4, 4), (0, 2)),
    "unbatched, zero rows": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(3, 4, 4), (0, 3)),
    "1-D, zero": lambda t: t.nn.functional.adaptive_avg_pool1d(t.ones(2, 3, 4), 0),
    "3-D, zero": lambda t: t.nn.functional.adaptive_avg_pool3d(t.ones(2, 3, 4, 4, 4), 0),
    "max, zero rows": lambda t: t.nn.functional.adaptive_max_pool2d(t.ones(2, 3, 4, 4), (0, 1)),
    "max's indices, zero": lambda t: t.nn.functional.adaptive_max_pool2d(t.ones(2, 3, 4, 4), 0, True)[1],
    "the mean of an empty image (NaN)": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 0, 4), 1),
    "no channels": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 0, 4, 4), 2),
    "refused: an empty image pooled to 2": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 0, 4), 2),
    "refused: an empty width": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 4, 0), (2, 0)),
    "refused: a 2-D input": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(4, 4), 2),
    "refused: a negative size": lambda t: t.nn.functional.adaptive_avg_pool2d(t.ones(2, 3, 4, 4), -1),
}


@pytest.mark.parametrize("case", ADAPTIVE_POOLS)
def test_adaptive_pooling_to_empty_or_from_empty_as_torch(case):
    # met squeezing an excitation block's features with the wrong size
    theirs, ours = (raised(ADAPTIVE_POOLS[case], t) for t in LIBRARIES)
    assert type(ours) is type(theirs)
    if theirs is not None:
        assert str(ours).startswith(str(theirs)), (ours, theirs)
        return
    a, b = ADAPTIVE_POOLS[case](real_torch), ADAPTIVE_POOLS[case](tilewise)
    assert list(b.shape) == list(a.shape) and b.stride() == a.stride() and str(b.dtype)[9:] == str(a.dtype)[6:]
    np.testing.assert_array_equal(b.numpy(), a.numpy())


NORM_RANK_REFUSALS = {
    "BatchNorm2d of a 3-D input": lambda t: t.nn.BatchNorm2d(4, momentum=0.01, eps=1e-3)(t.ones(2, 4, 4)),
    "BatchNorm1d of a 4-D input": lambda t: t.nn.BatchNorm1d(4)(t.ones(2, 4, 4, 4)),
    "BatchNorm3d of a 3-D input": lambda t: t.nn.BatchNorm3d(4)(t.ones(2, 4, 4)),
    "InstanceNorm2d of a 1-D input": lambda t: t.nn.InstanceNorm2d(4)(t.ones(4)),
}


@pytest.mark.parametrize("case", NORM_RANK_REFUSALS)
def test_norm_layers_refuse_an_input_of_the_wrong_rank_in_torchs_words(case):
    theirs, ours = (raised(NORM_RANK_REFUSALS[case], t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is ValueError and str(ours).startswith(str(theirs)), (ours, theirs)
