"""``make_tensor``: a random tensor for tests, from torch.testing's value range for each dtype.

The values are drawn by tilewise's own generators (``randint``, ``uniform_``), so they differ from torch's for
the same seed; the ranges, the clamping of ``low`` and ``high`` to what the dtype holds, the flags and the
errors are torch's.
"""

from __future__ import annotations

import collections.abc
import math
import warnings

from tilewise import dtypes
from tilewise.dtypes import DType, finfo, iinfo
from tilewise.ops.creation import empty, randint
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

_INTEGRAL = [dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]
_FLOATING = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
_FLOATING_8BIT = [dtypes.float8_e4m3fn, dtypes.float8_e5m2]
_COMPLEX = [dtypes.complex64, dtypes.complex128]
_BOOLEAN_OR_INTEGRAL = [dtypes.bool_, *_INTEGRAL]
_FLOATING_OR_COMPLEX = [*_FLOATING, *_COMPLEX]
_SUPPORTED = [*_BOOLEAN_OR_INTEGRAL, *_FLOATING_OR_COMPLEX, *_FLOATING_8BIT]


def make_tensor(*shape: int | collections.abc.Sequence[int], dtype: DType, device, low: float | None = None,
                high: float | None = None, requires_grad: bool = False, noncontiguous: bool = False,
                exclude_zero: bool = False, memory_format=None) -> Tensor:
    """A tensor of ``shape`` with values drawn uniformly from ``[low, high)``, as ``torch.testing.make_tensor``.

    Without ``low`` and ``high`` the range is ``[0, 2)`` for bool, ``[0, 10)`` for uint8, ``[-9, 10)`` for
    signed integers and ``[-9, 9)`` for floating and complex dtypes (both parts); bounds beyond what the dtype
    holds are clamped to it. ``noncontiguous=True`` returns a view with a step in the last dimension,
    ``exclude_zero=True`` replaces zeros by 1 (bool, integers) or the dtype's smallest normal number.

    >>> import tilewise as tw
    >>> x = make_tensor(2, 3, dtype=tw.int64, device="cpu", low=0, high=5)
    >>> x.shape, bool(((x >= 0) & (x < 5)).all())
    (tilewise.Size([2, 3]), True)
    """
    if len(shape) == 1 and isinstance(shape[0], collections.abc.Sequence):
        shape = shape[0]
    shape = tuple(shape)
    if noncontiguous and memory_format is not None:
        raise ValueError("The parameters `noncontiguous` and `memory_format` are mutually exclusive, but got "
                         f"{noncontiguous=} and {memory_format=}")
    if requires_grad and dtype in _BOOLEAN_OR_INTEGRAL:
        raise ValueError(f"`requires_grad=True` is not supported for boolean and integral dtypes, but got {dtype=}")
    noncontiguous = noncontiguous and math.prod(shape) > 1
    if noncontiguous:  # twice the last dimension, so that the view skips values that differ from those it shows
        shape = (*shape[:-1], 2 * shape[-1])

    if dtype is dtypes.bool_:
        low, high = _bounds(low, high, dtype, lowest=0, highest_exclusive=2, default=(0, 2))
        result = randint(low, high, shape, device=device, dtype=dtype)
    elif dtype in _INTEGRAL:
        info = iinfo(dtype)
        # randint takes its bounds as int64, so it cannot draw int64's largest value
        highest = info.max + (1 if dtype is not dtypes.int64 else 0)
        low, high = _bounds(low, high, dtype, lowest=info.min, highest_exclusive=highest, default=(-9, 10))
        result = randint(low, high, shape, device=device, dtype=dtype)
    elif dtype in _FLOATING_OR_COMPLEX or dtype in _FLOATING_8BIT:
        info = finfo(dtype)
        low, high = _bounds(low, high, dtype, lowest=info.min, highest_exclusive=info.max, default=(-9, 9))
        drawn = dtypes.float32 if dtype in _FLOATING_8BIT else dtype
        result = empty(shape, device=device, dtype=drawn)
        _uniform_(OPS["view_as_real"](result) if dtype.is_complex else result, low, high)
        if drawn is not dtype:
            result = result.to(dtype)
    else:
        supported = ", ".join(d.name for d in _SUPPORTED)
        raise TypeError(f"The requested dtype '{dtype}' is not supported by tilewise.testing.make_tensor(). "
                        f"Supported dtypes: {supported}.")

    if noncontiguous:
        result = result[..., 1::2]  # the offset of 1 catches kernels that ignore the storage offset
    elif memory_format is not None:
        result = result.clone(memory_format=memory_format)
    if exclude_zero:
        result[result == 0] = 1 if dtype in _BOOLEAN_OR_INTEGRAL else finfo(dtype).tiny
    if dtype in _FLOATING_OR_COMPLEX:
        result.requires_grad = requires_grad
    return result


def _bounds(low, high, dtype: DType, *, lowest, highest_exclusive, default: tuple[int, int]):
    """``low`` and ``high`` (or the defaults) checked, clamped to ``[lowest, highest_exclusive]``, and for bool and
    integer dtypes rounded up (``low`` so that no value falls below it, ``high`` because randint excludes it)."""
    low = default[0] if low is None else low
    high = default[1] if high is None else high
    if any(isinstance(value, float) and math.isnan(value) for value in (low, high)):
        raise ValueError(f"`low` and `high` cannot be NaN, but got {low=} and {high=}")
    if low == high and dtype in _FLOATING_OR_COMPLEX:
        warnings.warn("Passing `low==high` to `tilewise.testing.make_tensor` for floating or complex types is "
                      "deprecated, as in torch since 2.1. Use `tilewise.full(...)` instead.", FutureWarning,
                      stacklevel=3)
    elif low >= high:
        raise ValueError(f"`low` must be less than `high`, but got {low} >= {high}")
    elif high < lowest or low >= highest_exclusive:
        raise ValueError(f"The value interval specified by `low` and `high` is [{low}, {high}), but {dtype} only "
                         f"supports [{lowest}, {highest_exclusive})")
    low = min(max(low, lowest), highest_exclusive)
    high = min(max(high, lowest), highest_exclusive)
    if dtype in _BOOLEAN_OR_INTEGRAL:
        return math.ceil(low), math.ceil(high)
    return low, high


def _uniform_(t: Tensor, low: float, high: float) -> Tensor:
    # a range wider than the dtype's largest value overflows the generator's scaling: draw half of it, then double
    if high - low >= finfo(t.dtype).max:
        return t.uniform_(low / 2, high / 2).mul_(2)
    return t.uniform_(low, high)
