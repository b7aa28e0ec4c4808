"""Tests of the CUDA runtime layer: the caching allocator on a fake backend (CPU), availability without a
GPU, the single error check, and (marked ``cuda``) devices, streams, events, pinned memory and the
allocator on the real driver."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilewise._cuda_api import (
    CudaError,
    check,
    device_count,
    driver_version,
    is_available,
)
from tilewise.backends.cuda.runtime.allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    OutOfMemoryError,
    PrivatePool,
    RawOutOfMemory,
    round_size,
)

MiB = 1 << 20


# ---- fakes ---------------------------------------------------------------------------------------------


class FakeBackend:
    """Hands out addresses from a bump pointer, up to ``capacity`` bytes live at once."""

    def __init__(self, capacity: int = 1 << 40) -> None:
        self.capacity = capacity
        self.live: dict[int, int] = {}
        self.next_address = 0x7F00_0000_0000
        self.malloc_calls = 0
        self.free_calls = 0

    @property
    def used(self) -> int:
        return sum(self.live.values())

    def malloc(self, nbytes: int) -> int:
        self.malloc_calls += 1
        if self.used + nbytes > self.capacity:
            raise RawOutOfMemory(f"fake device: {nbytes} requested, {self.capacity - self.used} free")
        ptr = self.next_address
        self.next_address += nbytes + 4096  # a gap, so that neighbouring segments never look contiguous
        self.live[ptr] = nbytes
        return ptr

    def free(self, ptr: int) -> None:
        self.free_calls += 1
        del self.live[ptr]


class FakeEvent:
    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.done = False
        self.synchronized = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = True
        self.done = True


class FakeEvents:
    """An event factory whose events complete only when the test says so."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []

    def __call__(self, stream: int) -> FakeEvent:
        event = FakeEvent(stream)
        self.recorded.append(event)
        return event

    def complete(self, stream: int | None = None) -> None:
        for event in self.recorded:
            if stream is None or event.stream == stream:
                event.done = True


def make_allocator(capacity: int = 1 << 40) -> tuple[CachingAllocator, FakeBackend, FakeEvents]:
    backend, events = FakeBackend(capacity), FakeEvents()
    return CachingAllocator(backend, events, name="fake"), backend, events


def fake_device_memory(monkeypatch, device: int):
    """The CUDA backend's memory of a made-up device, over an allocator of fake memory: (memory, allocator, backend)."""
    from tilewise.backends.cuda import device_memory as dm

    allocator, backend, _ = make_allocator()
    memory = dm.DeviceMemory.__new__(dm.DeviceMemory)
    memory.device, memory.allocator, memory.free_lists, memory.cached, memory.allocated, memory.peak = (
        device, allocator, {}, 0, 0, 0)
    memory.cache_limit = dm.SMALL_CACHE_LIMIT
    monkeypatch.setitem(dm._memories, device, memory)
    return memory, allocator, backend


def check_invariants(allocator: CachingAllocator, backend: FakeBackend) -> None:
    segments = allocator.segments()
    assert {s.ptr: s.size for s in segments} == backend.live
    live_ranges = []
    for segment in segments:
        position = segment.ptr
        previous_state = None
        for block in segment.blocks:
            assert block.ptr == position, "blocks must tile their segment"
            assert block.size > 0 and block.size % 512 == 0
            assert not (block.state == "free" and previous_state == "free"), "free neighbours must be merged"
            previous_state = block.state
            position += block.size
            if block.state == "allocated":
                live_ranges.append((block.ptr, block.ptr + block.size))
        assert position == segment.ptr + segment.size
    live_ranges.sort()
    for (_, end), (start, _) in itertools.pairwise(live_ranges):
        assert end <= start, "live blocks overlap"
    stats = allocator.memory_stats()
    assert allocator.memory_allocated() == sum(end - start for start, end in live_ranges)
    assert allocator.memory_reserved() == sum(s.size for s in segments) == backend.used
    assert allocator.memory_reserved() >= allocator.memory_allocated()
    assert stats["allocated_bytes.peak"] >= stats["allocated_bytes.current"]
    assert stats["reserved_bytes.peak"] >= stats["reserved_bytes.current"]
    free_blocks = [b.size for s in segments for b in s.blocks if b.state == "free"]
    assert stats["free_cached_bytes"] == sum(free_blocks)
    assert stats["largest_free_block"] == max(free_blocks, default=0)


# ---- size classes, splitting, coalescing, reuse -------------------------------------------------------


def test_round_size_and_small_segment():
    allocator, backend, _ = make_allocator()
    assert round_size(0) == round_size(1) == 512 and round_size(513) == 1024
    allocator.malloc(1)
    assert allocator.memory_allocated() == 512
    assert allocator.memory_reserved() == SMALL_BUFFER
    assert backend.live == {allocator.segments()[0].ptr: SMALL_BUFFER}


def test_small_blocks_are_split_from_one_segment():
    allocator, backend, _ = make_allocator()
    first = allocator.malloc(1000)
    second = allocator.malloc(3000)
    assert second == first + 1024
    assert backend.malloc_calls == 1
    (segment,) = allocator.segments()
    assert [(b.size, b.state) for b in segment.blocks] == [
        (1024, "allocated"),
        (3072, "allocated"),
        (SMALL_BUFFER - 4096, "free"),
    ]
    check_invariants(allocator, backend)


def test_freed_neighbours_coalesce_and_empty_cache_returns_the_segment():
    allocator, backend, _ = make_allocator()
    a, b, c = (allocator.malloc(4096) for _ in range(3))
    allocator.free(a)
    allocator.free(c)
    blocks = allocator.segments()[0].blocks
    assert [b.state for b in blocks] == ["free", "allocated", "free"]
    allocator.free(b)
    (only,) = allocator.segments()[0].blocks
    assert (only.size, only.state) == (SMALL_BUFFER, "free")
    allocator.empty_cache()
    assert allocator.segments() == [] and backend.live == {} and allocator.memory_reserved() == 0


def test_freed_block_is_reused_without_new_segment():
    allocator, backend, _ = make_allocator()
    ptr = allocator.malloc(5000)
    allocator.free(ptr)
    assert allocator.malloc(5000) == ptr
    assert backend.malloc_calls == 1
    assert allocator.memory_stats()["num_segment_allocs"] == 1


def test_best_fit_picks_the_smallest_block_that_fits():
    allocator, backend, _ = make_allocator()
    big = allocator.malloc(64 * 1024)
    allocator.malloc(512)  # keeps big and small apart
    small = allocator.malloc(8192)
    allocator.malloc(512)
    allocator.free(big)
    allocator.free(small)
    assert allocator.malloc(8000) == small
    check_invariants(allocator, backend)


def test_medium_requests_share_20_mib_segments_and_large_get_their_own():
    allocator, backend, _ = make_allocator()
    a = allocator.malloc(3 * MiB)
    b = allocator.malloc(3 * MiB)
    assert b == a + 3 * MiB and allocator.memory_reserved() == LARGE_BUFFER
    allocator.malloc(11 * MiB)  # large, but the 14 MiB left in the segment fit it
    assert allocator.memory_reserved() == LARGE_BUFFER
    allocator.malloc(11 * MiB + 1)  # no cached block fits: a segment of its own, rounded up to 2 MiB
    assert allocator.memory_reserved() == LARGE_BUFFER + 12 * MiB
    assert len(allocator.segments()) == 2
    check_invariants(allocator, backend)


def test_large_remainders_of_one_mib_or_less_are_not_split():
    allocator, backend, _ = make_allocator()
    ptr = allocator.malloc(LARGE_BUFFER - 768 * 1024)  # 19.25 MiB: a segment of its own, rounded to 20 MiB
    assert allocator.memory_reserved() == LARGE_BUFFER
    assert allocator.memory_allocated() == LARGE_BUFFER  # the 0.75 MiB tail is not worth a block of its own
    allocator.free(ptr)
    again = allocator.malloc(19 * MiB + 512)  # fits the cached 20 MiB block with < 1 MiB left: not split
    assert again == ptr and allocator.memory_allocated() == LARGE_BUFFER
    check_invariants(allocator, backend)


def test_medium_request_falls_back_to_a_segment_of_its_own_size():
    allocator, backend, _ = make_allocator(capacity=8 * MiB)
    allocator.malloc(3 * MiB)
    assert allocator.memory_reserved() == 4 * MiB
    check_invariants(allocator, backend)


def test_free_of_unknown_or_freed_pointer_raises():
    allocator, _, _ = make_allocator()
    ptr = allocator.malloc(10)
    allocator.free(ptr)
    with pytest.raises(ValueError, match="not allocated by this allocator"):
        allocator.free(ptr)
    with pytest.raises(ValueError):
        allocator.free(12345)
    with pytest.raises(ValueError):
        allocator.malloc(-1)


# ---- streams ------------------------------------------------------------------------------------------


def test_blocks_are_reused_only_on_their_own_stream():
    allocator, backend, _ = make_allocator()
    on_one = allocator.malloc(4096, stream=1)
    allocator.free(on_one)
    on_two = allocator.malloc(4096, stream=2)
    assert on_two != on_one and backend.malloc_calls == 2
    assert allocator.malloc(4096, stream=1) == on_one
    assert {s.stream for s in allocator.segments()} == {1, 2}


def _private_ranges(allocator: CachingAllocator) -> list[tuple[int, int]]:
    return [(s.ptr, s.ptr + s.size) for s in allocator.segments() if s.pool_id]


def test_a_graphs_private_pool_keeps_its_blocks_from_every_other_request():
    allocator, backend, _ = make_allocator()
    cached = allocator.malloc(4096, stream=7)
    allocator.free(cached)  # a block cached for the capture's stream before the capture
    pool = PrivatePool()
    allocator.route(7, pool)
    a = allocator.malloc(4096, stream=7)
    assert a != cached, "a capture never takes a block of the shared cache"
    allocator.free(a)
    assert allocator.malloc(4096, stream=7) == a  # reused inside the same capture, in its stream order
    large = allocator.malloc(3 * MiB, stream=7)
    elsewhere = allocator.malloc(4096, stream=8)  # another stream meanwhile: the shared pools
    assert elsewhere != a
    allocator.route(7, None)
    private = _private_ranges(allocator)
    assert len(private) == 2 and any(lo <= large < hi for lo, hi in private)
    allocator.free(large)  # freed after the capture (a tensor that outlived it): back into the pool
    later = [allocator.malloc(n, stream=st) for n in (512, 4096, 3 * MiB) for st in (0, 7, 8)]
    assert not any(lo <= p < hi for p in later for lo, hi in private)
    allocator.empty_cache()
    assert _private_ranges(allocator) == private, "a live graph keeps its memory through empty_cache"
    allocator.release_pool(pool)
    allocator.empty_cache()
    assert _private_ranges(allocator) == [(lo, hi) for lo, hi in private if lo <= a < hi]  # `a` is still live
    allocator.free(a)
    allocator.empty_cache()
    assert _private_ranges(allocator) == []
    for p in [*later, elsewhere]:
        allocator.free(p)
    allocator.empty_cache()
    assert backend.live == {} and allocator.memory_reserved() == 0


def test_a_released_pool_is_returned_to_the_driver_before_an_out_of_memory_error():
    allocator, backend, _ = make_allocator(capacity=8 * MiB)
    pool = PrivatePool()
    allocator.route(1, pool)
    allocator.free(allocator.malloc(5 * MiB, stream=1))
    allocator.route(1, None)
    with pytest.raises(OutOfMemoryError):
        allocator.malloc(5 * MiB, stream=1)  # the graph still lives: its 6 MiB stay its own
    allocator.release_pool(pool)
    assert allocator.malloc(5 * MiB, stream=1) and not _private_ranges(allocator)


def test_record_stream_defers_reuse_until_the_event_completes():
    allocator, backend, events = make_allocator()
    ptr = allocator.malloc(4096, stream=1)
    allocator.record_stream(ptr, 2)
    allocator.record_stream(ptr, 1)  # its own stream: nothing to wait for
    allocator.free(ptr)
    assert [e.stream for e in events.recorded] == [2]
    assert allocator.memory_allocated() == 0
    assert allocator.memory_stats()["pending_free_bytes"] == 4096
    other = allocator.malloc(4096, stream=1)
    assert other != ptr, "a block still in use on stream 2 must not be handed out"
    events.complete(stream=2)
    assert allocator.malloc(4096, stream=1) == ptr
    assert allocator.memory_stats()["pending_free_bytes"] == 0
    check_invariants(allocator, backend)


def test_record_stream_needs_an_event_factory():
    allocator = CachingAllocator(FakeBackend())
    ptr = allocator.malloc(100, stream=1)
    with pytest.raises(RuntimeError, match="event_factory"):
        allocator.record_stream(ptr, 2)


def test_empty_cache_waits_for_pending_frees():
    allocator, backend, events = make_allocator()
    ptr = allocator.malloc(4096, stream=1)
    allocator.record_stream(ptr, 7)
    allocator.free(ptr)
    allocator.empty_cache()
    assert events.recorded[0].synchronized
    assert backend.live == {} and allocator.memory_reserved() == 0


# ---- statistics ---------------------------------------------------------------------------------------


def test_stats_arithmetic_and_peaks():
    allocator, backend, _ = make_allocator()
    sizes = [1, 700, 4096, 12 * MiB, 2 * MiB]  # 12 MiB first: it would fit in the 2 MiB block's segment
    pointers = [allocator.malloc(n) for n in sizes]
    expected = sum(round_size(n) for n in sizes)
    stats = allocator.memory_stats()
    assert allocator.memory_allocated() == stats["allocated_bytes.current"] == expected
    assert stats["requested_bytes.current"] == sum(sizes)
    assert stats["num_allocs"] == 5 and stats["active_blocks"] == 5
    assert allocator.memory_reserved() == SMALL_BUFFER + LARGE_BUFFER + 12 * MiB
    for ptr in pointers[3:]:
        allocator.free(ptr)
    assert allocator.memory_allocated() == expected - round_size(2 * MiB) - round_size(12 * MiB)
    assert allocator.max_memory_allocated() == expected
    assert allocator.memory_stats()["num_frees"] == 2
    allocator.reset_peak_memory_stats()
    assert allocator.max_memory_allocated() == allocator.memory_allocated()
    assert allocator.max_memory_reserved() == allocator.memory_reserved()
    allocator.empty_cache()
    assert allocator.memory_reserved() == SMALL_BUFFER
    assert allocator.max_memory_reserved() == SMALL_BUFFER + LARGE_BUFFER + 12 * MiB
    check_invariants(allocator, backend)


def test_fragmentation_is_one_minus_largest_over_total_free():
    allocator, backend, _ = make_allocator()
    blocks = [allocator.malloc(512 * 1024) for _ in range(4)]  # fills one 2 MiB segment exactly
    assert allocator.memory_stats()["fragmentation"] == 0.0
    allocator.free(blocks[0])
    allocator.free(blocks[2])
    stats = allocator.memory_stats()
    assert stats["free_cached_bytes"] == MiB and stats["largest_free_block"] == 512 * 1024
    assert stats["fragmentation"] == pytest.approx(0.5)
    allocator.free(blocks[1])
    assert allocator.memory_stats()["fragmentation"] == 0.0  # merged into one 1.5 MiB block
    assert "fragmentation" in allocator.memory_summary()
    check_invariants(allocator, backend)


# ---- out of memory ------------------------------------------------------------------------------------


def test_oom_raises_a_report_and_the_allocator_recovers():
    allocator, backend, _ = make_allocator(capacity=64 * MiB)
    held = [allocator.malloc(20 * MiB) for _ in range(3)]
    before = allocator.memory_stats()
    with pytest.raises(OutOfMemoryError) as caught:
        allocator.malloc(30 * MiB)
    error = caught.value
    message = str(error)
    assert isinstance(error, RuntimeError)
    for needle in (
        "30.00 MiB",
        str(30 * MiB),
        "60.00 MiB allocated",
        "60.00 MiB reserved",
        "largest free",
        "fragmented",
        "empty_cache",
        "batch size",
    ):
        assert needle in message, needle
    assert (error.requested, error.allocated, error.reserved) == (30 * MiB, 60 * MiB, 60 * MiB)
    after = allocator.memory_stats()
    assert after["num_ooms"] == 1 and after["num_alloc_retries"] == 1
    assert after["allocated_bytes.current"] == before["allocated_bytes.current"]
    assert after["reserved_bytes.current"] == before["reserved_bytes.current"]
    check_invariants(allocator, backend)
    allocator.free(held[0])
    allocator.free(held[1])
    ptr = allocator.malloc(30 * MiB)  # needs the cached 20 MiB segments returned to the backend first
    assert allocator.memory_allocated() == 20 * MiB + 30 * MiB
    allocator.free(ptr)
    check_invariants(allocator, backend)


def test_oom_releases_cached_segments_of_other_streams_and_retries():
    allocator, backend, _ = make_allocator(capacity=24 * MiB)
    allocator.free(allocator.malloc(20 * MiB, stream=1))
    ptr = allocator.malloc(20 * MiB, stream=2)  # the cached stream-1 segment is in the way
    stats = allocator.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0 and stats["num_segment_frees"] == 1
    assert allocator.segments()[0].stream == 2 and allocator.segments()[0].ptr == ptr
    check_invariants(allocator, backend)


def test_oom_path_waits_for_pending_cross_stream_frees():
    allocator, backend, events = make_allocator(capacity=20 * MiB)
    ptr = allocator.malloc(20 * MiB, stream=1)
    allocator.record_stream(ptr, 3)
    allocator.free(ptr)
    assert allocator.malloc(20 * MiB, stream=1) == ptr  # reused after synchronising the event
    assert events.recorded[0].synchronized
    check_invariants(allocator, backend)


def test_unexpected_backend_errors_propagate_and_leave_state_alone():
    class Broken(FakeBackend):
        def malloc(self, nbytes: int) -> int:
            raise OSError("driver exploded")

    allocator = CachingAllocator(Broken())
    with pytest.raises(OSError):
        allocator.malloc(100)
    assert allocator.memory_reserved() == 0 and allocator.memory_stats()["num_ooms"] == 0


# ---- frees from finalizers (the collector runs them inside the allocator's own operations) -----------


def _on_a_thread(fn, timeout: float = 20.0):
    """Run ``fn`` on a daemon thread; a hang fails the test instead of the suite."""
    import threading

    outcome: dict = {}

    def body():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 — handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the allocator hung: a free from a finalizer waited on the allocator's own lock"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_finalizer_freeing_inside_malloc_neither_hangs_nor_corrupts_the_cache():
    """A tensor in a reference cycle is collected while the allocator makes a new segment's bookkeeping (a ResNet
    eager step hung there on a GPU): its free waits until the malloc is done, then lands."""
    import gc

    class Collecting(FakeBackend):
        def malloc(self, nbytes: int) -> int:
            ptr = super().malloc(nbytes)
            gc.collect()  # what an allocation of the allocator's own objects may set off
            return ptr

    backend, events = Collecting(), FakeEvents()
    allocator = CachingAllocator(backend, events, name="fake")

    class Holder:  # a DeviceBuffer-like owner whose finalizer gives its block back
        def __init__(self, ptr):
            self.ptr, self.me = ptr, self  # a cycle: only the collector frees it

        def __del__(self):
            allocator.free(self.ptr)

    def run():
        first = allocator.malloc(24 * MiB)  # a segment of its own
        Holder(first)  # garbage now, in a cycle
        second = allocator.malloc(30 * MiB)  # a new segment: the collector runs inside this malloc
        assert allocator.memory_stats()["num_frees"] == 1, "the finalizer's free must have landed"
        check_invariants(allocator, backend)
        assert allocator.malloc(24 * MiB) == first, "the freed block is cached for reuse"
        return second

    gc.collect()
    _on_a_thread(run)
    check_invariants(allocator, backend)


def test_a_graph_pool_released_by_a_finalizer_inside_malloc_is_released_after_it():
    allocator, backend, _ = make_allocator()
    pool = PrivatePool()
    allocator.route(7, pool)
    original = backend.malloc

    def malloc(nbytes):
        allocator.release_pool(pool)  # a graph's __del__, run by the collector here
        assert not pool.released, "the release waits until the malloc is done"
        return original(nbytes)

    backend.malloc = malloc
    _on_a_thread(lambda: allocator.malloc(100))
    assert pool.released and 7 not in allocator.routes


def test_malloc_cached_serves_what_can_serve_allows_and_reserves_nothing_else():
    """``malloc_cached`` is ``malloc`` where ``can_serve`` says yes (the same block), else None, reserving nothing."""
    allocator, backend, _ = make_allocator()
    twin, _, _ = make_allocator()
    for a in (allocator, twin):
        a.malloc(3 * MiB)  # kept
        a.free(a.malloc(12 * MiB))
    assert allocator.malloc_cached(30 * MiB) is None and allocator.memory_reserved() == twin.memory_reserved()
    assert allocator.malloc_cached(5 * MiB, stream=1) is None
    assert allocator.can_serve(5 * MiB)
    assert allocator.malloc_cached(5 * MiB) == twin.malloc(5 * MiB)
    assert allocator.segments() == twin.segments() and allocator.memory_stats() == twin.memory_stats()
    check_invariants(allocator, backend)


def test_free_many_leaves_the_cache_as_frees_one_by_one_do():
    """``free_many`` (the backend's free lists going back at once) is ``free`` of each pointer in order, under one
    taking of the lock; called inside one of the allocator's operations (a finalizer), its frees wait as free's do."""
    sizes = [300, 4096, 3 * MiB, 700 << 10, 12 * MiB, 512, 5 * MiB, 2 * MiB]
    states = []
    for bulk in (False, True):
        allocator, backend, _ = make_allocator()
        ptrs = [allocator.malloc(n, stream=k % 2) for k, n in enumerate(sizes)]
        kept = ptrs[3]
        freed = [p for p in ptrs if p != kept]
        if bulk:
            allocator.free_many(freed)
        else:
            for ptr in freed:
                allocator.free(ptr)
        check_invariants(allocator, backend)
        states.append((allocator.segments(), allocator.memory_stats()))
    assert states[0] == states[1]
    with allocator._lock:  # as a finalizer inside malloc: deferred until the operation ends
        allocator.free_many([kept])
        assert allocator.memory_allocated() > 0
    assert allocator.memory_allocated() == 0


def test_the_backends_free_lists_are_emptied_even_when_finalizers_add_to_them_meanwhile(monkeypatch):
    """Giving the small-block free lists back (empty_cache, the out-of-memory retry, before a capture) frees into the
    allocator, where the collector may run a buffer's finalizer that puts a block on the lists being emptied."""
    from tilewise.backends.cuda import device_memory as dm

    memory, allocator, backend = fake_device_memory(monkeypatch, 98)
    buffers = [dm.DeviceBuffer(4096 * (k + 1), 98, k % 2) for k in range(6)]
    late = [dm.DeviceBuffer(512, 98, 1), dm.DeviceBuffer(1024, 98, 1)]  # freed by "finalizers" during the emptying
    del buffers
    original = allocator.free

    def free(ptr):
        original(ptr)
        if late:
            late.pop()  # its __del__ puts its block on the free list of stream 1, under a new key

    allocator.free = free
    memory.release_free_list(1)
    assert not [key for key in memory.free_lists if key[0] == 1], "a capture on stream 1 must find its lists empty"
    late.clear()
    memory.release_free_lists()
    assert memory.free_lists == {} and memory.cached == 0 and memory.allocated == 0
    allocator.empty_cache()
    assert backend.live == {}


def test_a_malloc_re_entering_the_allocator_is_an_error_not_a_hang():
    allocator, backend, _ = make_allocator()
    original = backend.malloc
    backend.malloc = lambda nbytes: (allocator.malloc(100), original(nbytes))[1]
    with pytest.raises(RuntimeError, match="re-entered"):
        _on_a_thread(lambda: allocator.malloc(100))
    backend.malloc = original
    assert allocator.malloc(100), "the lock is free again after the error"


# ---- property test ------------------------------------------------------------------------------------

sizes = st.one_of(st.integers(0, 4096), st.integers(4096, 2 * MiB), st.integers(2 * MiB, 24 * MiB))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.sampled_from([0, 1, 2])),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("record"), st.integers(0, 1000), st.sampled_from([0, 1, 2])),
        st.tuples(st.just("complete"), st.just(0), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.sampled_from([48 * MiB, 128 * MiB, 1 << 40]))
def test_random_sequences_keep_the_invariants(ops, capacity):
    allocator, backend, events = make_allocator(capacity)
    live: dict[int, int] = {}
    for op, value, stream in ops:
        if op == "malloc":
            try:
                ptr = allocator.malloc(value, stream=stream)
            except OutOfMemoryError:
                pass
            else:
                assert ptr not in live
                live[ptr] = value
        elif op == "free" and live:
            ptr = sorted(live)[value % len(live)]
            allocator.free(ptr)
            del live[ptr]
        elif op == "record" and live:
            allocator.record_stream(sorted(live)[value % len(live)], stream)
        elif op == "complete":
            events.complete()
        elif op == "empty_cache":
            allocator.empty_cache()
        check_invariants(allocator, backend)
        check_block_sizes(allocator, live)
        assert allocator.memory_stats()["requested_bytes.current"] == sum(live.values())
    for ptr in list(live):
        allocator.free(ptr)
    allocator.empty_cache()
    assert backend.live == {} and allocator.memory_allocated() == 0


def check_block_sizes(allocator: CachingAllocator, live: dict[int, int]) -> None:
    """Each live block is its rounded request plus at most an unsplittable tail."""
    blocks = {b.ptr: b for s in allocator.segments() for b in s.blocks if b.state == "allocated"}
    assert set(blocks) == set(live)
    for ptr, requested in live.items():
        tail = blocks[ptr].size - round_size(requested)
        assert 0 <= tail < (512 if round_size(requested) <= MiB else MiB + 1)
        assert blocks[ptr].requested == requested


# ---- the driver layer without a GPU -------------------------------------------------------------------


def test_availability_is_a_clean_false_without_a_gpu():
    if is_available():
        pytest.skip("this machine has a GPU")
    assert is_available() is False
    assert device_count() == 0
    assert driver_version() is None


def test_import_and_is_available_without_cuda_bindings():
    script = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "cuda" or name.startswith("cuda."):
                    raise ImportError("blocked for the test")
        sys.meta_path.insert(0, Block())
        import tilewise.backends.cuda.runtime as rt
        import tilewise.codegen.toolchain as tc
        assert rt.is_available() is False and rt.device_count() == 0
        try:
            rt.Stream()
        except rt.CudaUnavailableError as exc:
            print("unavailable:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=_repo_root(), check=False)
    assert done.returncode == 0, done.stderr
    assert "pip install" in done.stdout


def _repo_root() -> str:
    import pathlib

    return str(pathlib.Path(__file__).resolve().parents[1])


def test_check_returns_values_and_raises_with_the_call_name():
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert check((ok,), "x") is None
    assert check((ok, 5), "x") == 5
    assert check((ok, 1, 2), "x") == (1, 2)
    with pytest.raises(CudaError) as caught:
        check((nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,), "nvrtcCompileProgram")
    assert caught.value.call == "nvrtcCompileProgram"
    assert "nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION (6)" in str(caught.value)


def test_check_describes_driver_errors_even_without_a_driver():
    from cuda.bindings import driver as cu

    with pytest.raises(CudaError, match=r"cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY \(2\)"):
        check((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY,), "cuMemAlloc")


# ---- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_device_properties():
    from tilewise.backends.cuda.runtime import (
        current_device,
        get_device_properties,
        set_device,
        synchronize,
    )

    props = get_device_properties(0)
    assert props.name and props.multi_processor_count > 0 and props.total_memory > 1 << 30
    assert props.compute_capability >= (7, 0) and props.arch.startswith("sm_")
    assert props.warp_size == 32 and props.l2_cache_size > 0 and props.clock_rate_khz > 0
    assert props.max_shared_memory_per_block_optin >= props.max_shared_memory_per_block > 0
    set_device(0)
    assert current_device() == 0
    synchronize()
    with pytest.raises(ValueError, match="does not exist"):
        get_device_properties(device_count())
    print(props)


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_streams_events_and_copies():
    from tilewise.backends.cuda.runtime import (
        Event,
        Stream,
        copy_dtod,
        copy_dtoh,
        copy_htod,
        current_stream,
        get_allocator,
        pinned_empty,
        stream,
    )

    allocator = get_allocator(0)
    n = 64 * MiB
    host = pinned_empty((n // 4,), np.float32)
    host[:] = np.arange(n // 4, dtype=np.float32)
    src, dst = allocator.malloc(n), allocator.malloc(n)
    s = Stream()
    assert int(current_stream()) == 0
    with stream(s):
        assert current_stream() == s
        start, end = Event(enable_timing=True), Event(enable_timing=True)
        start.record()
        copy_htod(src, host.ctypes.data, n, s)
        for _ in range(10):
            copy_dtod(dst, src, n, s)
        end.record()
    assert int(current_stream()) == 0
    end.synchronize()
    assert end.query() and s.query()
    ms = start.elapsed_time(end)
    assert ms > 0
    back = pinned_empty((n // 4,), np.float32)
    other = Stream()
    other.wait_stream(s)
    copy_dtoh(back.ctypes.data, dst, n, other)
    other.synchronize()
    np.testing.assert_array_equal(back, host)
    print(f"64 MiB H2D + 10 D2D copies: {ms:.3f} ms")
    allocator.free(src)
    allocator.free(dst)


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_sleep_holds_the_stream_for_its_cycles():
    """tw.cuda._sleep spins for at least its cycles of the top clock (longer at lower clocks), and what is queued
    behind it waits for it."""
    import tilewise as tw

    per_ms = tw.cuda.get_device_properties().clock_rate_khz
    start, end = tw.cuda.Event(enable_timing=True), tw.cuda.Event(enable_timing=True)
    start.record()
    tw.cuda._sleep(2 * per_ms)
    x = tw.ones(4, device="cuda") * 3
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 1.9
    assert x.cpu().numpy().tolist() == [3.0] * 4


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_driver_allocator_record_stream_and_oom_recovery():
    from tilewise.backends.cuda.runtime import Stream, mem_get_info
    from tilewise.backends.cuda.runtime.allocator import (
        DriverBackend,
        driver_event_factory,
    )

    allocator = CachingAllocator(DriverBackend(0), driver_event_factory(0), name="cuda:0")
    s1, s2 = Stream(), Stream()
    ptr = allocator.malloc(MiB, stream=int(s1))
    allocator.record_stream(ptr, int(s2))
    allocator.free(ptr)
    s2.synchronize()
    assert allocator.malloc(MiB, stream=int(s1)) == ptr
    allocator.free(ptr)

    _, total = mem_get_info(0)
    chunk = max(1 << 30, total // 16)
    held = []
    with pytest.raises(OutOfMemoryError) as caught:
        for _ in range(64):
            held.append(allocator.malloc(chunk))
    message = str(caught.value)
    assert f"({chunk} bytes" in message and "reserved" in message and "empty_cache" in message
    stats = allocator.memory_stats()
    assert stats["num_ooms"] == 1 and held
    # each chunk has a segment of its own, rounded to 2 MiB; the < 1 MiB tail is not split off, so it counts
    assert stats["allocated_bytes.current"] == stats["reserved_bytes.current"] >= len(held) * chunk
    for p in held:
        allocator.free(p)
    again = allocator.malloc(chunk)
    allocator.free(again)
    allocator.empty_cache()
    assert allocator.memory_reserved() == 0
    print(message)


def test_record_stream_takes_a_stream_as_torchs_does():
    import torch

    import tilewise as tw

    with pytest.raises(RuntimeError) as ours:
        tw.ones(2).record_stream(None)
    with pytest.raises(RuntimeError) as theirs:
        torch.ones(2).record_stream(None)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.cuda
def test_a_stream_object_gone_before_the_memory_recorded_on_it_is_freed():
    """The block's event is recorded on the stream's handle when the tensor is freed: the handle outlives its
    Stream object (kept for the next Stream), so freeing afterwards neither crashes nor reuses early."""
    import gc
    import importlib

    import tilewise as tw
    from tilewise.backends.cuda.runtime import Stream

    stream_module = importlib.import_module("tilewise.backends.cuda.runtime.stream")  # the package's stream() hides it

    gc.collect()  # finalizers of earlier tests' garbage would otherwise run in the middle of this one
    s = Stream()
    handle, key = s.handle, (s.device, s.priority)
    x = tw.ones(1 << 20, device="cuda")
    x.record_stream(s)
    del s
    gc.collect()
    assert handle in stream_module._released[key]  # kept for the next Stream, not destroyed
    del x  # the allocator records an event on the old stream's handle here
    gc.collect()
    again = Stream()
    again.synchronize()  # the pooled handles are live streams
    y = tw.full((1 << 20,), 2.0, device="cuda")
    tw.cuda.synchronize()
    assert float(y.sum()) == 2.0 * (1 << 20)


# ---- capturing a CUDA graph, on a fake driver ----------------------------------------------------------


class FakeCaptureDriver:
    """The driver calls ``backends.cuda.graphs.capture`` makes, recorded; ``end_status`` is what ending returns."""

    def __init__(self, end_status: str = "CUDA_SUCCESS") -> None:
        from cuda.bindings import driver

        self.CUstreamCaptureMode = driver.CUstreamCaptureMode
        self.CUresult = driver.CUresult
        self.end_status = end_status
        self.calls: list[str] = []

    def _ok(self, name: str, *values):
        self.calls.append(name)
        return (self.CUresult.CUDA_SUCCESS, *values)

    def cuStreamBeginCapture(self, stream, mode):
        return self._ok("begin")

    def cuStreamEndCapture(self, stream):
        self.calls.append("end")
        if self.end_status != "CUDA_SUCCESS":
            return (getattr(self.CUresult, self.end_status), None)
        return (self.CUresult.CUDA_SUCCESS, "graph")

    def cuGraphInstantiate(self, graph, flags):
        return self._ok("instantiate", "exec")

    def cuGraphDestroy(self, graph):
        return self._ok("destroy graph")

    def cuGraphExecDestroy(self, executable):
        return self._ok("destroy exec")

    def cuCtxSynchronize(self):
        return self._ok("synchronize")


def install_fake_graphs(monkeypatch, driver):
    """``backends.cuda.graphs`` over ``driver`` and a fake-backed allocator, with no context to make current;
    returns the allocator."""
    from types import SimpleNamespace

    from tilewise.backends.cuda import graphs

    allocator, _, _ = make_allocator()
    mem = SimpleNamespace(allocator=allocator, release_free_list=lambda stream: None)
    monkeypatch.setattr(graphs, "driver_api", lambda: driver)
    monkeypatch.setattr(graphs, "memory", lambda device: mem)
    monkeypatch.setattr(graphs, "ensure_context", lambda device: device)
    return allocator


@pytest.fixture
def fake_capture(monkeypatch):
    """``graphs.capture`` over a fake driver, a fake-backed allocator and a stream that needs no GPU."""
    from tilewise.backends.cuda import graphs
    from tilewise.backends.cuda.runtime.stream import Stream

    driver = FakeCaptureDriver()
    allocator = install_fake_graphs(monkeypatch, driver)
    monkeypatch.setattr(graphs, "_take_stream", lambda device: Stream.from_handle(0xCA97, 0))
    monkeypatch.setattr(graphs, "_capture_streams", {})
    return graphs, driver, allocator


def test_a_graph_holding_a_communicator_is_released_before_it_is_destroyed(fake_capture):
    """What captured work notes it holds (a NCCL communicator) is listed on its graph; releasing the graphs
    holding it destroys them at once (NCCL waits for them before destroying the communicator) and only them,
    and a released graph refuses to replay. Outside a capture, noting is a no-op."""
    from tilewise.backends.cuda.runtime.capturing import note_capture_holds

    graphs, driver, _ = fake_capture
    comm, other = object(), object()
    note_capture_holds(comm)  # no capture under way: nothing to note it on

    def body(stream: int) -> None:
        note_capture_holds(comm)
        note_capture_holds(comm)  # twice: listed once

    holding, plain = graphs.capture(body, 0), graphs.capture(lambda stream: None, 0)
    assert holding.holds == (comm,) and plain.holds == ()
    assert graphs.release_graphs_holding(other) == 0 and not holding.released
    driver.calls.clear()
    assert graphs.release_graphs_holding(comm) == 1
    assert holding.released and not plain.released
    assert driver.calls == ["synchronize", "destroy exec", "destroy graph"]
    assert graphs.release_graphs_holding(comm) == 0
    with pytest.raises(RuntimeError, match="was released .* cannot be replayed"):
        holding.replay(0)
    driver.calls.clear()
    del holding  # already destroyed: nothing destroyed twice
    assert driver.calls == []


def test_capture_runs_the_body_on_its_stream_with_its_allocations_in_the_graphs_pool(fake_capture):
    from tilewise.backends.cuda.runtime import current_stream
    from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing

    graphs, driver, allocator = fake_capture
    seen = {}

    def body(stream: int) -> None:
        seen["stream"], seen["current"] = stream, current_stream(0).handle
        seen["capturing"] = is_current_stream_capturing()
        seen["ptr"] = allocator.malloc(4096, stream)

    graph = graphs.capture(body, 0)
    assert seen == {"stream": 0xCA97, "current": 0xCA97, "capturing": True, "ptr": seen["ptr"]}
    assert not is_current_stream_capturing() and current_stream(0).handle == 0 and not allocator.routes
    assert driver.calls == ["begin", "end", "instantiate"]
    (segment,) = allocator.segments()
    assert segment.pool_id == graph.pool.id and segment.ptr <= seen["ptr"] < segment.ptr + segment.size
    del graph  # the graph goes: its pool is released, its memory returned once free
    assert driver.calls == ["begin", "end", "instantiate", "destroy exec", "destroy graph"]
    allocator.free(seen["ptr"])
    allocator.empty_cache()
    assert allocator.segments() == []


def test_a_capture_whose_body_raises_ends_cleanly_and_says_why(fake_capture):
    from tilewise.backends.cuda.runtime.capturing import StreamCaptureError, refuse_under_capture

    graphs, driver, allocator = fake_capture

    def body(stream: int) -> None:
        allocator.malloc(4096, stream)
        refuse_under_capture("reading device memory on the host")

    with pytest.raises(graphs.GraphCaptureError, match="StreamCaptureError: reading device memory") as err:
        graphs.capture(body, 0)
    assert isinstance(err.value.__cause__, StreamCaptureError)
    assert driver.calls == ["begin", "end", "destroy graph"]  # the stream left capture mode; the partial graph went
    assert not allocator.routes and allocator._released_pools  # the pool is released: freed once its block is


def test_a_capture_the_driver_invalidated_is_an_error_naming_the_status(fake_capture):
    graphs, driver, allocator = fake_capture
    driver.end_status = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
    with pytest.raises(graphs.GraphCaptureError, match="the driver invalidated the capture .*INVALIDATED"):
        graphs.capture(lambda stream: None, 0)
    assert driver.calls == ["begin", "end"] and not allocator.routes


# ---- choosing among cuBLASLt's candidates, with fake timings -------------------------------------------------


def test_choose_fastest_times_every_candidate_and_keeps_the_fastest(monkeypatch):
    """Each candidate is queued in every round and the one of least median time wins; tuning off, a single
    candidate, a GEMM too small to time, or a CUDA graph capture under way keep cuBLASLt's first choice."""
    from types import SimpleNamespace

    import tilewise.backends.cuda.kernels as kernels
    import tilewise.backends.cuda.runtime as runtime
    from tilewise.backends.cuda import matmul
    from tilewise.backends.cuda.runtime.capturing import capture_scope
    from tilewise.config import settings

    cost = {11: 3.0, 22: 1.0, 33: 2.0}  # ms a run of each fake algorithm takes
    clock = {"now": 0.0, "last": None}
    runs: list[int] = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self, stream):
            self.at = clock["now"]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    def run(algo):
        runs.append(algo)
        clock["now"] += cost[algo]

    monkeypatch.setattr(runtime, "Event", FakeEvent)
    monkeypatch.setattr(kernels, "spin", lambda cycles, device, stream: None)
    monkeypatch.setattr(runtime, "get_device_properties", lambda device: SimpleNamespace(clock_rate_khz=1_980_000))
    monkeypatch.setattr(matmul, "_clocks_up_until", 0.0)
    big = 1 << 30
    monkeypatch.setattr(settings, "gemm_tune", None)  # the default: timed only under max-autotune
    assert matmul.choose_fastest(0, "test", [11, 22, 33], big, run, 0) == 11 and runs == []
    from tilewise.backends.cuda.tuning import tuning

    with tuning():
        assert matmul.choose_fastest(0, "test", [11, 22, 33], big, run, 0) == 22
    runs.clear()
    monkeypatch.setattr(settings, "gemm_tune", True)
    assert matmul.choose_fastest(0, "test", [11, 22, 33], big, run, 0) == 22
    assert {11, 22, 33} <= set(runs) and runs.count(22) >= matmul._ROUNDS * matmul._RUNS_PER_ROUND
    runs.clear()
    assert matmul.choose_fastest(0, "test", [11, 22, 33], 16, run, 0) == 11  # too small to time
    assert matmul.choose_fastest(0, "test", [33], big, run, 0) == 33
    with capture_scope(0x1234):
        assert matmul.choose_fastest(0, "test", [11, 22, 33], big, run, 0) == 11
    monkeypatch.setattr(settings, "gemm_tune", False)
    assert matmul.choose_fastest(0, "test", [11, 22, 33], big, run, 0) == 11
    assert runs == []


def test_a_timed_gemm_choice_is_remembered_on_disk(monkeypatch, tmp_path):
    """A GEMM whose candidates were timed (max-autotune's first run) keeps the winner on disk: a later process,
    not timing, takes it; ``TILEWISE_GEMM_TUNE=0`` takes the first candidate whatever is remembered; another
    candidate list (another cuBLASLt) is not matched."""
    from types import SimpleNamespace

    import tilewise.backends.cuda.runtime as runtime
    from tilewise.backends.cuda import matmul
    from tilewise.backends.cuda.tuning import tuning
    from tilewise.codegen.toolchain.disk import DiskCache
    from tilewise.config import settings

    timed: list[list[int]] = []

    def fastest(device, label, algos, work, run, stream):
        timed.append(list(algos))
        return algos[2] if matmul.tuning_wanted() else algos[0]

    monkeypatch.setattr(matmul, "choose_fastest", fastest)
    monkeypatch.setattr(matmul, "_disk", [DiskCache(tmp_path / "cublaslt", "test")])
    monkeypatch.setattr(matmul, "_lt", lambda: SimpleNamespace(get_version=lambda: 130000))
    monkeypatch.setattr(runtime, "get_device_properties", lambda device: SimpleNamespace(name="NVIDIA H200"))
    monkeypatch.setattr(settings, "gemm_tune", None)
    key = (0, "bfloat16", 8192, 768, 3072)
    big = 1 << 36
    assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) == 11  # not timing: the first
    from tilewise.backends.cuda.runtime.capturing import capture_scope

    with tuning(), capture_scope(0x1234):  # nothing is timed under a capture: nothing remembered
        assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) in (11, 33)
    assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) == 11
    with tuning():
        assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) == 33
    timed.clear()
    assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) == 33 and timed == []  # remembered
    assert matmul._choose((1, *key[1:]), None, [11, 22, 33, 44], big, (0,) * 8) == 33  # the same GPU model
    assert matmul._choose(key, None, [11, 22, 33], big, (0,) * 8) == 11  # another candidate list
    monkeypatch.setattr(settings, "gemm_tune", False)
    assert matmul._choose(key, None, [11, 22, 33, 44], big, (0,) * 8) == 11


def test_a_gemm_planned_for_fewer_sms_has_its_own_plan_and_remembered_choice(monkeypatch):
    """The SMs a GEMM is planned for (a compiled program's GEMM beside a collective) are part of its plan's key and
    of its timed choice's name on disk; planned for every SM (0), the entry is named as before there was a
    target, so choices already on disk stay found."""
    import hashlib
    from types import SimpleNamespace

    import tilewise.backends.cuda.runtime as runtime
    from tilewise import dtypes
    from tilewise.backends.cuda import matmul

    monkeypatch.setattr(matmul, "_lt", lambda: SimpleNamespace(get_version=lambda: 130000))
    monkeypatch.setattr(runtime, "get_device_properties", lambda device: SimpleNamespace(name="NVIDIA H200"))
    a_op, b_op = matmul.Operand(0, 768, 8192, 768), matmul.Operand(1, 3072, 8192, 3072)
    geometry = (0, dtypes.bfloat16, a_op, b_op, 768, 3072, 8192, 1, (0, 0), "none", (256,) * 4)
    whole, carved = matmul.plan_key(*geometry), matmul.plan_key(*geometry, sm_count=108)
    assert whole != carved and whole[-1] == 0 and carved[-1] == 108 and whole[:-1] == carved[:-1]
    assert matmul.plan_key(*geometry, 108) == carved
    before = repr((whole[1:-1], "NVIDIA H200", 130000, 4, "gemm-choice-v1"))  # the name without a target
    assert matmul._entry_name(whole, 4) == hashlib.sha256(before.encode()).hexdigest()[:32] + ".json"
    assert matmul._entry_name(carved, 4) != matmul._entry_name(whole, 4)
    assert matmul._entry_name(matmul.plan_key(*geometry, 100), 4) != matmul._entry_name(carved, 4)


@pytest.mark.cuda
def test_a_gemm_planned_for_fewer_sms_gives_the_same_values():
    """cuBLASLt's SM count target changes how a GEMM is spread over the GPU, not what it computes."""
    import tilewise as tw
    from tilewise.backends.cuda import matmul
    from tilewise.backends.cuda.runtime import get_device_properties

    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    sms = get_device_properties(0).multi_processor_count
    tw.manual_seed(0)
    tw.backends.cuda.matmul.allow_tf32 = False  # float32 in full (another test may have left TF32 on)
    cases = (  # (products of 4096 terms are about 64 in size: split-K may sum partials in bfloat16)
        (tw.bfloat16, ((2048, 4096), (4096, 768)), 2e-2, 1.0), (tw.float32, ((256, 96), (96, 80)), 1e-5, 1e-5))
    for dtype, shapes, rtol, atol in cases:
        a, b = (tw.randn(*shape, device="cuda", dtype=dtype) for shape in shapes)
        expected = matmul.gemm(a, b)
        for target in (sms // 2, sms - 24):
            out = tw.empty(expected.shape, device="cuda", dtype=dtype)
            assert not matmul.gemm_into(out, a, b, sm_count=target)
            tw.testing.assert_close(out.float().cpu(), expected.float().cpu(), rtol=rtol, atol=atol)
        bias = tw.randn(shapes[1][1], device="cuda", dtype=dtype)
        out = tw.empty(expected.shape, device="cuda", dtype=dtype)
        assert not matmul.gemm_into(out, a, b, bias, "relu_bias", sm_count=sms - 24)
        tw.testing.assert_close(out.float().cpu(), (expected + bias).relu().float().cpu(), rtol=rtol,
                                atol=atol)
        assert any(key[-1] == sms - 24 for key in matmul._plans)


def test_device_bounds_errors_say_torchs_words_only_for_the_index_family():
    """A device-side bounds error of the index family says torch's "index out of range in self"; searchsorted's
    sorter, which torch words otherwise, does not."""
    import numpy as np

    from tilewise.backends.cuda.runtime import bounds

    def message(site: int) -> str:
        fields = np.zeros(5, np.int64)
        fields[[bounds.SITE, bounds.WHICH, bounds.VALUE, bounds.SIZE]] = site, 0, 9, 4
        return bounds.describe(fields)

    family = bounds.note_site("index_select()", (0,), (4,), False)
    sorter = bounds.note_site("searchsorted(): sorter", (0,), (4,), False, in_self=False)
    assert message(family).startswith("index_select(): index out of range in self: index 9 is out of bounds")
    assert message(sorter).startswith("searchsorted(): sorter: index 9 is out of bounds for dimension 0 with size "
                                      "4; valid indices are 0..3")


def test_a_repeated_steps_blocks_come_back_to_the_same_tensors(monkeypatch):
    """[Note: small-block fast path]: the free lists hand out a size's lowest address first, so a loop that takes
    and gives back the same sizes in the same order finds its memory where the last iteration's was (last in,
    first out, the order in which a backward frees what a forward made moved the blocks from step to step)."""
    from tilewise.backends.cuda import device_memory as dm

    memory, allocator, _ = fake_device_memory(monkeypatch, 97)

    def step() -> list[int]:
        activations = [dm.DeviceBuffer(8192, 97, 0) for _ in range(4)]  # a forward's, all of one size
        temporary = dm.DeviceBuffer(8192, 97, 0)
        addresses = [b.ptr for b in activations] + [temporary.ptr]
        del temporary
        grads = []
        while activations:  # a backward: each layer's gradient made, then its activation freed, last layer first
            grads.append(dm.DeviceBuffer(8192, 97, 0))
            addresses.append(grads[-1].ptr)
            activations.pop()
        del grads  # the optimizer's step, then zero_grad(set_to_none=True)
        return addresses

    first, second, *rest = [step() for _ in range(6)]
    assert all(addresses == second for addresses in rest)
    memory.release_free_lists()


def test_the_free_lists_go_back_to_the_allocator_before_it_reserves_more_memory(monkeypatch):
    """[Note: small-block fast path]: the lists hold any number of bytes, but a request that neither they nor the
    allocator's cache can serve first gives them back (merged), so they never make the reserved memory grow."""
    from tilewise.backends.cuda import device_memory as dm

    memory, allocator, backend = fake_device_memory(monkeypatch, 95)
    blocks = [dm.DeviceBuffer(4 << 20, 95, 0) for _ in range(8)]  # two 20 MiB segments of the allocator
    segments = len(backend.live)
    del blocks
    assert memory.cached == 32 << 20  # kept on the lists, each block a size of its own
    large = dm.DeviceBuffer(16 << 20, 95, 0)  # served by a segment of merged blocks: no new one
    assert memory.cached == 0 and len(backend.live) == segments
    del large
    memory.release_free_lists()
