"""numpy kernels for the primitives of ``ops/special.py`` and ``ops/sets.py`` that are not expressions:
integer loops (gcd, lcm), bit fields (frexp), and the data-dependent ones whose result size depends on the
values (unique, bincount, histc, ...). On CUDA they run here on host copies (``kernels/fallback.py``).
"""

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor, from_array


def _array(value, dtype) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._np().astype(dtype.np, copy=False)
    return np.asarray(value, dtype=dtype.np)


def _integer_pair(name: str, fn):
    def run(self, other):
        out, _ = OPS[name].dtype_rule(OPS[name], (self, other))
        return from_array(np.asarray(fn(_array(self, out), _array(other, out))).astype(out.np), out)

    return run


kernel("gcd")(_integer_pair("gcd", np.gcd))
def _lcm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch's ``abs(a / gcd * b)``: for 8- and 16-bit integers C++ computes it in int (so the absolute value is
    taken before the result wraps to the dtype); for wider ones in the dtype itself."""
    if a.dtype.itemsize < 4:
        return np.abs(np.lcm(a.astype(np.int32), b.astype(np.int32)))
    return np.abs(np.lcm(a, b))


kernel("lcm")(_integer_pair("lcm", _lcm))


@kernel("frexp.Tensor")
def frexp(self):
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"torch.frexp() only supports floating-point dtypes (got {self.dtype.name})")
    mantissa, exponent = np.frexp(self._np().astype(np.float32 if self.dtype.itemsize < 4 else self.dtype.np))
    return from_array(mantissa.astype(self.dtype.np), self.dtype), from_array(exponent.astype(np.int32),
                                                                              dtypes.int32)


# ---------------------------------------------------------------- data-dependent sizes (ops/sets.py)
def _moved(a: np.ndarray, dim: int | None) -> np.ndarray:
    """The slices along ``dim`` as rows of a 2-d array (the elements themselves when ``dim`` is None)."""
    if dim is None:
        return a.reshape(-1, 1)
    return np.moveaxis(a, dim, 0).reshape(a.shape[dim], -1)


def _group_starts(rows: np.ndarray) -> np.ndarray:
    """Where each run of equal consecutive rows begins (NaN equals nothing, as in torch)."""
    if rows.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    differs = np.ones(rows.shape[0], dtype=bool)
    if rows.shape[1]:
        differs[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    else:
        differs[1:] = False
    return differs


def _unique_of_empty(self, dim: int) -> tuple:
    """torch's unique along ``dim`` of an empty tensor: empty results when ``dim`` is its only dim of size 0, an
    error otherwise (the slices along ``dim`` would be empty and could not be told apart)."""
    zero_dims = [k for k, n in enumerate(self.shape) if n == 0]
    if self.shape[dim] != 0:
        raise RuntimeError(f"There are 0 sized dimensions, and they aren't selected, so unique cannot be applied "
                           f"(unique along dim {dim} of a tensor of shape {list(self.shape)}; dims {zero_dims} have "
                           "size 0)")
    if len(zero_dims) > 1:
        raise RuntimeError(f"Number of zero sized dimensions is more than one, so unique cannot be applied (unique "
                           f"along dim {dim} of a tensor of shape {list(self.shape)})")
    inverse, counts = (from_array(np.zeros(0, dtype=np.int64), dtypes.int64) for _ in range(2))
    return from_array(self._np().copy(), self.dtype), inverse, counts


@kernel("unique_dim")
def unique_dim(self, sorted=True, return_inverse=False, return_counts=False, dim=None, consecutive=False):
    a = self._np()
    if dim is not None:
        dim = S.normalize_dim(dim, a.ndim, "unique")
        if a.ndim == 0:
            raise IndexError(f"unique: Dimension out of range (expected to be in range of [-1, 0], but got {dim})")
        if a.size == 0:
            return _unique_of_empty(self, dim)
    rows = _moved(a, dim)
    order = np.arange(rows.shape[0])
    if not consecutive:
        keys = rows.astype(np.float64) if a.dtype.kind == "V" or a.dtype.itemsize < 4 and a.dtype.kind == "f" else rows
        order = np.lexsort(keys.T[::-1]) if rows.shape[1] else order
    ordered = rows[order]
    starts = _group_starts(ordered)
    group = np.cumsum(starts) - 1
    inverse = np.empty(rows.shape[0], dtype=np.int64)
    inverse[order] = group
    counts = np.diff(np.append(np.flatnonzero(starts), rows.shape[0])).astype(np.int64)
    firsts = ordered[starts]
    if dim is None:
        values = firsts.reshape(-1)
        inverse = inverse.reshape(a.shape)
    else:
        kept = tuple(n for k, n in enumerate(a.shape) if k != dim)
        values = np.moveaxis(firsts.reshape((firsts.shape[0], *kept)), 0, dim)  # torch's layout: dim outermost
    return (from_array(values, self.dtype), from_array(inverse, dtypes.int64),
            from_array(counts, dtypes.int64))


@kernel("bincount")
def bincount(self, weights=None, minlength=0):
    if self.dtype.is_floating_point:
        raise NotImplementedError(f'"bincount_cpu" not implemented for \'{self.dtype.name}\'')
    a = self._np()
    if a.ndim != 1 or self.dtype is dtypes.bool_ or (a.size and a.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError(f"minlength should be >= 0 (got {minlength})")
    out, _ = OPS["bincount"].dtype_rule(OPS["bincount"], (self, weights, minlength))
    if weights is not None and tuple(weights.shape) != tuple(self.shape):
        raise RuntimeError(f"weights should be 1-d and have the same length as input (got weights of shape "
                           f"{list(weights.shape)} for input of shape {list(self.shape)})")
    w = None if weights is None else weights._np().astype(np.float64)
    counts = np.bincount(a.astype(np.int64), weights=w, minlength=minlength)
    return from_array(counts.astype(out.np), out)


@kernel("histc")
def histc(self, bins=100, min=0, max=0):
    if not self.dtype.is_floating_point:
        raise NotImplementedError(f'"histogram_cpu" not implemented for \'{self.dtype.name}\'')
    if bins <= 0:
        raise RuntimeError(f"torch.histc: bins must be > 0, but got {bins} for dimension 0")
    a = self._np().astype(np.float64).reshape(-1)
    lo, hi = float(min), float(max)
    if lo == hi and a.size:
        lo, hi = float(a.min()), float(a.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi:
        raise RuntimeError(f"torch.histc: max must be larger than min (got min {min}, max {max})")
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo}, {hi}] is not finite")
    inside = a[(a >= lo) & (a <= hi)]
    position = np.minimum(((inside - lo) * bins / (hi - lo)).astype(np.int64), bins - 1)
    return from_array(np.bincount(position, minlength=bins).astype(self.dtype.np), self.dtype)


def _complex_log_add_exp(x, y):
    """log(exp(x) + exp(y)) of complex values as torch forms it: the larger real part taken out and log1p of the
    exp of the difference; two equal infinite real parts give x where -inf (the angle is lost in exp's 0) and the
    plain formula where +inf; a nan real part, nan."""
    larger = x.real >= y.real
    hi, lo = np.where(larger, x, y), np.where(larger, y, x)
    out = hi + np.log1p(np.exp(lo - hi))
    same_inf = ~np.isfinite(lo.real) & (lo.real == hi.real)
    out = np.where(same_inf & (lo.real < 0), x, out)
    out = np.where(same_inf & (lo.real > 0), np.log(np.exp(x) + np.exp(y)), out)
    return np.where(np.isnan(x.real) | np.isnan(y.real), np.complex128(complex(np.nan, np.nan)), out).astype(x.dtype)


def _complex_logcumsumexp(a, dim):
    work = np.moveaxis(a, dim, 0).copy()
    for i in range(1, work.shape[0]):
        work[i] = _complex_log_add_exp(work[i - 1], work[i])
    return np.moveaxis(work, 0, dim)


@kernel("logcumsumexp")
def logcumsumexp(self, dim):
    a = self._np()
    work = a.astype(np.float32) if self.dtype.itemsize < 4 else a
    if a.ndim == 0:
        return from_array(a.copy(), self.dtype)
    d = dim % a.ndim
    with np.errstate(all="ignore"):
        if np.iscomplexobj(a):
            out = _complex_logcumsumexp(work, d)
        else:
            out = np.logaddexp.accumulate(work, axis=d) if a.size else work
    return from_array(np.asarray(out).astype(self.dtype.np, order="C"), self.dtype)  # row-major, as torch's


# ---------------------------------------------------------------- reductions into indexed positions (ops/indexed.py)
_SCATTER_UFUNCS = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.fmax, "amin": np.fmin}


@kernel("scatter_reduce.two")
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    from tilewise.backends.cpu.kernels import _at_least_1d, _check_gather_index
    from tilewise.ops.indexed import canonical_reduction

    reduce = canonical_reduction(reduce, "scatter_reduce")
    d, idx = _check_gather_index(self, dim, index, "scatter_reduce", src)
    dtype = self.dtype
    if idx.size == 0:
        return from_array(self._np().copy(), dtype)
    work = np.float32 if dtype.is_floating_point and dtype.itemsize < 4 else dtype.np
    out = _at_least_1d(self).astype(work, copy=True)
    values = _at_least_1d(src)[tuple(slice(0, n) for n in idx.shape)].astype(work)
    grids = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx
    where = tuple(grids)
    if not include_self:  # positions that receive a value start from the reduction's identity
        written = np.zeros(out.shape, dtype=bool)
        written[where] = True
        out[written] = _identity(reduce, out.dtype)
    if reduce in ("amax", "amin"):
        nan_out = np.zeros(out.shape, dtype=bool)  # fmax/fmin skip NaN, torch's amax/amin propagate it
        np.logical_or.at(nan_out, where, np.isnan(values) if values.dtype.kind == "f" else False)
        _SCATTER_UFUNCS[reduce].at(out, where, values)
        out = np.where(nan_out | (np.isnan(out) if out.dtype.kind == "f" else False), np.nan, out) \
            if out.dtype.kind == "f" else out
    else:
        _SCATTER_UFUNCS[reduce].at(out, where, values)
    if reduce == "mean":
        counts = np.full(out.shape, 1 if include_self else 0, dtype=np.int64)
        np.add.at(counts, where, 1)
        counts = np.maximum(counts, 1)
        out = out / counts if out.dtype.kind == "f" else np.floor_divide(out, counts)
    return from_array(np.asarray(out).astype(dtype.np, order="C").reshape(self.shape), dtype)  # row-major, as torch's


def _identity(reduce: str, dtype: np.dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is None:
        return reduce == "amin"
    return info.min if reduce == "amax" else info.max
