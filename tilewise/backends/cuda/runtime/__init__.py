"""tilewise's CUDA runtime: the driver API through cuda-bindings, with one error check.

[Note: CUDA runtime layer]
This package is the only place that talks to the CUDA driver (besides the toolchain's NVRTC calls, which
go through the same :func:`check`). It is deliberately thin, in the spirit of tinygrad's runtime. The
bindings themselves, ``check`` and the availability queries sit one floor lower, in ``tilewise._cuda_api``,
so that the code generator's toolchain (NVRTC) can use them without importing a backend; here are
``device`` (primary contexts, properties), ``module`` (loading cubins, launching kernels), ``stream``
(streams and events), ``allocator`` (the caching allocator, with the private pools of CUDA graphs),
``pinned`` (page-locked host memory and copies), ``bounds`` (the record through which indexing kernels
report bad indices), ``capturing`` (whether this thread captures a CUDA graph, and the host operations
refused meanwhile). Importing it never touches the driver, so it is safe on machines without a GPU.
"""

from tilewise._cuda_api import (
    CudaError,
    CudaUnavailableError,
    check,
    device_count,
    driver_version,
    is_available,
)
from tilewise.backends.cuda.runtime.allocator import (
    CachingAllocator,
    DriverBackend,
    OutOfMemoryError,
    RawOutOfMemory,
    get_allocator,
)
from tilewise.backends.cuda.runtime.device import (
    DeviceProperties,
    current_device,
    ensure_context,
    get_device_properties,
    mem_get_info,
    set_device,
    synchronize,
)
from tilewise.backends.cuda.runtime.pinned import (
    PinnedBuffer,
    copy_dtod,
    copy_dtoh,
    copy_htod,
    is_pinned,
    pinned_empty,
)
from tilewise.backends.cuda.runtime.stream import (
    Event,
    Stream,
    current_stream,
    default_stream,
    set_current_stream,
    stream,
)

__all__ = [
    "CachingAllocator",
    "CudaError",
    "CudaUnavailableError",
    "DeviceProperties",
    "DriverBackend",
    "Event",
    "OutOfMemoryError",
    "PinnedBuffer",
    "RawOutOfMemory",
    "Stream",
    "check",
    "copy_dtod",
    "copy_dtoh",
    "copy_htod",
    "current_device",
    "current_stream",
    "default_stream",
    "device_count",
    "driver_version",
    "ensure_context",
    "get_allocator",
    "get_device_properties",
    "is_available",
    "is_pinned",
    "mem_get_info",
    "pinned_empty",
    "set_current_stream",
    "set_device",
    "stream",
    "synchronize",
]
