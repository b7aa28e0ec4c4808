"""Float reductions that neither overflow nor drift, against torch: cumsum and var/std and their gradients.

torch's CPU cumsum carries a float32 running total in float64 (a float32 total stops growing at 2**24 when
adding ones), and its var/std sum squared deviations in float64 (Welford), so 1e20-sized values give a finite
standard deviation and values near a large mean lose nothing. The gradient of std at a constant input is 0.
Each is checked in eager mode and through ``tilewise.compile``, on the CPU and (marked ``cuda``) on a GPU
against torch's CPU answer, to float32 rounding.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.codegen.toolchain import nvrtc_available

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")  # torch and tilewise both warn
HALVES = ["float16", "bfloat16"]
FLOATS = [*HALVES, "float32", "float64"]


def pair(a, dtype: str, device: str = "cpu", requires_grad: bool = False):
    ours = tw.tensor(np.asarray(a)).to(getattr(tw, dtype)).to(device)  # a leaf on the device
    theirs = torch.tensor(np.asarray(a)).to(getattr(torch, dtype))
    if requires_grad:
        ours, theirs = ours.detach().requires_grad_(), theirs.detach().requires_grad_()
    return ours, theirs


def as_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.double() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
    t = t.detach().cpu()
    return (t.double() if t.dtype in (tw.bfloat16, tw.float16) else t).numpy()


def assert_within_ulps(ours, theirs, ulps: int = 0, what: str = "") -> None:
    """Same shape and dtype, and values at most ``ulps`` steps of ``theirs``' dtype apart (NaN and inf equal).
    float64 results come from float64 arithmetic in another order than torch's, so there a relative 1e-8 (a
    spread of 1e-2 around 1e4 cancels six digits of the sixteen)."""
    assert tuple(ours.shape) == tuple(theirs.shape), what
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch."), f"{what}: {ours.dtype} != {theirs.dtype}"
    a, e = as_numpy(ours), as_numpy(theirs)
    if ulps == 0:
        np.testing.assert_array_equal(a, e, err_msg=what)
        return
    np.testing.assert_array_equal(np.isfinite(a), np.isfinite(e), err_msg=what)
    finite = np.isfinite(e)
    np.testing.assert_array_equal(a[~finite], e[~finite], err_msg=what)
    step = np.spacing(np.abs(e[finite]).astype(np.float32))
    if theirs.dtype == torch.float64:
        step = np.abs(e[finite]) * 1e-8 / ulps + 1e-300
    elif theirs.dtype in (torch.float16, torch.bfloat16):
        step = np.abs(e[finite]) * (2.0 ** -10 if theirs.dtype == torch.float16 else 2.0 ** -7) + 1e-30
    assert np.all(np.abs(a[finite] - e[finite]) <= ulps * step), f"{what}: {a} vs torch {e}"


# ============================================================================ cumsum

@pytest.mark.parametrize("device", DEVICES)
def test_float32_cumsum_of_twenty_million_ones_counts_to_twenty_million(device):
    ours, theirs = tw.ones(2 * 10**7, device=device), torch.ones(2 * 10**7)
    assert ours.cumsum(0)[-1].item() == theirs.cumsum(0)[-1].item() == 2e7
    compiled = tw.compile(lambda x: x.cumsum(0))
    np.testing.assert_array_equal(as_numpy(compiled(ours)), as_numpy(theirs.cumsum(0)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dim", [((100_000,), 0), ((300, 400), 1), ((300, 400), 0), ((6, 50, 7), 1)], ids=str)
def test_float32_cumsum_and_cumprod_are_torchs_float64_running_totals_rounded(shape, dim, device):
    """Bit for bit on the CPU (the same left-to-right float64 total); within one float32 step on a GPU, whose
    tree-shaped scan adds in another order."""
    rng = np.random.default_rng(0)
    ulps = 0 if device == "cpu" else 1
    ours, theirs = pair(rng.standard_normal(shape) + 0.1, "float32", device)
    assert_within_ulps(ours.cumsum(dim), theirs.cumsum(dim), ulps, "cumsum")
    assert_within_ulps(tw.compile(lambda x: x.cumsum(dim))(ours), theirs.cumsum(dim), ulps, "compiled cumsum")
    near_one, near_one_theirs = pair(1 + rng.standard_normal(shape) * 1e-3, "float32", device)
    assert_within_ulps(near_one.cumprod(dim), near_one_theirs.cumprod(dim), ulps, "cumprod")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALVES)
def test_half_cumsum_matches_torch(dtype, device):
    ours, theirs = pair(np.random.default_rng(1).standard_normal((4, 3000)), dtype, device)
    if device == "cpu":
        assert_within_ulps(ours.cumsum(1), theirs.cumsum(1), 0, f"{dtype} cumsum")
        return
    # a parallel scan adds in another order than torch's CPU loop: each running total may differ by one step of
    # the dtype at the size the row's totals reached so far (near a crossing of zero, that is many of its ulps)
    got, want = as_numpy(ours.cumsum(1)).astype(np.float64), as_numpy(theirs.cumsum(1)).astype(np.float64)
    scale = np.maximum.accumulate(np.abs(want), axis=1)
    step = scale * (2.0 ** -10 if dtype == "float16" else 2.0 ** -7)
    assert np.all(np.abs(got - want) <= step + 1e-30), f"{dtype} cumsum on cuda"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source,target", [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"),
                                           ("float64", "float32"), ("int64", "float32")])
def test_cumsum_with_dtype_converts_the_input_first(source, target, device):
    a = np.random.default_rng(2).standard_normal((3, 2000)) * 10
    ours, theirs = pair(a, source, device)
    got, expected = ours.cumsum(1, dtype=getattr(tw, target)), theirs.cumsum(1, dtype=getattr(torch, target))
    assert_within_ulps(got, expected, 0 if device == "cpu" else 1, f"{source} -> {target}")


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
def test_every_cuda_scan_with_a_dtype_conversion_compiles():
    from tilewise.backends.cuda.kernels.scan import render_scan
    from tilewise.codegen.toolchain import compile_cuda
    from tilewise.ops.registry import OPS

    sources = {}
    for op, combiner in (("cumsum", "add"), ("cumprod", "mul")):
        for source in ("float32", "float16", "bfloat16", "float64", "int32", "bool"):
            for target in ("float16", "bfloat16", "float32", "float64", "int64"):
                x = tw.empty(2, dtype=getattr(tw, source))
                out_dtype, compute = OPS[op].dtype_rule(OPS[op], (x, 0, getattr(tw, target)))
                name = f"tw_{op}_{source}_{target}"
                sources[name] = render_scan(name, combiner, x.dtype, compute, out_dtype, 2)
                if compute.is_floating_point:
                    assert "double carry" in sources[name], f"{name}: the running total is not carried in float64"
    names = sorted(sources)
    compiled = compile_cuda("\n".join(sources[n] for n in names), names, "sm_90")
    assert all(f".entry {n}(" in compiled.ptx for n in names)


# ============================================================================ var and std

HUGE = [1e20, -1e20, 3e20]


@pytest.mark.parametrize("device", DEVICES)
def test_std_of_huge_float32_values_is_finite_like_torchs(device):
    ours, theirs = pair(HUGE, "float32", device)
    for name in ("std", "var"):
        assert_within_ulps(getattr(ours, name)(), getattr(theirs, name)(), 1, name)
    for name in ("std_mean", "var_mean"):
        for got, expected in zip(getattr(tw, name)(ours), getattr(torch, name)(theirs)):
            assert_within_ulps(got, expected, 1, name)
    assert np.isfinite(ours.std().item()) and ours.std().item() == pytest.approx(2e20, rel=1e-6)
    compiled = tw.compile(lambda x: (x.std(), x.var(0, keepdim=True), *tw.std_mean(x, correction=0)))
    expected = (theirs.std(), theirs.var(0, keepdim=True), *torch.std_mean(theirs, correction=0))
    for got, want in zip(compiled(ours), expected):
        assert_within_ulps(got, want, 1, "compiled")


def _moment_calls():
    """(name, kwargs) for var/std/var_mean/std_mean over dims, keepdim, unbiased and correction."""
    calls = []
    for name in ("var", "std", "var_mean", "std_mean"):
        for kwargs in ({}, {"dim": 1}, {"dim": (0, 2), "keepdim": True}, {"dim": -1, "unbiased": False},
                       {"dim": 1, "correction": 0}, {"dim": (1,), "correction": 2, "keepdim": True},
                       {"unbiased": True}, {"dim": 0, "correction": 3}):
            calls.append((name, kwargs))
    return calls


def _call(lib, name, x, kwargs):
    out = getattr(lib, name)(x, **kwargs)
    return tuple(out) if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("offset", [0.0, 1e4, 1e20], ids=["centred", "near-1e4", "huge"])
def test_var_std_match_torch_over_dims_keepdim_and_corrections(offset, dtype, device):
    """Values spread by 1e-2 around ``offset``: a float32 mean of values near 1e4 is off by about 1e-3, a tenth
    of the spread, so float32 two-pass arithmetic would be off by percents. The reference is torch on the same
    values in float64, rounded: torch's own float32 whole-tensor var takes a float32 mean first and is off by
    2e-4 (relative) on this input, which its float64 answer and numpy's are not."""
    if offset == 1e20 and dtype in HALVES:
        pytest.skip("1e20 does not fit a half-precision type")
    rng = np.random.default_rng(3)
    a = offset + rng.standard_normal((3, 4, 5)) * (1e-2 if offset else 1.0)
    ours, theirs = pair(a, dtype, device)
    for name, kwargs in _moment_calls():
        expected = [e.to(theirs.dtype) for e in _call(torch, name, theirs.double(), kwargs)]
        for got, want in zip(_call(tw, name, ours, kwargs), expected):
            assert_within_ulps(got, want, 1, f"{name}({kwargs})")
        if "dim" in kwargs:  # along dims torch's float32 kernel is float64 Welford: its own answer agrees
            for got, want in zip(_call(tw, name, ours, kwargs), _call(torch, name, theirs, kwargs)):
                assert_within_ulps(got, want, 1, f"{name}({kwargs}) against torch in {dtype}")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_var_std_match_torch(device):
    def moments(lib, x):
        return (x.var(1), x.std(), *lib.std_mean(x, (0, 2), keepdim=True), *lib.var_mean(x, -1, correction=0))

    compiled = tw.compile(lambda x: moments(tw, x))
    rng = np.random.default_rng(4)
    for offset in (0.0, 1e4, 1e20):
        ours, theirs = pair(offset + rng.standard_normal((3, 4, 5)) * (1e-2 if offset else 1.0), "float32", device)
        for got, expected in zip(compiled(ours), moments(torch, theirs.double())):  # see the test above
            assert_within_ulps(got, expected.float(), 1, f"offset {offset}")


# ---------------------------------------------------------------------------- gradients

def _gradient(lib, name, x, kwargs, g):
    outputs = _call(lib, name, x, kwargs)
    grads = [g[: o.numel()].reshape(tuple(o.shape)) for o in outputs]
    return lib.autograd.grad(outputs, [x], grads)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients_at_a_constant_input_match_torch(dtype, device):
    """std at a constant slice: 0, not NaN; with no degree of freedom left (correction == n): NaN, like torch."""
    a = np.full((3, 4, 5), 2.5)
    a[1] = np.arange(20).reshape(4, 5)  # one varying slice beside constant ones
    g = np.random.default_rng(6).integers(-3, 4, 60).astype(np.float64)
    for name, kwargs in [*_moment_calls(), ("std", {"dim": 2, "correction": 5}), ("var", {"dim": 2, "correction": 5})]:
        ours, theirs = pair(a, dtype, device, requires_grad=True)
        g_ours, g_theirs = pair(g, dtype, device)
        got = _gradient(tw, name, ours, kwargs, g_ours)
        expected = _gradient(torch, name, theirs, kwargs, g_theirs)
        np.testing.assert_allclose(as_numpy(got), as_numpy(expected), rtol=1e-6, atol=1e-6, equal_nan=True,
                                   err_msg=f"{name}({kwargs})")


def test_std_gradient_of_a_constant_vector_is_zero():
    x = tw.tensor([2.0, 2.0, 2.0], requires_grad=True)
    x.std().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # running eagerly instead would not test the compiler
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_gradients_at_a_constant_input_match_torch(device):
    def both(lib, x):
        return lib.autograd.grad(x.std(1).sum() + x.var() + lib.std_mean(x, 0)[0].sum(), x)[0]

    compiled = tw.compile(lambda x: both(tw, x))
    a = np.full((3, 4), 1.5)
    a[2] = [1.0, 2.0, 3.0, 5.0]
    ours, theirs = pair(a, "float32", device, requires_grad=True)
    np.testing.assert_allclose(as_numpy(compiled(ours)), as_numpy(both(torch, theirs)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int32", "uint8"])
def test_tensor_of_an_ndarray_converts_out_of_range_values_as_torch_without_a_warning(dtype):
    values = np.array([1e10, -1e10, np.nan, np.inf, -np.inf, 3.5, -2.7, 1e-9])
    if dtype in ("int32", "uint8"):
        values = np.array([1e10, -3.7, 2.9, 300.0, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = tw.tensor(values, dtype=getattr(tw, dtype))
    theirs = torch.tensor(values, dtype=getattr(torch, dtype))
    np.testing.assert_array_equal(ours.double().numpy(), theirs.double().numpy())
    values[0] = 7.0  # a copy, as torch's
    assert float(ours[0].double()) == float(theirs[0].double())
