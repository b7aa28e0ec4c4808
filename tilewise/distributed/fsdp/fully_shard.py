"""``fully_shard``: FSDP2's per-module sharding of parameters, gradients and (through them) optimizer state.

[Note: fully_shard] ``fully_shard(block)`` is applied to each block and then to the root. Each call turns
the parameters under the module that no inner call manages into one :class:`FSDPParamGroup` (see [Note: FSDP
parameters]) and changes the module's class to ``FSDP<Class>`` (an :class:`FSDPModule`), as torch does. Hooks
do the rest, per iteration:
- forward pre-hook: all-gather the group (waiting for a prefetch already issued), issue the next group's
  all-gather asynchronously (the order is learnt in the first iteration), and put the gathered leaves in the
  modules for ``forward``;
- forward post-hook: put the shards back, free the gathered parameters (``reshard_after_forward``; never for
  the root, whose backward comes next) and hook the outputs, whose gradient starts the block's backward;
- pre-backward (a hook on the outputs): gather the group again and prefetch the group whose backward comes
  next; the first one in an iteration queues the root's end-of-backward callback;
- post-backward (when every leaf of the group has its gradient, or at the end of backward for groups with
  unused parameters): reduce-scatter the gradients into the shards' ``.grad`` and free the leaves.
The module that runs the first forward is the root: it owns the iteration (the order of groups, the
saved-tensor hooks while it runs forward and the end-of-backward callback). A parameter used by modules in
two different groups cannot be gathered by both, and is refused when the second group is made.
"""

from __future__ import annotations

import functools
from typing import Any

from tilewise.autograd.engine import ExecutionEngine
from tilewise.autograd.graph import saved_tensors_hooks
from tilewise.dispatch import STATE
from tilewise.distributed.fsdp.api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from tilewise.distributed.fsdp.param_group import (
    FSDPParam,
    FSDPParamGroup,
    mark_shard,
    pack_saved,
    shard_spec,
    unpack_saved,
)
from tilewise.tensor import Tensor


def _dist():
    import tilewise.distributed as dist  # the package imports this module, so it is read at call time

    return dist


def _map_tensors(fn, value):
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(fn, v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(fn, v) for k, v in value.items()}
    return value


def _cast_floating(value, dtype):
    return _map_tensors(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t, value)


class FSDPState:
    """What one ``fully_shard`` call adds to its module: its group (None when it manages no parameter) and
    the hooks; the root's state also runs the iteration."""

    def __init__(self, module, group: FSDPParamGroup | None, mp_policy: MixedPrecisionPolicy):
        self.module = module
        self.group = group
        self.mp_policy = mp_policy
        self.root: FSDPState | None = None  # set at the first forward; ``self`` for the root
        # the root's iteration
        self.states: list[FSDPState] = []
        self.forward_order: list[FSDPState] = []  # this iteration's, so far
        self.learned_order: list[FSDPState] = []  # the last complete iteration's: whom a forward prefetches
        self.saved_hooks: saved_tensors_hooks | None = None
        # set_modules_to_forward_prefetch / set_modules_to_backward_prefetch (None: the learnt order's next)
        self.forward_prefetch: list[FSDPState] | None = None
        self.backward_prefetch: list[FSDPState] | None = None
        self.backward_queued = False

    # ------------------------------------------------------------------ root
    def _lazy_init(self) -> None:
        self.root = self
        self.states = [m._fsdp_state for m in self.module.modules() if isinstance(m, FSDPModule)]
        for state in self.states:
            if state is not self:
                if state.root is state:
                    raise RuntimeError(f"fully_shard: {type(state.module).__name__} ran forward as a root before its "
                                       f"parent {type(self.module).__name__}; run forward from the outermost module")
                state.root = self
        if self.group is not None:
            self.group.reshard_after_forward = False  # the root's backward starts right after its forward

    def _root_pre_forward(self) -> None:
        if self.saved_hooks is not None:  # a forward that raised left them on
            self.saved_hooks.__exit__(None, None, None)
        if self.forward_order:
            self.learned_order = self.forward_order
        self.forward_order = []
        self.saved_hooks = saved_tensors_hooks(pack_saved, unpack_saved)
        self.saved_hooks.__enter__()

    def _root_post_forward(self) -> None:
        if self.saved_hooks is not None:
            self.saved_hooks.__exit__(None, None, None)
            self.saved_hooks = None

    @staticmethod
    def _neighbour(order: list[FSDPState], state: FSDPState, step: int) -> FSDPState | None:
        """The state ``step`` places after ``state`` in a forward order (negative: before)."""
        if state not in order:
            return None
        k = order.index(state) + step
        return order[k] if 0 <= k < len(order) else None

    def _next_in_backward(self, state: FSDPState) -> FSDPState | None:
        """Whose backward follows ``state``'s: the reverse of this iteration's forward order, the root first."""
        order = [self] + [s for s in reversed(self.forward_order) if s is not self]
        return self._neighbour(order, state, 1)

    def finish_backward(self) -> None:
        """End of the backward: groups whose post-backward did not run (unused parameters) run it now, and every
        gathered group is freed."""
        for state in self.states:
            group = state.group
            if group is None:
                continue
            if group.needs_post_backward:
                group.post_backward()
            if group.reshard_after_backward:
                group.reshard()
        self.backward_queued = False

    # ------------------------------------------------------------------ hooks
    def mark_state_dict(self, module, destination: dict, prefix: str, local_metadata: dict) -> None:
        """A state dict holds detached views of the shards: give them the shards' specs and ``full_tensor()``,
        so that sharded checkpoints know where each one goes."""
        if self.group is None:
            return
        specs = {id(p.sharded._storage): p.spec for p in self.group.params}
        for key, value in destination.items():
            if key.startswith(prefix) and isinstance(value, Tensor) and id(value._storage) in specs:
                mark_shard(value, specs[id(value._storage)])

    def pre_forward(self, module, args: tuple, kwargs: dict):
        if self.root is None:
            self._lazy_init()
        root = self.root
        if root is self:
            self._root_pre_forward()
        if self not in root.forward_order:
            root.forward_order.append(self)
        if self.group is not None:
            self.group.unshard()
            if not root.backward_queued:
                following = self.forward_prefetch
                if following is None:
                    following = [root._neighbour(root.learned_order, self, 1)]
                _prefetch(following)
            self.group.use_unsharded()
        if self.mp_policy.param_dtype is not None and self.mp_policy.cast_forward_inputs:
            args, kwargs = _cast_floating(args, self.mp_policy.param_dtype), \
                _cast_floating(kwargs, self.mp_policy.param_dtype)
        return args, kwargs

    def post_forward(self, module, args: tuple, output):
        if self.group is not None:
            self.group.use_sharded()
            # a forward run again inside backward (activation checkpointing) keeps its parameters for its backward
            if self.group.reshard_after_forward and not self.root.backward_queued:
                self.group.reshard()
        if self.root is self:
            self._root_post_forward()
        if self.mp_policy.output_dtype is not None:
            output = _cast_floating(output, self.mp_policy.output_dtype)
        if STATE.grad_enabled:
            _map_tensors(self._hook_output, output)
        return output

    def _hook_output(self, t: Tensor) -> Tensor:
        if t.requires_grad:
            t.register_hook(self._pre_backward)
        return t

    def _pre_backward(self, grad: Tensor) -> None:
        root = self.root
        if not root.backward_queued:
            root.backward_queued = True
            ExecutionEngine().queue_callback(root.finish_backward)
        if self.group is not None:
            self.group.pre_backward()
        following = self.backward_prefetch
        _prefetch(following if following is not None else [root._next_in_backward(self)])


def _prefetch(states: list[FSDPState | None]) -> None:
    for state in states:
        if state is not None and state.group is not None:
            state.group.unshard(async_op=True)


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns: ``wait()`` makes the gathered parameters usable."""

    def __init__(self, group: FSDPParamGroup | None):
        self._group = group

    def wait(self) -> None:
        if self._group is not None:
            self._group.wait_for_unshard()
            self._group = None


class FSDPModule:
    """The methods ``fully_shard`` adds to a module (its class becomes ``FSDP<Class>``, a subclass of both)."""

    def reshard(self) -> None:
        """Free the gathered parameters (the module holds its shards)."""
        state = self._fsdp_state
        if state.group is not None:
            state.group.use_sharded()
            state.group.reshard()

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """Gather the parameters now (a collective: every rank calls it); with ``async_op``, a handle to wait on."""
        group = self._fsdp_state.group
        if group is not None:
            group.unshard(async_op=True)
        handle = UnshardHandle(group)
        if async_op:
            return handle
        handle.wait()
        return None

    def _fsdp_states_below(self, recurse: bool) -> list[FSDPState]:
        modules = self.modules() if recurse else [self]
        return [m._fsdp_state for m in modules if isinstance(m, FSDPModule)]

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        for state in self._fsdp_states_below(recurse):
            if state.group is not None and state.root is not state:
                state.group.reshard_after_forward = bool(reshard_after_forward)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """False: keep the gathered parameters after backward (for several backwards in a row); ``reshard()``
        frees them."""
        for state in self._fsdp_states_below(recurse):
            if state.group is not None:
                state.group.reshard_after_backward = bool(reshard_after_backward)

    def set_modules_to_forward_prefetch(self, modules: list) -> None:
        """Issue the all-gathers of ``modules`` (fully_shard modules) when this module's forward starts, instead
        of the next module's in the learnt order."""
        self._fsdp_state.forward_prefetch = _states_of(modules, "set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(self, modules: list) -> None:
        """Issue the all-gathers of ``modules`` when this module's backward starts, instead of the next one's in
        reverse forward order."""
        self._fsdp_state.backward_prefetch = _states_of(modules, "set_modules_to_backward_prefetch")

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: backward keeps accumulating full gradients locally (no reduce-scatter), as for the first
        micro-batches of gradient accumulation; the next backward with True reduce-scatters their sum."""
        for state in self._fsdp_states_below(recurse):
            if state.group is not None:
                state.group.requires_gradient_sync = bool(requires_gradient_sync)


def _states_of(modules, what: str) -> list[FSDPState]:
    for m in modules:
        if not isinstance(m, FSDPModule):
            raise ValueError(f"{what}: expects a list of fully_shard modules, but got {type(m).__name__}")
    return [m._fsdp_state for m in modules]


_FSDP_CLASSES: dict[type, type] = {}


def _fsdp_class(cls: type) -> type:
    if cls not in _FSDP_CLASSES:
        _FSDP_CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"_orig_cls": cls})
    return _FSDP_CLASSES[cls]


def _managed_parameters(module) -> list[tuple[Tensor, list[tuple[Any, str]], str]]:
    """The parameters under ``module`` outside inner ``fully_shard`` modules: each with the (module, name)
    pairs that hold it and its first dotted name."""
    found: dict[int, tuple[Tensor, list, str]] = {}
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop(0)
        for name, p in m._parameters.items():
            if p is None:
                continue
            qualified = prefix + name
            _refuse_shared(module, p, qualified)
            entry = found.setdefault(id(p), (p, [], qualified))
            entry[1].append((m, name))
        for name, child in m._modules.items():
            if child is not None and not isinstance(child, FSDPModule):
                stack.append((f"{prefix}{name}.", child))
    return list(found.values())


def _refuse_shared(module, p: Tensor, name: str) -> None:
    if "_fsdp_shard" in p.__dict__ or "_fsdp_moved_to" in p.__dict__:
        raise ValueError(f"fully_shard({type(module).__name__}): parameter '{name}' (shape {list(p.shape)}) already "
                         "belongs to another fully_shard module: it is shared with a module sharded before, or "
                         "this module's parent was sharded first. A parameter shared across fully_shard groups is "
                         "not supported; apply fully_shard bottom-up (blocks before their parent) and to a module "
                         "that holds every user of a shared parameter (e.g. leave tied weights to the root)")


def _process_group(mesh):
    if mesh is None:
        return None
    if hasattr(mesh, "get_group"):  # a DeviceMesh
        return mesh.get_group()
    return mesh  # a process group


_NO_MIXED_PRECISION = MixedPrecisionPolicy()
_NO_OFFLOAD = OffloadPolicy()


def fully_shard(module, *, mesh=None, reshard_after_forward: bool | int | None = True,
                mp_policy: MixedPrecisionPolicy = _NO_MIXED_PRECISION, offload_policy: OffloadPolicy = _NO_OFFLOAD):
    """Shard ``module``'s parameters (those no inner ``fully_shard`` manages) along dim 0 over the ranks of
    ``mesh`` (a process group, a 1-D DeviceMesh-like object with ``get_group()``, or None: the default group),
    as torch.distributed.fsdp.fully_shard (FSDP2). Apply it to each block, then to the root; train with any
    optimizer over ``model.parameters()`` (the shards). Returns ``module``, whose class becomes ``FSDP<Class>``.

    >>> import tilewise as tw
    >>> from tilewise.distributed.fsdp import fully_shard
    >>> model = tw.nn.Sequential(tw.nn.Linear(8, 8), tw.nn.Linear(8, 2))
    >>> for block in model:  # doctest: +SKIP
    ...     fully_shard(block)
    >>> fully_shard(model)  # doctest: +SKIP
    >>> [p.shape for p in model.parameters()]  # doctest: +SKIP
    [tilewise.Size([4, 8]), tilewise.Size([4]), tilewise.Size([1, 8]), tilewise.Size([1])]
    """
    from tilewise.nn.modules.module import Module

    if not isinstance(module, Module):
        raise TypeError(f"fully_shard expects an nn.Module, but got {type(module).__name__}")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: {type(module).__name__} is already sharded by fully_shard")
    if reshard_after_forward is None:
        reshard_after_forward = True
    if not isinstance(reshard_after_forward, bool):
        raise NotImplementedError(f"fully_shard: reshard_after_forward={reshard_after_forward!r} (resharding to a "
                                  "smaller world after forward) is not supported; pass True or False")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"fully_shard: offload_policy must be an OffloadPolicy, got {type(offload_policy).__name__}")
    dist = _dist()
    group = _process_group(mesh)
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    params = []
    for param, usages, name in _managed_parameters(module):
        if param.dim() == 0:
            raise NotImplementedError(f"fully_shard({type(module).__name__}): parameter '{name}' is 0-dimensional; "
                                      "only parameters with at least one dimension can be sharded along dim 0")
        spec = shard_spec(tuple(param.shape), rank, world_size, group)
        params.append(FSDPParam(param, usages, spec, mp_policy.param_dtype, mp_policy.reduce_dtype,
                                isinstance(offload_policy, CPUOffloadPolicy)))
    param_group = FSDPParamGroup(params, reshard_after_forward) if params else None
    state = FSDPState(module, param_group, mp_policy)
    object.__setattr__(module, "_fsdp_state", state)
    module.register_forward_pre_hook(state.pre_forward, prepend=True, with_kwargs=True)
    module.register_forward_hook(state.post_forward)
    # a function of its own: the public registration marks the hook it is given, which a bound method cannot take
    module.register_state_dict_post_hook(functools.partial(FSDPState.mark_state_dict, state))
    module.__class__ = _fsdp_class(type(module))
    return module
