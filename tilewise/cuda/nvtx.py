"""``tilewise.cuda.nvtx``: torch.cuda.nvtx's ranges and marks, through NVIDIA's ``nvtx`` package.

NVTX annotations show as named ranges on Nsight Systems' timeline, over the CUDA work they enclose. The
``nvtx`` package is optional: without it every call here does nothing and the first one warns. torch raises a
RuntimeError instead when its build lacks NVTX; tilewise does not, so that annotated code runs unchanged
where the package (or a GPU) is missing — the annotations cost nothing to leave in. The depths
``range_push``/``range_pop`` return are counted per thread here, as NVTX counts them.

>>> from tilewise.cuda import nvtx
>>> with nvtx.range("layer {}", 3):
...     pass
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings

__all__ = ["mark", "range", "range_end", "range_pop", "range_push", "range_start"]

_UNLOADED = object()
_nvtx = _UNLOADED
_depth = threading.local()
_open_ranges: dict[int, object] = {}  # range_start's handles -> nvtx's range ids
_handles = itertools.count(1)


def library():
    """NVIDIA's ``nvtx`` module, or None where it is not installed (warned about once)."""
    global _nvtx
    if _nvtx is _UNLOADED:
        try:
            import nvtx
        except ImportError:
            warnings.warn("tilewise.cuda.nvtx: the nvtx package is not installed, so NVTX ranges and marks are "
                          "not emitted (pip install nvtx to see them in Nsight Systems)", stacklevel=3)
            nvtx = None
        _nvtx = nvtx
    return _nvtx


def range_push(msg: str) -> int:
    """Open a range on this thread's stack; returns its zero-based depth."""
    nvtx = library()
    if nvtx is not None:
        nvtx.push_range(msg)
    depth = getattr(_depth, "value", 0)
    _depth.value = depth + 1
    return depth


def range_pop() -> int:
    """Close this thread's innermost range; returns its zero-based depth (-1 when none was open, as NVTX)."""
    depth = getattr(_depth, "value", 0)
    if depth == 0:
        return -1
    nvtx = library()
    if nvtx is not None:
        nvtx.pop_range()
    _depth.value = depth - 1
    return depth - 1


def range_start(msg: str) -> int:
    """Open a range that may end on another thread; returns the handle :func:`range_end` takes."""
    nvtx = library()
    handle = next(_handles)
    _open_ranges[handle] = nvtx.start_range(msg) if nvtx is not None else None
    return handle


def range_end(range_id: int) -> None:
    range_handle = _open_ranges.pop(range_id, None)
    if range_handle is not None:
        library().end_range(range_handle)


def mark(msg: str) -> None:
    """An instantaneous event on the timeline."""
    nvtx = library()
    if nvtx is not None:
        nvtx.mark(msg)


@contextlib.contextmanager
def range(msg: str, *args, **kwargs):  # noqa: A001 — torch's name
    """A range around a block (or, as a decorator, a function); extra arguments format ``msg``."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
