"""Reductions on CUDA: sum, prod, amax, amin, any, all over any set of dims, and the arg-reductions.

[Note: reduction schedule]
The kept dims become the *outer* index space (one output each) and the reduced dims the *inner* one; each
is merged to the fewest dims its strides allow, keeping row-major order (argmax reports row-major
positions). When the innermost reduced dim is contiguous, a block reduces one row (``ROW``: coalesced
loads, warp shuffles, one shared-memory step across warps); when the outputs are the contiguous ones, 32
adjacent outputs share a block and the reduced elements spread over ``threadIdx.y`` (``COLUMN``).
A reduction with too few outputs to fill the GPU is split over ``blockIdx.y``: the first pass writes
partial results in the accumulator dtype, a second pass combines them (no atomics, so results are
deterministic). Plans are cached per (operator, dtypes, shape, strides, dims), like pointwise plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise import _strides as S
from tilewise import dtypes
from tilewise.backends.cuda.device_memory import data_ptr, empty, empty_fast, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.codegen.render import COLUMN, ROW, ReductionKernel, render_reduction
from tilewise.codegen.render.cstyle import SUFFIX
from tilewise.codegen.render.cuda import accumulator, identity
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

_INT32_LIMIT = 2**31 - 1
_MAX_GRID_Y = 65535


@dataclass
class PassSpec:
    """One launch of a reduction: its kernel, grid and argument tail, and optionally a 16-byte-load variant
    usable when the input's address is a multiple of ``align`` bytes."""

    spec: ReductionKernel
    grid: tuple[int, int]
    tail: tuple[int, ...]  # n_outer, n_inner, chunk, outer sizes/strides, inner sizes/strides
    vector: ReductionKernel | None = None
    vector_tail: tuple[int, ...] = ()
    align: int = 0


@dataclass
class Pass:
    fn: object
    grid: tuple[int, int]
    block: tuple[int, int]
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
    kept = [d for d in range(len(shape)) if d not in dims]
    outer_shape = tuple(shape[d] for d in kept)
    outer, (outer_strides,) = S.coalesce(outer_shape, tuple(strides[d] for d in kept))
    inner, (inner_strides,) = S.coalesce(tuple(shape[d] for d in dims), tuple(strides[d] for d in dims))
    return outer_shape, outer, outer_strides, inner, inner_strides


def reduction_specs(name: str, combiner: str, dtype: DType, shape: tuple, strides: tuple, dims: tuple[int, ...],
                    acc: DType, output: DType | None, indices: bool, sm_count: int):
    """The passes of a reduction as (kernel spec, grid, tail) pairs, plus the kept shape, the partial
    buffer's shape and the reduced element count (see [Note: reduction schedule])."""
    outer_shape, outer, outer_strides, inner, inner_strides = _geometry(shape, strides, dims)
    n_outer, n_inner = S.numel(outer), S.numel(inner)
    arg = combiner in ("argmax", "argmin")
    inner_contiguous = bool(inner) and inner_strides[-1] == 1
    outer_contiguous = bool(outer) and outer_strides[-1] == 1
    mode = ROW if (inner_contiguous and n_inner >= 32) or not (outer_contiguous or n_inner < 32) else COLUMN
    if mode == ROW:
        block = (min(256, max(32, _pow2_at_least(n_inner) // 8)), 1)
        blocks, per_block = n_outer, block[0] * 8
    else:
        block = (32, min(8, _pow2_at_least(n_inner)))
        blocks, per_block = ceil_div(n_outer, 32), block[1] * 16
    target = (4 if mode == ROW else 16) * sm_count
    splits = 1
    if not arg and blocks < target and n_inner > per_block:
        splits = min(ceil_div(target, max(blocks, 1)), ceil_div(n_inner, per_block), _MAX_GRID_Y)
    chunk = ceil_div(n_inner, splits)
    span = max(S.storage_span(shape, strides, 0), n_outer * splits, n_inner)
    index = "int32" if span <= _INT32_LIMIT else "int64"
    first_out = acc if splits > 1 else output
    geometry = (*outer, *outer_strides, *inner, *inner_strides)
    first = PassSpec(_spec(name, combiner, dtype, acc, first_out, indices, len(outer), len(inner), index, mode, block),
                     (blocks, splits), (n_outer, n_inner, chunk, *geometry))
    vector = min(8, 16 // dtype.itemsize)
    if mode == ROW and len(inner) == 1 and inner_strides[0] == 1 and vector > 1 and n_inner >= 4 * vector and all(
            st % vector == 0 for st in outer_strides):
        trips = ceil_div(ceil_div(chunk, vector), block[0])
        first.vector = _spec(name, combiner, dtype, acc, first_out, indices, len(outer), 1, index, ROW, block, vector,
                             max(1, min(4, trips)))
        first.vector_tail = (n_outer, n_inner, ceil_div(chunk, vector) * vector, *geometry)
        first.align = vector * dtype.itemsize
    passes = [first]
    if splits > 1:
        passes.append(PassSpec(_spec(name, combiner, acc, acc, output, False, 1, 1, index, ROW, (32, 1)), (n_outer, 1),
                               (n_outer, splits, splits, n_outer, splits, splits, 1)))
    return passes, outer_shape, (n_outer, splits), n_inner


def _spec(name, combiner, input_dtype, acc, output, indices, outer_rank, inner_rank, index, mode, block,
          vector: int = 1, unroll: int = 4) -> ReductionKernel:
    width = "i32" if index == "int32" else "i64"
    kernel_name = (f"tw_{name}_{SUFFIX[input_dtype.name]}_{SUFFIX[acc.name]}_"
                   f"{SUFFIX[output.name] if output is not None else 'idx'}_{mode}_o{outer_rank}_i{inner_rank}_"
                   f"{width}_{block[0]}x{block[1]}" + (f"_v{vector}u{unroll}" if vector > 1 else ""))
    return ReductionKernel(kernel_name, combiner, input_dtype, acc, output, indices, outer_rank, inner_rank, index,
                           mode, block, vector, unroll)


def plan_reduction(name: str, combiner: str, x: Tensor, dims: tuple[int, ...], acc: DType, output: DType | None,
                   indices: bool) -> ReductionPlan:
    device = x._device.index
    passes, out_shape, partial_shape, n_inner = reduction_specs(name, combiner, x._dtype, x._shape, x._strides, dims,
                                                                acc, output, indices, _sm_count(device))
    def loaded(spec: ReductionKernel | None):
        return None if spec is None else load(render_reduction(spec), spec.name, device)

    loaded = [Pass(loaded(p.spec), p.grid, p.spec.block, p.tail, loaded(p.vector), p.vector_tail, p.align)
              for p in passes]
    return ReductionPlan(loaded[0], loaded[1] if len(loaded) > 1 else None, partial_shape, acc, out_shape, n_inner,
                         combiner)


_plans: dict[tuple, ReductionPlan] = {}


def reduce(name: str, combiner: str, x: Tensor, dims: tuple[int, ...], acc: DType, output: DType | None,
           indices: bool = False, shape: tuple | None = None) -> tuple[Tensor | None, Tensor | None]:
    """Reduce ``x`` over ``dims`` (normalised, sorted); returns (values, indices), contiguous, shaped like the
    kept dims or like ``shape`` (the same elements, e.g. with keepdim's 1s)."""
    key = (name, combiner, x._dtype, x._shape, x._strides, dims, acc, output, indices)
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
    first = plan.first
    x_ptr = data_ptr(x)
    fn, tail = first.fn, first.tail
    if first.vector_fn is not None and x_ptr % first.align == 0:
        fn, tail = first.vector_fn, first.vector_tail
    if plan.second is None:
        outs = [data_ptr(t) for t in (values, positions) if t is not None]
        launch(fn, first.grid, first.block, [*outs, x_ptr, *tail], stream)
        return values, positions
    partial = empty(plan.partial_shape, plan.acc, device)
    launch(fn, first.grid, first.block, [data_ptr(partial), x_ptr, *tail], stream)
    second = plan.second
    launch(second.fn, second.grid, second.block, [data_ptr(values), data_ptr(partial), *second.tail], stream)
    return values, positions


_COMBINER = {"add": "add", "mul": "mul", "max": "max", "min": "min", "or": "or", "and": "and"}
_op_plans: dict[tuple, tuple] = {}


def run_reduction(op, args: tuple, device: Device) -> Tensor:
    x = args[0]
    key = (op, x._dtype, x._shape, x._strides, *args[1:])
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
    if op.reduce in ("max", "min") and any(x._shape[d] == 0 for d in dims):
        raise IndexError(f"{op.name}(): Expected reduction dim {dims[0]} to have non-zero size; the input has shape "
                         f"{list(x._shape)}. Specify an identity or reduce over a non-empty dim.")
    combiner = _COMBINER[op.reduce]
    acc = accumulator(combiner, x._dtype, compute)
    key = (op.name, combiner, x._dtype, x._shape, x._strides, dims, acc, out_dtype, False)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = plan_reduction(op.name, combiner, x, dims, acc, out_dtype, False)
    return plan, out_dtype, S.reduced_shape(x._shape, dims, keepdim)


def _arg_reduce(name: str, combiner: str, x: Tensor, dim, keepdim: bool, values: bool):
    if x.numel() == 0:
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0, or the reduced "
                           "dim to be non-empty")
    if dim is None:
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
