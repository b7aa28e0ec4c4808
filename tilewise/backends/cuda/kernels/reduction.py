"""Reductions on CUDA: sum, prod, amax, amin, any, all over any set of dims, and the arg-reductions.

[Note: reduction schedule]
A reduction launch is a one-nest kernel IR (``codegen.kernel_ir``): the kept dims, merged to the fewest
their strides allow, are the *outer* dims of the domain (one output each) and the reduced dims, merged
likewise and in row-major order (argmax reports row-major positions), the *inner* ones; one load, one
``Reduce`` (``argmax``/``argmin`` keep the winner's position too) and the per-row stores. Sizes and strides
are by-value arguments, so the kernel is rendered and compiled once per specialisation (dtypes, combiner,
ranks, 32- or 64-bit indexing, whether the innermost reduced or kept dim has stride 1, the block size, the
strategy, splitting) by ``codegen``'s CUDA scheduler and renderer, like a compiled kernel. What depends on
the sizes is decided here when a plan is made, and passed to the scheduler as ``Knobs``:

* the strategy: ``rows`` (a block per output row: coalesced loads, warp shuffles, one shared-memory step
  across warps) when the reduced elements are adjacent in memory and there are at least 32 of them, or when
  neither the reduced nor the kept elements are adjacent; else ``columns`` (32 adjacent outputs per block,
  the reduced elements spread over the block's warps, combined through shared memory);
* the block size: a row's threads, a few elements each; a column block's warps, up to 8;
* splitting: a reduction with too few outputs for 4 blocks per SM is split over blocks (``tw_split`` blocks per
  row or group of columns, ``tw_chunk`` elements each, given at launch); each writes its partial results in
  the accumulator dtype, and a second launch (itself a row reduction over them) combines them in order: no
  atomics, so results are deterministic. Arg-reductions are never split;
* 16-byte loads along a contiguous reduced dim (``rows`` only): a second variant of the kernel, launched when
  the input's address is aligned (its row strides are multiples of the vector, which the plan checks), with
  its loop unrolled as many times as a thread's trips over the row (up to 4), so all of a short row's loads
  are in flight at once.

Plans are cached per (operator, dtypes, shape, strides, dims), like pointwise plans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, empty_fast, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.codegen.kernel_ir import ARG_COMBINERS, Argument, Index, Kernel, Load, Nest, Param, Reduce, Store, cast
from tilewise.codegen.render.cstyle import SUFFIX, compute_of
from tilewise.codegen.render.cuda import accumulator, identity
from tilewise.codegen.render.kernel_cuda import render_source
from tilewise.codegen.schedule import KernelSchedule, Knobs, schedule_cuda
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.ops.expr import Expr
from tilewise.tensor import Tensor

_INT32_LIMIT = 2**31 - 1 - (1 << 16)  # 32-bit indexing leaves room for a loop's position past the end
ROWS, COLUMNS = "rows", "columns"


@dataclass
class PassSpec:
    """One launch of a reduction: its schedule, grid, block and argument tail, and optionally a 16-byte-load
    variant usable when the input's address is a multiple of ``align`` bytes."""

    spec: KernelSchedule
    grid: int
    block: int
    tail: tuple[int, ...]  # sizes, strides[, split, chunk]
    vector: KernelSchedule | None = None
    vector_tail: tuple[int, ...] = ()
    align: int = 0


@dataclass
class Pass:
    fn: object
    grid: int
    block: int
    tail: tuple[int, ...]
    vector_fn: object = None
    vector_tail: tuple[int, ...] = ()
    align: int = 0


@dataclass
class ReductionPlan:
    first: Pass
    second: Pass | None  # combines the partial results when the first pass was split
    partial_shape: tuple[int, int]
    acc: DType
    out_shape: tuple  # the kept dims, in order
    n_inner: int
    combiner: str


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _sm_count(device: int) -> int:
    from tilewise.backends.cuda.runtime import get_device_properties

    return get_device_properties(device).multi_processor_count


def _geometry(shape: tuple, strides: tuple, dims: tuple[int, ...]):
    """The kept and the reduced dims, each merged as far as their strides allow: (sizes, strides) of each."""
    kept = [d for d in range(len(shape)) if d not in dims]
    outer, (outer_strides,) = S.coalesce(tuple(shape[d] for d in kept), tuple(strides[d] for d in kept))
    inner, (inner_strides,) = S.coalesce(tuple(shape[d] for d in dims), tuple(strides[d] for d in dims))
    if not inner:  # nothing (or only size-1 dims) reduced: one element per row, at a symbolic size of 1
        inner, inner_strides = (1,), (0,)
    return outer, outer_strides, inner, inner_strides


def reduction_kernel(name: str, combiner: str, dtype: DType, acc: DType, output: DType | None, indices: bool,
                     outer_rank: int, inner_rank: int, unit_outer: bool, unit_inner: bool, index: str) -> Kernel:
    """The kernel IR of a reduction over ``inner_rank`` symbolic dims for each point of ``outer_rank`` kept ones
    (see [Note: reduction schedule]); ``unit_*``: the innermost dim of that kind has stride 1."""
    outer = [f"osize{d}" for d in range(outer_rank)]
    inner = [f"isize{d}" for d in range(inner_rank)]
    ostrides = [1 if unit_outer and d == outer_rank - 1 else f"ostride{d}" for d in range(outer_rank)]
    istrides = [1 if unit_inner and d == inner_rank - 1 else f"istride{d}" for d in range(inner_rank)]
    terms = tuple(enumerate(ostrides)) + tuple((outer_rank + d, s) for d, s in enumerate(istrides))
    out_terms = tuple((d, f"ocount{d}" if d < outer_rank - 1 else 1) for d in range(outer_rank))
    params = []
    stores = []
    if output is not None:
        params.append(Param("out", output, False, True))
        stores.append(Store(len(params) - 1, Index(0, out_terms), Expr("scalar", (), "acc0"), output, None))
    if indices:
        params.append(Param("out_index", dtypes.int64, False, True))
        stores.append(Store(len(params) - 1, Index(0, out_terms), Expr("scalar", (), "pos0"), dtypes.int64, None))
    params.append(Param("in", dtype, True, False))
    value = Expr("input", (), 0)
    if compute_of(dtype) is not acc:
        value = cast(value, acc)
    nest = Nest(tuple(outer + inner), tuple(range(outer_rank, outer_rank + inner_rank)),
                [Load(len(params) - 1, Index(0, terms), dtype)], [Reduce(combiner, value, acc, 0)], stores)
    arguments = [Argument(n) for n in outer + inner]
    arguments += [Argument(s) for s in ostrides + istrides if type(s) is str]
    arguments += [Argument(s) for _, s in out_terms if type(s) is str]
    return Kernel(name, params, [nest], arguments=arguments, index=index)


def _kernel_name(name, combiner, dtype, acc, output, geometry: tuple, index: str, mode: str, block: int,
                 split: bool) -> str:
    outer_rank, inner_rank, unit_outer, unit_inner = geometry
    value = SUFFIX[output.name] if output is not None else "idx"
    layout = ("c" if unit_outer else "s") + ("c" if unit_inner else "s")
    return (f"tw_{name}_{SUFFIX[dtype.name]}_{SUFFIX[acc.name]}_{value}_{mode}_o{outer_rank}_i{inner_rank}{layout}_"
            f"{'i32' if index == 'int' else 'i64'}_{block}" + ("_split" if split else ""))


def _pass(name: str, combiner: str, dtype: DType, shape: tuple, strides: tuple, dims: tuple[int, ...], acc: DType,
          output: DType | None, indices: bool, sm_count: int, split_allowed: bool = True):
    """The first launch of a reduction (see [Note: reduction schedule]) and its split factor."""
    outer, outer_strides, inner, inner_strides = _geometry(shape, strides, dims)
    n_outer, n_inner = S.numel(outer), S.numel(inner)
    arg = combiner in ARG_COMBINERS
    inner_contiguous = inner_strides[-1] == 1
    outer_contiguous = bool(outer) and outer_strides[-1] == 1
    mode = ROWS if (inner_contiguous and n_inner >= 32) or not (outer_contiguous or n_inner < 32) else COLUMNS
    if mode == ROWS:
        block = min(256, max(32, _pow2_at_least(n_inner) // 8))
        blocks, per_block = n_outer, block * 8
    else:
        block = 32 * min(8, _pow2_at_least(n_inner))
        blocks, per_block = ceil_div(n_outer, 32), block // 32 * 16
    target = 4 * sm_count  # blocks to aim for, rows and columns alike (an 8192x4096 column sum: 16 x SMs 9% slower)
    splits = 1
    if split_allowed and not arg and blocks < target and n_inner > per_block:
        splits = min(ceil_div(target, max(blocks, 1)), ceil_div(n_inner, per_block))
    chunk = ceil_div(n_inner, splits)
    span = max(S.storage_span(shape, strides, 0), n_outer * splits, n_inner)
    index = "int" if span <= _INT32_LIMIT else "long long"
    geometry = (len(outer), len(inner), outer_contiguous, inner_contiguous)
    kernel_name = _kernel_name(name, combiner, dtype, acc, acc if splits > 1 else output, geometry, index, mode, block,
                               splits > 1)
    ir = reduction_kernel(kernel_name, combiner, dtype, acc, acc if splits > 1 else output, indices and splits == 1,
                          *geometry, index)
    # columns: each thread keeps 8 loads of one element in flight (4 left half-width columns at 46% of copy)
    knobs = Knobs(block=block, strategy=mode, split=splits > 1, unroll=0 if arg else (8 if mode == COLUMNS else 4))
    ocount = S.contiguous_strides(outer)[:-1]
    sizes = (*outer, *inner, *(s for s, u in zip(outer_strides, _units(len(outer), outer_contiguous)) if not u),
             *(s for s, u in zip(inner_strides, _units(len(inner), inner_contiguous)) if not u), *ocount)
    split_args = (splits, chunk) if splits > 1 else ()
    first = PassSpec(schedule_cuda(ir, replace(knobs, vector=1)), blocks * splits, block,
                     (*sizes, *split_args))
    vector = schedule_cuda(ir, knobs)
    width = vector.nests[0].cuda.vector
    if (mode == ROWS and len(inner) == 1 and inner_contiguous and width > 1 and n_inner >= 4 * width
            and all(st % width == 0 for st in outer_strides)):
        vector_chunk = ceil_div(chunk, width) * width
        trips = ceil_div(ceil_div(vector_chunk, width), block)
        unroll = max(1, min(4, trips))
        vector = schedule_cuda(ir, replace(knobs, unroll=unroll))
        vector.kernel = Kernel(f"{kernel_name}_v{width}u{unroll}", ir.params, ir.nests, arguments=ir.arguments,
                               index=ir.index)
        first.vector, first.align = vector, width * dtype.itemsize
        first.vector_tail = (*sizes, *((splits, vector_chunk) if splits > 1 else ()))
    return first, (n_outer, splits)


def _units(rank: int, unit: bool) -> list[bool]:
    """Which of ``rank`` strides are the literal 1 of a contiguous innermost dim (no argument for them)."""
    return [unit and d == rank - 1 for d in range(rank)]


def reduction_specs(name: str, combiner: str, dtype: DType, shape: tuple, strides: tuple, dims: tuple[int, ...],
                    acc: DType, output: DType | None, indices: bool, sm_count: int):
    """The passes of a reduction, plus the kept shape, the partial buffer's shape and the reduced element count
    (see [Note: reduction schedule])."""
    outer_shape = tuple(size for d, size in enumerate(shape) if d not in dims)
    n_inner = S.numel(tuple(shape[d] for d in dims))
    first, (n_outer, splits) = _pass(name, combiner, dtype, shape, strides, dims, acc, output, indices, sm_count)
    passes = [first]
    if splits > 1:  # combine the partial results: a row reduction of the [n_outer, splits] buffer, not split again
        second, _ = _pass(name, combiner, acc, (n_outer, splits), (splits, 1), (1,), acc, output, False, sm_count,
                          split_allowed=False)
        passes.append(second)
    return passes, outer_shape, (n_outer, splits), n_inner


def plan_reduction(name: str, combiner: str, x: Tensor, dims: tuple[int, ...], acc: DType, output: DType | None,
                   indices: bool) -> ReductionPlan:
    device = x._device.index
    passes, out_shape, partial_shape, n_inner = reduction_specs(name, combiner, x._dtype, x._shape, x._strides, dims,
                                                                acc, output, indices, _sm_count(device))

    def loaded(sched: KernelSchedule | None):
        return None if sched is None else load(render_source(sched), sched.kernel.name, device)

    loaded = [Pass(loaded(p.spec), p.grid, p.block, p.tail, loaded(p.vector), p.vector_tail, p.align)
              for p in passes]
    return ReductionPlan(loaded[0], loaded[1] if len(loaded) > 1 else None, partial_shape, acc, out_shape, n_inner,
                         combiner)


_plans: dict[tuple, ReductionPlan] = {}


def reduce(name: str, combiner: str, x: Tensor, dims: tuple[int, ...], acc: DType, output: DType | None,
           indices: bool = False, shape: tuple | None = None) -> tuple[Tensor | None, Tensor | None]:
    """Reduce ``x`` over ``dims`` (normalised, sorted); returns (values, indices), contiguous, shaped like the
    kept dims or like ``shape`` (the same elements, e.g. with keepdim's 1s)."""
    key = (name, combiner, x._device.index, x._dtype, x._shape, x._strides, dims, acc, output, indices)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = plan_reduction(name, combiner, x, dims, acc, output, indices)
    return execute(plan, x, output, indices, plan.out_shape if shape is None else shape)


def execute(plan: ReductionPlan, x: Tensor, output: DType | None, indices: bool, shape: tuple):
    device = x._device
    stream = stream_handle(device.index)
    strides, numel = S.contiguous_strides(shape), S.numel(shape)
    values = empty_fast(shape, strides, numel, output, device, stream) if output is not None else None
    positions = empty_fast(shape, strides, numel, dtypes.int64, device, stream) if indices else None
    if numel == 0:
        return values, positions
    if plan.n_inner == 0:
        from tilewise.backends.cuda.kernels.creation import fill

        fill(values, identity(plan.combiner, plan.acc))
        return values, positions
    x_ptr = data_ptr(x)
    if plan.second is None:
        outs = [data_ptr(t) for t in (values, positions) if t is not None]
        _launch(plan.first, outs, x_ptr, stream)
        return values, positions
    partial = empty(plan.partial_shape, plan.acc, device)
    _launch(plan.first, [data_ptr(partial)], x_ptr, stream)
    _launch(plan.second, [data_ptr(values)], data_ptr(partial), stream)
    return values, positions


def _launch(p: Pass, outs: list[int], x_ptr: int, stream: int) -> None:
    """Launch pass ``p`` reading ``x_ptr``: its 16-byte-load variant where that address is aligned for it."""
    fn, tail = p.fn, p.tail
    if p.vector_fn is not None and x_ptr % p.align == 0:
        fn, tail = p.vector_fn, p.vector_tail
    launch(fn, p.grid, p.block, [*outs, x_ptr, *tail], stream)


_COMBINER = {"add": "add", "mul": "mul", "max": "max", "min": "min", "or": "or", "and": "and"}
_op_plans: dict[tuple, tuple] = {}


def run_reduction(op, args: tuple, device: Device) -> Tensor:
    x = args[0]
    key = (op, x._device.index, x._dtype, x._shape, x._strides, *args[1:])  # a plan's kernels are one GPU's
    entry = _op_plans.get(key)
    if entry is None:
        entry = _op_plans[key] = _plan_op(op, args)
    plan, out_dtype, shape = entry
    return execute(plan, x, out_dtype, False, shape)[0]


def _plan_op(op, args: tuple) -> tuple:
    x = args[0]
    names = op.param_names()
    dim = args[1] if len(args) > 1 and names[1] == "dim" else None
    if dim is not None and len(dim) == 0 and op.reduce == "add":
        dims = tuple(range(x.ndim))  # torch: sum(dim=[]) reduces everything
    else:
        dims = S.normalize_dims(dim, x.ndim, op.name)
    keepdim = args[names.index("keepdim")] if "keepdim" in names else False
    out_dtype, compute = op.dtype_rule(op, args)
    combiner = _COMBINER[op.reduce]
    acc = accumulator(combiner, x._dtype, compute)
    key = (op.name, combiner, x._device.index, x._dtype, x._shape, x._strides, dims, acc, out_dtype, False)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = plan_reduction(op.name, combiner, x, dims, acc, out_dtype, False)
    return plan, out_dtype, S.reduced_shape(x._shape, dims, keepdim)


def _arg_reduce(name: str, combiner: str, x: Tensor, dim, keepdim: bool, values: bool):
    if dim is None:  # an empty x reaches here only along a dim of non-zero size: see [Note: empty reductions]
        dims = tuple(range(x.ndim))
        shape = (1,) * x.ndim if keepdim else ()
    else:
        dims = (S.normalize_dim(dim, max(x.ndim, 1), name),) if x.ndim else ()
        shape = S.reduced_shape(x._shape, dims, keepdim)
    output = x._dtype if values else None
    return reduce(name, combiner, x, dims, accumulator(combiner, x._dtype, x._dtype), output, True, shape)


@kernel("argmax")
def argmax(device: Device, self: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg_reduce("argmax", "argmax", self, dim, keepdim, False)[1]


@kernel("argmin")
def argmin(device: Device, self: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg_reduce("argmin", "argmin", self, dim, keepdim, False)[1]


@kernel("max.dim")
def max_dim(device: Device, self: Tensor, dim: int, keepdim: bool = False):
    return _arg_reduce("max", "argmax", self, dim, keepdim, True)


@kernel("min.dim")
def min_dim(device: Device, self: Tensor, dim: int, keepdim: bool = False):
    return _arg_reduce("min", "argmin", self, dim, keepdim, True)
