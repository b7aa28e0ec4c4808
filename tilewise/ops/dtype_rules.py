"""Result-dtype rules shared by operator declarations.

A rule maps the operator and its bound arguments to ``(out_dtype, compute_dtype)``: the dtype of the
result and the dtype its arithmetic runs in (half types compute in float32, like torch's opmath).
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.dtypes import DType, compute_dtype, result_type, to_float


def _operands(op, args) -> list:
    return [args[k] for k in op.tensor_idx if args[k] is not None]


def promote(op, args) -> tuple[DType, DType]:
    out = result_type(*_operands(op, args))
    return out, compute_dtype(out)


def promote_float(op, args) -> tuple[DType, DType]:
    """Integer inputs give the default float dtype (exp, sqrt, true division, ...)."""
    out = to_float(result_type(*_operands(op, args)))
    return out, compute_dtype(out)


def compare(op, args) -> tuple[DType, DType]:
    return dtypes.bool_, compute_dtype(result_type(*_operands(op, args)))


def logical(op, args) -> tuple[DType, DType]:
    return dtypes.bool_, dtypes.bool_


def integral(op, args) -> tuple[DType, DType]:
    out = result_type(*_operands(op, args))
    if out.is_floating_point:
        described = ", ".join(getattr(a, "dtype", type(a).__name__).__str__() for a in _operands(op, args))
        raise TypeError(f"{op.name}: only integer and bool tensors are supported, got {described}")
    return out, out


def floating_only(op, args) -> tuple[DType, DType]:
    out = result_type(*_operands(op, args))
    if not out.is_floating_point:
        raise TypeError(f"{op.name}: expected a floating point input, got {out}; convert with .float() first")
    return out, compute_dtype(out)


def where_rule(op, args) -> tuple[DType, DType]:
    out = result_type(*_operands(op, args)[1:])
    return out, compute_dtype(out)


def first_input(op, args) -> tuple[DType, DType]:
    d = args[op.tensor_idx[0]].dtype
    return d, compute_dtype(d)


def reduction_sum(op, args) -> tuple[DType, DType]:
    """sum/prod/cumsum: integers and bool accumulate in int64 unless dtype= says otherwise."""
    explicit = args[op.schema.index("dtype")] if "dtype" in op.param_names() else None
    src = args[0].dtype
    out = explicit or (dtypes.int64 if not src.is_floating_point else src)
    return out, compute_dtype(out)


def reduction_float(op, args) -> tuple[DType, DType]:
    """mean/var/std/norm/logsumexp: floating inputs only, like torch."""
    explicit = args[op.schema.index("dtype")] if "dtype" in op.param_names() else None
    src = explicit or args[0].dtype
    if not src.is_floating_point:
        raise TypeError(f"{op.name}(): could not infer output dtype. Input dtype must be floating point, got {src}; "
                        "pass dtype= or convert with .float()")
    return src, compute_dtype(src)


def fixed(dtype: DType):
    def rule(op, args) -> tuple[DType, DType]:
        return dtype, dtype

    return rule


def logical_from_input(op, args) -> tuple[DType, DType]:
    """isnan/isinf/signbit: a bool result computed in the input's own precision."""
    return dtypes.bool_, compute_dtype(result_type(*_operands(op, args)))
