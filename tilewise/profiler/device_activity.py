"""Device activity from CUPTI: every kernel, copy and memset the GPU ran, tied to the host range that launched it.

[Note: device activity] When CUDA activity is profiled and cupti-python is installed, a recording asks CUPTI
for activity records (CONCURRENT_KERNEL, MEMCPY, MEMSET, EXTERNAL_CORRELATION, and the RUNTIME and DRIVER
API records that the external correlations hang on) instead of timing ranges with CUDA events. Each record carries the
device's own start and end, the stream, and a correlation id naming the API call that launched it; while a
host range is open on a thread, the recorder keeps its event id pushed on CUPTI's per-thread stack of
external correlation ids (``push``/``pop``, two calls per range), so CUPTI also writes one EXTERNAL_CORRELATION
record per API call pairing its correlation id with the innermost range's id. After the recording stops,
``attach`` follows record -> correlation id -> event id and hangs each kernel on that event as torch's profiler
does (a kernel of a replayed CUDA graph lands on the compiled program's event, whose launch it was); the API
call that launched it (``cudaLaunchKernel``, ``cuLaunchKernel``, ``cuGraphLaunch``) becomes a host range inside
that event, where the kernel's flow arrow starts, as in torch's traces. Other API calls are not kept.

Cost: CUPTI fills buffers of ``BUFFER_BYTES`` (32 MiB) that it hands back only when full or flushed, so the
completion callback runs at the flush, when the recording stops, not during the step; the callback copies the
few fields kept out of each record (``ActivityRecord``: the buffer goes back to CUPTI when the callback
returns) and everything else — the correlation, the clock conversion, names — runs in ``attach``.

Clocks: CUPTI stamps records with its own nanosecond clock (``cupti.get_timestamp``). ``ClockPair`` samples it
beside the profiler's host clock when activity starts and when it stops, and maps device times onto the host
timeline linearly between the two samples (an offset and a rate, so neither clock's drift matters).

CUPTI takes one set of buffer callbacks per process, so one recording at a time owns the tracer
(``acquire``); another recording that asks for CUDA activity meanwhile falls back to CUDA events. The
callbacks are registered again at each start, since another profiler in the process may have replaced them.
Without cupti-python the fallback is the same, with a warning the first time.
"""

from __future__ import annotations

import threading
import warnings
from typing import NamedTuple

BUFFER_BYTES = 32 << 20

# cupti.h's CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, in the words torch's traces use
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
                10: "PtoP"}
MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}


class ActivityRecord(NamedTuple):
    """What is kept of one CUPTI kernel, memcpy or memset record (plain values: the record's buffer is reused)."""

    kind: str  # "kernel", "memcpy" or "memset"
    name: str  # the kernel's name; for a copy "<copy kind>/<src kind>/<dst kind>", for a memset its memory kind
    start_ns: int  # CUPTI's clock
    end_ns: int
    device: int
    stream: int
    correlation: int
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    registers: int = 0
    shared_memory: int = 0  # static + dynamic bytes per block
    nbytes: int = 0  # of a copy or memset


class ApiCall(NamedTuple):
    """What is kept of one CUPTI runtime or driver API record: the host call that may have launched work."""

    domain: str  # "runtime" or "driver"
    cbid: int  # CUPTI's callback id: the function's number
    correlation: int
    start_ns: int
    end_ns: int
    thread: int  # the OS thread id (threading.get_native_id's)


class ClockPair(NamedTuple):
    """Simultaneous readings of CUPTI's clock and the profiler's host clock (both in ns)."""

    device_ns: int
    host_ns: int


class Activity(NamedTuple):
    """Everything one recording collected from CUPTI."""

    records: list[ActivityRecord]
    calls: list[ApiCall]
    correlations: dict[int, int]  # CUPTI correlation id -> the external id (event id) on top when it was made
    first: ClockPair
    last: ClockPair


class Launch(NamedTuple):
    """An API call that launched device work, as a host range inside the range that made it."""

    launcher: object  # the FunctionEvent
    name: str  # cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync, ...
    start_us: float
    end_us: float
    correlation: int


def to_host_us(device_ns: int, first: ClockPair, last: ClockPair) -> float:
    """A CUPTI timestamp on the host timeline, in microseconds, by the line through the two clock pairs."""
    span = last.device_ns - first.device_ns
    rate = (last.host_ns - first.host_ns) / span if span > 0 else 1.0
    return (first.host_ns + (device_ns - first.device_ns) * rate) / 1000


def display_name(record: ActivityRecord) -> str:
    """The name torch's profiler gives the record: a kernel's own, ``Memcpy HtoD (Pageable -> Device)``,
    ``Memset (Device)``."""
    if record.kind == "memcpy":
        copy, source, destination = record.name.split("/")
        return f"Memcpy {copy} ({source} -> {destination})"
    if record.kind == "memset":
        return f"Memset ({record.name})"
    return record.name


def function_name(name: str) -> str:
    """CUPTI's name of an API function without its version suffix (``cudaLaunchKernel_v7000``), as torch shows it."""
    base, _, version = name.rpartition("_v")
    return base if base and version.isdigit() else name


def attach(activity: Activity, events: dict[int, object], name_of) -> tuple[list, list[Launch]]:
    """Hang each record, as a ``DeviceKernel``, on the event whose id CUPTI correlated with its launch. Returns the
    kernels no event launched (started before the recording, or from a thread outside any range) and the API calls
    that launched the rest (``name_of(domain, cbid)`` names them), each kernel's ``launch_us`` set to its call's
    start so that its flow leaves from there."""
    from tilewise.profiler.events import DeviceKernel

    first, last = activity.first, activity.last
    calls = {call.correlation: call for call in activity.calls}
    unclaimed, launches, launched_at = [], [], {}
    for record in sorted(activity.records, key=lambda r: r.start_ns):
        start = to_host_us(record.start_ns, first, last)
        kernel = DeviceKernel(display_name(record), record.device, to_host_us(record.end_ns, first, last) - start,
                              start, stream=record.stream, correlation=record.correlation, grid=record.grid,
                              block=record.block, registers=record.registers, shared_memory=record.shared_memory,
                              kind=record.kind, nbytes=record.nbytes)
        launcher = events.get(activity.correlations.get(record.correlation, -1))
        if launcher is None:
            unclaimed.append(kernel)
            continue
        launcher.kernels.append(kernel)
        call = calls.pop(record.correlation, None)  # a call launching several records is listed once
        if call is not None:
            launched_at[call.correlation] = to_host_us(call.start_ns, first, last)
            launches.append(Launch(launcher, function_name(name_of(call.domain, call.cbid)),
                                   launched_at[call.correlation], to_host_us(call.end_ns, first, last),
                                   call.correlation))
        kernel.launch_us = launched_at.get(record.correlation)
    return unclaimed, launches


# ---------------------------------------------------------------------------------------------- CUPTI itself

def copy_record(activity, kinds) -> ActivityRecord | None:
    """The fields kept of one record CUPTI hands the completion callback (None for the API records)."""
    kind = activity.kind
    if kind == kinds.CONCURRENT_KERNEL or kind == kinds.KERNEL:
        return ActivityRecord("kernel", activity.name, activity.start, activity.end, activity.device_id,
                              activity.stream_id, activity.correlation_id,
                              (activity.grid_x, activity.grid_y, activity.grid_z),
                              (activity.block_x, activity.block_y, activity.block_z), activity.registers_per_thread,
                              activity.static_shared_memory + activity.dynamic_shared_memory)
    if kind == kinds.MEMCPY:
        memory = MEMORY_KINDS.get
        name = "/".join((MEMCPY_KINDS.get(activity.copy_kind, "Unknown"), memory(activity.src_kind, "Unknown"),
                         memory(activity.dst_kind, "Unknown")))
        return ActivityRecord("memcpy", name, activity.start, activity.end, activity.device_id, activity.stream_id,
                              activity.correlation_id, nbytes=activity.bytes)
    if kind == kinds.MEMSET:
        return ActivityRecord("memset", MEMORY_KINDS.get(activity.memory_kind, "Unknown"), activity.start,
                              activity.end, activity.device_id, activity.stream_id, activity.correlation_id,
                              nbytes=activity.bytes)
    return None


class CuptiTracer:
    """The process's one CUPTI activity session (see [Note: device activity])."""

    def __init__(self, cupti) -> None:
        self.cupti = cupti
        kinds = cupti.ActivityKind
        self.kinds = (kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET, kinds.RUNTIME, kinds.DRIVER,
                      kinds.EXTERNAL_CORRELATION)
        self.external_kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
        self.push_id = cupti.activity_push_external_correlation_id
        self.pop_id = cupti.activity_pop_external_correlation_id
        self.records: list[ActivityRecord] = []
        self.calls: list[ApiCall] = []
        self.correlations: dict[int, int] = {}
        self.names: dict[tuple[str, int], str] = {}
        self.first: ClockPair | None = None
        self.owner = None

    # called from CUPTI's thread at a flush
    def _buffer_requested(self):
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list) -> None:
        kinds = self.cupti.ActivityKind
        correlations, records, calls = self.correlations, self.records, self.calls
        for activity in activities:
            kind = activity.kind
            if kind == kinds.EXTERNAL_CORRELATION:
                correlations[activity.correlation_id] = activity.external_id
            elif kind == kinds.KERNEL:
                continue  # never enabled here; another profiler (torch's) may have left it on: the same kernels
                # again, which CONCURRENT_KERNEL records already
            elif kind == kinds.RUNTIME or kind == kinds.DRIVER:
                calls.append(ApiCall("runtime" if kind == kinds.RUNTIME else "driver", activity.cbid,
                                     activity.correlation_id, activity.start, activity.end, activity.thread_id))
            else:
                record = copy_record(activity, kinds)
                if record is not None:
                    records.append(record)

    def clock_pair(self, host_now) -> ClockPair:
        before = host_now()
        device = self.cupti.get_timestamp()
        return ClockPair(device, (before + host_now()) // 2)

    def start(self, host_now) -> None:
        # registered at every start: CUPTI keeps one pair of callbacks per process, and another profiler in the
        # process (torch's Kineto, say) may have put its own there since
        self.cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self.records, self.calls, self.correlations = [], [], {}
        for kind in self.kinds:
            self.cupti.activity_enable(kind)
        self.first = self.clock_pair(host_now)

    def abandon(self) -> None:
        """Undo a start that failed part way: whatever kinds it enabled are disabled again."""
        for kind in self.kinds:
            try:
                self.cupti.activity_disable(kind)
            except Exception:  # noqa: BLE001, S112 — a kind that was never enabled
                continue

    def push(self, event_id: int) -> None:
        self.push_id(self.external_kind, event_id)

    def pop(self) -> None:
        self.pop_id(self.external_kind)

    def name_of(self, domain: str, cbid: int) -> str:
        """The API function CUPTI numbers ``cbid`` in ``domain`` ("runtime" or "driver")."""
        key = (domain, cbid)
        name = self.names.get(key)
        if name is None:
            domains = self.cupti.CallbackDomain
            which = domains.RUNTIME_API if domain == "runtime" else domains.DRIVER_API
            name = self.names[key] = str(self.cupti.get_callback_name(which, cbid))
        return name

    def stop(self, host_now) -> Activity:
        """Wait for the devices, flush every buffer (the completion callback runs now) and stop collecting."""
        from tilewise import cuda

        for device in range(cuda.device_count()):
            cuda.synchronize(device)
        last = self.clock_pair(host_now)
        self.cupti.activity_flush_all(1)
        for kind in self.kinds:
            self.cupti.activity_disable(kind)
        activity = Activity(self.records, self.calls, self.correlations, self.first, last)
        self.records, self.calls, self.correlations = [], [], {}
        return activity


_tracer: CuptiTracer | None = None
_tracer_lock = threading.Lock()
_warned = False


def acquire(owner) -> CuptiTracer | None:
    """The CUPTI tracer for ``owner``'s recording, or None (no cupti-python: warned once; or another recording
    holds it): the caller then times device work with CUDA events."""
    global _tracer
    with _tracer_lock:
        if _tracer is None:
            cupti = _import_cupti()
            if cupti is None:
                return None
            _tracer = CuptiTracer(cupti)
        if _tracer.owner is not None:
            return None
        _tracer.owner = owner
        return _tracer


def release(tracer: CuptiTracer) -> None:
    with _tracer_lock:
        tracer.owner = None


def _import_cupti():
    global _warned
    try:
        from cupti import cupti
    except ImportError as error:
        if not _warned:
            _warned = True
            cause = "is not installed" if isinstance(error, ModuleNotFoundError) and error.name == "cupti" else \
                f"could not be imported ({type(error).__name__}: {error})"
            warnings.warn(f"tilewise.profiler: cupti-python {cause}, so CUDA activity is timed with CUDA "
                          "events around each operator and program step (no kernel names, grids or streams); "
                          "pip install cupti-python for CUPTI's kernel records", stacklevel=4)
        return None
    return cupti
