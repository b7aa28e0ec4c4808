"""DistributedDataParallel: one replica of a module per process, gradients averaged over the process group.

[Note: DistributedDataParallel] Construction checks that every rank holds the same parameter shapes (torch's
errors), broadcasts parameters and buffers from the group's first rank, and builds a ``Reducer`` (``_reducer.py``,
[Note: DDP buckets]) that all-reduces gradient buckets while backward runs. Each forward first re-broadcasts
the buffers (``broadcast_buffers``, so batch-norm statistics follow rank 0), runs the module, and — when grad is
enabled outside ``no_sync()`` — arms the reducer for the backward that follows. Under ``no_sync()`` nothing is
armed: gradients accumulate in ``.grad`` locally, and the next synced backward reduces the accumulated sum.
Under ``tilewise.compile`` the whole step, with its bucket all-reduces, is one program ([Note: compiled DDP] in
``_reducer.py``); a communication hook breaks the graph before each bucket's collective.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from contextlib import contextmanager

import tilewise.distributed as dist
from tilewise.autograd.grad_mode import is_grad_enabled, no_grad
from tilewise.dtypes import int64
from tilewise.nn.modules.module import Module
from tilewise.nn.parallel._reducer import (
    DEFAULT_FIRST_BUCKET_BYTES,
    MB,
    GradBucket,
    Reducer,
    compute_bucket_assignment_by_size,
    with_values,
)
from tilewise.nn.parameter import UninitializedParameter
from tilewise.ops.creation import zeros
from tilewise.ops.functions import cat
from tilewise.tensor import Tensor, tensor

__all__ = ["DistributedDataParallel"]

_DEFAULT_BUCKET_CAP_MB = 25
_BROADCAST_BUCKET_BYTES = 250 * MB  # torch's broadcast_bucket_size


class DistributedDataParallel(Module):
    """Data parallelism over processes: wrap the module once per rank, train as usual.

    >>> # xdoctest: +SKIP("needs init_process_group")
    >>> model = DistributedDataParallel(Net())    # parameters now equal rank 0's everywhere
    >>> model(batch_of_this_rank).sum().backward()  # .grad holds the average over all ranks' batches
    """

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0, broadcast_buffers=None,
                 init_sync: bool = True, process_group=None, bucket_cap_mb=None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 forward_sync_buffers: bool | None = None) -> None:
        super().__init__()
        self.process_group = _resolve_group(process_group)
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._module_parameters = [p for n, p in module.named_parameters() if n not in self.parameters_to_ignore]
        _check_module(self._module_parameters, device_ids, output_device)
        self.module = module
        self.device_type = self._module_parameters[0].device.type
        self.device = self._module_parameters[0].device
        self.device_ids = self.output_device = None
        if self.device_type != "cpu" and device_ids:
            self.device_ids = [_device_index(d) for d in device_ids]
            self.output_device = _device_index(output_device if output_device is not None else device_ids[0])
        self.dim = dim
        self.forward_sync_buffers, init_sync_buffers = _buffer_sync_settings(broadcast_buffers, forward_sync_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is deprecated. Please "
                          "avoid using it.", FutureWarning, stacklevel=2)
        self.broadcast_bucket_size = _BROADCAST_BUCKET_BYTES
        self.bucket_bytes_cap = int((_DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MB)
        self.bucket_bytes_cap_default = bucket_cap_mb is None
        parameters = self._params_for_reducer()
        self.modules_buffers = self._buffers_to_sync()
        if init_sync:
            _verify_param_shape_across_processes(self.process_group, parameters)
            params_and_buffers = [p.detach() for p in self._params_to_sync()]
            if init_sync_buffers:
                params_and_buffers += self.modules_buffers
            _broadcast_coalesced(params_and_buffers, self.broadcast_bucket_size, self.process_group)
        first_cap = DEFAULT_FIRST_BUCKET_BYTES if self.bucket_bytes_cap_default else self.bucket_bytes_cap
        limits = [min(first_cap, self.bucket_bytes_cap), self.bucket_bytes_cap]
        bucket_indices = list(reversed(compute_bucket_assignment_by_size(parameters, limits)))
        self.reducer = Reducer(parameters, bucket_indices, self.process_group, find_unused_parameters,
                               gradient_as_bucket_view)
        self._comm_hooks: list[tuple] = []

    @property
    def broadcast_buffers(self) -> bool:
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    def _params_for_reducer(self) -> list[Tensor]:
        """The parameters whose gradients are averaged, in the order the module registered them (shared ones
        once)."""
        seen, params = set(), []
        for module_name, module in self.module.named_modules():
            for name, param in module.named_parameters(recurse=False):
                fqn = f"{module_name}.{name}" if module_name else name
                if param.requires_grad and fqn not in self.parameters_to_ignore and id(param) not in seen:
                    seen.add(id(param))
                    params.append(param)
        return params

    def _params_to_sync(self) -> list[Tensor]:
        return [p for n, p in self.module.named_parameters() if n not in self.parameters_to_ignore]

    def _buffers_to_sync(self) -> list[Tensor]:
        return [b for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self.device_ids:
            inputs, kwargs = _to_device((inputs, kwargs), f"{self.device_type}:{self.device_ids[0]}")
        output = self.module(*inputs, **kwargs)
        sync = bool(is_grad_enabled() and self.require_backward_grad_sync)
        if sync:
            self.reducer.prepare_for_backward(_find_tensors(output) if self.find_unused_parameters else [])
        if self.require_forward_param_sync != sync:  # written only when it changes: a compiled step that writes
            self.require_forward_param_sync = sync  # module state each call would break its graph there
        return output

    def will_sync_module_buffers(self) -> bool:
        return self.require_forward_param_sync and self.forward_sync_buffers and len(self.modules_buffers) > 0

    def _sync_buffers(self) -> None:
        self.modules_buffers = self._buffers_to_sync()  # a module may have reassigned a buffer
        _broadcast_coalesced(self.modules_buffers, self.broadcast_bucket_size, self.process_group)

    @contextmanager
    def no_sync(self):
        """Inside this context forward/backward passes accumulate gradients locally without communication; the
        first synced backward after it averages the accumulated sums. The forward must run inside it too."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False):
        raise NotImplementedError("DistributedDataParallel.join() (training on uneven inputs across ranks) is not "
                                  "supported by tilewise; give every rank the same number of batches, e.g. with "
                                  "DistributedSampler(..., drop_last=True)")

    # ------------------------------------------------------------------ communication hooks
    def register_comm_hook(self, state: object, hook) -> None:
        """Reduce each bucket with ``hook(state, bucket: GradBucket) -> Future`` instead of the default average.
        The Future's value (a tensor, or a list whose first element is one) becomes the bucket's gradients; see
        ``tilewise.distributed.algorithms.ddp_comm_hooks.default_hooks``. Register once, before backward."""
        _check_comm_hook(hook)
        if self.reducer.comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._comm_hooks.append((hook, state))
        self.reducer.comm_hook, self.reducer.comm_state = hook, state


def _resolve_group(process_group):
    if not dist.is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return process_group if process_group is not None else dist.group.WORLD


def _check_module(params: list[Tensor], device_ids, output_device) -> None:
    if not any(p.requires_grad for p in params):
        raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter that "
                           "requires a gradient.")
    if device_ids is not None and len(device_ids) > 1:
        raise ValueError("device_ids can only be None or contain a single element.")
    device_types = {p.device.type for p in params}
    if len(device_types) != 1:
        raise ValueError(f"DistributedDataParallel's input module must be on the same type of devices, but input "
                         f"module parameters locate in {device_types}.")
    if next(iter(device_types)) == "cpu" and (device_ids or output_device):
        raise ValueError(f"DistributedDataParallel device_ids and output_device arguments only work with "
                         f"single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                         f"{device_ids}, output_device {output_device}, and module parameters "
                         f"{ {p.device for p in params} }.")
    for p in params:
        if isinstance(p, UninitializedParameter):
            raise RuntimeError("Modules with uninitialized parameters can't be used with `DistributedDataParallel`. "
                               "Run a dummy forward pass to correctly initialize the modules")


def _buffer_sync_settings(broadcast_buffers, forward_sync_buffers) -> tuple[bool, bool]:
    """(sync buffers before each forward, sync them at construction), with torch's deprecation of
    ``broadcast_buffers``."""
    if broadcast_buffers is not None:
        if forward_sync_buffers is not None:
            warnings.warn("Both `broadcast_buffers` and `forward_sync_buffers` were specified. `broadcast_buffers` "
                          "is deprecated and its value is ignored when `forward_sync_buffers` is provided.",
                          FutureWarning, stacklevel=3)
        else:
            warnings.warn("`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
                          "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If "
                          "you rely on buffers NOT being synced at init (e.g. rank-local buffers), keep using "
                          "`broadcast_buffers=False` until `init_sync_buffers` is available.",
                          FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return forward_sync_buffers, True
    effective = broadcast_buffers if broadcast_buffers is not None else True
    return effective, effective


def _device_index(device) -> int:
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None:
        index = int(str(device).rpartition(":")[2])
    return index


def _to_device(value, device: str):
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _find_tensors(value) -> list[Tensor]:
    """The tensors in a forward's output (nested in lists, tuples, dicts and dataclasses), as torch finds them."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _find_tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _find_tensors(item)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _find_tensors(getattr(value, f.name))]
    return []


def _group_root(group) -> int:
    """The global rank of the group's first member, the source of DDP's broadcasts."""
    return dist.get_global_rank(group, 0) if group is not None and group is not dist.group.WORLD else 0


def _verify_param_shape_across_processes(group, params: list[Tensor]) -> None:
    """torch's check that every rank wraps the same model: equal parameter counts, then rank 0's sizes and
    strides."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    metadata = [n for p in params for n in (*p.shape, *p.stride())]
    device = params[0].device
    mine = tensor([len(params), len(metadata)], dtype=int64, device=device)
    gathered = [zeros(2, dtype=int64, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    counts = [g.tolist() for g in gathered]
    for other, (count, _) in enumerate(counts):
        if count != len(params):
            raise RuntimeError(f"DDP expects same model across all ranks, but Rank {rank} has {len(params)} params, "
                               f"while rank {other} has inconsistent {count} params.")
    length = counts[0][1]
    control = tensor((metadata + [0] * length)[:length], dtype=int64, device=device)
    dist.broadcast(control, src=_group_root(group), group=group)
    mismatch = _first_mismatch(rank, params, control.tolist())
    # torch raises on the mismatching ranks only, and the others hang in the next collective: every rank stops
    anywhere = tensor([int(mismatch is not None)], dtype=int64, device=device)
    dist.all_reduce(anywhere, group=group)
    if mismatch is not None:
        raise RuntimeError(mismatch)
    if anywhere.item():
        raise RuntimeError(f"DDP expects same model across all ranks, but the parameters of {anywhere.item()} "
                           f"rank(s) do not match the sizes or strides of those in process 0 (their errors name "
                           f"the parameter); rank {rank} matches.")


def _first_mismatch(rank: int, params: list[Tensor], expected: list[int]) -> str | None:
    """torch's error for the first parameter whose sizes or strides differ from process 0's, if any."""
    position = 0
    for index, p in enumerate(params):
        for size in p.shape:
            if position >= len(expected) or size != expected[position]:
                return (f"[{rank}]: params[{index}] in this process with sizes {list(p.shape)} appears not to match "
                        "sizes of the same param in process 0.")
            position += 1
        for stride in p.stride():
            if position >= len(expected) or stride != expected[position]:
                return (f"params[{index}] in this process with sizes {list(p.shape)} appears not to match strides "
                        "of the same param in process 0.")
            position += 1
    return None


def _broadcast_coalesced(tensors: list[Tensor], bucket_bytes: int, group) -> None:
    """Overwrite ``tensors`` with the group's first rank's values, in few collectives: one flat tensor per run
    of the same device and dtype, of at most ``bucket_bytes``."""
    root = _group_root(group)
    with no_grad():
        for chunk in _coalesced_chunks(tensors, bucket_bytes):
            flat = with_values(cat([t.reshape(-1) for t in chunk]))
            dist.broadcast(flat, src=root, group=group)
            offset = 0
            for t in chunk:
                t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()


def _coalesced_chunks(tensors: list[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
    groups: dict[tuple, list[list[Tensor]]] = {}
    sizes: dict[tuple, int] = {}
    for t in tensors:
        key = (str(t.device), t.dtype)
        nbytes = t.numel() * t.element_size()
        if key not in groups or sizes[key] + nbytes > bucket_bytes:
            groups.setdefault(key, []).append([])
            sizes[key] = 0
        groups[key][-1].append(t)
        sizes[key] += nbytes
    return [chunk for chunks in groups.values() for chunk in chunks if chunk]


def _check_comm_hook(hook) -> None:
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")
    bucket = inspect.signature(hook).parameters["bucket"].annotation
    if bucket is not inspect.Parameter.empty and bucket is not GradBucket and not str(bucket).endswith("GradBucket"):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
