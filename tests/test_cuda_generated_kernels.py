"""The eager CUDA pointwise and reduction kernels (kernel IR scheduled and rendered by ``codegen``, sizes and
strides at run time) against torch on the CPU: odd sizes (a ragged last vector), unaligned and strided views,
broadcasting, by-value scalars, the vector and scalar variants, rows, columns, split reductions and the
arg-reductions with NaN and ties.

Everything here is marked ``cuda`` and skipped where no GPU is found (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

pytestmark = pytest.mark.cuda


def _pair(a: np.ndarray, dtype: str = "float32"):
    """(tilewise CUDA tensor, torch CPU tensor) of the same values in ``dtype``."""
    a = np.asarray(a)
    t = torch.from_numpy(a).to(getattr(torch, dtype))
    x = tw.from_numpy(a).cuda().to(tw.dtypes.from_name(dtype))
    return x, t


def _same(got, want: torch.Tensor, rtol: float = 0.0, atol: float = 0.0) -> None:
    got = torch.from_numpy(got.cpu().float().numpy() if got.dtype in (tw.bfloat16, tw.float16) else got.cpu().numpy())
    want = want.float() if want.dtype in (torch.bfloat16, torch.float16) else want
    assert tuple(got.shape) == tuple(want.shape)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False)


def _rand(shape, seed=0):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape), np.float32)


# ---------------------------------------------------------------------------------------------- pointwise

@pytest.mark.parametrize("n", [1, 3, 4, 1000, 1000003])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int32", "uint8"])
def test_contiguous_add_with_ragged_end_and_unaligned_views(n, dtype):
    a, b = (_rand((n + 1,), s) * 10 for s in (0, 1))
    if dtype in ("int32", "uint8"):
        a, b = np.abs(a).astype(np.int64), np.abs(b).astype(np.int64)
    x, t = _pair(a, dtype)
    y, u = _pair(b, dtype)
    _same(tw.add(x[:n], y[:n], alpha=2), torch.add(t[:n], u[:n], alpha=2), rtol=1e-2 if dtype == "bfloat16" else 0)
    _same(x[1:] + y[:n], t[1:] + u[:n], rtol=1e-2 if dtype == "bfloat16" else 0)  # unaligned: the scalar variant
    _same(x[:n] * 3, t[:n] * 3, rtol=1e-2 if dtype == "bfloat16" else 0)


@pytest.mark.parametrize("shapes", [((64, 1000), (1000,)), ((7, 1, 5), (1, 3, 1)), ((3, 1), (1,)), ((), (4, 5)),
                                    ((0, 5), (5,)), ((2, 3, 4, 5, 6), (3, 1, 5, 1))])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int64"])
def test_broadcast_mul(shapes, dtype):
    a, b = _rand(shapes[0], 2) * 4, _rand(shapes[1], 3) * 4
    if dtype == "int64":
        a, b = a.astype(np.int64), b.astype(np.int64)
    x, t = _pair(a, dtype)
    y, u = _pair(b, dtype)
    _same(x * y, t * u, rtol=1e-2 if dtype == "bfloat16" else 0)
    _same(y * x, u * t, rtol=1e-2 if dtype == "bfloat16" else 0)


@pytest.mark.parametrize("shape", [(512, 256), (33, 17), (1, 5), (3, 4, 5)])
def test_strided_copy_cast(shape):
    a = _rand(shape, 4) * 100
    x, t = _pair(a)
    xt, tt = x.transpose(0, -1), t.transpose(0, -1)
    _same(xt.to(tw.bfloat16), tt.to(torch.bfloat16))
    _same(xt.contiguous(), tt.contiguous())
    _same(x[..., ::2].to(tw.int32), t[..., ::2].to(torch.int32))
    out, want = tw.zeros(shape[::-1], device="cuda").transpose(0, -1), torch.zeros(shape[::-1]).transpose(0, -1)
    out.copy_(x.to(tw.float64))  # a strided destination
    want.copy_(t.double())
    _same(out, want)


def test_by_value_and_0_dim_operands():
    a = _rand((1001,), 5)
    x, t = _pair(a)
    host, dev = tw.tensor(2.5), tw.tensor(-1.5, device="cuda")
    _same(x * host, t * 2.5)
    _same(x + dev, t - 1.5)
    _same(tw.where(x > 0, x, 0.25), torch.where(t > 0, t, 0.25))
    _same(dev * dev, torch.tensor(2.25))
    _same((x > 0) & (x < 1), (t > 0) & (t < 1))
    _same(tw.floor_divide(x.to(tw.int64), 3), torch.floor_divide(t.to(torch.int64), 3))


def test_in_place_updates_aligned_and_not():
    a = _rand((1027,), 6)
    x, t = _pair(a)
    y, u = _pair(a + 1)
    x.add_(y, alpha=0.5)
    t.add_(u, alpha=0.5)
    _same(x, t)
    x[3:].mul_(2)
    t[3:].mul_(2)
    _same(x, t)


# ---------------------------------------------------------------------------------------------- reductions

REDUCTIONS = [((37, 1001), 1), ((1001, 37), 0), ((1001, 37), 1), ((1 << 20) + 3,), ((8192, 64), 0),
              ((16, 32, 64), (0, 2)), ((4096, 3), 1), ((3, 4096), 0), ((), ()), ((5, 0), 1), ((64, 50000), 1),
              ((3, 1081345), 1), ((1081345,),)]  # split rows whose chunks, rounded to whole vectors, overrun


@pytest.mark.parametrize("case", REDUCTIONS, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "float64"])
def test_sum_amax_prod_over_rows_columns_and_splits(case, dtype):
    shape, dim = case[0], (case[1] if len(case) > 1 else None)
    a = np.round(_rand(shape, 7) * 4)
    x, t = _pair(a, dtype)
    big = x.numel() > 10000
    rtol = 2e-2 if dtype == "bfloat16" else (1e-4 if dtype == "float32" else 0)
    _same(x.sum(dim), t.sum(dim) if dim is not None else t.sum(), rtol=rtol, atol=1e-2 if big else 0)
    _same(x.transpose(0, -1).sum(dim) if x.ndim else x.sum(), t.transpose(0, -1).sum(dim) if t.ndim else t.sum(),
          rtol=rtol, atol=1e-2 if big else 0)
    if x.numel() and all(shape[d] for d in ((dim,) if isinstance(dim, int) else dim or ())):
        _same(x.amax(dim) if dim is not None else x.amax(), t.amax(dim) if dim is not None else t.amax())
        _same(x.amin(dim) if dim is not None else x.amin(), t.amin(dim) if dim is not None else t.amin())
    if not big and isinstance(dim, int):
        small = (x.abs() < 2).to(x.dtype) + 1 if dtype != "int32" else x.abs().clamp(max=1) + 1
        small_t = (t.abs() < 2).to(t.dtype) + 1 if dtype != "int32" else t.abs().clamp(max=1) + 1
        _same(small[..., :20].prod(dim), small_t[..., :20].prod(dim), rtol=rtol)


@pytest.mark.parametrize("case", REDUCTIONS[:8], ids=str)
def test_any_all_of_every_layout(case):
    shape, dim = case[0], (case[1] if len(case) > 1 else None)
    a = _rand(shape, 8)
    a[a < 2.5] = 0
    x, t = _pair(a)
    for f in ("any", "all"):
        got = getattr(x != 0, f)(dim) if isinstance(dim, int) else getattr(x != 0, f)()
        want = getattr(t != 0, f)(dim) if isinstance(dim, int) else getattr(t != 0, f)()
        _same(got, want)


@pytest.mark.parametrize("shape,dim", [((37, 1001), 1), ((1001, 37), 0), ((64, 50000), 1), (((1 << 20) + 3,), None)],
                         ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_arg_reductions_with_nan_and_ties(shape, dim, dtype):
    a = np.round(_rand(shape, 9) * 3)
    flat = a.reshape(-1)
    flat[::97] = 50.0  # many ties for the maximum
    flat[::89] = -50.0
    if dtype != "int64":
        flat[1234 % flat.size] = np.nan
        flat[4321 % flat.size] = np.nan
    x, t = _pair(a, dtype)
    _same(x.argmax(dim), t.argmax(dim))
    _same(x.argmin(dim), t.argmin(dim))
    if dim is not None:
        for name in ("max", "min"):
            got, want = getattr(x, name)(dim, keepdim=True), getattr(t, name)(dim, keepdim=True)
            _same(got[0], want.values)
            _same(got[1], want.indices)


def test_arg_reduction_of_0_dim_and_transposed():
    x, t = _pair(np.array(3.0, np.float32))
    _same(x.argmax(), t.argmax())
    a = np.round(_rand((300, 7), 10))
    x, t = _pair(a)
    _same(x.t().argmax(1), t.t().argmax(1))
    _same(x.t().argmin(0), t.t().argmin(0))
