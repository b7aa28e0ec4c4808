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

[Note: graphs that hold a communicator] A NCCL collective captured into a CUDA graph makes the graph hold a
reference on its communicator (NCCL's persistent plans), and ``ncclCommDestroy`` waits until every such graph is
destroyed: a process group destroyed while a compiled step's graph is alive would hang for ever (torch has the
same hang, pytorch#115388). So what a capture records on a communicator is noted here
(:func:`note_capture_holds`); the capture lists it on its graph, and before a communicator is destroyed its owner
releases every live graph that holds it (``graphs.release_graphs_holding``). A released graph is never replayed:
a compiled program drops it and captures again, or runs uncaptured, on its next call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StreamCaptureError(RuntimeError):
    """A host operation that cannot be part of a CUDA graph was attempted while one was being captured."""


class _CaptureState(threading.local):
    stream: int | None = None  # the handle of the stream this thread is capturing on, if any
    holds: list | None = None  # what the capture under way records references to (see the note)


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


def note_capture_holds(resource: object) -> None:
    """Note that the capture under way on this thread records work holding ``resource`` (a communicator); no-op
    when none is (see [Note: graphs that hold a communicator])."""
    if _state.holds is not None and all(held is not resource for held in _state.holds):
        _state.holds.append(resource)


@contextmanager
def capture_scope(stream: int, holds: list | None = None) -> Iterator[None]:
    """Mark this thread as capturing on ``stream`` for the duration of the block; what the captured work holds
    (:func:`note_capture_holds`) is appended to ``holds``."""
    previous, previous_holds = _state.stream, _state.holds
    _state.stream, _state.holds = int(stream), holds
    try:
        yield
    finally:
        _state.stream, _state.holds = previous, previous_holds
