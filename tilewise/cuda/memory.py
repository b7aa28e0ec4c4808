"""``tilewise.cuda.memory``: torch.cuda.memory's history of the caching allocator (its statistics,
``memory_allocated`` and the rest, are ``tilewise.cuda``'s).

``_record_memory_history`` starts (or stops) the allocator's log of every alloc, free and segment (see
[Note: memory history] in ``backends/cuda/runtime/memory_history``), ``_snapshot`` returns it with the
segments and blocks as torch's dictionaries, ``_dump_snapshot`` pickles that for torch's ``memory_viz``,
and ``plot_timeline`` draws live bytes over time, one band per allocation, the largest labelled by the Python
frames that made them (``memory_timeline``).

>>> from tilewise.cuda import memory
>>> memory._record_memory_history(enabled="all", context="all", max_entries=10000)
>>> sorted(memory._snapshot())
['allocator_settings', 'device_traces', 'segments']
>>> memory._record_memory_history(enabled=None)
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from tilewise.backends.cuda.runtime import allocator as _allocator
from tilewise.backends.cuda.runtime.memory_history import check_settings, snapshot_of
from tilewise.cuda.memory_timeline import plot_timeline  # noqa: F401


def _record_memory_history(enabled: str | bool | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                           compile_context: bool = False, global_record_annotations: bool = False,
                           skip_actions: list[str] | None = None) -> None:
    """Record what the caching allocator does, on every device (torch's ``device`` is accepted and, as
    there, recording covers the whole process). ``enabled=None`` stops and drops the history; a bool is
    torch's legacy spelling (True: "all")."""
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    check_settings(enabled, context, stacks, max_entries, skip_actions)
    settings = None if enabled is None else {"enabled": enabled, "context": context, "stacks": stacks,
                                             "max_entries": max_entries, "skip_actions": skip_actions}
    _bypass_free_lists(settings is not None)  # first: the blocks the free lists give back are no frees to record
    _allocator.set_history(settings, keep=not clear_history)


def _bypass_free_lists(bypass: bool) -> None:
    """The CUDA backend's small-block free lists answer mallocs without the allocator; while history records,
    every request goes to the allocator instead (see [Note: small-block fast path])."""
    if "tilewise.backends.cuda.device_memory" not in sys.modules:  # no CUDA tensor was ever made: nothing cached
        return
    from tilewise.backends.cuda import device_memory

    for mem in list(device_memory._memories.values()):
        mem.bypass_free_lists(bypass)


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    """torch's ``Snapshot``: ``segments`` (each with its ``blocks``), ``device_traces`` (one list of actions per
    device) and ``allocator_settings``. The segments are there whether or not history records (their blocks'
    frames only while it does); the traces are empty unless ``_record_memory_history(enabled="all")`` runs."""
    return snapshot_of(_allocator.device_allocators())


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickle :func:`_snapshot` to ``filename``, as torch's, for pytorch.org/memory_viz."""
    snapshot = _snapshot()
    with open(filename, "wb") as file:
        pickle.dump(snapshot, file)
