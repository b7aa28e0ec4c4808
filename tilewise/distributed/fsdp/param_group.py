"""One ``fully_shard`` call's parameters: their dim-0 shards, the all-gather before use and the reduce-scatter
of their gradients.

[Note: FSDP parameters] Each managed parameter is replaced, in every module that holds it, by its rank's
rows: the full tensor is cut along dim 0 into ``world_size`` chunks of ``ceil(rows / world_size)`` rows (as
``torch.chunk`` cuts it, so the last ranks may hold fewer rows, or none), and the shard is an ordinary
Parameter holding those rows, with a :class:`ShardSpec` saying where they sit in the full tensor and a
``full_tensor()`` method that gathers it (what checkpoints read). A shard is padded with zero rows to the chunk
size only on its way into a collective, so an optimizer over the shards sees exactly the rank's elements.

For compute, each parameter has one *unsharded* leaf tensor, kept for the life of the module: the group's one
all-gather (every parameter's padded rows, flattened one after the other, so one collective per block) is
copied out into each leaf's full data (``leaf.data = gathered``); resharding takes it away (``leaf.data =
empty``). Autograd
accumulates the parameter's gradient into that leaf; once every leaf of the group has its gradient, the group
reduce-scatters them (summed, then divided by the world size) into the shards' ``.grad``. Because the leaf
object never changes, what autograd saved for backward can refer to it by identity: while a root forward runs,
a saved-tensor hook (:func:`pack_saved`) replaces a saved tensor that lives in an unsharded parameter's memory
by a reference (:class:`SavedParameter`), and unpacking gives a view of the leaf's data at that time, gathered
again before the block's backward. So resharding after forward truly frees the gathered parameters.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import MethodType
from typing import Any

from tilewise.autograd.grad_mode import no_grad
from tilewise.nn.parameter import Parameter
from tilewise.ops.creation import empty, zeros
from tilewise.ops.registry import call
from tilewise.tensor import Tensor


def _dist():
    import tilewise.distributed as dist  # the package imports this module, so it is read at call time

    return dist


@dataclass(frozen=True)
class ShardSpec:
    """Where a rank's shard sits in the full tensor: rows ``[start, stop)`` of ``full_shape``, cut in chunks of
    ``rows_per_rank`` rows over ``world_size`` ranks of ``group``."""

    full_shape: tuple[int, ...]
    rank: int
    world_size: int
    rows_per_rank: int
    group: Any = None

    @property
    def start(self) -> int:
        return min(self.rank * self.rows_per_rank, self.full_shape[0])

    @property
    def stop(self) -> int:
        return min(self.start + self.rows_per_rank, self.full_shape[0])

    @property
    def offsets(self) -> tuple[int, ...]:
        return (self.start,) + (0,) * (len(self.full_shape) - 1)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (self.stop - self.start, *self.full_shape[1:])


def shard_spec(full_shape: tuple[int, ...], rank: int, world_size: int, group=None) -> ShardSpec:
    rows = -(-full_shape[0] // world_size)
    return ShardSpec(tuple(full_shape), rank, world_size, rows, group)


def padded_rows(t: Tensor, rows: int) -> Tensor:
    """``t`` with zero rows appended up to ``rows`` rows, contiguous (``t`` itself when it already is)."""
    missing = rows - t.shape[0]
    if missing == 0:
        return t.contiguous()
    return call("cat", [t, zeros((missing, *t.shape[1:]), dtype=t.dtype, device=t.device)])


def gather_rows(local: Tensor, spec: ShardSpec, *, async_op: bool = False):
    """Start (or run) the all-gather of the ranks' padded shards: ``(buffer, work, input)``; the full tensor is
    then ``buffer[:rows]``. The caller holds ``input`` until the work is waited on: on a GPU the collective
    reads it on its own stream, and freeing it earlier would let the allocator hand its memory out meanwhile."""
    padded = padded_rows(local, spec.rows_per_rank)
    buffer = empty((spec.rows_per_rank * spec.world_size, *spec.full_shape[1:]), dtype=local.dtype,
                   device=local.device)
    work = _dist().all_gather_into_tensor(buffer, padded, group=spec.group, async_op=async_op)
    return buffer, work, padded


def _row_numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape[1:]:
        n *= size
    return n


def full_tensor(shard: Tensor) -> Tensor:
    """The whole parameter a shard is part of, gathered from every rank (a collective: call it on all ranks)."""
    spec = shard.__dict__["_fsdp_shard"]
    with no_grad():
        buffer, _, _ = gather_rows(shard.detach(), spec)
    return buffer[:spec.full_shape[0]]


def mark_shard(shard: Tensor, spec: ShardSpec) -> Tensor:
    """Give a shard (a parameter, or a tensor of a state dict) its spec and ``full_tensor()``."""
    shard._fsdp_shard = spec
    shard.full_tensor = MethodType(full_tensor, shard)  # bound: a deepcopy rebinds it to the copy
    return shard


class SavedParameter:
    """What autograd keeps, in place of a saved tensor that lives in an unsharded parameter's memory: the
    parameter and the tensor's geometry in it (None: the leaf itself)."""

    __slots__ = ("param", "geometry")

    def __init__(self, param: FSDPParam, geometry):
        self.param, self.geometry = param, geometry


# id(storage) of each gathered parameter, and id of each unsharded leaf -> its FSDPParam
_UNSHARDED_STORAGES: weakref.WeakValueDictionary[int, FSDPParam] = weakref.WeakValueDictionary()
_LEAVES: weakref.WeakValueDictionary[int, FSDPParam] = weakref.WeakValueDictionary()


def pack_saved(t: Tensor):
    param = _LEAVES.get(id(t))
    if param is not None and param.unsharded is t:
        return SavedParameter(param, None)
    param = _UNSHARDED_STORAGES.get(id(t._storage)) if t._storage is not None else None
    if param is None:
        return t
    return SavedParameter(param, (tuple(t.shape), tuple(t.stride()), t.storage_offset()))


def unpack_saved(packed):
    if not isinstance(packed, SavedParameter):
        return packed
    param = packed.param
    param.group.unshard()  # normally done by the block's pre-backward; a no-op then
    if packed.geometry is None:
        return param.unsharded
    shape, strides, offset = packed.geometry
    return param.unsharded.detach().as_strided(shape, strides, offset)


class FSDPParam:
    """One managed parameter: its shard (what the modules and the optimizer hold) and its unsharded leaf."""

    def __init__(self, param: Tensor, usages: list[tuple[Any, str]], spec: ShardSpec, param_dtype, reduce_dtype,
                 offload: bool):
        self.usages = usages
        self.spec = spec
        self.device = param.device
        self.compute_dtype = param_dtype or param.dtype
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        self.offload = offload
        rows = param.detach()[spec.start:spec.stop].clone()
        if offload:
            rows = rows.to("cpu")
        self.sharded = mark_shard(Parameter(rows, requires_grad=param.requires_grad), spec)
        self.unsharded = empty(0, dtype=self.compute_dtype, device=self.device).requires_grad_(param.requires_grad)
        self.group: FSDPParamGroup | None = None
        _LEAVES[id(self.unsharded)] = self
        if param.requires_grad:
            self.unsharded.register_post_accumulate_grad_hook(self._grad_accumulated)
        param._fsdp_moved_to = spec  # marks the original: a second fully_shard finding it reports sharing
        self.use_sharded()

    @property
    def requires_grad(self) -> bool:
        return self.sharded.requires_grad

    def use_sharded(self) -> None:
        for module, name in self.usages:
            module._parameters[name] = self.sharded

    def use_unsharded(self) -> None:
        for module, name in self.usages:
            module._parameters[name] = self.unsharded

    # ------------------------------------------------------------------ all-gather
    def padded_local(self) -> Tensor:
        """This rank's rows as the all-gather sends them: on the compute device, in the compute dtype, padded."""
        with no_grad():
            local = self.sharded.detach()
            if local.device != self.device:
                local = local.to(self.device)
            if local.dtype != self.compute_dtype:
                local = local.to(self.compute_dtype)
            return padded_rows(local, self.spec.rows_per_rank)

    @property
    def padded_numel(self) -> int:
        return self.spec.rows_per_rank * _row_numel(self.spec.full_shape)

    def set_gathered(self, full: Tensor) -> None:
        """``full`` (the gathered rows of every rank, padding included) becomes the unsharded leaf's data."""
        self.unsharded.data = full[:self.spec.full_shape[0]]
        _UNSHARDED_STORAGES[id(self.unsharded._storage)] = self

    def free_unsharded(self) -> None:
        _UNSHARDED_STORAGES.pop(id(self.unsharded._storage), None)
        self.unsharded.data = empty(0, dtype=self.compute_dtype, device=self.device)

    # ------------------------------------------------------------------ gradients
    def _grad_accumulated(self, leaf: Tensor) -> None:
        if self.group is not None:
            self.group.grad_accumulated(self)

    def take_padded_grad(self) -> Tensor:
        """The leaf's gradient (taken from it) in the reduce dtype, padded to every rank's rows, flattened per
        rank: shape ``(world_size, rows_per_rank * row size)``."""
        spec = self.spec
        grad = self.unsharded.grad
        self.unsharded.grad = None
        padded = padded_rows(grad.to(self.reduce_dtype), spec.rows_per_rank * spec.world_size)
        return padded.reshape(spec.world_size, -1)

    def add_reduced_grad(self, summed: Tensor) -> None:
        """Add this rank's rows of the summed gradient (flat, padded), averaged over the ranks, to ``.grad``."""
        spec = self.spec
        rows = summed.view(spec.rows_per_rank, *spec.full_shape[1:])[:spec.stop - spec.start]
        mine = (rows / spec.world_size).to(self.sharded.dtype)
        if self.offload:
            mine = mine.to("cpu")
        if self.sharded.grad is None:
            self.sharded.grad = mine.contiguous()
        else:
            self.sharded.grad.add_(mine)


def _check_one_gather(params: list[FSDPParam]) -> None:
    """One flat all-gather serves a group whose parameters share compute dtype, device and process group."""
    first = params[0]
    for p in params[1:]:
        if (p.compute_dtype, p.device) != (first.compute_dtype, first.device):
            raise NotImplementedError(
                f"fully_shard: parameters of {first.compute_dtype} on {first.device} and of {p.compute_dtype} on "
                f"{p.device} in one module: a fully_shard group gathers its parameters as one buffer; apply "
                "fully_shard to submodules whose parameters share a dtype and device, or set "
                "MixedPrecisionPolicy(param_dtype=...) to gather them all in one dtype")


class FSDPParamGroup:
    """The parameters of one ``fully_shard`` call, gathered and resharded together."""

    def __init__(self, params: list[FSDPParam], reshard_after_forward: bool):
        self.params = params
        self.reshard_after_forward = reshard_after_forward
        self.reshard_after_backward = True
        self.requires_gradient_sync = True
        self.unsharded = False
        self.gathering = False
        self.needs_post_backward = False
        self._accumulated: set[int] = set()
        self._gathering = None
        _check_one_gather(params)
        for p in params:
            p.group = self

    def unshard(self, async_op: bool = False) -> None:
        if self.unsharded:
            return
        if not self.gathering:
            self._start_all_gather()
            self.gathering = True
        if not async_op:
            self.wait_for_unshard()

    def _start_all_gather(self) -> None:
        """One all-gather for the whole group: every parameter's padded rows, flattened one after the other."""
        first = self.params[0]
        with no_grad():
            sent = call("cat", [p.padded_local().reshape(-1) for p in self.params])
            received = empty(sent.numel() * first.spec.world_size, dtype=sent.dtype, device=sent.device)
            work = _dist().all_gather_into_tensor(received, sent, group=first.spec.group, async_op=True)
        self._gathering = (received, work, sent)  # ``sent`` held until waited on (see gather_rows)

    def wait_for_unshard(self) -> None:
        if self.gathering:
            received, work, _sent = self._gathering
            if work is not None:
                work.wait()
            self._gathering = None
            world_size = self.params[0].spec.world_size
            per_rank = received.view(world_size, -1)
            offset = 0
            with no_grad():
                for p in self.params:  # copy out: each parameter's rows of every rank, one after the other
                    n = p.padded_numel
                    rows = per_rank[:, offset:offset + n]
                    p.set_gathered(rows.reshape(world_size * p.spec.rows_per_rank, *p.spec.full_shape[1:]))
                    offset += n
            self.gathering, self.unsharded = False, True

    def reshard(self) -> None:
        self.wait_for_unshard()  # a prefetch in flight must land before its buffers go
        if self.unsharded:
            for p in self.params:
                p.free_unsharded()
            self.unsharded = False

    def use_unsharded(self) -> None:
        for p in self.params:
            p.use_unsharded()

    def use_sharded(self) -> None:
        for p in self.params:
            p.use_sharded()

    # ------------------------------------------------------------------ backward
    def pre_backward(self) -> None:
        self.unshard()
        if not self.needs_post_backward:
            self.needs_post_backward = True
            self._accumulated.clear()

    def grad_accumulated(self, param: FSDPParam) -> None:
        if not self.needs_post_backward:
            return
        self._accumulated.add(id(param))
        if all(id(p) in self._accumulated for p in self.params if p.requires_grad):
            self.post_backward()

    def _reduce_scatter_grads(self) -> None:
        """One reduce-scatter (summed) for the group's gradients, laid out as the all-gather lays out the
        parameters. A parameter backward gave no gradient keeps none (as without sharding); like torch's FSDP,
        this relies on every rank running the same graph, so that all of them leave out the same parameters."""
        params = [p for p in self.params if p.requires_grad and p.unsharded.grad is not None]
        if not params:
            return
        spec = params[0].spec
        with no_grad():
            sent = call("cat", [p.take_padded_grad() for p in params], 1).reshape(-1)
            summed = empty(sent.numel() // spec.world_size, dtype=sent.dtype, device=sent.device)
            dist = _dist()
            dist.reduce_scatter_tensor(summed, sent, op=dist.ReduceOp.SUM, group=spec.group)
            offset = 0
            for p in params:
                p.add_reduced_grad(summed[offset:offset + p.padded_numel])
                offset += p.padded_numel

    def post_backward(self) -> None:
        """Reduce-scatter the group's gradients into its shards and free the gathered parameters."""
        self.needs_post_backward = False
        if self.requires_gradient_sync:
            self._reduce_scatter_grads()
        if self.reshard_after_backward:
            self.reshard()
