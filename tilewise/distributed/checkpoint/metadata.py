"""What a sharded checkpoint's index holds: for every entry of the flattened state dict, the full tensor's
shape and dtype and which rank file holds which block of it (or which file holds a non-tensor value).

[Note: checkpoint index] A checkpoint is a directory: one file per rank (``__<rank>_0.distcp``, a tilewise
checkpoint holding ``{"tensors": {key: block}, "objects": {key: value}}``) and ``metadata.json``, written by
rank 0 once every rank has written its file. Keys are the state dict's nested keys joined by dots
(``model.blocks.0.fc1.weight``, ``optim.state.head.bias.exp_avg``). A tensor appears as blocks, each given by
its offsets and sizes in the full tensor: a shard of ``fully_shard`` is the block of rows its rank holds, any
other tensor is replicated and stored once, by rank 0, as one block covering it all. A reader of any world
size takes from each block the part that overlaps the region it needs, opening only the files that hold one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

METADATA_FILE = "metadata.json"


def rank_file(rank: int) -> str:
    return f"__{rank}_0.distcp"


@dataclass
class Chunk:
    """A block of a full tensor: stored in ``file`` under ``key``, at ``offsets`` with ``sizes``."""

    file: str
    offsets: list[int]
    sizes: list[int]


@dataclass
class TensorEntry:
    shape: list[int]
    dtype: str
    chunks: list[Chunk] = field(default_factory=list)


@dataclass
class Metadata:
    """The index of a checkpoint: ``tensors`` (key -> shape, dtype, blocks) and ``objects`` (key -> file)."""

    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        tensors = {k: {"shape": e.shape, "dtype": e.dtype,
                       "chunks": [{"file": c.file, "offsets": c.offsets, "sizes": c.sizes} for c in e.chunks]}
                   for k, e in self.tensors.items()}
        return json.dumps({"version": 1, "tensors": tensors, "objects": self.objects}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Metadata:
        raw = json.loads(text)
        tensors = {k: TensorEntry(e["shape"], e["dtype"], [Chunk(**c) for c in e["chunks"]])
                   for k, e in raw["tensors"].items()}
        return cls(tensors, raw["objects"])

    def merge(self, other: Metadata) -> None:
        for key, entry in other.tensors.items():
            mine = self.tensors.setdefault(key, TensorEntry(entry.shape, entry.dtype))
            if mine.shape != entry.shape:
                raise RuntimeError(f"distributed checkpoint save: ranks disagree on the full shape of '{key}': "
                                   f"{mine.shape} and {entry.shape}")
            mine.chunks += entry.chunks
        self.objects.update(other.objects)


def write_atomically(path: str, write) -> None:
    """``write(temporary_path)``, then rename over ``path``: a reader never sees a half-written file."""
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def read_metadata(directory: str) -> Metadata:
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"distributed checkpoint load: {directory!r} holds no {METADATA_FILE} (not a "
                                "checkpoint written by tilewise.distributed.checkpoint.save, or one whose save did "
                                "not finish)")
    with open(path) as f:
        return Metadata.from_json(f.read())
