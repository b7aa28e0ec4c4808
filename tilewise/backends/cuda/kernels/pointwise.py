"""Pointwise operators on CUDA: the declared ``Expr`` as a kernel IR nest, scheduled and rendered by ``codegen``.

[Note: pointwise plans]
A pointwise launch is a one-nest kernel IR (``codegen.kernel_ir``) over a domain of symbolic sizes: one
load per tensor operand, one store, the operator's ``Expr`` between them. It is built, scheduled
(``codegen.schedule``, the ``elements`` strategy) and rendered (``codegen.render.kernel_cuda``) once per
*specialisation* (dtypes, rank after merging dims, the layout of each operand, 32- or 64-bit indexing):
sizes and strides are by-value arguments, so one compile serves every shape. Layouts: ``contiguous`` (the
domain's row-major strides, products of the sizes, which the renderer reads as the element's flat position),
``strided`` (its own ``stride_<name>_<d>`` arguments), ``broadcast`` (one element for all), ``value`` (a
by-value argument ``x<k>``: Python numbers and 0-dim CPU tensors in tensor positions, so ``x * 2`` moves
nothing from the host; a 0-dim CUDA tensor is a broadcast operand read in place). What a call must still
work out — the broadcast shape, merged dims, which kernel, the launch grid, the argument list minus the
pointers — depends only on the inputs' dtypes, shapes and strides, so it is kept in a :class:`Plan` keyed
by exactly those: a repeated call costs a dictionary lookup, an allocation and a launch.

When the domain merges to one dim and an operand walks it contiguously, the schedule moves 16 bytes of the
widest such operand per access (the last, partial vector element by element). A symbolic stride or an
address is not known to be aligned, so each such specialisation is rendered twice: the vector variant, run
when every contiguous operand's address is aligned (checked at launch), and a scalar one (``Knobs(vector=1)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import empty_fast, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, launch, launch_packed, load, packer_for
from tilewise.codegen.kernel_ir import Argument, Index, Kernel, Load, Nest, Param, Store, cast, extent
from tilewise.codegen.render.cstyle import SUFFIX, compute_of
from tilewise.codegen.render.kernel_cuda import render_source
from tilewise.codegen.schedule import KernelSchedule, Knobs, schedule_cuda
from tilewise.dtypes import DType, get_default_dtype
from tilewise.ops import dtype_rules as R
from tilewise.ops.expr import Expr, inputs_of, render_text, substitute, toposort, value_key
from tilewise.tensor import Tensor

BLOCK = 128
_INT32_LIMIT = 2**31 - 1 - (1 << 16)  # 32-bit indexing leaves room for a thread's position past the end
PTR, NUMBER, HOST_SCALAR, ABSENT = 0, 1, 2, 3  # how a plan fills each input's argument
CONTIGUOUS, STRIDED, BROADCAST, VALUE = "contiguous", "strided", "broadcast", "value"


@dataclass
class Plan:
    """Everything about a launch that does not change between calls with the same geometry."""

    vector_fn: object  # the vector variant, or None
    scalar_fn: object
    vector_grid: int
    scalar_grid: int
    inputs: tuple[tuple[int, int], ...]  # (kind, argument index) per input
    scalars: tuple[int, ...]  # argument index of each by-value scalar parameter
    convert: type  # Python type of by-value arguments (the compute dtype's)
    tail: tuple[int, ...]  # sizes, strides
    aligned: tuple[tuple[int, int], ...]  # (pointer position, byte alignment) the vector variant needs
    numel: int
    packers: dict = field(default_factory=dict)  # kernel -> the packer of its arguments (False: the general one)


def kernel_name(prefix: str, layouts, out_layout, rank: int, index: str) -> str:
    codes = {CONTIGUOUS: "c", STRIDED: "s", BROADCAST: "b", VALUE: "v"}
    ins = "".join(SUFFIX[dt.name] + codes[lay] for dt, lay in layouts)
    outs = SUFFIX[out_layout[0].name] + codes[out_layout[1]]
    width = "i32" if index == "int" else "i64"
    return f"tw_{prefix}_{outs}_{ins}_r{rank}_{width}"


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
    """The schedules (scalar and, where the layouts allow, vector) of one launch geometry, and how to call them."""

    scalar: KernelSchedule
    vector: KernelSchedule | None
    aligned: tuple[tuple[int, int], ...]  # (pointer position, byte alignment) for the vector variant
    tail: tuple[int, ...]
    numel: int


def _index(layout: str, name: str, rank: int) -> Index:
    """The index of an operand of ``layout`` over a domain of ``rank`` symbolic dims."""
    if layout == BROADCAST:
        return Index(0, ())
    if layout == CONTIGUOUS:  # row-major strides are products of the sizes: no arguments of their own
        sizes = [f"size{d}" for d in range(rank)]
        return Index(0, tuple((d, extent(sizes[d + 1:])) for d in range(rank)))
    return Index(0, tuple((d, f"stride_{name}_{d}") for d in range(rank)))


def pointwise_kernel(name: str, exprs: tuple[Expr, ...], compute: DType, operands: list[tuple[DType, str]],
                     scalar_names: tuple[str, ...], out: tuple[DType, str], rank: int, index: str,
                     saturate: bool = False) -> Kernel:
    """The kernel IR of an elementwise launch writing ``exprs`` (over the inputs ``operands``, (dtype, layout)
    each, and the scalars ``scalar_names``) to an output of (dtype, layout), over ``rank`` symbolic dims."""
    params = [Param("out0", out[0], False, True)]
    loads, arguments, mapping = [], [], {}
    for k, (dtype, layout) in enumerate(operands):
        if layout == VALUE:
            arguments.append(Argument(f"value{k}", compute))  # not x<k>: the renderer names loads so
            replacement = Expr("scalar", (), f"value{k}")
        else:
            params.append(Param(f"in{k}", dtype, True, False))
            loads.append(Load(len(params) - 1, _index(layout, f"in{k}", rank), dtype))
            replacement = Expr("input", (), len(loads) - 1)
            if compute_of(dtype) is not compute:
                replacement = cast(replacement, compute)
        for e in exprs:
            for n in toposort(e):
                if n.op == "input" and n.arg == k:
                    mapping[id(n)] = replacement
    for s in scalar_names:
        arguments.append(Argument(f"s_{s}", compute))
        for e in exprs:
            for n in toposort(e):
                if n.op == "scalar" and n.arg == s:
                    mapping[id(n)] = Expr("scalar", (), f"s_{s}")
    sizes = tuple(f"size{d}" for d in range(rank))
    arguments += [Argument(s) for s in sizes]
    strided = (["out0"] if out[1] == STRIDED else []) + [f"in{k}" for k, (_, lay) in enumerate(operands)
                                                          if lay == STRIDED]
    arguments += [Argument(f"stride_{n}_{d}") for n in strided for d in range(rank)]
    stores = [Store(0, _index(out[1], "out0", rank), substitute(e, mapping), out[0], None, saturate) for e in exprs]
    return Kernel(name, params, [Nest(sizes, (), loads, [], stores)], arguments=arguments, index=index)


def kernel_specs(name: str, exprs: tuple[Expr, ...], compute: DType, described: list[tuple],
                 scalar_names: tuple[str, ...], out: tuple[DType, tuple, tuple], saturate: bool = False) -> Specs:
    """Specialise an elementwise launch writing ``out`` = (dtype, shape, strides) from inputs ``described``
    (see ``_describe``): merge dims, classify each operand's layout, pick the index width, build the kernel IR
    and schedule its variants."""
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
    rank = max(len(merged_shape), 1)
    if not merged_shape:
        merged_shape, merged = (numel,), [(1,) for _ in merged]
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
    operands = list(zip(in_dtypes, layouts))
    spans = [S.storage_span(merged_shape, tuple(abs(x) for x in st), 0) for st in merged]  # flip: negative strides
    index = "int" if max([numel, *spans]) <= _INT32_LIMIT else "long long"
    strided = ([merged[0]] if out_layout == STRIDED else []) + [
        merged[1 + candidates.index(k)] for k, lay in enumerate(layouts) if lay == STRIDED]
    tail = (*merged_shape, *(s for st in strided for s in st))
    kernel = pointwise_kernel(kernel_name(name, operands, (out_dtype, out_layout), rank, index), exprs, compute,
                              operands, scalar_names, (out_dtype, out_layout), rank, index, saturate)
    scalar = schedule_cuda(kernel, Knobs(block=BLOCK, vector=1))
    vector = schedule_cuda(kernel, Knobs(block=BLOCK))
    aligned = ()
    width = vector.nests[0].cuda.vector
    if width > 1 and numel >= width:
        vector.kernel = Kernel(f"{kernel.name}_v{width}", kernel.params, kernel.nests, arguments=kernel.arguments,
                               index=kernel.index)
        # the pointers walked contiguously (position in the argument list): 16-byte accesses need them aligned
        walked = [0] if out_layout == CONTIGUOUS else []
        walked += [1 + sum(lay != VALUE for _, lay in operands[:k]) for k, (_, lay) in enumerate(operands)
                   if lay == CONTIGUOUS]
        aligned = tuple((pos, width * kernel.params[pos].dtype.itemsize) for pos in walked)
    else:
        vector = None
    return Specs(scalar, vector, aligned, tail, numel)


def make_plan(name: str, exprs: tuple[Expr, ...], compute: DType, described: list[tuple], arg_index: list[int],
              scalar_index: list[int], scalar_names: tuple[str, ...], out: tuple[DType, tuple, tuple],
              device: int, saturate: bool = False) -> Plan:
    """Specialise, render, compile and load the kernels of one launch geometry (see [Note: pointwise plans])."""
    specs = kernel_specs(name, exprs, compute, described, scalar_names, out, saturate)

    def loaded(sched: KernelSchedule | None):
        return None if sched is None else load(render_source(sched), sched.kernel.name, device)

    vector = specs.vector.nests[0].cuda.vector if specs.vector is not None else 1
    return Plan(loaded(specs.vector), loaded(specs.scalar), ceil_div(specs.numel, BLOCK * vector),
                ceil_div(specs.numel, BLOCK), tuple((d[0], a) for d, a in zip(described, arg_index)),
                tuple(scalar_index), python_type(compute), specs.tail, specs.aligned, specs.numel)


def execute(plan: Plan, args: tuple, out: Tensor, stream: int) -> None:
    """Launch ``plan`` writing ``out`` from the bound ``args``: the pointers, then the by-value operands and
    scalars, then the sizes and strides (the kernel's parameter order)."""
    convert = plan.convert
    argv = [out._storage.data.ptr + out._offset * out._dtype.itemsize]
    values = []
    for kind, k in plan.inputs:
        if kind == PTR:
            t = args[k]
            argv.append(t._storage.data.ptr + t._offset * t._dtype.itemsize)
        elif kind == NUMBER:
            values.append(convert(args[k]))
        elif kind == HOST_SCALAR:
            values.append(convert(args[k].item()))
        else:
            values.append(convert(0))
    fn, grid = plan.scalar_fn, plan.scalar_grid
    if plan.vector_fn is not None:
        for pos, alignment in plan.aligned:
            if argv[pos] % alignment:
                break
        else:
            fn, grid = plan.vector_fn, plan.vector_grid
    argv += values
    for k in plan.scalars:
        argv.append(convert(args[k]))
    argv.extend(plan.tail)
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
        expr = op.expr_on("cuda")
        return expr, tuple(n.arg for n in inputs_of(expr) if n.op == "scalar"), ()
    variant = tuple(a for k, a in enumerate(args) if k not in op.tensor_idx and not isinstance(a, Tensor))
    chooser = op.attrs.get("expr_variant")  # a builder that reads an operand's value (pow's exponent) says so
    return builder(args, compute), (), variant + ((chooser(args),) if chooser is not None else ())


_op_rest: dict = {}  # op -> (positions of its non-tensor arguments, whether their values pick the expression)


def _op_plan(op, args: tuple, device) -> tuple[Plan, tuple, tuple, DType]:
    """The plan of an operator call, and its output's shape, strides and dtype."""
    rest = _op_rest.get(op)
    if rest is None:
        rest = _op_rest[op] = (tuple(k for k in range(len(op.schema.params)) if k not in op.tensor_idx),
                               "expr_builder" in op.attrs)
    positions, by_value = rest
    # a plan holds kernels loaded on one device; Python numbers take the default dtype's category
    chooser = op.attrs.get("expr_variant")
    key = (op, device.index, get_default_dtype(), *[_describe(args[k]) for k in op.tensor_idx],
           *[value_key(args[k]) if by_value else type(args[k]) for k in positions], chooser(args) if chooser else None)
    entry = _plans.get(key)
    if entry is None:
        entry = _plans[key] = _plan_op(op, args, device)
    elif _checks_numbers(op, entry[3]) and any(type(args[k]) in (int, float) for k in (*op.tensor_idx, *positions)):
        op.dtype_rule(op, args)  # the key holds a number's type, not its value: the rule refuses one out of range
    return entry


def _checks_numbers(op, out_dtype: DType) -> bool:
    """Whether ``op``'s dtype rule may refuse a Python number by its value for this result dtype: an integer result
    (``int8_tensor + 1000``), or where's and clamp's values beside a half (see [Note: half operands])."""
    return out_dtype.category == dtypes.INT or (
        out_dtype in (dtypes.float16, dtypes.bfloat16) and op.dtype_rule in (R.where_rule, R.clamp_rule))


# [Note: one memory order] Operands that all lie in the same dense order other than row-major (channels-last
# activations, a transpose's copy) are one flat array each, element for element: the kernel runs over them as
# over contiguous 1-d tensors (vector loads, no index arithmetic) and the result takes that order too, as torch's
# stride rule gives it. A strided kernel over such operands walks memory with the innermost logical dim's stride
# (the channel count) and ran a ResNet-50's channels-last ReLUs ten times slower.
def _one_order(tensors) -> tuple | None:
    """The shared (shape, strides) of ``tensors`` (None entries and numbers aside) when they all lie in one dense
    order that is not row-major, else None."""
    layout = None
    for t in tensors:
        if type(t) is not Tensor:
            continue
        if t._device.type == "cpu":
            return None
        here = (t._shape, t._strides)
        if layout is None:
            layout = here
        elif here != layout:
            return None
    if layout is None or S.is_contiguous(*layout) or not S.is_non_overlapping_and_dense(*layout):
        return None
    return layout


def _flat(t):
    """A tensor of ``_one_order``'s operands as the flat array it is."""
    if type(t) is not Tensor:
        return t
    return Tensor._make(t._storage, (S.numel(t._shape),), (1,), t._offset, t._dtype, t._device)


def _flat_args(op, args: tuple) -> tuple:
    tensor_idx = op.tensor_idx
    return tuple(_flat(a) if k in tensor_idx else a for k, a in enumerate(args))


def run_pointwise(op, args: tuple, device):
    """Run a pointwise operator: a new output of the broadcast shape, in the stride order torch gives it."""
    layout = _one_order([args[k] for k in op.tensor_idx])
    if layout is not None:  # see [Note: one memory order]
        flat = _flat_args(op, args)
        plan, _, _, out_dtype = _op_plan(op, flat, device)
        stream = stream_handle(device.index)
        out = empty_fast(layout[0], layout[1], plan.numel, out_dtype, device, stream)
        if plan.numel:
            execute(plan, flat, _flat(out), stream)
        return out
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
    layout = _one_order([args[k] for k in op.tensor_idx] + [out])
    if layout is not None:  # see [Note: one memory order]
        args, out_flat = _flat_args(op, args), _flat(out)
        plan, shape, strides, out_dtype = _op_plan(op, args, device)
        if out_dtype is not out._dtype:
            return None
        storage = out._storage
        for k in op.tensor_idx:
            a = args[k]
            if type(a) is Tensor and a._storage is storage and (a._offset, a._shape) != (out._offset, out_flat._shape):
                return None
        if plan.numel:
            if plan.vector_fn is not None and (storage.data.ptr + out._offset * out._dtype.itemsize) % 16:
                return None
            execute(plan, args, out_flat, stream_handle(device.index))
        return out
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
    expr = _half_numbers_rounded(op, args, expr, compute)
    shapes = [args[k]._shape for k in op.tensor_idx if type(args[k]) is Tensor]
    shape = S.broadcast_shapes(*shapes, op=op.name) if shapes else ()
    described = [_describe(args[k]) for k in op.tensor_idx]
    return compute, expr, scalar_names, described, (out_dtype, shape, _result_strides(op, args, shape))


def _half_numbers_rounded(op, args: tuple, expr: Expr, compute: DType) -> Expr:
    """``expr`` with the numbers that torch's CUDA kernel rounds to the operands' half (``R.half_rounded``; see
    [Note: half operands]) rounded in the kernel: a number travels by value in the compute dtype."""
    rounded = R.half_rounded(op, "cuda")
    common = R.common_half(op, args, op.tensor_idx) if rounded else None
    if common is None:
        return expr
    params = op.schema.params
    mapping = {}
    for node in toposort(expr):
        if node.op == "input":
            k = op.tensor_idx[node.arg]
            a = args[k]
            number = type(a) is not Tensor or a._device.type == "cpu" and a._dtype is not common
            if params[k].name in rounded and a is not None and number:
                mapping[id(node)] = cast(cast(node, common), compute)
        elif node.op == "scalar" and node.arg in rounded:
            mapping[id(node)] = cast(cast(node, common), compute)
    return substitute(expr, mapping) if mapping else expr


def _result_strides(op, args: tuple, shape: tuple) -> tuple:
    """torch's stride order for the result (``strides.pointwise_strides``); Python numbers count as 0-dim. An
    operator declared ``row_major`` (torch's own kernel writes that) is row-major."""
    if op.attrs.get("row_major"):
        return S.contiguous_strides(shape)
    operands = []
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor:
            operands.append((a._shape, a._strides))
        elif a is not None:
            operands.append(S.WRAPPED_NUMBER)
    return S.pointwise_strides(shape, operands)


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
    target = out
    if _one_order([out, *inputs]) is not None:  # see [Note: one memory order]
        inputs, out = [_flat(x) for x in inputs], _flat(out)
    described = [_describe(x) for x in inputs]
    key = (name, out._device.index, expr, compute, saturate, out._dtype, out._shape, out._strides, *described)
    plan = _copy_plans.get(key)
    if plan is None:
        plan = _copy_plans[key] = make_plan(name, (expr,), compute, described, list(range(len(inputs))), [], (),
                                            (out._dtype, out._shape, out._strides), out._device.index, saturate)
    if plan.numel:
        execute(plan, tuple(inputs), out, stream_handle(out._device.index))
    return target

