"""Process groups and torch.distributed's module-level collectives.

[Note: process groups] ``init_process_group`` finds the other processes through a store (``env://``,
``tcp://host:port``, ``file://path`` or a given ``store``) and makes the default group, ``group.WORLD``.
A ``ProcessGroup`` is a set of global ranks, a namespace in the store, and one transport per device type,
named by its backend configuration (``"gloo"`` serves CPU tensors, ``"nccl"`` CUDA tensors, ``None`` means
``"cpu:gloo,cuda:nccl"`` as in torch). A transport is created on the group's first collective on that
device type (every rank calls collectives in the same order, so they create it together), in its own
``PrefixStore``. Ranks outside a ``new_group`` get ``GroupMember.NON_GROUP_MEMBER``; collectives on it warn
and return None, as torch's do.

Transports implement the primitives of ``backend.Backend``; this module maps torch's global ranks
(``src=``, ``dst=``) to group ranks, checks arguments with torch's errors, and composes everything else
from the primitives: ``all_gather`` into a list is an ``all_gather_into_tensor`` into one buffer,
``reduce`` an all-reduce of a copy, ``gather`` and ``scatter`` are ``all_to_all_single`` with empty
splits for the ranks that send nothing, the object collectives pickle into byte tensors. A composed
operation returns a ``backend.ComposedWork`` whose finishing copies run when its parts are done. The
object collectives (objects.py, composed from the collectives here) and the rendezvous (rendezvous.py) are
modules of their own.

For code built on groups (DDP, sharding): ``group._get_backend(device)`` is the transport serving a device,
``get_process_group_ranks(group)`` the global ranks, ``get_group_rank`` / ``get_global_rank`` map between
the two, and ``_tensor_backend(group, tensor)`` the checked transport for a tensor.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import threading
import warnings
from collections.abc import Callable

from tilewise.distributed.backend import Backend as TransportBackend
from tilewise.distributed.backend import ComposedWork, RedOpType, ReduceOp, Work
from tilewise.distributed.rendezvous import rendezvous, store_based_barrier
from tilewise.distributed.store import PrefixStore, Store
from tilewise.dtypes import c10_name
from tilewise.ops.creation import empty
from tilewise.ops.functions import cat
from tilewise.tensor import Tensor

default_pg_timeout = datetime.timedelta(minutes=30)

_NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."


class Backend(str):
    """Backend names (torch's ``torch.distributed.Backend``): ``Backend("GLOO") == Backend.GLOO == "gloo"``."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    backend_list = [UNDEFINED, GLOO, NCCL, UCC, MPI, XCCL]
    default_device_backend_map: dict[str, str] = {"cpu": GLOO, "cuda": NCCL}
    backend_capability: dict[str, list[str]] = {GLOO: ["cpu"], NCCL: ["cuda"]}

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, but got: {type(name)}")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        return name.lower() if value == Backend.UNDEFINED else value

    @classmethod
    def register_backend(cls, name: str, func: Callable, extended_api: bool = False,
                         devices: str | list[str] | None = None) -> None:
        """Add a transport ``func(store, group_rank, group_size, timeout) -> backend.Backend``."""
        devices = [devices] if isinstance(devices, str) else list(devices or ["cpu", "cuda"])
        setattr(cls, name.upper(), name.lower())
        cls.backend_list.append(name.lower())
        cls.backend_capability[name.lower()] = devices
        _TRANSPORTS[name.lower()] = func


def _transport_class(module: str, name: str) -> Callable:
    def make(store, rank: int, size: int, timeout: datetime.timedelta) -> TransportBackend:
        return getattr(importlib.import_module(module), name)(store, rank, size, timeout)
    return make


# The transports by name; nccl.py is imported on the first CUDA collective only (it needs nccl4py).
_TRANSPORTS: dict[str, Callable] = {
    Backend.GLOO: _transport_class("tilewise.distributed.gloo", "GlooBackend"),
    Backend.NCCL: _transport_class("tilewise.distributed.nccl", "NCCLBackend"),
}


def _parse_backend_config(backend: str | None) -> dict[str, str]:
    """``"gloo"`` -> {"cpu": "gloo"}; ``"cpu:gloo,cuda:nccl"`` -> both; None -> torch's default map."""
    if backend is None or str(backend).lower() == Backend.UNDEFINED:
        return dict(Backend.default_device_backend_map)
    config = {}
    for item in str(backend).lower().split(","):
        if ":" in item:
            device_type, name = item.split(":", 1)
            config[device_type.strip()] = name.strip()
            continue
        name = Backend(item.strip())
        if name not in Backend.backend_capability:
            raise ValueError(f"Invalid backend: '{item}'. Valid backends are: "
                             f"{', '.join(sorted(Backend.backend_capability))}")
        for device_type in Backend.backend_capability[name]:
            config[device_type] = name
    for name in config.values():
        if name not in _TRANSPORTS:
            raise ValueError(f"Invalid backend: '{name}'. Valid backends are: {', '.join(sorted(_TRANSPORTS))}")
    return config


def _config_string(config: dict[str, str]) -> str:
    names = set(config.values())
    if len(names) == 1:
        return names.pop()
    return ",".join(f"{device}:{name}" for device, name in config.items())


class ProcessGroup:
    """Global ranks, a store namespace, and a transport per device type (made on first use)."""

    def __init__(self, store: Store, rank: int, size: int, ranks: list[int], config: dict[str, str],
                 timeout: datetime.timedelta, group_name: str):
        self._store, self._rank, self._size, self._ranks = store, rank, size, list(ranks)
        self._config, self._timeout, self.group_name = config, timeout, group_name
        self.group_desc = group_name
        self._backend_name: str | None = None  # as given to init_process_group / new_group: get_backend's answer
        self._backends: dict[str, TransportBackend] = {}
        self._lock = threading.Lock()

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        return _config_string(self._config)

    @property
    def bound_device_id(self):
        return None

    def _device_types(self) -> list[str]:
        return list(self._config)

    def _has_backend(self, device_type: str) -> bool:
        return device_type in self._config

    def _get_backend(self, device) -> TransportBackend:
        """The transport serving ``device`` (a device, or its type as a string), made on first use."""
        found = self._backends.get(device) if isinstance(device, str) else self._backends.get(device.type)
        if found is not None:  # the hot path: a transport made before
            return found
        device_type = device if isinstance(device, str) else device.type
        device_type = device_type.split(":")[0]
        if device_type not in self._config:
            raise RuntimeError(f"No backend type associated with device type {device_type}")
        with self._lock:
            if device_type not in self._backends:
                name = self._config[device_type]
                store = PrefixStore(f"{device_type}/{name}", self._store)
                self._backends[device_type] = _TRANSPORTS[name](store, self._rank, self._size, self._timeout)
            return self._backends[device_type]

    def _shutdown(self) -> None:
        with self._lock:
            backends, self._backends = list(self._backends.values()), {}
        for backend in backends:
            backend.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroup(name={self.group_name!r}, backend={self.name()!r}, ranks={self._ranks})"


class _World:
    def __init__(self) -> None:
        self.default_pg: ProcessGroup | None = None
        self.store: Store | None = None  # the rendezvous store; groups live under prefixes of it
        self.groups: dict[ProcessGroup, str] = {}
        self.group_count = 0


_world = _World()


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 (torch's name)
        return _world.default_pg


class GroupMember(metaclass=_WorldMeta):
    NON_GROUP_MEMBER = -100


class group(GroupMember):  # noqa: N801 (torch's name: dist.group.WORLD)
    pass


def is_available() -> bool:
    return True


def is_gloo_available() -> bool:
    return True


def is_nccl_available() -> bool:
    """True where nccl4py imports (the CUDA extra is installed), as torch reports whether it was built with NCCL."""
    return importlib.util.find_spec("nccl") is not None  # without loading libnccl


def is_mpi_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def is_initialized() -> bool:
    return _world.default_pg is not None


def _default_pg() -> ProcessGroup:
    if _world.default_pg is None:
        raise ValueError(_NOT_INITIALIZED)
    return _world.default_pg


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Store | None = None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """Join the job's processes into the default group, ``group.WORLD`` (torch's signature and rules)."""
    if _world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    if store is not None:
        if world_size <= 0:
            raise AssertionError("world_size must be positive if using store")
        if rank < 0:
            raise AssertionError("rank must be non-negative if using store")
    config = _parse_backend_config(backend)
    timeout = timeout if timeout is not None else default_pg_timeout
    if store is None:
        store, rank, world_size = rendezvous(init_method or "env://", rank, world_size, timeout)
    store.set_timeout(timeout)
    if not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank}: the rank must be in [0, {world_size}) for world_size {world_size}")
    _world.store = store
    default_store = PrefixStore("default_pg", store)
    pg = ProcessGroup(default_store, rank, world_size, list(range(world_size)), config, timeout,
                      group_name or "0")
    pg._backend_name = backend
    store_based_barrier(default_store, "store_based_barrier_key:init", rank, world_size, timeout)
    _world.default_pg = pg
    _world.groups = {pg: pg.group_name}
    _world.group_count = 1


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Shut down ``group``'s transports (all groups when ``group`` is None or WORLD)."""
    if group == GroupMember.NON_GROUP_MEMBER:
        return
    target = _world.default_pg if group is None else group
    if target is None:
        raise AssertionError("Process group cannot be None")
    if target is _world.default_pg:
        for pg in list(_world.groups):
            pg._shutdown()
        _world.__init__()
        return
    target._shutdown()
    _world.groups.pop(target, None)


def new_group(ranks: list[int] | None = None, timeout: datetime.timedelta | None = None, backend: str | None = None,
              pg_options=None, use_local_synchronization: bool = False, group_desc: str | None = None,
              device_id=None, sort_ranks: bool = True):
    """A group of some global ranks; every rank of the world must call it, in the same order."""
    world = _default_pg()
    ranks = list(range(world.size())) if not ranks else list(ranks)
    if len(ranks) > world.size():
        raise ValueError("the new group's world size should be less or equal to the world size set by "
                         "init_process_group")
    for r in ranks:
        if not 0 <= r < world.size():
            raise ValueError("The new group's rank should be within the world_size set by init_process_group")
    if sort_ranks:
        ranks = sorted(ranks)
    config = _parse_backend_config(backend) if backend is not None else dict(world._config)
    timeout = timeout if timeout is not None else world._timeout
    name = str(_world.group_count)
    _world.group_count += 1
    if world.rank() not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    store = PrefixStore(f"{name}/", _world.store)
    pg = ProcessGroup(store, ranks.index(world.rank()), len(ranks), ranks, config, timeout, name)
    pg.group_desc = group_desc or name
    pg._backend_name = backend if backend is not None else world._backend_name
    store_based_barrier(store, "store_based_barrier_key", world.rank(), len(ranks), timeout)
    _world.groups[pg] = name
    return pg


def _resolve(group) -> ProcessGroup:
    if group is None or group is GroupMember.WORLD:
        return _default_pg()
    if not isinstance(group, ProcessGroup) or group not in _world.groups:
        raise ValueError(f"Process group {group} is not initialized in the world group map. Please initialize the "
                         "group first.")
    return group


def _not_member(group) -> bool:
    return isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER


def _warn_not_in_group(op_name: str) -> None:
    global_rank = -1 if _world.default_pg is None else _world.default_pg.rank()
    warnings.warn(f"Running {op_name} on global rank {global_rank} which does not belong to the given group.",
                  stacklevel=3)


def get_rank(group: ProcessGroup | None = None) -> int:
    if _not_member(group):
        return -1
    return _resolve(group).rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    if _not_member(group):
        return -1
    return _resolve(group).size()


def get_backend(group: ProcessGroup | None = None) -> str:
    if _not_member(group):
        raise ValueError("Invalid process group specified")
    pg = _resolve(group)
    return Backend(pg._backend_name) if pg._backend_name else Backend.UNDEFINED


def get_process_group_ranks(group) -> list[int]:
    return list(_resolve(group)._ranks)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    pg = _resolve(group)
    if global_rank not in pg._ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {pg}")
    return pg._ranks.index(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    pg = _resolve(group)
    if not 0 <= group_rank < pg.size():
        raise ValueError(f"Group rank {group_rank} is not part of group {pg}")
    return pg._ranks[group_rank]


def _group_peer(pg: ProcessGroup, global_rank: int | None, group_rank: int | None, what: str,
                op_name: str = "") -> int:
    """The group rank of a ``src``/``dst`` given as a global rank or (``group_src``) as a group rank."""
    if global_rank is not None and group_rank is not None:
        raise ValueError(f"Can only specify {what} or group_{what}")
    if group_rank is not None:
        if not 0 <= group_rank < pg.size():
            raise ValueError(f"Group rank {group_rank} is not part of group {pg}")
        return group_rank
    if global_rank is None:
        if pg is _world.default_pg:
            return 0
        raise ValueError(f"Must specify either {what} or group_{what}")
    if global_rank not in pg._ranks:
        if pg is _world.default_pg and op_name:
            raise RuntimeError(f"ProcessGroup{_transport_label(pg)}::{op_name}: invalid root rank: {global_rank}")
        raise ValueError(f"Global rank {global_rank} is not part of group {pg}")
    return pg._ranks.index(global_rank)


def _transport_label(pg: ProcessGroup) -> str:
    return "Gloo" if pg._config.get("cpu") == Backend.GLOO else "NCCL"


# tensors


def _check_tensor(tensor, param: str) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type torch.Tensor\n"
                        f"             but got {type(tensor)} instead.")


def _check_tensor_list(tensors, param: str) -> None:
    if not isinstance(tensors, list) or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type List[torch.Tensor]\n"
                        f"             but got {type(tensors)} instead.")


def _tensor_backend(pg: ProcessGroup, tensor, op_name: str) -> TransportBackend:
    """The transport serving ``tensor``'s device (torch's error when the group has none for it)."""
    return pg._get_backend(tensor.device)


def _dense(tensor):
    """``tensor`` itself when it is contiguous (no copy, no dispatch), else a contiguous copy to send from."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _staged(output) -> tuple:
    """A contiguous tensor to receive into, and the copy back into ``output`` when that is a strided view."""
    if output.is_contiguous():
        return output, None
    buffer = output.contiguous()
    return buffer, lambda: output.copy_(buffer)


def _with_copy_back(work: Work, copy_back, output) -> Work:
    return work if copy_back is None else ComposedWork([work], copy_back, [output])


def _label(tensor) -> str:
    return "ProcessGroupNCCL" if tensor.device.type == "cuda" else "ProcessGroupGloo"


def _sizes(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _check_same_dtype(tensors: list) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        first, other = tensors[0].dtype, next(t.dtype for t in tensors if t.dtype != tensors[0].dtype)
        raise ValueError(f"Invalid usage of tensors with different dtypes. Found {other} and {first}")


def _check_same_kind(op_name: str, expected, got, index: int | str) -> None:
    if got.dtype != expected.dtype or got.device != expected.device:
        raise RuntimeError(f"{_label(expected)}::{op_name}: invalid tensor type at index {index} (expected dtype="
                           f"{expected.dtype}, device={expected.device}, got dtype={got.dtype}, device={got.device})")


def _check_same_size(op_name: str, expected_shape, got, index: int | str) -> None:
    if tuple(got.shape) != tuple(expected_shape):
        raise RuntimeError(f"{_label(got)}::{op_name}: invalid tensor size at index {index} (expected "
                           f"{_sizes(expected_shape)}, got {_sizes(got.shape)})")


def _check_op(op, tensor, op_name: str) -> RedOpType:
    op = RedOpType(op)
    if op in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR) and tensor.dtype.is_floating_point:
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")
    # gloo averages in float and cannot cast back (torch's error); NCCL's ncclAvg divides integers itself
    if op == RedOpType.AVG and not tensor.dtype.is_floating_point and tensor.device.type != "cuda":
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{c10_name(tensor.dtype)}")
    if op == RedOpType.PREMUL_SUM:
        raise RuntimeError(f"{op_name}: ReduceOp.PREMUL_SUM is only supported by the nccl backend")
    return op


def _finish(work: Work, async_op: bool) -> Work | None:
    if async_op:
        return work
    work.wait()
    return None


# collectives


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``tensor`` over the group, in place on every rank."""
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("all_reduce")
        return None
    pg = _resolve(group)
    op = _check_op(op, tensor, "all_reduce")
    if tensor.is_contiguous():
        work = _tensor_backend(pg, tensor, "all_reduce").allreduce([tensor], op)
    else:  # torch accepts strided tensors here: reduce a contiguous copy and write it back
        staged = tensor.contiguous()
        inner = _tensor_backend(pg, staged, "all_reduce").allreduce([staged], op)
        work = ComposedWork([inner], lambda: tensor.copy_(staged), [tensor])
    return _finish(work, async_op)


def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False, group_src: int | None = None):
    """Copy ``tensor`` of rank ``src`` into ``tensor`` of every rank."""
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("broadcast")
        return None
    pg = _resolve(group)
    root = _group_peer(pg, src, group_src, "src", "broadcast")
    if tensor.is_contiguous():
        work = _tensor_backend(pg, tensor, "broadcast").broadcast([tensor], root)
    else:
        staged = tensor.contiguous()
        inner = _tensor_backend(pg, staged, "broadcast").broadcast([staged], root)
        work = ComposedWork([inner], lambda: tensor.copy_(staged), [tensor])
    return _finish(work, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """``output_tensor`` = every rank's ``input_tensor`` concatenated on dim 0 (or stacked), in rank order."""
    _check_tensor(output_tensor, "output_tensor")
    _check_tensor(input_tensor, "input_tensor")
    if _not_member(group):
        _warn_not_in_group("all_gather_into_tensor")
        return None
    pg = _resolve(group)
    _check_same_kind("allgather_into_tensor", output_tensor, input_tensor, 0)
    if output_tensor.numel() != input_tensor.numel() * pg.size():
        raise RuntimeError(f"{_label(input_tensor)}::allgather_into_tensor: invalid tensor size (the output "
                           f"{_sizes(output_tensor.shape)} must hold world_size ({pg.size()}) times the input "
                           f"{_sizes(input_tensor.shape)})")
    backend = _tensor_backend(pg, output_tensor, "all_gather_into_tensor")
    output, copy_back = _staged(output_tensor)
    work = backend.allgather_into_tensor(output, _dense(input_tensor))
    return _finish(_with_copy_back(work, copy_back, output_tensor), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):  # noqa: A002
    """``output`` = this rank's dim-0 slice of ``input`` reduced over the group."""
    _check_tensor(output, "output")
    _check_tensor(input, "input")
    if _not_member(group):
        _warn_not_in_group("reduce_scatter_tensor")
        return None
    pg = _resolve(group)
    _check_same_kind("reduce_scatter_tensor", output, input, 0)
    op = _check_op(op, input, "reduce_scatter_tensor")
    if input.numel() != output.numel() * pg.size():
        raise RuntimeError(f"{_label(input)}::reduce_scatter_tensor: invalid tensor size (the input "
                           f"{_sizes(input.shape)} must hold world_size ({pg.size()}) times the output "
                           f"{_sizes(output.shape)})")
    backend = _tensor_backend(pg, input, "reduce_scatter_tensor")
    staged, copy_back = _staged(output)
    work = backend.reduce_scatter_tensor(staged, _dense(input), op)
    return _finish(_with_copy_back(work, copy_back, output), async_op)


def _flat_buffer(like, numel: int):
    return empty(numel, dtype=like.dtype, device=like.device)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """``tensor_list[i]`` = rank i's ``tensor``."""
    _check_tensor_list(tensor_list, "tensor_list")
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("all_gather")
        return None
    pg = _resolve(group)
    _check_same_dtype([tensor, *tensor_list])
    if len(tensor_list) != pg.size():
        raise RuntimeError(f"{_label(tensor)}::allgather: invalid output tensor list at index 0 (expected length "
                           f"{pg.size()}, got {len(tensor_list)})")
    for i, out in enumerate(tensor_list):
        _check_same_kind("allgather", tensor, out, i)
        _check_same_size("allgather", tensor.shape, out, i)
    backend = _tensor_backend(pg, tensor, "all_gather")
    n = tensor.numel()
    buffer = _flat_buffer(tensor, n * pg.size())
    inner = backend.allgather_into_tensor(buffer, _dense(tensor))

    def scatter_out() -> None:
        for i, out in enumerate(tensor_list):
            out.copy_(buffer[i * n:(i + 1) * n].reshape(out.shape))

    return _finish(ComposedWork([inner], scatter_out, tensor_list), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``output`` = ``input_list[rank]`` reduced over the group."""
    _check_tensor(output, "output")
    _check_tensor_list(input_list, "input_list")
    if _not_member(group):
        _warn_not_in_group("reduce_scatter")
        return None
    pg = _resolve(group)
    if len(input_list) != pg.size():
        raise RuntimeError(f"invalid input tensor list size, must be world size (world size {pg.size()}, got "
                           f"{len(input_list)} tensors)")
    for i, item in enumerate(input_list):
        _check_same_kind("reduce_scatter", output, item, i)
        _check_same_size("reduce_scatter", output.shape, item, i)
    op = _check_op(op, output, "reduce_scatter")
    backend = _tensor_backend(pg, output, "reduce_scatter")
    stacked = cat([t.reshape(-1) for t in input_list])
    inner = backend.reduce_scatter_tensor(output, stacked, op)
    return _finish(ComposedWork([inner], None, [output]), async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,  # noqa: A002
                      group=None, async_op: bool = False):
    """Rank i's dim-0 slice j of ``input`` goes to rank j's slice i of ``output`` (even or given splits)."""
    _check_tensor(output, "output")
    _check_tensor(input, "input")
    if _not_member(group):
        _warn_not_in_group("all_to_all_single")
        return None
    pg = _resolve(group)
    _check_same_kind("alltoall_base", output, input, 0)
    _check_splits(output, output_split_sizes, pg.size(), "output")
    _check_splits(input, input_split_sizes, pg.size(), "input")
    backend = _tensor_backend(pg, input, "all_to_all_single")
    staged, copy_back = _staged(output)
    work = backend.alltoall_base(staged, _dense(input), list(output_split_sizes or []) or None,
                                 list(input_split_sizes or []) or None)
    return _finish(_with_copy_back(work, copy_back, output), async_op)


def _check_splits(tensor, splits, size: int, what: str) -> None:
    rows = tensor.shape[0] if tensor.dim() else 1
    if not splits:
        if rows % size:
            raise RuntimeError(f"all_to_all_single: the {what} tensor's dim 0 ({rows}) must divide equally by "
                               f"world size {size} when no split sizes are given")
        return
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise RuntimeError(f"Split sizes doesn't match total dim 0 size: {what}_split_sizes {list(splits)} must "
                           f"have world size ({size}) non-negative entries summing to the {what} tensor's dim 0 "
                           f"({rows})")


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """``output_tensor_list[i]`` on rank j = ``input_tensor_list[j]`` of rank i."""
    _check_tensor_list(output_tensor_list, "output_tensor_list")
    _check_tensor_list(input_tensor_list, "input_tensor_list")
    if _not_member(group):
        _warn_not_in_group("all_to_all")
        return None
    pg = _resolve(group)
    if len(output_tensor_list) != pg.size() or len(input_tensor_list) != pg.size():
        raise RuntimeError(f"all_to_all: the tensor lists must have world_size={pg.size()} tensors (got "
                           f"{len(output_tensor_list)} outputs, {len(input_tensor_list)} inputs)")
    _check_same_dtype([*output_tensor_list, *input_tensor_list])
    first = input_tensor_list[0]
    for i, t in enumerate([*input_tensor_list, *output_tensor_list]):
        _check_same_kind("alltoall", first, t, i)
    backend = _tensor_backend(pg, first, "all_to_all")
    sent = cat([t.reshape(-1) for t in input_tensor_list])
    received = _flat_buffer(first, sum(t.numel() for t in output_tensor_list))
    inner = backend.alltoall_base(received, sent, [t.numel() for t in output_tensor_list],
                                  [t.numel() for t in input_tensor_list])

    def copy_out() -> None:
        offset = 0
        for out in output_tensor_list:
            out.copy_(received[offset:offset + out.numel()].reshape(out.shape))
            offset += out.numel()

    return _finish(ComposedWork([inner], copy_out, output_tensor_list), async_op)


def reduce(tensor, dst: int | None = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: int | None = None):
    """``tensor`` of rank ``dst`` = ``tensor`` reduced over the group; the others' tensors are unchanged."""
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("reduce")
        return None
    pg = _resolve(group)
    root = _group_peer(pg, dst, group_dst, "dst", "reduce")
    op = _check_op(op, tensor, "reduce")
    staged = tensor.contiguous().clone()
    inner = _tensor_backend(pg, staged, "reduce").allreduce([staged], op)
    finish = (lambda: tensor.copy_(staged)) if pg.rank() == root else None
    return _finish(ComposedWork([inner], finish, [tensor]), async_op)


def _check_root_list(pg, root: int, tensor, tensors: list, op_name: str, role: str, kind: str) -> None:
    """gather's and scatter's list: given on the ``role`` rank only, of world_size tensors like ``tensor``."""
    if pg.rank() != root:
        if tensors:
            raise ValueError(f"Argument ``{op_name}_list`` must NOT be specified on non-{role} ranks.")
        return
    if not tensors:
        raise ValueError(f"Argument ``{op_name}_list`` must be specified on {role} rank.")
    if len(tensors) != pg.size():
        raise RuntimeError(f"ProcessGroup{_transport_label(pg)}::{op_name}: requires a list of world_size "
                           f"({pg.size()}) {kind} tensors, got {len(tensors)}")
    for i, item in enumerate(tensors):
        _check_same_kind(op_name, tensor, item, i)
        _check_same_size(op_name, tensor.shape, item, i)


def gather(tensor, gather_list=None, dst: int | None = None, group=None, async_op: bool = False,
           group_dst: int | None = None):
    """On rank ``dst``, ``gather_list[i]`` = rank i's ``tensor``; other ranks pass no list."""
    _check_tensor(tensor, "tensor")
    if gather_list:
        _check_tensor_list(gather_list, "gather_list")
    else:
        gather_list = []
    if _not_member(group):
        _warn_not_in_group("gather")
        return None
    pg = _resolve(group)
    root = _group_peer(pg, dst, group_dst, "dst", "gather")
    _check_root_list(pg, root, tensor, gather_list, "gather", "destination", "output")
    backend = _tensor_backend(pg, tensor, "gather")
    n, size = tensor.numel(), pg.size()
    received = _flat_buffer(tensor, n * size if pg.rank() == root else 0)
    sent_splits = [n if r == root else 0 for r in range(size)]
    received_splits = [n] * size if pg.rank() == root else [0] * size
    inner = backend.alltoall_base(received, _dense(tensor).reshape(-1), received_splits, sent_splits)

    def copy_out() -> None:
        for i, out in enumerate(gather_list):
            out.copy_(received[i * n:(i + 1) * n].reshape(out.shape))

    return _finish(ComposedWork([inner], copy_out, gather_list), async_op)


def scatter(tensor, scatter_list=None, src: int | None = None, group=None, async_op: bool = False,
            group_src: int | None = None):
    """``tensor`` of rank i = ``scatter_list[i]`` of rank ``src``; other ranks pass no list."""
    _check_tensor(tensor, "tensor")
    if scatter_list:
        _check_tensor_list(scatter_list, "scatter_list")
    else:
        scatter_list = []
    if _not_member(group):
        _warn_not_in_group("scatter")
        return None
    pg = _resolve(group)
    root = _group_peer(pg, src, group_src, "src", "scatter")
    _check_root_list(pg, root, tensor, scatter_list, "scatter", "source", "input")
    sent = cat([t.reshape(-1) for t in scatter_list]) if pg.rank() == root else _flat_buffer(tensor, 0)
    backend = _tensor_backend(pg, tensor, "scatter")
    n, size = tensor.numel(), pg.size()
    received = _flat_buffer(tensor, n)
    sent_splits = [n] * size if pg.rank() == root else [0] * size
    received_splits = [n if r == root else 0 for r in range(size)]
    inner = backend.alltoall_base(received, sent, received_splits, sent_splits)
    return _finish(ComposedWork([inner], lambda: tensor.copy_(received.reshape(tensor.shape)), [tensor]),
                   async_op)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout: datetime.timedelta | None = None):
    """Return once every rank of the group has called barrier."""
    if _not_member(group):
        _warn_not_in_group("barrier")
        return None
    pg = _resolve(group)
    device_type = "cpu" if pg._has_backend("cpu") else pg._device_types()[0]
    work = pg._get_backend(device_type).barrier()
    if async_op:
        return work
    work.wait(timeout)
    return None


def monitored_barrier(group=None, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """A barrier through the store in which rank 0 names the ranks that did not arrive within ``timeout``."""
    if _not_member(group):
        _warn_not_in_group("monitored_barrier")
        return None
    pg = _resolve(group)
    if not pg._has_backend("cpu"):
        raise ValueError("monitored_barrier is only implemented for GLOO backend.")
    timeout = timeout if timeout is not None else pg._timeout
    pg._monitored_count = getattr(pg, "_monitored_count", 0) + 1
    key = f"monitored_barrier/{pg._monitored_count}"
    if pg.rank() != 0:
        pg._store.set(f"{key}/{pg.rank()}", "1")
        pg._store.wait([f"{key}/released"], timeout)
        return None
    missing = []
    for r in range(1, pg.size()):
        try:
            pg._store.wait([f"{key}/{r}"], timeout if not missing else datetime.timedelta(milliseconds=1))
        except RuntimeError:
            missing.append(r)
            if not wait_all_ranks:
                break
    if missing:
        ms = int(timeout.total_seconds() * 1000)
        if wait_all_ranks:
            raise RuntimeError(f"Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms")
        raise RuntimeError(f"Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
    pg._store.set(f"{key}/released", "1")
    return None


# point to point


def _p2p_backend(pg: ProcessGroup, tensor, peer: int, op_name: str) -> TransportBackend:
    if peer == pg.rank():
        word = "destination" if op_name in ("send", "isend") else "source"
        raise ValueError(f"Invalid {word} rank: {word} rank should not be the same as the rank of the current "
                         "process.")
    return _tensor_backend(pg, tensor, op_name)


def isend(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None):
    """Send ``tensor`` to rank ``dst``; returns a Work (None outside the group)."""
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("isend")
        return None
    pg = _resolve(group)
    peer = _group_peer(pg, dst, group_dst, "dst")
    return _p2p_backend(pg, tensor, peer, "isend").send([_dense(tensor)], peer, tag)


def irecv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None):
    """Receive into ``tensor`` from rank ``src`` (any rank when both src and group_src are None)."""
    _check_tensor(tensor, "tensor")
    if _not_member(group):
        _warn_not_in_group("irecv")
        return None
    pg = _resolve(group)
    staged, copy_back = _staged(tensor)
    if src is None and group_src is None:
        work = _tensor_backend(pg, tensor, "irecv").recv([staged], -1, tag)
    else:
        peer = _group_peer(pg, src, group_src, "src")
        work = _p2p_backend(pg, tensor, peer, "irecv").recv([staged], peer, tag)
    return _with_copy_back(work, copy_back, tensor)


def send(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> None:
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor``; returns the sender's global rank (-1 outside the group)."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    pg = _resolve(group)
    if src is None and group_src is None:  # from any rank: the transport says which (torch's recv_anysource)
        return get_global_rank(pg, work.source_rank())
    return get_global_rank(pg, _group_peer(pg, src, group_src, "src"))


class P2POp:
    """One point-to-point operation for ``batch_isend_irecv``: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op: Callable, tensor, peer: int | None = None, group=None, tag: int = 0,
                 group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             "``torch.distributed.irecv``.")
        _check_tensor(tensor, "tensor")
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer, tag
        self.group, self.group_peer = group, group_peer

    def __repr__(self) -> str:
        return f"P2POp(op={self.op.__name__}, peer={self.peer}, tensor shape={tuple(self.tensor.shape)})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Issue every operation of the list; returns their works in order."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    groups = {id(_resolve(p.group)) for p in p2p_op_list}
    if len(groups) > 1:
        raise ValueError("All ops need to use the same group.")
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return works
