"""Whether this thread is capturing a CUDA graph, and the host operations refused meanwhile.

[Note: host operations under capture]
Work queued on a stream being captured does not run: it is recorded into a graph that runs later, once per
replay. Host code that reads device memory (a download, ``.item()``), waits for the device (a synchronize),
uploads from host memory, or draws random numbers (a seed and offset read on the host, then fixed in the
graph) would therefore see values not yet computed, or bake in a host address or a draw that every replay
repeats. The driver catches some of these (synchronizing a capturing stream invalidates the capture), not
all (a copy from pageable memory may be captured with the address of a temporary array). So the runtime
refuses them itself, with one thread-local check in each: while :func:`capture_scope` is active on this thread,
:func:`refuse_under_capture` raises :class:`StreamCaptureError`, which the capture turns into "this cannot be
captured" (a compiled program then runs its steps uncaptured). Other threads are not affected: their work is
not on the capturing stream.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StreamCaptureError(RuntimeError):
    """A host operation that cannot be part of a CUDA graph was attempted while one was being captured."""


class _CaptureState(threading.local):
    stream: int | None = None  # the handle of the stream this thread is capturing on, if any


_state = _CaptureState()


def is_current_stream_capturing() -> bool:
    """True while this thread is capturing a CUDA graph (torch.cuda.is_current_stream_capturing)."""
    return _state.stream is not None


def refuse_under_capture(what: str) -> None:
    """Raise :class:`StreamCaptureError` naming ``what`` when this thread is capturing a CUDA graph."""
    if _state.stream is not None:
        raise StreamCaptureError(f"{what} is not permitted while a CUDA graph is being captured (operation not "
                                 "permitted when stream is capturing): the graph would replay it with the values "
                                 "and addresses of the capture")


@contextmanager
def capture_scope(stream: int) -> Iterator[None]:
    """Mark this thread as capturing on ``stream`` for the duration of the block."""
    previous = _state.stream
    _state.stream = int(stream)
    try:
        yield
    finally:
        _state.stream = previous
