"""The eager CPU path's shortcuts for common calls give what the general path gives, as torch does.

Tiny operators spend their time between the Python call and the kernel, so the CPU backend keeps per-signature
plans and wraps fresh results without re-deriving their layout (see ``backends/cpu``); each shortcut here is
checked against torch and against the general code it stands in for.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.backends.cpu import render
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor, from_array, from_contiguous_array

_SLOTS = tuple(s for s in Tensor.__slots__ if s not in ("__weakref__", "__dict__"))


def _slot_values(t: Tensor) -> dict:
    return {s: getattr(t, s) for s in _SLOTS}


@pytest.mark.parametrize("shape", [(4, 4), (), (0, 3), (2, 1, 3)])
def test_from_contiguous_array_sets_every_slot_as_make_does(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    fast = from_contiguous_array(a, tw.float32)
    made = tw.Tensor._make(fast._storage, fast._shape, tw.strides.contiguous_strides(shape), 0, tw.float32,
                           fast._device)
    made._array = a
    assert _slot_values(fast) == _slot_values(made)
    assert fast._storage.numel == a.size and fast._storage.version == 0 and fast._storage.dtype is tw.float32
    assert a.size == 0 or np.shares_memory(fast._storage.data, a)
    general = _slot_values(from_array(a, tw.float32))
    assert {k: v for k, v in general.items() if k != "_storage"} == \
        {k: v for k, v in _slot_values(fast).items() if k != "_storage"}


def test_single_ufunc_only_for_one_numpy_operation_on_the_inputs_in_order():
    from tilewise.backends.cpu import _static_kernels

    assert render.single_ufunc(OPS["exp"].expr, 1) is np.exp
    assert render.single_ufunc(OPS["mul"].expr, 2) is np.multiply
    assert render.single_ufunc(OPS["rsqrt"].expr, 1) is None  # a helper of the renderer, not a ufunc
    with pytest.MonkeyPatch.context() as patch:  # a numpy spelling that is a function, not a ufunc
        patch.setitem(render._UNARY, "exp", "np.round")
        assert render.single_ufunc(OPS["exp"].expr, 1) is None
    fn, scalar_idx, _, at_defaults = _static_kernels(OPS["add"])
    assert scalar_idx == (2,) and at_defaults == (np.add, ())  # alpha=1 makes add(x0, x1)
    assert not isinstance(fn, np.ufunc)  # the general kernel multiplies by alpha


def test_run_quietly_passes_every_arity():
    a = np.array([1.0, 2.0], np.float32)
    assert render.run_quietly(np.negative, [a]).tolist() == [-1.0, -2.0]
    assert render.run_quietly(np.add, [a, a]).tolist() == [2.0, 4.0]
    assert render.run_quietly(np.where, [a > 1, a, -a]).tolist() == [-1.0, 2.0]
    assert render.run_quietly(lambda: 7, []) == 7


_LAYOUTS = {
    "row-major": lambda t: t,
    "transposed": lambda t: t.t(),
    "sliced": lambda t: t[:, ::2].t(),
}


def _operands(values: np.ndarray, dtype: str, layout: str):
    """The same values as a tilewise and a torch tensor of ``dtype``, laid out as ``layout`` says."""
    arrange = _LAYOUTS[layout]
    ours = arrange(tw.from_numpy(values.copy()).to(getattr(tw, dtype)))
    theirs = arrange(torch.from_numpy(values.copy()).to(getattr(torch, dtype)))
    return ours, theirs


_CALLS = {
    "add": lambda lib, x, y: lib.add(x, y),
    "add alpha=2": lambda lib, x, y: lib.add(x, y, alpha=2),
    "add alpha=True": lambda lib, x, y: lib.add(x > 0, y > 0, alpha=True),
    "add alpha=1.0": lambda lib, x, y: lib.add(x, y, alpha=1.0),
    "sub": lambda lib, x, y: x - y,
    "mul": lambda lib, x, y: x * y,
    "div": lambda lib, x, y: x / y,
    "exp": lambda lib, x, y: x.exp(),
    "rsqrt": lambda lib, x, y: x.abs().rsqrt(),
    "maximum": lambda lib, x, y: lib.maximum(x, y),
    "where": lambda lib, x, y: lib.where(x > y, x, y),
}
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("call", sorted(_CALLS))
def test_uniform_pointwise_calls_match_torch(call, layout, dtype):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((4, 6)).astype(np.float32)
    x, tx = _operands(values, dtype, layout)
    y, ty = _operands(values[::-1], dtype, layout)
    ours, theirs = _CALLS[call](tw, x, y), _CALLS[call](torch, tx, ty)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    assert ours.shape == tuple(theirs.shape) and ours.stride() == theirs.stride()
    exact = call not in ("exp", "rsqrt")  # numpy's and torch's transcendental functions may differ in the last bit
    rtol = 0 if exact else 2 * torch.finfo(getattr(torch, dtype)).eps
    np.testing.assert_allclose(ours.float().numpy(), theirs.float().numpy(), rtol=rtol, atol=0)
    assert ours.is_contiguous() == theirs.is_contiguous()


_NUMBER_CALLS = {
    "x * 2": lambda x: x * 2, "x * 0.1": lambda x: x * 0.1, "1 - x": lambda x: 1 - x, "x + 1e40": lambda x: x + 1e40,
    "2.5 / x": lambda x: 2.5 / x, "x - 3 (alpha=2)": lambda x: x.sub(3, alpha=2), "x > 0.5": lambda x: x > 0.5,
    "x == 1": lambda x: x == 1, "max(x, 0.25)": lambda x: x.clamp_min(0.25), "x // 0.3": lambda x: x // 0.3,
    "div floor": lambda x: x.div(0.3, rounding_mode="floor"), "x ** 2": lambda x: x ** 2,
    "int x * 0.5": lambda x: (x * 10).long() * 0.5, "x * True": lambda x: x * True,
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS) + ["0-dim"])
@pytest.mark.parametrize("call", sorted(_NUMBER_CALLS))
def test_a_tensor_and_a_python_number_match_torch(call, layout, dtype):
    """The plan kept per (operator, dtype, number type) for a tensor and a Python number gives torch's results."""
    values = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    if layout == "0-dim":
        x, tx = tw.tensor(values[0, 0]).to(getattr(tw, dtype)), torch.tensor(values[0, 0]).to(getattr(torch, dtype))
    else:
        x, tx = _operands(values, dtype, layout)
    for _ in range(2):  # the second call runs the plan the first one kept
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ours, theirs = _NUMBER_CALLS[call](x), _NUMBER_CALLS[call](tx)
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
        assert ours.shape == tuple(theirs.shape) and ours.stride() == theirs.stride()
        np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())
        assert ours._base is None and ours._storage is not x._storage


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_uniform_pointwise_results_own_their_memory_and_version(dtype):
    x = tw.ones(3, 3, dtype=getattr(tw, dtype))
    out = x + x
    assert out._storage is not x._storage and out._storage.version == 0 and out._base is None
    out.add_(1)
    assert x.tolist() == [[1.0] * 3] * 3 and out.tolist() == [[3.0] * 3] * 3


def test_zero_dim_uniform_pointwise_matches_torch():
    ours = tw.tensor(2.0) * tw.tensor(3.0)
    theirs = torch.tensor(2.0) * torch.tensor(3.0)
    assert ours.shape == () and ours.item() == theirs.item() and ours.dtype is tw.float32


def test_overflow_and_invalid_results_do_not_warn_like_torch():
    big = tw.full((2, 2), 6e4, dtype=tw.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.isinf(torch.full((2, 2), 6e4, dtype=torch.float16) * 2).all()
        assert tw.isinf(big * 2).all()
        assert tw.isinf(tw.full((2,), 3e38) * tw.full((2,), 10.0)).all()
        assert tw.isnan(tw.zeros(2) / tw.zeros(2)).all()
        assert tw.isinf(tw.ones(3, dtype=tw.float16) + 1e10).all()  # computed in float32, overflows in the cast


@pytest.mark.parametrize("name", ["sum", "amax", "amin", "prod"])
def test_reduction_of_a_zero_dim_tensor_is_a_new_tensor_like_torch(name):
    x, tx = tw.tensor(3.0), torch.tensor(3.0)
    ours, theirs = getattr(x, name)(), getattr(tx, name)()
    ours.add_(1)
    theirs.add_(1)
    assert x.item() == tx.item() == 3.0 and ours.item() == theirs.item() == 4.0


_REDUCTIONS = {
    "sum": lambda t: t.sum(),
    "sum(1)": lambda t: t.sum(1),
    "sum(0, keepdim=True)": lambda t: t.sum(0, keepdim=True),
    "amax(1)": lambda t: t.amax(1),
    "prod": lambda t: t.prod(),
    "mean(1)": lambda t: t.mean(1),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
@pytest.mark.parametrize("call", sorted(_REDUCTIONS))
def test_reductions_match_torch_without_warnings(call, dtype):
    if call.startswith("mean") and dtype in ("int32", "bool"):
        pytest.skip("torch refuses the mean of integers; tests/test_ops.py checks the error")
    values = np.array([[1.0, 2.0, 3.0], [60000.0, 60000.0, -1.0]], np.float32)  # float16 sums overflow to inf
    x = tw.from_numpy(values).to(getattr(tw, dtype))
    tx = torch.from_numpy(values).to(getattr(torch, dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours, theirs = _REDUCTIONS[call](x), _REDUCTIONS[call](tx)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.") and ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours.double().numpy(), theirs.double().numpy(), rtol=1e-3)


def _backward_events(device: str, build) -> list[str]:
    from tilewise.profiler import ProfilerActivity, profile

    x, y, g = build(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        y.backward(g)
        if device == "cuda":
            tw.cuda.synchronize()
    return [e.key for e in prof.key_averages() for _ in range(e.count)]


def _relu_net(device: str):
    x = tw.randn(4, 8, 5, 5, device=device).requires_grad_()
    y = tw.nn.functional.relu(x * 2)
    return x, y, tw.randn(4, 8, 5, 5, device=device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_relu_backward_is_one_operator_as_in_torch(device):
    """torch's ReluBackward0 is one threshold_backward: a comparison and a multiplication were two kernels."""
    events = _backward_events(device, _relu_net)
    assert events.count("aten::threshold_backward") == 1
    assert "aten::gt" not in events and "aten::mul" in events  # the mul is x * 2's backward


def _bf16_batch_norm(device: str):
    x = tw.randn(4, 8, 5, 5, device=device, dtype=tw.bfloat16).requires_grad_()
    bn = tw.nn.BatchNorm2d(8).to(device)
    return x, bn(x), tw.randn(4, 8, 5, 5, device=device, dtype=tw.bfloat16)


@pytest.mark.cuda
def test_a_bfloat16_batch_norm_backward_writes_its_gradient_in_bfloat16():
    """The input's gradient leaves the batch norm's backward kernel in the input's dtype, as torch's does, not as
    float32 cast by a kernel of its own."""
    events = _backward_events("cuda", _bf16_batch_norm)
    assert not [e for e in events if e.startswith("tw_copy_f32") and "bf16" in e], events


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_norm_backward_of_a_bfloat16_input_is_computed_in_float32_and_rounded_once_as_torch(norm):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, 6).bfloat16().requires_grad_()
    g = torch.randn(4, 8, 5, 6).bfloat16()
    ours = tw.tensor(x.detach().float().numpy()).bfloat16().requires_grad_()
    if norm == "batch":
        theirs_mod, ours_mod = torch.nn.BatchNorm2d(8), tw.nn.BatchNorm2d(8)
    else:
        theirs_mod, ours_mod = torch.nn.LayerNorm(6).bfloat16(), tw.nn.LayerNorm(6).bfloat16()
    theirs_mod(x).backward(g)
    ours_mod(ours).backward(tw.tensor(g.float().numpy()).bfloat16())
    assert ours.grad.dtype is tw.bfloat16
    np.testing.assert_allclose(ours.grad.float().numpy(), x.grad.float().numpy(), rtol=1e-2, atol=1e-2)
    for ours_p, theirs_p in zip(ours_mod.parameters(), theirs_mod.parameters()):
        assert ours_p.grad.dtype.name == str(theirs_p.grad.dtype).removeprefix("torch.")
