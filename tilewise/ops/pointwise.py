"""Pointwise operators: meaning as a scalar expression, derivative as a formula, dtype rule.

Each row is the whole definition of an operator; kernels (numpy, C, CUDA), methods, in-place forms and
autograd all derive from it. Activations whose meaning is a short expression of primitives (gelu, silu,
mish, ...) are pointwise operators too: their expression *is* their decomposition, and the compiler fuses
it like any other pointwise chain; their derivatives are written out for numerical stability.
"""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise.dtypes import FLOAT, c10_name, type_meta_name
from tilewise.ops import dtype_rules as R
from tilewise.ops.expr import Expr, fma, lift, where
from tilewise.ops.registry import declare


def pointwise(schema: str, expr, grad: dict | None = None, dtype=R.promote, **attrs):
    return declare(schema, "pointwise", expr=expr, grad=grad, dtype=dtype, **attrs)


def unary(name: str, expr, grad: str | None, dtype=R.promote_float, **attrs):
    return pointwise(f"{name}(Tensor self) -> Tensor", expr, {"self": grad} if grad else None, dtype, **attrs)


SQRT1_2 = math.sqrt(0.5)  # torch's kAlpha (M_SQRT1_2): its GELU multiplies by it, which also spares a division
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _in(k: int) -> Expr:
    return Expr("input", (), k)


def softplus_expr(x):
    return where(x.gt(20), x, x.exp().log1p())


def gelu_expr(x, approximate: str):
    if approximate == "tanh":
        return 0.5 * x * (1 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
    return 0.5 * x * (1 + (x * SQRT1_2).erf())


def gelu_backward_expr(g, x, approximate: str):
    if approximate == "tanh":
        inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = inner.tanh()
        d_inner = SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)
    cdf = 0.5 * (1 + (x * SQRT1_2).erf())
    pdf = INV_SQRT_2PI * (-0.5 * x * x).exp()
    return g * (cdf + x * pdf)


def clamp_expr(x, lo, hi, input_at_ties: bool = False):
    """[Note: ties of clamp] At ``x == bound`` (+0 against -0) torch's vectorised CPU loop returns one operand or
    the other: ``vec::clamp(a, min, max)`` of a number bound is ``min(max, max(min, a))`` and keeps the input,
    while a tensor bound goes through ``vec::maximum(a, min)``, which keeps the bound. (Its scalar loop, which runs
    the last elements short of a vector and every call whose two bounds are both one element, keeps the input.)
    ``maximum`` and ``minimum`` here return their second operand at a tie, as the vector instructions do."""
    out = x
    if lo is not None:
        out = lift(lo).maximum(out) if input_at_ties else out.maximum(lo)
    if hi is not None:
        out = lift(hi).minimum(out) if input_at_ties else out.minimum(hi)
    return out


def nan_to_num_expr(x, nan, posinf, neginf, dtype):
    from tilewise.dtypes import finfo

    if not dtype.is_floating_point:
        return x
    info = finfo(dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    return where(x.isnan(), nan if nan is not None else 0.0, where(x.isinf(), where(x.gt(0), hi, lo), x))



# Builders for operators whose expression depends on a string or optional argument: called with the
# bound arguments and the compute dtype, they return one Expr per distinct argument value.
def _gelu(args, dtype):
    return gelu_expr(_in(0), args[1])


def _gelu_backward(args, dtype):
    return gelu_backward_expr(_in(0), _in(1), args[2])


def _one_element(value) -> bool:
    return math.prod(getattr(value, "_shape", ())) == 1


def _clamp(args, dtype):
    """See [Note: ties of clamp]: numbers keep the input at a tie, and so do two bounds of one element each (torch's
    loop takes no vector path with two broadcast operands); a tensor bound otherwise wins it."""
    bounds = [b for b in args[1:3] if b is not None]
    keeps_input = all(isinstance(b, (int, float)) for b in bounds) or (
        len(bounds) == 2 and all(_one_element(b) for b in bounds))
    return clamp_expr(_in(0), None if args[1] is None else _in(1), None if args[2] is None else _in(2), keeps_input)


def _round(args, dtype):
    """``round(x, decimals=d)`` is torch's ``nearbyint(x * 10**d) / 10**d``, and ``nearbyint(x / 10**-d) * 10**-d``
    for a negative ``d`` (round_decimals_kernel)."""
    decimals = args[1]
    if decimals == 0:
        return _in(0).round()
    scale = float(10 ** abs(decimals))
    return (_in(0) * scale).round() / scale if decimals > 0 else (_in(0) / scale).round() * scale


def _round_decimals_need_floats(op, args) -> None:
    dtype = getattr(args[0], "dtype", None)
    if args[1] != 0 and dtype is not None and not dtype.is_floating_point:
        raise NotImplementedError(f"\"round\" with decimals={args[1]} not implemented for '{c10_name(dtype)}': it "
                                  "needs a floating-point tensor, e.g. .float()")


def _gelu_approximation_known(op, args) -> None:
    approximate = args[-1]
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or tanh. ({op.name} got approximate="
                           f"{approximate!r})")


def _on_cuda(args) -> bool:
    return any(getattr(getattr(a, "device", None), "type", None) == "cuda" for a in args)


def _div(args, dtype):
    mode = args[2]
    if mode not in (None, "trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{mode}'")
    a, b = _in(0), _in(1)
    if mode == "floor":
        return a.floordiv(b)
    # torch's CUDA kernels multiply by the reciprocal of a CPU scalar (div_true_kernel_cuda): written so here, the
    # halves still differed from torch on an H200 while the compiled decompositions that divide by a count (a mean,
    # a variance) changed their rounding (std of a constant came out nonzero): division stays a division
    quotient = a / b
    if mode is None:
        return quotient
    return quotient.trunc() if dtype.is_floating_point else a.truncdiv(b)


def _rdiv(args, dtype):
    """``number / tensor`` is ``tensor.reciprocal() * number`` in torch (``Tensor.__rtruediv__``): the reciprocal
    is rounded to the tensor's dtype, then multiplied (for a half, by the number at float32)."""
    reciprocal = 1 / _in(0)
    own = getattr(args[0], "dtype", dtype)
    if own.is_floating_point and own is not dtype and not own.is_complex:
        reciprocal = reciprocal.cast(own).cast(dtype)
    return reciprocal * _in(1)


# [Note: pow by a number] torch's CPU kernel of ``tensor ** number`` (pow_tensor_scalar) special-cases some
# exponents for float32, float64 and bfloat16 (not float16): sqrt, rsqrt and reciprocal for 0.5, -0.5 and -1, and
# products for 2, 3 and -2 (``base * base * base``). bfloat16's products round each step to bfloat16 (its rsqrt
# does too in the scalar tail, but not in the vector body, matched here). Other exponents go to the vector
# library's pow (Sleef), not matched bit for bit.
_POW_BY_NUMBER = {
    2: lambda x, r: x * x, 3: lambda x, r: r(x * x) * x, -2: lambda x, r: 1 / r(x * x),
    0.5: lambda x, r: x.sqrt(), -0.5: lambda x, r: 1 / x.sqrt(), -1: lambda x, r: 1 / x,
}


# torch's CUDA kernel (pow_tensor_scalar_kernel) takes them for every floating dtype, float16 too: sqrt, rsqrt and
# reciprocal when the number is 0.5, -0.5 or -1, the products when the number cast to the base's dtype is 2, 3 or -2
# (each product rounded to a half base's dtype: c10's Half and BFloat16 multiply to their own type).
_POW_PRODUCTS = (2, 3, -2)


def _pow_special_exponent(args):
    """The exponent of ``_POW_BY_NUMBER`` that this call takes, or None."""
    exponent, base_dtype = args[1], getattr(args[0], "dtype", None)
    if type(exponent) not in (int, float):
        return None
    if _on_cuda(args) and base_dtype in (R.dtypes.float16, R.dtypes.bfloat16):
        if exponent in _POW_BY_NUMBER and exponent not in _POW_PRODUCTS:
            return exponent
        exponent = R.round_to_half(exponent, base_dtype)
        return int(exponent) if exponent in _POW_PRODUCTS else None
    if base_dtype not in (R.dtypes.float32, R.dtypes.float64, R.dtypes.bfloat16):
        return None
    return exponent if exponent in _POW_BY_NUMBER else None


def _pow(args, dtype):
    base, exponent = _in(0), _in(1)
    special = _pow_special_exponent(args)
    if special is None:
        return base ** exponent
    own = args[0].dtype
    return _POW_BY_NUMBER[special](base, lambda e: e.cast(own).cast(dtype) if own is not dtype else e)


def _positive_side(x: Expr, args) -> Expr:
    """Which inputs elu and celu take to their identity side: at a zero, torch's CPU loop takes ``x >= 0`` there,
    its CUDA kernel ``x > 0`` (it sends ``x <= 0`` to ``alpha * expm1(x)``, which gives a zero the sign of the
    product): the zero's sign differs between them."""
    return x.gt(0) if _on_cuda(args) else x.ge(0)


def _elu(args, dtype):
    x, (alpha, scale, input_scale) = _in(0), args[1:4]
    return where(_positive_side(x, args), x * scale, (x * input_scale).expm1() * (lift(alpha) * scale))


def _celu(args, dtype):
    x, alpha = _in(0), args[1]
    return where(_positive_side(x, args), x, (x / alpha).expm1() * alpha)


def _div_dtype(op, args):
    """True division makes integers float; rounding division keeps the promoted type (torch's rule)."""
    return R.promote_float(op, args) if args[2] is None else R.numeric(op, args)


def _nan_to_num(args, dtype):
    # the default replacements are the extremes of the input's dtype, not of the (wider) dtype it is computed in
    return nan_to_num_expr(_in(0), args[1], args[2], args[3], args[0].dtype if dtype.is_floating_point else dtype)


# ---------------------------------------------------------------- arithmetic
# [Note: fused multiply-adds of torch's kernels] torch's CPU kernels compute add and sub with an alpha, lerp and
# addcmul with one fused multiply-add (see [Note: fused multiply-add] in backends/cpu/fma.py); its CUDA kernels
# are built with nvcc's default --fmad=true (as NVRTC compiles tilewise's), which contracts ``a + alpha * b``, lerp's
# two products; addcmul and addcdiv have explicit fused multiply-adds there (``pointwise_op_impl``: addcmul
# ``fma(t1, t2, self)`` for a value of 1, else ``fma(value, t1 * t2, self)``; addcdiv ``fma(value, t1 / t2, self)``),
# in another order than on the CPU (``expr_on``), where addcdiv divides and adds. A fused multiply-add of
# integers or bools multiplies and adds.
def _addcmul_cuda(a, t1, t2, value):
    """torch's CUDA addcmul (``pointwise_op_impl``): ``fma(t1, t2, self)`` for a value of 1, else
    ``fma(value, t1 * t2, self)``."""
    if isinstance(value, (int, float)):
        return fma(t1, t2, a) if value == 1 else fma(value, t1 * t2, a)
    return where(value.eq(1), fma(t1, t2, a), fma(value, t1 * t2, a))


pointwise("fma(Tensor self, Tensor other, Tensor addend) -> Tensor", lambda a, b, c: fma(a, b, c),
          {"self": "grad * conj_if_complex(other)", "other": "grad * conj_if_complex(self)", "addend": "grad"},
          public=False, method=False, inplace=False)
pointwise("add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
          lambda a, b, alpha: fma(b, alpha, a), {"self": "grad", "other": "grad * alpha"}, dunder=("add", "radd"),
          half_rounded=R.ADD_HALF_ROUNDED)
pointwise("sub(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
          lambda a, b, alpha: fma(-b, alpha, a), {"self": "grad", "other": "-grad * alpha"}, R.subtraction,
          dunder=("sub",), aliases=("subtract",), half_rounded=R.ADD_HALF_ROUNDED)
pointwise("rsub(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
          lambda a, b, alpha: fma(-a, alpha, b), {"self": "-grad * alpha", "other": "grad"}, R.subtraction,
          method=False, dunder=("rsub",), inplace=False, half_rounded=R.ADD_HALF_ROUNDED, out=False)
pointwise("mul(Tensor self, Tensor other) -> Tensor",
          lambda a, b: a * b,
          {"self": "grad * conj_if_complex(other)", "other": "grad * conj_if_complex(self)"}, dunder=("mul", "rmul"),
          aliases=("multiply",), half_rounded=R.OTHER_AT_OPMATH)
pointwise("div(Tensor self, Tensor other, *, str? rounding_mode=None) -> Tensor", None,
          {"self": "grad / conj_if_complex(other) if rounding_mode is None else zeros_like(grad)",
           "other": "-grad * conj_if_complex(self / (other * other)) if rounding_mode is None else zeros_like(grad)"},
          _div_dtype, dunder=("truediv",), aliases=("divide", "true_divide"), expr_builder=_div,
          half_rounded=R.OTHER_AT_OPMATH)
pointwise("rdiv(Tensor self, Tensor other) -> Tensor", None,
          {"self": "-grad * conj_if_complex(other / (self * self))", "other": "grad / conj_if_complex(self)"},
          R.promote_float, method=False, dunder=("rtruediv",), inplace=False, autocast={"cuda": "fp32"},
          expr_builder=_rdiv, half_rounded={"cpu": ("self",)})
pointwise("floor_divide(Tensor self, Tensor other) -> Tensor", lambda a, b: a.floordiv(b), None, R.numeric,
          dunder=("floordiv", "rfloordiv"), differentiable=False, half_rounded=R.OTHER_AT_OPMATH)
pointwise("remainder(Tensor self, Tensor other) -> Tensor", lambda a, b: a.mod(b),
          {"self": "grad", "other": "-grad * floor_divide(self, other)"}, R.numeric, dunder=("mod", "rmod"),
          half_rounded=R.BOTH_ROUNDED)
pointwise("fmod(Tensor self, Tensor other) -> Tensor", lambda a, b: a.fmod(b),
          {"self": "grad", "other": "-grad * trunc(self / other)"}, R.numeric, half_rounded=R.BOTH_ROUNDED)
pointwise("pow(Tensor self, Tensor exponent) -> Tensor", None,
          {"self": "grad * conj_if_complex(exponent * where(exponent == 0, ones_like(self), self ** (exponent - 1)))",
           "exponent": "pow_backward_exponent(grad, self, exponent, result)"},
          R.power, dunder=("pow",), autocast={"cuda": "fp32"}, check=R.power_check, expr_builder=_pow,
          expr_variant=_pow_special_exponent, half_rounded={"cuda": ("exponent",)})
pointwise("rpow(Tensor self, Tensor other) -> Tensor", lambda a, b: b ** a,
          {"self": "grad * conj_if_complex(result * log(other))",
           "other": "grad * conj_if_complex(self * other ** (self - 1))"}, R.numeric,
          method=False, inplace=False, dunder=("rpow",), autocast={"cuda": "fp32"}, half_rounded=R.BOTH_ROUNDED)
pointwise("neg(Tensor self) -> Tensor", lambda x: -x, {"self": "-grad"}, R.negation, dunder=("neg",),
          aliases=("negative",))
pointwise("abs(Tensor self) -> Tensor", lambda x: x.abs(), {"self": "grad * sgn(self)"}, R.magnitude, dunder=("abs",),
          aliases=("absolute",))
pointwise("sign(Tensor self) -> Tensor", lambda x: x.sign(), {"self": "zeros_like(grad)"})
pointwise("sgn(Tensor self) -> Tensor", lambda x: x.sign(), {"self": "sgn_backward(grad, self, result)"},
          fwd="sgn_backward(self_t, self, result)")  # not holomorphic: torch's tangent is its gradient's formula
def _lerp_check(op, args) -> None:
    """torch's lerp takes ``end`` of ``self``'s dtype, and a ``weight`` tensor of it unless 0-dim; and floating or
    complex inputs only."""
    self, end, weight = args[0], args[1], args[2]
    if getattr(end, "dtype", self.dtype) is not self.dtype:
        raise RuntimeError(f"expected dtype {type_meta_name(self.dtype)} for `end` but got dtype "
                           f"{type_meta_name(end.dtype)}")
    if getattr(weight, "ndim", 0) > 0 and weight.dtype is not self.dtype:
        raise RuntimeError(f"expected dtype {type_meta_name(self.dtype)} for `weight` but got dtype "
                           f"{type_meta_name(weight.dtype)}")
    if self.dtype.category < FLOAT:
        kernel = "lerp_kernel_tensor" if hasattr(weight, "dtype") else "lerp_kernel_scalar"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{c10_name(self.dtype)}\'')


pointwise("lerp(Tensor self, Tensor end, Tensor weight) -> Tensor",
          lambda a, b, w: where(w.abs().lt(0.5), fma(w, b - a, a), fma(w - 1, b - a, b)),
          {"self": "grad * conj_if_complex(1 - weight)", "end": "grad * conj_if_complex(weight)",
           "weight": "grad * conj_if_complex(end - self)"},
          half_rounded={"cpu": ("self", "end")}, check=_lerp_check,
          # ``end - (end - self) * (1 - weight)`` contracted: the same value but for the sign of a zero
          expr_on={"cuda": lambda a, b, w: where(w.abs().lt(0.5), fma(w, b - a, a), fma(-(b - a), 1 - w, b))})
pointwise("addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
          lambda a, t1, t2, value: fma(value * t1, t2, a),
          {"self": "grad", "tensor1": "grad * conj_if_complex(value * tensor2)",
           "tensor2": "grad * conj_if_complex(value * tensor1)"},
          autocast={"cuda": "promote"}, expr_on={"cuda": _addcmul_cuda})
def _addcdiv_check(op, args) -> None:
    """torch refuses integer (and bool) ``tensor1`` and ``tensor2`` together: they once divided as integers."""
    if all(getattr(t, "dtype", None) is not None and t.dtype.category < FLOAT for t in args[1:3]):
        raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future  release addcdiv "
                           "will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be "
                           "implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for "
                           "integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future "
                           "addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), "
                           "for all dtypes.")


pointwise("addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
          lambda a, t1, t2, value: a + value * t1 / t2,
          {"self": "grad", "tensor1": "grad * conj_if_complex(value / tensor2)",
           "tensor2": "-grad * conj_if_complex(value * tensor1 / (tensor2 * tensor2))"}, R.promote_float,
          autocast={"cuda": "promote"}, check=_addcdiv_check,
          expr_on={"cuda": lambda a, t1, t2, value: fma(value, t1 / t2, a)})
pointwise("atan2(Tensor self, Tensor other) -> Tensor", lambda a, b: a.atan2(b),
          {"self": "grad * other / (self * self + other * other)",
           "other": "-grad * self / (self * self + other * other)"}, R.promote_float, aliases=("arctan2",),
          autocast={"cuda": "promote"})
pointwise("maximum(Tensor self, Tensor other) -> Tensor", lambda a, b: a.maximum(b),
          {"self": "extremum_pair_backward(grad, self, other, self < other)",
           "other": "extremum_pair_backward(grad, self, other, other < self)"},
          fwd="extremum_pair_jvp(self_t, other_t, self, other, result)")
pointwise("minimum(Tensor self, Tensor other) -> Tensor", lambda a, b: a.minimum(b),
          {"self": "extremum_pair_backward(grad, self, other, self > other)",
           "other": "extremum_pair_backward(grad, self, other, other > self)"},
          fwd="extremum_pair_jvp(self_t, other_t, self, other, result)")
pointwise("clamp(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", None,
          {"self": "clamp_backward(grad, self, min, max)", "min": "clamp_min_backward(grad, self, min, max)",
           "max": "clamp_max_backward(grad, self, min, max)"},
          R.clamp_rule, aliases=("clip",), expr_builder=_clamp, half_rounded={"cuda": ()})
pointwise("copysign(Tensor self, Tensor other) -> Tensor", lambda a, b: a.copysign(b),
          {"self": "grad * where(self == 0, zeros_like(result), result / self)", "other": "zeros_like(grad)"},
          R.promote_float)

# ---------------------------------------------------------------- exponentials, logs, powers
unary("exp", lambda x: x.exp(), "grad * conj_if_complex(result)", autocast={"cuda": "fp32"})
unary("exp2", lambda x: x.exp2(), f"grad * conj_if_complex(result) * {math.log(2.0)}")
unary("expm1", lambda x: x.expm1(), "grad * conj_if_complex(result + 1)", autocast={"cuda": "fp32"})
unary("log", lambda x: x.log(), "grad / conj_if_complex(self)", autocast={"cuda": "fp32"})
unary("log2", lambda x: x.log2(), f"grad / (conj_if_complex(self) * {math.log(2.0)})", autocast={"cuda": "fp32"})
unary("log10", lambda x: x.log10(), f"grad / (conj_if_complex(self) * {math.log(10.0)})", autocast={"cuda": "fp32"})
unary("log1p", lambda x: x.log1p(), "grad / conj_if_complex(self + 1)", autocast={"cuda": "fp32"})
unary("sqrt", lambda x: x.sqrt(), "grad / (2 * conj_if_complex(result))")
unary("rsqrt", lambda x: x.rsqrt(), "-0.5 * grad * conj_if_complex(result * result * result)",
      autocast={"cuda": "fp32"})
unary("reciprocal", lambda x: x.reciprocal(), "-grad * conj_if_complex(result * result)", autocast={"cuda": "fp32"})
unary("square", lambda x: x * x, "2 * grad * conj_if_complex(self)", dtype=R.squared)

# ---------------------------------------------------------------- trigonometric and hyperbolic
unary("sin", lambda x: x.sin(), "grad * conj_if_complex(cos(self))")
unary("cos", lambda x: x.cos(), "-grad * conj_if_complex(sin(self))")
unary("tan", lambda x: x.tan(), "grad * conj_if_complex(1 + result * result)", autocast={"cuda": "fp32"})
unary("asin", lambda x: x.asin(), "grad * conj_if_complex(rsqrt(1 - self * self))", aliases=("arcsin",),
      autocast={"cuda": "fp32"})
unary("acos", lambda x: x.acos(), "-grad * conj_if_complex(rsqrt(1 - self * self))", aliases=("arccos",),
      autocast={"cuda": "fp32"})
unary("atan", lambda x: x.atan(), "grad / conj_if_complex(1 + self * self)", aliases=("arctan",))
unary("sinh", lambda x: x.sinh(), "grad * conj_if_complex(cosh(self))", autocast={"cuda": "fp32"})
unary("cosh", lambda x: x.cosh(), "grad * conj_if_complex(sinh(self))", autocast={"cuda": "fp32"})
unary("tanh", lambda x: x.tanh(), "grad * conj_if_complex(1 - result * result)")
unary("sigmoid", lambda x: 1 / (1 + (-x).exp()), "grad * conj_if_complex(result * (1 - result))")
unary("erf", lambda x: x.erf(), f"grad * {2 / math.sqrt(math.pi)} * exp(-self * self)")
unary("erfinv", lambda x: x.erfinv(), f"grad * {math.sqrt(math.pi) / 2} * exp(erfinv(self) ** 2)",
      autocast={"cuda": "fp32"})

# ---------------------------------------------------------------- rounding (zero gradient, like torch)
for _name in ("floor", "ceil", "trunc"):
    unary(_name, lambda x, _n=_name: getattr(x, _n)(), "zeros_like(grad)", dtype=R.promote)
pointwise("round(Tensor self, *, int decimals=0) -> Tensor", None, {"self": "zeros_like(grad)"}, R.promote,
          expr_builder=_round, check=_round_decimals_need_floats)
unary("fix", lambda x: x.trunc(), "zeros_like(grad)", dtype=R.promote)
unary("frac", lambda x: x - x.trunc(), "grad", dtype=R.floating_kernel)  # torch's frac_cpu: floats only

# ---------------------------------------------------------------- comparisons and logic
for _name, _dunder in (("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")):
    pointwise(f"{_name}(Tensor self, Tensor other) -> Tensor", lambda a, b, _n=_name: getattr(a, _n)(b), None,
              R.compare, dunder=(_dunder,), differentiable=False, half_rounded=R.BOTH_ROUNDED)
for _name in ("logical_and", "logical_or", "logical_xor"):
    pointwise(f"{_name}(Tensor self, Tensor other) -> Tensor", lambda a, b, _n=_name: getattr(a, _n)(b), None,
              R.logical, differentiable=False)
pointwise("logical_not(Tensor self) -> Tensor", lambda x: x.logical_not(), None, R.logical, differentiable=False)
for _name, _dunder in (("bitwise_and", ("and", "rand")), ("bitwise_or", ("or", "ror")),
                       ("bitwise_xor", ("xor", "rxor"))):
    pointwise(f"{_name}(Tensor self, Tensor other) -> Tensor", lambda a, b, _n=_name: getattr(a, _n)(b), None,
              R.integral, dunder=_dunder, differentiable=False)
pointwise("bitwise_not(Tensor self) -> Tensor", lambda x: x.bitwise_not(), None, R.integral, dunder=("invert",),
          differentiable=False)
pointwise("bitwise_left_shift(Tensor self, Tensor other) -> Tensor", lambda a, b: a.lshift(b), None, R.integral,
          dunder=("lshift", "rlshift"), differentiable=False)
pointwise("bitwise_right_shift(Tensor self, Tensor other) -> Tensor", lambda a, b: a.rshift(b), None, R.integral,
          dunder=("rshift", "rrshift"), differentiable=False)
pointwise("isnan(Tensor self) -> Tensor", lambda x: x.isnan(), None, R.logical_from_input, differentiable=False,
          out=False)
pointwise("isinf(Tensor self) -> Tensor", lambda x: x.isinf(), None, R.logical_from_input, differentiable=False,
          out=False)
pointwise("isfinite(Tensor self) -> Tensor", lambda x: (x.isnan().logical_or(x.isinf())).logical_not(), None,
          R.logical_from_input, differentiable=False, out=False)
pointwise("isposinf(Tensor self) -> Tensor", lambda x: x.isinf().logical_and(x.gt(0)), None, R.logical_from_input,
          differentiable=False)
pointwise("isneginf(Tensor self) -> Tensor", lambda x: x.isinf().logical_and(x.lt(0)), None, R.logical_from_input,
          differentiable=False)
pointwise("signbit(Tensor self) -> Tensor", lambda x: x.signbit(), None, R.logical_from_input, differentiable=False)
pointwise("where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", lambda c, a, b: where(c, a, b),
          {"self": "where(condition, grad, zeros_like(grad))", "other": "where(condition, zeros_like(grad), grad)",
           "condition": None},
          R.where_rule, method=False)
pointwise("nan_to_num(Tensor self, float? nan=0.0, float? posinf=None, float? neginf=None) -> Tensor",
          None, {"self": "grad * isfinite(self)"}, expr_builder=_nan_to_num)

# ---------------------------------------------------------------- activations
# relu is clamp_min(self, 0), relu6 hardtanh(self, 0, 6): number bounds, which keep the input at a tie (-0 stays -0)
# [Note: masked gradients select] The gradients of relu, hardtanh, threshold, clamp and their kin pass ``grad`` where
# the input lies inside and give 0 elsewhere: selected, as torch's kernels select, never ``grad * mask``, which turns
# an infinite or NaN gradient outside into NaN. Comparisons with a NaN input are false, so a NaN passes the gradient
# where the test that would stop it is ``<=`` (relu, hardtanh) and stops it where the test that would pass it is
# (clamp, hardsigmoid). The two backward operators below are one kernel each, as torch's.
pointwise("threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
          lambda g, x, t: where(x.le(t), 0, g),
          {"grad_output": "threshold_backward(grad, self, threshold)", "self": "zeros_like(grad)"}, method=False)
pointwise("hardtanh_backward(Tensor grad_output, Tensor self, Scalar min_val, Scalar max_val) -> Tensor",
          lambda g, x, lo, hi: where(x.le(lo).logical_or(x.ge(hi)), 0, g),
          {"grad_output": "hardtanh_backward(grad, self, min_val, max_val)", "self": "zeros_like(grad)"},
          method=False)
pointwise("relu(Tensor self) -> Tensor", lambda x: clamp_expr(x, 0, None, True),
          {"self": "threshold_backward(grad, result, 0)"}, out=False)
def _hardtanh_check(op, args) -> None:
    """torch's hardtanh (and relu6, which is hardtanh(0, 6)) refuses bool and complex inputs, and an unsigned
    input's negative bounds (as integers: ``hardtanh(uint8, -0.5, 1)`` is taken)."""
    dtype = args[0].dtype
    if dtype is dtypes.bool_:
        raise RuntimeError("Bool inputs not supported for hardtanh")
    if dtype.is_complex:
        raise NotImplementedError("clamp is not supported for complex types")
    if dtype is dtypes.uint8 and any(int(bound) < 0 for bound in args[1:3] if math.isfinite(bound)):
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")


pointwise("relu6(Tensor self) -> Tensor", lambda x: clamp_expr(x, 0, 6, True),
          {"self": "hardtanh_backward(grad, self, 0, 6)"}, method=False, check=_hardtanh_check)
pointwise("leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor",
          lambda x, s: where(x.gt(0), x, x * s), {"self": "where(self > 0, grad, grad * negative_slope)"},
          R.floating_kernel, method=False)
# threshold replaces where ``self <= threshold``, as torch's kernel tests: a NaN input (or threshold) stays the input
pointwise("threshold(Tensor self, Scalar threshold, Scalar value) -> Tensor",
          lambda x, t, v: where(x.le(t), v, x), {"self": "threshold_backward(grad, self, threshold)"}, method=False,
          half_rounded={"cpu": ("self", "value"), "cuda": ("self", "threshold", "value")}, check=R.half_scalars_fit)
pointwise("hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor",
          lambda x, lo, hi: clamp_expr(x, lo, hi, True), {"self": "hardtanh_backward(grad, self, min_val, max_val)"},
          method=False, half_rounded={"cpu": ("self", "min_val", "max_val")}, check=_hardtanh_check)
pointwise("gelu(Tensor self, *, str approximate='none') -> Tensor", None,
          {"self": "gelu_backward(grad, self, approximate)"}, R.floating_only, expr_builder=_gelu, method=False,
          check=_gelu_approximation_known)
pointwise("silu(Tensor self) -> Tensor", lambda x: x / (1 + (-x).exp()),
          {"self": "grad * sigmoid(self) * (1 + self * (1 - sigmoid(self)))"}, R.floating_only, method=False)
pointwise("mish(Tensor self) -> Tensor", lambda x: x * softplus_expr(x).tanh(),
          {"self": "grad * (tanh(softplus(self)) + self * sigmoid(self) * (1 - tanh(softplus(self)) ** 2))"},
          R.floating_only, method=False)
pointwise("softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor",
          lambda x, beta, threshold: where((x * beta).gt(threshold), x, ((x * beta).exp().log1p()) / beta),
          {"self": "where(self * beta > threshold, grad, grad * sigmoid(self * beta))"}, R.floating_only,
          method=False, autocast={"cuda": "fp32"})
pointwise("hardswish(Tensor self) -> Tensor", lambda x: x * (x + 3).maximum(0).minimum(6) / 6,
          {"self": "hardswish_backward(grad, self)"}, R.floating_only, method=False)
pointwise("hardswish_backward(Tensor grad_output, Tensor self) -> Tensor",
          lambda g, x: where(x.le(-3), 0, where(x.lt(3), g * (x / 3 + 0.5), g)),
          {"grad_output": "hardswish_backward(grad, self)",
           "self": "where((self > -3) & (self < 3), grad * grad_output / 3, zeros_like(grad))"},
          R.floating_only, method=False)
pointwise("hardsigmoid(Tensor self) -> Tensor", lambda x: (x + 3).maximum(0).minimum(6) / 6,
          {"self": "where((self > -3) & (self < 3), grad / 6, zeros_like(grad))"}, R.floating_only, method=False)
pointwise("elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor", None,
          {"self": "where(self > 0, grad * scale, grad * input_scale * alpha * scale * exp(self * input_scale))"},
          R.floating_only, method=False, expr_builder=_elu)
pointwise("selu(Tensor self) -> Tensor",
          lambda x: where(x.gt(0), x * 1.0507009873554804934193349852946,
                          x.expm1() * (1.6732632423543772848170429916717 * 1.0507009873554804934193349852946)),
          {"self": "where(self > 0, grad * 1.0507009873554804934193349852946, "
                   "grad * 1.7580993408473768599402175208123 * exp(self))"}, R.floating_only, method=False, out=False)
pointwise("celu(Tensor self, Scalar alpha=1.0) -> Tensor", None,
          {"self": "where(self > 0, grad, grad * exp(self / alpha))"}, R.floating_only, method=False,
          expr_builder=_celu, out=False)
pointwise("softsign(Tensor self) -> Tensor", lambda x: x / (1 + x.abs()),
          {"self": "grad / ((1 + abs(self)) * (1 + abs(self)))"}, R.softsign_rule, method=False)
# row_major: torch's kernel (log_sigmoid_forward) writes a row-major result, not one in TensorIterator's order
pointwise("logsigmoid(Tensor self) -> Tensor", lambda x: x.minimum(0) - (-x.abs()).exp().log1p(),
          {"self": "grad * sigmoid(-self)"}, R.floating_only, method=False, row_major=True)
pointwise("gelu_backward(Tensor grad_output, Tensor self, str approximate='none') -> Tensor", None,
          {"grad_output": "gelu_backward(grad, self, approximate)",
           "self": "grad * grad_output * gelu_second_derivative(self, approximate)"},
          R.floating_only, expr_builder=_gelu_backward, method=False, check=_gelu_approximation_known)


