"""numpy kernels for the scan, sort and data-movement primitives (``ops/scans.py``, ``ops/movement.py``).

Half-precision inputs are scanned and sorted in float32 (numpy's float16/bfloat16 arithmetic would round at
every step) and cast back once. Sorting is always stable; the descending order is computed by sorting the
reversed slice, which keeps equal elements in their original order and NaN first, like torch.
"""

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.dtypes import compute_dtype
from tilewise.tensor import Tensor, cast_array, from_array, from_array_strided


def _out(array, dtype) -> Tensor:
    array = np.asarray(array)
    return from_array(array, dtype)


def _row_major(array, dtype) -> Tensor:
    """A scan's result, row-major whatever its input's order, as torch's scans lay theirs out (numpy's keep the
    input's order)."""
    return from_array(np.asarray(array, order="C"), dtype)


def _in_order_of(array, t: Tensor, dtype) -> Tensor:
    """A result of ``t``'s shape laid out as torch lays out sort's and flip's: with ``t``'s strides when it is
    dense, else densely in its order (``strides.preserved_strides``)."""
    return from_array_strided(np.asarray(array), S.preserved_strides(t._shape, t._strides), dtype)


def _keys(t: Tensor) -> np.ndarray:
    """The values to compare or accumulate: half precision widened to float32."""
    a = t._np()
    work = compute_dtype(t.dtype).np
    return a if a.dtype == work else a.astype(work)


# ---------------------------------------------------------------- scans

def _accumulate(self, dim, dtype, fn, name):
    """cumsum/cumprod: a running total carried in torch's CPU accumulate type, float64 for a float32 result
    (a float32 total stops growing at 2**24 when adding ones), and rounded to the result dtype at each step,
    which numpy's left-to-right accumulate then cast reproduces bit for bit."""
    from tilewise.ops.dtype_rules import reduction_sum
    from tilewise.ops.registry import OPS

    out_dtype, work = reduction_sum(OPS[name], (self, dim, dtype))
    d = S.normalize_dim(dim, self.ndim, name)
    carry = np.float64 if out_dtype is dtypes.float32 else work.np
    a = self._np()
    if self.dtype is not out_dtype:  # torch converts the input to ``dtype`` first
        a = cast_array(a, out_dtype.np)
    if a.ndim == 0:
        return _out(a.copy(), out_dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # widening first: numpy's dtype= casts element by element
        return _row_major(cast_array(fn(a.astype(carry, copy=False), axis=d), out_dtype.np), out_dtype)


@kernel("cumsum")
def cumsum(self, dim, dtype=None):
    return _accumulate(self, dim, dtype, np.cumsum, "cumsum")


@kernel("cumprod")
def cumprod(self, dim, dtype=None):
    return _accumulate(self, dim, dtype, np.cumprod, "cumprod")


def _running_extreme(self, dim, ufunc, name):
    """Running max/min and the latest position attaining it; a NaN takes over from where it appears."""
    d = S.normalize_dim(dim, self.ndim, name)
    a = _keys(self)
    if a.ndim == 0:
        return _out(a.copy(), self.dtype), _out(np.zeros((), np.int64), dtypes.int64)
    values = ufunc.accumulate(a, axis=d) if a.shape[d] else a.copy()
    attained = (a == values) | (np.isnan(a) if a.dtype.kind == "f" else False)
    positions = np.arange(a.shape[d]).reshape((-1,) + (1,) * (a.ndim - d - 1))
    candidates = np.where(attained, positions, 0)
    indices = np.maximum.accumulate(candidates, axis=d) if a.shape[d] else candidates
    return _row_major(values, self.dtype), _row_major(indices, dtypes.int64)


@kernel("cummax")
def cummax(self, dim):
    return _running_extreme(self, dim, np.maximum, "cummax")


@kernel("cummin")
def cummin(self, dim):
    return _running_extreme(self, dim, np.minimum, "cummin")


# ---------------------------------------------------------------- sorting

def stable_argsort(a: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    ascending_of_reversed = np.argsort(np.flip(a, axis), axis=axis, kind="stable")
    return np.flip(a.shape[axis] - 1 - ascending_of_reversed, axis)


@kernel("sort")
def sort(self, dim=-1, descending=False, stable=False):
    d = S.normalize_dim(dim, self.ndim, "sort")
    a = self._np()
    if a.ndim == 0:
        return _out(a.copy(), self.dtype), _out(np.zeros((), np.int64), dtypes.int64)
    order = stable_argsort(_keys(self), d, descending)
    return _in_order_of(np.take_along_axis(a, order, d), self, self.dtype), _in_order_of(order, self, dtypes.int64)


@kernel("topk")
def topk(self, k, dim=-1, largest=True, sorted=True):
    """Partition so the k wanted elements lead (O(n)), then sort only those; ties keep their input order."""
    from tilewise.ops.scans import check_topk

    d = check_topk(self, k, dim)
    a = self._np()
    if a.ndim == 0:
        return _out(a.copy(), self.dtype), _out(np.zeros((), np.int64), dtypes.int64)
    keys, n = _keys(self), a.shape[d]
    if 0 < k < n:
        chosen = np.argpartition(keys, n - k if largest else k - 1, axis=d)
        chosen = np.sort(np.take(chosen, np.arange(n - k, n) if largest else np.arange(k), axis=d), axis=d)
        order = np.take_along_axis(chosen, stable_argsort(np.take_along_axis(keys, chosen, d), d, largest), d)
    else:
        order = np.take(stable_argsort(keys, d, largest), np.arange(k), axis=d)
    return _out(np.take_along_axis(a, order, d), self.dtype), _out(order, dtypes.int64)


@kernel("searchsorted")
def searchsorted(sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    """torch's binary search, vectorised over every value (see [Note: searchsorted])."""
    from tilewise.ops.scans import check_searchsorted

    from_right, common = check_searchsorted(sorted_sequence, self, out_int32, right, side, sorter)
    work = compute_dtype(common).np
    seq = sorted_sequence._np().astype(work)
    values = (self._np() if isinstance(self, Tensor) else np.asarray(self)).astype(work)
    n = seq.shape[-1]
    rows = seq.reshape(S.numel(seq.shape[:-1]), n)
    if sorter is not None:
        order = sorter._np().reshape(rows.shape)
        bad = order[(order < 0) | (order >= n)]
        if bad.size:
            raise IndexError(f"searchsorted(): sorter: index {int(bad[0])} is out of bounds for dimension "
                             f"{seq.ndim - 1} with size {n}; valid indices are 0..{n - 1} (negative indices are "
                             f"not counted from the end); the indexed tensor has shape {list(seq.shape)}")
        rows = np.take_along_axis(rows, order, 1)
    out_dtype = dtypes.int32 if out_int32 else dtypes.int64
    if values.size == 0:
        return _out(np.zeros(values.shape, np.int64), out_dtype)
    found = _binary_search(rows, values.reshape(rows.shape[0], -1), from_right)
    return _out(found.reshape(values.shape), out_dtype)


def _binary_search(rows: np.ndarray, queries: np.ndarray, from_right: bool) -> np.ndarray:
    """For each query of row r, torch's lower (upper, ``from_right``) bound in ``rows[r]``."""
    lo = np.zeros(queries.shape, np.int64)
    hi = np.full(queries.shape, rows.shape[1], np.int64)
    if rows.shape[1] == 0:
        return lo
    row = np.arange(rows.shape[0])[:, None]
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = lo + ((hi - lo) >> 1)
        at = rows[row, np.minimum(mid, rows.shape[1] - 1)]
        right = ~(at > queries) if from_right else ~(at >= queries)
        lo = np.where(active & right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)


# ---------------------------------------------------------------- movement

@kernel("cat")
def cat(tensors, dim=0):
    from tilewise.ops.movement import cat_memory_format, check_cat

    parts, d, dtype = check_cat(tensors, dim)
    joined = np.concatenate([t._np().astype(dtype.np, copy=False) for t in parts], axis=d)
    # numpy lays the result out in the inputs' order; torch has its own rule
    return from_array_strided(joined, S.format_strides(cat_memory_format(tensors), joined.shape), dtype)


@kernel("flip")
def flip(self, dims):
    axes = S.normalize_dims(dims, self.ndim, "flip")
    a = self._np()
    return _in_order_of(np.flip(a, axes) if a.ndim else a.copy(), self, self.dtype)


@kernel("repeat_interleave.Tensor")
def repeat_interleave_indices(repeats, output_size=None):
    from tilewise.ops.movement import check_repeats, check_repeats_total

    out_dtype = check_repeats(repeats)
    counts = repeats._np().reshape(-1).astype(np.int64)
    check_repeats_total(int(counts.sum()), int(min(counts.min(initial=0), 0)), output_size)
    return _out(np.repeat(np.arange(counts.size), counts), out_dtype)
