"""A CUDA tensor's memory: blocks of the device's caching allocator, and the tensors made over them.

A CUDA tensor's storage holds a :class:`DeviceBuffer`, one block of the device's caching allocator, which
goes back to the cache when the last tensor using it is collected. The allocator reuses a block on the
stream it was allocated on, so freeing while kernels that read it are still queued is safe: later work on
that stream runs after them. Every kernel runs on the thread's current stream (``tilewise.cuda.stream``).
Everything in the CUDA backend that makes a tensor (the kernels, the transfers, the library calls) starts
here, so this module imports nothing else of the backend but its runtime.
"""

from __future__ import annotations

from heapq import heappop, heappush

from tilewise import strides as S
from tilewise.backends.cuda.runtime.allocator import OutOfMemoryError
from tilewise.backends.cuda.runtime.stream import _thread_state as _stream_state
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.storage import Storage
from tilewise.tensor import Tensor

SMALL_BLOCK = 64 << 20  # blocks up to this size are recycled by the backend's own free lists
SMALL_CACHE_LIMIT = 1 << 62  # most bytes those free lists hold per device: no limit (see the note below)


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
    2 MiB GEMM output cost more host time than the GEMM's launch. Each list is a heap that hands out its lowest
    address first, as the allocator's best fit does among blocks of one size: the blocks of a size that a training
    step takes and gives back are the same set every step, and taken lowest first they go to the same tensors every
    step, so a step's memory lies where the last one's did (a CUDA graph keyed by its addresses replays: [Note:
    graphs in place] in ``compiler/program_cuda.py``). Last in, first out, the blocks of a size moved from tensor
    to tensor from one step to the next and did not come back (a GPT-2 step's 50 MB activations, measured over 13
    steps). A block on these lists cannot be merged with its neighbours, so before the allocator reserves memory
    for a request it cannot serve from its cache, the lists go back to it, merged where they can be: what they
    hold never makes the device's reserved memory grow. They hold any number of bytes until then; a limit (1 GiB,
    once) sent the blocks freed past it to the allocator in an order that differed from step to step, and a GPT-2
    step's memory never lay in the same place twice (its recorded requests, replayed: with the limit no two of 14
    steps alike, without it every step alike from the third). ``allocated`` counts what tensors
    hold, so the figures of ``tilewise.cuda.memory_allocated`` stay exact; the free lists are returned to
    the allocator by ``empty_cache`` and before an out-of-memory error is allowed to escape. While the
    allocator records its memory history, ``cache_limit`` is -1: the free lists stay empty and every malloc and
    free reaches the allocator, so the history sees each one.
    """

    cache_limit = SMALL_CACHE_LIMIT  # -1 while the allocator records its history (see above)

    def __init__(self, device: int) -> None:
        from tilewise.backends.cuda.runtime import get_allocator

        self.device = device
        self.allocator = get_allocator(device)
        self.cache_limit = SMALL_CACHE_LIMIT if self.allocator.history is None else -1
        self.free_lists: dict[tuple[int, int], list[int]] = {}
        self.cached = 0
        self.allocated = 0
        self.peak = 0

    def malloc_uncached(self, size: int, stream: int) -> int:
        """A block from the allocator; on out-of-memory, the free lists go back to it and it tries again."""
        if self.cached and not self.allocator.routes:
            ptr = self.allocator.malloc_cached(size, stream)
            if ptr is not None:
                return ptr
            self.release_free_lists()  # before the allocator reserves more memory, it gets back what is cached here
        try:
            return self.allocator.malloc(size, stream)
        except OutOfMemoryError:
            if not self.cached:
                raise
        self.release_free_lists()
        return self.allocator.malloc(size, stream)

    def free(self, ptr: int, size: int, stream: int) -> None:
        self.allocated -= size
        if size <= SMALL_BLOCK and self.cached + size <= self.cache_limit:
            heappush(self.free_lists.setdefault((stream, size), []), ptr)
            self.cached += size
        else:
            self.allocator.free(ptr)

    def release_free_lists(self) -> None:
        # the lists are taken first: a finalizer run by the collector during a free below may add to new ones
        lists, self.free_lists = self.free_lists, {}
        for (_, size), ptrs in lists.items():
            self.cached -= size * len(ptrs)
        self.allocator.free_many([ptr for ptrs in lists.values() for ptr in ptrs])

    def release_free_list(self, stream: int) -> None:
        """Give the blocks cached for ``stream`` back to the allocator (before a capture on it: see
        ``PrivateDeviceBuffer``)."""
        while keys := [key for key in self.free_lists if key[0] == stream]:  # again: a finalizer may add to them
            for key in keys:
                for ptr in self.free_lists.pop(key, ()):
                    self.allocator.free(ptr)
                    self.cached -= key[1]

    def bypass_free_lists(self, bypass: bool) -> None:
        """Send every malloc and free to the allocator (while its history records), or use the free lists again."""
        self.release_free_lists()
        self.cache_limit = -1 if bypass else SMALL_CACHE_LIMIT

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
            self.ptr = heappop(found)  # the lowest address (see [Note: small-block fast path])
            mem.cached -= size
        else:
            self.ptr = mem.malloc_uncached(size, stream)
            if mem.allocator.routes and stream in mem.allocator.routes:  # a graph's capture: its own memory
                self.__class__ = PrivateDeviceBuffer
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
            if size <= SMALL_BLOCK and mem.cached + size <= mem.cache_limit:  # DeviceMemory.free's fast path, inline
                mem.allocated -= size
                found = mem.free_lists.get((self.stream, size))
                if found is None:
                    mem.free_lists[(self.stream, size)] = [self.ptr]
                else:
                    heappush(found, self.ptr)
                mem.cached += size
            else:
                mem.free(self.ptr, size, self.stream)
        except Exception:  # noqa: S110 — at interpreter shutdown the allocator may already be gone
            pass

    def __repr__(self) -> str:
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device=cuda:{self.device})"


class StreamSharedDeviceBuffer(DeviceBuffer):
    """A :class:`DeviceBuffer` that was used on another stream too (:func:`record_stream`).

    The small-block free lists hand a block back on its own stream at once, which would let a later kernel
    overwrite memory that work on the other stream still reads; such a block therefore goes back through the
    caching allocator, which keeps it out of reuse until the other streams' work queued before the free has
    completed. A buffer changes to this class when first recorded, so the hot path of every other buffer
    pays nothing for the check."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self._memory.allocated -= self.size
            self._memory.allocator.free(self.ptr)
        except Exception:  # noqa: S110 — at interpreter shutdown the allocator may already be gone
            pass


class PrivateDeviceBuffer(DeviceBuffer):
    """A :class:`DeviceBuffer` allocated while a CUDA graph was captured on its stream: a block of the graph's
    private pool (see "Private pools" in [Note: caching allocator]).

    It goes back to the allocator, hence to that pool, when freed, never onto the free lists, which would hand it
    to the next request of its size on that stream after the capture; and a capture starts with its stream's
    free lists emptied, so every block it gets comes from the pool. A buffer gets this class when allocated
    during a capture (a free-list miss, which every request of a capture is), so other buffers pay nothing."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self._memory.allocated -= self.size
            self._memory.allocator.free(self.ptr)
        except Exception:  # noqa: S110 — at interpreter shutdown the allocator may already be gone
            pass


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


def record_stream(t: Tensor, stream: int) -> None:
    """Mark ``t``'s memory as used by the work queued so far on ``stream`` (a raw handle), as torch's
    ``Tensor.record_stream``: once the tensor is freed, its block is reused only after that work is done."""
    buffer = t._storage.data
    if not isinstance(buffer, DeviceBuffer) or int(stream) == buffer.stream:
        return  # memory the allocator does not own is never handed out again by it
    buffer._memory.allocator.record_stream(buffer.ptr, int(stream))
    buffer.__class__ = StreamSharedDeviceBuffer


def data_ptr(t: Tensor) -> int:
    """The device address of ``t``'s first element."""
    return t._storage.data.ptr + t._offset * t._dtype.itemsize
