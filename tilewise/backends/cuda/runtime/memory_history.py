"""What the caching allocator did, and why: torch's memory history and snapshot, for tilewise's allocator.

[Note: memory history] ``torch.cuda.memory._record_memory_history`` makes the caching allocator log every
action it takes (``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
``oom``) with the Python frames that caused it, and ``_snapshot`` returns that log beside the allocator's
segments and blocks, as plain dictionaries that torch's ``memory_viz`` reads. A ``MemoryHistory`` is that log
for one ``CachingAllocator``: the allocator holds ``history = None`` until recording is asked for and checks
it once per malloc/free (one attribute read: nothing else costs anything while disabled); while it records,
the allocator reports each action here, under its own lock. ``enabled="state"`` keeps only the frames of the
live blocks; ``"all"`` also keeps the trace, a ring of at most ``max_entries`` entries (the oldest dropped,
as torch's ring buffer does). ``context`` says where frames are kept: ``"state"`` on live blocks only,
``"alloc"`` on alloc entries too, ``"all"`` on frees as well; ``None`` nowhere. Frames are Python's only
(``stacks="all"`` has no C++ frames to add here), innermost first, the allocator's own frames left out.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

ENABLED = (None, "state", "all")
CONTEXTS = (None, "state", "alloc", "all")
STACKS = ("python", "all")
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot")
BLOCK_STATES = {"allocated": "active_allocated", "pending": "active_awaiting_free", "free": "inactive"}

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
_INTERNAL_FILES = {os.path.join(_RUNTIME_DIR, name) for name in ("allocator.py", "memory_history.py")}


class MemoryHistory:
    """The recorded actions of one allocator (see [Note: memory history])."""

    def __init__(self, device: int, enabled: str = "all", context: str | None = "all", stacks: str = "python",
                 max_entries: int = sys.maxsize, skip_actions: list[str] | None = None) -> None:
        check_settings(enabled, context, stacks, max_entries, skip_actions)
        self.device = device
        self.enabled = enabled
        self.context = context
        self.stacks = stacks
        self.skip = frozenset(skip_actions or ())
        self.trace: deque[dict] | None = deque(maxlen=max_entries) if enabled == "all" else None
        self.frames: dict[int, list[dict]] = {}  # live block or segment address -> the frames that made it

    def _needs_frames(self, action: str) -> bool:
        if self.context is None:
            return False
        if action in ("alloc", "segment_alloc"):  # kept on the live block (or segment) in every context
            return True
        return self.context == "all" and self.trace is not None

    def record(self, action: str, addr: int, size: int, stream: int, **extra) -> None:
        """One allocator action; alloc and segment_alloc remember their frames for the snapshot's blocks."""
        makes = action in ("alloc", "segment_alloc")
        frames = python_frames() if self._needs_frames(action) else []
        if makes and self.context is not None:
            self.frames[(action, addr)] = frames
        elif action == "free_completed":
            self.frames.pop(("alloc", addr), None)
        elif action == "segment_free":
            self.frames.pop(("segment_alloc", addr), None)
        if self.trace is None or action in self.skip:
            return
        in_entry = self.context == "all" or (self.context == "alloc" and makes)
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                           "time_us": time.time_ns() // 1000, "frames": frames if in_entry else [], **extra})

    def continue_from(self, previous: MemoryHistory) -> None:
        """Carry on ``previous``'s log and live frames (recording restarted without clearing its history)."""
        self.frames.update(previous.frames)
        if self.trace is not None:
            self.trace.extend(previous.entries())

    def block_frames(self, addr: int) -> list[dict]:
        return self.frames.get(("alloc", addr), [])

    def segment_frames(self, addr: int) -> list[dict]:
        return self.frames.get(("segment_alloc", addr), [])

    def entries(self) -> list[dict]:
        return list(self.trace) if self.trace is not None else []


def check_settings(enabled, context, stacks, max_entries, skip_actions) -> None:
    """torch's argument checks of ``_record_memory_history``, with tilewise's wording."""
    if enabled not in ENABLED:
        raise ValueError(f"_record_memory_history: enabled must be one of {ENABLED}, got {enabled!r}")
    if context not in CONTEXTS:
        raise ValueError(f"_record_memory_history: context must be one of {CONTEXTS}, got {context!r}")
    if stacks not in STACKS:
        raise ValueError(f"_record_memory_history: stacks must be one of {STACKS}, got {stacks!r}")
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"_record_memory_history: max_entries must be a positive int, got {max_entries!r}")
    unknown = sorted(set(skip_actions or ()) - set(ACTIONS))
    if unknown:
        raise ValueError(f"_record_memory_history: unknown skip_actions {unknown}; valid actions are {ACTIONS}")


def python_frames() -> list[dict]:
    """The calling Python frames, innermost first, as torch's snapshot writes them."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename not in _INTERNAL_FILES:
            frames.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return frames


def segment_dict(device: int, info, history: MemoryHistory | None) -> dict:
    """A ``SegmentInfo`` (allocator.segments()) as torch's ``Segment`` dictionary, its blocks included."""
    blocks = [{"address": b.ptr, "size": b.size, "requested_size": b.requested, "state": BLOCK_STATES[b.state],
               "frames": history.block_frames(b.ptr) if history is not None and b.state != "free" else []}
              for b in info.blocks]
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": info.ptr, "total_size": info.size, "allocated_size": allocated,
            "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks),
            "stream": info.stream, "segment_type": info.pool,
            "segment_pool_id": (info.pool_id, 0), "is_expandable": False,
            "frames": history.segment_frames(info.ptr) if history is not None else [], "blocks": blocks}


def snapshot_of(allocators: dict) -> dict:
    """torch's ``Snapshot`` of the given allocators (device index -> ``CachingAllocator``): every segment,
    then one trace per device index up to the highest."""
    segments, traces = [], [[] for _ in range(max(allocators, default=-1) + 1)]
    for device, allocator in sorted(allocators.items()):
        infos, history = allocator.segments_and_history()
        segments += [segment_dict(device, info, history) for info in infos]
        if history is not None:
            traces[device] = history.entries()
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}
