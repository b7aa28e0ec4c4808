"""What makes a first compile quick without changing what it makes ([Note: parallel compiles]): kernels compiled on
a pool of threads give the same bytes as compiled one after another (``TILEWISE_COMPILE_THREADS=1``), the kernel
cache stays whole with threads and processes compiling the same kernels at once, kernels that differ only in their
name are rendered once, and fusion's kept dependency closures are the ones a fresh walk finds."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from childenv import python_path, run_together

import tilewise as tw
from tilewise.codegen.render.kernel_cuda import render_program
from tilewise.codegen.toolchain import nvrtc_available
from tilewise.codegen.toolchain import pool as compile_pool
from tilewise.codegen.toolchain.cache import KernelCache
from tilewise.codegen.toolchain.disk import unseal
from tilewise.compiler.capture import trace
from tilewise.compiler.lowering import fusion
from tilewise.compiler.passes import run_pipeline
from tilewise.compiler.program import Lowered, aliased_kernels, lower_program
from tilewise.compiler.targets import CUDA_TARGET, get_target
from tilewise.config import settings

ROOT = Path(__file__).resolve().parent.parent
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")


class Block(tw.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = tw.nn.LayerNorm(width)
        self.up = tw.nn.Linear(width, 2 * width)
        self.down = tw.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(tw.nn.functional.gelu(self.up(self.norm(x))))


def _training_step_for_cuda(layers: int = 3, width: int = 32) -> Lowered:
    """A residual MLP's training step (forward, backward, AdamW) lowered for the CUDA target: each layer makes the
    same kernels, and the update has nests of several shapes."""
    tw.manual_seed(0)
    model = tw.nn.Sequential(*(Block(width) for _ in range(layers)))
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    _, (low,), _ = tw.compile(step).lowered(get_target("cuda"), tw.randn(8, width))
    return low


@pytest.fixture(scope="module")
def step_low() -> Lowered:
    return _training_step_for_cuda()


@pytest.fixture
def threads(monkeypatch):
    def set_threads(n: int) -> None:
        monkeypatch.setattr(settings, "compile_threads", n)
    return set_threads


# ---------------------------------------------------------------------------- rendering and fusion

def test_kernels_of_equal_schedules_render_once_to_the_same_text(step_low):
    aliased = aliased_kernels(step_low.kernels, step_low.plan)
    one_by_one = {}
    for sched in step_low.schedules:
        one_by_one.update(render_program([sched], aliased))
    assert step_low.sources == one_by_one
    texts = {text.replace(name, "NAME") for name, text in one_by_one.items()}
    assert len(texts) < len(one_by_one), "the layers' kernels share texts"


def test_alike_nests_of_a_kernel_share_one_rendering_of_their_body(step_low, monkeypatch):
    """The optimizer kernel's nests of equal generic keys render their body once; each rendered on its own, every
    kernel's text is the same."""
    from tilewise.codegen.render import kernel_cuda

    aliased = aliased_kernels(step_low.kernels, step_low.plan)
    rendered = []
    template = kernel_cuda._template
    monkeypatch.setattr(kernel_cuda, "_template", lambda *args: rendered.append(args[2]) or template(*args))
    shared, renders = render_program(step_low.schedules, aliased), len(rendered)
    key = kernel_cuda._generic_key  # every nest a key of its own
    monkeypatch.setattr(kernel_cuda, "_generic_key", lambda kernel, ns, shared: ((id(ns),), key(kernel, ns, shared)[1]))
    rendered.clear()
    assert render_program(step_low.schedules, aliased) == shared == step_low.sources
    assert renders < len(rendered)


def test_each_kernel_is_handed_to_its_compile_as_rendered_largest_first():
    class Started:
        def __init__(self):
            self.units: list[tuple[str, str]] = []

        def start(self, name: str, text: str) -> None:
            self.units.append((name, text))

    def fn(x, y):
        return (x.softmax(-1) * y).sum(0), (x.exp() + 1).relu(), (x * y).mean(-1)

    started = Started()
    graph = run_pipeline(trace(fn, (tw.randn(64, 32), tw.randn(64, 32)), {}).graph, CUDA_TARGET.passes)
    low = lower_program(graph, CUDA_TARGET, compiling=started)
    assert len(started.units) == len(low.sources) >= 2 and dict(started.units) == low.sources
    statements = {k.name: k.statements() for k in low.kernels.values()}
    sizes = [statements[name] for name, _ in started.units]
    assert sizes == sorted(sizes, reverse=True)
    assert list(low.sources) == [s.kernel.name for s in low.schedules]  # the program's order is kept


def test_kept_dependency_closures_are_the_ones_a_fresh_walk_finds(monkeypatch):
    asked = []
    kept = fusion._Partition.deps_closure

    def checked(self, gid):
        found = kept(self, gid)
        assert found == self._walked_closure(gid), gid
        asked.append(gid)
        return found

    monkeypatch.setattr(fusion._Partition, "deps_closure", checked)
    _training_step_for_cuda(layers=2, width=16)
    assert len(asked) > 20


def test_decompositions_made_over_other_operands_are_the_ones_a_trace_makes(monkeypatch):
    """[Note: decompositions made once]: each layer's composites after the first are rebuilt from the first's
    decomposition, into the very nodes a trace of their own gives."""
    import sys

    from tilewise.compiler.capture import trace_decomposition

    decompose = sys.modules["tilewise.compiler.passes.decompose"]  # (the package exports the pass by that name)
    made, traced = decompose._decomposition, []

    def checked(node, keep, kinds):
        results = made(node, keep, kinds)
        assert results == trace_decomposition(node, keep), node
        traced.append(len(kinds))
        return results

    monkeypatch.setattr(decompose, "_decomposition", checked)
    _training_step_for_cuda(layers=3, width=16)
    assert len(traced) > 2 * traced[-1], "most composites are made, not traced"


def _two_norms(first, second):
    return first.square().sum().sqrt(), second.square().sum().sqrt()


def _nest_heads(text: str) -> list[str]:
    return re.findall(r"/\* nests? [^*]*\*/", text)


@needs_nvrtc
def test_the_same_nests_met_in_either_order_make_one_kernel_text():
    """Two independent whole-tensor reductions share a kernel as two nests ([Note: nest order]): met in either order
    (a last layer's gradient norms before its other kernels' work) they make one text, the larger nest first, and
    that text compiles."""
    from tilewise.compiler.program_cuda import shared_name

    small, large = tw.randn(48), tw.randn(64, 96)
    texts = []
    for args in ((small, large), (large, small)):
        _, (low,), _ = tw.compile(_two_norms).lowered(get_target("cuda"), *args)
        (name, text), = {shared_name(n, t) for n, t in low.sources.items()}
        texts.append(text)
    assert texts[0] == texts[1]
    assert len(_nest_heads(texts[0])) == 2
    assert "6144" in texts[0].split("nest 1:")[0] and "(int)48" in texts[0].split("nest 1:")[1]
    KernelCache(use_disk=False).compile(texts[0], name, "sm_90")


def test_nests_in_size_order_give_the_same_values_and_torchs_on_the_cpu():
    """Each nest's value is its own whatever its place in the kernel: on the C target the norms met in either order
    are the same bits, and torch's values."""
    import torch

    small, large = tw.randn(48), tw.randn(64, 96)
    ahead = [t.item() for t in tw.compile(_two_norms)(small, large)]
    behind = [t.item() for t in tw.compile(_two_norms)(large, small)]
    assert ahead == behind[::-1]
    expected = [t.item() for t in _two_norms(torch.from_numpy(small.numpy()), torch.from_numpy(large.numpy()))]
    assert all(math.isclose(got, want, rel_tol=1e-6) for got, want in zip(ahead, expected))


# ---------------------------------------------------------------------------- the pool

def test_compile_threads_come_from_the_setting_or_the_cpus(threads):
    threads(3)
    assert compile_pool.compile_threads() == 3
    threads(0)
    assert 1 <= compile_pool.compile_threads() <= compile_pool.MAX_THREADS


@needs_nvrtc
def test_one_thread_compiles_in_the_callers_thread_in_order(threads):
    threads(1)
    seen = []
    cache = KernelCache(use_disk=False)
    original = cache.compile

    def compile_in(source, name, arch):
        seen.append((name, threading.current_thread()))
        return original(source, name, arch)

    cache.compile = compile_in
    units = [(f"k{n}", f'extern "C" __global__ void k{n}(float* o) {{ o[0] = {n}.f; }}') for n in range(3)]
    assert [k.names for k in compile_pool.compile_all(units, "sm_90", cache)] == [("k0",), ("k1",), ("k2",)]
    assert [name for name, _ in seen] == ["k0", "k1", "k2"]
    assert all(thread is threading.current_thread() for _, thread in seen)


@needs_nvrtc
def test_parallel_and_serial_compiles_give_the_same_bytes(step_low, threads):
    from tilewise.compiler.program_cuda import shared_name

    units = list(dict.fromkeys(shared_name(name, text) for name, text in step_low.sources.items()))
    assert len(units) >= 4
    threads(1)
    serial = compile_pool.compile_all(units, "sm_90", KernelCache(use_disk=False))
    threads(4)
    parallel = compile_pool.compile_all(units, "sm_90", KernelCache(use_disk=False))
    for (name, _), a, b in zip(units, serial, parallel):
        assert a.names == b.names == (name,)
        assert a.ptx == b.ptx and a.cubin == b.cubin, name


@needs_nvrtc
@pytest.mark.parametrize("count", [1, 2, 64])
def test_a_programs_kernels_load_once_per_unit_from_the_compiles_noted_as_rendered(step_low, threads, count,
                                                                                  monkeypatch, tmp_path):
    """``build_cuda_program``'s compile path without a GPU: the device's arch and the module loads stand in. With
    more texts than compile threads, they compile together in one unit per thread (see [Note: kernels compiled
    together]), each unit loaded once; a text the kernel cache holds compiles alone."""
    import tilewise.backends.cuda.runtime.module as module
    import tilewise.compiler.program_cuda as program_cuda

    threads(count)
    loads = []

    def load_module(cubin, device):
        loads.append(cubin)
        return SimpleNamespace(get_function=lambda name: SimpleNamespace(name=name, cubin=cubin))

    monkeypatch.setattr(program_cuda, "get_device_properties", lambda index: SimpleNamespace(arch="sm_90"))
    monkeypatch.setattr(module, "load_module", load_module)
    device = SimpleNamespace(index=0)
    compiles = program_cuda.KernelCompiles(device)
    compiles.cache = KernelCache(tmp_path / "kernels")
    texts = list(dict.fromkeys(program_cuda.shared_name(name, text) for name, text in step_low.sources.items()))
    held = texts[1]
    compiles.cache.compile(held[1], held[0], "sm_90")  # compiled before: served alone
    for name, text in step_low.sources.items():  # as lower_program's render hands them over
        compiles.start(name, text)
    assert not compiles.started and list(compiles.noted) == texts
    functions = program_cuda.compile_kernels(step_low.sources, device, compiles)
    started = compiles.started
    assert set(started) == set(texts) and not compiles.noted
    units = {id(future): future for future in started.values()}
    if count == 1 or count >= len(texts):
        assert len(units) == len(texts) and not compiles.together
    else:
        assert len(units) == count + 1 < len(texts)  # one unit per thread, and the text the cache held
        assert not compiles.together.get(held) and len(compiles.together) == len(texts) - 1
    assert len(loads) == len(units) < len(step_low.sources)
    assert {(f.name, f.source) for f in functions.values()} == set(texts)
    for name, text in step_low.sources.items():
        assert functions[name].source == program_cuda.shared_name(name, text)[1]
        assert f".entry {functions[name].name}" in started[(functions[name].name, functions[name].source)].result().ptx
        assert functions[name].cubin == started[(functions[name].name, functions[name].source)].result().cubin


@needs_nvrtc
def test_a_unit_that_fails_to_compile_is_compiled_text_by_text_and_the_error_is_the_kernels_own(threads,
                                                                                                   monkeypatch):
    """One text that NVRTC refuses makes its unit fail: each of the unit's kernels is then compiled alone, the
    good ones load and the bad one raises its own compile error."""
    import tilewise.backends.cuda.runtime.module as module
    import tilewise.compiler.program_cuda as program_cuda
    from tilewise.codegen.toolchain.nvrtc import KernelCompileError

    threads(2)
    monkeypatch.setattr(program_cuda, "get_device_properties", lambda index: SimpleNamespace(arch="sm_90"))
    monkeypatch.setattr(module, "load_module", lambda cubin, device: SimpleNamespace(
        get_function=lambda name: SimpleNamespace(name=name)))
    good = {f"k{k}_fill": f'extern "C" __global__ void k{k}_fill(float* o) {{ o[{k}] = {k}.0f; }}' for k in range(4)}
    bad = {"k9_broken": 'extern "C" __global__ void k9_broken(float* o) { o[0] = undeclared; }'}
    pending = program_cuda.PendingFunctions(list({**good, **bad}.items()), SimpleNamespace(index=0),
                                            _uncached_compiles(program_cuda))
    assert any(pending.compiles.together.values())
    for k in range(len(good)):
        assert pending.function(k).name == pending.keys[k][0]
    with pytest.raises(KernelCompileError, match="undeclared"):
        pending.function(len(good))
    again = program_cuda.PendingFunctions(list({**good, **bad}.items()), SimpleNamespace(index=0),
                                          _uncached_compiles(program_cuda))
    with pytest.raises(KernelCompileError, match="kernel 'broken_") as raised:
        again.all()
    assert "fill_" not in str(raised.value), "the error is the broken kernel's alone"


def _uncached_compiles(program_cuda):
    compiles = program_cuda.KernelCompiles(SimpleNamespace(index=0))
    compiles.cache = KernelCache(use_disk=False)
    return compiles


@needs_nvrtc
def test_a_compile_error_comes_out_of_the_pool(threads):
    threads(2)
    units = [("good", 'extern "C" __global__ void good(float* o) { o[0] = 1.f; }'),
             ("bad", 'extern "C" __global__ void bad(float* o) { o[0] = nothing; }')]
    with pytest.raises(Exception, match="bad"):
        compile_pool.compile_all(units, "sm_90", KernelCache(use_disk=False))


# ---------------------------------------------------------------------------- the kernel cache under concurrency

KERNELS = [(f"k{n}", f'extern "C" __global__ void k{n}(float* o) {{ o[threadIdx.x] = {n}.f; }}') for n in range(4)]


@needs_nvrtc
def test_threads_asking_for_the_same_kernels_at_once_compile_each_once(tmp_path):
    cache = KernelCache(tmp_path)
    cache.toolchain()
    start = threading.Barrier(6)
    results: list[list[bytes]] = []

    def ask():
        start.wait()
        results.append([cache.compile(source, name, "sm_90").cubin for name, source in KERNELS])

    workers = [threading.Thread(target=ask) for _ in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(results) == 6 and all(r == results[0] for r in results)
    assert cache.stats.compiles == len(KERNELS)
    entries = list(tmp_path.rglob("*.kernel"))
    assert len(entries) == len(KERNELS) and all(unseal(e.read_bytes()) is not None for e in entries)


TWO_PROCESSES = textwrap.dedent("""
    import json, os, time
    from pathlib import Path
    from tilewise.codegen.toolchain.cache import KernelCache
    from tilewise.codegen.toolchain.pool import compile_all
    go = Path(os.environ["GO_FILE"])
    while not go.exists():
        time.sleep(0.001)
    units = [("k%d" % n, 'extern "C" __global__ void k%d(float* o) { o[threadIdx.x] = %d.f; }' % (n, n))
             for n in range(8)]
    cache = KernelCache(os.environ["TILEWISE_CACHE_DIR"])
    kernels = compile_all(units, "sm_90", cache)
    again = KernelCache(os.environ["TILEWISE_CACHE_DIR"])
    same = [k.cubin for k in compile_all(units, "sm_90", again)] == [k.cubin for k in kernels]
    print(json.dumps({"same": same, "damaged": cache.stats.corrupt_entries + again.stats.corrupt_entries,
                      "reread": again.stats.disk_hits}))
""")


@needs_nvrtc
def test_two_processes_compiling_the_same_kernels_at_once_both_succeed(tmp_path):
    go, cache_dir = tmp_path / "go", tmp_path / "cache"
    environment = {**os.environ, "TILEWISE_CACHE_DIR": str(cache_dir), "PYTHONPATH": python_path(),
                   "GO_FILE": str(go), "TILEWISE_COMPILE_THREADS": "4"}
    finished = run_together(TWO_PROCESSES, [environment, environment], go, cwd=ROOT)
    for returncode, stdout, stderr in finished:
        assert returncode == 0, stderr[-3000:]
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out == {"same": True, "damaged": 0, "reread": 8}
    entries = list(cache_dir.rglob("*.kernel"))
    assert len(entries) == 8 and all(unseal(e.read_bytes()) is not None for e in entries)
    assert not [p for p in cache_dir.rglob("*") if p.name.endswith(".tmp")]


FORKED = textwrap.dedent("""
    import os, signal, sys
    from tilewise.codegen.toolchain.cache import KernelCache
    from tilewise.codegen.toolchain.pool import compile_all
    units = [("k%d" % n, 'extern "C" __global__ void k%d(float* o) { o[0] = %d.f; }' % (n, n)) for n in range(3)]
    compile_all(units, "sm_90", KernelCache(use_disk=False))  # the parent's pool exists
    child = os.fork()
    if child == 0:
        signal.alarm(60)  # a child whose pool never runs its work ends instead of hanging on
        kernels = compile_all(units[::-1], "sm_90", KernelCache(use_disk=False))
        os._exit(0 if [k.names[0] for k in kernels] == ["k2", "k1", "k0"] else 3)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


@needs_nvrtc
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_compiles_on_a_pool_of_its_own():
    environment = {**os.environ, "PYTHONPATH": python_path(), "TILEWISE_COMPILE_THREADS": "2"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", FORKED], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


# ---------------------------------------------------------------------------- on a GPU

def _gpu_step(model, optimizer):
    """The residual MLP's training step, compiled."""
    @tw.compile
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def _three_gpu_steps() -> tuple[list[float], dict[str, str], object]:
    tw.manual_seed(0)
    model = tw.nn.Sequential(*(Block(64) for _ in range(3))).to("cuda")
    step = _gpu_step(model, tw.optim.AdamW(model.parameters(), lr=1e-3))
    x = tw.randn(16, 64).to("cuda")
    losses = [step(x).item() for _ in range(3)]
    (program,) = step.programs()
    return losses, program.sources, model[0].up.weight.detach().cpu().numpy()


@pytest.mark.cuda
def test_a_training_step_on_the_gpu_built_serially_or_on_the_pool_is_the_same(tmp_path, threads, monkeypatch):
    """The whole path on a device: kernels started as rendered, waited for and loaded as each is done (on the pool)
    or compiled one after another (``TILEWISE_COMPILE_THREADS=1``), each from an empty kernel cache."""
    import tilewise.codegen.toolchain.cache as cache_module

    runs = []
    for count in (1, 4):
        threads(count)
        monkeypatch.setattr(cache_module, "_default_cache", KernelCache(tmp_path / f"cache{count}"))
        runs.append(_three_gpu_steps())
        assert cache_module.default_cache().stats.compiles > 0
    (serial_losses, serial_sources, serial_weight), (pool_losses, pool_sources, pool_weight) = runs
    assert serial_sources == pool_sources
    assert pool_losses == pytest.approx(serial_losses, rel=1e-6, abs=1e-7)
    assert abs(pool_weight - serial_weight).max() <= 1e-6


@pytest.mark.cuda
def test_the_first_run_waits_for_each_kernel_as_it_comes_up_and_for_all_before_it_writes_much_of_an_input(
        tmp_path, monkeypatch):
    """[Note: the first run overlaps the compiles]: library calls and the kernels already compiled run while later
    kernels compile; every compile is waited for before a step would write more of the inputs' memory than the
    first run copies aside (here AdamW's update of the parameters, past the step counts)."""
    import tilewise.codegen.toolchain.cache as cache_module
    import tilewise.compiler.program_cuda as program_cuda

    monkeypatch.setattr(cache_module, "_default_cache", KernelCache(tmp_path / "cache"))
    monkeypatch.setattr(program_cuda, "SNAPSHOT_BYTES", 4096)
    events: list = []
    for cls in (program_cuda.CudaKernelStep, program_cuda.CudaExternStep, program_cuda.CudaCopyStep):
        def run(self, pointers, stream, original=cls.run):
            events.append(self)
            return original(self, pointers, stream)
        monkeypatch.setattr(cls, "run", run)
    original_all = program_cuda.PendingFunctions.all

    def all_loaded(self):
        events.append("all")
        return original_all(self)
    monkeypatch.setattr(program_cuda.PendingFunctions, "all", all_loaded)

    tw.manual_seed(0)
    model = tw.nn.Sequential(*(Block(64) for _ in range(3))).to("cuda")
    step = _gpu_step(model, tw.optim.AdamW(model.parameters(), lr=1e-3))
    x = tw.randn(16, 64).to("cuda")
    step(x)
    (program,) = step.programs()
    buffers = program.plan.buffers
    outside = {k for k, b in enumerate(buffers) if b.kind in ("input", "donated")}
    first_all = events.index("all")
    before = events[:first_all]
    assert any(isinstance(s, program_cuda.CudaKernelStep) for s in before), "every compile was waited for first"
    assert all(s.writes() is not None for s in before)
    written_before = {b for s in before for b in s.writes() if b in outside}
    assert sum(buffers[b].ty.nbytes for b in written_before) <= 4096
    after = [s for s in events[first_all:] if s != "all"]
    assert any(not outside.isdisjoint(s.writes() or ()) for s in after), "the update writes the parameters"
    assert all(s.function is not None for s in program.steps if isinstance(s, program_cuda.CudaKernelStep))
    assert program.runtime.compiling is None
    # later calls run (or capture) with every function in place
    losses = [step(x).item() for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)


@pytest.mark.cuda
@pytest.mark.parametrize("snapshot", [0, None])
def test_a_kernel_that_fails_to_compile_fails_the_first_call_with_the_arguments_as_they_were(tmp_path, monkeypatch,
                                                                                            snapshot):
    """With nothing copied aside, the run waits for every compile before its first write of an input; with the
    inputs written so far copied aside (the default), it writes them back when a compile fails."""
    import tilewise.codegen.toolchain.cache as cache_module
    import tilewise.compiler.program_cuda as program_cuda

    monkeypatch.setattr(cache_module, "_default_cache", KernelCache(tmp_path / "cache"))
    if snapshot is not None:
        monkeypatch.setattr(program_cuda, "SNAPSHOT_BYTES", snapshot)
    original_load = program_cuda.PendingFunctions._load

    def load(self, key):
        if key == self.unique[-1]:
            raise RuntimeError(f"NVRTC could not compile {key[0]}")
        return original_load(self, key)
    monkeypatch.setattr(program_cuda.PendingFunctions, "_load", load)

    tw.manual_seed(0)
    model = tw.nn.Sequential(*(Block(64) for _ in range(3))).to("cuda")
    before = [p.detach().cpu().numpy().copy() for p in model.parameters()]
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-3)
    step = _gpu_step(model, optimizer)
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        step(tw.randn(16, 64).to("cuda"))
    for p, old in zip(model.parameters(), before):
        assert (p.detach().cpu().numpy() == old).all()
    for state in optimizer.state.values():
        assert state["step"].item() == 0
        assert not state["exp_avg"].cpu().numpy().any()


@needs_nvrtc
@pytest.mark.slow
def test_the_compile_time_benchmark_reports_every_stage_and_equal_serial_kernels(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_time.py"), "--tiny", "--models", "gpt2",
                           "--serial", "--threads", "2"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": python_path(ROOT / "benchmarks")})
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in ("trace", "passes", "fuse", "lower to kernel IR", "plan memory", "render", "compile kernels (NVRTC)"):
        assert f"| {stage} |" in done.stdout, stage
    assert "the same PTX and cubins as on the pool: yes" in done.stdout
