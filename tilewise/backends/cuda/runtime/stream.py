"""Streams, the current stream of each thread and device, and events.

[Note: streams]
A :class:`Stream` owns a driver stream created with ``CU_STREAM_NON_BLOCKING``, so it never serialises
with the legacy null stream. Until a thread says otherwise (with the :func:`stream` context manager or
:func:`set_current_stream`), its current stream on every device is the legacy default stream, handle 0:
work queued there orders against all blocking streams, which is the safe behaviour for code that never
thinks about streams. The current stream is per thread and per device, as in PyTorch. Objects here
convert to the raw handle with ``int(s)``, which is what the allocator, the launcher and the copy helpers
take, so the hot paths carry plain integers.

[Note: events]
An :class:`Event` is created lazily, on the device of the stream it is first recorded on, as PyTorch
does, so constructing one needs no context. Events are created with ``CU_EVENT_DISABLE_TIMING`` unless
``enable_timing=True``: timing-free events are cheaper to record and are what the caching allocator uses
for cross-stream reuse. ``query`` treats ``CUDA_ERROR_NOT_READY`` as the answer "not yet", not as an error.

A stream records events and an event is recorded on a stream, so the two share this module (as torch's
``torch/cuda/streams.py`` holds both).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tilewise._cuda_api import check, driver_api, is_status
from tilewise.backends.cuda.runtime.bounds import raise_index_errors
from tilewise.backends.cuda.runtime.capturing import refuse_under_capture
from tilewise.backends.cuda.runtime.device import (
    call_in_context,
    context_device,
    current_device,
    ensure_context,
    set_device,
)


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
        self.priority = priority
        try:
            self.handle = _released.get((self.device, priority), []).pop()
        except IndexError:
            cu = driver_api()
            flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
            self.handle = int(check(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority"))
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
        refuse_under_capture("synchronizing a stream")
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
        event = Event() if event is None else event
        event.record(self)
        return event

    def __del__(self) -> None:
        # The handle is kept for the next Stream of its device and priority, never destroyed (torch pools its
        # streams too): a block freed after its stream object is gone (``record_stream``, a collective's
        # internal stream) has an event recorded on that handle, which a destroyed stream would crash.
        if getattr(self, "_owned", False) and self.handle:
            try:
                _released.setdefault((self.device, self.priority), []).append(self.handle)
            except Exception:  # noqa: BLE001, S110 -- at interpreter shutdown the module's globals may be gone
                pass


# (device, priority) -> handles of owned streams whose Stream objects are gone, reused by the next ones made
_released: dict[tuple[int, int], list[int]] = {}


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


class Event:
    """A CUDA event.

    >>> start, end = Event(enable_timing=True), Event(enable_timing=True)  # doctest: +SKIP
    >>> start.record(); end.record(); end.synchronize()  # doctest: +SKIP
    >>> start.elapsed_time(end)  # milliseconds  # doctest: +SKIP
    0.004
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.device: int | None = None
        self._handle = 0

    @property
    def handle(self) -> int:
        """The driver handle (created on the current device if the event was never recorded)."""
        if not self._handle:
            self._create(ensure_context())
        return self._handle

    def _create(self, device: int) -> None:
        cu = driver_api()
        flags = 0 if self.enable_timing else int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if self.blocking:
            flags |= int(cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
        self._handle = int(check(cu.cuEventCreate(flags), "cuEventCreate"))
        self.device = device

    def record(self, stream: Stream | int | None = None) -> None:
        """Record this event on ``stream`` (default: the current stream; an int is a raw handle)."""
        handle, device = _stream_handle_and_device(stream)
        ensure_context(device)
        if not self._handle:
            self._create(device)
        elif device != self.device:
            raise ValueError(f"Event was created on cuda:{self.device} and cannot be recorded on cuda:{device}")
        check(driver_api().cuEventRecord(self._handle, handle), "cuEventRecord")

    def query(self) -> bool:
        """True when the work captured by the last record has completed (or the event was never recorded)."""
        if not self._handle:
            return True
        ensure_context(self.device)
        result = driver_api().cuEventQuery(self._handle)
        if is_status(result, "CUDA_ERROR_NOT_READY"):
            return False
        check(result, "cuEventQuery")
        return True

    def synchronize(self) -> None:
        """Block the host until the event has completed; raise the index error an indexing kernel found
        meanwhile, if any."""
        refuse_under_capture("waiting for an event on the host")
        if self._handle:
            ensure_context(self.device)
            check(driver_api().cuEventSynchronize(self._handle), "cuEventSynchronize")
        raise_index_errors()

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` (default: current) wait for this event."""
        (stream or current_stream()).wait_event(self)

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end``; both must be recorded, completed and timing-enabled."""
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("elapsed_time needs both events created with Event(enable_timing=True)")
        if not (self._handle and end._handle):
            raise ValueError("elapsed_time needs both events to have been recorded")
        ensure_context(self.device)
        return float(check(driver_api().cuEventElapsedTime(self._handle, end._handle), "cuEventElapsedTime"))

    def __repr__(self) -> str:
        return f"Event(enable_timing={self.enable_timing}, device={self.device}, handle={self._handle:#x})"

    def __del__(self) -> None:
        if getattr(self, "_handle", 0):
            try:
                call_in_context(self.device, driver_api().cuEventDestroy, self._handle)
            except Exception:  # noqa: BLE001, S110 -- at interpreter shutdown the driver (or contextlib) may be gone
                pass


def _stream_handle_and_device(stream: Stream | int | None) -> tuple[int, int]:
    if stream is None:
        stream = current_stream()
    if isinstance(stream, Stream):
        return stream.handle, stream.device
    return int(stream), context_device()  # a raw handle is the current context's (see context_device)
