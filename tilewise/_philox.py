"""Counter-based random numbers: Philox4x32-10, identical on CPU (numpy) and GPU (CUDA C).

[Note: Philox stream layout]
A draw is a pure function of (seed, offset, n): no hidden state, so the CPU and a GPU kernel can produce
the same bits, and a generator only has to remember an offset. Philox4x32-10 (Salmon et al., SC'11,
"Parallel random numbers: as easy as 1, 2, 3"; constants and round order as in Random123's philox.h)
maps a 128-bit counter and a 64-bit key to four 32-bit words. The stream of a (seed, offset) is

    key       = (seed & 0xffffffff, seed >> 32)
    block j   = philox4x32_10(counter=(c & 0xffffffff, c >> 32, 0, 0), key)   with c = offset + j
    word i    = lane i % 4 of block i // 4

so `offset` counts 128-bit blocks (counters), and a GPU thread t that computes block `offset + t` owns words
4t..4t+3. The two high counter words stay zero (reserved). A value is built from one word (32-bit outputs)
or from two consecutive words (64-bit outputs; the first word is the high half); a draw of n values
consumes `counters_needed(n, dtype)` = ceil(n * words_per_value / 4) blocks, its unused tail words are
dropped, and the caller advances its offset by that count. Because words are assigned by index, a draw is a
prefix of any longer draw at the same offset, and the draw at `offset + k` equals the longer draw from
`offset` with its first 4k words (4k / words_per_value values) removed.

Values from words:
* uniform float32: the top 24 bits of a word times 2**-24; float64: the top 53 bits of (hi << 32 | lo)
  times 2**-53. Both lie in [0, 1), hit exactly representable grid points, and need no rounding anywhere.
* normal: Box-Muller on consecutive uniform draws (2k, 2k+1): radius sqrt(-2 log(1 - u_2k)), using 1 - u in
  (0, 1] so the log is finite, and angle 2*pi*u_2k+1; z_2k = r cos, z_2k+1 = r sin. The tails end at
  5.77 (float32) and 8.57 (float64) standard deviations, as for any Box-Muller on a 24/53-bit grid.
* randint: low + bits % (high - low), from one word when the range spans at most 2**32 values, else from
  two words (64 bits); the modulo bias, at most span / 2**32 or span / 2**64, is accepted (as in PyTorch).

Bit-identity of normals needs more than the same formula: libm, numpy's SIMD loops and CUDA's logf/sincosf
round differently. So log and sin/cos are computed here from +, *, / and sqrt alone (all correctly rounded
in IEEE 754 on every target) with fixed polynomials, after an exact reduction in integer arithmetic of the
angle draw to a quarter turn plus a remainder |x| <= pi/4. The CUDA C in PHILOX_CUDA_SOURCE is rendered from the same
coefficient tables and writes every rounding explicitly (__fmul_rn, __fadd_rn, ...) so nvcc cannot
contract a multiply-add into an FMA; on a host C compiler the same source compiles with `-ffp-contract=off`.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import factorial, pi

import numpy as np
from numpy.typing import DTypeLike

PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
WORDS_PER_COUNTER = 4

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_U64_LIMIT = 1 << 64


# --- Philox4x32-10 -----------------------------------------------------------------------------------


def _philox_round(c0, c1, c2, c3, k0, k1):
    """One Philox round on uint64 lanes that hold 32-bit values (products fit in 64 bits)."""
    p0 = np.uint64(PHILOX_MULTIPLIERS[0]) * c0
    p1 = np.uint64(PHILOX_MULTIPLIERS[1]) * c2
    return (p1 >> _SHIFT32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> _SHIFT32) ^ c3 ^ k1, p0 & _MASK32


def _philox_lanes(lanes: Sequence[np.ndarray], k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """Philox4x32-10 over four uint64 counter lanes; returns an (n, 4) uint32 array."""
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + np.uint64(PHILOX_WEYL[0])) & _MASK32
            k1 = (k1 + np.uint64(PHILOX_WEYL[1])) & _MASK32
        lanes = _philox_round(*lanes, k0, k1)
    return np.stack(lanes, axis=1).astype(np.uint32)


def philox4x32(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 of each counter row: (n, 4) uint32 counters, a (2,) or (n, 2) uint32 key -> (n, 4) uint32.

    >>> out = philox4x32(np.zeros((1, 4), np.uint32), np.zeros(2, np.uint32))
    >>> [hex(w) for w in out[0]]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    counter, key = np.asarray(counter), np.asarray(key)
    if counter.dtype != np.uint32 or counter.ndim != 2 or counter.shape[1] != 4:
        raise ValueError(f"philox4x32: counter must be uint32 of shape (n, 4), got {counter.dtype} {counter.shape}")
    if key.dtype != np.uint32 or key.shape not in ((2,), (counter.shape[0], 2)):
        raise ValueError(
            f"philox4x32: key must be uint32 of shape (2,) or ({counter.shape[0]}, 2), got {key.dtype} {key.shape}"
        )
    lanes = [counter[:, i].astype(np.uint64) for i in range(4)]
    return _philox_lanes(lanes, key[..., 0].astype(np.uint64), key[..., 1].astype(np.uint64))


# --- the stream ----------------------------------------------------------------------------------------


def _words_per_value(dtype: DTypeLike) -> int:
    itemsize = np.dtype(dtype).itemsize
    if itemsize > 8:
        raise TypeError(f"philox: values of dtype {np.dtype(dtype)} are not drawn; use at most 8-byte dtypes")
    return 2 if itemsize == 8 else 1


def counters_needed(n: int, dtype: DTypeLike = np.uint32) -> int:
    """Counters (128-bit blocks) a draw of n values of dtype consumes; advance the offset by this much.

    8-byte dtypes take two 32-bit words per value, smaller ones one word. For randint pass
    `randint_draw_dtype(low, high)`.

    >>> counters_needed(10, np.float32), counters_needed(10, np.float64)
    (3, 5)
    """
    return -(-n * _words_per_value(dtype) // WORDS_PER_COUNTER)


def _check_seed_offset(seed: int, offset: int, counters: int) -> None:
    if not 0 <= seed < _U64_LIMIT:
        raise ValueError(f"philox: seed must lie in [0, 2**64), got {seed}")
    if offset < 0 or offset + counters > _U64_LIMIT:
        raise ValueError(f"philox: counters [{offset}, {offset + counters}) leave the 64-bit range [0, 2**64)")


def random_bits(seed: int, offset: int, n: int) -> np.ndarray:
    """The first n 32-bit words of the stream of (seed, offset), as uint32; consumes ceil(n / 4) counters.

    >>> random_bits(0, 0, 6).tolist() == random_bits(0, 0, 8)[:6].tolist()
    True
    """
    if n < 0:
        raise ValueError(f"random_bits: n must be >= 0, got {n}")
    blocks = counters_needed(n)
    _check_seed_offset(seed, offset, blocks)
    counter = np.arange(blocks, dtype=np.uint64) + np.uint64(offset)
    zeros = np.zeros(blocks, dtype=np.uint64)
    lanes = [counter & _MASK32, counter >> _SHIFT32, zeros, zeros]
    words = _philox_lanes(lanes, np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32))
    return words.reshape(-1)[:n]


def _random_words64(seed: int, offset: int, n: int) -> np.ndarray:
    """n 64-bit values, each from two consecutive words (first word high), as uint64."""
    pairs = random_bits(seed, offset, 2 * n).reshape(n, 2).astype(np.uint64)
    return (pairs[:, 0] << _SHIFT32) | pairs[:, 1]


# --- floating-point math that every target rounds identically --------------------------------------


@dataclass(frozen=True)
class _Precision:
    """One floating-point target: its grid and the fixed polynomials shared by numpy and CUDA C."""

    dtype: type[np.floating]
    c_type: str
    c_suffix: str  # literal suffix
    bits: int  # bits of a uniform draw, the float's significand width
    log_terms: int  # terms of 2*atanh(s) = log((1+s)/(1-s)), |s| <= 0.1716
    sin_terms: int  # Taylor terms after x on |x| <= pi/4
    cos_terms: int  # Taylor terms after 1 on |x| <= pi/4

    def const(self, value: float | Fraction) -> np.floating:
        return self.dtype(float(value))

    @property
    def log_coeffs(self) -> tuple[np.floating, ...]:
        return tuple(self.const(Fraction(2, 2 * k + 1)) for k in range(self.log_terms))

    @property
    def sin_coeffs(self) -> tuple[np.floating, ...]:
        return tuple(self.const(Fraction((-1) ** k, factorial(2 * k + 1))) for k in range(1, self.sin_terms + 1))

    @property
    def cos_coeffs(self) -> tuple[np.floating, ...]:
        return tuple(self.const(Fraction((-1) ** k, factorial(2 * k))) for k in range(1, self.cos_terms + 1))

    @property
    def ulp(self) -> np.floating:
        return self.const(2.0**-self.bits)

    @property
    def turn_ulp(self) -> np.floating:
        """2*pi / 2**bits: the angle of one step of the angle draw."""
        return self.dtype(self.const(2 * pi) * self.ulp)

    @property
    def quarter_shift(self) -> int:
        return self.bits - 2


_FLOAT32 = _Precision(np.float32, "float", "f", bits=24, log_terms=5, sin_terms=4, cos_terms=5)
_FLOAT64 = _Precision(np.float64, "double", "", bits=53, log_terms=11, sin_terms=8, cos_terms=8)


def _precision(dtype: DTypeLike, fn: str) -> _Precision:
    for p in (_FLOAT32, _FLOAT64):
        if np.dtype(dtype) == p.dtype:
            return p
    raise TypeError(f"{fn}: dtype must be float32 or float64, got {np.dtype(dtype)} (draw float32 and cast)")


def _horner(x: np.ndarray, coeffs: tuple[np.floating, ...]) -> np.ndarray:
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = c + x * acc
    return acc


def _log_unit(u: np.ndarray, p: _Precision) -> np.ndarray:
    """log(u) for u in (0, 1]: u = f * 2**e with f in [sqrt(1/2), sqrt(2)), log f = 2 atanh((f-1)/(f+1))."""
    f, e = np.frexp(u)
    low = f < p.const(np.sqrt(0.5))
    f = np.where(low, f + f, f)
    e = np.where(low, e - 1, e)
    one = p.const(1)
    s = (f - one) / (f + one)
    return e.astype(p.dtype) * p.const(np.log(2)) + s * _horner(s * s, p.log_coeffs)


def _sincos_turn(k: np.ndarray, p: _Precision) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos of 2*pi * k / 2**bits, reducing k exactly to a quarter turn q and |x| <= pi/4."""
    k = k.astype(np.int64)
    q = (k + (1 << (p.quarter_shift - 1))) >> p.quarter_shift
    x = (k - (q << p.quarter_shift)).astype(p.dtype) * p.turn_ulp
    x2 = x * x
    s = x + x * (x2 * _horner(x2, p.sin_coeffs))
    c = p.const(1) + x2 * _horner(x2, p.cos_coeffs)
    odd = (q & 1) == 1
    sin, cos = np.where(odd, c, s), np.where(odd, s, c)
    return np.where(q & 2, -sin, sin), np.where((q + 1) & 2, -cos, cos)


def _box_muller(radius_draw: np.ndarray, angle_draw: np.ndarray, p: _Precision) -> tuple[np.ndarray, np.ndarray]:
    one_minus_u = ((1 << p.bits) - radius_draw.astype(np.int64)).astype(p.dtype) * p.ulp
    r = np.sqrt(p.const(-2) * _log_unit(one_minus_u, p))
    sin, cos = _sincos_turn(angle_draw, p)
    return r * cos, r * sin


# --- distributions -------------------------------------------------------------------------------------


def _uniform_draws(seed: int, offset: int, n: int, p: _Precision) -> np.ndarray:
    """n integers of p.bits random bits: top 24 bits of a word, or top 53 bits of a 64-bit pair."""
    if p is _FLOAT32:
        return random_bits(seed, offset, n) >> np.uint32(8)
    return _random_words64(seed, offset, n) >> np.uint64(11)


def uniform(seed: int, offset: int, n: int, dtype: DTypeLike = np.float32) -> np.ndarray:
    """n uniform values in [0, 1) on the 2**-24 (float32) or 2**-53 (float64) grid.

    >>> u = uniform(7, 0, 1000)
    >>> u.dtype, bool(0 <= u.min() and u.max() < 1)
    (dtype('float32'), True)
    """
    p = _precision(dtype, "uniform")
    return _uniform_draws(seed, offset, n, p).astype(p.dtype) * p.ulp


def normal(seed: int, offset: int, n: int, dtype: DTypeLike = np.float32) -> np.ndarray:
    """n standard normal values by Box-Muller on pairs of uniform draws (see the design note).

    >>> z = normal(7, 0, 5)
    >>> z.dtype, z.shape, bool((z == normal(7, 0, 6)[:5]).all())
    (dtype('float32'), (5,), True)
    """
    p = _precision(dtype, "normal")
    draws = _uniform_draws(seed, offset, n + n % 2, p).reshape(-1, 2)
    z0, z1 = _box_muller(draws[:, 0], draws[:, 1], p)
    return np.stack([z0, z1], axis=1).reshape(-1)[:n]


def randint_draw_dtype(low: int, high: int) -> np.dtype:
    """Width of randint's draws for [low, high): uint32 if the range spans at most 2**32 values, else uint64."""
    return np.dtype(np.uint32 if high - low <= 1 << 32 else np.uint64)


def randint(seed: int, offset: int, n: int, low: int, high: int, dtype: DTypeLike = np.int64) -> np.ndarray:
    """n integers in [low, high) as `low + bits % (high - low)`, from 32- or 64-bit draws (see the design note).

    Consumes `counters_needed(n, randint_draw_dtype(low, high))` counters.

    >>> r = randint(3, 0, 1000, -5, 5)
    >>> r.dtype, int(r.min()), int(r.max())
    (dtype('int64'), -5, 4)
    """
    info = np.iinfo(dtype)
    if not info.min <= low < high <= info.max + 1:
        raise ValueError(
            f"randint: need {info.min} <= low < high <= {info.max + 1} for {np.dtype(dtype)}, "
            f"got low={low}, high={high}"
        )
    span = high - low
    if randint_draw_dtype(low, high) == np.uint32:
        bits = random_bits(seed, offset, n).astype(np.uint64)
    else:
        bits = _random_words64(seed, offset, n)
    in_range = bits if span == _U64_LIMIT else bits % np.uint64(span)
    return (in_range + np.uint64(low % _U64_LIMIT)).view(np.int64).astype(dtype)


def attempt_uniforms(seed: int, offset: int, elements: np.ndarray, attempt: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 uniforms in [0, 1) for each of ``elements`` (indices) at rejection-sampling ``attempt``.

    [Note: draws per element] A sampler that loops until it accepts (Poisson, binomial) takes a variable number of
    draws per element, which no fixed stretch of the stream can hold. Such a draw claims one counter per element,
    as a draw of 4n words would, and element i's attempt j reads the block of counter (c & 0xffffffff, c >> 32, j, 0)
    with c = offset + i: attempt 0 is the claimed block itself, later attempts use the reserved third counter word
    and so meet no other draw's blocks. The block's words (w0, w1) and (w2, w3) give the two values as a float64
    uniform's (top 53 bits of hi << 32 | lo). Every element's values depend only on (seed, offset, i, j), so a GPU
    thread per element computes the same ones.

    >>> u, v = attempt_uniforms(1, 0, np.arange(3), 0)
    >>> bool(np.array_equal(np.stack([u, v], 1).reshape(-1), uniform(1, 0, 6, np.float64)))
    True
    """
    counter = np.asarray(elements, dtype=np.uint64) + np.uint64(offset)
    lanes = [counter & _MASK32, counter >> _SHIFT32, np.full(counter.shape, attempt, np.uint64),
             np.zeros(counter.shape, np.uint64)]
    words = _philox_lanes(lanes, np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)).astype(np.uint64)
    first = ((words[:, 0] << _SHIFT32) | words[:, 1]) >> np.uint64(11)
    second = ((words[:, 2] << _SHIFT32) | words[:, 3]) >> np.uint64(11)
    return first.astype(np.float64) * _FLOAT64.ulp, second.astype(np.float64) * _FLOAT64.ulp


# --- the same math as CUDA C ---------------------------------------------------------------------------

_CUDA_PRELUDE = r"""
#if defined(__CUDACC_RTC__)
typedef unsigned int tw_u32;
typedef unsigned long long tw_u64;
typedef int tw_i32;
typedef long long tw_i64;
#else
#include <stdint.h>
typedef uint32_t tw_u32;
typedef uint64_t tw_u64;
typedef int32_t tw_i32;
typedef int64_t tw_i64;
#endif
#if !defined(__CUDACC__)
/* Host C build (compile with -ffp-contract=off): CUDA's qualifiers and explicitly rounded intrinsics
   become their plain IEEE operations. */
#include <math.h>
#define __device__
#define __forceinline__ static inline
#define __umulhi(a, b) ((tw_u32)(((tw_u64)(a) * (tw_u64)(b)) >> 32))
#define __fadd_rn(a, b) ((a) + (b))
#define __fmul_rn(a, b) ((a) * (b))
#define __fdiv_rn(a, b) ((a) / (b))
#define __fsqrt_rn(a) sqrtf(a)
#define __dadd_rn(a, b) ((a) + (b))
#define __dmul_rn(a, b) ((a) * (b))
#define __ddiv_rn(a, b) ((a) / (b))
#define __dsqrt_rn(a) sqrt(a)
#endif
"""

_CUDA_PHILOX = string.Template(r"""
typedef struct { tw_u32 x, y, z, w; } tw_u32x4;

__device__ __forceinline__ tw_u32x4 tw_philox4x32_round(tw_u32x4 c, tw_u32 k0, tw_u32 k1) {
    tw_u32x4 r = {__umulhi(${M1}u, c.z) ^ c.y ^ k0, ${M1}u * c.z, __umulhi(${M0}u, c.x) ^ c.w ^ k1, ${M0}u * c.x};
    return r;
}

__device__ __forceinline__ tw_u32x4 tw_philox4x32_10(tw_u32x4 c, tw_u32 k0, tw_u32 k1) {
    c = tw_philox4x32_round(c, k0, k1);
    for (int i = 1; i < ${ROUNDS}; ++i) {
        k0 += ${W0}u;
        k1 += ${W1}u;
        c = tw_philox4x32_round(c, k0, k1);
    }
    return c;
}

/* Block `counter` of the stream of `seed` (see tilewise/_philox.py): words 4*(counter-offset) .. +3. */
__device__ __forceinline__ tw_u32x4 tw_philox_block(tw_u64 seed, tw_u64 counter) {
    tw_u32x4 c = {(tw_u32)counter, (tw_u32)(counter >> 32), 0u, 0u};
    return tw_philox4x32_10(c, (tw_u32)seed, (tw_u32)(seed >> 32));
}

__device__ __forceinline__ tw_i32 tw_draw_float(tw_u32 w) { return (tw_i32)(w >> 8); }

__device__ __forceinline__ tw_i64 tw_draw_double(tw_u32 hi, tw_u32 lo) {
    return (tw_i64)((((tw_u64)hi << 32) | lo) >> 11);
}

__device__ __forceinline__ float tw_uniform_float(tw_u32 w) {
    return __fmul_rn((float)tw_draw_float(w), ${ULP_F});
}

__device__ __forceinline__ double tw_uniform_double(tw_u32 hi, tw_u32 lo) {
    return __dmul_rn((double)tw_draw_double(hi, lo), ${ULP_D});
}
""")

_CUDA_NORMAL = string.Template(r"""
__device__ __forceinline__ ${T} tw_log_unit_${T}(${T} u) {
    int e;
    ${T} f = ${FREXP}(u, &e);
    if (f < ${SQRT_HALF}) {
        f = f + f;
        e -= 1;
    }
    ${T} s = ${DIV}(f - ${ONE}, ${ADD}(f, ${ONE}));
    ${T} s2 = ${MUL}(s, s);
    return ${ADD}(${MUL}((${T})e, ${LN2}), ${MUL}(s, ${LOG_POLY}));
}

__device__ __forceinline__ void tw_sincos_turn_${T}(${I} k, ${T}* sin_out, ${T}* cos_out) {
    ${I} q = (k + ${HALF_QUARTER}) >> ${QSHIFT};
    ${T} x = ${MUL}((${T})(k - (q << ${QSHIFT})), ${TURN_ULP});
    ${T} x2 = ${MUL}(x, x);
    ${T} s = ${ADD}(x, ${MUL}(x, ${MUL}(x2, ${SIN_POLY})));
    ${T} c = ${ADD}(${ONE}, ${MUL}(x2, ${COS_POLY}));
    ${T} sn = (q & 1) ? c : s;
    ${T} cs = (q & 1) ? s : c;
    *sin_out = (q & 2) ? -sn : sn;
    *cos_out = ((q + 1) & 2) ? -cs : cs;
}

__device__ __forceinline__ void tw_box_muller_${T}(${I} radius_draw, ${I} angle_draw, ${T}* z0, ${T}* z1) {
    ${T} one_minus_u = ${MUL}((${T})(${ONE_DRAW} - radius_draw), ${ULP});
    ${T} r = ${SQRT}(${MUL}(${MINUS_TWO}, tw_log_unit_${T}(one_minus_u)));
    ${T} s, c;
    tw_sincos_turn_${T}(angle_draw, &s, &c);
    *z0 = ${MUL}(r, c);
    *z1 = ${MUL}(r, s);
}
""")

_CUDA_NORMAL_PAIRS = r"""
__device__ __forceinline__ void tw_normal_float2(tw_u32 w0, tw_u32 w1, float* z0, float* z1) {
    tw_box_muller_float(tw_draw_float(w0), tw_draw_float(w1), z0, z1);
}

__device__ __forceinline__ void tw_normal_double2(tw_u32 hi0, tw_u32 lo0, tw_u32 hi1, tw_u32 lo1,
                                                  double* z0, double* z1) {
    tw_box_muller_double(tw_draw_double(hi0, lo0), tw_draw_double(hi1, lo1), z0, z1);
}
"""


def _c_literal(value: np.floating, p: _Precision) -> str:
    """An exact hexadecimal literal, so C reads back the very constant numpy used."""
    mantissa, exponent = float(value).hex().split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}{p.c_suffix}"


def _c_horner(x: str, coeffs: tuple[np.floating, ...], p: _Precision, add: str, mul: str) -> str:
    expr = _c_literal(coeffs[-1], p)
    for c in reversed(coeffs[:-1]):
        expr = f"{add}({_c_literal(c, p)}, {mul}({x}, {expr}))"
    return expr


def _render_normal(p: _Precision) -> str:
    short = "f" if p.c_type == "float" else "d"
    add, mul = f"__{short}add_rn", f"__{short}mul_rn"
    return _CUDA_NORMAL.substitute(
        T=p.c_type,
        I="tw_i32" if p.bits < 32 else "tw_i64",
        FREXP="frexpf" if p.c_type == "float" else "frexp",
        ADD=add,
        MUL=mul,
        DIV=f"__{short}div_rn",
        SQRT=f"__{short}sqrt_rn",
        ONE=_c_literal(p.const(1), p),
        MINUS_TWO=_c_literal(p.const(-2), p),
        SQRT_HALF=_c_literal(p.const(np.sqrt(0.5)), p),
        LN2=_c_literal(p.const(np.log(2)), p),
        LOG_POLY=_c_horner("s2", p.log_coeffs, p, add, mul),
        SIN_POLY=_c_horner("x2", p.sin_coeffs, p, add, mul),
        COS_POLY=_c_horner("x2", p.cos_coeffs, p, add, mul),
        HALF_QUARTER=f"{1 << (p.quarter_shift - 1)}" + ("" if p.bits < 32 else "LL"),
        QSHIFT=p.quarter_shift,
        TURN_ULP=_c_literal(p.turn_ulp, p),
        ONE_DRAW=f"{1 << p.bits}" + ("" if p.bits < 32 else "LL"),
        ULP=_c_literal(p.ulp, p),
    )


def _render_cuda_source() -> str:
    philox = _CUDA_PHILOX.substitute(
        M0=f"0x{PHILOX_MULTIPLIERS[0]:08X}",
        M1=f"0x{PHILOX_MULTIPLIERS[1]:08X}",
        W0=f"0x{PHILOX_WEYL[0]:08X}",
        W1=f"0x{PHILOX_WEYL[1]:08X}",
        ROUNDS=PHILOX_ROUNDS,
        ULP_F=_c_literal(_FLOAT32.ulp, _FLOAT32),
        ULP_D=_c_literal(_FLOAT64.ulp, _FLOAT64),
    )
    return _CUDA_PRELUDE + philox + _render_normal(_FLOAT32) + _render_normal(_FLOAT64) + _CUDA_NORMAL_PAIRS


PHILOX_CUDA_SOURCE: str = _render_cuda_source()
"""CUDA C device functions with the exact math of this module (also valid C99 for a host compiler).

tw_philox4x32_10(ctr, k0, k1), tw_philox_block(seed, counter), tw_uniform_float(w),
tw_uniform_double(hi, lo), tw_normal_float2(w0, w1, &z0, &z1), tw_normal_double2(hi0, lo0, hi1, lo1, &z0, &z1).
A kernel whose thread t turns tw_philox_block(seed, offset + t) into values reproduces, bit for bit, the
numpy draw of the same (seed, offset): 4 float32 values per block, or 2 float64 values.
"""
