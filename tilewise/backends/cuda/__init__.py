"""The CUDA backend: device tensors, host transfers, and ``run(op, args, device)`` for the dispatcher.

[Note: CUDA backend]
A CUDA tensor's storage holds a :class:`DeviceBuffer`, one block of the device's caching allocator, which
goes back to the cache when the last tensor using it is collected. The allocator reuses a block on the
stream it was allocated on, so freeing while kernels that read it are still queued is safe: later work on
that stream runs after them. Every kernel runs on the thread's current stream (``tilewise.cuda.stream``).

``run`` picks the kernel by operator kind, exactly like the CPU backend: pointwise and reduction kernels
are generated from the declaration (``kernels/pointwise.py``, ``kernels/reduction.py``); other primitives
have a registered kernel (``kernels/``, ``matmul.py``); composites run their decomposition, so each
primitive inside reaches this backend again (fusing them into one kernel is the compiler's job). A
primitive with no CUDA kernel yet runs its CPU kernel on host copies of its inputs and moves the results
back (logged once per operator under ``TILEWISE_LOG=fallback``).
"""

from __future__ import annotations

import numpy as np

from tilewise import _strides as S
from tilewise.backends.cuda.runtime.stream import _thread_state as _stream_state
from tilewise.device import Backend, Device, cpu
from tilewise.dtypes import DType
from tilewise.storage import Storage
from tilewise.tensor import Tensor, cast_array, from_array

SMALL_BLOCK = 64 << 20  # blocks up to this size are recycled by the backend's own free lists
SMALL_CACHE_LIMIT = 1 << 30  # most bytes those free lists hold per device


class DeviceMemory:
    """The backend's view of one device's memory: the caching allocator, a fast path in front of it, and
    exact statistics.

    [Note: small-block fast path]
    An eager op allocates its output and frees its inputs' temporaries at Python speed, so the allocator's
    general bookkeeping (best-fit search, splitting, merging) would dominate the cost of a small op. Freed
    blocks of at most :data:`SMALL_BLOCK` bytes are therefore kept here on a free list per (stream, size)
    and handed straight back to the next request of that size on that stream, which is as safe as the
    allocator's own reuse (same stream, so stream order protects it). "Small" reaches 64 MiB: an eager
    training step repeats the same activation sizes every step, and the allocator's own malloc and free of a
    2 MiB GEMM output cost more host time than the GEMM's launch. A block on these lists cannot be merged
    with its neighbours, so they hold at most :data:`SMALL_CACHE_LIMIT` bytes. ``allocated`` counts what tensors
    hold, so the figures of ``tilewise.cuda.memory_allocated`` stay exact; the free lists are returned to
    the allocator by ``empty_cache`` and before an out-of-memory error is allowed to escape.
    """

    def __init__(self, device: int) -> None:
        from tilewise.backends.cuda.runtime import get_allocator

        self.device = device
        self.allocator = get_allocator(device)
        self.free_lists: dict[tuple[int, int], list[int]] = {}
        self.cached = 0
        self.allocated = 0
        self.peak = 0

    def malloc_uncached(self, size: int, stream: int) -> int:
        """A block from the allocator; on out-of-memory, the free lists go back to it and it tries again."""
        from tilewise.backends.cuda.runtime import OutOfMemoryError

        try:
            return self.allocator.malloc(size, stream)
        except OutOfMemoryError:
            if not self.cached:
                raise
        self.release_free_lists()
        return self.allocator.malloc(size, stream)

    def free(self, ptr: int, size: int, stream: int) -> None:
        self.allocated -= size
        if size <= SMALL_BLOCK and self.cached + size <= SMALL_CACHE_LIMIT:
            self.free_lists.setdefault((stream, size), []).append(ptr)
            self.cached += size
        else:
            self.allocator.free(ptr)

    def release_free_lists(self) -> None:
        for ptrs in self.free_lists.values():
            for ptr in ptrs:
                self.allocator.free(ptr)
        self.free_lists.clear()
        self.cached = 0

    def reset_peak(self) -> None:
        self.peak = self.allocated
        self.allocator.reset_peak_memory_stats()


_memories: dict[int, DeviceMemory] = {}


def memory(device: int) -> DeviceMemory:
    found = _memories.get(device)
    if found is None:
        found = _memories[device] = DeviceMemory(device)
    return found


class DeviceBuffer:
    """``nbytes`` of device memory on ``device``, usable in stream order on ``stream``."""

    __slots__ = ("_memory", "device", "nbytes", "ptr", "size", "stream")

    def __init__(self, nbytes: int, device: int, stream: int) -> None:
        mem = _memories.get(device)
        if mem is None:
            mem = memory(device)
        size = ((nbytes + 511) >> 9 << 9) or 512  # the allocator's rounding: a multiple of 512, at least 512
        found = mem.free_lists.get((stream, size))  # the fast path, inline: this runs once per op
        if found:
            self.ptr = found.pop()
            mem.cached -= size
        else:
            self.ptr = mem.malloc_uncached(size, stream)
        mem.allocated += size
        if mem.allocated > mem.peak:
            mem.peak = mem.allocated
        self._memory = mem
        self.device = device
        self.nbytes = nbytes
        self.size = size
        self.stream = stream

    def __del__(self) -> None:
        try:
            mem, size = self._memory, self.size
            if size <= SMALL_BLOCK and mem.cached + size <= SMALL_CACHE_LIMIT:  # DeviceMemory.free's fast path, inline
                mem.allocated -= size
                found = mem.free_lists.get((self.stream, size))
                if found is None:
                    mem.free_lists[(self.stream, size)] = [self.ptr]
                else:
                    found.append(self.ptr)
                mem.cached += size
            else:
                mem.free(self.ptr, size, self.stream)
        except Exception:  # noqa: S110 — at interpreter shutdown the allocator may already be gone
            pass

    def __repr__(self) -> str:
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device=cuda:{self.device})"


def stream_handle(device: int) -> int:
    """The raw handle of this thread's current stream on ``device`` (0: the legacy default stream)."""
    streams = _stream_state.streams
    found = streams.get(device) if streams is not None else None
    return found.handle if found is not None else 0


def empty(shape: tuple, dtype: DType, device: Device, strides: tuple | None = None) -> Tensor:
    """An uninitialised CUDA tensor (contiguous unless ``strides`` are given, which must be dense)."""
    shape = tuple(shape)
    numel = S.numel(shape)
    index = device.index
    buffer = DeviceBuffer(numel * dtype.itemsize, index, stream_handle(index))
    strides = S.contiguous_strides(shape) if strides is None else tuple(strides)
    return Tensor._make(Storage(buffer, device, dtype, numel), shape, strides, 0, dtype, device)


def empty_fast(shape: tuple, strides: tuple, numel: int, dtype: DType, device: Device, stream: int) -> Tensor:
    """:func:`empty` for callers that already know the strides, element count and stream (the hot path)."""
    buffer = DeviceBuffer(numel * dtype.itemsize, device.index, stream)
    return Tensor._make(Storage(buffer, device, dtype, numel), shape, strides, 0, dtype, device)


def data_ptr(t: Tensor) -> int:
    """The device address of ``t``'s first element."""
    return t._storage.data.ptr + t._offset * t._dtype.itemsize


_kernels: dict = {}  # the kernel registry, bound by _load_kernels
_pointwise = _pointwise_into = _reduction = _host = _fused = None  # the generated-kernel entry points (_load_kernels)
_fused_ops: frozenset = frozenset()  # composites run as one compiled kernel (register_composite_runner)


def run_into(op, args: tuple, device: Device, out: Tensor) -> Tensor | None:
    """A pointwise op's result written into ``out`` (an in-place op's target), or None: see ``dispatch.call_into``."""
    if out._dtype.is_complex:
        return None  # computed as complex operands are (see run), then written back
    return _pointwise_into(op, args, device, out)


def run(op, args: tuple, device: Device):
    try:
        return _run(op, args, device)
    except (NotImplementedError, KeyError):  # kernels are generated for real dtypes: see _run_complex
        if not (_complex_operands(op, args) or _complex_result(op, args)):
            raise
        return _run_complex(op, args, device)


def _run(op, args: tuple, device: Device):
    kind = op.kind
    if kind == "pointwise":
        return _pointwise(op, args, device)
    if kind == "composite" and op.name in _fused_ops:
        out = _fused(op, args)
        if out is not None:
            return out
    impl = _kernels.get(op.full_name)
    if impl is not None:
        return impl(device, *args)
    if kind == "reduction" and op.reduce is not None:
        return _reduction(op, args, device)
    if op.decomposition is not None:
        return op.decomposition(*args)
    return _host(op, args, device)


def _complex_operands(op, args: tuple) -> bool:
    return any(type(args[k]) is Tensor and args[k]._dtype.is_complex for k in op.tensor_idx)


def _complex_result(op, args: tuple) -> bool:
    """Real operands, a complex result (``complex(real, imag)``, ``polar``)."""
    try:
        return op.dtype_rule(op, args)[0].is_complex
    except Exception:  # noqa: BLE001 — no dtype rule for these arguments: not a complex-making pointwise op
        return False


def _run_complex(op, args: tuple, device: Device):
    """An operator with complex operands whose kernel has no complex form (kernels are generated for real dtypes;
    copies, casts, fills and the fft primitives handle complex tensors themselves): a pointwise operator runs
    real operators on the parts where it has a real form (the arithmetic fft users need), anything else its CPU
    kernel on host copies (see [Note: complex tensors] in ops/complex.py)."""
    if op.kind == "pointwise":
        from tilewise.ops.complex import run_real_form

        out_dtype, _ = op.dtype_rule(op, args)  # refuses an operator without a complex meaning, as on the CPU
        try:
            found = run_real_form(op, args, out_dtype, device)
        except (KeyError, NotImplementedError):  # e.g. a complex Python scalar, which the parts cannot take
            found = None
        if found is not None:
            return found
    return _host(op, args, device)


# ---------------------------------------------------------------------------------------------- transfers

def upload(src: Tensor, device: Device, non_blocking: bool = False, dtype: DType | None = None) -> Tensor:
    """Copy CPU tensor ``src`` to ``device``, converted to ``dtype`` (default: its own).

    [Note: uploads]
    From pageable memory the driver stages the bytes through a pinned buffer of its own and returns once all
    are staged: the copy blocks the host, and ``src`` may change or go right after, as in torch. From a
    contiguous pinned tensor the copy engine reads ``src`` itself, so nothing is staged: with
    ``non_blocking`` the call returns as soon as the copy is queued on the current stream, and ``src`` is
    held until an event recorded behind the copy has completed (the caller may drop it at once); without it
    the host waits for the stream, as torch does, so that writing ``src`` afterwards cannot race the copy. A
    pinned source that needs a dtype change is copied as it is and converted on the device, so the host
    never touches its bytes; a pageable one is converted on the host first (fewer bytes to stage when it
    narrows).
    """
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import copy_htod, ensure_context

    dtype = dtype or src._dtype
    index = ensure_context(device.index)
    stream = stream_handle(index)
    if _uploads_from_pinned(src):
        out = empty(src._shape, src._dtype, device)
        if out.numel():
            copy_htod(data_ptr(out), _host_address(src), out.numel() * src._dtype.itemsize, stream)
            if non_blocking:
                _keep_until_done(src._storage.data, stream)
            else:
                check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
        if dtype is src._dtype:
            return out
        from tilewise.backends.cuda.kernels.copy import cast

        return cast(out, dtype)
    host = src._np()
    host = np.ascontiguousarray(host if host.dtype == dtype.np else cast_array(host, dtype.np))
    out = empty(src._shape, dtype, device)
    if host.nbytes:
        copy_htod(data_ptr(out), host.ctypes.data, host.nbytes, stream)
    return out


def _uploads_from_pinned(src: Tensor) -> bool:
    from tilewise.backends.cuda.runtime import is_pinned

    return src.is_contiguous() and is_pinned(src._storage.data)


def _host_address(t: Tensor) -> int:
    return t._storage.data.ctypes.data + t._offset * t._dtype.itemsize


def download(x: Tensor, non_blocking: bool = False) -> Tensor:
    """Copy a CUDA tensor to a new contiguous CPU tensor; with ``non_blocking`` into pinned memory, returning
    before the copy has finished (synchronise the stream before reading it, as in torch). Every download is a
    point where results become visible, so it raises the index error an indexing kernel found meanwhile, if
    any (see [Note: device-side bounds checks])."""
    from tilewise.backends.cuda.kernels.copy import contiguous
    from tilewise.backends.cuda.runtime import copy_dtoh, ensure_context, pinned_empty
    from tilewise.backends.cuda.runtime.bounds import raise_index_errors

    index = x._device.index
    ensure_context(index)
    src = contiguous(x)
    host = pinned_empty(src._shape, src._dtype.np) if non_blocking else np.empty(src._shape, src._dtype.np)
    nbytes = src.numel() * src._dtype.itemsize
    if nbytes:
        stream = stream_handle(index)
        copy_dtoh(host.ctypes.data, data_ptr(src), nbytes, stream)
        if not non_blocking:
            from tilewise._cuda_api import check, driver_api

            check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
    raise_index_errors()
    return from_array(host, src._dtype)


def pin_memory(x: Tensor) -> Tensor:
    """A contiguous copy of CPU tensor ``x`` in page-locked memory (what makes ``non_blocking`` uploads
    asynchronous)."""
    from tilewise.backends.cuda.runtime import pinned_empty

    host = pinned_empty(x._shape, x._dtype.np)
    host[...] = x._np()
    return from_array(host, x._dtype)


def empty_pinned(shape: tuple, dtype: DType) -> Tensor:
    """An uninitialised contiguous CPU tensor in page-locked memory (``tilewise.empty(..., pin_memory=True)``)."""
    from tilewise.backends.cuda.runtime import pinned_empty

    return from_array(pinned_empty(tuple(shape), dtype.np), dtype)


_in_flight: list[tuple[np.ndarray, object]] = []  # pinned sources of asynchronous uploads, with their events


def _keep_until_done(array: np.ndarray, stream: int) -> None:
    """Hold a pinned source until the copy queued on ``stream`` so far has completed; release the sources of
    the copies that have."""
    from tilewise.backends.cuda.runtime import Event

    _in_flight[:] = [(a, e) for a, e in _in_flight if not e.query()]
    event = Event()
    event.record(stream)
    _in_flight.append((array, event))


def synchronize(device: Device) -> None:
    from tilewise.backends.cuda.runtime import synchronize as synchronize_device

    synchronize_device(device.index)


def is_pinned(t: Tensor) -> bool:
    from tilewise.backends.cuda.runtime import is_pinned as pinned

    return t._storage is not None and pinned(t._storage.data)


class CUDABackend(Backend):
    """This package as a :class:`~tilewise.device.Backend` (the dispatcher's and the tensors' view of it)."""

    pins_host_memory = True

    run = staticmethod(run)
    run_into = staticmethod(run_into)
    empty = staticmethod(empty)
    upload = staticmethod(upload)
    download = staticmethod(download)
    synchronize = staticmethod(synchronize)
    pin_memory = staticmethod(pin_memory)
    is_pinned = staticmethod(is_pinned)
    empty_pinned = staticmethod(empty_pinned)

    def __repr__(self) -> str:
        return "<CUDA backend>"


backend = CUDABackend()


def register_composite_runner(names: frozenset, runner) -> None:
    """[Plug-in point] Run the composite operators ``names`` through ``runner(op, args)`` (which returns None
    to decline) instead of their decomposition. The compiler registers itself here at import
    (``compiler.composites``): the backend stays below the compiler and never imports it."""
    global _fused, _fused_ops
    _fused, _fused_ops = runner, frozenset(names)


def _load_kernels() -> None:
    global _kernels, _pointwise, _pointwise_into, _reduction, _host
    from tilewise.backends.cuda import (  # noqa: F401 — attention; fft; the linalg primitives; mm, bmm, linear
        attention,
        fft,
        linalg,
        matmul,
    )
    from tilewise.backends.cuda.kernels import KERNELS, _load_all
    from tilewise.backends.cuda.kernels.fallback import run_on_host
    from tilewise.backends.cuda.kernels.pointwise import run_pointwise, run_pointwise_into
    from tilewise.backends.cuda.kernels.reduction import run_reduction

    _load_all()
    _kernels, _pointwise, _reduction, _host = KERNELS, run_pointwise, run_reduction, run_on_host
    _pointwise_into = run_pointwise_into


__all__ = ["CUDABackend", "DeviceBuffer", "backend", "cpu", "data_ptr", "download", "empty", "empty_pinned",
           "pin_memory", "run", "stream_handle", "upload"]


# torch.backends.cuda's functions (see backends/cuda/torch_api.py)
from tilewise.backends.cuda.torch_api import (  # noqa: E402
    cudnn_sdp_enabled,
    enable_cudnn_sdp,
    enable_flash_sdp,
    enable_math_sdp,
    enable_mem_efficient_sdp,
    flash_sdp_enabled,
    is_built,
    math_sdp_enabled,
    mem_efficient_sdp_enabled,
    sdp_kernel,
)
