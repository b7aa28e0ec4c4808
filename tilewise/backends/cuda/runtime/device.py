"""Devices, their primary contexts, and the current device of each thread.

[Note: primary contexts]
tilewise uses each device's *primary* context (``cuDevicePrimaryCtxRetain``), never a context of its own,
so that cuBLASLt, cuDNN and NCCL, which use the primary context too, see the same allocations and streams.
A context is retained once per device for the life of the process. Like the CUDA runtime, the current
device is a per-thread setting (default 0); :func:`ensure_context` makes that device's primary context
current on the calling thread and is what every other runtime module calls before touching the driver.
Device properties are read once per device and cached: they cannot change while the process runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

from tilewise._cuda_api import (
    CudaUnavailableError,
    check,
    device_count,
    driver_api,
    init,
)
from tilewise.backends.cuda.runtime.bounds import raise_index_errors
from tilewise.backends.cuda.runtime.capturing import refuse_under_capture

_retain_lock = threading.Lock()
_primary_contexts: dict[int, object] = {}


class _ThreadState(threading.local):
    """Each thread's device state. The class attributes are a new thread's values, so reading one is a plain
    lookup: ``getattr(local, name, default)`` on a name a thread never set raises and catches AttributeError
    inside, 0.4 us on every eager op where a hit costs 0.08."""

    device = 0  # the current device
    context_device = None  # the device whose primary context is current on this thread


_thread_state = _ThreadState()


@dataclass(frozen=True)
class DeviceProperties:
    """What tilewise needs to know about one GPU (sizes in bytes, clocks in kHz)."""

    index: int
    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    l2_cache_size: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    max_shared_memory_per_multiprocessor: int
    max_threads_per_block: int
    max_registers_per_block: int
    warp_size: int
    clock_rate_khz: int
    memory_clock_rate_khz: int
    memory_bus_width_bits: int

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.major, self.minor

    @property
    def arch(self) -> str:
        """The NVRTC target for this device, e.g. ``"sm_90"``."""
        return f"sm_{self.major}{self.minor}"


def _validated_index(device: int | None) -> int:
    index = current_device() if device is None else int(device)
    init()
    count = device_count()
    if count == 0:
        raise CudaUnavailableError("CUDA is not available: the driver initialised but sees no GPU")
    if not 0 <= index < count:
        raise ValueError(f"CUDA device {index} does not exist: {count} device(s) visible (valid: 0..{count - 1})")
    return index


def _primary_context(index: int) -> object:
    with _retain_lock:
        ctx = _primary_contexts.get(index)
        if ctx is None:
            init()
            cu = driver_api()
            dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
            ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _primary_contexts[index] = ctx
    return ctx


def ensure_context(device: int | None = None) -> int:
    """Make ``device``'s (default: the current device's) primary context current on this thread; return its index."""
    index = current_device() if device is None else int(device)
    if _thread_state.context_device != index:
        index = _validated_index(index)
        check(driver_api().cuCtxSetCurrent(_primary_context(index)), "cuCtxSetCurrent")
        _thread_state.context_device = index
    return index


def context_device() -> int:
    """The device whose primary context is current on this thread, the current device's made current if none is.

    A raw stream handle (0, the legacy default stream, included) belongs to the context current when it is used,
    and an operator makes its operands' device's context current before it starts (see [Note: the operation's
    device]): copies and event records given a raw handle run there, not on the thread's current device."""
    found = _thread_state.context_device
    return found if found is not None else ensure_context()


def call_in_context(device: int, fn, *args):
    """``fn(*args)`` with ``device``'s primary context current, then the thread's previous context current again.

    For finalizers (an event's, a module's, a pinned buffer's), which the garbage collector may run in the middle of
    an operation on another device: switching the thread's context there would send that operation's next library
    call (which runs in the current context) to the wrong GPU."""
    previous = _thread_state.context_device
    ensure_context(device)
    try:
        return fn(*args)
    finally:
        if previous is not None and previous != device:
            ensure_context(previous)


def set_device(device: int) -> None:
    """Make ``device`` this thread's current device and bind its primary context."""
    index = _validated_index(device)
    _thread_state.device = index
    ensure_context(index)


def current_device() -> int:
    """This thread's current device index (0 until :func:`set_device` is called)."""
    return _thread_state.device


def synchronize(device: int | None = None) -> None:
    """Wait until all work queued on ``device`` (default: current) has finished; raise the index error an
    indexing kernel found meanwhile, if any (see [Note: device-side bounds checks])."""
    refuse_under_capture("synchronizing the device")
    ensure_context(device)
    check(driver_api().cuCtxSynchronize(), "cuCtxSynchronize")
    raise_index_errors()


def mem_get_info(device: int | None = None) -> tuple[int, int]:
    """(free, total) bytes of device memory as the driver sees them."""
    ensure_context(device)
    free, total = check(driver_api().cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


def get_device_properties(device: int | None = None) -> DeviceProperties:
    """The properties of ``device`` (default: current), read once and cached.

    >>> from tilewise.backends.cuda.runtime import is_available
    >>> props = get_device_properties(0) if is_available() else None  # doctest: +SKIP
    >>> props.arch  # doctest: +SKIP
    'sm_90'
    """
    return _read_properties(_validated_index(device))


@cache
def _read_properties(index: int) -> DeviceProperties:
    cu = driver_api()
    dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
    raw_name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = raw_name.split(b"\0", 1)[0].decode()
    total = int(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
    kinds = cu.CUdevice_attribute

    def attr(which: object) -> int:
        return int(check(cu.cuDeviceGetAttribute(which, dev), "cuDeviceGetAttribute"))

    return DeviceProperties(
        index=index,
        name=name,
        major=attr(kinds.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        minor=attr(kinds.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        multi_processor_count=attr(kinds.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        total_memory=total,
        l2_cache_size=attr(kinds.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        max_shared_memory_per_block=attr(kinds.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        max_shared_memory_per_block_optin=attr(kinds.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        max_shared_memory_per_multiprocessor=attr(kinds.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        max_threads_per_block=attr(kinds.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        max_registers_per_block=attr(kinds.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        warp_size=attr(kinds.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        clock_rate_khz=attr(kinds.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        memory_clock_rate_khz=attr(kinds.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        memory_bus_width_bits=attr(kinds.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
    )
