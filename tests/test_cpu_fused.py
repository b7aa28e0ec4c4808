"""Eager CPU composites and gelu as one compiled C kernel ([Note: fused composites]) against torch: forward and
backward, on contiguous and transposed inputs, with NaN, in float32 and float64; float16/bfloat16, empty tensors
and calls below the size threshold keep numpy's path, and must match torch just the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.compiler import composites
from tilewise.config import settings


@pytest.fixture
def always_fused(monkeypatch):
    monkeypatch.setattr(settings, "cpu_fused_min_elements", 0)


def compiled_ops() -> set[str]:
    return {key[1].name for key, fn in composites._programs.items() if fn is not None}


CASES = {
    "softmax": (lambda nnf, x: nnf.softmax(x, -1), lambda nnf, x: nnf.softmax(x, -1)),
    "log_softmax": (lambda nnf, x: nnf.log_softmax(x, 0), lambda nnf, x: nnf.log_softmax(x, 0)),
    "layer_norm": (lambda nnf, x: nnf.layer_norm(x, x.shape[-1:]), lambda nnf, x: nnf.layer_norm(x, x.shape[-1:])),
    "gelu": (lambda nnf, x: nnf.gelu(x), lambda nnf, x: nnf.gelu(x)),
    "gelu_tanh": (lambda nnf, x: nnf.gelu(x, approximate="tanh"), lambda nnf, x: nnf.gelu(x, approximate="tanh")),
    "cross_entropy": (lambda nnf, x: nnf.cross_entropy(x, tw.arange(x.shape[0]) % x.shape[1]),
                      lambda nnf, x: nnf.cross_entropy(x, torch.arange(x.shape[0]) % x.shape[1])),
}
EXPECTED_PROGRAMS = {"softmax": {"softmax", "_softmax_backward_data"},
                     "log_softmax": {"log_softmax", "_log_softmax_backward_data"},
                     "layer_norm": {"native_layer_norm", "_layer_norm_backward"}, "gelu": {"gelu", "gelu_backward"},
                     "gelu_tanh": {"gelu", "gelu_backward"}, "cross_entropy": {"_cross_entropy_loss"}}
# float32 atol: tanh-GELU's gradient far in the negative tail is 1 + tanh(u) and 1 - tanh(u)^2 with tanh(u) near
# -1, which float32 evaluates to a few 1e-6 of absolute error (torch's float32 kernels included)
TOLERANCE = {"float32": (2e-5, 5e-6), "float64": (1e-12, 1e-13)}


def both(values: np.ndarray):
    """Our tensor, and torch's reference: float32 is checked against torch in float64, since torch's own float32
    results depend on the host's vector unit (with AVX-512, its float32 gelu(inf) is nan, its scalar path's inf)."""
    ours = tw.from_numpy(values.copy()).requires_grad_()
    theirs = torch.from_numpy(values.astype(np.float64) if values.dtype == np.float32 else values.copy())
    return ours, theirs.requires_grad_()


def check(case: str, values: np.ndarray, transposed: bool = False) -> None:
    ours_fn, torch_fn = CASES[case]
    x, tx = both(values)
    inputs = (x.t(), tx.t()) if transposed else (x, tx)
    y, ty = ours_fn(tw.nn.functional, inputs[0]), torch_fn(torch.nn.functional, inputs[1])
    rtol, atol = TOLERANCE.get(str(values.dtype), (1e-2, 1e-2))
    np.testing.assert_allclose(y.detach().float().numpy(), ty.detach().float().numpy(), rtol=rtol, atol=atol)
    seed = np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(values.dtype)
    (y * tw.from_numpy(seed)).sum().backward()
    (ty * torch.from_numpy(seed)).sum().backward()
    np.testing.assert_allclose(x.grad.float().numpy(), tx.grad.float().numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_kernel_matches_torch(case, dtype, always_fused):
    values = np.random.default_rng(0).standard_normal((24, 40)).astype(dtype) * 3
    check(case, values)
    assert EXPECTED_PROGRAMS[case] <= compiled_ops(), "the call did not take the compiled path"


@pytest.mark.parametrize("case", sorted(CASES))
def test_transposed_input(case, always_fused):
    check(case, np.random.default_rng(2).standard_normal((40, 24)).astype(np.float32), transposed=True)


@pytest.mark.parametrize("case", ["softmax", "log_softmax", "layer_norm", "gelu"])
def test_nan_and_infinity_propagate_as_in_torch(case, always_fused):
    values = np.random.default_rng(3).standard_normal((6, 16)).astype(np.float32)
    values[1, 3], values[2, 0], values[4, 7] = np.nan, np.inf, -np.inf
    ours_fn, torch_fn = CASES[case]
    x, tx = both(values)
    np.testing.assert_allclose(ours_fn(tw.nn.functional, x).detach().numpy(),
                               torch_fn(torch.nn.functional, tx).detach().numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", ["softmax", "layer_norm", "gelu"])
def test_empty_tensor_keeps_numpys_path(case, always_fused):
    ours_fn, torch_fn = CASES[case]
    x, tx = both(np.zeros((0, 8), np.float32))
    y, ty = ours_fn(tw.nn.functional, x), torch_fn(torch.nn.functional, tx)
    assert tuple(y.shape) == tuple(ty.shape)


@pytest.mark.parametrize("case", ["softmax", "layer_norm", "gelu"])
def test_bfloat16_keeps_numpys_rounding(case, always_fused):
    values = np.random.default_rng(4).standard_normal((8, 32)).astype(np.float32)
    ours_fn, torch_fn = CASES[case]
    y = ours_fn(tw.nn.functional, tw.from_numpy(values).to(tw.bfloat16))
    ty = torch_fn(torch.nn.functional, torch.from_numpy(values).to(torch.bfloat16))
    assert y.dtype == tw.bfloat16
    np.testing.assert_array_equal(y.float().numpy(), ty.float().numpy())


def test_small_calls_stay_on_numpy(monkeypatch):
    monkeypatch.setattr(settings, "cpu_fused_min_elements", 1 << 30)
    before = dict(composites._programs)
    check("softmax", np.random.default_rng(5).standard_normal((7, 9)).astype(np.float32))
    assert composites._programs == before


def test_never_when_switched_off(monkeypatch):
    monkeypatch.setattr(settings, "cpu_fused_min_elements", -1)
    before = dict(composites._programs)
    check("gelu", np.random.default_rng(6).standard_normal((300, 300)).astype(np.float32))
    assert composites._programs == before


POOLS = {  # name -> (input shape, keyword arguments)
    "2d": ((2, 3, 9, 10), dict(kernel_size=2)),
    "2d padded ceil": ((2, 3, 9, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "2d dilated": ((1, 2, 11, 11), dict(kernel_size=2, stride=1, dilation=2)),
    "1d": ((2, 3, 17), dict(kernel_size=3, stride=2)),
    "3d": ((1, 2, 5, 6, 7), dict(kernel_size=2, padding=1)),
}


def _max_pool(nnf, x, kwargs):
    return getattr(nnf, f"max_pool{x.ndim - 2}d")(x, return_indices=True, **kwargs)


def _pooled(values: np.ndarray, kwargs: dict, channels_last: bool = False):
    """(values, indices, input gradient) of max pooling ``values``, tilewise then torch."""
    results = []
    for lib, wrap in ((tw, tw.from_numpy), (torch, torch.from_numpy)):
        x = wrap(values.copy())
        if channels_last:
            x = x.contiguous(memory_format=lib.channels_last)
        x.requires_grad_(values.dtype.kind == "f")
        y, indices = _max_pool(lib.nn.functional, x, kwargs)
        grad = None
        if x.requires_grad:
            seed = np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(values.dtype)
            (y * wrap(seed)).sum().backward()
            grad = x.grad.numpy()
        results.append((y.detach().numpy(), indices.numpy(), grad, x.grad.stride() if x.requires_grad else None))
    return results


@pytest.mark.parametrize("case", sorted(POOLS))
def test_max_pool_compiled_matches_numpy_and_torch_bit_for_bit(case, monkeypatch):
    """Max pooling with indices takes the compiled path from the threshold on: its values, indices (NaN and ties
    by torch's rule) and input gradient are those of the numpy path and of torch, exactly."""
    shape, kwargs = POOLS[case]
    values = np.random.default_rng(6).integers(-3, 4, shape).astype(np.float32)  # many ties
    values.reshape(-1)[::7] = np.nan
    monkeypatch.setattr(settings, "cpu_fused_min_elements", 1 << 30)
    numpy_path = _pooled(values, kwargs)[0]
    monkeypatch.setattr(settings, "cpu_fused_min_elements", 0)
    compiled, theirs = _pooled(values, kwargs)
    assert f"max_pool{len(shape) - 2}d_with_indices" in compiled_ops(), "the call did not take the compiled path"
    for ours in (numpy_path, compiled):
        for a, b in zip(ours[:3], theirs[:3]):
            np.testing.assert_array_equal(a, b)


def test_max_pool_compiled_keeps_channels_last(always_fused):
    values = np.random.default_rng(7).standard_normal((2, 4, 8, 8)).astype(np.float32)
    ours, theirs = _pooled(values, dict(kernel_size=2), channels_last=True)
    for a, b in zip(ours[:3], theirs[:3]):
        np.testing.assert_array_equal(a, b)
    assert ours[3] == theirs[3]


def test_max_pool_of_integers_compiled(always_fused):
    values = np.random.default_rng(8).integers(-50, 50, (2, 3, 8, 9)).astype(np.int32)
    ours, theirs = _pooled(values, dict(kernel_size=2, padding=1))
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("mask", ["causal", "float", "bool", "none"])
def test_attention_compiled_matches_torch(mask, always_fused):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 3, 10, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((10, 10)).astype(np.float32)
    results = []
    for lib in (tw, torch):
        tensors = [lib.from_numpy(a.copy()).requires_grad_() for a in (q, k, v)]
        kwargs = {"causal": dict(is_causal=True), "none": {},
                  "float": dict(attn_mask=lib.from_numpy(bias.copy())),
                  "bool": dict(attn_mask=lib.from_numpy(bias > 0))}[mask]
        y = lib.nn.functional.scaled_dot_product_attention(*tensors, **kwargs)
        seed = lib.from_numpy(np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(np.float32))
        (y * seed).sum().backward()
        results.append([y.detach().numpy(), *(t.grad.numpy() for t in tensors)])
    assert {"_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward"} <= compiled_ops()
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5)
