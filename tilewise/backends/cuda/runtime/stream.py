"""Streams and the current stream of each thread and device.

[Note: streams]
A :class:`Stream` owns a driver stream created with ``CU_STREAM_NON_BLOCKING``, so it never serialises
with the legacy null stream. Until a thread says otherwise (with the :func:`stream` context manager or
:func:`set_current_stream`), its current stream on every device is the legacy default stream, handle 0:
work queued there orders against all blocking streams, which is the safe behaviour for code that never
thinks about streams. The current stream is per thread and per device, as in PyTorch. Objects here
convert to the raw handle with ``int(s)``, which is what the allocator, the launcher and the copy helpers
take, so the hot paths carry plain integers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tilewise._cuda_api import check, driver_api, is_status
from tilewise.backends.cuda.runtime.bounds import raise_index_errors
from tilewise.backends.cuda.runtime.device import (
    current_device,
    ensure_context,
    set_device,
)

if TYPE_CHECKING:
    from tilewise.backends.cuda.runtime.event import Event


class _ThreadState(threading.local):
    """Each thread's streams (the class attribute is a new thread's value: see device.py's ``_ThreadState``)."""

    streams: dict | None = None  # device index -> the current Stream, once one was set on this thread


_thread_state = _ThreadState()


class Stream:
    """A CUDA stream on one device.

    >>> s = Stream()  # doctest: +SKIP
    >>> with stream(s):  # work queued in here goes to s  # doctest: +SKIP
    ...     pass
    >>> s.synchronize()  # doctest: +SKIP
    """

    def __init__(self, device: int | None = None, priority: int = 0) -> None:
        self.device = ensure_context(device)
        cu = driver_api()
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        handle = check(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority")
        self.handle = int(handle)
        self._owned = True

    @classmethod
    def from_handle(cls, handle: int, device: int | None = None) -> Stream:
        """Wrap a stream someone else owns (handle 0 is the legacy default stream); it is never destroyed here."""
        stream = cls.__new__(cls)
        stream.device = current_device() if device is None else int(device)
        stream.handle = int(handle)
        stream._owned = False
        return stream

    def __int__(self) -> int:
        return self.handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (self.device, self.handle) == (other.device, other.handle)

    def __hash__(self) -> int:
        return hash((self.device, self.handle))

    def __repr__(self) -> str:
        return f"Stream(device={self.device}, handle={self.handle:#x})"

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has finished; raise the index error an indexing kernel
        found meanwhile, if any."""
        ensure_context(self.device)
        check(driver_api().cuStreamSynchronize(self.handle), "cuStreamSynchronize")
        raise_index_errors()

    def query(self) -> bool:
        """True when all work queued on this stream has finished."""
        ensure_context(self.device)
        result = driver_api().cuStreamQuery(self.handle)
        if is_status(result, "CUDA_ERROR_NOT_READY"):
            return False
        check(result, "cuStreamQuery")
        return True

    def wait_event(self, event: Event) -> None:
        """Make future work on this stream wait until ``event`` has completed."""
        ensure_context(self.device)
        check(driver_api().cuStreamWaitEvent(self.handle, event.handle, 0), "cuStreamWaitEvent")

    def wait_stream(self, other: Stream) -> None:
        """Make future work on this stream wait for the work queued on ``other`` so far."""
        self.wait_event(other.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        from tilewise.backends.cuda.runtime.event import Event

        event = Event() if event is None else event
        event.record(self)
        return event

    def __del__(self) -> None:
        if getattr(self, "_owned", False) and self.handle:
            with contextlib.suppress(Exception):  # at interpreter shutdown the driver may be gone
                ensure_context(self.device)
                driver_api().cuStreamDestroy(self.handle)


def default_stream(device: int | None = None) -> Stream:
    """The legacy default (null) stream of ``device``."""
    index = current_device() if device is None else int(device)
    return Stream.from_handle(0, index)


def _current_streams() -> dict[int, Stream]:
    streams = _thread_state.streams
    if streams is None:
        streams = _thread_state.streams = {}
    return streams


def current_stream(device: int | None = None) -> Stream:
    """This thread's current stream on ``device`` (default: current device); the null stream unless set."""
    index = current_device() if device is None else int(device)
    found = _current_streams().get(index)
    return found if found is not None else default_stream(index)


def set_current_stream(s: Stream) -> None:
    """Make ``s`` this thread's current stream on its device."""
    _current_streams()[s.device] = s


@contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """Within the block, ``s`` is the current stream of its device, and its device the current device.

    ``stream(None)`` changes nothing, so callers can pass an optional stream straight through.
    """
    if s is None:
        yield None
        return
    previous_device = current_device()
    previous_stream = _current_streams().get(s.device)
    if s.device != previous_device:
        set_device(s.device)
    set_current_stream(s)
    try:
        yield s
    finally:
        _restore(s.device, previous_stream)
        if s.device != previous_device:
            set_device(previous_device)


def _restore(device: int, previous: Stream | None) -> None:
    if previous is None:
        _current_streams().pop(device, None)
    else:
        _current_streams()[device] = previous
