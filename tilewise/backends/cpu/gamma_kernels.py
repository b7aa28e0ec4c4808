"""numpy kernels for the regularized incomplete gamma functions: ``igamma`` (P(a, x), torch.special.gammainc) and
``igammac`` (Q(a, x) = 1 - P(a, x), torch.special.gammaincc).

[Note: incomplete gamma] Both are computed in float64 and rounded to the result's dtype. Below x = a + 1 the
power series P = D * sum_n x^n / ((a + 1) ... (a + n)) converges fast and gives P to full relative precision; above
it the continued fraction of Q (Legendre's, evaluated by the modified Lentz method) does the same for Q; the other
function is one minus it. D = x^a e^-x / Gamma(a + 1) is taken through its logarithm, and for a >= 10 that logarithm
is a (log1p(d) - d) - log(2 pi a) / 2 - s(a) with d = (x - a) / a and s Stirling's series for lgamma's remainder,
so that the large, nearly cancelling terms a log x, x and lgamma(a + 1) are never formed (their difference would
lose about log10(a) digits). Both loops stop per element once a term no longer moves the sum, after O(sqrt(a))
steps where x is near a. The edge values are torch's: nan for a negative argument, for a = x = 0 and for two
infinite arguments; a = 0 with x > 0 gives P = 1, x = 0 gives P = 0, an infinite a gives P = 0 and an infinite x
P = 1. On CUDA these kernels run on host copies (``backends/cuda/kernels/fallback.py``).
"""

from __future__ import annotations

import math

import numpy as np

from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor, from_array_strided

_EPS = np.finfo(np.float64).eps
_TINY = 1e-300
_MAX_STEPS = 1_000_000  # a term stops moving the sum after about 10 sqrt(a) steps; a bound against a NaN loop
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_STIRLING_FROM = 10.0


def _lgamma(values: np.ndarray) -> np.ndarray:
    return np.fromiter(map(math.lgamma, values.tolist()), np.float64, values.size)


def _log_series_prefactor(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """log(x^a e^-x / Gamma(a + 1)) for a > 0, x > 0 (see [Note: incomplete gamma])."""
    out = np.empty_like(a)
    large = a >= _STIRLING_FROM
    small = ~large
    out[small] = a[small] * np.log(x[small]) - x[small] - _lgamma(a[small] + 1)
    al, xl = a[large], x[large]
    d = (xl - al) / al
    inverse, remainder = 1 / al, np.zeros_like(al)
    for k, c in enumerate(_STIRLING):
        remainder = remainder + c * inverse ** (2 * k + 1)
    out[large] = al * (np.log1p(d) - d) - 0.5 * np.log(al) - _HALF_LOG_2PI - remainder
    return out


def _lower_series(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(a, x) by its power series (x < a + 1)."""
    total, term = np.ones_like(a), np.ones_like(a)
    active = np.arange(a.size)
    for n in range(1, _MAX_STEPS):
        if not active.size:
            break
        term[active] *= x[active] / (a[active] + n)
        total[active] += term[active]
        active = active[np.abs(term[active]) > _EPS * np.abs(total[active])]
    return np.exp(_log_series_prefactor(a, x)) * total


def _upper_fraction(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Q(a, x) by Legendre's continued fraction, modified Lentz (x >= a + 1)."""
    b = x + 1 - a
    c = np.full_like(a, 1 / _TINY)
    d = 1 / b
    h = d.copy()
    active = np.arange(a.size)
    for i in range(1, _MAX_STEPS):
        if not active.size:
            break
        an = -i * (i - a[active])
        b[active] += 2
        dd = an * d[active] + b[active]
        dd = np.where(np.abs(dd) < _TINY, _TINY, dd)
        cc = b[active] + an / c[active]
        cc = np.where(np.abs(cc) < _TINY, _TINY, cc)
        d[active] = 1 / dd
        c[active] = cc
        step = d[active] * cc
        h[active] *= step
        active = active[np.abs(step - 1) > _EPS]
    return np.exp(_log_series_prefactor(a, x)) * a * h


def regularized_gamma(a: np.ndarray, x: np.ndarray, upper: bool) -> np.ndarray:
    """P(a, x) (``upper`` False) or Q(a, x), elementwise over float64 arrays of one shape."""
    a, x = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(x, np.float64))
    a, x = a.reshape(-1), x.reshape(-1)
    out = np.full(a.shape, np.nan)
    with np.errstate(all="ignore"):
        regular = (a > 0) & (x > 0) & np.isfinite(a) & np.isfinite(x)
        lower = regular & (x < a + 1)
        higher = regular & ~lower
        p = _lower_series(a[lower], x[lower])
        q = _upper_fraction(a[higher], x[higher])
        out[lower] = 1 - p if upper else p
        out[higher] = q if upper else 1 - q
        edge = ~regular & (a >= 0) & (x >= 0)  # the limits; NaN arguments and a = x = 0 stay nan
        lower_value = np.where(np.isinf(a), np.where(np.isinf(x), np.nan, 0.0),
                               np.where(np.isinf(x) | (a == 0), np.where(x == 0, np.nan, 1.0), 0.0))
        out[edge] = (1 - lower_value[edge]) if upper else lower_value[edge]
    return out


def _incomplete_gamma(name: str, upper: bool):
    def run(self, other):
        op = OPS[name]
        out, _ = op.dtype_rule(op, (self, other))
        a = self._np() if isinstance(self, Tensor) else np.asarray(self)
        x = other._np() if isinstance(other, Tensor) else np.asarray(other)
        shape = np.broadcast_shapes(a.shape, x.shape)
        values = regularized_gamma(a.astype(np.float64), x.astype(np.float64), upper).reshape(shape)
        operands = [(v._shape, v._strides) if isinstance(v, Tensor) else S.WRAPPED_NUMBER for v in (self, other)]
        return from_array_strided(values.astype(out.np), S.pointwise_strides(shape, operands), out)

    return run


kernel("igamma")(_incomplete_gamma("igamma", upper=False))
kernel("igammac")(_incomplete_gamma("igammac", upper=True))
