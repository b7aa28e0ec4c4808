"""numpy kernels for primitives that are not scalar expressions or plain reductions."""

from __future__ import annotations

import math

import numpy as np

from tilewise import _philox
from tilewise import strides as S
from tilewise.backends.cpu.fma import fma
from tilewise.backends.cpu.registry import kernel
from tilewise.backends.cpu.render import run_quietly
from tilewise.backends.cpu.threads import gemm_threads, use_blas_threads
from tilewise.device import backend_for, cpu
from tilewise.layouts import copy_strides
from tilewise.ops.indexing import check_gather_shapes, mask_positions, nonempty_shape
from tilewise.tensor import (
    Tensor,
    cast_array,
    from_array,
    from_array_strided,
    from_contiguous_array,
    strided_copy,
)


def _out(array, dtype) -> Tensor:
    array = np.asarray(array)
    if array.dtype is dtype.np and array.flags.c_contiguous:  # a kernel's fresh result, usually
        return from_contiguous_array(array, dtype)
    return from_array(array, dtype)


def _check_cpu(device, op: str) -> None:
    if device is not None and device is not cpu:
        raise RuntimeError(f"{op}: the CPU backend cannot create a tensor on {device}")


# ---------------------------------------------------------------- creation and copies

@kernel("full")
def full(size, fill_value, dtype=None, device=None):
    if _all_zero_bits(fill_value):
        # calloc'd pages: no write until first touched (an optimizer's state, zeros a compile only traces through)
        return _out(np.zeros(size, dtype=dtype.np), dtype)
    if dtype.is_float8:
        fill_value = cast_array(np.asarray(fill_value), dtype.np)
    return _out(np.full(size, fill_value, dtype=dtype.np), dtype)


def _all_zero_bits(value) -> bool:
    """Whether ``value`` is a zero whose bytes are all zero in every dtype (not -0.0, whose sign bit is set)."""
    if type(value) is complex:
        return _all_zero_bits(value.real) and _all_zero_bits(value.imag)
    return type(value) in (int, float, bool) and value == 0 and math.copysign(1.0, value) > 0


@kernel("empty")
def empty(size, dtype=None, device=None):
    return _out(np.empty(size, dtype=dtype.np), dtype)


@kernel("arange")
def arange(start, end, step=1, dtype=None, device=None):
    length = max(int(np.ceil((end - start) / step)), 0)
    if dtype.is_floating_point:
        values = start + np.arange(length, dtype=np.float64) * step
    else:
        values = start + np.arange(length, dtype=np.int64) * int(step)
    return _out(values, dtype)


@kernel("linspace")
def linspace(start, end, steps, dtype=None, device=None):
    if steps < 2:  # torch fills the start, whatever the end
        return _out(np.full(steps, start), dtype)
    if dtype.is_complex:
        return _out(np.linspace(start, end, steps, dtype=np.complex128), dtype)
    return _out(_torch_linspace(start, end, steps, dtype.np), dtype)


def _torch_linspace(start, end, steps: int, np_dtype) -> np.ndarray:
    """torch's linspace, to the bit: the first half counts up from ``start`` (``start + step * i``), the second down
    from ``end`` (``end - step * (steps - 1 - i)``), so both ends are exact. float32 and float64 compute in their
    own dtype with one rounding (torch's kernel is contracted to a fused multiply-add); float16 and bfloat16 round
    the product and the sum to the dtype each (their arithmetic goes through float32 an operation at a time);
    integers compute in float64 and truncate toward zero."""
    index = np.arange(steps)
    first_half = index < steps // 2
    with np.errstate(all="ignore"):  # an infinite or NaN end gives NaN where torch's does
        if np_dtype.kind in "iu":
            low, high = np_dtype.type(start), np_dtype.type(end)  # (checked to fit by the operator)
            step = (np.float64(high) - np.float64(low)) / (steps - 1)
            up = fma(np.float64(step), index.astype(np.float64), np.float64(low))
            down = fma(np.float64(-step), (steps - 1 - index).astype(np.float64), np.float64(high))
            return np.trunc(np.where(first_half, up, down)).astype(np.int64).astype(np_dtype)
        low, high = np_dtype.type(start), np_dtype.type(end)
        if np_dtype.itemsize >= 4:
            step = (high - low) / np_dtype.type(steps - 1)
            up = fma(step, index.astype(np_dtype), low)
            down = fma(-step, (steps - 1 - index).astype(np_dtype), high)
            return np.where(first_half, up, down)
        low, high = _in_dtype(low, np_dtype), _in_dtype(high, np_dtype)
        step = _in_dtype(_in_dtype(high - low, np_dtype) / _in_dtype(steps - 1, np_dtype), np_dtype)
        up = low + _in_dtype(step * _in_dtype(index, np_dtype), np_dtype)
        down = high - _in_dtype(step * _in_dtype(steps - 1 - index, np_dtype), np_dtype)
        return np.where(first_half, up, down).astype(np_dtype)


def _in_dtype(value, np_dtype) -> np.ndarray:
    """``value`` rounded to a 16-bit float dtype and held in float32, where that dtype's arithmetic happens."""
    return np.asarray(value).astype(np_dtype).astype(np.float32)


@kernel("eye")
def eye(n, m=None, dtype=None, device=None):
    return _out(np.eye(n, m if m is not None else n), dtype)


@kernel("_to_copy")
def to_copy(self, dtype=None, device=None, non_blocking=False, memory_format=None):
    dtype = dtype or self.dtype
    if device is not None and device is not cpu:
        # the backend sees the source, pinned or not
        return backend_for(device).upload(self, device, non_blocking, dtype, memory_format)
    strides = copy_strides(self, memory_format)
    a = self._np()
    if a.dtype == dtype.np:
        return _copy(a, self, strides, dtype)
    if strides == S.contiguous_strides(self._shape):
        a = np.asarray(a, order="C")  # cast_array keeps the source's order: row-major first, then one cast
    with np.errstate(over="ignore", invalid="ignore"):  # out of range becomes inf, as in torch, which never warns
        return from_array_strided(cast_array(a, dtype.np), strides, dtype)


@kernel("clone")
def clone(self, memory_format=None):
    """torch's rule: preserve the layout of a dense tensor, otherwise (or when asked) use the format asked for
    or the one the strides suggest."""
    return _copy(self._np(), self, copy_strides(self, memory_format), self.dtype)


def _copy(a: np.ndarray, source: Tensor, strides: tuple, dtype) -> Tensor:
    """One copy of ``a`` (``source``'s values) laid out with ``strides``: numpy's own copy where it already lies
    so (row-major, or the source's order), else a write into a new tensor of those strides."""
    if strides == S.contiguous_strides(source._shape):
        return from_array_strided(a.copy(order="C"), strides, dtype)
    if strides == source._strides:
        return from_array_strided(a.copy(order="K"), strides, dtype)
    return strided_copy(a, strides, dtype)


@kernel("_write_")
def write(self, src):
    dst = self._np()
    dst[...] = src._np()
    return self


# ---------------------------------------------------------------- random

def _generator(g):
    from tilewise.ops.creation import generator_or_default

    return generator_or_default(g)


def _draw(g, n: int, np_dtype, fn, *extra):
    seed, offset = _generator(g).claim(_philox.counters_needed(n, np_dtype))
    return fn(seed, offset, n, *extra)


@kernel("uniform")
def uniform(size, low=0.0, high=1.0, dtype=None, device=None, generator=None):
    n = int(np.prod(size))
    work = np.float64 if dtype.itemsize == 8 else np.float32
    u = _draw(generator, n, work, lambda s, o, k: _philox.uniform(s, o, k, work)).reshape(size)
    if low != 0.0 or high != 1.0:
        u = u * (high - low) + low
    return _out(u, dtype)


@kernel("normal_sample")
def normal_sample(size, dtype=None, device=None, generator=None):
    n = int(np.prod(size))
    work = np.float64 if dtype.itemsize == 8 else np.float32
    return _out(_draw(generator, n, work, lambda s, o, k: _philox.normal(s, o, k, work)).reshape(size), dtype)


@kernel("randint")
def randint(low, high, size, dtype=None, device=None, generator=None):
    n = int(np.prod(size))
    draw_dtype = _philox.randint_draw_dtype(low, high)
    values = _draw(generator, n, draw_dtype, lambda s, o, k: _philox.randint(s, o, k, low, high)).reshape(size)
    return _out(values, dtype)


@kernel("bernoulli")
def bernoulli(self, generator=None):
    p = self._np()
    if p.size and (np.nanmin(p) < 0 or np.nanmax(p) > 1):
        raise RuntimeError("bernoulli: expected all probabilities to be in [0, 1]")
    u = _draw(generator, p.size, np.float32, lambda s, o, k: _philox.uniform(s, o, k, np.float32)).reshape(p.shape)
    return _out(u < p, self.dtype)


@kernel("randperm")
def randperm(n, dtype=None, device=None, generator=None):
    bits = _draw(generator, n, np.uint32, _philox.random_bits)
    return _out(np.argsort(bits, kind="stable"), dtype)


@kernel("multinomial")
def multinomial(self, num_samples, replacement=False, generator=None):
    """See [Note: multinomial draws]; the CUDA kernels compute the same sums in the same order."""
    from tilewise import dtypes
    from tilewise.ops.creation import check_multinomial, check_probabilities, refuse_entry_drawn_with_replacement

    check_multinomial(self, num_samples, replacement)
    probs = self._np().astype(np.float64)
    rows = probs.reshape(int(np.prod(probs.shape[:-1])), probs.shape[-1])
    invalid = bool((rows < 0).any() or not np.isfinite(rows).all())
    if invalid and replacement and num_samples > 1:
        refuse_entry_drawn_with_replacement(rows)
    check_probabilities(invalid, not invalid and bool((rows.sum(-1) <= 0).any()))
    u = _draw(generator, rows.shape[0] * num_samples, np.float64,
              lambda s, o, k: _philox.uniform(s, o, k, np.float64)).reshape(rows.shape[0], num_samples)
    out = np.empty((rows.shape[0], num_samples), dtype=np.int64)
    if rows.shape[0]:
        (_with_replacement if replacement else _without_replacement)(rows.copy(), u, out)
    return _out(out.reshape(probs.shape[:-1] + (num_samples,)), dtypes.int64)


def tiled_cumsum(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cumulative sums of each row of ``weights`` (rows, n >= 1; a weight <= 0 counts as 0) in
    [Note: multinomial draws]'s order, and each row's total."""
    from tilewise.ops.creation import MULTINOMIAL_TILES

    rows, n = weights.shape
    length = -(-n // MULTINOMIAL_TILES)
    tiles = -(-n // length)
    padded = np.zeros((rows, tiles * length))
    padded[:, :n] = np.where(weights > 0, weights, 0.0)  # taken (negative) and zero weights add nothing
    inside = np.cumsum(padded.reshape(rows, tiles, length), axis=2)
    totals = np.cumsum(inside[:, :, -1], axis=1)
    before = np.concatenate([np.zeros((rows, 1)), totals[:, :-1]], axis=1)
    return (before[:, :, None] + inside).reshape(rows, -1)[:, :n], totals[:, -1]


def _settle(weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Picks from counts of cumulative weights <= x: at most n - 1, moved back over categories of weight 0."""
    picks = np.minimum(counts, weights.shape[-1] - 1)
    for k in np.flatnonzero(~(weights[picks] > 0)):
        while picks[k] > 0 and not weights[picks[k]] > 0:
            picks[k] -= 1
    return picks


def _with_replacement(weights: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    cdf, totals = tiled_cumsum(weights)
    for r in range(weights.shape[0]):
        # cdf is non-decreasing and NaN-free, so this is the count of cdf <= x (n for a NaN x, as numpy sorts it)
        out[r] = _settle(weights[r], np.searchsorted(cdf[r], u[r] * totals[r], side="right"))


def _without_replacement(weights: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """``weights`` is a scratch copy: a drawn category's weight becomes -1 (taken: it weighs nothing)."""
    for j in range(u.shape[1]):
        cdf, totals = tiled_cumsum(weights)
        counts = np.count_nonzero(~(cdf > (u[:, j] * totals)[:, None]), axis=1)
        for r in range(weights.shape[0]):
            if totals[r] > 0:
                pick = int(_settle(weights[r], counts[r:r + 1])[0])
            else:  # every category left weighs nothing: the lowest one not drawn yet
                pick = int(np.argmax(weights[r] >= 0))
            out[r, j] = pick
            weights[r, pick] = -1.0


# ---------------------------------------------------------------- arg-reductions
# numpy's argmax/argmin (ml_dtypes' too) already follow torch's rule within each reduced slice: the first NaN
# wins, otherwise the first extremum, so a NaN in one row changes no other row.

def _arg(self, dim, keepdim, fn, name):
    from tilewise import dtypes
    from tilewise import strides as S

    a = self._np()  # an empty input reaches here only along a dim of non-zero size (see [Note: empty reductions])
    if dim is None:
        res = fn(a.reshape(-1), axis=0)
        return _out(np.reshape(res, (1,) * a.ndim) if keepdim else res, dtypes.int64)
    d = S.normalize_dim(dim, max(a.ndim, 1), name)
    if a.ndim == 0:
        return _out(np.asarray(0), dtypes.int64)
    return _out(fn(a, axis=d, keepdims=keepdim), dtypes.int64)


@kernel("argmax")
def argmax(self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, np.argmax, "argmax")


@kernel("argmin")
def argmin(self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, np.argmin, "argmin")


def _value_index(self, dim, keepdim, fn, name):
    idx = _arg(self, dim, True, fn, name)
    from tilewise import strides as S

    a = self._np()
    if a.ndim == 0:
        return _out(a.copy(), self.dtype), _out(np.asarray(0), idx.dtype)
    d = S.normalize_dim(dim, a.ndim, name)
    values = np.take_along_axis(a, idx._np(), axis=d)
    if not keepdim:
        values, ind = np.squeeze(values, d), np.squeeze(idx._np(), d)
    else:
        ind = idx._np()
    return _out(values, self.dtype), _out(ind, idx.dtype)


@kernel("max.dim")
def max_dim(self, dim, keepdim=False):
    return _value_index(self, dim, keepdim, np.argmax, "max")


@kernel("min.dim")
def min_dim(self, dim, keepdim=False):
    return _value_index(self, dim, keepdim, np.argmin, "min")


# ---------------------------------------------------------------- matmul

def _matmul_dtype_work(dtype):
    return np.float32 if dtype.is_floating_point and dtype.itemsize < 4 else None


@kernel("mm", "bmm")
def matmul(self, mat2):
    """Shapes and dtypes were checked by the operator's rule (``ops/linalg.py``) before dispatch."""
    a, b = self._np(), mat2._np()
    dtype = self._dtype
    work = _matmul_dtype_work(dtype)
    if work is not None:
        a, b = a.astype(work), b.astype(work)
    use_blas_threads(gemm_threads(2 * a.size * b.shape[-1]))
    return _out(np.matmul(a, b), dtype)


# [Note: a product and its bias, rounded once] torch's CPU linear, addmm and baddbmm in float16 and bfloat16 add
# beta * bias to alpha times the float32 product and round the sum once; their decompositions (a product rounded
# to the low precision, then an add) round twice and differ in the last bit of a quarter of the elements. These
# kernels compute the sum in float32 where that matters, and leave every other case to the decomposition.

def _rounds_once(product_shape: tuple | None, bias, *tensors) -> bool:
    """Whether the sum of ``bias`` and the product of ``tensors`` (of ``product_shape``) rounds once here: all of one
    floating dtype narrower than float32, and a bias that broadcasts to the product without growing it."""
    if bias is None or product_shape is None or _matmul_dtype_work(bias.dtype) is None:
        return False
    if any(t.dtype is not bias.dtype for t in tensors):
        return False
    try:
        return np.broadcast_shapes(tuple(bias.shape), product_shape) == product_shape
    except ValueError:
        return False


def _sum_rounded_once(bias, a: np.ndarray, b: np.ndarray, beta, alpha, dtype) -> Tensor:
    total = np.matmul(a.astype(np.float32), b.astype(np.float32))
    if alpha != 1:
        total = total * np.float32(alpha)
    if beta != 0:  # torch: beta 0 ignores the bias, NaN and infinity included
        total = total + bias._np().astype(np.float32) * np.float32(beta)
    return _out(total.astype(np.float32), dtype)


def _decomposed(name: str, *args):
    from tilewise.ops.registry import OPS

    return OPS[name].decomposition(*args)


@kernel("linear")
def linear(input, weight, bias=None):
    fits = weight.ndim == 2 and input.ndim >= 1 and input.shape[-1] == weight.shape[1]
    shape = (*input.shape[:-1], weight.shape[0]) if fits else None
    if _rounds_once(shape, bias, input, weight):
        return _sum_rounded_once(bias, input._np(), weight._np().T, 1, 1, input.dtype)
    if fits and _one_wide_float(input, weight, bias) and (bias is None or bias._shape == shape[-1:]):
        return _product_plus_bias(input, weight, bias, shape)
    return _decomposed("linear", input, weight, bias)


def _one_wide_float(input, weight, bias) -> bool:
    dtype = input._dtype
    return (dtype.is_floating_point and dtype.itemsize >= 4 and weight._dtype is dtype
            and (bias is None or bias._dtype is dtype))


def _product_plus_bias(input, weight, bias, shape: tuple) -> Tensor:
    """``linear`` in float32 or float64 as its decomposition computes it (the product of the rows of every leading
    dim, then the bias added), in two numpy calls rather than the decomposition's five operators."""
    rows = input._np().reshape(math.prod(input._shape[:-1]), input._shape[-1])  # -1 is ambiguous for 0 features
    use_blas_threads(gemm_threads(2 * rows.shape[0] * weight._shape[0] * weight._shape[1]))
    out = np.matmul(rows, weight._np().T)
    if bias is not None:
        out = run_quietly(np.add, [out, bias._np()])
    return _out(out.reshape(shape), input._dtype)


@kernel("addmm")
def addmm(self, mat1, mat2, beta=1, alpha=1):
    fits = mat1.ndim == 2 and mat2.ndim == 2 and mat1.shape[1] == mat2.shape[0]
    if not _rounds_once((mat1.shape[0], mat2.shape[1]) if fits else None, self, mat1, mat2):
        return _decomposed("addmm", self, mat1, mat2, beta, alpha)
    return _sum_rounded_once(self, mat1._np(), mat2._np(), beta, alpha, self.dtype)


@kernel("baddbmm")
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    fits = (batch1.ndim == 3 and batch2.ndim == 3 and batch1.shape[0] == batch2.shape[0]
            and batch1.shape[2] == batch2.shape[1])
    shape = (batch1.shape[0], batch1.shape[1], batch2.shape[2]) if fits else None
    if not _rounds_once(shape, self, batch1, batch2):
        return _decomposed("baddbmm", self, batch1, batch2, beta, alpha)
    return _sum_rounded_once(self, batch1._np(), batch2._np(), beta, alpha, self.dtype)


def _check_mm(a, b):
    """The shape check of mm (2-D operands) or bmm (otherwise), for kernels that do not know which they run."""
    from tilewise.ops.linalg import check_mm_shapes

    check_mm_shapes("mm" if a.ndim == 2 else "bmm", a, b)


# ---------------------------------------------------------------- indexing

# [Note: scattering into a view] The backward of a strided view (a convolution's im2col windows, unfold, a
# diagonal) adds the gradient into the elements the view reads. Through a strided numpy view of the output
# buffer that is one vectorised ``+=`` where the view does not overlap itself; an overlapping view is split into
# a Python loop over its smallest overlapping dims (a 3x3 convolution's kernel offsets: 9 passes) around such
# non-overlapping parts. Computing every position and ``np.add.at`` took 0.4-0.7 s per MNIST CNN step on 2
# cores (the positions alone 0.35 s); a view that no short loop untangles, or with negative strides, still goes
# that way.
SCATTER_LOOP_MAX = 256  # passes of the loop above past which np.add.at is used


@kernel("view_scatter_add")
def view_scatter_add(grad, input_shape, view_shape, view_strides, view_offset):
    from tilewise import strides as S

    out = np.zeros(S.numel(input_shape), dtype=grad.dtype.np)
    values = np.broadcast_to(grad._np(), tuple(view_shape))
    target = _strided_target(out, view_shape, view_strides, view_offset)
    loops = _untangling_dims(view_shape, view_strides) if target is not None else None
    if loops is None:
        np.add.at(out, _view_positions(view_shape, view_strides, view_offset), values.reshape(-1))
    else:
        for index in np.ndindex(*(view_shape[d] for d in loops)):
            at = [slice(None)] * len(view_shape)
            for d, i in zip(loops, index):
                at[d] = i
            target[tuple(at)] += values[tuple(at)]
    return _out(out.reshape(input_shape), grad.dtype)


def _strided_target(out: np.ndarray, view_shape, view_strides, view_offset) -> np.ndarray | None:
    """A writable numpy view of flat ``out`` with the view's geometry; None for negative strides."""
    if any(s < 0 for s in view_strides):
        return None
    itemsize = out.itemsize
    return np.lib.stride_tricks.as_strided(out[view_offset:], tuple(view_shape),
                                           tuple(s * itemsize for s in view_strides))


def _untangling_dims(view_shape, view_strides) -> list[int] | None:
    """The fewest smallest dims to loop over so that the rest of the view does not overlap itself (see the note),
    or None when that loop would be longer than ``SCATTER_LOOP_MAX``."""
    from tilewise import strides as S

    loops, passes = [], 1
    rest = [d for d in range(len(view_shape)) if view_shape[d] > 1]
    while not S.is_non_overlapping([view_shape[d] for d in rest], [view_strides[d] for d in rest]):
        smallest = min(rest, key=lambda d: view_shape[d])
        passes *= view_shape[smallest]
        if passes > SCATTER_LOOP_MAX:
            return None
        rest.remove(smallest)
        loops.append(smallest)
    return sorted(loops)


def _view_positions(view_shape, view_strides, view_offset) -> np.ndarray:
    positions = view_offset + sum(np.arange(n).reshape((-1,) + (1,) * (len(view_shape) - k - 1)) * s
                                  for k, (n, s) in enumerate(zip(view_shape, view_strides)))
    return np.broadcast_to(np.asarray(positions), tuple(view_shape)).reshape(-1)


@kernel("view_scatter")
def view_scatter(self, src, view_shape, view_strides, view_offset):
    from tilewise import strides as S

    out = np.ascontiguousarray(self._np()).copy().reshape(-1)
    values = np.broadcast_to(src._np(), tuple(view_shape))
    target = _strided_target(out, view_shape, view_strides, view_offset)
    if target is not None and S.is_non_overlapping(view_shape, view_strides):
        target[...] = values
    else:
        out[_view_positions(view_shape, view_strides, view_offset)] = values.reshape(-1)
    return _out(out.reshape(self.shape), self.dtype)


def _np_indices(self: Tensor, indices, op: str) -> tuple:
    out = []
    for dim, idx in enumerate(indices):
        if idx is None:
            out.append(slice(None))
            continue
        a = idx._np()
        if a.dtype == np.bool_:
            raise RuntimeError(f"{op}: bool index tensors must be converted to positions first")
        if a.dtype.kind not in "iu":
            raise IndexError(f"{op}: tensors used as indices must be long, int, byte or bool tensors, got "
                             f"{idx.dtype.name} for dimension {dim}")
        size = self.shape[dim] if dim < self.ndim else 0
        if a.size and (a.max() >= size or a.min() < -size):
            bad = int(a.max()) if a.max() >= size else int(a.min())
            raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
        out.append(a)
    if len(out) > self.ndim:
        raise IndexError(f"{op}: too many indices for tensor of dimension {self.ndim}")
    shapes = [a.shape for a in out if not isinstance(a, slice)]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError(f"{op}: shape mismatch: indexing tensors could not be broadcast together with shapes "
                         f"{', '.join(str(list(s)) for s in shapes)}") from None
    return tuple(out)


@kernel("index.Tensor")
def index(self, indices):
    picked = self._np()[_np_indices(self, indices, "index")]
    if picked.ndim > 1:  # numpy lays the index block out first; torch as TensorIterator does
        given = [(d, t) for d, t in enumerate(indices) if t is not None]
        strides = S.index_result_strides(self.shape, self.stride(), [d for d, _ in given],
                                         [(t.shape, t.stride()) for _, t in given])
        if tuple(s * picked.itemsize for s in strides) != picked.strides:
            laid_out = np.lib.stride_tricks.as_strided(np.empty(picked.size, picked.dtype), picked.shape,
                                                       tuple(s * picked.itemsize for s in strides))
            laid_out[...] = picked
            picked = laid_out
    return _out(picked, self.dtype)


@kernel("index_put")
def index_put(self, indices, values, accumulate=False):
    indices = mask_positions(self, indices)
    out = self._np().copy(order="K")  # in self's order: torch's result is a clone under preserve_format
    idx = _np_indices(self, indices, "index_put")
    v = values._np() if isinstance(values, Tensor) else values
    v = np.asarray(v).astype(out.dtype)
    target_shape = out[idx].shape
    try:
        v = np.broadcast_to(v, target_shape)
    except ValueError:
        raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {list(np.shape(v))} cannot be "
                           f"broadcast to indexing result of shape {list(target_shape)}") from None
    if accumulate:
        _add_at_rows(out, idx, v)
    else:
        out[idx] = v
    return from_array_strided(out, S.preserved_strides(self._shape, self._strides), self.dtype)


def _add_at_rows(out: np.ndarray, idx: tuple, values: np.ndarray) -> None:
    """``np.add.at(out, idx, values)`` for contiguous ``out``. Where ``idx`` is index arrays for the leading dims
    (an embedding's backward), through one flat index: the same additions in the same order (each element's in
    the order of the indexed rows), 5x faster (65x64 rows from 768 indices: 89 us against 445)."""
    if not idx or not out.flags.c_contiguous or not all(isinstance(a, np.ndarray) for a in idx):
        np.add.at(out, idx, values)
        return
    rows = None
    for dim, a in enumerate(idx):
        size, stride = out.shape[dim], out.strides[dim] // out.itemsize
        term = np.where(a < 0, a + size, a).astype(np.int64, copy=False) * stride
        rows = term if rows is None else rows + term
    inner = out[(0,) * len(idx)].size if out.size else 0
    positions = rows.reshape(rows.shape + (1,)) + np.arange(inner, dtype=np.int64)
    np.add.at(out.reshape(-1), positions.reshape(-1), values.reshape(-1))


def _check_gather_index(self, dim, index, op, src=None):
    """(the normalised dim, the index as an array of at least one dim): a 0-dim ``self``, index or ``src`` is one
    element along one dim, as torch counts them. An index outside ``[0, size)`` raises torch's RuntimeError."""
    d = check_gather_shapes(self, dim, index, op, src)
    a = index._np().reshape(nonempty_shape(index.shape)).astype(np.int64, copy=False)
    size = nonempty_shape(self.shape)[d]
    if a.size and (a.min() < 0 or a.max() >= size):
        bad = int(a.min()) if a.min() < 0 else int(a.max())
        raise RuntimeError(f"index {bad} is out of bounds for dimension {d} with size {size}")
    return d, a


def _at_least_1d(t: Tensor) -> np.ndarray:
    return t._np().reshape(nonempty_shape(t.shape))


@kernel("gather")
def gather(self, dim, index, sparse_grad=False):
    d, idx = _check_gather_index(self, dim, index, "gather")
    if idx.size == 0:
        return _out(np.empty(index.shape, self.dtype.np), self.dtype)
    src = _at_least_1d(self)
    slices = tuple(slice(0, n) for n in idx.shape)
    src = src[tuple(slices[k] if k != d else slice(None) for k in range(src.ndim))]
    # row-major whatever the index's order, as torch's
    return _out(np.asarray(np.take_along_axis(src, idx, axis=d).reshape(index.shape), order="C"), self.dtype)


def _scatter(self, dim, index, src, accumulate, op):
    d, idx = _check_gather_index(self, dim, index, op, src if isinstance(src, Tensor) else None)
    out = _at_least_1d(self).copy()
    if idx.size == 0:
        return _out(out.reshape(self.shape), self.dtype)
    if isinstance(src, Tensor):
        values = _at_least_1d(src)[tuple(slice(0, n) for n in idx.shape)]
    else:
        values = np.broadcast_to(np.asarray(src, dtype=out.dtype), idx.shape)
    grids = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx
    if accumulate:
        np.add.at(out.reshape(-1), _flat_positions(grids, out), values.astype(out.dtype).reshape(-1))
    else:
        out[tuple(grids)] = values.astype(out.dtype)
    return _out(out.reshape(self.shape), self.dtype)


def _flat_positions(grids: list, out: np.ndarray) -> np.ndarray:
    """The row-major positions in contiguous ``out`` that the broadcast index ``grids`` name, in the order the
    grids broadcast. ``np.add.at`` with one flat index adds in that same order as with the grids, five times
    faster (a max pooling's backward on 64x64x24x24: 16 ms against 3.3 ms)."""
    flat = None
    for grid, stride in zip(grids, S.contiguous_strides(out.shape)):
        term = grid * stride
        flat = term if flat is None else flat + term
    return np.broadcast_to(flat, np.broadcast_shapes(*(g.shape for g in grids))).reshape(-1)


@kernel("scatter.src")
def scatter_src(self, dim, index, src):
    return _scatter(self, dim, index, src, False, "scatter")


@kernel("scatter.value")
def scatter_value(self, dim, index, value):
    if isinstance(value, Tensor):  # a number given as a 0-dim tensor: broadcast, not checked as a source
        value = value._np()[()]
    return _scatter(self, dim, index, value, False, "scatter")


@kernel("scatter_add")
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, True, "scatter_add")


@kernel("nonzero")
def nonzero(self):
    from tilewise import dtypes

    found = np.argwhere(self._np() != 0)  # (count, ndim), also for a 0-dim input
    return from_array_strided(found, (1, found.shape[0]), dtypes.int64)  # column-major, as torch's (gh-46224)
