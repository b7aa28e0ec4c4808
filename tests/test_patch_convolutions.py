"""Convolutions that cut their input into non-overlapping patches (a ViT's patch embedding: stride equal to the
kernel, no padding or dilation, one group) run on the CUDA target as their decomposition, a transposing copy and
one GEMM, rather than as a cuDNN call; every other convolution stays cuDNN's. The lowering is made here without a
GPU; on a GPU, the compiled step gives eager's (cuDNN's) results."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
from tilewise.backends.cuda import convolution, cudnn
from tilewise.compiler import targets
from tilewise.compiler.lowering.memory import steps_of


@pytest.fixture
def cudnn_importable(monkeypatch):
    """Lowering for CUDA from CPU tensors asks cuDNN's frontend only whether it imports (it need not here)."""
    monkeypatch.setattr(cudnn, "unavailable", lambda: None)


class _Shape:
    def __init__(self, *shape):
        self.shape, self.dtype = shape, tw.bfloat16


@pytest.mark.parametrize(("channels", "kernel", "stride", "pads", "dilation", "groups", "patches"), [
    (3, (16, 16), (16, 16), ((0, 0), (0, 0)), (1, 1), 1, True),
    (4, (4, 2), (4, 2), ((0, 0), (0, 0)), (1, 1), 1, True),
    (64, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), 1, False),  # a ConvNeXt's downsampling: cuDNN's
    (3, (16, 16), (8, 8), ((0, 0), (0, 0)), (1, 1), 1, False),
    (3, (3, 3), (3, 3), ((1, 1), (1, 1)), (1, 1), 1, False),
    (3, (2, 2), (2, 2), ((0, 0), (0, 0)), (2, 2), 1, False),
    (4, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), 2, False),
])
def test_patch_convolutions_are_recognised(channels, kernel, stride, pads, dilation, groups, patches):
    x, w, g = _Shape(2, channels, 32, 32), _Shape(8, channels // groups, *kernel), _Shape(2, 8, 8, 8)
    params = (stride, pads, dilation, groups)
    assert convolution._patches("_conv2d", (x, w, *params)) is patches
    assert convolution._patches("_conv2d_backward_weight", (g, x, w, *params)) is patches
    assert not convolution._patches("_conv2d_backward_input", (g, x, w, *params))  # cuDNN's, always
    assert not convolution._patches("_conv_transpose2d", (x, w, *params, (0, 0)))


def _step(patch: int, device="cpu"):
    tw.manual_seed(0)
    embed = tw.nn.Conv2d(3, 64, kernel_size=patch, stride=patch).to(device)

    def step(images):
        with tw.autocast(device, dtype=tw.bfloat16):
            x = embed(images).flatten(2).transpose(1, 2)
        loss = x.float().square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in embed.parameters()]
        embed.zero_grad()
        return loss, *grads

    return step


def _library_calls(step, x) -> list[str]:
    _, programs, _ = tw.compile(step).lowered(targets.get_target("cuda"), x)
    return [n.op for low in programs for n in steps_of(low.fused) if n not in low.kernels]


def test_a_patch_embedding_lowers_to_gemms(cudnn_importable):
    calls = _library_calls(_step(8), tw.randn(2, 3, 32, 32))
    assert not [c for c in calls if c.startswith("_conv")], calls
    assert len([c for c in calls if c in ("mm", "bmm", "addmm")]) == 2, calls  # forward, weight gradient


def test_an_overlapping_convolution_stays_cudnns(cudnn_importable):
    tw.manual_seed(0)
    conv = tw.nn.Conv2d(3, 64, kernel_size=3, stride=2, padding=1)

    def step(images):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = conv(images).float().square().mean()
        loss.backward()
        return loss

    calls = _library_calls(step, tw.randn(2, 3, 32, 32))
    assert [c for c in calls if c.startswith("_conv")], calls


@pytest.mark.cuda
def test_a_compiled_patch_embedding_matches_eager_cudnn():
    if not tw.cuda.is_available():
        pytest.skip("no GPU")
    step = _step(16, "cuda")
    compiled = tw.compile(step)
    for seed in range(2):
        tw.manual_seed(seed + 1)
        x = tw.randn(4, 3, 64, 64, device="cuda")
        for ours, theirs in zip(compiled(x), step(x)):
            ours, theirs = ours.detach().float().cpu().numpy(), theirs.detach().float().cpu().numpy()
            np.testing.assert_allclose(ours, theirs, rtol=2e-2, atol=2e-2 * max(float(np.abs(theirs).max()), 1e-6))
    (program,) = compiled.programs()
    assert not [s.describe() for s in program.steps if "call _conv" in s.describe()]
