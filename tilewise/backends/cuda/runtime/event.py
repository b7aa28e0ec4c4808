"""Events: markers in a stream for ordering, polling and timing.

[Note: events]
An :class:`Event` is created lazily, on the device of the stream it is first recorded on, as PyTorch
does, so constructing one needs no context. Events are created with ``CU_EVENT_DISABLE_TIMING`` unless
``enable_timing=True``: timing-free events are cheaper to record and are what the caching allocator uses
for cross-stream reuse. ``query`` treats ``CUDA_ERROR_NOT_READY`` as the answer "not yet", not as an error.
"""

from __future__ import annotations

import contextlib

from tilewise._cuda_api import check, driver_api, is_status
from tilewise.backends.cuda.runtime.bounds import raise_index_errors
from tilewise.backends.cuda.runtime.device import ensure_context
from tilewise.backends.cuda.runtime.stream import Stream, current_stream


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
            with contextlib.suppress(Exception):  # at interpreter shutdown the driver may be gone
                ensure_context(self.device)
                driver_api().cuEventDestroy(self._handle)


def _stream_handle_and_device(stream: Stream | int | None) -> tuple[int, int]:
    if stream is None:
        stream = current_stream()
    if isinstance(stream, Stream):
        return stream.handle, stream.device
    return int(stream), ensure_context()
