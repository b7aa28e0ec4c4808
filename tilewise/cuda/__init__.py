"""``tilewise.cuda``: devices, streams, events, memory statistics and seeding, with torch.cuda's names
(``tilewise.cuda.amp`` holds torch.cuda.amp's deprecated spellings of ``tilewise.amp``).

Everything here works on a machine without a GPU as far as it can: ``is_available()`` is False and
``device_count()`` is 0 there, and the rest raises a clear error.

>>> import tilewise as tw
>>> tw.cuda.is_available() in (True, False)
True
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from tilewise.backends.cuda import runtime as _rt
from tilewise.backends.cuda.runtime import (
    CudaError,
    DeviceProperties,
    Event,
    OutOfMemoryError,
    Stream,
    current_stream,
    default_stream,
    device_count,
    is_available,
    stream,
)
from tilewise.cuda._more import _index
from tilewise.tensortypes import CUDA_TYPES as _CUDA_TYPES

__all__ = [
    "CudaError", "DeviceProperties", "Event", "OutOfMemoryError", "Stream", "current_device", "current_stream",
    "default_stream", "device_count", "empty_cache", "get_device_capability", "get_device_name",
    "get_device_properties", "init", "is_available", "is_bf16_supported", "manual_seed", "manual_seed_all",
    "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_stats", "memory_summary", "reset_peak_memory_stats", "set_device", "stream", "synchronize",
    "StreamContext", "can_device_access_peer", "device", "device_of", "get_arch_list", "get_gencode_flags",
    "get_rng_state", "get_rng_state_all", "initial_seed", "ipc_collect", "is_current_stream_capturing",
    "is_initialized", "is_tf32_supported", "max_memory_cached", "memory_cached", "reset_max_memory_allocated",
    "reset_max_memory_cached", "seed", "seed_all", "set_rng_state", "set_rng_state_all", "set_stream",
    "CUDAGraph", "graph", "graph_pool_handle",
]


def init() -> None:
    """Initialise the driver now rather than at first use (raises where CUDA cannot be used)."""
    _rt.ensure_context(_rt.current_device())


def get_device_properties(device: Any = None) -> DeviceProperties:
    return _rt.get_device_properties(_index(device))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return get_device_properties(device).compute_capability


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the current GPU runs bfloat16 (torch.cuda.is_bf16_supported): natively from compute capability 8.0;
    with ``including_emulation`` on any GPU, where tilewise's kernels compute bfloat16 in float32. False without a
    GPU."""
    if not is_available():
        return False
    return including_emulation or get_device_properties(None).major >= 8


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory, as the driver reports them (torch.cuda.mem_get_info)."""
    return _rt.mem_get_info(_index(device))


def set_device(device: Any) -> None:
    _rt.set_device(_index(device))


def current_device() -> int:
    return _rt.current_device()


def synchronize(device: Any = None) -> None:
    """Wait for all work queued on ``device`` (default: the current device)."""
    _rt.synchronize(_index(device))


def _sleep(cycles: int) -> None:
    """Queue a kernel that spins for ``cycles`` GPU clock cycles on the current stream (torch.cuda._sleep):
    what a benchmark queues behind it runs back to back once it ends, timed without the host's gaps."""
    from tilewise.backends.cuda import stream_handle
    from tilewise.backends.cuda.kernels import spin

    index = _index(None)
    _rt.ensure_context(index)
    spin(cycles, index, stream_handle(index))


# ---------------------------------------------------------------------------------------------- memory

def _memory(device: Any):
    from tilewise.backends.cuda import memory as device_memory

    return device_memory(_index(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors on ``device`` (block sizes: requests rounded up to 512 bytes)."""
    return _memory(device).allocated


def max_memory_allocated(device: Any = None) -> int:
    """The most :func:`memory_allocated` has been since the start or :func:`reset_peak_memory_stats`."""
    return _memory(device).peak


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds from the driver on ``device``."""
    return _memory(device).allocator.memory_reserved()


def max_memory_reserved(device: Any = None) -> int:
    return _memory(device).allocator.max_memory_reserved()


def memory_cached(device: Any = None) -> int:
    warnings.warn("`torch.cuda.memory_cached` has been renamed to `torch.cuda.memory_reserved`", FutureWarning,
                  stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    warnings.warn("`torch.cuda.max_memory_cached` has been renamed to `torch.cuda.max_memory_reserved`",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    warnings.warn("torch.cuda.reset_max_memory_allocated now calls torch.cuda.reset_peak_memory_stats, which resets "
                  "/all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    warnings.warn("torch.cuda.reset_max_memory_cached now calls torch.cuda.reset_peak_memory_stats, which resets "
                  "/all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    _memory(device).reset_peak()


def memory_stats(device: Any = None) -> dict[str, Any]:
    """The caching allocator's figures, with the allocated bytes as tensors hold them (see
    [Note: small-block fast path] in ``tilewise.backends.cuda``)."""
    mem = _memory(device)
    stats = mem.allocator.memory_stats()
    stats.update({"allocated_bytes.current": mem.allocated, "allocated_bytes.peak": mem.peak,
                  "small_block_cache_bytes": mem.cached})
    return stats


def memory_summary(device: Any = None) -> str:
    mem = _memory(device)
    return (f"{mem.allocator.memory_summary()}\n  tensors hold {mem.allocated} bytes (peak {mem.peak}); "
            f"small-block cache {mem.cached} bytes")


def empty_cache() -> None:
    """Return every cached, fully free segment of the current device to the driver, with the cuDNN workspace no
    CUDA graph holds (torch allocates its workspace for each call; tilewise keeps one between calls)."""
    mem = _memory(None)
    mem.release_free_lists()
    cudnn = sys.modules.get("tilewise.backends.cuda.cudnn")
    if cudnn is not None:
        cudnn.release_workspace(mem.device)
    mem.allocator.empty_cache()


# ---------------------------------------------------------------------------------------------- streams

def _record_stream(self, stream) -> None:
    """``Tensor.record_stream(stream)``, torch's: the tensor's memory, once freed, is not handed out again until
    the work queued on ``stream`` by then has completed (for memory that another stream reads or writes)."""
    if not isinstance(stream, Stream):
        raise RuntimeError("unknown parameter type")  # torch's words for an argument that is not a Stream
    if self.device.type != "cuda":
        raise RuntimeError(f"record_stream: the tensor is on {self.device}; only CUDA tensors' memory is "
                           "managed by the caching allocator")
    from tilewise.backends.cuda import record_stream

    record_stream(self, stream.handle)


from tilewise.tensor import Tensor as _Tensor  # noqa: E402

_Tensor.record_stream = _record_stream


# ---------------------------------------------------------------------------------------------- random

def manual_seed(seed: int) -> None:
    """Seed the generator. tilewise has one Philox stream for CPU and GPU, so this is ``tilewise.manual_seed``."""
    from tilewise.ops.creation import manual_seed as seed_all

    seed_all(seed)


manual_seed_all = manual_seed


globals().update({cls.__name__: cls for cls in _CUDA_TYPES.values()})  # tilewise.cuda.FloatTensor, ...
from tilewise.ops.storage_api import LEGACY_CUDA as _LEGACY_STORAGES  # noqa: E402

globals().update(_LEGACY_STORAGES)  # tilewise.cuda.FloatStorage, ...

from tilewise.cuda import graphs, memory, nvtx  # noqa: E402, F401 — torch.cuda.graphs, .memory and .nvtx
from tilewise.cuda._more import (  # noqa: E402 — the rest of torch.cuda's contexts, random state and spellings
    StreamContext,
    can_device_access_peer,
    device,
    device_of,
    get_arch_list,
    get_gencode_flags,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    ipc_collect,
    is_current_stream_capturing,
    is_initialized,
    is_tf32_supported,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
    set_stream,
)
from tilewise.cuda.extension import load, load_inline  # noqa: E402 — one's own CUDA C kernels (torch's cpp_extension)
from tilewise.cuda.graphs import CUDAGraph, graph, graph_pool_handle  # noqa: E402 — capturing eager work
