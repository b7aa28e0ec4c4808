"""The caching allocator's memory history (``tilewise.cuda.memory``) on the CPU, with the allocator's fake
backend: what is recorded, the snapshot's layout against the keys torch documents, torch's own memory_viz
tools reading it, the pickle and the timeline plot; and (marked ``cuda``) a snapshot of real allocations."""

from __future__ import annotations

import pickle
import re

import pytest
import torch.cuda._memory_viz as memory_viz
import torch.cuda.memory as torch_memory

from tests.test_cuda_runtime import FakeBackend, FakeEvents
from tilewise.backends.cuda.runtime import allocator as allocator_module
from tilewise.backends.cuda.runtime.allocator import CachingAllocator, OutOfMemoryError
from tilewise.backends.cuda.runtime.memory_history import MemoryHistory
from tilewise.cuda import memory
from tilewise.cuda.memory_timeline import stack_bands

MiB = 1 << 20


@pytest.fixture
def fake_device(monkeypatch):
    """A fake allocator standing in for cuda:0's, recording stopped again afterwards."""
    allocator = CachingAllocator(FakeBackend(), FakeEvents(), name="cuda:0")
    monkeypatch.setattr(allocator_module, "_device_allocators", {0: allocator})
    yield allocator
    memory._record_memory_history(enabled=None)


def documented_keys(name: str) -> set[str]:
    """The fields torch's ``_snapshot`` docstring lists for its TypedDict ``name``."""
    doc = torch_memory._snapshot.__doc__
    body = doc.split(f"class {name}(TypedDict):", 1)[1].split("class ", 1)[0].split("Args:", 1)[0]
    return set(re.findall(r"^\s+(\w+):", body, flags=re.MULTILINE))


def make_tensor_like(allocator, nbytes):  # a named frame, so the recorded stacks can be checked
    return allocator.malloc(nbytes)


def test_history_records_actions_in_order_with_frames(fake_device):
    memory._record_memory_history(enabled="all", context="all")
    ptr = make_tensor_like(fake_device, 1000)
    fake_device.free(ptr)
    fake_device.empty_cache()
    trace = memory._snapshot()["device_traces"][0]
    assert [e["action"] for e in trace] == ["segment_alloc", "alloc", "free_requested", "free_completed",
                                            "segment_free"]
    assert [e["size"] for e in trace] == [2 * MiB, 1000, 1000, 1000, 2 * MiB]
    assert trace[1]["addr"] == ptr and trace[0]["addr"] == trace[4]["addr"]
    assert trace[1]["frames"][0]["name"] == "make_tensor_like"
    assert all(e["frames"] for e in trace)  # context="all": frees carry frames too
    assert all(set(e) >= {"action", "addr", "size", "stream", "frames"} for e in trace)
    assert trace == sorted(trace, key=lambda e: e["time_us"])


def test_snapshot_layout_is_torchs_documented_one(fake_device):
    memory._record_memory_history()
    live = make_tensor_like(fake_device, 3000)
    freed = fake_device.malloc(512)
    fake_device.free(freed)
    snapshot = memory._snapshot()
    assert set(snapshot) >= documented_keys("Snapshot")
    (segment,) = snapshot["segments"]
    assert set(segment) >= documented_keys("Segment")
    assert segment["total_size"] == 2 * MiB and segment["segment_type"] == "small"
    for block in segment["blocks"]:
        assert set(block) >= documented_keys("Block")
    states = {b["address"]: b["state"] for b in segment["blocks"]}
    assert states[live] == "active_allocated"
    assert segment["allocated_size"] == segment["active_size"] == 3072
    live_block = next(b for b in segment["blocks"] if b["address"] == live)
    assert live_block["requested_size"] == 3000
    assert live_block["frames"][0]["name"] == "make_tensor_like"
    for frame in live_block["frames"]:
        assert set(frame) >= documented_keys("Frame") - {"fx_node_op", "fx_node_name", "fx_original_trace"}
    for entry in snapshot["device_traces"][0]:
        assert set(entry) >= documented_keys("TraceEntry") - {"device_free", "pool_id"}


def test_torchs_memory_viz_reads_the_snapshot(fake_device, tmp_path):
    memory._record_memory_history()
    a = make_tensor_like(fake_device, 5 * MiB)
    b = fake_device.malloc(100)
    fake_device.free(b)
    snapshot = memory._snapshot()
    text = memory_viz.trace(snapshot)
    assert "cudaMalloc" in text and "del " in text and "free completed" in text
    assert "20.0MiB allocated, 15.0MiB" in memory_viz.segsum(snapshot)  # 5 MiB in a 20 MiB segment
    lines = memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert f"seg_{a}" in lines and "active_allocated" in lines and "make_tensor_like" in lines
    assert "snapshot.pickle" in memory_viz.trace_plot(snapshot)
    path = tmp_path / "snap.pickle"
    memory._dump_snapshot(str(path))
    with open(path, "rb") as file:
        assert pickle.load(file) == memory._snapshot()


def test_cross_stream_free_completes_later(fake_device):
    memory._record_memory_history()
    ptr = fake_device.malloc(4096, stream=1)
    fake_device.record_stream(ptr, 2)
    fake_device.free(ptr)
    snapshot = memory._snapshot()
    assert [e["action"] for e in snapshot["device_traces"][0]][-1] == "free_requested"
    block = next(b for b in snapshot["segments"][0]["blocks"] if b["address"] == ptr)
    assert block["state"] == "active_awaiting_free"
    fake_device.event_factory.complete()
    fake_device.malloc(4096, stream=1)
    actions = [e["action"] for e in memory._snapshot()["device_traces"][0]]
    assert actions[-2:] == ["free_completed", "alloc"]


def test_the_backends_free_lists_are_bypassed_while_recording(fake_device, monkeypatch):
    from tilewise.backends.cuda import device_memory

    monkeypatch.setattr(device_memory, "_memories", {})
    buffer = device_memory.DeviceBuffer(1000, 0, 0)
    del buffer  # cached on the backend's free list: the allocator never hears of it
    assert device_memory._memories[0].cached == 1024
    memory._record_memory_history()
    mem = device_memory._memories[0]
    assert mem.cached == 0 and mem.cache_limit == -1
    assert memory._snapshot()["device_traces"][0] == []  # giving the cached block back is not a free
    buffer = device_memory.DeviceBuffer(1000, 0, 0)
    del buffer
    assert [e["action"] for e in memory._snapshot()["device_traces"][0]] == ["alloc", "free_requested",
                                                                              "free_completed"]
    memory._record_memory_history(enabled=None)
    assert mem.cache_limit == device_memory.SMALL_CACHE_LIMIT
    assert device_memory.DeviceMemory(0).cache_limit == device_memory.SMALL_CACHE_LIMIT


def test_contexts_decide_where_frames_are_kept(fake_device):
    for context, alloc_frames, free_frames, block_frames in (
            (None, False, False, False), ("state", False, False, True), ("alloc", True, False, True),
            ("all", True, True, True)):
        memory._record_memory_history(context=context, clear_history=True)
        ptr = fake_device.malloc(1000)
        kept = fake_device.malloc(2000)
        fake_device.free(ptr)
        snapshot = memory._snapshot()
        entries = {e["action"]: e for e in snapshot["device_traces"][0]}
        assert bool(entries["alloc"]["frames"]) is alloc_frames, context
        assert bool(entries["free_requested"]["frames"]) is free_frames, context
        block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == kept)
        assert bool(block["frames"]) is block_frames, context
        fake_device.free(kept)


def test_state_only_keeps_no_trace_and_max_entries_is_a_ring(fake_device):
    memory._record_memory_history(enabled="state")
    fake_device.free(fake_device.malloc(100))
    assert memory._snapshot()["device_traces"] == [[]]
    memory._record_memory_history(enabled="all", max_entries=3)
    ptrs = [fake_device.malloc(100 * (k + 1)) for k in range(5)]
    trace = memory._snapshot()["device_traces"][0]
    assert [e["size"] for e in trace] == [300, 400, 500]
    memory._record_memory_history(enabled="all", skip_actions=["alloc"], clear_history=True)
    for p in ptrs:
        fake_device.free(p)
    assert {e["action"] for e in memory._snapshot()["device_traces"][0]} == {"free_requested", "free_completed"}


def test_enabling_again_keeps_history_unless_cleared(fake_device):
    memory._record_memory_history()
    fake_device.malloc(100)
    memory._record_memory_history()
    fake_device.malloc(200)
    assert [e["size"] for e in memory._snapshot()["device_traces"][0] if e["action"] == "alloc"] == [100, 200]
    memory._record_memory_history(clear_history=True)
    assert memory._snapshot()["device_traces"][0] == []


def test_signatures_are_torchs():
    import inspect

    ours = inspect.signature(memory._record_memory_history).parameters
    theirs = inspect.signature(torch_memory._record_memory_history_impl).parameters
    assert list(ours) == list(theirs)
    assert all(ours[name].default == theirs[name].default for name in ours)
    for name in ("_snapshot", "_dump_snapshot"):
        assert list(inspect.signature(getattr(memory, name)).parameters) == list(
            inspect.signature(getattr(torch_memory, name)).parameters)


def test_out_of_memory_is_recorded():
    allocator = CachingAllocator(FakeBackend(capacity=4 * MiB), FakeEvents())
    allocator.history = MemoryHistory(0)
    with pytest.raises(OutOfMemoryError):
        allocator.malloc(64 * MiB)
    assert allocator.history.entries()[-1]["action"] == "oom"
    assert allocator.history.entries()[-1]["size"] == 64 * MiB


def test_disabled_history_costs_nothing_and_bad_arguments_raise(fake_device):
    memory._record_memory_history()
    assert fake_device.history is not None
    memory._record_memory_history(enabled=None)
    assert fake_device.history is None and allocator_module.history_settings is None
    assert memory._snapshot()["device_traces"] == [[]]
    memory._record_memory_history(True)  # torch's legacy bool spelling
    assert fake_device.history is not None
    for bad in ({"enabled": "some"}, {"context": "frames"}, {"stacks": "cpp"}, {"max_entries": 0},
                {"skip_actions": ["malloc"]}):
        with pytest.raises(ValueError, match="_record_memory_history"):
            memory._record_memory_history(**bad)


def test_allocators_made_later_record_too(monkeypatch):
    monkeypatch.setattr(allocator_module, "_device_allocators", {})
    memory._record_memory_history()
    try:
        assert allocator_module.history_settings is not None
        later = MemoryHistory(1, **allocator_module.history_settings)
        assert later.trace is not None
    finally:
        memory._record_memory_history(enabled=None)


# ---------------------------------------------------------------------------------------------- the plot

def test_stacked_bands_follow_live_bytes():
    trace = [{"action": "alloc", "addr": 1, "size": 10, "frames": []},
             {"action": "alloc", "addr": 2, "size": 20, "frames": []},
             {"action": "free_requested", "addr": 1, "size": 10, "frames": []},
             {"action": "free_requested", "addr": 3, "size": 5, "frames": []},  # made before recording began
             {"action": "alloc", "addr": 4, "size": 7, "frames": []}]
    bands, totals, end = stack_bands(trace)
    assert totals == [15, 35, 25, 20, 27] and end == 6
    by_addr = {b.addr: b for b in bands}
    assert by_addr[3].start == 0 and by_addr[3].end == 4
    assert by_addr[2].steps == [(2, 15), (3, 5), (4, 0)]  # dropped when the bands below it were freed
    assert by_addr[4].end == end


def test_long_traces_are_sampled_to_the_plot_width():
    trace = [{"action": "alloc", "addr": 0, "size": 100, "frames": []}]
    for k in range(1, 1000):  # a short-lived allocation per two actions, the first one live throughout
        trace += [{"action": "alloc", "addr": k, "size": 1, "frames": []},
                  {"action": "free_requested", "addr": k, "size": 1, "frames": []}]
    bands, totals, end = stack_bands(trace, columns=50)
    assert len(totals) == len(trace) and end == len(trace) + 1  # totals stay exact
    assert all(len(b.steps) <= 51 for b in bands) and len(bands[0].steps) == 1
    assert sum(1 for b in bands if b.steps) <= 51  # those living between two samples are not drawn


def test_plot_timeline_writes_bands_and_labels_the_largest(fake_device, tmp_path):
    memory._record_memory_history()
    ptrs = [make_tensor_like(fake_device, (k + 1) * 1024) for k in range(12)]
    for p in ptrs[::2]:
        fake_device.free(p)
    path = tmp_path / "timeline.html"
    memory.plot_timeline(memory._snapshot(), str(path))
    page = path.read_text()
    assert page.count('class="allocation"') == 12
    assert 'data-size="12288"' in page and "make_tensor_like" in page
    legend = page.split('<ul id="legend">')[1]
    assert legend.count("<li>") == 10 and legend.index("12.0 KiB") < legend.index("11.0 KiB")
    peak = max(stack_bands(memory._snapshot()["device_traces"][0])[1])
    assert f'id="peak">{peak / 1024:.1f} KiB' in page
    with pytest.raises(ValueError, match="no recorded actions for cuda:3"):
        memory.plot_timeline(memory._snapshot(), str(path), device=3)


# ---------------------------------------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_snapshot_of_real_allocations(tmp_path):
    import tilewise as tw

    if not tw.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    memory._record_memory_history(max_entries=100_000)
    try:
        a = tw.ones(1 << 20, device="cuda")
        b = tw.ones(3 << 20, device="cuda")
        del a
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert {4 << 20, 12 << 20} <= {e["size"] for e in allocs}
    assert any(e["action"] == "free_requested" and e["size"] == 4 << 20 for e in trace)
    assert any(f["name"] == "test_snapshot_of_real_allocations" for f in allocs[-1]["frames"])
    blocks = [blk for s in snapshot["segments"] for blk in s["blocks"] if blk["state"] == "active_allocated"]
    assert any(blk["address"] == b.data_ptr() for blk in blocks)
    memory.plot_timeline(snapshot, str(tmp_path / "t.html"))
    memory_viz.trace(snapshot)


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(memory, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_png_goes_through_matplotlib(fake_device, tmp_path, monkeypatch):
    """matplotlib is not a dependency of the CPU tests: a stand-in for pyplot checks what the plot asks of it."""
    import sys
    import types

    drawn = []

    class Axes:
        def fill(self, xs, ys, **kwargs):
            drawn.append((len(xs), kwargs.get("label")))

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    class Figure:
        def tight_layout(self):
            pass

        def savefig(self, path):
            open(path, "wb").write(b"\x89PNG")

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **kwargs: (Figure(), Axes())
    pyplot.close = lambda figure: None
    package = types.ModuleType("matplotlib")
    package.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", package)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    memory._record_memory_history()
    for k in range(3):
        make_tensor_like(fake_device, (k + 1) * 1024)
    memory.plot_timeline(memory._snapshot(), str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes() == b"\x89PNG"
    assert [label.split(" (")[0] for _, label in drawn] == [
        "1.0 KiB: make_tensor_like", "2.0 KiB: make_tensor_like", "3.0 KiB: make_tensor_like"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match="needs matplotlib"):
        memory.plot_timeline(memory._snapshot(), str(tmp_path / "u.png"))
