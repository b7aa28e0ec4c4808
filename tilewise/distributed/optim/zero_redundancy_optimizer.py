"""ZeroRedundancyOptimizer: each rank keeps the optimizer state of its share of the parameters only.

[Note: ZeRO stage 1] Every rank holds every parameter and (after DDP or an all-reduce) every gradient, but
runs the wrapped optimizer on a partition of them, so the optimizer's state (Adam's two moments: twice the
parameters) is spread over the ranks. After its local step each rank broadcasts the parameters it updated,
so all ranks leave ``step()`` with the same parameters as one unsharded optimizer would give. The partition
is torch's, parameter for parameter: within each parameter group, parameters sorted by size (largest first,
stable) go greedily to the rank with the fewest elements so far; so a checkpoint's consolidated state dict and
the per-rank shards agree with torch's. The consolidated state dict has the unsharded optimizer's layout
(global parameter indices in group order), so it loads into a plain optimizer and back.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any

from tilewise.optim.optimizer import Optimizer
from tilewise.tensor import Tensor


def _dist():
    import tilewise.distributed as dist  # the package imports this module, so it is read at call time

    return dist


def _to_cpu(value):
    """A copy of an optimizer state (nested dicts/lists of tensors) with its tensors on the CPU."""
    if isinstance(value, Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _to_device(value, device):
    if isinstance(value, Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _checked_params(params) -> tuple[list, list[Tensor]]:
    """``params`` as a list (of tensors or of groups) and the flat list of its tensors, with torch's errors."""
    if isinstance(params, Tensor):
        raise TypeError(f"`params` argument should be an iterable of Tensors, but got {type(params).__name__}")
    try:
        entries = list(params)
    except TypeError as e:
        raise TypeError("`params` argument should be an iterable of Tensors or dicts, but got "
                        f"{type(params).__name__}") from e
    if not entries:
        raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
    if all(isinstance(p, Tensor) for p in entries):
        return entries, entries
    if not all(isinstance(p, dict) for p in entries):
        raise TypeError("`params` argument should be an iterable of Tensors or dicts")
    for group in entries:
        if "params" not in group:
            raise ValueError("Each parameter group passed-in via `params` must have a 'params' key mapping to the "
                             "parameters in the group")
    return entries, [p for group in entries for p in group["params"]]


def _check_same_dense_type(params: list[Tensor]) -> None:
    first = params[0]
    for p in params[1:]:
        if p.dtype != first.dtype or p.device.type != first.device.type:
            raise ValueError("ZeroRedundancyOptimizer only supports using the same dense type for all parameters "
                             f"but got both {first.dtype} on {first.device.type} and {p.dtype} on "
                             f"{p.device.type}")


def partition_by_size(params: list[Tensor], sizes: list[int]) -> list[list[Tensor]]:
    """torch's sorted-greedy split of one group: largest first, each to the rank with the fewest elements so far
    (ties to the lowest rank). ``sizes`` carries the ranks' totals from one group to the next."""
    per_rank: list[list[Tensor]] = [[] for _ in sizes]
    for p in sorted(params, key=lambda t: t.numel(), reverse=True):
        rank = sizes.index(min(sizes))
        per_rank[rank].append(p)
        sizes[rank] += p.numel()
    return per_rank


class ZeroRedundancyOptimizer(Optimizer):
    """Wraps ``optimizer_class`` so that each rank of ``process_group`` keeps the state of its share of the
    parameters only (ZeRO stage 1), as torch.distributed.optim.ZeroRedundancyOptimizer.

    Call ``step()`` on every rank after the gradients agree across ranks (DDP, or an all-reduce); every rank
    then holds the parameters an unsharded ``optimizer_class`` would give. ``consolidate_state_dict(to)`` (on
    every rank) gathers the whole state on rank ``to``, whose ``state_dict()`` is then the unsharded optimizer's.

    >>> import tilewise as tw
    >>> from tilewise.distributed.optim import ZeroRedundancyOptimizer
    >>> model = tw.nn.Linear(4, 2)
    >>> opt = ZeroRedundancyOptimizer(model.parameters(), tw.optim.AdamW, lr=1e-3)  # doctest: +SKIP
    >>> model(tw.ones(3, 4)).sum().backward(); opt.step()  # doctest: +SKIP
    """

    def __init__(self, params, optimizer_class: type[Optimizer], process_group: Any | None = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, **defaults: Any):
        if overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer(overlap_with_ddp=True) is not supported: it needs a "
                                      "DDP communication hook that runs the optimizer per gradient bucket; use "
                                      "overlap_with_ddp=False and call step() after backward")
        params, self._all_params = _checked_params(params)
        _check_same_dense_type(self._all_params)
        self.initialized = False
        Optimizer.__init__(self, params, defaults)
        dist = _dist()
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size: int = dist.get_world_size(self.process_group)
        self.rank: int = dist.get_rank(self.process_group)
        self.global_rank: int = self._global_rank(self.rank)
        self._overlap_with_ddp = False
        self._optim_defaults = defaults
        self._optim_constructor = optimizer_class
        self._partition_cache: list[list[dict]] = []
        self._init_local_optimizer()
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._buckets: list[Tensor | None] = []
        self._build_param_buckets()
        self._all_state_dicts: list[dict] = []
        self.initialized = True

    # ------------------------------------------------------------------ the partition
    def _global_rank(self, group_rank: int) -> int:
        dist = _dist()
        if self.process_group is None or self.process_group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    def _partition_parameters(self) -> list[list[dict]]:
        """For each rank, its param groups: the wrapper's groups (same hyperparameters) holding its share."""
        if not self._partition_cache:
            self._partition_cache = [[] for _ in range(self.world_size)]
            sizes = [0] * self.world_size
            for group in self.param_groups:
                for rank, params in enumerate(partition_by_size(group["params"], sizes)):
                    self._partition_cache[rank].append({**group, "params": params})
        return self._partition_cache

    @property
    def _param_to_rank(self) -> dict[int, int]:
        return {id(p): rank for rank, groups in enumerate(self._partition_parameters())
                for group in groups for p in group["params"]}

    @property
    def _index_to_param(self) -> list[Tensor]:
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _init_local_optimizer(self) -> None:
        # param groups (dicts) rather than a list of tensors: a rank may own no parameter of a group
        self.optim: Optimizer = self._optim_constructor(self._partition_parameters()[self.rank],
                                                        **self._optim_defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)

    def add_param_group(self, param_group: dict) -> None:
        """Add a group on every rank (call it on all of them): its parameters are partitioned as a new group,
        the earlier groups keep their ranks."""
        super().add_param_group(param_group)
        if not self.initialized:
            return
        self._partition_cache = []
        mine = self._partition_parameters()[self.rank]
        if len(mine) == len(self.optim.param_groups) + 1:
            self.optim.add_param_group(mine[-1])
        if self.parameters_as_bucket_view:
            self._build_param_buckets()

    @staticmethod
    def _sync_param_groups(src: list[dict], dst: list[dict]) -> None:
        """Copy every hyperparameter (not the parameters) group by group, e.g. a scheduler's new lr."""
        for src_group, dst_group in zip(src, dst):
            for key, value in src_group.items():
                if key != "params":
                    dst_group[key] = value

    # ------------------------------------------------------------------ bucket views
    def _build_param_buckets(self) -> None:
        """With ``parameters_as_bucket_view``, each rank's share of the parameters becomes views of one flat
        tensor, so one broadcast per rank carries them."""
        self._buckets = []
        if not self.parameters_as_bucket_view:
            return
        from tilewise.ops.creation import empty

        first = self._all_params[0]
        for groups in self._partition_parameters():
            params = [p for g in groups for p in g["params"] if p.requires_grad]
            if not params:
                self._buckets.append(None)
                continue
            bucket = empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
            offset = 0
            for p in params:
                view = bucket[offset:offset + p.numel()].view(p.shape)
                view.copy_(p.detach())
                p.data = view
                offset += p.numel()
            self._buckets.append(bucket)

    # ------------------------------------------------------------------ stepping
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        """Update this rank's share with the wrapped optimizer, then broadcast every share from its rank."""
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        loss = self.optim.step(**kwargs) if closure is None else self.optim.step(closure=closure, **kwargs)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._sync_params()
        return loss

    def _sync_params(self) -> None:
        dist = _dist()
        handles = []
        for rank, groups in enumerate(self._partition_parameters()):
            src = self._global_rank(rank)
            if self.parameters_as_bucket_view:
                tensors = [self._buckets[rank]] if self._buckets[rank] is not None else []
            else:
                tensors = [p.detach() for g in groups for p in g["params"]]
            handles += [dist.broadcast(t, src=src, group=self.process_group, async_op=True) for t in tensors]
        for handle in handles:
            handle.wait()

    # ------------------------------------------------------------------ state dicts
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's local optimizer state on rank ``to`` (group rank), on the CPU. Call on all ranks."""
        dist = _dist()
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        self._all_state_dicts = []
        for rank in range(self.world_size):
            message = [_to_cpu(self.optim.state_dict()) if rank == self.rank else None]
            if rank != to:  # rank ``to`` keeps its own state without sending it
                dist.broadcast_object_list(message, src=self._global_rank(rank), group=self.process_group)
            if self.rank == to:
                self._all_state_dicts.append(message[0])

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer's state in the unsharded optimizer's layout, as of the last
        ``consolidate_state_dict`` to this rank."""
        if not self._all_state_dicts:
            raise RuntimeError("Optimizer state has not been consolidated on this rank. Please call "
                               f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant to "
                               "save the global state.")
        state_dict = super().state_dict()
        index_of = {id(p): k for k, p in enumerate(self._index_to_param)}
        for rank, local in enumerate(self._all_state_dicts):
            for local_group, global_group in zip(local["param_groups"], self._partition_parameters()[rank]):
                for local_index, param in zip(local_group["params"], global_group["params"]):
                    if local_index in local["state"]:
                        state_dict["state"][index_of[id(param)]] = local["state"][local_index]
        state_dict["state"] = dict(sorted(state_dict["state"].items()))
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole (consolidated) state: each rank keeps the entries of the parameters it owns."""
        owner = self._param_to_rank
        params = self._index_to_param
        mine = {}
        for index, value in state_dict["state"].items():
            param = params[index]
            if owner[id(param)] == self.rank:
                self.optim.state[param] = _to_device(value, param.device)
                mine[index] = value
        super().load_state_dict({**state_dict, "state": mine})
        self._sync_param_groups(state_dict["param_groups"], self.param_groups)
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
