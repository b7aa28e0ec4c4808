"""The profiler's device activity from CUPTI (``profiler/device_activity``), on the CPU through a fake ``cupti``
module that behaves as cupti-python's activity API does (per-thread external correlation stacks, records handed
to the completion callback at a flush): records become device rows hung on the range that launched them, with
times on the host timeline, torch's table columns and a Chrome trace with stream tracks and ac2g flows; the
fallback to CUDA events without cupti warns once. Marked ``cuda``: the same on a GPU with the real CUPTI."""

from __future__ import annotations

import enum
import json
import sys
import threading
import types
import warnings

import pytest

import tilewise as tw
import tilewise.profiler as twp
from tilewise.profiler import device_activity
from tilewise.profiler.chrome_trace import FlowIds, device_events
from tilewise.profiler.device_activity import (
    Activity,
    ActivityRecord,
    ApiCall,
    ClockPair,
    Launch,
    attach,
    copy_record,
    to_host_us,
)
from tilewise.profiler.events import DeviceKernel, FunctionEvent

ACTIVITIES = [twp.ProfilerActivity.CPU, twp.ProfilerActivity.CUDA]


class FakeCupti:
    """cupti-python's activity API, as far as the profiler uses it, with kernels "launched" by ``launch``."""

    class ActivityKind(enum.IntEnum):
        KERNEL = 3
        MEMCPY = 1
        MEMSET = 2
        DRIVER = 5
        RUNTIME = 6
        CONCURRENT_KERNEL = 10
        EXTERNAL_CORRELATION = 38

    class ExternalCorrelationKind(enum.IntEnum):
        CUSTOM0 = 4

    class CallbackDomain(enum.IntEnum):
        DRIVER_API = 1
        RUNTIME_API = 2

    NAMES = {(1, 307): "cuLaunchKernel", (2, 211): "cudaLaunchKernel_v7000", (2, 41): "cudaMemcpyAsync_v3020"}

    def __init__(self):
        self.enabled: set[int] = set()
        self.local = threading.local()
        self.pending: list = []
        self.callbacks = None
        self.registrations = 0
        self.clock = 5_000_000_000  # CUPTI's clock: far from the host's, and twice its rate
        self.next_correlation = 100

    def stack(self) -> list:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def activity_register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)
        self.registrations += 1

    def activity_enable(self, kind):
        self.enabled.add(int(kind))

    def activity_disable(self, kind):
        self.enabled.discard(int(kind))

    def activity_push_external_correlation_id(self, kind, external_id):
        assert kind == self.ExternalCorrelationKind.CUSTOM0
        self.stack().append(external_id)

    def activity_pop_external_correlation_id(self, kind):
        return self.stack().pop()

    def get_callback_name(self, domain, cbid):
        return self.NAMES[(int(domain), cbid)]

    def get_timestamp(self):
        return self.clock + 2 * (tw.profiler.recorder.now_ns())

    def launch(self, name, duration_ns=2000, stream=7, kind="kernel"):
        """An API call launching work: its record, and the external correlation of the range on top."""
        if self.ActivityKind.CONCURRENT_KERNEL not in self.enabled:
            return
        self.next_correlation += 1
        correlation = self.next_correlation
        call_start = self.get_timestamp()
        start = self.get_timestamp()
        common = dict(start=start, end=start + duration_ns, device_id=0, stream_id=stream,
                      correlation_id=correlation)
        if kind == "kernel":
            record = types.SimpleNamespace(kind=self.ActivityKind.CONCURRENT_KERNEL, name=name, grid_x=4, grid_y=1,
                                           grid_z=1, block_x=128, block_y=1, block_z=1, registers_per_thread=32,
                                           static_shared_memory=1024, dynamic_shared_memory=512, **common)
        else:
            record = types.SimpleNamespace(kind=self.ActivityKind.MEMCPY, copy_kind=1, src_kind=1, dst_kind=3,
                                           bytes=4096, **common)
        self.pending.append(record)
        if kind == "kernel" and self.ActivityKind.KERNEL in self.enabled:  # another profiler left KERNEL on
            self.pending.append(types.SimpleNamespace(**{**vars(record), "kind": self.ActivityKind.KERNEL}))
        if self.stack():
            self.pending.append(types.SimpleNamespace(kind=self.ActivityKind.EXTERNAL_CORRELATION,
                                                      correlation_id=correlation, external_id=self.stack()[-1],
                                                      external_kind=4))
        domain, cbid = (self.ActivityKind.DRIVER, 307) if kind == "kernel" else (self.ActivityKind.RUNTIME, 41)
        self.pending.append(types.SimpleNamespace(kind=domain, cbid=cbid, correlation_id=correlation,
                                                  start=call_start, end=self.get_timestamp(),
                                                  thread_id=threading.get_native_id()))

    def activity_flush_all(self, flag):
        records, self.pending = self.pending, []
        if records:
            self.callbacks[1](records)


@pytest.fixture
def fake_cupti(monkeypatch):
    fake = FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = fake
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setattr(device_activity, "_tracer", None)
    return fake


def test_records_hang_on_the_range_that_launched_them(fake_cupti):
    x = tw.ones(4)
    fake_cupti.launch("before_profiling")
    with twp.profile(activities=ACTIVITIES) as prof:
        with twp.record_function("outer"):
            x + x
            fake_cupti.launch("gemm_kernel", duration_ns=6000)
            with twp.record_function("inner"):
                fake_cupti.launch("copy", kind="memcpy")
                fake_cupti.launch("reduce_kernel")
        fake_cupti.launch("outside_any_range")
    events = prof.events()
    outer = next(e for e in events if e.name == "outer")
    inner = next(e for e in events if e.name == "inner")
    assert [k.name for k in outer.kernels] == ["gemm_kernel"]
    assert [k.name for k in inner.kernels] == ["Memcpy HtoD (Pageable -> Device)", "reduce_kernel"]
    gemm = outer.kernels[0]
    assert gemm.duration == pytest.approx(3.0, rel=0.05)  # 6000 CUPTI ns at twice the host's rate: 3 us
    assert outer.start_us <= gemm.start <= inner.start_us + 1  # on the host timeline, where it was launched
    assert (gemm.grid, gemm.block, gemm.registers, gemm.shared_memory, gemm.stream) == ((4, 1, 1), (128, 1, 1), 32,
                                                                                          1536, 7)
    assert outer.self_device_time_total == gemm.duration
    assert outer.device_time_total == pytest.approx(gemm.duration + inner.device_time_total)
    launches = [c for c in outer.cpu_children if c.kind == "cuda_driver"]
    assert [c.name for c in launches] == ["cuLaunchKernel"]  # the call that launched it, a host range inside
    assert outer.start_us <= launches[0].start_us <= gemm.launch_us + 1e-3 and launches[0].end_us <= outer.end_us
    assert [c.name for c in inner.cpu_children] == ["cudaMemcpyAsync", "cuLaunchKernel"]  # "_v3020" dropped
    device_rows = [e.name for e in events if e.device_type.name == "CUDA"]
    assert sorted(device_rows) == sorted(["gemm_kernel", "Memcpy HtoD (Pageable -> Device)", "reduce_kernel",
                                          "outside_any_range"])
    assert "before_profiling" not in device_rows  # CUPTI was not recording then
    assert fake_cupti.enabled == set() and fake_cupti.stack() == []  # stopped, every push popped


def test_a_kernel_kind_another_profiler_left_on_counts_no_kernel_twice(fake_cupti):
    """torch's profiler enables CUPTI's KERNEL records beside CONCURRENT_KERNEL and may leave them on: each kernel
    then comes twice, once of each kind; the recording takes the kind it enabled only."""
    fake_cupti.enabled.add(int(fake_cupti.ActivityKind.KERNEL))
    with twp.profile(activities=ACTIVITIES) as prof:
        with twp.record_function("outer"):
            fake_cupti.launch("gemm_kernel", duration_ns=6000)
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["gemm_kernel"]
    outer = next(e for e in prof.events() if e.name == "outer")
    assert [k.name for k in outer.kernels] == ["gemm_kernel"]


def test_compiled_programs_and_autograd_run_unchanged_under_cupti(fake_cupti):
    compiled = tw.compile(lambda a: (a * 2).exp().sum())
    a = tw.linspace(-1, 1, 6).reshape(2, 3)
    expected = compiled(a).item()
    w = tw.ones(3, requires_grad=True)
    with twp.profile(activities=ACTIVITIES) as prof:
        got = compiled(a).item()
        (a * w).sum().backward()
    assert got == expected and w.grad.tolist() == (a.sum(0)).tolist()
    assert fake_cupti.stack() == [] and prof.profiler.device_timing == "CUPTI"
    names = [e.name for e in prof.events()]
    assert any(n.startswith("CompiledProgram") for n in names) and "autograd::engine::evaluate_function: " \
        "SumBackward0" in names


def test_key_averages_lists_kernels_as_torch_does(fake_cupti):
    with twp.profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            with twp.record_function("step"):
                fake_cupti.launch("my_kernel", duration_ns=4000)
    averages = {a.key: a for a in prof.key_averages()}
    kernel = averages["my_kernel"]
    assert kernel.count == 3 and kernel.self_cuda_time_total == pytest.approx(6.0, rel=0.05)
    assert kernel.self_cpu_time_total == 0 and kernel.cpu_time_total == 0
    assert averages["step"].cuda_time_total == pytest.approx(kernel.self_cuda_time_total)
    table = prof.key_averages().table(sort_by="self_cuda_time_total")
    header = table.splitlines()[1].split("  ")
    assert [h.strip() for h in header if h.strip()][6:10] == ["Self CUDA", "Self CUDA %", "CUDA total",
                                                               "CUDA time avg"]
    rows = {row.split()[0]: row for row in table.splitlines()[3:5]}  # the largest self CUDA times first
    assert set(rows) == {"my_kernel", "step"}  # the range that launched it counts it as its own, as in torch
    assert rows["my_kernel"].split()[1:3] == ["0.00%", "0.000us"] and "100.00%" in rows["my_kernel"]
    assert table.splitlines()[-1].startswith("Self CUDA time total: ")


def test_chrome_trace_has_stream_tracks_and_flows(fake_cupti, tmp_path):
    with twp.profile(activities=ACTIVITIES) as prof:
        with twp.record_function("launcher"):
            fake_cupti.launch("k_a", stream=7)
            fake_cupti.launch("copy", kind="memcpy", stream=13)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    device = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy")]
    assert {(e["name"], e["cat"], e["tid"]) for e in device} == {
        ("k_a", "kernel", 7), ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 13)}
    kernel = next(e for e in device if e["name"] == "k_a")
    assert kernel["args"]["grid"] == [4, 1, 1] and kernel["args"]["registers per thread"] == 32
    launcher = next(e for e in events if e["ph"] == "X" and e["name"] == "launcher")
    assert kernel["args"]["External id"] == launcher["args"]["External id"]
    streams = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
               and e["pid"] == kernel["pid"]}
    assert streams == {7: "stream 7", 13: "stream 13"}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(finishes) == {e["args"]["correlation"] for e in device}
    calls = {e["args"]["correlation"]: e for e in events if e["ph"] == "X" and e["cat"] in ("cuda_driver",
                                                                                           "cuda_runtime")}
    assert {e["name"] for e in calls.values()} == {"cuLaunchKernel", "cudaMemcpyAsync"}
    for flow, start in starts.items():
        assert start["cat"] == "ac2g" and start["tid"] == launcher["tid"] and start["pid"] == launcher["pid"]
        assert start["ts"] == calls[flow]["ts"]  # the flow leaves from the launching call, as in torch's traces
        assert finishes[flow]["bp"] == "e" and finishes[flow]["pid"] == kernel["pid"]
    _check_nesting(events)


def test_kernels_of_one_launch_get_flows_of_their_own():
    launcher = FunctionEvent(3, "CompiledProgram (cuda)", 1, 0.0, 10.0)
    launcher.kernels = [DeviceKernel("k0", 0, 1.0, 2.0, correlation=55),  # a graph launch's kernels share its id
                        DeviceKernel("k1", 0, 1.0, 3.0, correlation=55), DeviceKernel("event_timed", 0, 1.0, 4.0)]
    events = device_events(launcher, 1, FlowIds())
    starts = [e["id"] for e in events if e["ph"] == "s"]
    assert starts[0] == 55 and len(set(starts)) == 3
    assert sorted(e["id"] for e in events if e["ph"] == "f") == sorted(starts)


def test_one_recording_at_a_time_owns_cupti(fake_cupti):
    with twp.profile(activities=ACTIVITIES):
        with twp.profile(activities=ACTIVITIES) as inner:  # CUPTI is taken: this one falls back to CUDA events
            assert inner.recorder.tracer is None and inner.recorder.times_with_events
    with twp.profile(activities=ACTIVITIES) as again:
        assert again.recorder.tracer is not None
    assert fake_cupti.registrations == 2  # at each start of a recording that owns it


def test_cupti_refusing_to_start_falls_back_to_events(fake_cupti, monkeypatch):
    def refuse(kind):
        if kind == FakeCupti.ActivityKind.DRIVER:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        fake_cupti.enabled.add(int(kind))

    monkeypatch.setattr(fake_cupti, "activity_enable", refuse)
    with pytest.warns(UserWarning, match="CUPTI could not start .*MULTIPLE_SUBSCRIBERS"):
        with twp.profile(activities=ACTIVITIES) as prof:
            pass
    assert prof.profiler.device_timing == "CUDA events" and fake_cupti.enabled == set()
    assert device_activity._tracer.owner is None


def test_cpu_only_profiles_leave_cupti_alone(fake_cupti):
    with twp.profile(activities=[twp.ProfilerActivity.CPU]) as prof:
        assert prof.recorder.tracer is None
    assert fake_cupti.callbacks is None


def test_without_cupti_the_fallback_warns_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti raises ImportError
    monkeypatch.setattr(device_activity, "_tracer", None)
    monkeypatch.setattr(device_activity, "_warned", False)
    with pytest.warns(UserWarning, match="cupti-python is not installed"):
        with twp.profile(activities=ACTIVITIES) as prof:
            tw.ones(2) + 1
    assert prof.profiler.tracer is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with twp.profile(activities=ACTIVITIES):
            pass


def _check_nesting(events):
    """On each track, ranges nest (as test_profiler's trace check has it)."""
    tracks: dict = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in tracks.values():
        open_ends: list = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 2e-3, e
            open_ends.append(e["ts"] + e["dur"])


# ---------------------------------------------------------------------------------------------- parsing

def test_clock_conversion_is_the_line_through_both_pairs():
    first, last = ClockPair(1_000_000, 0), ClockPair(3_000_000, 1_000_000)
    assert to_host_us(1_000_000, first, last) == 0
    assert to_host_us(2_000_000, first, last) == 500  # half-way in CUPTI's time: half-way on the host's
    assert to_host_us(5_000_000, first, last) == 2000
    assert to_host_us(7, ClockPair(7, 3000), ClockPair(7, 3000)) == 3  # no span: the offset alone


def test_attach_follows_correlation_to_event_ids():
    launcher = FunctionEvent(41, "aten::mm", 1, 0.0, 10.0)
    records = [ActivityRecord("kernel", "sgemm", 2000, 5000, 0, 7, 900),
               ActivityRecord("memset", "Device", 1000, 1500, 0, 7, 901, nbytes=64),
               ActivityRecord("kernel", "sgemm_tail", 5000, 5500, 0, 7, 900),
               ActivityRecord("kernel", "stray", 6000, 7000, 0, 7, 902)]
    calls = [ApiCall("runtime", 211, 900, 300, 800, 1), ApiCall("driver", 5, 903, 900, 950, 1)]
    activity = Activity(records, calls, {900: 41, 901: 41}, ClockPair(0, 0), ClockPair(10_000, 10_000))
    unclaimed, launches = attach(activity, {41: launcher}, lambda domain, cbid: f"{domain}{cbid}_v7000")
    assert [(k.name, k.start, k.duration, k.kind, k.launch_us) for k in launcher.kernels] == [
        ("Memset (Device)", 1.0, 0.5, "memset", None), ("sgemm", 2.0, 3.0, "kernel", 0.3),
        ("sgemm_tail", 5.0, 0.5, "kernel", 0.3)]  # one call launching two kernels: both flows leave from it
    assert [k.name for k in unclaimed] == ["stray"]
    assert launches == [Launch(launcher, "runtime211", 0.3, 0.8, 900)]  # the call of no recorded work is dropped


def test_copy_record_keeps_what_is_read_later():
    kinds = FakeCupti.ActivityKind
    kernel = types.SimpleNamespace(kind=kinds.CONCURRENT_KERNEL, name="k", start=1, end=2, device_id=1, stream_id=3,
                                   correlation_id=4, grid_x=1, grid_y=2, grid_z=3, block_x=4, block_y=5, block_z=6,
                                   registers_per_thread=40, static_shared_memory=10, dynamic_shared_memory=20)
    assert copy_record(kernel, kinds) == ActivityRecord("kernel", "k", 1, 2, 1, 3, 4, (1, 2, 3), (4, 5, 6), 40, 30)
    copy = types.SimpleNamespace(kind=kinds.MEMCPY, copy_kind=2, src_kind=3, dst_kind=2, start=1, end=2, device_id=0,
                                 stream_id=0, correlation_id=5, bytes=8)
    assert copy_record(copy, kinds).name == "DtoH/Device/Pinned"
    assert copy_record(types.SimpleNamespace(kind=kinds.DRIVER), kinds) is None


# ---------------------------------------------------------------------------------------------- on a GPU

def _needs_cupti():
    if not tw.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("cupti")


@pytest.mark.cuda
def test_real_kernel_names_of_a_matmul_and_a_compiled_program(tmp_path):
    _needs_cupti()
    x = tw.randn(256, 256, device="cuda")
    compiled = tw.compile(lambda x: (x * 2 + 1).relu().sum(1))
    compiled(x)
    tw.cuda.synchronize()
    with twp.profile(activities=ACTIVITIES) as prof:
        (x @ x).sum()
        compiled(x)
    events = prof.events()
    mm = next(e for e in events if e.name == "aten::mm")
    assert mm.kernels and all(k.correlation and k.duration > 0 for k in mm.kernels)
    assert mm.kernels[0].name != "aten::mm"  # the kernel's own name, not the operator's
    program = next(e for e in events if e.name.startswith("CompiledProgram"))
    launched = program.kernels + [k for e in events if e.cpu_parent is program for k in e.kernels]
    assert launched and all(mm.start_us <= k.start for k in launched)
    rows = {a.key for a in prof.key_averages() if a.self_cuda_time_total > 0}
    assert {k.name for k in mm.kernels} <= rows
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    document = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "M" and e["args"].get("name", "").startswith("stream ") for e in document["traceEvents"])


def _compiled_gpt_step():
    from tilewise.models import gpt

    tw.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64)).to("cuda")
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    x = tw.randint(0, 256, (4, 32), device="cuda")
    return tw.compile(step), x, x.roll(1, 1)


@pytest.mark.cuda
def test_a_profiled_compiled_training_step_gives_the_same_loss():
    _needs_cupti()
    step, x, y = _compiled_gpt_step()
    unprofiled = [float(step(x, y)) for _ in range(4)]
    step, x, y = _compiled_gpt_step()
    profiled = [float(step(x, y))]
    with twp.profile(activities=ACTIVITIES) as prof:
        profiled += [float(step(x, y)) for _ in range(3)]
    # the embedding's and attention's backward add with atomics (no deterministic form of either), so two runs of
    # one step may differ in the last bits, profiled or not
    assert profiled == pytest.approx(unprofiled, rel=1e-6)
    assert prof.profiler.device_timing == "CUPTI"
    assert any(e.device_type.name == "CUDA" and e.self_cuda_time_total > 0 for e in prof.events())


@pytest.mark.slow
def test_overhead_benchmark_runs_on_the_cpu(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "i"))
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "profiler_overhead.py"), "--quick", "--device",
                           "cpu"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| tilewise compiled (whole step) |" in done.stdout and "ratio" in done.stdout
    losses = done.stdout.split("losses ")[-1].split("; ")
    ours, theirs = (part.split(": ")[1].split() for part in losses)
    assert [float(v) for v in ours] == pytest.approx([float(v) for v in theirs], rel=1e-3)
