"""Object collectives: picklable Python objects between ranks (all_gather_object, broadcast_object_list, ...).

[Note: object collectives] As in torch, an object is pickled into a uint8 tensor on the group's CPU transport
(else the current CUDA device); the sizes travel first (an all-gather or broadcast of int64 lengths), then the
bytes, padded to the longest where a collective needs equal sizes. Unpickling runs whatever the sender
pickled: use these only between processes of one job, as torch warns.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

from tilewise.cuda import current_device
from tilewise.device import Device
from tilewise.distributed.c10d import (
    ProcessGroup,
    _flat_buffer,
    _group_peer,
    _not_member,
    _resolve,
    _warn_not_in_group,
    all_gather_into_tensor,
    broadcast,
    gather,
    scatter,
)
from tilewise.dtypes import int64, uint8
from tilewise.ops.creation import empty, zeros
from tilewise.ops.functions import cat
from tilewise.tensor import from_numpy, tensor


def _object_device(pg: ProcessGroup):
    if pg._has_backend("cpu"):
        return Device("cpu")
    return Device("cuda", current_device())


def _object_to_tensor(obj, device):
    buffer = io.BytesIO()
    pickle.Pickler(buffer).dump(obj)
    data = from_numpy(np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy())
    return data.to(device), tensor([data.numel()], dtype=int64).to(device)


def _tensor_to_object(tensor, size: int):
    return pickle.loads(tensor.cpu().numpy()[:size].tobytes())


def _all_gather_sizes(size_tensor, pg: ProcessGroup) -> list[int]:
    sizes = _flat_buffer(size_tensor, pg.size())
    all_gather_into_tensor(sizes, size_tensor, group=pg)
    return [int(s) for s in sizes.cpu().numpy()]


def all_gather_object(object_list: list, obj, group=None) -> None:
    """``object_list[i]`` = rank i's picklable ``obj``."""
    if _not_member(group):
        _warn_not_in_group("all_gather_object")
        return
    pg = _resolve(group)
    data, size = _object_to_tensor(obj, _object_device(pg))
    sizes = _all_gather_sizes(size, pg)
    longest = max(sizes)
    padded = cat([data, _flat_buffer(data, longest - data.numel())]) if longest > data.numel() else data
    gathered = _flat_buffer(data, longest * pg.size())
    all_gather_into_tensor(gathered, padded, group=pg)
    for i, n in enumerate(sizes):
        object_list[i] = _tensor_to_object(gathered[i * longest:(i + 1) * longest], n)


def broadcast_object_list(object_list: list, src: int | None = None, group=None, device=None,
                          group_src: int | None = None) -> None:
    """Replace ``object_list`` on every rank with rank ``src``'s (same length on every rank)."""
    if _not_member(group):
        _warn_not_in_group("broadcast_object_list")
        return
    pg = _resolve(group)
    root = _group_peer(pg, src, group_src, "src")
    device = Device(device) if device is not None else _object_device(pg)
    sizes = zeros(len(object_list), dtype=int64, device=device)
    if pg.rank() == root:
        pieces = [_object_to_tensor(obj, device) for obj in object_list]
        sizes = cat([n for _, n in pieces]) if pieces else sizes
    broadcast(sizes, group=pg, group_src=root)
    counts = [int(s) for s in sizes.cpu().numpy()]
    if pg.rank() == root:
        payload = cat([d for d, _ in pieces]) if pieces else _flat_buffer(sizes, 0)
        payload = payload.to(uint8)
    else:
        payload = empty(sum(counts), dtype=uint8, device=device)
    broadcast(payload, group=pg, group_src=root)
    if pg.rank() != root:
        offset = 0
        for i, n in enumerate(counts):
            object_list[i] = _tensor_to_object(payload[offset:offset + n], n)
            offset += n


def gather_object(obj, object_gather_list: list | None = None, dst: int | None = None, group=None,
                  group_dst: int | None = None) -> None:
    """On rank ``dst``, ``object_gather_list[i]`` = rank i's ``obj``."""
    if _not_member(group):
        _warn_not_in_group("gather_object")
        return
    pg = _resolve(group)
    root = _group_peer(pg, dst, group_dst, "dst")
    if pg.rank() == root and (object_gather_list is None or len(object_gather_list) != pg.size()):
        raise ValueError(f"Argument ``object_gather_list`` must be a list of world_size={pg.size()} elements on "
                         "the destination rank")
    data, size = _object_to_tensor(obj, _object_device(pg))
    sizes = _all_gather_sizes(size, pg)
    longest = max(sizes)
    padded = cat([data, _flat_buffer(data, longest - data.numel())]) if longest > data.numel() else data
    outputs = [_flat_buffer(data, longest) for _ in range(pg.size())] if pg.rank() == root else None
    gather(padded, outputs, group=pg, group_dst=root)
    if pg.rank() == root:
        for i, n in enumerate(sizes):
            object_gather_list[i] = _tensor_to_object(outputs[i], n)


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int | None = None, group=None, group_src: int | None = None) -> None:
    """``scatter_object_output_list[0]`` on rank i = ``scatter_object_input_list[i]`` of rank ``src``."""
    if _not_member(group):
        _warn_not_in_group("scatter_object_list")
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    pg = _resolve(group)
    root = _group_peer(pg, src, group_src, "src")
    device = _object_device(pg)
    longest = zeros(1, dtype=int64, device=device)
    if pg.rank() == root:
        pieces = [_object_to_tensor(obj, device) for obj in scatter_object_input_list]
        longest = tensor([max(int(n.item()) for _, n in pieces)], dtype=int64).to(device)
    broadcast(longest, group=pg, group_src=root)
    width = int(longest.item())
    mine = _flat_buffer(empty(0, dtype=uint8, device=device), width)
    my_size = zeros(1, dtype=int64, device=device)
    padded = sizes = None
    if pg.rank() == root:
        padded = [cat([d, _flat_buffer(d, width - d.numel())]) for d, _ in pieces]
        sizes = [n for _, n in pieces]
    scatter(mine, padded, group=pg, group_src=root)
    scatter(my_size, sizes, group=pg, group_src=root)
    scatter_object_output_list[0] = _tensor_to_object(mine, int(my_size.item()))
