"""Render a scalar ``Expr`` to a numpy function (the CPU eager kernel of a pointwise operator).

The generated source is kept on the function (``__source__``) so ``explain`` can show it, exactly as the
C and CUDA renderers keep theirs.
"""

from __future__ import annotations

import contextvars
import math
import threading

import numpy as np

from tilewise.backends.cpu.fma import fma as _fma
from tilewise.dtypes import ALL as ALL_DTYPES
from tilewise.ops.expr import Expr, toposort

_UNARY = {
    "neg": "np.negative", "abs": "np.abs", "sign": "_sign", "exp": "np.exp", "exp2": "np.exp2",
    "expm1": "np.expm1", "log": "np.log", "log2": "np.log2", "log10": "_log10", "log1p": "np.log1p",
    "sqrt": "np.sqrt", "rsqrt": "_rsqrt", "reciprocal": "_reciprocal", "sin": "np.sin", "cos": "np.cos",
    "tan": "np.tan", "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan", "sinh": "np.sinh",
    "cosh": "np.cosh", "tanh": "np.tanh", "erf": "_erf", "erfinv": "_erfinv", "floor": "np.floor",
    "ceil": "np.ceil", "round": "np.round", "trunc": "np.trunc", "logical_not": "np.logical_not",
    "bitwise_not": "np.invert", "isnan": "np.isnan", "isinf": "np.isinf", "signbit": "np.signbit",
    "asinh": "np.arcsinh", "acosh": "np.arccosh", "atanh": "np.arctanh", "erfc": "_erfc", "lgamma": "_lgamma",
}
_BINARY = {
    "add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.true_divide",
    "floordiv": "_floordiv", "truncdiv": "_truncdiv", "mod": "_mod", "fmod": "_fmod", "pow": "_pow",
    "maximum": "np.maximum", "minimum": "np.minimum", "atan2": "np.arctan2", "eq": "np.equal",
    "ne": "np.not_equal", "lt": "np.less", "le": "np.less_equal", "gt": "np.greater", "ge": "np.greater_equal",
    "logical_and": "np.logical_and", "logical_or": "np.logical_or", "logical_xor": "np.logical_xor",
    "bitwise_and": "np.bitwise_and", "bitwise_or": "np.bitwise_or", "bitwise_xor": "np.bitwise_xor",
    "lshift": "np.left_shift", "rshift": "np.right_shift", "copysign": "np.copysign", "hypot": "np.hypot",
    "nextafter": "np.nextafter",
}


def _sign(x):
    """torch's sign: 0 at NaN (``(0 < x) - (x < 0)``), where numpy's is NaN; a bool is its own sign."""
    if np.asarray(x).dtype == np.bool_:
        return np.array(x, copy=True)
    out = np.sign(x)
    if out.dtype.kind == "f":
        out = np.where(np.isnan(out), out.dtype.type(0), out)
    return out


def _log10(x):
    """numpy's float32 log10 is an ulp off for about half its inputs, powers of ten among them (log10(100) is
    2.0000002); torch's is correctly rounded nearly everywhere, so float32 goes through float64 (as fast as
    numpy's float32 one to within a few times, for an operator no hot loop leans on)."""
    if getattr(x, "dtype", None) == np.float32:
        return np.log10(x, dtype=np.float64).astype(np.float32)
    return np.log10(x)


def _rsqrt(x):
    return 1 / np.sqrt(x)


def _reciprocal(x):
    return 1 / x


def _zero_divisor(b) -> bool:
    """Whether ``b`` is an integer divisor holding a zero (floating division by zero gives inf or nan)."""
    dtype = getattr(b, "dtype", None)
    if dtype is None or dtype.kind not in "iub":
        return False
    if type(b) is not np.ndarray:
        return b == 0  # a numpy scalar
    return np.count_nonzero(b) != b.size  # the cheapest full pass numpy has (a tenth of np.all on small arrays)


def zero_division_error(op: str, dtype) -> RuntimeError:
    """torch's error for an integer division by zero on the CPU, naming the operator."""
    return RuntimeError(f"ZeroDivisionError: {op}: integer division by zero (a divisor of dtype {dtype} is 0); "
                        "divide floating-point tensors (e.g. .double()) to get inf or nan instead")


def _integer_checked(ufunc):
    """``ufunc`` refusing an integer divisor of zero, as torch's CPU kernels do (numpy would give 0)."""
    def divide(a, b, op):
        if _zero_divisor(b) and np.broadcast(a, b).size:  # an empty result divides nothing
            raise zero_division_error(op, np.result_type(a, b))
        return ufunc(a, b)

    divide.__name__ = f"checked_{ufunc.__name__}"
    return divide


def _divide_toward_zero(a, b):
    if np.result_type(a, b).kind == "f":
        return np.trunc(np.true_divide(a, b))
    q, r = np.divmod(a, b)  # floor division, one pass for both
    return q + ((r != 0) & (q < 0))  # numpy wraps INT_MIN // -1 to INT_MIN, the answer, with a remainder of 0


def _remainder(a, b):
    """torch's remainder: fmod moved into the divisor's sign, so a zero keeps the dividend's sign (-2.0 % 1.0 is
    -0.0, where numpy gives 0.0)."""
    if np.result_type(a, b).kind != "f":
        return np.remainder(a, b)
    mod = np.fmod(a, b)
    return np.where((mod != 0) & (np.less(b, 0) != (mod < 0)), mod + b, mod)


_floordiv, _truncdiv, _mod, _fmod = (_integer_checked(u) for u in (np.floor_divide, _divide_toward_zero, _remainder,
                                                                   np.fmod))
_DIVISIONS = ("floordiv", "truncdiv", "mod", "fmod")  # their kernels take the operator's name, for the error


def _pow(a, b):
    """numpy's power, except that an integer to a negative integer power is torch's (and C's) 1 / a rounded
    toward zero: 1 for a base of 1, +-1 for -1 by the exponent's parity, 0 otherwise (numpy raises)."""
    if np.result_type(a, b).kind not in "iu" or not np.any(np.less(b, 0)):
        return np.power(a, b)
    negative = np.less(b, 0)
    powers = np.power(a, np.where(negative, 0, b))
    reciprocal = np.where(np.equal(a, 1), 1, np.where(np.equal(a, -1), 1 - 2 * (np.asarray(b) & 1), 0))
    return np.where(negative, reciprocal.astype(powers.dtype), powers)


# ---------------------------------------------------------------- erf
# fdlibm's erf (Sun Microsystems, 1993; the algorithm most C libraries use for double), under 1 ulp in
# float64: a rational approximation per range of |x|. Each table lists P's and Q's coefficients from the
# constant term up.


def _rational_table(p: tuple, q: tuple) -> np.ndarray:
    """P's and Q's coefficients as the two columns of one table, highest power first (P padded with zeros)."""
    table = np.zeros((len(q), 2, 1))
    table[len(q) - len(p):, 0, 0] = p[::-1]
    table[:, 1, 0] = q[::-1]
    return table


_ERX = 8.45062911510467529297e-01  # erf(1) rounded to float precision
_ERF_NEAR_0 = _rational_table(
    (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
     -5.77027029648944159157e-03, -2.37630166566501626084e-05),
    (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
     1.32494738004321644526e-04, -3.96022827877536812320e-06))
_ERF_NEAR_1 = _rational_table(
    (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
     3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
     -2.16637559486879084300e-03),
    (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
     1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02))
_ERFC_UP_TO_2_86 = _rational_table(
    (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
     -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
     -8.12874355063065934246e+01, -9.81432934416914548592e+00),
    (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
     6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
     6.57024977031928170135e+00, -6.04244152148580987438e-02))
_ERFC_UP_TO_6 = _rational_table(
    (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
     -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
     -4.83519191608651397019e+02),
    (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
     3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
     -2.24409524465858183362e+01))


def _rational(table: np.ndarray, z: np.ndarray) -> np.ndarray:
    """P(z)/Q(z) by Horner's rule, the two polynomials side by side in one pass."""
    pq = np.zeros((2, z.shape[0]))
    for c in table:
        pq *= z
        pq += c
    return pq[0] / pq[1]


def _erf_near_0(x, ax):  # |x| < 0.84375: x + x * P(x²)/Q(x²)
    return x + x * _rational(_ERF_NEAR_0, x * x)


def _erf_near_1(x, ax):  # 0.84375 <= |x| < 1.25: erf(1) plus a rational function of |x| - 1
    return np.copysign(_ERX + _rational(_ERF_NEAR_1, ax - 1), x)


def _erf_tail(table: np.ndarray):
    """1 - erfc(|x|) with erfc(|x|) = exp(-x² - 0.5625 + R/S(1/x²)) / |x|; x² is split at z, |x| with its low
    32 bits cleared, so that z² is exact and exp's argument loses nothing."""
    def erf(x, ax):
        r = _rational(table, 1 / (ax * ax))
        z = (ax.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
        erfc = np.exp(-z * z - 0.5625) * np.exp((z - ax) * (z + ax) + r) / ax
        return np.copysign(1 - erfc, x)

    return erf


def _erf_saturated(x, ax):  # |x| >= 6: erf is ±1 to double precision
    return np.copysign(1.0, x)


_ERF_BOUNDS = (0.84375, 1.25, 1 / 0.35, 6.0)
_ERF_REGIONS = (_erf_near_0, _erf_near_1, _erf_tail(_ERFC_UP_TO_2_86), _erf_tail(_ERFC_UP_TO_6), _erf_saturated)


_ERF_VECTOR_MIN = 2048  # below this many elements, libm one by one is faster than five numpy passes


def _erf(x):
    """Each element through the approximation of its range of |x|. Positions, not boolean masks, move the
    elements: numpy gathers by a random mask several times slower than by an index array."""
    x = np.asarray(x)
    a = x.astype(np.float64).reshape(-1)
    if a.size < _ERF_VECTOR_MIN:  # the same algorithm in the C library (glibc, musl: fdlibm's)
        return np.fromiter(map(math.erf, a.tolist()), np.float64, a.size).reshape(x.shape).astype(x.dtype)
    ax = np.abs(a)
    region = sum((ax >= bound).view(np.int8) for bound in _ERF_BOUNDS)  # NaN: region 0, stays NaN
    out = np.empty_like(a)
    for k, approximation in enumerate(_ERF_REGIONS):
        positions = np.flatnonzero(region == k)
        if positions.size:
            part = a[positions]
            out[positions] = approximation(part, np.abs(part))
    return out.reshape(x.shape).astype(x.dtype)


def _erfinv(y):
    """Inverse error function: Giles' single-precision approximation refined by two Newton steps on erf."""
    y = np.asarray(y)
    y64 = y.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -np.log((1.0 - y64) * (1.0 + y64))
        small = w < 5.0
        ws = w - 2.5
        p_small = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p_small = c + p_small * ws
        wl = np.sqrt(np.maximum(w, 5.0)) - 3.0
        p_large = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            p_large = c + p_large * wl
        x = np.where(small, p_small, p_large) * y64
        for _ in range(2):
            err = _erf(x) - y64
            x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
        x = np.where(y64 == 1.0, np.inf, np.where(y64 == -1.0, -np.inf, x))
        x = np.where(np.abs(y64) > 1.0, np.nan, x)
    return x.astype(y.dtype)


def _lgamma_scalar(v: float) -> float:
    try:
        return math.lgamma(v)
    except ValueError:  # a pole (0, -1, -2, ...): torch gives +inf
        return math.inf
    except OverflowError:  # |v| near the float64 maximum: the C library's lgamma is +inf there
        return math.inf


def _elementwise(fn):
    """A libm function numpy lacks, applied element by element in float64 (the C library's own algorithm)."""
    def apply(x):
        x = np.asarray(x)
        flat = x.astype(np.float64).reshape(-1).tolist()
        return np.fromiter(map(fn, flat), np.float64, len(flat)).reshape(x.shape).astype(x.dtype)

    return apply


_lgamma = _elementwise(_lgamma_scalar)
_erfc = _elementwise(math.erfc)


try:  # numpy >= 2 keeps its floating-point error state in a context variable
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _IGNORE_ALL = _make_extobj(all="ignore")
except ImportError:
    _extobj_contextvar = None

# Kernels run inside a context of their own in which that variable says "ignore": entering it costs a tenth of
# setting and resetting the variable (or of np.errstate), which matters on the eager path where each op is a
# few microseconds. One per thread, because a context can be entered by one thread at a time.
_quiet = threading.local()


def _quiet_context() -> contextvars.Context:
    context = _quiet.context = contextvars.Context()
    context.run(_extobj_contextvar.set, _IGNORE_ALL)
    return context


def run_quietly(fn, values: list):
    """``fn(*values)`` with numpy's floating-point warnings off (torch's kernels never warn on inf or nan)."""
    if _extobj_contextvar is None:
        with np.errstate(all="ignore"):
            return fn(*values)
    try:
        context = _quiet.context
    except AttributeError:  # the thread's first kernel
        context = _quiet_context()
    # kernels do not call run_quietly: a context cannot be entered twice. Context.run called with *values costs
    # half a numpy call more than with its arguments spelled out, hence the common arities spelled out.
    n = len(values)
    if n == 2:
        return context.run(fn, values[0], values[1])
    if n == 1:
        return context.run(fn, values[0])
    return context.run(fn, *values)


NAMESPACE = {"np": np, "_sign": _sign, "_log10": _log10,
             "_rsqrt": _rsqrt, "_reciprocal": _reciprocal, "_pow": _pow, "_erf": _erf, "_erfinv": _erfinv,
             "_lgamma": _lgamma, "_erfc": _erfc, "_fma": _fma,
             "_floordiv": _floordiv, "_truncdiv": _truncdiv, "_mod": _mod, "_fmod": _fmod,
             **{f"_dtype_{d.name}": d.np for d in ALL_DTYPES}}


def single_ufunc(expr: Expr, n_inputs: int):
    """The numpy ufunc that is the whole kernel when ``expr`` is one unary or binary numpy operation on the inputs
    in order (``add(x0, x1)``, ``exp(x0)``), else None: calling it directly spares the eager path a Python frame
    around it. Kernels with scalar parameters, constants or helpers of this module are always rendered."""
    names = _UNARY if len(expr.srcs) == 1 else _BINARY if len(expr.srcs) == 2 else {}
    spelled = names.get(expr.op, "")
    if not spelled.startswith("np.") or len(expr.srcs) != n_inputs:
        return None
    if any(s.op != "input" or s.arg != k for k, s in enumerate(expr.srcs)):
        return None
    ufunc = getattr(np, spelled[3:])
    return ufunc if isinstance(ufunc, np.ufunc) else None


def render_numpy(expr: Expr, n_inputs: int, scalar_names: tuple[str, ...], name: str = "kernel",
                 op: str | None = None):
    """Return a Python function ``f(x0, ..., xN, *scalars)`` evaluating ``expr`` with numpy; ``op`` (default
    ``name``) is the operator its errors name."""
    lines, names = [], {}
    for k, node in enumerate(toposort(expr)):
        if node.op == "input":
            names[id(node)] = f"x{node.arg}"
            continue
        if node.op == "scalar":
            names[id(node)] = f"s_{node.arg}"
            continue
        if node.op == "const":
            names[id(node)] = repr(node.arg) if not (isinstance(node.arg, float) and not math.isfinite(node.arg)) \
                else f"float('{node.arg}')"
            continue
        srcs = [names[id(s)] for s in node.srcs]
        if node.op in _UNARY:
            code = f"{_UNARY[node.op]}({srcs[0]})"
        elif node.op in _DIVISIONS:
            code = f"{_BINARY[node.op]}({srcs[0]}, {srcs[1]}, {op or name!r})"
        elif node.op in _BINARY:
            code = f"{_BINARY[node.op]}({srcs[0]}, {srcs[1]})"
        elif node.op == "where":
            code = f"np.where({srcs[0]}, {srcs[1]}, {srcs[2]})"
        elif node.op == "fma":
            code = f"_fma({srcs[0]}, {srcs[1]}, {srcs[2]})"
        elif node.op == "cast":
            code = f"np.asarray({srcs[0]}).astype(_dtype_{node.arg.name})"  # bfloat16 has no numpy name
        else:
            raise NotImplementedError(f"numpy renderer: no rule for scalar op {node.op!r}")
        names[id(node)] = f"t{k}"
        lines.append(f"    t{k} = {code}")
    params = [f"x{k}" for k in range(n_inputs)] + [f"s_{s}" for s in scalar_names]
    src = f"def {name}({', '.join(params)}):\n" + "\n".join(lines) + f"\n    return {names[id(expr)]}\n"
    scope: dict = {}
    exec(compile(src, f"<numpy kernel {name}>", "exec"), NAMESPACE, scope)
    fn = scope[name]
    fn.__source__ = src
    return fn
