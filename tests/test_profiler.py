"""tilewise.profiler against torch.profiler: event names, nesting and self time, the table's columns and sort
keys, the schedule's actions, record_function, shapes, stacks, memory, compiled program steps, threads, the
Chrome trace's structure, and a Profiler key that costs nothing (is never called) while no profile records."""

from __future__ import annotations

import gzip
import json
import re
import threading
import warnings

import numpy as np
import pytest
import torch
import torch.profiler as tp

import tilewise as tw
import tilewise.profiler as twp
from tilewise import dispatch
from tilewise.compiler import program as compiled_programs


def _program(lib, x, y):
    a = x + y
    b = a * 2
    c = b.exp().sum()
    d = x.relu()
    e = x.t()
    f = x[0]
    g = x.reshape(16)
    h = lib.matmul(x, y)
    i = x.mean()
    j = lib.cat([x, y])
    return a, b, c, d, e, f, g, h, i, j


def _inputs():
    x = np.arange(16, dtype=np.float32).reshape(4, 4) / 7 - 1
    y = np.ones((4, 4), np.float32) * 0.5
    return (tw.tensor(x), tw.tensor(y)), (torch.tensor(x), torch.tensor(y))


def _profiled(lib, profiler, **options):
    (twx, twy), (tx, ty) = _inputs()
    x, y = (twx, twy) if lib is tw else (tx, ty)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU], **options) as prof:
            out = _program(lib, x, y)
    return prof, out


def _header(table: str) -> list[str]:
    return re.split(r"\s{2,}", table.splitlines()[1].strip())


# ---------------------------------------------------------------------------- names and nesting

def test_top_level_events_are_named_as_torch_names_them():
    ours, _ = _profiled(tw, twp)
    theirs, _ = _profiled(torch, tp)
    assert [e.name for e in ours.events() if e.cpu_parent is None] == \
        [e.name for e in theirs.events() if e.cpu_parent is None]


def test_a_composite_nests_its_primitives_and_self_time_excludes_them():
    prof, _ = _profiled(tw, twp)
    events = prof.events()
    matmul = next(e for e in events if e.name == "aten::matmul")
    assert [c.name for c in matmul.cpu_children] == ["aten::mm"]
    for e in events:
        assert e.self_cpu_time_total == pytest.approx(e.cpu_time_total - sum(c.cpu_time_total for c in e.cpu_children))
        assert e.self_cpu_time_total >= -1e-6
        for c in e.cpu_children:
            assert c.cpu_parent is e and c.thread == e.thread
            assert e.start_us <= c.start_us and c.end_us <= e.end_us
    top = sum(e.cpu_time_total for e in events if e.cpu_parent is None)
    assert sum(e.self_cpu_time_total for e in events) == pytest.approx(top)


def test_the_backward_runs_inside_torchs_engine_ranges():
    """Each autograd node's work is an ``autograd::engine::evaluate_function: <node>`` range holding ``<node>``,
    with the node's operators inside, and a leaf's accumulation is ``torch::autograd::AccumulateGrad``."""
    def ranges(lib, profiler):
        x = lib.ones(3, requires_grad=True)
        with profiler() as prof:
            (x * x.exp()).sum().backward()
        events = [e for e in prof.events() if "Backward" in e.name or "autograd" in e.name]
        return [(e.name, [c.name for c in e.cpu_children if "Backward" in c.name or "autograd" in c.name])
                for e in events], prof

    ours, prof = ranges(tw, twp.profile)
    assert ours == ranges(torch, tp.profile)[0]
    (mul,) = [e for e in prof.events() if e.name == "MulBackward0"]
    assert "aten::mul" in [c.name for c in mul.cpu_children]


def test_the_profiler_never_changes_results():
    prof, profiled = _profiled(tw, twp)
    (x, y), _ = _inputs()
    for a, b in zip(profiled, _program(tw, x, y)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_key_averages_count_calls_and_sum_times():
    (x, _), _ = _inputs()
    with twp.profile() as prof:
        for _ in range(3):
            x + x
    (add,) = [a for a in prof.key_averages() if a.key == "aten::add"]
    events = [e for e in prof.events() if e.name == "aten::add"]
    assert add.count == 3 == len(events)
    assert add.cpu_time_total == pytest.approx(sum(e.cpu_time_total for e in events))
    assert add.cpu_time == pytest.approx(add.cpu_time_total / 3)
    assert add.self_cpu_time_total == pytest.approx(sum(e.self_cpu_time_total for e in events))


def test_a_device_row_named_like_its_launcher_keeps_its_own_average():
    """Without CUPTI a device range is named after the host event that launched it; key_averages keeps the two
    apart (folded, the call count doubled and the footer's device total came out 0 with NaN shares)."""
    from tilewise.profiler.events import DeviceKernel, EventList, FunctionEvent
    from tilewise.profiler.recorder import kernel_event

    host = FunctionEvent(1, "CompiledProgram (cuda)", 1, 0.0, 900.0, use_device="cuda")
    host.kernels.append(DeviceKernel("CompiledProgram (cuda)", 0, 750.0, 10.0))
    events = EventList([host, kernel_event(host, host.kernels[0])], "cuda")
    rows = [a for a in events.key_averages() if a.key == "CompiledProgram (cuda)"]
    assert sorted((a.device_type.name, a.count) for a in rows) == [("CPU", 1), ("CUDA", 1)]
    footer = events.key_averages().table(row_limit=5).splitlines()[-1]
    assert footer == "Self CUDA time total: 750.000us" and "NaN" not in events.key_averages().table()


# ---------------------------------------------------------------------------- the table

@pytest.mark.parametrize("options", [{}, {"profile_memory": True}, {"record_shapes": True}])
def test_table_columns_and_footer_are_torchs(options):
    ours, _ = _profiled(tw, twp, **options)
    theirs, _ = _profiled(torch, tp, **options)
    group = options.get("record_shapes", False)
    mine = ours.key_averages(group_by_input_shape=group).table(sort_by="cpu_time_total", row_limit=5)
    torchs = theirs.key_averages(group_by_input_shape=group).table(sort_by="cpu_time_total", row_limit=5)
    assert _header(mine) == _header(torchs)
    assert mine.splitlines()[-1].startswith("Self CPU time total: ")
    assert len(mine.splitlines()) == len(torchs.splitlines())  # row_limit rows, between the same rules
    assert str(ours.key_averages()) == ours.key_averages().table()


SORT_KEYS = ["cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage", "cuda_memory_usage",
             "self_cpu_memory_usage", "self_cuda_memory_usage", "count", "self_cpu_time_total",
             "self_cuda_time_total", "device_time", "device_time_total", "self_device_time_total"]


@pytest.mark.parametrize("key", SORT_KEYS)
def test_torchs_sort_keys_sort_the_table(key):
    ours, _ = _profiled(tw, twp, profile_memory=True)
    theirs, _ = _profiled(torch, tp, profile_memory=True)
    theirs.key_averages().table(sort_by=key)  # the key is one torch accepts
    averages = ours.key_averages()
    table = averages.table(sort_by=key, row_limit=-1)
    attribute = key.replace("cuda", "device")
    names = [line[:line.index("  ", len(line) - len(line.lstrip()))].strip() for line in table.splitlines()[3:-2]]
    values = [getattr(next(a for a in averages if a.key == n), attribute) for n in names]
    assert values == sorted(values, reverse=True)


def test_an_unknown_sort_key_is_torchs_error():
    ours, _ = _profiled(tw, twp)
    theirs, _ = _profiled(torch, tp)
    with pytest.raises(AttributeError) as expected:
        theirs.key_averages().table(sort_by="bogus")
    with pytest.raises(AttributeError) as got:
        ours.key_averages().table(sort_by="bogus")
    assert str(got.value) == str(expected.value)


def test_row_limit_bounds_the_rows():
    ours, _ = _profiled(tw, twp)
    assert len(ours.key_averages().table(row_limit=2).splitlines()) == 3 + 2 + 2


# ---------------------------------------------------------------------------- schedule

SCHEDULES = [dict(wait=1, warmup=1, active=2), dict(wait=1, warmup=1, active=2, repeat=1, skip_first=1),
             dict(wait=0, warmup=2, active=1, repeat=3), dict(wait=2, warmup=1, active=3, skip_first=2,
                                                               skip_first_wait=1)]


@pytest.mark.parametrize("kwargs", SCHEDULES)
def test_schedule_actions_are_torchs(kwargs):
    ours, theirs = twp.schedule(**kwargs), tp.schedule(**kwargs)
    assert [ours(k).name for k in range(20)] == [theirs(k).name for k in range(20)]


@pytest.mark.parametrize("kwargs", [dict(wait=-1, warmup=1, active=1), dict(wait=0, warmup=1, active=0)])
def test_invalid_schedules_are_refused_as_torch_refuses_them(kwargs):
    with pytest.raises(AssertionError) as expected:
        tp.schedule(**kwargs)
    with pytest.raises(AssertionError) as got:
        twp.schedule(**kwargs)
    assert str(got.value) == str(expected.value)


def _cycles(lib, profiler):
    x = lib.ones(4)
    seen = []

    def ready(prof):
        seen.append((prof.step_num, sorted(e.name for e in prof.events() if e.name.startswith("ProfilerStep")),
                     sum(e.name == "aten::mul" for e in prof.events())))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = profiler.schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU], schedule=sched, on_trace_ready=ready) as p:
            for _ in range(12):
                x * 2
                p.step()
    return seen


def test_a_scheduled_profile_records_and_saves_the_cycles_torch_does():
    assert _cycles(tw, twp) == _cycles(torch, tp)


def test_profiler_steps_average_under_one_key_and_keep_their_number_in_the_trace(tmp_path):
    x = tw.ones(2)
    with twp.profile(schedule=twp.schedule(wait=0, warmup=1, active=3, repeat=1)) as p:
        for _ in range(5):
            x + 1
            p.step()
    (steps,) = [a for a in p.key_averages() if a.key == "ProfilerStep*"]
    assert steps.count == 3
    p.export_chrome_trace(str(tmp_path / "t.json"))
    names = [e["name"] for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert [n for n in names if n.startswith("ProfilerStep")] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


# ---------------------------------------------------------------------------- record_function, shapes, stack

def test_record_function_is_a_range_around_what_runs_inside():
    x = tw.ones(3)

    @twp.record_function("decorated")
    def inner():
        return x * 3

    with twp.profile() as prof:
        with twp.record_function("outer"):
            x + 1
            inner()
    outer = next(e for e in prof.events() if e.name == "outer")
    assert outer.is_user_annotation and outer.cpu_parent is None
    assert [c.name for c in outer.cpu_children] == ["aten::add", "decorated"]
    assert [c.name for c in outer.cpu_children[1].cpu_children] == ["aten::mul"]


def test_record_function_outside_a_profile_records_nothing():
    with twp.record_function("alone"):
        tw.ones(2) + 1
    with twp.profile() as prof:
        pass
    assert list(prof.events()) == []


def test_record_shapes_records_input_shapes_and_groups_by_them():
    ours, _ = _profiled(tw, twp, record_shapes=True)
    theirs, _ = _profiled(torch, tp, record_shapes=True)
    for name in ("aten::add", "aten::mul", "aten::matmul", "aten::cat", "aten::t", "aten::select", "aten::exp"):
        mine = next(e for e in ours.events() if e.name == name).input_shapes
        torchs = next(e for e in theirs.events() if e.name == name).input_shapes
        assert mine == torchs, name
    (x, _), _ = _inputs()
    with twp.profile(record_shapes=True) as prof:
        x + x
        x[:2] + x[:2]
    adds = [a for a in prof.key_averages(group_by_input_shape=True) if a.key == "aten::add"]
    assert sorted(str(a.input_shapes) for a in adds) == ["[[2, 4], [2, 4], []]", "[[4, 4], [4, 4], []]"]
    assert "Input Shapes" in _header(prof.key_averages(group_by_input_shape=True).table())


def test_with_stack_records_the_users_frames_outside_tilewise():
    x = tw.ones(2)
    with twp.profile(with_stack=True) as prof:
        x + x; line = __import__("inspect").currentframe().f_lineno  # noqa: E702
    (add,) = [e for e in prof.events() if e.name == "aten::add"]
    assert add.stack[0] == f"{__file__}({line}): test_with_stack_records_the_users_frames_outside_tilewise"
    assert not any("/tilewise/" in s and "/tests/" not in s for s in add.stack)
    assert "Source Location" in _header(prof.key_averages(group_by_stack_n=1).table())


def test_with_flops_counts_products_as_torch_does():
    a, b = np.ones((4, 5), np.float32), np.ones((5, 3), np.float32)
    with twp.profile(with_flops=True) as ours:
        tw.mm(tw.tensor(a), tw.tensor(b))
    with tp.profile(with_flops=True) as theirs:
        torch.mm(torch.tensor(a), torch.tensor(b))
    assert [e.flops for e in ours.events() if e.name == "aten::mm"] == \
        [e.flops for e in theirs.events() if e.name == "aten::mm"]


# ---------------------------------------------------------------------------- memory

def test_profile_memory_attributes_allocations_and_frees():
    x = tw.ones(4, 4)
    with twp.profile(profile_memory=True) as prof:
        with twp.record_function("block"):
            y = x + 1  # 64 bytes kept
            z = (x * 2).sum()  # the product is freed inside the block
        del z
    add = next(e for e in prof.events() if e.name == "aten::add")
    assert add.cpu_memory_usage == add.self_cpu_memory_usage == 64
    block = next(e for e in prof.events() if e.name == "block")
    assert block.cpu_memory_usage == 64 + 4  # the product came and went; y and the sum remain
    assert block.self_cpu_memory_usage == -64
    sizes = [r.nbytes for r in prof.profiler.memory]
    assert sizes.count(64) == 2 and -64 in sizes and -4 in sizes
    assert "CPU Mem" in _header(prof.key_averages().table())
    del y


def test_views_are_no_allocation():
    x = tw.ones(4, 4)
    with twp.profile(profile_memory=True) as prof:
        x.t()
        x[1:].expand(2, 3, 4)
        x.view(16)
    assert len(prof.events()) >= 4
    assert all(e.cpu_memory_usage == 0 for e in prof.events()) and not prof.profiler.memory


# ---------------------------------------------------------------------------- compiled programs

def test_a_compiled_call_shows_its_program_and_one_event_per_step():
    def f(x, y):
        return (x * y + 1).exp().sum(1), x @ y

    compiled = tw.compile(f)
    (x, y), _ = _inputs()
    expected = compiled(x, y)
    with twp.profile() as prof:
        got = compiled(x, y)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    programs = [e for e in prof.events() if e.name.startswith("CompiledProgram")]
    assert len(programs) == 1
    program = next(iter(compiled.variants)).forward if hasattr(compiled, "variants") else None
    steps = [c.name for c in programs[0].cpu_children]
    assert len(steps) == programs[0].args["steps"] >= 2
    kernels = [c for c in programs[0].cpu_children if c.kind == "program_step" and c.name.startswith("k")]
    assert len(kernels) == programs[0].args["kernels"] >= 1
    del program


def test_program_steps_are_put_back_after_a_profiled_run():
    compiled = tw.compile(lambda x: (x + 1) * 2)
    x = tw.ones(8)
    compiled(x)
    with twp.profile() as prof:
        compiled(x)
    (event,) = [e for e in prof.events() if e.name.startswith("CompiledProgram")]
    assert len(event.cpu_children) == event.args["steps"]
    np.testing.assert_array_equal(compiled(x).numpy(), np.full(8, 4, np.float32))


# ---------------------------------------------------------------------------- the hook's cost while off

def test_no_hook_runs_while_no_profile_records(monkeypatch):
    def refuse(*args):
        raise AssertionError("a profiler hook ran with no profile recording")

    compiled = tw.compile(lambda x: x * 3 + 1)
    with twp.profile():
        pass
    assert dispatch.profiling is False
    monkeypatch.setattr(dispatch, "profile_op", refuse)
    monkeypatch.setattr(compiled_programs, "profile_program", refuse)
    x = tw.ones(4)
    (x + x).sum()
    compiled(x)


def test_the_profiler_key_is_on_exactly_while_recording():
    x = tw.ones(2)
    p = twp.profile(schedule=twp.schedule(wait=1, warmup=1, active=1))
    p.start()
    assert dispatch.profiling is False  # waiting
    p.step()
    assert dispatch.profiling is False  # warming up
    p.step()
    assert dispatch.profiling is True
    x + 1
    p.stop()
    assert dispatch.profiling is False


def test_an_operator_that_raises_closes_its_event():
    x = tw.ones(2, 3)
    with twp.profile() as prof:
        with pytest.raises(RuntimeError):
            x @ x
        x + 1
    events = prof.events()
    assert [e.name for e in events if e.cpu_parent is None][-1] == "aten::add"
    assert all(e.end_us >= e.start_us for e in events)


# ---------------------------------------------------------------------------- threads

def test_events_of_another_thread_go_to_its_own_track():
    x = tw.ones(4)

    def work():
        for _ in range(3):
            tw.exp(x)

    with twp.profile() as prof:
        with twp.record_function("main"):
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
            x + x
    exps = [e for e in prof.events() if e.name == "aten::exp"]
    main = next(e for e in prof.events() if e.name == "main")
    assert len(exps) == 3 and all(e.cpu_parent is None and e.thread != main.thread for e in exps)
    assert [c.name for c in main.cpu_children] == ["aten::add"]


# ---------------------------------------------------------------------------- chrome trace

def _check_trace(path):
    document = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    events = document["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    for e in events:
        assert {"ph", "name", "pid"} <= e.keys()
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float))
    for e in complete:
        assert {"ts", "dur", "tid", "cat"} <= e.keys() and e["dur"] >= 0
    by_track: dict = {}
    for e in complete:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in by_track.values():  # on each track, ranges nest: a child lies inside every open parent
        open_ranges: list = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            while open_ranges and open_ranges[-1] <= e["ts"] + 1e-3:
                open_ranges.pop()
            end = e["ts"] + e["dur"]
            assert not open_ranges or end <= open_ranges[-1] + 2e-3, e
            open_ranges.append(end)
    return document, complete


def test_chrome_trace_holds_nested_host_ranges_per_thread_and_memory(tmp_path):
    x = tw.ones(4, 4)

    def work():
        tw.exp(x)

    with twp.profile(profile_memory=True, record_shapes=True) as prof:
        with twp.record_function("block"):
            tw.matmul(x, x)
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    document, complete = _check_trace(path)
    names = {e["name"] for e in complete}
    assert {"block", "aten::matmul", "aten::mm", "aten::exp"} <= names
    threads = {e["tid"] for e in complete}
    assert len(threads) == 2
    named_threads = {e["tid"] for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads <= named_threads
    memory = [e for e in document["traceEvents"] if e["name"] == "[memory]"]
    assert memory and all(e["ph"] == "i" and e["args"]["Bytes"] for e in memory)
    mm = next(e for e in complete if e["name"] == "aten::mm")
    assert mm["args"]["Input Dims"] == [[4, 4], [4, 4]]
    assert list(tmp_path.iterdir()) == [path]  # written through a temporary that is gone


def test_chrome_trace_replaces_an_existing_file_and_needs_a_recording(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("old")
    with twp.profile() as prof:
        tw.ones(2) + 1
    prof.export_chrome_trace(str(path))
    assert json.loads(path.read_text())["traceEvents"]
    with pytest.raises(RuntimeError, match="recorded nothing"):
        twp.profile().export_chrome_trace(str(path))


def test_tensorboard_trace_handler_writes_one_trace_per_saved_cycle(tmp_path):
    x = tw.ones(2)
    handler = twp.tensorboard_trace_handler(str(tmp_path), worker_name="w")
    with twp.profile(schedule=twp.schedule(wait=0, warmup=1, active=1, repeat=2), on_trace_ready=handler) as p:
        for _ in range(5):
            x + 1
            p.step()
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2 and all(f.name.startswith("w.") and f.name.endswith(".pt.trace.json") for f in files)
    for f in files:
        _check_trace(f)


def test_tensorboard_trace_handler_keeps_recordings_saved_within_one_millisecond(tmp_path, monkeypatch):
    # torch names the file with nanoseconds for this reason; a clock that stands still in milliseconds is the test
    import sys
    import types

    profile_module = sys.modules[twp.tensorboard_trace_handler.__module__]
    ticks = iter(range(1_000_000_000_000, 1_000_000_000_000 + 1000, 7))
    monkeypatch.setattr(profile_module, "time", types.SimpleNamespace(time_ns=lambda: next(ticks)))
    handler = twp.tensorboard_trace_handler(str(tmp_path), worker_name="w")
    with twp.profile(schedule=twp.schedule(wait=0, warmup=1, active=1, repeat=3), on_trace_ready=handler) as p:
        for _ in range(6):
            tw.ones(2) + 1
            p.step()
    assert len(list(tmp_path.iterdir())) == 3


def test_tensorboard_trace_handler_gzip_writes_what_torchs_would(tmp_path):
    handler = twp.tensorboard_trace_handler(str(tmp_path), worker_name="w", use_gzip=True)
    with twp.profile(on_trace_ready=handler):
        tw.ones(2) + 1
    (path,) = tmp_path.iterdir()
    assert path.name.endswith(".pt.trace.json.gz")
    _check_trace(path)
    prof = twp.profile()
    with prof:
        tw.ones(2) * 2
    prof.export_chrome_trace(str(tmp_path / "direct.json.gz"))
    _check_trace(tmp_path / "direct.json.gz")


# ---------------------------------------------------------------------------- CUDA

@pytest.mark.cuda
def test_cuda_activity_times_operators_on_the_device(tmp_path):
    x = tw.ones(256, 256, device="cuda")
    with twp.profile(activities=[twp.ProfilerActivity.CPU, twp.ProfilerActivity.CUDA]) as prof:
        y = (x @ x).relu()
    assert y.device.type == "cuda"
    mm = next(e for e in prof.events() if e.name == "aten::mm")
    assert mm.self_device_time_total > 0
    header = _header(prof.key_averages().table(sort_by="self_cuda_time_total"))
    assert header[6:10] == ["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"]
    assert prof.key_averages().table().splitlines()[-1].startswith("Self CUDA time total: ")
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    document, complete = _check_trace(path)
    kernels = [e for e in complete if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset") and "External id" in e["args"]]
    starts = {e["id"] for e in document["traceEvents"] if e["ph"] == "s"}
    finishes = {e["id"] for e in document["traceEvents"] if e["ph"] == "f"}
    assert kernels and starts == finishes and len(starts) == len(kernels)


@pytest.mark.cuda
def test_cuda_memory_columns_and_compiled_steps_on_the_device():
    x = tw.ones(64, 64, device="cuda")
    compiled = tw.compile(lambda x: (x * 2 + 1).sum(1))
    compiled(x)
    with twp.profile(activities=[twp.ProfilerActivity.CPU, twp.ProfilerActivity.CUDA], profile_memory=True) as prof:
        y = x + 1
        compiled(x)
    add = next(e for e in prof.events() if e.name == "aten::add")
    assert add.device_memory_usage == 64 * 64 * 4 and add.cpu_memory_usage == 0
    assert "CUDA Mem" in _header(prof.key_averages().table())
    assert any(e.name.startswith("CompiledProgram") for e in prof.events())
    del y


@pytest.mark.parametrize("module", ["tilewise.profiler.profile"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
