"""``save`` and ``load`` of a state dict as a sharded checkpoint (see [Note: checkpoint index])."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from tilewise.autograd.grad_mode import no_grad
from tilewise.distributed.checkpoint.metadata import (
    METADATA_FILE,
    Chunk,
    Metadata,
    TensorEntry,
    rank_file,
    read_metadata,
    write_atomically,
)
from tilewise.serialization import load as load_file
from tilewise.serialization import save as save_file
from tilewise.tensor import Tensor


def _dist():
    import tilewise.distributed as dist  # the package imports this module, so it is read at call time

    return dist


def _distributed(no_dist: bool) -> bool:
    return not no_dist and _dist().is_initialized()


def _leaves(obj: Mapping, prefix: str = "") -> Iterator[tuple[str, dict, Any, Any]]:
    """Every non-dict value of a nested state dict: ``(dotted key, its dict, its key there, value)``."""
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from _leaves(v, key + ".")
        else:
            yield key, obj, k, v


def _flat(state_dict: Mapping, what: str) -> dict[str, tuple[dict, Any, Any]]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"distributed checkpoint {what}: state_dict must be a dict, got {type(state_dict).__name__}")
    flat: dict[str, tuple[dict, Any, Any]] = {}
    for key, parent, k, v in _leaves(state_dict):
        if key in flat:
            raise ValueError(f"distributed checkpoint {what}: two entries flatten to the key '{key}'")
        flat[key] = (parent, k, v)
    return flat


def _block_of(t: Tensor) -> tuple[list[int], list[int], list[int]]:
    """(full shape, offsets, sizes) of the block a tensor holds: a ``fully_shard`` shard's rows, else all of it."""
    spec = t.__dict__.get("_fsdp_shard")
    if spec is None:
        return list(t.shape), [0] * t.dim(), list(t.shape)
    return list(spec.full_shape), list(spec.offsets), list(t.shape)


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).rsplit(".", 1)[-1]


def save(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None, storage_writer=None, planner=None,
         process_group=None, no_dist: bool = False) -> Metadata:
    """Write ``state_dict`` into the directory ``checkpoint_id``: every rank writes the blocks it holds (shards
    of ``fully_shard`` modules; replicated tensors and other values from rank 0 only), then rank 0 writes the
    index. Call it on every rank; it returns once the whole checkpoint is on disk. Returns the index.

    >>> import tilewise as tw, tilewise.distributed.checkpoint as dcp, tempfile
    >>> directory = tempfile.mkdtemp()
    >>> _ = dcp.save({"w": tw.ones(2, 3), "step": 7}, checkpoint_id=directory)
    >>> target = {"w": tw.zeros(2, 3), "step": 0}
    >>> dcp.load(target, checkpoint_id=directory); target["step"], target["w"].sum().item()
    (7, 6.0)
    """
    directory = _directory(checkpoint_id, storage_writer, planner, "save")
    dist = _dist()
    distributed = _distributed(no_dist)
    rank = dist.get_rank(process_group) if distributed else 0
    os.makedirs(directory, exist_ok=True)
    name = rank_file(rank)
    tensors: dict[str, Tensor] = {}
    objects: dict[str, Any] = {}
    index = Metadata()
    for key, (_, _, value) in _flat(state_dict, "save").items():
        if isinstance(value, Tensor):
            shape, offsets, sizes = _block_of(value)
            entry = index.tensors[key] = TensorEntry(shape, _dtype_name(value))
            sharded = "_fsdp_shard" in value.__dict__
            if (sharded or rank == 0) and value.numel():
                tensors[key] = value.detach().to("cpu").contiguous()
                entry.chunks.append(Chunk(name, offsets, sizes))
        elif rank == 0:
            objects[key] = value
            index.objects[key] = name
    write_atomically(os.path.join(directory, name),
                     lambda path: save_file({"tensors": tensors, "objects": objects}, path))
    if distributed:
        indexes: list = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(indexes, index, group=process_group)
        index = Metadata()
        for part in indexes:
            index.merge(part)
    if rank == 0:
        text = index.to_json()
        write_atomically(os.path.join(directory, METADATA_FILE), lambda path: _write_text(path, text))
    if distributed:
        dist.barrier(group=process_group)
    return index


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _directory(checkpoint_id, storage_writer, planner, what: str) -> str:
    if storage_writer is not None or planner is not None:
        raise NotImplementedError(f"distributed checkpoint {what}: custom storage writers/readers and planners are "
                                  "not supported; pass checkpoint_id (a directory)")
    if checkpoint_id is None:
        raise ValueError(f"distributed checkpoint {what}: checkpoint_id (the checkpoint's directory) is required")
    return os.fspath(checkpoint_id)


class _Files:
    """The rank files of one checkpoint, each read at its first use."""

    def __init__(self, directory: str):
        self.directory = directory
        self.loaded: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.loaded:
            self.loaded[name] = load_file(os.path.join(self.directory, name))
        return self.loaded[name]


def _overlap(offsets_a, sizes_a, offsets_b, sizes_b) -> list[tuple[int, int]] | None:
    """The region both blocks cover, per dimension ``(start, stop)`` in full-tensor coordinates; None if none."""
    region = []
    for oa, sa, ob, sb in zip(offsets_a, sizes_a, offsets_b, sizes_b):
        lo, hi = max(oa, ob), min(oa + sa, ob + sb)
        if lo >= hi:
            return None
        region.append((lo, hi))
    return region


def _slices(region, offsets) -> tuple[slice, ...]:
    return tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(region, offsets))


def _fill(target: Tensor, key: str, entry: TensorEntry, files: _Files) -> None:
    shape, offsets, sizes = _block_of(target)
    if shape != entry.shape:
        raise RuntimeError(f"distributed checkpoint load: size mismatch for '{key}': the checkpoint holds shape "
                           f"{entry.shape}, the state dict's tensor is (part of) shape {shape}")
    covered = 0
    with no_grad():
        for chunk in entry.chunks:
            region = _overlap(offsets, sizes, chunk.offsets, chunk.sizes)
            if region is None:
                continue
            block = files[chunk.file]["tensors"][key]
            part = block[_slices(region, chunk.offsets)] if region else block
            destination = target[_slices(region, offsets)] if region else target
            destination.copy_(part.to(device=target.device, dtype=target.dtype))
            covered += part.numel()
    if covered != target.numel():
        raise RuntimeError(f"distributed checkpoint load: the checkpoint's blocks of '{key}' cover {covered} of the "
                           f"{target.numel()} elements asked for")


def load(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None, storage_reader=None, planner=None,
         process_group=None, no_dist: bool = False) -> None:
    """Fill ``state_dict`` in place from the checkpoint in ``checkpoint_id``: each tensor (a shard of a
    ``fully_shard`` module: its rows; any other: all of it) is copied from the blocks that overlap it, whatever
    world size wrote them; other values are replaced. Every key of ``state_dict`` must be in the checkpoint."""
    directory = _directory(checkpoint_id, storage_reader, planner, "load")
    index = read_metadata(directory)
    files = _Files(directory)
    for key, (parent, k, value) in _flat(state_dict, "load").items():
        if isinstance(value, Tensor):
            entry = index.tensors.get(key)
            if entry is None:
                raise RuntimeError(f"distributed checkpoint load: '{key}' is not in the checkpoint {directory!r}")
            _fill(value, key, entry, files)
        elif key in index.objects:
            parent[k] = files[index.objects[key]]["objects"][key]
        else:
            raise RuntimeError(f"distributed checkpoint load: '{key}' is not in the checkpoint {directory!r}")
