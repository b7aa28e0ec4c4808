"""Result-dtype rules shared by operator declarations.

A rule maps the operator and its bound arguments to ``(out_dtype, compute_dtype)``: the dtype of the
result and the dtype its arithmetic runs in (half types compute in float32, like torch's opmath).
"""

from __future__ import annotations

import warnings

import numpy as np

from tilewise import dtypes
from tilewise._warnings import levels_to_the_caller
from tilewise.dtypes import COMPLEX, DType, compute_dtype, result_type, to_float

# Operators that accept complex operands, as torch's kernels do (see [Note: complex tensors] in ops/complex.py);
# the rules below refuse complex operands for every other operator.
COMPLEX_OPERATORS = frozenset({
    "add", "sub", "rsub", "mul", "div", "rdiv", "neg", "abs", "sgn", "exp", "log", "sqrt", "rsqrt", "reciprocal",
    "square", "sin", "cos", "tan", "sinh", "cosh", "tanh", "sigmoid", "pow", "rpow", "eq", "ne", "isnan", "isinf",
    "isfinite", "where", "sum", "prod", "mean", "addcmul", "addcdiv", "lerp", "expm1", "log1p", "log2", "log10",
    "asin", "acos", "atan", "exp2", "cumsum", "cumprod", "sinc",
})


def check_complex_supported(op, dtype: DType) -> None:
    """torch's refusal of complex operands for an operator without a complex kernel."""
    if op.name not in COMPLEX_OPERATORS:
        raise NotImplementedError(f"{op.name}: not implemented for complex tensors (got {dtype.name}), as in torch; "
                                  "apply it to .real, .imag or .abs() instead")


def _operands(op, args) -> list:
    return [args[k] for k in op.tensor_idx if args[k] is not None]


def promote(op, args) -> tuple[DType, DType]:
    out = result_type(*_operands(op, args))
    if out.category == COMPLEX:
        check_complex_supported(op, out)
    return out, compute_dtype(out)


def magnitude(op, args) -> tuple[DType, DType]:
    """abs: a complex input gives its real dtype, computed from the complex values; torch has no bool kernel."""
    out, compute = promote(op, args)
    if out is dtypes.bool_:
        kernel = f"abs_{'cuda' if device_type_of(op, args) == 'cuda' else 'cpu'}"
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\' (abs of a bool tensor: convert it to an '
                                  "integer dtype first, e.g. .long(), or use it as it is: it is its own magnitude)")
    return out.to_real(), compute


def _is_bool(value) -> bool:
    return value.dtype is dtypes.bool_ if hasattr(value, "dtype") else type(value) is bool


def _described(op, args) -> str:
    return " and ".join(a.dtype.name if hasattr(a, "dtype") else type(a).__name__ for a in _operands(op, args))


def subtraction(op, args) -> tuple[DType, DType]:
    """sub/rsub refuse bool operands, like torch: on masks ``-`` is a mistake for ``^`` or ``~``."""
    flags = [_is_bool(a) for a in _operands(op, args)]
    if all(flags):
        raise RuntimeError(f"{op.name}: Subtraction, the `-` operator, with two bool tensors is not supported "
                           f"(got {_described(op, args)}). Use the `^` or `logical_xor()` operator instead.")
    if any(flags):
        raise RuntimeError(f"{op.name}: Subtraction, the `-` operator, with a bool tensor is not supported (got "
                           f"{_described(op, args)}). If you are trying to invert a mask, use the `~` or "
                           "`logical_not()` operator instead; otherwise convert the mask with .long() or .float().")
    return promote(op, args)


def negation(op, args) -> tuple[DType, DType]:
    if _is_bool(args[0]):
        raise RuntimeError(f"{op.name}: Negation, the `-` operator, on a bool tensor is not supported. If you are "
                           "trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return promote(op, args)


def squared(op, args) -> tuple[DType, DType]:
    """square is ``pow(self, 2)``: a bool promotes with the integer exponent to int64."""
    if _is_bool(args[0]):
        return dtypes.int64, dtypes.int64
    return promote(op, args)


def numeric(op, args) -> tuple[DType, DType]:
    """floor_divide, remainder, fmod, rounding div: torch has no bool kernel for them."""
    out = result_type(*_operands(op, args))
    if out.category == COMPLEX:
        check_complex_supported(op, out)
    if out is dtypes.bool_:
        raise NotImplementedError(f"{op.name}: not implemented for bool tensors (got {_described(op, args)}); "
                                  "convert the operands to an integer or floating dtype first, e.g. .long()")
    return out, compute_dtype(out)


def power(op, args) -> tuple[DType, DType]:
    """pow: like ``numeric``, except that torch accepts a bool base with a Python-scalar exponent."""
    return numeric(op, args) if hasattr(args[1], "dtype") else promote(op, args)


def no_negative_integer_power(op, args) -> None:
    """pow's check: an integer or bool tensor to a negative Python-int power is refused, as torch does (a tensor
    of negative exponents gives 1 / base rounded toward zero instead)."""
    base, exponent = args[0], args[1]
    if type(exponent) is int and exponent < 0 and getattr(base, "dtype", dtypes.float32).category < dtypes.FLOAT:
        raise RuntimeError(f"Integers to negative integer powers are not allowed. ({op.name}: a {base.dtype.name} "
                           f"tensor to the power {exponent}; make the base floating, e.g. .double(), for fractions)")


def power_check(op, args) -> None:
    """pow's checks: ``no_negative_integer_power``, and a Python-number exponent of a float16 or bfloat16 base must fit
    the half (torch's kernel casts it there: ``value cannot be converted to type c10::Half without overflow``)."""
    no_negative_integer_power(op, args)
    base_dtype = getattr(args[0], "dtype", None)
    if base_dtype in _HALVES and type(args[1]) in (int, float):
        dtypes.checked_scalar(args[1], base_dtype, op.name)


def promote_float(op, args) -> tuple[DType, DType]:
    """Integer inputs give the default float dtype (exp, sqrt, true division, ...)."""
    out = to_float(result_type(*_operands(op, args)))
    if out.category == COMPLEX:
        check_complex_supported(op, out)
    return out, compute_dtype(out)


def compare(op, args) -> tuple[DType, DType]:
    compute = result_type(*_operands(op, args))
    if compute.category == COMPLEX:
        check_complex_supported(op, compute)
    return dtypes.bool_, compute_dtype(compute)


def logical(op, args) -> tuple[DType, DType]:
    return dtypes.bool_, dtypes.bool_


_KERNEL_NAMES = {"bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift"}


def integral(op, args) -> tuple[DType, DType]:
    """Bitwise operators: integers and bools; torch refuses the other dtypes of the promoted operands (a float
    number beside an integer tensor included) with NotImplementedError, naming its kernel."""
    out = result_type(*_operands(op, args))
    if out.category >= dtypes.FLOAT:
        described = ", ".join(getattr(a, "dtype", type(a).__name__).__str__() for a in _operands(op, args))
        raise NotImplementedError(f"\"{_KERNEL_NAMES.get(op.name, op.name)}_cpu\" not implemented for "
                                  f"'{dtypes.c10_name(out)}' (only integer and bool tensors are supported, got "
                                  f"{described})")
    return out, out


def floating_kernel(op, args) -> tuple[DType, DType]:
    """Operators torch has floating kernels only for (leaky_relu, hypot, logaddexp, ...): it refuses integers and
    bools with NotImplementedError, naming its kernel."""
    out = result_type(*_operands(op, args))
    if not out.is_floating_point:
        kernel = f"{op.name}_{'cuda' if device_type_of(op, args) == 'cuda' else 'cpu'}"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{dtypes.c10_name(out)}\' (got a {out.name} '
                                  "input)")
    return out, compute_dtype(out)


# the kernels torch names when it refuses an activation's integer or bool input: "{name}_{device}", or one
# name for every device
_ACTIVATION_KERNELS = {"_softshrink": "softshrink_check", "elu": "elu_{device}", "celu": "elu_{device}",
                       "selu": "elu_{device}", "logsigmoid": "log_sigmoid_{device}"}
_GELU_KERNELS = {"cpu": "GeluKernelImpl", "cuda": "GeluCUDAKernelImpl"}


def floating_only(op, args) -> tuple[DType, DType]:
    """Activations torch has floating kernels only for (gelu, silu, hardsigmoid, elu, ...): it refuses integers
    and bools with NotImplementedError, naming its kernel."""
    out = result_type(*_operands(op, args))
    if not out.is_floating_point:
        device = "cuda" if device_type_of(op, args) == "cuda" else "cpu"
        name = op.name.removesuffix("_backward")
        kernel = _GELU_KERNELS[device] if name == "gelu" else \
            _ACTIVATION_KERNELS.get(name, "{name}_{device}").format(name=name, device=device)
        raise NotImplementedError(f'"{kernel}" not implemented for \'{dtypes.c10_name(out)}\' (got a {out.name} '
                                  "input; convert it with .float())")
    return out, compute_dtype(out)


def softsign_rule(op, args) -> tuple[DType, DType]:
    """softsign is ``x / (1 + x.abs())``: integers give the default float dtype, as true division does; bools are
    refused by abs."""
    out = result_type(*_operands(op, args))
    if out == dtypes.bool_:
        device = "cuda" if device_type_of(op, args) == "cuda" else "cpu"
        raise NotImplementedError(f'"abs_{device}" not implemented for \'Bool\' (softsign takes the absolute value '
                                  "of its input)")
    return promote_float(op, args)


def _check_where_condition(op, dtype) -> None:
    """torch takes a uint8 condition with a deprecation warning, and refuses any other dtype but bool."""
    if dtype is dtypes.uint8:
        warnings.warn(f"{op.name} received a uint8 condition tensor. This behavior is deprecated and will be removed "
                      "in a future version of PyTorch. Use a boolean condition instead.", UserWarning,
                      stacklevel=levels_to_the_caller())
        return
    raise RuntimeError(f"{op.name} expected condition to be a boolean tensor, but got a tensor with dtype "
                       f"{dtypes.c10_name(dtype)} (the condition is {dtype.name}; compare it, e.g. condition != 0, to "
                       "make a mask)")


def where_rule(op, args) -> tuple[DType, DType]:
    condition = args[op.tensor_idx[0]]
    if getattr(condition, "dtype", dtypes.bool_) is not dtypes.bool_:
        _check_where_condition(op, condition.dtype)
    values = _operands(op, args)[1:]
    out = result_type(*values)
    if out not in _HALVES or device_type_of(op, args) == "cuda":  # torch's CPU kernel casts a number past a
        _check_numbers_fit(op, values, out)  # half's range to inf without a word; its CUDA kernel refuses it
    return out, compute_dtype(out)


def clamp_rule(op, args) -> tuple[DType, DType]:
    """torch's promotion over the input and its bounds; a bound given as a number must fit the result."""
    operands = _operands(op, args)
    if len(operands) == 1:
        raise RuntimeError(f"{op.name}: At least one of 'min' or 'max' must not be None")
    out = result_type(*operands)
    if out.category == COMPLEX:
        raise NotImplementedError(f"{op.name} is not supported for complex types (got {out.name})")
    bounds = op.tensor_idx[1:]
    if out in _HALVES:  # a bound torch reads at float32 (its CUDA kernel) is not refused: see [Note: half operands]
        rounded = half_rounded(op, device_type_of(op, args))
        bounds = [k for k in bounds if op.schema.params[k].name in rounded]
    _check_numbers_fit(op, [args[k] for k in bounds], out)
    return out, compute_dtype(out)


def device_type_of(op, args) -> str:
    """The device type of ``op``'s first tensor operand (a Tensor or the compiler's stand-in for one): "cpu" when
    there is none."""
    for k in op.tensor_idx:
        device = getattr(args[k], "device", None)
        if device is not None:
            return device.type
    return "cpu"


def _check_numbers_fit(op, operands, dtype: DType) -> None:
    """Python numbers that become elements of the result must fit its dtype (see [Note: scalar overflow])."""
    for value in operands:
        if type(value) in (int, float):
            dtypes.checked_scalar(value, dtype, op.name)


def first_input(op, args) -> tuple[DType, DType]:
    d = args[op.tensor_idx[0]].dtype
    if d.category == COMPLEX:
        check_complex_supported(op, d)
    return d, compute_dtype(d)


def reduction_sum(op, args) -> tuple[DType, DType]:
    """sum/prod/cumsum: integers and bool accumulate in int64 unless dtype= says otherwise."""
    explicit = args[op.schema.index("dtype")] if "dtype" in op.param_names() else None
    src = args[0].dtype
    out = explicit or (dtypes.int64 if src.category < dtypes.FLOAT else src)
    if out.category == COMPLEX:
        check_complex_supported(op, out)
    return out, compute_dtype(out)


def reduction_float(op, args) -> tuple[DType, DType]:
    """mean/var/std/norm/logsumexp: floating inputs only, like torch."""
    explicit = args[op.schema.index("dtype")] if "dtype" in op.param_names() else None
    src = explicit or args[0].dtype
    if src.category == COMPLEX:
        check_complex_supported(op, src)
    elif not src.is_floating_point:
        raise RuntimeError(f"{op.name}(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {dtypes.c10_name(src)} ({src}); pass dtype= or convert with "
                           ".float()")
    return src, compute_dtype(src)


def fixed(dtype: DType):
    def rule(op, args) -> tuple[DType, DType]:
        return dtype, dtype

    return rule


def logical_from_input(op, args) -> tuple[DType, DType]:
    """isnan/isinf/signbit: a bool result computed in the input's own precision."""
    return dtypes.bool_, compute_dtype(result_type(*_operands(op, args)))


def checked_scalar_argument(op, name: str, value, out: DType):
    """A Scalar argument (add's ``alpha``, addcmul's ``value``, threshold's ``value``...) as the result's dtype
    holds it, with torch's errors: a floating or bool ``alpha`` for an integer result, a value that does not fit
    (see [Note: scalar overflow])."""
    if type(value) not in (int, float, bool):
        return value
    if name == "alpha" and out.category < dtypes.FLOAT:  # integers and bool; complex results take any alpha
        if isinstance(value, float):
            raise RuntimeError(f"{op.name}: For integral input tensors, argument alpha must not be a floating point "
                               f"number (got alpha={value}, result dtype {out.name})")
        if isinstance(value, bool) and out is not dtypes.bool_:
            raise RuntimeError(f"{op.name}: Boolean alpha only supported for Boolean results (got alpha={value}, "
                               f"result dtype {out.name})")
    return dtypes.checked_scalar(value, out, op.name) if out.category == dtypes.INT else value


# [Note: half operands] Beside a float16/bfloat16 tensor, torch's CPU kernels compute in float32 from operands cast
# to the operands' common dtype first: a Python number, a 0-dim tensor of another dtype or an integer tensor is
# rounded to that half (``half_tensor == 0.1`` compares with 0.1 rounded to float16, so it is True for a tensor
# made from 0.1; 70000 becomes inf). Some kernels read the number at float32 instead (``original_scalar_value``
# of an opmath type): ``mul`` and the three ``div`` modes for their second operand, ``lerp`` for its weight. Scalar
# arguments (``alpha``, ``value``, ``negative_slope``, ...) are float32 in most kernels; ``add``'s and ``sub``'s
# alpha and ``hardtanh``'s, ``threshold``'s and ``hardshrink``'s bounds are cast to the half (and refused when
# past its range). torch's CUDA kernels do not cast Python numbers (TensorIterator leaves a CPU scalar as it is and
# ``opmath_gpu_kernel_with_scalars`` reads it in float32): ``half + 0.1`` adds 0.1, not float16(0.1). Those whose
# functor takes ``scalar_t`` (``gpu_kernel_with_scalars``: the comparisons, ``remainder``, ``fmod``, ``pow`` on
# either side) or that read a Scalar with ``to<scalar_t>()`` (``threshold``'s bounds, the shrinks' lambda, ``pow``'s
# exponent) round it, and refuse a Scalar past the half's range; ``clamp``'s CUDA kernel reads its bounds at
# float32 and refuses none. Where the CUDA kernel computes differently, the operator's expression says so for CUDA:
# division by a CPU scalar is a multiplication by its float32 reciprocal (``div_true_kernel_cuda``).
# Each operator declares what torch does on each device type, ``half_rounded={device type: parameter names}``
# beside its dtype rule; without a declaration, the operands of the rules in ``_COMMON_DTYPE_RULES`` are rounded
# on the CPU and nothing is rounded on CUDA. The eager CPU kernels, the eager CUDA kernels and the compiler read
# the declaration through ``half_rounded`` (cached per operator and device type).
_HALVES = (dtypes.float16, dtypes.bfloat16)
# the rules of operators whose operands torch casts
_COMMON_DTYPE_RULES = frozenset({promote, promote_float, compare, first_input, negation, subtraction, numeric, power,
                                 floating_only, softsign_rule, clamp_rule, where_rule})
# declarations shared by several operators
ADD_HALF_ROUNDED = {"cpu": ("self", "other", "alpha")}  # add, sub, rsub: the number and alpha are cast on the CPU
OTHER_AT_OPMATH = {"cpu": ("self",)}  # mul, div, floor_divide: the second operand is read at float32 on the CPU
# comparisons, remainder, fmod: cast on the CPU (the default) and on CUDA (``gpu_kernel_with_scalars`` of scalar_t)
BOTH_ROUNDED = {"cuda": ("self", "other")}
_half_rounded: dict[tuple, frozenset] = {}  # (op, device type) -> names of the parameters rounded to the half


def half_rounded(op, device_type: str) -> frozenset:
    """The names of ``op``'s parameters (tensor operands and Scalar arguments) whose Python numbers torch rounds to
    the operands' float16/bfloat16 before computing on ``device_type``: see [Note: half operands]."""
    key = (op, device_type)
    found = _half_rounded.get(key)
    if found is None:
        declared = op.attrs.get("half_rounded", {})
        if device_type in declared:
            found = frozenset(declared[device_type])
        elif device_type == "cpu" and op.dtype_rule in _COMMON_DTYPE_RULES:
            found = frozenset(op.schema.params[k].name for k in op.tensor_idx)
        else:
            found = frozenset()
        _half_rounded[key] = found
    return found


def half_scalars_fit(op, args) -> None:
    """The Scalar arguments that torch casts to a float16/bfloat16 input's dtype on its device (``half_rounded``)
    must fit it: torch's ``to<scalar_t>()`` refuses a value past the half's range (``threshold`` on CUDA)."""
    x = args[op.tensor_idx[0]]
    dtype = getattr(x, "dtype", None)
    if dtype not in _HALVES:
        return
    rounded = half_rounded(op, device_type_of(op, args))
    for k, p in enumerate(op.schema.params):
        if p.name in rounded and k not in op.tensor_idx:
            rounded_scalar(op, args[k], dtype)


def is_half(dtype: DType) -> bool:
    return dtype in _HALVES


def common_half(op, args, tensor_idx) -> DType | None:
    """The float16/bfloat16 that ``op``'s operands (``args`` at ``tensor_idx``) are rounded to before computing,
    or None."""
    if not any(getattr(args[k], "dtype", None) in _HALVES for k in tensor_idx):
        return None
    common = result_type(*[args[k] for k in tensor_idx if args[k] is not None])
    return common if common in _HALVES else None


def rounds_to_common(operand, common: DType) -> bool:
    """Whether ``operand`` (a Python number or a tensor-like) of a parameter that ``half_rounded`` names changes
    when it is cast to ``common``."""
    if type(operand) in (int, float, bool):
        return True
    dtype = getattr(operand, "dtype", None)
    return dtype is not None and dtype is not common


def rounded_scalar(op, value, common: DType):
    """A Scalar argument that torch casts to ``common`` (add's ``alpha``, hardtanh's bounds): refused past its
    range with torch's error, else rounded."""
    if type(value) not in (int, float):
        return value
    dtypes.checked_scalar(value, common, op.name)
    return round_to_half(value, common)


def round_to_half(value, common: DType) -> float:
    """A Python number as torch casts it to ``common``: through float32 (c10's Half and BFloat16 are made from a
    float), past the range to inf."""
    with np.errstate(over="ignore"):
        return float(np.float32(value).astype(common.np))
