"""Pointwise operators on CUDA: the declared ``Expr`` rendered by ``compiler.render`` and launched.

[Note: pointwise plans]
Rendering and compiling happen once per kernel *specialisation* (dtypes, rank after merging dims,
contiguity of each operand, 32- or 64-bit indexing); sizes and strides are run-time arguments. What a call
must still work out — the broadcast shape, merged dims, which kernel, the launch grid, the argument list
minus the pointers — depends only on the inputs' dtypes, shapes and strides, so it is kept in a
:class:`Plan` keyed by exactly those. A repeated call then costs a dictionary lookup, an allocation and a
launch. Python numbers and 0-dim CPU tensors in tensor positions travel as by-value arguments, so
``x * 2`` moves nothing from the host; a 0-dim CUDA tensor is read in place. When every operand is
contiguous and its address aligned, each thread handles 16 bytes of the widest operand with vector loads
and stores; otherwise each thread computes one element from its coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import _strides as S
from tilewise.backends.cuda.device_memory import empty_fast, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, launch, launch_packed, load, packer_for
from tilewise.codegen.render import (
    BROADCAST,
    CONTIGUOUS,
    CUDA,
    STRIDED,
    VALUE,
    Operand,
    PointwiseKernel,
    render_pointwise,
    vector_width,
)
from tilewise.codegen.render.cstyle import SUFFIX
from tilewise.dtypes import DType, get_default_dtype
from tilewise.ops.expr import Expr, inputs_of, render_text
from tilewise.tensor import Tensor

BLOCK = 128
_INT32_LIMIT = 2**31 - 1
PTR, NUMBER, HOST_SCALAR, ABSENT = 0, 1, 2, 3  # how a plan fills each input's argument


@dataclass
class Plan:
    """Everything about a launch that does not change between calls with the same geometry."""

    vector_fn: object  # the contiguous vector kernel, or None
    scalar_fn: object
    vector_grid: int
    scalar_grid: int
    inputs: tuple[tuple[int, int], ...]  # (kind, argument index) per input
    scalars: tuple[int, ...]  # argument index of each by-value scalar parameter
    convert: type  # Python type of by-value arguments (the compute dtype's)
    tail: tuple[int, ...]  # n, sizes, strides
    aligned: tuple[tuple[int, int], ...]  # (input index or -1 for the output, alignment) for the vector path
    numel: int
    packers: dict = field(default_factory=dict)  # kernel -> the packer of its arguments (False: the general one)


def kernel_name(prefix: str, kernel_inputs, outputs, rank: int, index: str, vector: int) -> str:
    codes = {CONTIGUOUS: "c", STRIDED: "s", BROADCAST: "b", VALUE: "v"}
    ins = "".join(SUFFIX[o.dtype.name] + codes[o.layout] for o in kernel_inputs)
    outs = "".join(SUFFIX[o.dtype.name] + codes[o.layout] for o in outputs)
    width = "i32" if index == "int32" else "i64"
    return f"tw_{prefix}_{outs}_{ins}_r{rank}_{width}" + (f"_v{vector}" if vector > 1 else "")


def python_type(dtype: DType) -> type:
    if dtype.is_floating_point:
        return float
    return bool if dtype.name == "bool" else int


# ---------------------------------------------------------------------------------------------- planning

def _describe(value) -> tuple:
    """The part of an input that decides its plan."""
    if type(value) is Tensor:
        if value._device.type == "cpu":
            return (HOST_SCALAR, value._dtype)
        return (PTR, value._dtype, value._shape, value._strides)
    if value is None:
        return (ABSENT,)
    return (NUMBER, type(value))


@dataclass
class Specs:
    """The kernels (scalar and, where possible, vector) of one launch geometry, and how to call them."""

    scalar: PointwiseKernel
    vector: PointwiseKernel | None
    aligned: tuple[tuple[int, int], ...]  # (input index or -1 for the output, byte alignment) for the vector path
    tail: tuple[int, ...]
    numel: int


def kernel_specs(name: str, exprs: tuple[Expr, ...], compute: DType, described: list[tuple],
                 scalar_names: tuple[str, ...], out: tuple[DType, tuple, tuple], saturate: bool = False) -> Specs:
    """Specialise an elementwise launch writing ``out`` = (dtype, shape, strides) from inputs ``described``
    (see ``_describe``): merge dims, classify each operand's layout, pick index width and vector width."""
    out_dtype, shape, out_strides = out
    numel = S.numel(shape)
    candidates, input_strides = [], []
    for k, d in enumerate(described):
        if d[0] == PTR:
            strides = S.expand_strides(d[2], d[3], shape)
            if numel > 1 and any(stride != 0 for size, stride in zip(shape, strides) if size != 1):
                candidates.append(k)
                input_strides.append(strides)
    merged_shape, merged = S.coalesce(shape, out_strides, *input_strides)
    rank = len(merged_shape)
    contiguous = S.contiguous_strides(merged_shape)
    layouts = []
    for k, d in enumerate(described):
        if d[0] != PTR:
            layouts.append(VALUE)
        elif k not in candidates:
            layouts.append(BROADCAST)
        else:
            layouts.append(CONTIGUOUS if merged[1 + candidates.index(k)] == contiguous else STRIDED)
    out_layout = CONTIGUOUS if merged[0] == contiguous else STRIDED
    in_dtypes = [d[1] if d[0] == PTR else compute for d in described]
    kernel_inputs = tuple(Operand(dt, layout) for dt, layout in zip(in_dtypes, layouts))
    output = Operand(out_dtype, out_layout)
    spans = [S.storage_span(merged_shape, tuple(abs(x) for x in st), 0) for st in merged]  # flip: negative strides
    index = "int32" if max([numel, *spans]) <= _INT32_LIMIT else "int64"
    strided = ([merged[0]] if out_layout == STRIDED else []) + [
        merged[1 + candidates.index(k)] for k, lay in enumerate(layouts) if lay == STRIDED]
    tail = (numel, *(merged_shape if strided else ()), *(s for st in strided for s in st))

    def spec(vector: int) -> PointwiseKernel:
        layout_rank = max(rank, 1)
        return PointwiseKernel(
            name=kernel_name(name, kernel_inputs, (output,), layout_rank, index, vector), inputs=kernel_inputs,
            outputs=tuple((output, e) for e in exprs), compute=compute, scalars=scalar_names, rank=layout_rank,
            index=index, vector=vector, saturate=saturate, block=BLOCK)

    vector_spec, aligned = None, ()
    if out_layout == CONTIGUOUS and STRIDED not in layouts:
        contiguous_inputs = [(k, dt) for k, (dt, lay) in enumerate(zip(in_dtypes, layouts)) if lay == CONTIGUOUS]
        vector = vector_width([out_dtype] + [dt for _, dt in contiguous_inputs], CUDA.max_vector)
        if vector > 1 and numel >= vector:
            vector_spec = spec(vector)
            aligned = ((-1, vector * out_dtype.itemsize),) + tuple((k, vector * dt.itemsize)
                                                                   for k, dt in contiguous_inputs)
    return Specs(spec(1), vector_spec, aligned, tail, numel)


def make_plan(name: str, exprs: tuple[Expr, ...], compute: DType, described: list[tuple], arg_index: list[int],
              scalar_index: list[int], scalar_names: tuple[str, ...], out: tuple[DType, tuple, tuple],
              device: int, saturate: bool = False) -> Plan:
    """Specialise, render, compile and load the kernels of one launch geometry (see [Note: pointwise plans])."""
    specs = kernel_specs(name, exprs, compute, described, scalar_names, out, saturate)

    def loaded(spec: PointwiseKernel | None):
        return None if spec is None else load(render_pointwise(spec, CUDA), spec.name, device)

    vector = specs.vector.vector if specs.vector is not None else 1
    return Plan(loaded(specs.vector), loaded(specs.scalar), ceil_div(specs.numel, BLOCK * vector),
                ceil_div(specs.numel, BLOCK), tuple((d[0], a) for d, a in zip(described, arg_index)),
                tuple(scalar_index), python_type(compute), specs.tail, specs.aligned, specs.numel)


def execute(plan: Plan, args: tuple, out: Tensor, stream: int) -> None:
    """Launch ``plan`` writing ``out`` from the bound ``args``."""
    convert = plan.convert
    argv = [out._storage.data.ptr + out._offset * out._dtype.itemsize]
    for kind, k in plan.inputs:
        if kind == PTR:
            t = args[k]
            argv.append(t._storage.data.ptr + t._offset * t._dtype.itemsize)
        elif kind == NUMBER:
            argv.append(convert(args[k]))
        elif kind == HOST_SCALAR:
            argv.append(convert(args[k].item()))
        else:
            argv.append(convert(0))
    for k in plan.scalars:
        argv.append(convert(args[k]))
    argv.extend(plan.tail)
    fn, grid = plan.scalar_fn, plan.scalar_grid
    if plan.vector_fn is not None:
        for k, alignment in plan.aligned:
            if argv[k + 1] % alignment:
                break
        else:
            fn, grid = plan.vector_fn, plan.vector_grid
    packer = plan.packers.get(fn)
    if packer is None:
        packer = plan.packers[fn] = packer_for(fn, argv) or False
    if packer:
        launch_packed(fn, grid, BLOCK, packer, argv, stream)
    else:
        launch(fn, grid, BLOCK, argv, stream)


# ---------------------------------------------------------------------------------------------- operators

_plans: dict[tuple, tuple[Plan, tuple, tuple, DType]] = {}


def _expression(op, args: tuple, compute: DType) -> tuple[Expr, tuple, tuple]:
    """(expr, scalar parameter names, the argument values that select the expression variant)."""
    builder = op.attrs.get("expr_builder")
    if builder is None:
        return op.expr, tuple(n.arg for n in inputs_of(op.expr) if n.op == "scalar"), ()
    variant = tuple(a for k, a in enumerate(args) if k not in op.tensor_idx and not isinstance(a, Tensor))
    return builder(args, compute), (), variant


_op_rest: dict = {}  # op -> (positions of its non-tensor arguments, whether their values pick the expression)


def _op_plan(op, args: tuple, device) -> tuple[Plan, tuple, tuple, DType]:
    """The plan of an operator call, and its output's shape, strides and dtype."""
    rest = _op_rest.get(op)
    if rest is None:
        rest = _op_rest[op] = (tuple(k for k in range(len(op.schema.params)) if k not in op.tensor_idx),
                               "expr_builder" in op.attrs)
    positions, by_value = rest
    # a plan holds kernels loaded on one device; Python numbers take the default dtype's category
    key = (op, device.index, get_default_dtype(), *[_describe(args[k]) for k in op.tensor_idx],
           *[args[k] if by_value else type(args[k]) for k in positions])
    entry = _plans.get(key)
    if entry is None:
        entry = _plans[key] = _plan_op(op, args, device)
    return entry


def run_pointwise(op, args: tuple, device):
    """Run a pointwise operator: a new contiguous output of the broadcast shape."""
    plan, shape, strides, out_dtype = _op_plan(op, args, device)
    stream = stream_handle(device.index)
    out = empty_fast(shape, strides, plan.numel, out_dtype, device, stream)
    if plan.numel:
        execute(plan, args, out, stream)
    return out


def run_pointwise_into(op, args: tuple, device, out: Tensor) -> Tensor | None:
    """Run a pointwise operator writing straight into ``out``, an in-place op's target: when the new output
    would have ``out``'s shape, strides and dtype, ``out`` is aligned for the vector kernel, and no other input
    shares its memory (each thread reads element i of ``out`` before writing it, so ``out`` itself may be an
    input). None when the caller must write the result back itself."""
    plan, shape, strides, out_dtype = _op_plan(op, args, device)
    if out_dtype is not out._dtype or shape != out._shape or strides != out._strides:
        return None
    storage = out._storage
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a is not out and a._storage is storage:
            return None
    if plan.numel:
        if plan.vector_fn is not None and (storage.data.ptr + out._offset * out._dtype.itemsize) % 16:
            return None
        execute(plan, args, out, stream_handle(device.index))
    return out


def kernel_prefix(op, expr: Expr) -> str:
    """The operator's name, plus a digest of the expression for operators whose expression has variants."""
    if "expr_builder" not in op.attrs:
        return op.name
    import hashlib

    return f"{op.name}_{hashlib.sha1(render_text(expr).encode()).hexdigest()[:6]}"


def op_geometry(op, args: tuple):
    """(compute dtype, expr, scalar names, described inputs, output (dtype, shape, strides)) of an op call."""
    out_dtype, compute = op.dtype_rule(op, args)
    expr, scalar_names, _ = _expression(op, args, compute)
    shapes = [args[k]._shape for k in op.tensor_idx if type(args[k]) is Tensor]
    shape = S.broadcast_shapes(*shapes, op=op.name) if shapes else ()
    described = [_describe(args[k]) for k in op.tensor_idx]
    return compute, expr, scalar_names, described, (out_dtype, shape, S.contiguous_strides(shape))


def _plan_op(op, args: tuple, device) -> tuple[Plan, tuple, tuple, DType]:
    compute, expr, scalar_names, described, out = op_geometry(op, args)
    names = op.param_names()
    scalar_index = [names.index(s) for s in scalar_names]
    plan = make_plan(kernel_prefix(op, expr), (expr,), compute, described, list(op.tensor_idx), scalar_index,
                     scalar_names, out, device.index)
    return plan, out[1], out[2], out[0]


_copy_plans: dict[tuple, Plan] = {}


def elementwise(name: str, expr: Expr, compute: DType, inputs: list, out: Tensor, saturate: bool = False) -> Tensor:
    """Write ``expr`` over ``inputs`` (tensors on ``out``'s device, or numbers) into the existing ``out``,
    whatever its strides: the kernel behind copies, casts, fills and in-place writes."""
    described = [_describe(x) for x in inputs]
    key = (name, out._device.index, expr, compute, saturate, out._dtype, out._shape, out._strides, *described)
    plan = _copy_plans.get(key)
    if plan is None:
        plan = _copy_plans[key] = make_plan(name, (expr,), compute, described, list(range(len(inputs))), [], (),
                                            (out._dtype, out._shape, out._strides), out._device.index, saturate)
    if plan.numel:
        execute(plan, tuple(inputs), out, stream_handle(out._device.index))
    return out

