"""numpy kernels for the discrete samplers ``poisson`` and ``binomial``.

[Note: Poisson and binomial samples] The algorithms are torch's (so the samples follow the same laws, rounding
included): Poisson by multiplying uniforms until the product falls below e^-rate (rate < 10) and by Hormann's
transformed rejection with squeeze, PTRS (rate >= 10; "The transformed rejection method for generating Poisson
random variables", 1993); binomial on min(p, 1 - p), by counting geometric waiting times that fit in the count
(count * p < 10) and by Hormann's BTRS ("The generation of binomial random variates", 1993) above, the sample
reflected (count - k) where p > 1/2. The uniforms are Philox's, not torch's Mersenne twister, so the values differ
from torch's for a seed: each element draws pairs of uniforms per attempt as [Note: draws per element] in
``_philox.py`` lays out, which keeps a sample a function of (seed, offset, element) alone. Elements are processed
together, attempt by attempt, each leaving once it has its value. torch's edge values are kept: a zero rate or count
gives 0, p >= 1 the count, a NaN p NaN; an infinite rate gives the int64 minimum (torch's PTRS casts floor(inf) to
int64), and a negative or NaN rate is refused. Where torch's sampler never returns (a NaN count) the sample is NaN.
On CUDA these kernels run on host copies (``backends/cuda/kernels/fallback.py``) with the same generator.
"""

from __future__ import annotations

import math

import numpy as np

from tilewise import _philox
from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.ops.registry import OPS
from tilewise.tensor import from_array

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_INT64_MIN = -(2.0 ** 63)
_MAX_ATTEMPTS = 1 << 20  # each attempt accepts with probability above 0.5 (PTRS, BTRS) or ends a product of 2 steps


def _lgamma(values: np.ndarray) -> np.ndarray:
    return np.fromiter(map(math.lgamma, values.tolist()), np.float64, values.size)


class _Attempts:
    """The uniforms of the elements still sampling, attempt after attempt (see [Note: draws per element])."""

    def __init__(self, seed: int, offset: int):
        self.seed, self.offset, self.attempt = seed, offset, 0

    def next(self, elements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.attempt >= _MAX_ATTEMPTS:
            raise RuntimeError(f"sampling did not accept a value after {_MAX_ATTEMPTS} attempts")
        u, v = _philox.attempt_uniforms(self.seed, self.offset, elements, self.attempt)
        self.attempt += 1
        return u, v


# ---------------------------------------------------------------- Poisson

def _poisson_product(rates: np.ndarray, elements: np.ndarray, draws: _Attempts, out: np.ndarray) -> None:
    """rate < 10: the count of uniforms whose running product stays above e^-rate."""
    limit = np.exp(-rates)
    product, count = np.ones_like(rates), np.zeros_like(rates)
    active = np.arange(rates.size)
    while active.size:
        pair = draws.next(elements[active])
        for step in range(2):
            product[active] *= pair[step]
            above = product[active] > limit[active]
            count[active] += above
            ended = active[~above]
            out[elements[ended]] = count[ended]
            active, pair = active[above], (pair[0][above], pair[1][above])


def _poisson_ptrs(rates: np.ndarray, elements: np.ndarray, draws: _Attempts, out: np.ndarray) -> None:
    """rate >= 10: Hormann's PTRS."""
    slam, loglam = np.sqrt(rates), np.log(rates)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_inv_alpha = np.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2)
    active = np.arange(rates.size)
    while active.size:
        u, v = draws.next(elements[active])
        lam, aa, bb = rates[active], a[active], b[active]
        shifted = u - 0.5
        us = 0.5 - np.abs(shifted)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.floor((2 * aa / us + bb) * shifted + lam + 0.43)
        accept = (us >= 0.07) & (v <= vr[active])
        undecided = ~accept & ~((k < 0) | ((us < 0.013) & (v > us)))
        rows = np.flatnonzero(undecided)
        if rows.size:
            kr, ur = k[rows], us[rows]
            with np.errstate(divide="ignore"):
                lhs = np.log(v[rows]) + log_inv_alpha[active[rows]] - np.log(aa[rows] / (ur * ur) + bb[rows])
            rhs = -lam[rows] + kr * loglam[active[rows]] - _lgamma(kr + 1)
            accept[rows] = lhs <= rhs
        out[elements[active[accept]]] = k[accept]
        active = active[~accept]


def sample_poisson(rates: np.ndarray, seed: int, offset: int) -> np.ndarray:
    """One Poisson sample per rate (a flat float64 array of non-negative rates; see the note)."""
    out = np.zeros(rates.size)
    out[np.isinf(rates)] = _INT64_MIN
    small = np.flatnonzero((rates > 0) & (rates < 10))
    large = np.flatnonzero((rates >= 10) & np.isfinite(rates))
    if small.size:
        _poisson_product(rates[small], small, _Attempts(seed, offset), out)
    if large.size:
        _poisson_ptrs(rates[large], large, _Attempts(seed, offset), out)
    return out


@kernel("poisson")
def poisson(self, generator=None):
    from tilewise.ops.creation import generator_or_default

    OPS["poisson"].dtype_rule(OPS["poisson"], (self, generator))
    rates = self._np().astype(np.float64)
    if rates.size and not (rates >= 0).all():
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    seed, offset = generator_or_default(generator).claim(rates.size)
    values = sample_poisson(rates.reshape(-1), seed, offset).reshape(rates.shape)
    return from_array(values.astype(self.dtype.np), self.dtype)


# ---------------------------------------------------------------- binomial

def _binomial_inversion(count: np.ndarray, p: np.ndarray, elements: np.ndarray, draws: _Attempts,
                        out: np.ndarray) -> None:
    """count * p < 10: the number of geometric waiting times ceil(log u / log(1 - p)) whose sum stays within count."""
    log_q = np.log1p(-p)
    waited, successes = np.zeros_like(count), np.zeros_like(count)
    active = np.arange(count.size)
    while active.size:
        pair = draws.next(elements[active])
        for step in range(2):
            with np.errstate(divide="ignore"):
                waited[active] += np.ceil(np.log(pair[step]) / log_q[active])
            within = waited[active] <= count[active]
            successes[active] += within
            ended = active[~within]
            out[elements[ended]] = successes[ended]
            active, pair = active[within], (pair[0][within], pair[1][within])


def _stirling_tail(k: np.ndarray) -> np.ndarray:
    """log(k!) - ((k + 1/2) log(k + 1) - (k + 1) + log(2 pi) / 2): Stirling's series in 1 / (k + 1) from k = 10."""
    z = k + 1
    out = np.empty_like(z)
    small = z < 11
    zs = z[small]
    out[small] = _lgamma(zs) - ((zs - 0.5) * np.log(zs) - zs + _LOG_SQRT_2PI)
    zl = z[~small]
    inverse_square = 1 / (zl * zl)
    out[~small] = (1 / 12 - inverse_square * (1 / 360 - inverse_square / 1260)) / zl
    return out


def _binomial_btrs(n: np.ndarray, p: np.ndarray, elements: np.ndarray, draws: _Attempts, out: np.ndarray) -> None:
    """count * p >= 10 (p <= 1/2): Hormann's BTRS."""
    spread = np.sqrt(n * p * (1 - p))
    b = 1.15 + 2.53 * spread
    a = -0.0873 + 0.0248 * b + 0.01 * p
    c = n * p + 0.5
    v_r = 0.92 - 4.2 / b
    r = p / (1 - p)
    alpha = (2.83 + 5.1 / b) * spread
    m = np.floor((n + 1) * p)
    mode_terms = ((m + 0.5) * np.log((m + 1) / (r * (n - m + 1))) + _stirling_tail(m) + _stirling_tail(n - m))
    active = np.arange(n.size)
    while active.size:
        u, v = draws.next(elements[active])
        shifted = u - 0.5
        us = 0.5 - np.abs(shifted)
        na = n[active]
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.floor((2 * a[active] / us + b[active]) * shifted + c[active])
        inside = (k >= 0) & (k <= na)
        accept = inside & (us >= 0.07) & (v <= v_r[active])
        rows = np.flatnonzero(inside & ~accept)
        if rows.size:
            e, kr, nr, ur = active[rows], k[rows], na[rows], us[rows]
            with np.errstate(divide="ignore"):
                log_v = np.log(v[rows] * alpha[e] / (a[e] / (ur * ur) + b[e]))
            bound = (mode_terms[e] + (nr + 1) * np.log((nr - m[e] + 1) / (nr - kr + 1))
                     + (kr + 0.5) * np.log(r[e] * (nr - kr + 1) / (kr + 1)) - _stirling_tail(kr)
                     - _stirling_tail(nr - kr))
            accept[rows] = log_v <= bound
        out[elements[active[accept]]] = k[accept]
        active = active[~accept]


def sample_binomial(count: np.ndarray, prob: np.ndarray, seed: int, offset: int) -> np.ndarray:
    """One binomial sample per (count, prob) pair (flat float64 arrays of one size; see the note)."""
    out = np.full(count.size, np.nan)
    with np.errstate(invalid="ignore"):
        none = (count <= 0) | (prob <= 0)
        every = ~none & (prob >= 1)
        regular = ~none & ~every & (prob > 0) & (prob < 1) & np.isfinite(count)
    out[none] = 0.0
    out[every] = count[every]
    out[~none & ~every & np.isinf(count) & (prob > 0) & (prob < 1)] = np.inf
    flipped = prob > 0.5
    q = np.where(flipped, 1 - prob, prob)
    with np.errstate(invalid="ignore"):
        btrs = regular & (count * q >= 10)
    for chosen, sampler in ((np.flatnonzero(regular & ~btrs), _binomial_inversion), (np.flatnonzero(btrs),
                                                                                        _binomial_btrs)):
        if chosen.size:
            sampler(count[chosen], q[chosen], chosen, _Attempts(seed, offset), out)
    reflect = regular & flipped
    out[reflect] = count[reflect] - out[reflect]
    return out


@kernel("binomial")
def binomial(count, prob, generator=None):
    from tilewise.ops.creation import generator_or_default

    OPS["binomial"].dtype_rule(OPS["binomial"], (count, prob, generator))
    shape = S.broadcast_shapes(count._shape, prob._shape, op="binomial")
    n = np.broadcast_to(count._np().astype(np.float64), shape).reshape(-1)
    p = np.broadcast_to(prob._np().astype(np.float64), shape).reshape(-1)
    seed, offset = generator_or_default(generator).claim(n.size)
    values = sample_binomial(n, p, seed, offset).reshape(shape)
    return from_array(values.astype(count.dtype.np), count.dtype)
