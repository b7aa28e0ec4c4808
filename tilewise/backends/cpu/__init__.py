"""The CPU backend: numpy arrays, with kernels derived from operator declarations where possible.

[Note: CPU kernels] Pointwise operators run their declared ``Expr`` rendered to numpy (one cached function
per operator and argument variant); reductions run the declared combiner through numpy's reduce.
Operators that are not expressions (sort, gather, matmul, random, ...) have a hand-written numpy kernel in
``kernels.py``, registered under the operator's name; ``tests/test_op_rules.py`` checks that every operator has
one or is a composite or view. Hot composites and costly pointwise operators on large enough tensors run as
one compiled C kernel instead (``register_composite_runner``; [Note: fused composites]). Inputs are cast to
the operator's compute dtype first, so half-precision arithmetic rounds once, at the end, like torch's CPU
kernels.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tilewise.backends.cpu.allocator import keep_freed_memory
from tilewise.backends.cpu.registry import KERNELS, kernel  # noqa: F401 — kernel: the decorator, re-exported
from tilewise.backends.cpu.render import render_numpy, run_quietly, single_ufunc
from tilewise.config import settings
from tilewise.device import Backend, Device
from tilewise.dtypes import ALL as ALL_DTYPES
from tilewise.dtypes import get_default_dtype
from tilewise.ops import dtype_rules as R
from tilewise.ops.expr import Expr, inputs_of, unit_product_dropped, value_key
from tilewise.storage import HostOutOfMemoryError, out_of_host_memory
from tilewise.strides import (
    WRAPPED_NUMBER,
    broadcast_shapes,
    cached_contiguous_strides,
    contiguous_strides,
    normalize_dims,
    pointwise_strides,
)
from tilewise.tensor import Tensor, cast_array, from_array, from_array_strided, from_contiguous_array

_fused = None  # the compiler's runner of composite operators as one C kernel (register_composite_runner)
_fused_ops: frozenset = frozenset()


def run(op, args: tuple, device):
    try:
        kind = op.kind
        if op.name in _fused_ops:
            out = _fused(op, args)
            if out is not None:
                return out
        if kind == "pointwise":
            return run_pointwise(op, args)
        if kind == "reduction" and op.reduce is not None:
            return run_reduction(op, args)
        impl = KERNELS.get(op.full_name)
        if impl is not None:
            return impl(*args)
        if kind == "custom":  # its kernels live with its registration (tilewise.library)
            return op.attrs["run"](args, device)
        if op.decomposition is not None:
            return op.decomposition(*args)
    except MemoryError as exc:
        raise out_of_memory(op.name, exc) from None
    raise NotImplementedError(f"{op.full_name}: no CPU kernel and no decomposition")


def register_composite_runner(names: frozenset, runner) -> None:
    """[Plug-in point] Run the operators ``names`` (composites, and pointwise operators whose numpy form is slow)
    through ``runner(op, args)`` (which returns None to decline) before their kernel or decomposition. The
    compiler registers itself here at import (``compiler.composites``): the backend never imports the compiler."""
    global _fused, _fused_ops
    _fused, _fused_ops = runner, frozenset(names)


def out_of_memory(op: str, exc: MemoryError) -> RuntimeError:
    """torch's allocator error for an allocation numpy could not make, with its size in bytes."""
    shape, dtype = getattr(exc, "shape", None), getattr(exc, "dtype", None)
    if shape is None or dtype is None:
        return HostOutOfMemoryError(f"{op}: DefaultCPUAllocator: not enough memory ({exc})")
    return out_of_host_memory(op, math.prod(shape) * dtype.itemsize,
                              f"for an array of shape {list(shape)} and dtype {dtype}")


# ---------------------------------------------------------------------------- pointwise

_compiled: dict[tuple, tuple] = {}  # (op[, variant]) -> (numpy function, positions of its scalar arguments)


def pointwise_fn(op, args: tuple, compute_dtype) -> tuple:
    """The numpy function for this operator (and argument variant, for operators with expression builders),
    with the argument positions it takes after the tensors."""
    builder = op.attrs.get("expr_builder")
    if builder is None:
        entry = _compiled.get((op,))
        if entry is None:
            entry = _compiled[(op,)] = _static_kernels(op)
        return _pick_static(entry, args)
    variant = tuple(value_key(a) for k, a in enumerate(args) if k not in op.tensor_idx and not isinstance(a, Tensor))
    present = tuple(None if args[k] is None else (getattr(args[k], "_dtype", True), _one_element(args[k]))
                    for k in op.tensor_idx)
    # a builder may read its inputs' dtypes (nan_to_num's extremes) and whether they hold one element (clamp's ties)
    chooser = op.attrs.get("expr_variant")  # a builder that reads an operand's value (pow's exponent) says so
    key = (op, variant, present, compute_dtype, chooser(args) if chooser is not None else None)
    entry = _compiled.get(key)
    if entry is None:
        expr = builder(args, compute_dtype)
        entry = _compiled[key] = (render_numpy(expr, len(op.tensor_idx), (), f"{op.name}_variant", op.name), ())
    return entry


def _one_element(value) -> bool:
    shape = getattr(value, "_shape", None)
    return shape is None or math.prod(shape) == 1


def _pick_static(entry: tuple, args: tuple) -> tuple:
    """From ``_static_kernels``' entry: the kernel specialised to the defaults when the call passes them."""
    fn, scalar_idx, defaults, at_defaults = entry
    if at_defaults is None:
        return fn, scalar_idx
    if len(scalar_idx) == 1:  # add's and sub's alpha: one comparison, without a loop's cost
        value, d = args[scalar_idx[0]], defaults[0]
        return at_defaults if value == d and type(value) is type(d) else (fn, scalar_idx)
    for k, d in zip(scalar_idx, defaults):
        if args[k] != d or type(args[k]) is not type(d):  # alpha=True is not alpha=1
            return fn, scalar_idx
    return at_defaults


def _static_kernels(op) -> tuple:
    """The general kernel, its scalar positions and defaults, and a kernel specialised to those defaults
    (``add``'s ``alpha=1`` then costs no multiply); the specialisation exists when every default is a number."""
    params = op.schema.params
    n_inputs = len(op.tensor_idx)
    scalar_idx = tuple(k for k in range(len(params)) if k not in op.tensor_idx)
    if scalar_idx:
        fn = render_numpy(op.expr, n_inputs, tuple(params[k].name for k in scalar_idx), op.name)
    else:
        fn = single_ufunc(op.expr, n_inputs) or render_numpy(op.expr, n_inputs, (), op.name)
    defaults = tuple(params[k].default for k in scalar_idx)
    at_defaults = None
    if scalar_idx and all(type(d) in (int, float) for d in defaults):
        expr = _with_constants(op.expr, {params[k].name: d for k, d in zip(scalar_idx, defaults)})
        at_defaults = (single_ufunc(expr, n_inputs) or render_numpy(expr, n_inputs, (), f"{op.name}_defaults", op.name),
                       ())
    return fn, scalar_idx, defaults, at_defaults


def _with_constants(expr: Expr, values: dict) -> Expr:
    """``expr`` with its scalar parameters replaced by constants, and products by 1 dropped (exact)."""
    if expr.op == "scalar":
        return Expr("const", (), values[expr.arg])
    srcs = tuple(_with_constants(s, values) for s in expr.srcs)
    if expr.op == "mul" and _is_one(srcs[0]):
        return srcs[1]
    return unit_product_dropped(Expr(expr.op, srcs, expr.arg), lambda operand, factor: _is_one(factor))


def _is_one(expr: Expr) -> bool:
    return expr.op == "const" and expr.arg == 1 and type(expr.arg) is not bool


_FLOAT_MAX = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64)}


def _number_as(value, np_dtype):
    return np.asarray(value, dtype=np_dtype)[()]


def _as_compute(value, np_dtype, op):
    if type(value) is Tensor:
        a = value._np()
        return a if a.dtype is np_dtype or a.dtype == np_dtype else a.astype(np_dtype)
    if value is None:
        return None
    if np_dtype.kind == "b":
        return bool(value)
    if type(value) is float and not -_FLOAT_MAX.get(np_dtype, math.inf) <= value <= _FLOAT_MAX.get(np_dtype, math.inf):
        return run_quietly(_number_as, [value, np_dtype])  # past the dtype's range (inf): numpy would warn, torch not
    try:
        return np.asarray(value, dtype=np_dtype)[()]
    except OverflowError:  # uint8_tensor + (-2): the scalar wraps to the tensor's width, as in torch
        if type(value) is int and not -(1 << 63) <= value < 1 << 64:
            raise OverflowError(f"{op.name}: int too big to convert: {value} does not fit in 64 bits") from None
        return np.asarray(value).astype(np_dtype)[()]


# Dtype rules that read nothing but the tensor operands (of each, a tensor's dtype and whether it is 0-dim, or
# the type of a Python number) and the default dtype: their results are kept per combination of those.
_OPERAND_RULES = frozenset({R.promote, R.promote_float, R.compare, R.logical, R.logical_from_input, R.floating_only,
                            R.first_input, R.negation, R.subtraction, R.numeric, R.power})
_rule_results: dict[tuple, tuple] = {}  # _operand_signature -> (out dtype, compute dtype)
_ZERO_DIM = {d: (d, 0) for d in ALL_DTYPES}  # a 0-dim tensor's entry in a signature: promotion ranks it apart
_PYTHON_NUMBERS = (int, float, bool)


def _dtypes(op, args: tuple) -> tuple:
    """``op.dtype_rule(op, args)``, computed once per operand signature for the rules in ``_OPERAND_RULES``."""
    key = _operand_signature(op, args) if op.dtype_rule in _OPERAND_RULES else None
    if key is None:
        return op.dtype_rule(op, args)
    found = _rule_results.get(key)
    if found is None:
        found = _rule_results[key] = op.dtype_rule(op, args)
    return found


def _operand_signature(op, args: tuple) -> tuple | None:
    """(op, default dtype, then per tensor operand: its dtype, or the type of a Python number or None), or None
    when an operand is of another kind."""
    signature = [op, get_default_dtype()]
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor:
            signature.append(a._dtype if a._shape else _ZERO_DIM[a._dtype])
        elif a is None or type(a) in _PYTHON_NUMBERS:
            signature.append(type(a))
        else:
            return None
    return tuple(signature)


# Calls whose tensor operands are all tensors of one floating dtype and shape (no Python numbers, so neither
# scalar types nor the default dtype play a part) also reuse the kernel, per (operator, dtype).
# (op, dtype) -> (out dtype, compute numpy dtype or None, kernels, positions of the Scalar arguments rounded to dtype)
_uniform_plans: dict[tuple, tuple | None] = {}
_UNPLANNED = object()


def run_pointwise(op, args: tuple):
    operands = _uniform_operands(op, args)
    if operands is not None:
        arrays, row_major = operands
        first = args[op.tensor_idx[0]]
        key = (op, first._dtype)
        plan = _uniform_plans.get(key, _UNPLANNED)
        if plan is _UNPLANNED:
            plan = _uniform_plans[key] = _uniform_plan(op, args, first._dtype)
        if plan is not None:  # the general path below, with the dtype rule and the kernel lookup done once
            out_dtype, cast_to, kernels, rounded = plan
            fn, scalar_idx = _pick_static(kernels, args)
            values = arrays if cast_to is None else [a.astype(cast_to) for a in arrays]
            for k in scalar_idx:
                values.append(R.rounded_scalar(op, args[k], first._dtype) if k in rounded else args[k])
            res = run_quietly(fn, values)
            if row_major and type(res) is np.ndarray and res.dtype is out_dtype.np and res.flags.c_contiguous \
                    and res.shape == first._shape:
                return from_contiguous_array(res, out_dtype)  # what _result and _torch_layout would make of it
            return _torch_layout(_result(res, first._shape, out_dtype), op, args)
    elif len(op.tensor_idx) == 2:
        out = _tensor_and_number(op, args)
        if out is not None:
            return out
    shape = _broadcast_shape(op, args)  # first, so a mismatch is reported with the operator's name
    out_dtype, compute = _dtypes(op, args)
    cnp = compute.np
    fn, scalar_idx = pointwise_fn(op, args, compute)
    values = [_as_compute(args[k], cnp, op) for k in op.tensor_idx]
    common = R.common_half(op, args, op.tensor_idx) if cnp is _FLOAT32 else None
    if common is not None:
        _round_to_common_half(op, args, values, common)
    names = op.schema.params
    for k in scalar_idx:
        name = names[k].name
        value = R.checked_scalar_argument(op, name, args[k], out_dtype)
        if common is not None and name in R.half_rounded(op, "cpu"):
            value = R.rounded_scalar(op, value, common)
        values.append(value)
    return _torch_layout(_result(run_quietly(fn, values), shape, out_dtype), op, args)


_FLOAT32 = np.dtype(np.float32)


def _round_to_common_half(op, args: tuple, values: list, common) -> None:
    """``values`` (the operands in float32) rounded in place to ``common`` as torch rounds them: see
    [Note: half operands]."""
    rounded = R.half_rounded(op, "cpu")
    params = op.schema.params
    for position, k in enumerate(op.tensor_idx):
        if args[k] is not None and params[k].name in rounded and R.rounds_to_common(args[k], common):
            with np.errstate(over="ignore"):
                values[position] = values[position].astype(common.np).astype(_FLOAT32)


def _torch_layout(out: Tensor, op, args: tuple) -> Tensor:
    """``out`` with the strides torch's TensorIterator gives the result (``strides.pointwise_strides``): numpy
    already matches it when every operand is row-major, and usually when they share one order."""
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a._strides != contiguous_strides(a._shape):
            break
    else:
        return out
    if op.attrs.get("row_major"):  # torch's own kernel for the operator writes row-major
        return from_array(np.ascontiguousarray(out._np()), out._dtype)
    operands = []
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor:
            operands.append((a._shape, a._strides))
        elif a is not None:
            operands.append(WRAPPED_NUMBER)
    return from_array_strided(out._np(), pointwise_strides(out._shape, operands), out._dtype)


def _uniform_operands(op, args: tuple) -> tuple[list[np.ndarray], bool] | None:
    """The tensor operands' arrays, when every tensor operand is a Tensor of the first one's dtype and shape, and
    whether every one of them is row-major (then numpy's result is row-major, as torch's)."""
    first = None
    arrays = []
    row_major = True
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is not Tensor:
            return None
        if first is None:
            first = a
            strides = cached_contiguous_strides(a._shape)
        elif a._dtype is not first._dtype or a._shape != first._shape:
            return None
        if a._strides != strides:
            row_major = False
        arrays.append(a._np())
    return arrays, row_major


# Calls of a binary operator on a float32 or float64 tensor and a Python int or float (``x * 0.5``, ``grad * 2``,
# ``1 - p``) reuse the dtype rule's answer and the kernel too, per (operator, dtype, number type, tensor position):
# (out dtype, compute numpy dtype, kernels) or None where the general path must run
_number_plans: dict[tuple, tuple | None] = {}


def _tensor_and_number(op, args: tuple) -> Tensor | None:
    """``run_pointwise`` for a tensor and a Python number, without the general path's per-call work (the dtype
    rule, the kernel lookup, the half-rounding checks), or None where that path must run."""
    i, j = op.tensor_idx
    a, b = args[i], args[j]
    if type(a) is Tensor:
        t, number, position = a, b, 0
    elif type(b) is Tensor:
        t, number, position = b, a, 1
    else:
        return None
    kind = type(number)
    if kind is not float and kind is not int:
        return None
    key = (op, t._dtype, kind, position, not t._shape)
    plan = _number_plans.get(key, _UNPLANNED)
    if plan is _UNPLANNED:
        plan = _number_plans[key] = _number_plan(op, args, t)
    if plan is None:
        return None
    out_dtype, compute, kernels = plan
    fn, scalar_idx = _pick_static(kernels, args)
    array = t._np()
    if array.dtype is not compute:
        array = array.astype(compute)
    scalar = _as_compute(number, compute, op)
    values = [array, scalar] if position == 0 else [scalar, array]
    params = op.schema.params
    for k in scalar_idx:
        values.append(R.checked_scalar_argument(op, params[k].name, args[k], out_dtype))
    res = run_quietly(fn, values)
    if type(res) is np.ndarray and res.dtype is out_dtype.np and res.flags.c_contiguous and res.shape == t._shape \
            and t._strides == cached_contiguous_strides(t._shape):
        return from_contiguous_array(res, out_dtype)
    return _torch_layout(_result(res, t._shape, out_dtype), op, args)


def _number_plan(op, args: tuple, t: Tensor) -> tuple | None:
    """What ``_tensor_and_number`` reuses, or None where the result's dtype or kernel may depend on more than the
    key (a dtype rule outside ``_OPERAND_RULES``, an expression builder, a tensor that half rounding concerns)."""
    if not t._dtype.is_floating_point or t._dtype.itemsize < 4 or t._dtype.is_complex:
        return None
    if op.dtype_rule not in _OPERAND_RULES or "expr_builder" in op.attrs:
        return None
    out_dtype, compute = _dtypes(op, args)
    if out_dtype.is_complex or compute.is_complex:
        return None
    entry = _compiled.get((op,))
    if entry is None:
        entry = _compiled[(op,)] = _static_kernels(op)
    return out_dtype, compute.np, entry


def _uniform_plan(op, args: tuple, dtype) -> tuple | None:
    """What ``run_pointwise`` reuses for calls on tensors of one ``dtype``, or None where the operator's dtype
    rule or kernel may depend on more than that (see ``_OPERAND_RULES``)."""
    if not dtype.is_floating_point or op.dtype_rule not in _OPERAND_RULES or "expr_builder" in op.attrs:
        return None
    out_dtype, compute = _dtypes(op, args)
    entry = _compiled.get((op,))
    if entry is None:
        entry = _compiled[(op,)] = _static_kernels(op)
    rounded = R.half_rounded(op, "cpu") if R.is_half(dtype) else frozenset()
    positions = frozenset(k for k, p in enumerate(op.schema.params) if p.name in rounded and k not in op.tensor_idx)
    return out_dtype, None if compute is dtype else compute.np, entry, positions


def _result(res, shape: tuple, out_dtype) -> Tensor:
    if type(res) is not np.ndarray:
        res = np.asarray(res)
    if res.shape != shape:
        res = np.broadcast_to(res, shape).copy()
    if res.dtype is not out_dtype.np and res.dtype != out_dtype.np:  # identity first: numpy's dtypes are interned
        res = cast_array(res, out_dtype.np)
    return from_array(res, out_dtype)


def _broadcast_shape(op, args: tuple) -> tuple:
    shape = None
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a._shape != shape:
            if shape is not None:
                shapes = [args[j]._shape for j in op.tensor_idx if type(args[j]) is Tensor]
                return broadcast_shapes(*shapes, op=op.name)
            shape = a._shape
    return () if shape is None else shape


# ---------------------------------------------------------------------------- reductions

_REDUCERS = {
    "add": np.add.reduce, "mul": np.multiply.reduce, "max": np.maximum.reduce, "min": np.minimum.reduce,
    "or": np.logical_or.reduce, "and": np.logical_and.reduce,
}


_reduction_plans: dict[tuple, tuple] = {}  # (op, input dtype, rank, other arguments) -> _reduction_plan(op, args)


def run_reduction(op, args: tuple):
    x = args[0]
    key = (op, x._dtype, len(x._shape), args[1:])
    plan = _reduction_plans.get(key)
    if plan is None:
        plan = _reduction_plans[key] = _reduction_plan(op, args)
    dims, reduce, out_dtype, compute = plan
    a = x._np()
    if a.dtype is not compute.np and a.dtype != compute.np:
        a = a.astype(compute.np)
    # max and min over an empty dim never reach here (see [Note: empty reductions]).
    # NaN and inf propagate silently, as in torch; a 0-dim input's result is a new tensor all the same
    res = np.asarray(run_quietly(reduce, [a])) if x._shape else a.copy()
    if res.dtype is out_dtype.np and res.flags.c_contiguous:
        return from_contiguous_array(res, out_dtype)
    if res.dtype != out_dtype.np:
        res = cast_array(res, out_dtype.np)
    return from_array(np.asarray(res, order="C"), out_dtype)  # row-major whatever the input's order, as torch's


def _reduction_plan(op, args: tuple) -> tuple:
    """(dims, the numpy reduction of an array over them, out dtype, compute dtype) of a reduction call: functions
    of the input's dtype and rank and of the other arguments, hence computed once per combination of those."""
    ndim = len(args[0]._shape)
    names = op.param_names()
    dim = args[1] if len(args) > 1 and names[1] == "dim" else None
    dims = normalize_dims(dim, ndim, op.name)
    if dim is not None and len(dim) == 0 and op.reduce == "add":
        dims = tuple(range(ndim))  # torch: sum(dim=[]) reduces everything
    keepdim = args[names.index("keepdim")] if "keepdim" in names else False
    out_dtype, compute = op.dtype_rule(op, args)
    return dims, functools.partial(_REDUCERS[op.reduce], axis=dims, keepdims=keepdim), out_dtype, compute


class CPUBackend(Backend):
    """The CPU as a :class:`~tilewise.device.Backend`: numpy arrays in host memory. Host memory is where every
    transfer starts or ends, so ``upload`` and ``download`` are copies; pinning is the accelerator's business."""

    run = staticmethod(run)

    def empty(self, shape: tuple, dtype, device: Device, strides: tuple | None = None) -> Tensor:
        if strides is None:
            return from_array(np.empty(tuple(shape), dtype.np), dtype)
        return from_array(np.empty(tuple(shape), dtype.np), dtype).as_strided(shape, strides)

    def upload(self, src: Tensor, device: Device, non_blocking: bool = False, dtype=None,
               memory_format=None) -> Tensor:
        return KERNELS["_to_copy"](src, dtype, None, False, memory_format)

    def download(self, x: Tensor, non_blocking: bool = False) -> Tensor:
        return KERNELS["_to_copy"](x)

    def synchronize(self, device: Device) -> None:
        """CPU kernels finish before they return: nothing is ever queued."""

    def __repr__(self) -> str:
        return "<CPU backend>"


backend = CPUBackend()


def _load_kernels() -> None:
    if settings.cpu_malloc:
        keep_freed_memory()
    from tilewise.backends.cpu import (  # noqa: F401 — registers the kernels
        api_kernels,
        conv_kernels,
        fft_kernels,
        gamma_kernels,
        kernels,
        linalg_householder_kernels,
        linalg_kernels,  # noqa: F401
        movement_kernels,
        sampling_kernels,
        scaled_mm_kernels,
    )


def get_cpu_capability() -> str:
    """The widest x86/Arm vector extension this CPU offers numpy's loops, in torch.backends.cpu's words: "AVX512",
    "AVX2", "SVE256", "DEFAULT" (or "NO AVX" on an x86 CPU without AVX2)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return "DEFAULT"
    if all(features.get(f) for f in ("AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ")):
        return "AVX512"
    if features.get("AVX2"):
        return "AVX2"
    if features.get("SVE"):
        return "SVE256"
    return "NO AVX" if "AVX" in features else "DEFAULT"
