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
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

_F32_HALF_ULP_BITS = np.int64(1 << 28)  # in a float64 holding a float32 midpoint, the low 29 mantissa bits
_F32_LOW_BITS = np.int64((1 << 29) - 1)
_F32_NORMAL_MIN = 2.0 ** -126  # below it float32 spacing is fixed: midpoints sit at other bits
_SPLITTER = float(2 ** 27 + 1)  # Veltkamp's constant for 53-bit doubles
# the range where the float64 emulation is proved: no operand or partial result overflows or underflows
_SAFE_MAX = 2.0 ** 995
_SAFE_MIN = 2.0 ** -900


def fma(a, b, c):
    """``a * b + c`` with one rounding, elementwise, in the dtype numpy gives ``a * b + c``."""
    dtype = np.result_type(a, b, c)
    if dtype.kind != "f":
        return a * b + c
    a, b, c = (np.asarray(x, dtype) for x in (a, b, c))
    if dtype.itemsize <= 4:  # float16 and bfloat16 operands compute in float32, as torch's opmath does
        return _fma_float32(a, b, c).astype(dtype, copy=False)
    if dtype == np.float64:
        return _fma_float64(a, b, c)
    return a * b + c  # long double: no wider type to check it with


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
