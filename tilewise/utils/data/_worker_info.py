"""What a DataLoader worker process knows about itself (``get_worker_info``), apart from the worker's loop.

It is a module of its own because both sides read it: the worker loop (``_worker``) sets it when the process
starts, and collation (``collate``) asks it whether to write a batch into shared memory; the loop in turn fetches
and collates, so neither could hold it without the two importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker process."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker process, its id, the number of workers, its seed and its copy of the dataset;
    ``None`` in the main process.

    >>> from tilewise.utils.data import get_worker_info
    >>> get_worker_info() is None
    True
    """
    return _worker_info


def set_worker_info(info: WorkerInfo) -> None:
    """Called once by a worker process as it starts."""
    global _worker_info
    _worker_info = info
