"""A fused multiply-add for numpy arrays: ``a * b + c`` rounded once, as C's ``fma``.

[Note: fused multiply-add] torch's CPU kernels compute add and sub with an alpha (``vec::fmadd(b, alpha, a)``),
lerp (``fmadd(weight or weight - 1, end - self, self or end)``) and addcmul (``fmadd(value * t1, t2, self)``) with
one rounding, in the vector body and, contracted by the compiler, in the scalar tail alike; float16 and bfloat16
compute so in float32 and round the float32 result. numpy has no fused multiply-add, so:

- float32 (the compute dtype of the halves too): the product of two float32 values is exact in float64, and the
  sum rounded to float64 then to float32 is the fused result except where the float64 sum lands exactly halfway
  between two float32 values while its own rounding was inexact (the only way two roundings differ from one: a
  float32 midpoint strictly between the exact sum and its float64 rounding would be a float64 nearer the sum).
  Those rare elements step one float64 ulp toward the exact sum (its error, from TwoSum) before the cast.
- float64: Boldo and Melquiond's emulation ("Emulation of FMA and correctly rounded sums: proved algorithms
  using rounding to odd", IEEE TC 2008): the exact product as two doubles (Dekker), its exact sum with ``c`` as
  two doubles (TwoSum), the two low parts added rounded to odd, the high part plus that rounded to nearest. It
  holds without underflow or overflow; elements near either end of the range, and non-finite ones, go through
  exact rational arithmetic (or IEEE's rules for infinities and NaN) one by one.
- other dtypes (integers, bools, complex) multiply and add, as torch's kernels do.

[Note: fused multiply-add in C] The emulation costs 5-30 numpy passes (float32 add_ with an alpha 0.7 -> 4.4 ms per
million elements, float64 2.8 -> 96 ms), so float32 (halves included) and float64 go through one small C function
per dtype, C's ``fmaf``/``fma`` in a loop, built once per machine by the C toolchain (``codegen/toolchain/cc.py``,
its flags and disk cache). ``fma()`` is not an expression the compiler may contract or split: with
``-march=native`` on a CPU with FMA instructions it is one (vectorised) instruction, elsewhere the C library's
correctly rounded ``fma``; ``-ffp-contract=off`` governs only ``a * b + c`` written out. The operands are passed
with their strides after coalescing their dims (``strides.coalesce``): as one or two dims, with inner strides
0 or 1 spelled as constants so the loop vectorises; other layouts are copied to contiguous first. The call's
fixed cost (ctypes and the four pointers, the output's allocation) is about 8 us (2 shared cores), as much as
float32's emulation of 1024 elements (:data:`NATIVE_FLOAT32_MIN_ELEMENTS`; 16K: 10 against 33 us) and less than
float64's at any size (one element: 9 against 29 us; 16K: 13 against 240 us). Below that, and wherever no C
compiler works (the toolchain raises ``CCompileError``), the numpy emulation runs. It stays the reference: the
tests compare the two bit for bit. Eager add_ with an alpha on a million elements went from 4.4-6.4 to 0.4-0.65 ms
in float32 and from 28-33 to 1.1-2.9 ms in float64 (``benchmarks/cpu_fma.py``, torch on one thread 0.2 and 0.5 ms).
"""

from __future__ import annotations

import ctypes
from fractions import Fraction
from functools import cache

import numpy as np

from tilewise.codegen.toolchain.cc import CCompileError, CLibraryCache
from tilewise.config import settings
from tilewise.strides import coalesce

_F32_HALF_ULP_BITS = np.int64(1 << 28)  # in a float64 holding a float32 midpoint, the low 29 mantissa bits
_F32_LOW_BITS = np.int64((1 << 29) - 1)
_F32_NORMAL_MIN = 2.0 ** -126  # below it float32 spacing is fixed: midpoints sit at other bits
_SPLITTER = float(2 ** 27 + 1)  # Veltkamp's constant for 53-bit doubles
# the range where the float64 emulation is proved: no operand or partial result overflows or underflows
_SAFE_MAX = 2.0 ** 995
_SAFE_MIN = 2.0 ** -900


# below it float32's emulation (a few numpy passes) is as fast as the C call; float64's is slower at any size
NATIVE_FLOAT32_MIN_ELEMENTS = 1024

# one row of ``rows`` x ``cols`` elements, ``out`` contiguous; strides in elements. Each of the 8 combinations of
# inner strides 0 and 1 is a loop of its own, whose constant strides let the compiler vectorise it.
_C_SOURCE = r"""
#include <math.h>
#include <stdint.h>

#define TW_FMA_ROW(F, SA, SB, SC) \
    for (int64_t j = 0; j < n; ++j) out[j] = F(a[j * (SA)], b[j * (SB)], c[j * (SC)])

#define TW_FMA(NAME, T, F) \
static void NAME##_row(int64_t n, const T *restrict a, int64_t sa, const T *restrict b, int64_t sb, \
                       const T *restrict c, int64_t sc, T *restrict out) { \
    if ((sa | sb | sc) & ~(int64_t)1) { TW_FMA_ROW(F, sa, sb, sc); return; } \
    switch (sa << 2 | sb << 1 | sc) { \
    case 0: TW_FMA_ROW(F, 0, 0, 0); break; \
    case 1: TW_FMA_ROW(F, 0, 0, 1); break; \
    case 2: TW_FMA_ROW(F, 0, 1, 0); break; \
    case 3: TW_FMA_ROW(F, 0, 1, 1); break; \
    case 4: TW_FMA_ROW(F, 1, 0, 0); break; \
    case 5: TW_FMA_ROW(F, 1, 0, 1); break; \
    case 6: TW_FMA_ROW(F, 1, 1, 0); break; \
    default: TW_FMA_ROW(F, 1, 1, 1); \
    } \
} \
void NAME(int64_t rows, int64_t cols, const T *a, int64_t a_row, int64_t a_col, const T *b, int64_t b_row, \
          int64_t b_col, const T *c, int64_t c_row, int64_t c_col, T *out) { \
    for (int64_t i = 0; i < rows; ++i) \
        NAME##_row(cols, a + i * a_row, a_col, b + i * b_row, b_col, c + i * c_row, c_col, out + i * cols); \
}

TW_FMA(tw_fma_float32, float, fmaf)
TW_FMA(tw_fma_float64, double, fma)
"""
_C_FUNCTIONS = {np.dtype(np.float32): "tw_fma_float32", np.dtype(np.float64): "tw_fma_float64"}


def fma(a, b, c):
    """``a * b + c`` with one rounding, elementwise, in the dtype numpy gives ``a * b + c``: by C's ``fma`` where it
    pays (see [Note: fused multiply-add in C]), else by :func:`emulated_fma`."""
    dtype = np.result_type(a, b, c)
    if dtype.kind != "f":
        return a * b + c
    a, b, c = (np.asarray(x, dtype) for x in (a, b, c))
    if dtype == np.float64:
        out = native_fma(a, b, c)
        if out is not None:
            return out
    elif dtype.itemsize <= 4 and max(a.size, b.size, c.size) >= NATIVE_FLOAT32_MIN_ELEMENTS:
        out = native_fma(*(x.astype(np.float32, copy=False) for x in (a, b, c)))  # halves compute in float32
        if out is not None:
            return out.astype(dtype, copy=False)
    return _emulated(a, b, c, dtype)


def emulated_fma(a, b, c):
    """:func:`fma` by numpy alone (see [Note: fused multiply-add]): the reference of the C path."""
    dtype = np.result_type(a, b, c)
    if dtype.kind != "f":
        return a * b + c
    return _emulated(*(np.asarray(x, dtype) for x in (a, b, c)), dtype)


def _emulated(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: np.dtype):
    if a.ndim == b.ndim == c.ndim == 0:  # one element: the fix-ups below index by position
        return _emulated(a.reshape(1), b.reshape(1), c.reshape(1), dtype).reshape(())
    if dtype.itemsize <= 4:  # float16 and bfloat16 operands compute in float32, as torch's opmath does
        return _fma_float32(a, b, c).astype(dtype, copy=False)
    if dtype == np.float64:
        return _fma_float64(a, b, c)
    return a * b + c  # long double: no wider type to check it with


@cache
def _native_functions(cc: str) -> dict | None:
    """The C functions by dtype, compiled with ``cc``; None where it cannot build them (see the note)."""
    try:  # a cache of its own (same directory): the compiled programs' statistics stay theirs
        library = CLibraryCache().load(_C_SOURCE)
    except (CCompileError, OSError):
        return None
    functions = {}
    for dtype, name in _C_FUNCTIONS.items():
        function = getattr(library, name)
        function.restype = None
        pointer, i64 = ctypes.c_void_p, ctypes.c_int64
        function.argtypes = [i64, i64, pointer, i64, i64, pointer, i64, i64, pointer, i64, i64, pointer]
        functions[dtype] = function
    return functions


def native_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """``fma(a, b, c)`` of three float32 or three float64 arrays by C's ``fma``, as a new C-contiguous array of
    their broadcast shape; None where no C compiler is available."""
    if not a.dtype == b.dtype == c.dtype or a.dtype not in _C_FUNCTIONS:
        raise TypeError(f"native_fma: the operands must be all float32 or all float64 arrays, got "
                        f"{a.dtype}, {b.dtype} and {c.dtype}")
    functions = _native_functions(settings.cc)
    if functions is None:
        return None
    operands = (a, b, c)
    out = np.empty(_broadcast_shape(operands), a.dtype)
    if out.size == 0:
        return out
    layout = _flat_layout(out, operands)
    if layout is None:
        operands = [np.broadcast_to(x, out.shape) for x in operands]
        layout = _rows_and_columns(out, operands)
    if layout is None:  # more than two dims, or strides not in whole elements: copy to contiguous
        operands = [x if x.strides == (0,) * x.ndim and x.flags.aligned else np.array(x, order="C")
                    for x in operands]
        layout = _rows_and_columns(out, operands)
    rows, cols, (sa, sb, sc) = layout
    functions[out.dtype](rows, cols, operands[0].ctypes.data, *sa, operands[1].ctypes.data, *sb,
                         operands[2].ctypes.data, *sc, out.ctypes.data)
    return out


def _broadcast_shape(operands) -> tuple[int, ...]:
    """The broadcast shape, without numpy's general machinery where single elements meet arrays of one shape."""
    shape = None
    for x in operands:
        if x.size != 1:
            if shape is not None and x.shape != shape:
                return np.broadcast_shapes(*(y.shape for y in operands))
            shape = x.shape
    if shape is None or any(x.ndim > len(shape) for x in operands):
        return np.broadcast_shapes(*(y.shape for y in operands))
    return shape


def _flat_layout(out: np.ndarray, operands):
    """The layout :func:`_rows_and_columns` gives when every operand is a single element or C-contiguous in
    ``out``'s shape (the common case, found without coalescing), else None."""
    strides = []
    for x in operands:
        if not x.flags.aligned:
            return None
        if x.size == 1:
            strides.append((0, 0))
        elif x.flags.c_contiguous and x.shape == out.shape:
            strides.append((0, 1))
        else:
            return None
    return 1, out.size, strides


def _rows_and_columns(out: np.ndarray, operands: list[np.ndarray]):
    """(rows, columns, per operand its (row, column) strides in elements) walking ``operands`` in the order of
    ``out``'s elements, or None where that takes more than two dims or a stride is not whole elements."""
    size = out.itemsize
    if any(s % size for x in operands for s in x.strides) or not all(x.flags.aligned for x in operands):
        return None
    shape, strides = coalesce(out.shape, *(tuple(s // size for s in x.strides) for x in (out, *operands)))
    if len(shape) > 2:
        return None
    shape = (1,) * (2 - len(shape)) + shape
    return shape[0], shape[1], [(0,) * (2 - len(s)) + s for s in strides[1:]]


def _two_sum(a, b):
    """(a + b rounded, its exact error): Knuth's TwoSum, exact for any finite doubles whose sum does not overflow."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fma_float32(a, b, c):
    p = a.astype(np.float64) * b.astype(np.float64)  # exact: 48 significant bits
    c = c.astype(np.float64)
    s = p + c
    bits = s.view(np.int64)
    ties = ((bits & _F32_LOW_BITS) == _F32_HALF_ULP_BITS) | (np.abs(s) < _F32_NORMAL_MIN)
    if ties.any():
        s = np.array(s)  # a 0-d result is a scalar: make it writable
        at = np.nonzero(ties)
        ps, cs = np.broadcast_to(p, s.shape)[at], np.broadcast_to(c, s.shape)[at]
        s[at] = _to_odd(*_two_sum(ps, cs))
    return s.astype(np.float32)


def _to_odd(s, e):
    """``s`` rounded to odd, given its exact error ``e``: where inexact with an even last bit, one ulp toward the
    exact value. Rounded to nearest into a format at least two bits narrower, that is the exact value rounded once."""
    s = np.asarray(s, np.float64)
    bits = s.view(np.int64)
    step = (np.isfinite(e) & (e != 0) & ((bits & 1) == 0)).astype(np.int64)
    away = np.signbit(e) == np.signbit(s)  # the exact value is farther from zero than s
    return (bits + np.where(away, step, -step)).view(np.float64)


def _split(a):
    t = a * _SPLITTER
    hi = t - (t - a)
    return hi, a - hi


def _fma_float64(a, b, c):
    uh = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl  # uh + ul == a * b exactly (Dekker)
    th, tl = _two_sum(c, uh)
    v = _to_odd(*_two_sum(tl, ul))
    z = np.asarray(th + v)
    zero = z == 0
    if zero.any():  # an exact zero: its sign is that of the unfused sum, whose product is then exact
        z = np.where(zero, uh + c, z)
    unsafe = ~(np.abs(a) < _SAFE_MAX) | ~(np.abs(b) < _SAFE_MAX) | ~(np.abs(c) < _SAFE_MAX) \
        | ((np.abs(uh) < _SAFE_MIN) & (a != 0) & (b != 0)) | ~(np.abs(z) < _SAFE_MAX) \
        | ((np.abs(z) < _SAFE_MIN) & (z != 0))
    if unsafe.any():
        z = np.array(z)
        at = np.nonzero(unsafe)
        shape = z.shape
        triples = zip(*(np.broadcast_to(x, shape)[at].tolist() for x in (a, b, c)))
        z[at] = [_exact_fma(x, y, w) for x, y, w in triples]
    return z


def _exact_fma(a: float, b: float, c: float) -> float:
    """One element by exact rational arithmetic (Python's int division rounds once, subnormals included)."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return a * b + c  # an infinite or NaN product: IEEE's rules, as the fused operation gives them
    if not np.isfinite(c):
        return c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # round to nearest gives -0 only for the sum of two -0: a -0 product (a zero factor) and c
        product_sign = np.signbit(a) != np.signbit(b)
        return -0.0 if (a == 0 or b == 0) and product_sign and c == 0 and np.signbit(c) else 0.0
    try:
        return float(exact)
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")
