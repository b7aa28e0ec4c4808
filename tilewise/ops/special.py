"""Special functions and numpy-style pointwise operators: inverse hyperbolics, gamma family, logaddexp, xlogy,
sinc, heaviside, hypot, nextafter, fmax/fmin, ldexp, frexp, gcd/lcm, logit, float_power, clamp_min/max, i0.

[Note: special functions as expressions] Where C's libm and CUDA's math library both have the function
(asinh, lgamma, erfc, hypot, nextafter) it is a primitive of the scalar vocabulary (``ops/expr.py``), so the
numpy, C and CUDA renderers each call their library's own. digamma, polygamma and i0 are in neither of numpy
and C's libm, so their meaning is written here as an expression over primitives, the series torch's kernels
evaluate (Cephes): a recurrence that shifts the argument up, then an asymptotic expansion, which every
backend renders and the compiler fuses like any other pointwise chain. gcd, lcm and frexp loop or read bits;
they are primitives with numpy kernels (``backends/cpu/api_kernels.py``).
"""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise.dtypes import DType, c10_name, compute_dtype, result_type, to_float
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import broadcast
from tilewise.ops.expr import Expr, where
from tilewise.ops.formulas import HELPERS
from tilewise.ops.pointwise import pointwise, unary
from tilewise.ops.registry import declare


def _not_implemented(op, dtype: DType) -> NotImplementedError:
    name = c10_name(dtype)
    return NotImplementedError(f'"{op.name}_cpu" not implemented for \'{name}\' (got a {dtype.name} input)')


def _operands(op, args) -> list:
    return [args[k] for k in op.tensor_idx if args[k] is not None]


def floating_kernel(op, args) -> tuple[DType, DType]:
    """Operators torch has floating kernels only for (hypot, logaddexp, nextafter): integers are refused."""
    out = result_type(*_operands(op, args))
    if not out.is_floating_point:
        raise _not_implemented(op, out)
    return out, compute_dtype(out)


def exact_floating_kernel(op, args) -> tuple[DType, DType]:
    """nextafter steps to the neighbouring value of the result's own format, so it computes in that format."""
    out, _ = floating_kernel(op, args)
    if out.itemsize < 4:
        raise NotImplementedError(f"{op.name}: {out.name} inputs are not supported; convert to float32 first")
    return out, out


def integer_kernel(op, args) -> tuple[DType, DType]:
    """gcd/lcm: integer operands only."""
    out = result_type(*_operands(op, args))
    if out.is_floating_point or out is dtypes.bool_:
        raise _not_implemented(op, out)
    return out, out


def same_dtype(op, args) -> tuple[DType, DType]:
    """heaviside refuses operands of different dtypes, like torch."""
    values = _operands(op, args)
    kinds = {v.dtype for v in values if hasattr(v, "dtype") and v.ndim}
    if len({v.dtype for v in values if hasattr(v, "dtype")}) > 1 and kinds:
        raise RuntimeError(f"{op.name} is not yet implemented for tensors with different dtypes (got "
                           f"{' and '.join(v.dtype.name for v in values if hasattr(v, 'dtype'))})")
    return R.promote(op, args)


# ---------------------------------------------------------------- series (Cephes' algorithms, as torch's kernels)
_DIGAMMA_SHIFT = 6


def digamma_expr(x: Expr) -> Expr:
    """psi(x): reflection below 1/2, then psi(y) = psi(y + 6) - sum 1/(y + k) and the asymptotic series at
    y + 6 (its error there is below 1e-12). torch gives -inf at 0 and nan at the negative integers."""
    reflect = x.lt(0.5)
    y = where(reflect, 1 - x, x)
    shift = 1 / y
    for k in range(1, _DIGAMMA_SHIFT):
        shift = shift + 1 / (y + k)
    z = y + _DIGAMMA_SHIFT
    zz = 1 / (z * z)
    tail = zz * (1 / 12 - zz * (1 / 120 - zz * (1 / 252 - zz * (1 / 240 - zz * (1 / 132 - zz * (691 / 32760))))))
    value = z.log() - 0.5 / z - tail - shift
    reflected = value - math.pi / (x * math.pi).tan()
    out = where(reflect, reflected, value)
    pole = reflect.logical_and(x.eq(x.floor()))
    return where(x.eq(0), -math.inf, where(pole, math.nan, out))


_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6)
_ZETA_SHIFT = 9


def hurwitz_zeta_expr(s: int, x: Expr) -> Expr:
    """zeta(s, x) = sum_k (x + k)^-s by Euler-Maclaurin: nine terms, then the integral and Bernoulli tail."""
    total = x ** float(-s)
    for k in range(1, _ZETA_SHIFT):
        total = total + (x + k) ** float(-s)
    w = x + _ZETA_SHIFT
    total = total + w ** float(1 - s) / (s - 1) + 0.5 * w ** float(-s)
    rising, factorial = float(s), 2.0
    for j, b in enumerate(_BERNOULLI, start=1):
        total = total + (b * rising / factorial) * w ** float(-s - 2 * j + 1)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        factorial *= (2 * j + 1) * (2 * j + 2)
    return where(x.le(0).logical_and(x.eq(x.floor())), math.inf, total)


def polygamma_expr(n: int, x: Expr) -> Expr:
    if n == 0:
        return digamma_expr(x)
    return ((-1) ** (n + 1) * math.factorial(n)) * hurwitz_zeta_expr(n + 1, x)


_I_SERIES_TERMS = 48
_I_ASYMPTOTIC_TERMS = 18
_I_SWITCH = 15.0  # |x| above it: the asymptotic series is exact to double precision


def bessel_i_expr(nu: int, x: Expr) -> Expr:
    """Modified Bessel function I_nu (nu = 0, 1): its power series for |x| <= 15, else
    e^|x| / sqrt(2 pi |x|) times the asymptotic series; odd in x for nu = 1."""
    ax = x.abs()
    t = (ax * 0.5) * (ax * 0.5)
    term, series = Expr("const", (), 1.0), Expr("const", (), 1.0)
    for k in range(1, _I_SERIES_TERMS):
        term = term * t / (k * (k + nu))
        series = series + term
    if nu == 1:
        series = series * ax * 0.5
    inv = 1 / (8 * ax.maximum(_I_SWITCH))
    term, asym = Expr("const", (), 1.0), Expr("const", (), 1.0)
    for j in range(1, _I_ASYMPTOTIC_TERMS):
        term = term * (((2 * j - 1) ** 2 - 4 * nu * nu) / j) * inv
        asym = asym + term
    big = ax.maximum(_I_SWITCH)
    asym = asym * (big * 0.5).exp() * ((big * 0.5).exp() / (2 * math.pi * big).sqrt())
    out = where(ax.le(_I_SWITCH), series, asym)
    return out if nu == 0 else out.copysign(x)


def _in(k: int) -> Expr:
    return Expr("input", (), k)


def _polygamma(args, dtype):
    n = args[0]
    if n < 0:
        raise RuntimeError(f"polygamma(n, x) does not support negative n (got n={n})")
    return polygamma_expr(n, _in(0))


# ---------------------------------------------------------------- inverse hyperbolic, gamma family
unary("asinh", lambda x: x.asinh(), "grad * rsqrt(self * self + 1)", aliases=("arcsinh",))
unary("acosh", lambda x: x.acosh(), "grad * rsqrt(self * self - 1)", aliases=("arccosh",))
unary("atanh", lambda x: x.atanh(), "grad / (1 - self * self)", aliases=("arctanh",))
unary("erfc", lambda x: x.erfc(), f"-grad * {2 / math.sqrt(math.pi)} * exp(-self * self)")
unary("lgamma", lambda x: x.lgamma(), "grad * digamma(self)")
unary("digamma", digamma_expr, "grad * polygamma(1, self)")
pointwise("polygamma(int n, Tensor self) -> Tensor", None, {"self": "grad * polygamma(n + 1, self)"},
          R.promote_float, expr_builder=_polygamma, method=False, inplace=False)
unary("i0", lambda x: bessel_i_expr(0, x), "grad * special_i1(self)")
unary("special_i1", lambda x: bessel_i_expr(1, x), "grad * (i0(self) - where(self == 0, 0.5 * ones_like(self), "
      "special_i1(self) / where(self == 0, ones_like(self), self)))", method=False, inplace=False)

# ---------------------------------------------------------------- exponentials and logs of pairs
pointwise("logaddexp(Tensor self, Tensor other) -> Tensor",
          lambda a, b: where(a.eq(b).logical_and(a.isinf()), a, a.maximum(b) + (-(a - b).abs()).exp().log1p()),
          {"self": "grad / (1 + exp(other - self))", "other": "grad / (1 + exp(self - other))"}, floating_kernel)
pointwise("logaddexp2(Tensor self, Tensor other) -> Tensor",
          lambda a, b: where(a.eq(b).logical_and(a.isinf()), a,
                             a.maximum(b) + (-(a - b).abs()).exp2().log1p() / math.log(2.0)),
          {"self": "grad / (1 + exp2(other - self))", "other": "grad / (1 + exp2(self - other))"}, floating_kernel)
def _xlogy(args, dtype):
    """torch's CPU kernel computes in the result's own type: for float16 and bfloat16, log(other) is rounded to it
    before the product (c10's ``std::log`` of a Half returns a Half)."""
    a, b = _in(0), _in(1)
    out = to_float(result_type(*[v for v in args[:2] if v is not None]))
    log = b.log()
    on_cuda = any(getattr(getattr(v, "device", None), "type", None) == "cuda" for v in args[:2])
    if out is not dtype and out in (dtypes.float16, dtypes.bfloat16) and not on_cuda:  # CUDA's is float32 throughout
        log = log.cast(out).cast(dtype)
    return where(b.isnan(), b, where(a.eq(0), 0, a * log))


pointwise("xlogy(Tensor self, Tensor other) -> Tensor", None,
          {"self": "where((self == 0) & (other <= 0), zeros_like(grad), grad * log(other))",
           "other": "grad * self / other"}, R.promote_float, expr_builder=_xlogy)
unary("sinc", lambda x: where(x.eq(0), 1.0, (x * math.pi).sin() / (x * math.pi)),
      f"where(self == 0, zeros_like(grad), grad * ({math.pi} * self * cos({math.pi} * self) - sin({math.pi} * self))"
      f" / ({math.pi} * self * self))")
unary("deg2rad", lambda x: x * (math.pi / 180), f"grad * {math.pi / 180}")
unary("rad2deg", lambda x: x * (180 / math.pi), f"grad * {180 / math.pi}")

# ---------------------------------------------------------------- comparisons of pairs
pointwise("hypot(Tensor self, Tensor other) -> Tensor", lambda a, b: a.hypot(b),
          {"self": "grad * self / result", "other": "grad * other / result"}, floating_kernel)
pointwise("nextafter(Tensor self, Tensor other) -> Tensor", lambda a, b: a.nextafter(b), None,
          exact_floating_kernel, differentiable=False)
pointwise("heaviside(Tensor self, Tensor values) -> Tensor",
          lambda x, v: where(x.eq(0), v, where(x.gt(0), 1, 0)), None, same_dtype, differentiable=False)
pointwise("fmax(Tensor self, Tensor other) -> Tensor",
          lambda a, b: where(a.isnan(), b, where(b.isnan(), a, a.maximum(b))),
          {"self": "where((self >= other) | isnan(other), grad, zeros_like(grad))",
           "other": "where((self >= other) | isnan(other), zeros_like(grad), grad)"}, inplace=False,
          fwd="self_t.where((self > other) | isnan(other), other_t)")
pointwise("fmin(Tensor self, Tensor other) -> Tensor",
          lambda a, b: where(a.isnan(), b, where(b.isnan(), a, a.minimum(b))),
          {"self": "where((self <= other) | isnan(other), grad, zeros_like(grad))",
           "other": "where((self <= other) | isnan(other), zeros_like(grad), grad)"}, inplace=False,
          fwd="self_t.where((self <= other) | isnan(other), other_t)")

# ---------------------------------------------------------------- integers and floating-point parts
declare("gcd(Tensor self, Tensor other) -> Tensor", "other", dtype=integer_kernel, differentiable=False,
        inplace=True, batch=broadcast)
declare("lcm(Tensor self, Tensor other) -> Tensor", "other", dtype=integer_kernel, differentiable=False,
        inplace=True, batch=broadcast)
declare("frexp.Tensor(Tensor self) -> (Tensor mantissa, Tensor exponent)", "other",
        grad={"self": "grad / exp2(result[1].to(grad.dtype))"}, nondiff_outputs=(1,), batch=broadcast,
        fwd="self_t / exp2(result[1].to(self_t.dtype))")


def composite(schema: str, decomposition, **attrs):
    return declare(schema, "composite", decomposition=decomposition, **attrs)


def _ldexp(self, other):
    return self * (2.0 ** other if not hasattr(other, "dtype") else (2.0 ** other.to(to_float(other.dtype))))


def _float_power(self, exponent):
    base = self.to(dtypes.float64) if hasattr(self, "dtype") else self
    return base.pow(exponent.to(dtypes.float64) if hasattr(exponent, "dtype") else exponent)


def _logit(self, eps=None):
    x = self if self.dtype.is_floating_point else self.to(dtypes.get_default_dtype())
    if eps is not None:
        x = x.clamp(eps, 1 - eps)
    return (x / (1 - x)).log()


def _positive(self):
    if self.dtype is dtypes.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return self


composite("ldexp(Tensor self, Tensor other) -> Tensor", _ldexp, inplace=True,
          grad={"self": "grad * exp2(other)", "other": f"grad * result * {math.log(2.0)}"},
          fwd="self_t * exp2(other) + other_t * result * 0.6931471805599453")
composite("float_power(Tensor self, Tensor exponent) -> Tensor", _float_power, inplace=True)
composite("logit(Tensor self, float? eps=None) -> Tensor", _logit, inplace=True)
composite("positive(Tensor(a) self) -> Tensor(a)", _positive)
composite("clamp_min(Tensor self, Tensor min) -> Tensor", lambda self, min: self.clamp(min=min), inplace=True)
composite("clamp_max(Tensor self, Tensor max) -> Tensor", lambda self, max: self.clamp(max=max), inplace=True)


def _mvlgamma(self, p):
    if p < 1:
        raise RuntimeError(f"mvlgamma: p has to be greater than or equal to 1 (got p={p})")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"mvlgamma: input tensor must be floating point (got {self.dtype.name})")
    total = self.lgamma()
    for j in range(1, p):  # p is small: one lgamma per term keeps the sum free of constant tensors
        total = total + (self - j / 2).lgamma()
    return (total + p * (p - 1) / 4 * math.log(math.pi)).contiguous()  # row-major: torch's is a sum over terms


def mvlgamma_backward(grad, self, p):
    total = self.digamma()
    for j in range(1, p):
        total = total + (self - j / 2).digamma()
    return grad * total


HELPERS.update(mvlgamma_backward=mvlgamma_backward)
composite("mvlgamma(Tensor self, int p) -> Tensor", _mvlgamma, inplace=True,
          grad={"self": "mvlgamma_backward(grad, self, p)"},
          fwd="auto_element_wise")
