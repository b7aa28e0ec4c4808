"""The caching device-memory allocator.

[Note: caching allocator]
Asking the driver for memory is slow and synchronising (``cuMemFree`` waits for the whole device), so,
like PyTorch's CUDACachingAllocator, tilewise keeps freed memory in a cache and hands it out again. The
driver gives us *segments*; a segment is cut into *blocks*; a block is what a caller gets.

Size classes (modelled loosely on PyTorch's):

* every request is rounded up to a multiple of 512 bytes (``0`` counts as 512);
* *small* requests (<= 1 MiB) live in 2 MiB segments, shared by many blocks;
* *medium* requests (1 MiB .. 10 MiB) live in 20 MiB segments of the large pool, so a run of similar
  activations shares a few segments instead of fragmenting memory with many odd-sized ones; if the
  20 MiB segment cannot be had, a segment of just the request (rounded to 2 MiB) is tried;
* *large* requests (>= 10 MiB) get a segment of their own, rounded up to a multiple of 2 MiB.

A cached block larger than the request is split, the rest going back to the cache (in the small pool
when at least 512 bytes remain, in the large pool only when more than 1 MiB remains, so large blocks are
not shredded into slivers). A freed block is merged with its free neighbours in the same segment, and
a segment whose blocks are all free again is one free block that :meth:`CachingAllocator.empty_cache`
can return to the driver. Free blocks are found best-fit (smallest block that fits, then lowest address).

Streams: a block belongs to the stream its segment was allocated on and is reused only by allocations on
that stream, so stream order alone makes reuse safe (no synchronisation). A caller that uses a block on
another stream says so with :meth:`CachingAllocator.record_stream`; when such a block is freed, an event is
recorded on each of those streams and the block stays out of the cache until all the events have
completed. Events come from an injectable factory so the logic is tested on the CPU with fake events.

Out of memory: when the backend raises :class:`RawOutOfMemory`, the allocator waits for the pending
events, releases every fully free cached segment, and retries once; if that fails too it raises
:class:`OutOfMemoryError` with a report (requested size, allocated, reserved, largest free block,
fragmentation, and what to do), leaving its bookkeeping intact so later allocations still work.

Private pools (CUDA graphs): a captured graph bakes in every address its work touched, so the memory it
allocates while captured must stay its own for as long as it may replay, as torch's graph pools do. While
:meth:`CachingAllocator.route` sends a stream's requests to a :class:`PrivatePool`, they are served from that
pool's own segments; a block freed into it is reused only by later requests of the same capture (the graph
replays them in the same stream order). The pool's blocks never reach the shared pools. Once its graph is
gone, :meth:`CachingAllocator.release_pool` marks the pool released, and its segments are returned to the driver
when fully free by ``empty_cache`` or the out-of-memory retry (``cuMemFree`` waits for the device, so a replay
still in flight has finished by then), never handed to another tensor.

History: while ``tilewise.cuda.memory._record_memory_history`` records, ``history`` holds a
``memory_history.MemoryHistory`` that each action is reported to (see [Note: memory history]); otherwise it
is ``None`` and costs one attribute check per malloc and free.

The real backend, :class:`DriverBackend`, uses ``cuMemAlloc``/``cuMemFree`` rather than the stream-ordered
``cuMemAllocAsync`` pool: this cache already provides the stream-ordered reuse, and a second cache
underneath would hold memory that our statistics and ``empty_cache`` cannot see (or need a release
threshold of zero, which makes every async free a real free). ``cuMemAlloc`` also fails immediately and
plainly with ``CUDA_ERROR_OUT_OF_MEMORY``. Its cost, a device-wide sync on ``cuMemFree``, is paid only by
``empty_cache`` and the OOM path.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from threading import get_ident
from typing import Any, Protocol

from tilewise.backends.cuda.runtime.memory_history import MemoryHistory

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1 << 20  # largest request served from the small pool
SMALL_BUFFER = 2 << 20  # segment size of the small pool
LARGE_BUFFER = 20 << 20  # segment size for medium requests
MIN_LARGE_ALLOC = 10 << 20  # requests from here on get a segment of their own
ROUND_LARGE = 2 << 20  # granularity of large segments

ALLOCATED, PENDING, FREE = "allocated", "pending", "free"


class _AllocatorLock:
    """The allocator's lock, safe against a finalizer that frees inside one of the allocator's own operations.

    [Note: frees from finalizers]
    Device memory goes back from ``DeviceBuffer.__del__``, and the garbage collector runs finalizers wherever
    Python allocates an object, including inside the allocator's own ``malloc`` while it holds this lock (a
    tensor kept alive by a reference cycle, collected while a new segment's bookkeeping is made). A plain lock
    would then wait on itself forever, and a re-entrant one would let the free merge blocks that the
    interrupted operation is halfway through splitting. So a free (or a pool's release) arriving on the thread
    that holds the lock is queued, and runs when that operation is done, still under the lock. Any other call
    re-entering on the same thread is a bug, reported as one rather than a hang."""

    __slots__ = ("_lock", "deferred", "owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None  # the thread holding the lock
        self.deferred: list[tuple[Callable[[Any], None], Any]] = []

    def held_here(self) -> bool:
        return self.owner == get_ident()

    def __enter__(self) -> None:
        ident = get_ident()
        if self.owner == ident:
            raise RuntimeError("the caching allocator was re-entered on the thread that is inside it")
        self._lock.acquire()
        self.owner = ident

    def __exit__(self, *exc: object) -> None:
        try:
            while self.deferred:
                fn, arg = self.deferred.pop(0)
                try:
                    fn(arg)
                except Exception:  # noqa: BLE001, S110 — a finalizer's free, which its __del__ would have swallowed
                    pass
        finally:
            self.owner = None
            self._lock.release()


class RawOutOfMemory(MemoryError):  # noqa: N818 -- the name the backend protocol is specified with
    """Raised by a raw backend's ``malloc`` when it cannot serve the request."""


class OutOfMemoryError(RuntimeError):
    """The allocator could not get memory even after releasing its cache. Carries the figures of the report."""

    def __init__(
        self, message: str, *, requested: int, allocated: int, reserved: int, largest_free: int, fragmentation: float
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.allocated = allocated
        self.reserved = reserved
        self.largest_free = largest_free
        self.fragmentation = fragmentation


class RawBackend(Protocol):
    """Where segments come from: device memory, or a fake with a capacity in tests."""

    def malloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...


class StreamEvent(Protocol):
    """An event already recorded on a stream."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


EventFactory = Callable[[int], StreamEvent]  # records a new event on the given stream and returns it


@dataclass(eq=False)
class _Segment:
    ptr: int
    size: int
    stream: int
    pool: _Pool
    head: _Block | None = None  # the block at the segment's start


class _Block:
    """A piece of a segment; blocks of a segment form a doubly linked list in address order."""

    __slots__ = ("next", "prev", "ptr", "requested", "segment", "size", "state", "stream", "stream_uses")

    def __init__(
        self, ptr: int, size: int, segment: _Segment, prev: _Block | None = None, next: _Block | None = None
    ) -> None:
        self.ptr = ptr
        self.size = size
        self.segment = segment
        self.stream = segment.stream
        self.state = FREE
        self.requested = 0
        self.prev = prev
        self.next = next
        self.stream_uses: set[int] | None = None  # other streams the block was used on (record_stream)

    @property
    def fills_segment(self) -> bool:
        return self.prev is None and self.next is None


class _Pool:
    """The free blocks of one size class, per stream, sorted by (size, address) for best-fit lookup."""

    def __init__(self, name: str, split_threshold: int, pool_id: int = 0) -> None:
        self.name = name
        self.split_threshold = split_threshold  # split only if the remainder is at least this big
        self.pool_id = pool_id  # 0: the shared pools; else the PrivatePool it belongs to
        self._sorted: dict[int, list[tuple[int, int]]] = {}
        self._blocks: dict[int, _Block] = {}

    def add(self, block: _Block) -> None:
        entries = self._sorted.get(block.stream)
        if entries is None:
            entries = self._sorted[block.stream] = []
        insort(entries, (block.size, block.ptr))
        self._blocks[block.ptr] = block

    def remove(self, block: _Block) -> None:
        entries = self._sorted[block.stream]
        del entries[bisect_left(entries, (block.size, block.ptr))]
        del self._blocks[block.ptr]

    def best_fit(self, stream: int, size: int, take: bool = False) -> _Block | None:
        """The smallest block of ``stream`` of at least ``size`` bytes; ``take``: removed from the pool too (what
        ``malloc`` does with it, one search instead of two)."""
        entries = self._sorted.get(stream)
        if not entries:
            return None
        index = bisect_left(entries, (size, -1))
        if index == len(entries):
            return None
        if take:
            return self._blocks.pop(entries.pop(index)[1])
        return self._blocks[entries[index][1]]

    def blocks(self) -> list[_Block]:
        return list(self._blocks.values())


class PrivatePool:
    """The memory of one captured CUDA graph (see "Private pools" in the note above): its own small and large
    pools, whose segments serve no request outside the capture. ``id`` numbers the pools of a process from 1
    (segments report it as their ``pool_id``, and memory snapshots as torch's graph pool id)."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self._ids)
        self._small = _Pool("small", MIN_BLOCK_SIZE, self.id)
        self._large = _Pool("large", SMALL_SIZE + 1, self.id)
        self.released = False
        self.users = 0  # the graphs that captured into it (see backends/cuda/graphs.py)

    def pools(self) -> tuple[_Pool, _Pool]:
        return self._small, self._large


@dataclass(frozen=True)
class BlockInfo:
    ptr: int
    size: int
    state: str  # "allocated", "pending" (freed, waiting for other streams) or "free"
    requested: int


@dataclass(frozen=True)
class SegmentInfo:
    ptr: int
    size: int
    stream: int
    pool: str
    blocks: tuple[BlockInfo, ...]
    pool_id: int = 0  # 0: the shared pools; else the private pool of a CUDA graph (PrivatePool.id)


def round_size(nbytes: int) -> int:
    """The block size a request of ``nbytes`` (not negative) gets: a multiple of 512, at least 512."""
    return ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE) or MIN_BLOCK_SIZE


def segment_sizes(size: int) -> list[int]:
    """Segment sizes to try, in order, for a block of ``size`` bytes that no cached block can serve."""
    if size <= SMALL_SIZE:
        return [SMALL_BUFFER]
    own = -(-size // ROUND_LARGE) * ROUND_LARGE
    if size < MIN_LARGE_ALLOC:
        return [LARGE_BUFFER, own]
    return [own]


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} bytes" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class CachingAllocator:
    """A caching allocator over a raw backend; see [Note: caching allocator] at the top of this module.

    >>> class Fake:
    ...     def __init__(self): self.next = 1 << 32
    ...     def malloc(self, n): self.next += n; return self.next - n
    ...     def free(self, ptr): pass
    >>> a = CachingAllocator(Fake())
    >>> p = a.malloc(1000)            # rounded to 1024 bytes, from a 2 MiB segment
    >>> a.memory_allocated(), a.memory_reserved()
    (1024, 2097152)
    >>> a.free(p); a.malloc(1000) == p  # served from the cache
    True
    """

    def __init__(self, backend: RawBackend, event_factory: EventFactory | None = None, *, name: str = "device") -> None:
        self.backend = backend
        self.event_factory = event_factory
        self.name = name
        self._lock = _AllocatorLock()  # public methods only; they never call each other under it
        self._small = _Pool("small", MIN_BLOCK_SIZE)
        self._large = _Pool("large", SMALL_SIZE + 1)
        self._segments: dict[int, _Segment] = {}
        self._live: dict[int, _Block] = {}
        self._pending: list[tuple[_Block, list[StreamEvent]]] = []
        self.routes: dict[int, PrivatePool] = {}  # stream -> the private pool its requests come from (capture)
        self._released_pools: list[PrivatePool] = []  # pools of graphs that are gone: freed once fully free
        self._counters = dict.fromkeys(
            ("num_allocs", "num_frees", "num_ooms", "num_alloc_retries", "num_segment_allocs", "num_segment_frees"), 0
        )
        self._allocated = self._reserved = self._requested = 0
        self._peak_allocated = self._peak_reserved = 0
        self.history: MemoryHistory | None = None  # set while memory history records (see the note above)

    # ---- allocation -------------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Return a device pointer to at least ``nbytes`` bytes, for use on ``stream`` (an int handle)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        stream = int(stream)
        with self._lock:
            size = round_size(nbytes)
            return self._serve(nbytes, size, self._pool_for(size, stream), stream)

    def malloc_cached(self, nbytes: int, stream: int = 0) -> int | None:
        """:meth:`malloc` where :meth:`can_serve` says it would be served from the cache, else None: the two under
        one taking of the lock (what the backend asks before it gives its free lists back: ``device_memory.py``)."""
        stream = int(stream)
        with self._lock:
            size = round_size(nbytes)
            pool = self._pool_for(size, stream)
            if pool.best_fit(stream, size) is None:
                return None
            return self._serve(nbytes, size, pool, stream)

    def can_serve(self, nbytes: int, stream: int = 0) -> bool:
        """Whether a :meth:`malloc` of ``nbytes`` for ``stream`` would be served from the cache, without reserving
        a new segment (blocks waiting for other streams do not count)."""
        stream = int(stream)
        with self._lock:
            size = round_size(nbytes)
            return self._pool_for(size, stream).best_fit(stream, size) is not None

    def _pool_for(self, size: int, stream: int) -> _Pool:
        """The pool a block of ``size`` for ``stream`` comes from (a private one while a capture routes it)."""
        owner = self.routes.get(stream, self) if self.routes else self
        return owner._small if size <= SMALL_SIZE else owner._large

    def _serve(self, nbytes: int, size: int, pool: _Pool, stream: int) -> int:
        """:meth:`malloc` under the lock: the best-fit block of ``pool``, else a new segment's."""
        if self._pending:
            self._release_completed_pending()
        block = pool.best_fit(stream, size, take=True)
        if block is None:
            block = self._new_segment_block(size, pool, stream, nbytes)
        self._split(block, size, pool)
        self._mark_allocated(block, nbytes)
        if self.history is not None:
            self.history.record("alloc", block.ptr, nbytes, stream)
        return block.ptr

    def free(self, ptr: int) -> None:
        """Give back a pointer from :meth:`malloc`; the memory stays cached for reuse."""
        if self._lock.held_here():  # a finalizer inside one of our operations: [Note: frees from finalizers]
            self._lock.deferred.append((self._free, ptr))
            return
        with self._lock:
            self._free(ptr)

    def free_many(self, ptrs: Iterable[int]) -> None:
        """:meth:`free` of each pointer, in order, under one taking of the lock (the backend's free lists going
        back at once: see [Note: small-block fast path] in ``device_memory.py``)."""
        if self._lock.held_here():  # see [Note: frees from finalizers]
            self._lock.deferred.extend((self._free, ptr) for ptr in ptrs)
            return
        with self._lock:
            for ptr in ptrs:
                self._free(ptr)

    def _free(self, ptr: int) -> None:
        block = self._live.pop(ptr, None)
        if block is None:
            raise ValueError(f"free({ptr:#x}): this pointer was not allocated by this allocator, or was already freed")
        self._counters["num_frees"] += 1
        self._allocated -= block.size
        self._requested -= block.requested
        if self.history is not None:
            self.history.record("free_requested", ptr, block.requested, block.stream)
        if block.stream_uses:
            self._defer_until_streams_done(block)
        else:
            self._insert_free(block)

    def record_stream(self, ptr: int, stream: int) -> None:
        """Note that the block at ``ptr`` is used on ``stream`` too: once freed, it is reused only after the
        work queued on ``stream`` up to the free has completed."""
        stream = int(stream)
        with self._lock:
            block = self._live.get(ptr)
            if block is None:
                raise ValueError(f"record_stream({ptr:#x}): not a live allocation of this allocator")
            if stream == block.stream:
                return
            if self.event_factory is None:
                raise RuntimeError("record_stream needs an allocator built with an event_factory")
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    # ---- private pools (CUDA graphs) ---------------------------------------------------------------

    def route(self, stream: int, pool: PrivatePool | None) -> None:
        """Serve ``stream``'s requests from ``pool`` from now on (a graph being captured on it), or from the shared
        pools again (``None``)."""
        with self._lock:
            if pool is None:
                self.routes.pop(int(stream), None)
            else:
                self.routes[int(stream)] = pool

    def release_pool(self, pool: PrivatePool) -> None:
        """The graph that owned ``pool`` is gone: its segments go back to the driver once fully free (at the next
        ``empty_cache`` or out-of-memory retry), and are never handed to another request."""
        if self._lock.held_here():  # a graph's finalizer inside one of our operations (see the note above)
            self._lock.deferred.append((self._release_pool, pool))
            return
        with self._lock:
            self._release_pool(pool)

    def _release_pool(self, pool: PrivatePool) -> None:
        if pool.released:
            return
        pool.released = True
        for stream in [s for s, p in self.routes.items() if p is pool]:
            del self.routes[stream]
        self._released_pools.append(pool)

    def _mark_allocated(self, block: _Block, nbytes: int) -> None:
        block.state = ALLOCATED
        block.requested = nbytes
        self._live[block.ptr] = block
        self._counters["num_allocs"] += 1
        self._allocated += block.size
        self._requested += nbytes
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated

    def _split(self, block: _Block, size: int, pool: _Pool) -> None:
        remaining = block.size - size
        if remaining < pool.split_threshold:
            return
        rest = _Block(ptr=block.ptr + size, size=remaining, segment=block.segment, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        pool.add(rest)

    def _insert_free(self, block: _Block) -> None:
        """Return a block to its pool, merged with free neighbours in its segment."""
        if self.history is not None:
            self.history.record("free_completed", block.ptr, block.requested, block.stream)
        pool = block.segment.pool
        block.state = FREE
        block.requested = 0
        block.stream_uses = None
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.state == FREE:
                pool.remove(neighbour)
                _merge(block, neighbour)
        pool.add(block)

    # ---- segments and the out-of-memory path -------------------------------------------------------

    def _new_segment_block(self, size: int, pool: _Pool, stream: int, nbytes: int) -> _Block:
        try:
            return self._allocate_segment(size, pool, stream)
        except RawOutOfMemory:
            self._counters["num_alloc_retries"] += 1
        self._release_completed_pending(wait=True)
        block = pool.best_fit(stream, size)
        if block is not None:
            pool.remove(block)
            return block
        self._release_free_segments()
        try:
            return self._allocate_segment(size, pool, stream)
        except RawOutOfMemory as exc:
            self._counters["num_ooms"] += 1
            if self.history is not None:
                self.history.record("oom", 0, nbytes, stream, device_free=getattr(exc, "device_free", 0))
            raise self._out_of_memory_error(nbytes, size, stream, exc) from exc

    def _allocate_segment(self, size: int, pool: _Pool, stream: int) -> _Block:
        error: RawOutOfMemory | None = None
        for segment_size in segment_sizes(size):
            try:
                ptr = self.backend.malloc(segment_size)
            except RawOutOfMemory as exc:
                error = exc
                continue
            segment = _Segment(ptr=ptr, size=segment_size, stream=stream, pool=pool)
            self._segments[ptr] = segment
            self._counters["num_segment_allocs"] += 1
            self._reserved += segment_size
            self._peak_reserved = max(self._peak_reserved, self._reserved)
            if self.history is not None:
                self.history.record("segment_alloc", ptr, segment_size, stream)
            segment.head = _Block(ptr=ptr, size=segment_size, segment=segment)
            return segment.head
        assert error is not None
        raise error

    def _release_free_segments(self) -> None:
        released = [p for private in self._released_pools for p in private.pools()]
        for pool in (self._small, self._large, *released):
            for block in pool.blocks():
                if block.fills_segment:
                    pool.remove(block)
                    self._release_segment(block.segment)
        self._released_pools = [p for p in self._released_pools if any(q.blocks() for q in p.pools())
                                or any(s.pool in p.pools() for s in self._segments.values())]

    def _release_segment(self, segment: _Segment) -> None:
        del self._segments[segment.ptr]
        self.backend.free(segment.ptr)
        if self.history is not None:
            self.history.record("segment_free", segment.ptr, segment.size, segment.stream)
        self._reserved -= segment.size
        self._counters["num_segment_frees"] += 1

    def _out_of_memory_error(self, nbytes: int, size: int, stream: int, cause: Exception) -> OutOfMemoryError:
        largest, fragmentation = self._largest_free_block(), self._fragmentation()
        message = (
            f"{self.name} out of memory: tried to allocate {format_bytes(nbytes)} ({nbytes} bytes, block of {size}) "
            f"on stream {stream:#x}. The allocator holds {format_bytes(self._allocated)} allocated and "
            f"{format_bytes(self._reserved)} reserved in {len(self._segments)} segment(s); the largest free cached "
            f"block is {format_bytes(largest)} and free cached memory is {fragmentation:.1%} fragmented. "
            f"Cached free segments were released and the allocation retried; it still failed ({cause}). "
            f"Free tensors you no longer need, call empty_cache() to return cached memory to the driver, "
            f"or reduce the batch size."
        )
        return OutOfMemoryError(
            message,
            requested=nbytes,
            allocated=self._allocated,
            reserved=self._reserved,
            largest_free=largest,
            fragmentation=fragmentation,
        )

    # ---- cross-stream frees -----------------------------------------------------------------------

    def _defer_until_streams_done(self, block: _Block) -> None:
        assert self.event_factory is not None and block.stream_uses
        events = [self.event_factory(stream) for stream in sorted(block.stream_uses)]
        block.state = PENDING
        self._pending.append((block, events))

    def _release_completed_pending(self, wait: bool = False) -> None:
        if not self._pending:
            return
        still_pending = []
        for block, events in self._pending:
            if wait:
                for event in events:
                    event.synchronize()
            if all(event.query() for event in events):
                self._insert_free(block)
            else:
                still_pending.append((block, events))
        self._pending = still_pending

    def empty_cache(self) -> None:
        """Return every fully free cached segment to the backend (waiting for pending cross-stream frees first)."""
        with self._lock:
            self._release_completed_pending(wait=True)
            self._release_free_segments()

    # ---- statistics -------------------------------------------------------------------------------

    def memory_allocated(self) -> int:
        """Bytes in blocks handed out and not yet freed (block sizes, i.e. after rounding)."""
        return self._allocated

    def memory_reserved(self) -> int:
        """Bytes held from the backend, in segments."""
        return self._reserved

    def max_memory_allocated(self) -> int:
        return self._peak_allocated

    def max_memory_reserved(self) -> int:
        return self._peak_reserved

    def reset_peak_memory_stats(self) -> None:
        with self._lock:
            self._peak_allocated = self._allocated
            self._peak_reserved = self._reserved

    def _free_blocks(self) -> Iterator[_Block]:
        yield from self._small.blocks()
        yield from self._large.blocks()

    def _largest_free_block(self) -> int:
        return max((block.size for block in self._free_blocks()), default=0)

    def _fragmentation(self) -> float:
        """1 - largest free block / all free cached bytes (0 when nothing is cached)."""
        total = sum(block.size for block in self._free_blocks())
        return 0.0 if total == 0 else 1.0 - self._largest_free_block() / total

    def memory_stats(self) -> dict[str, Any]:
        """A flat dict of figures; byte counts are block sizes, "peak" since the last reset."""
        with self._lock:
            free_cached = sum(block.size for block in self._free_blocks())
            return {
                "allocated_bytes.current": self._allocated,
                "allocated_bytes.peak": self._peak_allocated,
                "reserved_bytes.current": self._reserved,
                "reserved_bytes.peak": self._peak_reserved,
                "requested_bytes.current": self._requested,
                "active_blocks": len(self._live),
                "pending_free_bytes": sum(block.size for block, _ in self._pending),
                "free_cached_bytes": free_cached,
                "largest_free_block": self._largest_free_block(),
                "fragmentation": self._fragmentation(),
                "num_segments": len(self._segments),
                **self._counters,
            }

    def segments(self) -> list[SegmentInfo]:
        """A snapshot of every segment and its blocks, in address order."""
        with self._lock:
            return [self._segment_info(segment) for _, segment in sorted(self._segments.items())]

    def segments_and_history(self) -> tuple[list[SegmentInfo], MemoryHistory | None]:
        """:meth:`segments` and the history recorded so far, read together (a snapshot's two halves agree)."""
        with self._lock:
            infos = [self._segment_info(segment) for _, segment in sorted(self._segments.items())]
            return infos, self.history

    def _segment_info(self, segment: _Segment) -> SegmentInfo:
        blocks = []
        block = segment.head
        while block is not None:
            blocks.append(BlockInfo(block.ptr, block.size, block.state, block.requested))
            block = block.next
        return SegmentInfo(segment.ptr, segment.size, segment.stream, segment.pool.name, tuple(blocks),
                           segment.pool.pool_id)

    def memory_summary(self) -> str:
        """A short human-readable report of :meth:`memory_stats`."""
        stats = self.memory_stats()
        size = {
            key: format_bytes(stats[key])
            for key in (
                "allocated_bytes.current",
                "allocated_bytes.peak",
                "reserved_bytes.current",
                "reserved_bytes.peak",
                "free_cached_bytes",
                "largest_free_block",
            )
        }
        lines = [
            f"{self.name} caching allocator",
            f"  allocated  {size['allocated_bytes.current']:>12}  (peak {size['allocated_bytes.peak']})",
            f"  reserved   {size['reserved_bytes.current']:>12}  (peak {size['reserved_bytes.peak']})",
            f"  segments   {stats['num_segments']:>12}",
            f"  free cache {size['free_cached_bytes']:>12}  (largest block {size['largest_free_block']})",
            f"  fragmentation {stats['fragmentation']:.1%}",
            f"  allocs {stats['num_allocs']}, frees {stats['num_frees']}, OOMs {stats['num_ooms']}",
            f"  retries after a failed segment allocation {stats['num_alloc_retries']}",
        ]
        return "\n".join(lines)


def _merge(block: _Block, neighbour: _Block) -> None:
    """Absorb the free ``neighbour`` (the block just before or after) into ``block``."""
    if neighbour is block.prev:
        block.ptr = neighbour.ptr
        block.prev = neighbour.prev
        if block.prev is None:
            block.segment.head = block
        else:
            block.prev.next = block
    else:
        block.next = neighbour.next
        if block.next is not None:
            block.next.prev = block
    block.size += neighbour.size


# ---- the real device backend -----------------------------------------------------------------------


class DriverBackend:
    """Raw device memory from ``cuMemAlloc``/``cuMemFree`` on one device (see the note above for why)."""

    def __init__(self, device: int) -> None:
        self.device = device

    def malloc(self, nbytes: int) -> int:
        from tilewise._cuda_api import check, driver_api, is_status
        from tilewise.backends.cuda.runtime.device import ensure_context, mem_get_info

        ensure_context(self.device)
        result = driver_api().cuMemAlloc(nbytes)
        if is_status(result, "CUDA_ERROR_OUT_OF_MEMORY"):
            free, total = mem_get_info(self.device)
            error = RawOutOfMemory(
                f"cuMemAlloc({nbytes}) on cuda:{self.device}: CUDA_ERROR_OUT_OF_MEMORY; the driver reports "
                f"{format_bytes(free)} free of {format_bytes(total)}"
            )
            error.device_free = free  # the memory history's oom entry reports it, as torch's does
            raise error
        return int(check(result, "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        from tilewise._cuda_api import check, driver_api
        from tilewise.backends.cuda.runtime.device import ensure_context

        ensure_context(self.device)
        check(driver_api().cuMemFree(ptr), "cuMemFree")


def driver_event_factory(device: int) -> EventFactory:
    """An event factory for ``device``: records a timing-free event on the given stream handle."""
    from tilewise.backends.cuda.runtime.stream import Event, Stream

    def record_on(stream: int) -> StreamEvent:
        event = Event()
        event.record(Stream.from_handle(stream, device))
        return event

    return record_on


_device_allocators: dict[int, CachingAllocator] = {}
_device_allocators_lock = threading.Lock()
history_settings: dict | None = None  # MemoryHistory's arguments while history records (new allocators record too)


def set_history(settings: dict | None, keep: bool = False) -> None:
    """Start (``settings``: ``MemoryHistory``'s keyword arguments) or stop recording on every device's
    allocator, now and for those made later; with ``keep``, a history already recording goes on into the new
    one (torch's ``clear_history=False``)."""
    global history_settings
    with _device_allocators_lock:
        history_settings = settings
        allocators = dict(_device_allocators)
    for device, allocator in allocators.items():
        previous = allocator.history
        allocator.history = MemoryHistory(device, **settings) if settings is not None else None
        if keep and previous is not None and allocator.history is not None:
            allocator.history.continue_from(previous)


def device_allocators() -> dict[int, CachingAllocator]:
    """The allocators made so far, by device index."""
    with _device_allocators_lock:
        return dict(_device_allocators)


def get_allocator(device: int | None = None) -> CachingAllocator:
    """The process-wide caching allocator of ``device`` (default: the current device)."""
    from tilewise.backends.cuda.runtime.device import current_device

    index = current_device() if device is None else int(device)
    with _device_allocators_lock:
        allocator = _device_allocators.get(index)
        if allocator is None:
            allocator = CachingAllocator(DriverBackend(index), driver_event_factory(index), name=f"cuda:{index}")
            if history_settings is not None:
                allocator.history = MemoryHistory(index, **history_settings)
            _device_allocators[index] = allocator
    return allocator
