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
from tilewise.ops.expr import Expr, fma, where
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
    y + 6 (its error there is below 1e-12). torch gives -inf at 0, +inf at -0 (``copysign(inf, -x)``) and nan at
    the negative integers."""
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
    return where(x.eq(0), where(x.signbit(), math.inf, -math.inf), where(pole, math.nan, out))


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
_I_ASYMPTOTIC_TERMS = 30
_I_SWITCH = 15.0  # |x| above it: the asymptotic series is exact to double precision


def bessel_i_expr(nu: int, x: Expr, scaled: bool = False) -> Expr:
    """Modified Bessel function I_nu (nu = 0, 1): its power series for |x| <= 15, else
    e^|x| / sqrt(2 pi |x|) times the asymptotic series; odd in x for nu = 1. ``scaled``: e^-|x| I_nu(x) (i0e, i1e),
    the series times e^-|x| and the asymptotic series without its exponential, so nothing overflows."""
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
    if scaled:
        series = series * (-ax.minimum(_I_SWITCH)).exp()
        asym = asym / (2 * math.pi * big).sqrt()
    else:
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


# ---------------------------------------------------------------- torch.special: normal distribution, entropy, scaled
# [Note: torch.special's functions] Each is torch's aten operator (``special_ndtr``, ...), called as
# ``tilewise.special.ndtr``. Their meanings are torch's kernels' (ATen's Math.h): ndtr is (1 + erf(x / sqrt 2)) / 2,
# as torch's vectorised kernel computes it (so it is 0 below about -38, where erf is -1); ndtri is Cephes' three
# rational approximations; log_ndtr is log1p(-erfc(t) / 2) for x >= -1, else log(erfcx(-t) / 2) - t^2 (t = x /
# sqrt 2), exact far into the lower tail. erfcx = e^(x^2) erfc(x) is, for 0 <= x < 5, erfc(x) times e^(x^2) with
# x^2 split into its rounded value h and the exact remainder fma(x, x, -h), so that the exponential does not
# amplify the rounding of x^2; for x >= 5 the continued fraction 1 / sqrt(pi) / (x + (1/2) / (x + 1 / (x + ...)))
# (16 levels: double precision from 5 on, and no underflow of erfc); for x < 0, 2 e^(x^2) - erfcx(-x).
_SQRT1_2 = math.sqrt(0.5)
# the name torch's dispatch reports a dtype it has no kernel for under
_KERNELS = {"special_ndtri": "ndtri", "special_log_ndtr": "log_ndtr",
            "special_erfcx": "erfcx", "special_entr": "entr", "special_i0e": "i0e", "special_i1e": "i1e",
            "special_xlog1py": "xlog1py", "special_i1": "i1"}


def _no_kernel(op, args, dtype: DType) -> NotImplementedError:
    device = next((v.device.type for v in args if hasattr(v, "device")), "cpu")
    return NotImplementedError(f'"{_KERNELS[op.name]}_{device}" not implemented for \'{c10_name(dtype)}\'')


def real_kernel(op, args) -> tuple[DType, DType]:
    """ndtr, entr, i0e, i1e, xlog1py: torch's floating kernels (float16 and bfloat16 too; integers and bools give
    the default float dtype); complex refused."""
    given = result_type(*_operands(op, args))
    if given.is_complex:
        raise _no_kernel(op, args, given)
    return R.promote_float(op, args)


def float_double_kernel(op, args) -> tuple[DType, DType]:
    """ndtri, log_ndtr and erfcx: torch has float32 and float64 kernels only (float16 and bfloat16 are refused)."""
    out, compute = real_kernel(op, args)
    if out in (dtypes.float16, dtypes.bfloat16):
        raise _no_kernel(op, args, out)
    return out, compute


def _step_rounding(args, dtype):
    """Where torch's CPU kernel computes a float16/bfloat16 result in that type (c10's Half and BFloat16 round
    every arithmetic step, as its vectorised kernels do), a function rounding an intermediate value to it; else
    the identity (CUDA computes in float32 throughout)."""
    values = [v for v in args if v is not None and (hasattr(v, "dtype") or isinstance(v, (int, float)))]
    out = to_float(result_type(*values))
    on_cuda = any(getattr(getattr(v, "device", None), "type", None) == "cuda" for v in values)
    if out is not dtype and out in (dtypes.float16, dtypes.bfloat16) and not on_cuda:
        return lambda e: e.cast(out).cast(dtype)
    return lambda e: e


def _horner(x: Expr, coefficients) -> Expr:
    out = Expr("const", (), coefficients[0])
    for c in coefficients[1:]:
        out = out * x + c
    return out


_NDTRI_P0 = (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
             1.39312609387279679503E1, -1.23916583867381258016E0)
_NDTRI_Q0 = (1.0, 1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
             -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
             1.59056225126211695515E1, -1.18331621121330003142E0)
_NDTRI_P1 = (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
             4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
             -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4)
_NDTRI_Q1 = (1.0, 1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
             1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
             -3.80806407691578277194E-2, -9.33259480895457427372E-4)
_NDTRI_P2 = (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
             1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
             3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9)
_NDTRI_Q2 = (1.0, 6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
             2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
             2.89247864745380683936E-6, 6.79019408009981274425E-9)
_EXP_M2 = 0.13533528323661269189  # e^-2


def ndtri_expr(y0: Expr) -> Expr:
    """The inverse of ndtr (Cephes): for |y - 1/2| <= 1/2 - e^-2 a rational function of (y - 1/2)^2; in the tails,
    with z = sqrt(-2 log y) (y the smaller of y0 and 1 - y0), z - log(z) / z minus a rational function of 1 / z
    (one for z < 8, another above). 0 and 1 give -inf and inf, outside [0, 1] nan."""
    upper = y0.gt(1 - _EXP_M2)
    y = where(upper, 1 - y0, y0)
    central = y.gt(_EXP_M2)
    c = y - 0.5
    c2 = c * c
    middle = (c + c * (c2 * _horner(c2, _NDTRI_P0) / _horner(c2, _NDTRI_Q0))) * 2.50662827463100050242
    t = where(central, _EXP_M2, y)  # the tail branch on a value it is defined at where the middle one is taken
    z = (-2 * t.log()).sqrt()
    x0 = z - z.log() / z
    w = 1 / z
    x1 = where(z.lt(8), w * _horner(w, _NDTRI_P1) / _horner(w, _NDTRI_Q1),
               w * _horner(w, _NDTRI_P2) / _horner(w, _NDTRI_Q2))
    tail = where(upper, x0 - x1, x1 - x0)
    out = where(central, middle, tail)
    return where(y0.eq(0), -math.inf, where(y0.eq(1), math.inf,
                                             where(y0.lt(0).logical_or(y0.gt(1)), math.nan, out)))


_ERFCX_SWITCH = 5.0
_ERFCX_LEVELS = 16
_INV_SQRT_PI = 1 / math.sqrt(math.pi)


def _exp_square(x: Expr) -> Expr:
    """e^(x^2) without the rounding of x^2 magnified: e^h (1 + l) with h = x * x rounded and l = x * x - h exact
    (inf once e^h overflows)."""
    h = x * x
    e = h.exp()
    return where(e.isinf(), e, fma(e, fma(x, x, -h), e))


def erfcx_expr(x: Expr) -> Expr:
    ax = x.abs()
    near = ax.erfc() * _exp_square(ax)
    far_x = ax.maximum(_ERFCX_SWITCH)
    f = far_x
    for k in range(_ERFCX_LEVELS, 0, -1):
        f = far_x + (k / 2) / f
    far = _INV_SQRT_PI / f
    positive = where(ax.lt(_ERFCX_SWITCH), near, far)
    return where(x.lt(0), 2 * _exp_square(x) - positive, positive)


def log_ndtr_expr(x: Expr) -> Expr:
    t = x * _SQRT1_2
    return where(x.lt(-1), (erfcx_expr(-t) / 2).log() - t * t, (-(t.erfc() / 2)).log1p())


def _entr(args, dtype):
    x = _in(0)
    r = _step_rounding(args[:1], dtype)
    return where(x.isnan(), x, where(x.gt(0), -x * r(x.log()), where(x.eq(0), 0.0, -math.inf)))


def _xlog1py(args, dtype):
    """As xlogy (see ``_xlogy``), with log1p(other)."""
    a, b = _in(0), _in(1)
    r = _step_rounding(args[:2], dtype)
    return where(b.isnan(), b, where(a.eq(0), 0, a * r(b.log1p())))


def _ndtr_composite(x):
    """torch's ``special_ndtr`` is a composite of these operators, and its autograd keeps what they keep (erf's
    scaled input, not ``x``): writing into ``x`` after the forward is no error there, nor here."""
    if x.dtype.is_complex:  # erf's own refusal, which torch's composite meets first
        raise NotImplementedError(f'"erf_vml_{x.device.type}" not implemented for \'{c10_name(x.dtype)}\'')
    return (1 + (x * _SQRT1_2).erf()) * 0.5


unary("special_ndtri", ndtri_expr, f"grad * {math.sqrt(2 * math.pi)} * exp(result * result / 2)",
      float_double_kernel, method=False, inplace=False)
unary("special_log_ndtr", log_ndtr_expr,
      f"grad / {math.sqrt(2 * math.pi)} * exp(-(result + self * self / 2))", float_double_kernel, method=False,
      inplace=False)
unary("special_erfcx", erfcx_expr, f"(2 * self * result - {2 / math.sqrt(math.pi)}) * grad", float_double_kernel,
      method=False, inplace=False)
pointwise("special_entr(Tensor self) -> Tensor", None, {"self": "grad * -(1 + log(self))"}, real_kernel,
          expr_builder=_entr, method=False, inplace=False)
unary("special_i1", lambda x: bessel_i_expr(1, x), "grad * (i0(self) - where(self == 0, 0.5 * ones_like(self), "
      "result / where(self == 0, ones_like(self), self)))", real_kernel, method=False, inplace=False)
unary("special_i0e", lambda x: bessel_i_expr(0, x, scaled=True), "grad * (special_i1e(self) - sign(self) * result)",
      real_kernel, method=False, inplace=False)
unary("special_i1e", lambda x: bessel_i_expr(1, x, scaled=True),
      "grad * where(self == 0, 0.5 * ones_like(self), special_i0e(self) - result * (sign(self) + 1 / "
      "where(self == 0, ones_like(self), self)))", real_kernel, method=False, inplace=False)
pointwise("special_xlog1py(Tensor self, Tensor other) -> Tensor", None,
          {"self": "where((self == 0) & (other <= -1), zeros_like(grad), grad * log1p(other))",
           "other": "grad * self / (other + 1)"}, real_kernel, expr_builder=_xlog1py, method=False, inplace=False)

# ---------------------------------------------------------------- regularized incomplete gamma functions
# torch.special.gammainc and gammaincc are these operators (``tilewise/special.py``). Their meaning is a series and
# a continued fraction run to convergence, so their kernels are numpy loops (``backends/cpu/gamma_kernels.py``; on
# CUDA on host copies). torch differentiates them in ``other`` only: a gradient for ``self`` raises at backward.
_IGAMMA_DENSITY = "exp((self - 1) * log(other) - other - lgamma(self))"
declare("igamma(Tensor self, Tensor other) -> Tensor", "other", dtype=R.floating_kernel,
        grad={"self": "derivative_not_implemented('igamma: input')", "other": f"grad * {_IGAMMA_DENSITY}"},
        fwd="auto_element_wise", inplace=True, batch=broadcast,
        doc="The regularized lower incomplete gamma function P(self, other) (torch.special.gammainc).\n\n"
            ">>> tw.igamma(tw.tensor([1.0]), tw.tensor([2.0]))\ntensor([0.8647])")
declare("igammac(Tensor self, Tensor other) -> Tensor", "other", dtype=R.floating_kernel,
        grad={"self": "derivative_not_implemented('igammac: input')", "other": f"-grad * {_IGAMMA_DENSITY}"},
        fwd="auto_element_wise", inplace=True, batch=broadcast,
        doc="The regularized upper incomplete gamma function Q(self, other) = 1 - P (torch.special.gammaincc).\n\n"
            ">>> tw.igammac(tw.tensor([1.0]), tw.tensor([2.0]))\ntensor([0.1353])")


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
      f"where(self == 0, zeros_like(grad), grad * conj_if_complex(({math.pi} * self * cos({math.pi} * self) - "
      f"sin({math.pi} * self)) / ({math.pi} * self * self)))")
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


composite("special_ndtr(Tensor self) -> Tensor", _ndtr_composite, method=False)


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
composite("positive(Tensor(a) self) -> Tensor(a)", _positive, dunder=("pos",))
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
