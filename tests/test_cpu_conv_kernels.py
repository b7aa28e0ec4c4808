"""The CPU backend's convolution kernels ([Note: convolution columns per image] in
``backends/cpu/conv_kernels.py``) against torch and against the operators' decomposition, which every call they do
not serve (groups, channels-last, half precision, strided gradients) must still reach."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.backends.cpu import conv_kernels
from tilewise.ops.registry import OPS

CASES = {
    "plain": ((2, 3, 9, 10), (4, 3, 3, 3), {}),
    "stride and padding": ((2, 3, 9, 10), (4, 3, 3, 2), dict(stride=2, padding=1)),
    "dilation, uneven": ((1, 2, 11, 11), (3, 2, 3, 3), dict(dilation=2, padding=(2, 1), stride=(1, 2))),
    "same": ((2, 3, 8, 8), (4, 3, 3, 3), dict(padding="same")),
    "same, even kernel": ((2, 3, 8, 7), (4, 3, 2, 4), dict(padding="same")),
    "1x1": ((2, 5, 4, 4), (6, 5, 1, 1), {}),
    "1d": ((2, 3, 17), (4, 3, 3), dict(stride=2, padding=2)),
    "3d": ((2, 3, 5, 6, 7), (4, 3, 2, 3, 2), dict(padding=1, stride=(1, 2, 1))),
}
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12)}


def conv_and_grads(lib, x: np.ndarray, w: np.ndarray, kwargs: dict, memory_format=None):
    inp, weight = lib.from_numpy(x.copy()), lib.from_numpy(w.copy())
    if memory_format is not None:
        inp = inp.contiguous(memory_format=getattr(lib, memory_format))
    inp.requires_grad_()
    weight.requires_grad_()
    y = getattr(lib.nn.functional, f"conv{x.ndim - 2}d")(inp, weight, **kwargs)
    seed = np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(x.dtype)
    (y * lib.from_numpy(seed)).sum().backward()
    return y, inp.grad, weight.grad


@pytest.fixture
def served(monkeypatch):
    """Counts the calls the kernels serve (rather than hand to the decomposition)."""
    counts = {"columns": 0}
    original = conv_kernels._columns_per_image

    def counted(*args):
        counts["columns"] += 1
        return original(*args)

    monkeypatch.setattr(conv_kernels, "_columns_per_image", counted)
    return counts


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case, dtype, served):
    shape, weight_shape, kwargs = CASES[case]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape).astype(dtype), rng.standard_normal(weight_shape).astype(dtype)
    ours, theirs = conv_and_grads(tw, x, w, kwargs), conv_and_grads(torch, x, w, kwargs)
    rtol, atol = TOLERANCE[dtype]
    for a, b in zip(ours, theirs):
        assert a.stride() == b.stride()
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol)
    assert served["columns"] == 1, "the forward did not take the kernel"


@pytest.mark.parametrize("case", ["plain", "dilation, uneven", "3d"])
def test_each_kernel_matches_the_decomposition(case):
    shape, weight_shape, kwargs = CASES[case]
    rng = np.random.default_rng(2)
    x, w = (tw.from_numpy(rng.standard_normal(s)) for s in (shape, weight_shape))
    spatial = len(shape) - 2
    stride = kwargs.get("stride", 1)
    stride = stride if isinstance(stride, tuple) else (stride,) * spatial
    dilation = (kwargs.get("dilation", 1),) * spatial
    padding = kwargs.get("padding", 0)
    padding = padding if isinstance(padding, tuple) else (padding,) * spatial
    pads = tuple(p for q in padding for p in (q, q))
    name = f"_conv{spatial}d"
    out = OPS[name](x, w, stride, pads, dilation, 1)
    np.testing.assert_allclose(out.numpy(), OPS[name].decomposition(x, w, stride, pads, dilation, 1).numpy(),
                               rtol=1e-12, atol=1e-12)
    grad = tw.from_numpy(rng.standard_normal(tuple(out.shape)))
    for suffix in ("_backward_input", "_backward_weight"):
        op = OPS[name + suffix]
        np.testing.assert_allclose(op(grad, x, w, stride, pads, dilation, 1).numpy(),
                                   op.decomposition(grad, x, w, stride, pads, dilation, 1).numpy(), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("variant", ["groups", "channels_last", "bfloat16", "expanded grad"])
def test_calls_not_served_take_the_decomposition(variant, served):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 4, 7, 7)).astype(np.float32), rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    kwargs, memory_format = {}, None
    if variant == "groups":
        w, kwargs = w[:, :2].copy(), dict(groups=2)
    if variant == "channels_last":
        memory_format = "channels_last"
    if variant == "bfloat16":
        y = tw.nn.functional.conv2d(tw.from_numpy(x).bfloat16(), tw.from_numpy(w).bfloat16())
        ty = torch.nn.functional.conv2d(torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16())
        np.testing.assert_allclose(y.float().numpy(), ty.float().numpy(), rtol=2e-2, atol=2e-2)
        assert served["columns"] == 0
        return
    if variant == "expanded grad":  # sum's gradient reaches the convolution as a stride-0 tensor
        inp = tw.from_numpy(x.copy()).requires_grad_()
        torch_inp = torch.from_numpy(x.copy()).requires_grad_()
        tw.nn.functional.conv2d(inp, tw.from_numpy(w)).sum().backward()
        torch.nn.functional.conv2d(torch_inp, torch.from_numpy(w)).sum().backward()
        np.testing.assert_allclose(inp.grad.numpy(), torch_inp.grad.numpy(), rtol=1e-5, atol=1e-5)
        return
    ours = conv_and_grads(tw, x, w, kwargs, memory_format)
    theirs = conv_and_grads(torch, x, w, kwargs, memory_format)
    for a, b in zip(ours, theirs):
        assert a.stride() == b.stride()
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert served["columns"] == 0


def test_empty_batch():
    x, w = np.zeros((0, 3, 5, 5), np.float32), np.ones((2, 3, 3, 3), np.float32)
    y = tw.nn.functional.conv2d(tw.from_numpy(x), tw.from_numpy(w))
    assert tuple(y.shape) == (0, 2, 3, 3)


def test_compiled_cpu_programs_call_these_kernels_for_their_convolutions():
    """The C target keeps a one-group float32 convolution and its two gradients whole (one call of these
    kernels each) instead of im2col in generated code, and gives eager's gradients."""
    conv = tw.nn.Conv2d(3, 8, 3, padding=1)
    x = tw.randn(4, 3, 16, 16, requires_grad=True)

    def step(x):
        loss = conv(x).relu().sum()
        loss.backward()
        return loss

    compiled = tw.compile(step)
    for _ in range(2):
        x.grad, conv.weight.grad = None, None
        compiled(x)
    got = (x.grad.numpy().copy(), conv.weight.grad.numpy().copy())
    x.grad, conv.weight.grad = None, None
    step(x)
    np.testing.assert_allclose(got[0], x.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], conv.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    ops = [getattr(getattr(s, "node", None), "op", None) for s in compiled.programs()[-1].steps]
    assert {"_conv2d", "_conv2d_backward_input", "_conv2d_backward_weight"} <= set(ops)
