"""cuDNN attention graphs built when a CUDA program is (see [Note: library calls prepared at build]): on the CUDA
lowering of transformer steps (made here without a GPU, cuDNN and the device standing in), the preparation of each
attention step asks for its graph under the key its run asks for, so the run builds nothing; a program's build
prepares each attention step once, after its kernels' compiles have started, and ``lowered()`` prepares nothing;
on a GPU, the first run of a compiled step finds both graphs built."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from compiled_steps import qkv_attention_step

import tilewise as tw
import tilewise.nn.functional as F
from tilewise._stages import Stages
from tilewise.backends.cuda import attention, cudnn
from tilewise.backends.cuda.kernels import PREPARE
from tilewise.compiler import program_cuda, targets
from tilewise.compiler.program import step_nodes
from tilewise.device import Device

BATCH, LENGTH, HEADS, DIM, LAYERS = 2, 16, 4, 16, 2
WIDTH = HEADS * DIM
CUDA = Device("cuda", 0)


class _Graph:
    """A built graph standing in for cuDNN's: counts its runs."""

    def __init__(self):
        self.runs = 0

    def run(self, pointers, stream):
        self.runs += 1


@pytest.fixture
def stand_in_cudnn(monkeypatch):
    """cuDNN importable, a GPU of compute capability 9.0, and graph builds recorded (identity -> graph) instead of
    made; the graph and decision caches start empty."""
    built: dict[tuple, _Graph] = {}

    def cached_graph(identity, device, name, build):
        assert identity not in built, f"built twice: {identity}"
        built[identity] = _Graph()
        return built[identity]

    monkeypatch.setattr(cudnn, "unavailable", lambda: None)
    monkeypatch.setattr(cudnn, "cached_graph", cached_graph)
    monkeypatch.setattr(attention, "_capability_major", lambda device: 9)
    monkeypatch.setattr(attention, "stream_handle", lambda index: 0)
    monkeypatch.setattr(attention, "_graphs", {})
    monkeypatch.setattr(attention, "_decisions", {})
    return built


def _gpt_step():
    """GPT-2's attention: a fused QKV projection split into heads, causal (the ordered and packed variants)."""
    tw.manual_seed(0)
    projs = [tw.nn.Linear(WIDTH, 3 * WIDTH) for _ in range(LAYERS)]

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            for proj in projs:
                q, k, v = proj(x).split(WIDTH, dim=2)
                q, k, v = (t.view(BATCH, LENGTH, HEADS, DIM).transpose(1, 2) for t in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = y.transpose(1, 2).reshape(BATCH, LENGTH, WIDTH)
        loss = x.float().square().mean()
        loss.backward()
        return loss

    return step


def _vit_step():
    """ViT's attention: ``nn.MultiheadAttention`` over batch-first tokens, not causal."""
    tw.manual_seed(0)
    layers = [tw.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True) for _ in range(LAYERS)]

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            for attn in layers:
                x, _ = attn(x, x, x, need_weights=False)
        loss = x.float().square().mean()
        loss.backward()
        return loss

    return step


def _plain_step():
    """Attention over contiguous [batch, heads, length, dim] operands (the operators themselves)."""
    tw.manual_seed(0)
    projs = [tw.nn.Linear(DIM, DIM) for _ in range(3)]

    def step(q, k, v):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            q, k, v = (proj(t) for proj, t in zip(projs, (q, k, v)))
            y = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        loss = y.float().square().mean()
        loss.backward()
        return loss

    return step


STEPS = {"gpt": (_gpt_step, lambda: (tw.randn(BATCH, LENGTH, WIDTH),)),
         "vit": (_vit_step, lambda: (tw.randn(BATCH, LENGTH, WIDTH),)),
         "plain": (_plain_step, lambda: tuple(tw.randn(BATCH, HEADS, LENGTH, DIM) for _ in range(3)))}


def _lowered(name: str) -> list:
    make, args = STEPS[name]
    _, programs, _ = tw.compile(make()).lowered(targets.get_target("cuda"), *args())
    return programs


def _extern_steps(low) -> list:
    """The library-call steps of a lowered program, as ``build_cuda_program`` makes them (for a CUDA device)."""
    return [program_cuda.CudaExternStep(node, low.plan, results, CUDA) for node, results in step_nodes(low.fused)
            if node.op != "fused" and node not in low.plan.cat_copies]


def _attention_steps(low) -> list:
    return [s for s in _extern_steps(low) if s.op.full_name.startswith("_scaled_dot_product_attention")]


def _run_pointers(plan) -> list[int]:
    """Addresses a run might bind: the arena elsewhere than the stand-ins', inputs and outputs allocated apart."""
    arena = 0x7F31_2000_0000
    return [arena + b.slot if b.kind == "arena" else 0x7F40_0000_0000 + (k << 24) + b.offset
            for k, b in enumerate(plan.buffers)]


@pytest.mark.parametrize("name", list(STEPS))
def test_a_prepared_attention_graph_is_the_one_its_run_looks_up(stand_in_cudnn, monkeypatch, name):
    programs = _lowered(name)
    keys = {"prepare": [], "run": []}
    phase = ["prepare"]

    def graph_key(*args):
        key = real_key(*args)
        keys[phase[0]].append(key)
        return key

    real_key = attention.graph_key
    monkeypatch.setattr(attention, "graph_key", graph_key)
    steps = [(low, _attention_steps(low)) for low in programs]
    assert sum(len(s) for _, s in steps) == 2 * LAYERS if name != "plain" else 2, steps
    for low, attention_steps in steps:
        assert all(s.prepare is not None for s in attention_steps)
        program_cuda.prepare_library_calls(attention_steps, low.plan)
    # every attention step went to cuDNN: one graph per distinct geometry, forward and backward
    assert len(keys["prepare"]) == sum(len(s) for _, s in steps)
    assert len(stand_in_cudnn) == len(set(keys["prepare"])) == 2, list(stand_in_cudnn)
    assert all(graph is not None for graph in attention._graphs.values())
    phase[0] = "run"
    for low, attention_steps in steps:
        pointers = _run_pointers(low.plan)
        for step in attention_steps:
            step.run(pointers, 0)
    assert keys["run"] == keys["prepare"], "a run looked its graph up under another key than its preparation"
    assert len(stand_in_cudnn) == 2, "a run built a graph that was not prepared"
    assert sum(g.runs for g in stand_in_cudnn.values()) == len(keys["run"])


def test_a_graph_that_fails_to_build_is_remembered_and_the_run_falls_back(stand_in_cudnn, monkeypatch):
    def cached_graph(identity, device, name, build):
        raise RuntimeError("no engine for this configuration")

    monkeypatch.setattr(cudnn, "cached_graph", cached_graph)
    (low,) = _lowered("plain")[:1]
    steps = _attention_steps(low)
    program_cuda.prepare_library_calls(steps, low.plan)  # raises nothing
    assert attention._graphs and all(graph is None for graph in attention._graphs.values())
    monkeypatch.setattr(cudnn, "cached_graph", lambda *args: pytest.fail("a failed build was tried again"))
    pointers = _run_pointers(low.plan)
    for step in steps:
        assert not step.into(*step._into_args(pointers, [program_cuda.device_tensor(pointers[b], value, geom, CUDA)
                                                         for b, value, geom in step.inputs]))


class _PendingFunctions:
    def __init__(self, units, device, compiles=None):
        _events.append("compiles started")


class _KernelStep:
    def __init__(self, *args):
        pass


_events: list[str] = []


def test_building_a_program_prepares_each_attention_step_once_after_starting_the_compiles(monkeypatch):
    monkeypatch.setattr(cudnn, "unavailable", lambda: None)
    prepared = []
    for name in list(PREPARE):
        monkeypatch.setitem(PREPARE, name, lambda outs, *args, name=name: prepared.append(name) or
                            _events.append("prepare"))
    programs = _lowered("gpt")
    assert not prepared, "lowered() prepared library calls"
    monkeypatch.setattr(program_cuda, "get_device_properties", lambda index: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(program_cuda, "PendingFunctions", _PendingFunctions)
    monkeypatch.setattr(program_cuda, "CudaKernelStep", _KernelStep)
    for low in programs:
        _events.clear()
        with Stages() as stages:
            program = program_cuda.build_cuda_program(low, CUDA)
        attention_steps = [s for s in program.steps if isinstance(s, program_cuda.CudaExternStep)
                           and s.op.full_name.startswith("_scaled_dot_product_attention")]
        # the program's compiles start before its steps are prepared, each once
        assert _events == ["compiles started"] + ["prepare"] * len(attention_steps), _events
        if attention_steps:
            assert any(key[-1] == "prepare library calls (cuDNN graphs)" for key in stages.seconds), stages.seconds
    assert sorted(prepared) == sorted(["_scaled_dot_product_attention_math_ordered",
                                       "_scaled_dot_product_attention_backward_packed"] * LAYERS), prepared


@pytest.mark.cuda
def test_a_compiled_steps_first_run_finds_its_attention_graphs_built(monkeypatch):
    """Every cuDNN graph the compiled step uses is built while its program is (not by the run), one each way."""
    batch, length, heads, dim = 2, 64, 2, 64
    width = heads * dim
    tw.manual_seed(0)
    proj = tw.nn.Linear(width, 3 * width).cuda().bfloat16()
    builds = []
    preparing = [False]
    cached_graph, prepare = cudnn.cached_graph, program_cuda.prepare_library_calls

    def counted(identity, device, name, build):
        builds.append((identity, preparing[0]))
        return cached_graph(identity, device, name, build)

    def prepare_library_calls(steps, plan):
        preparing[0] = True
        try:
            prepare(steps, plan)
        finally:
            preparing[0] = False

    monkeypatch.setattr(cudnn, "cached_graph", counted)
    monkeypatch.setattr(program_cuda, "prepare_library_calls", prepare_library_calls)
    monkeypatch.setattr(attention, "_graphs", {})

    step = qkv_attention_step(tw, proj, batch, length, heads, dim)

    compiled = tw.compile(step)
    for seed in range(2):
        tw.manual_seed(seed + 1)
        compiled(tw.randn(batch, length, width, device="cuda").bfloat16())
    tw.cuda.synchronize()
    assert len(builds) == 2 and all(during for _, during in builds), builds
    assert len(attention._graphs) == 2 and all(g is not None for g in attention._graphs.values())


def test_a_preparation_that_raises_is_logged_and_the_program_is_still_built(capsys):
    """Preparing is a head start only: a step whose preparation raises is passed over (the compile log says so),
    and the steps after it are still prepared."""
    from tilewise.config import settings

    calls = []

    def step(fails: bool):
        s = object.__new__(program_cuda.CudaExternStep)
        s.prepare = object()
        s.describe = lambda: f"step {len(calls)}"

        def prepare_call(pointers):
            calls.append(fails)
            if fails:
                raise ValueError("no graph for this geometry")

        s.prepare_call = prepare_call
        return s

    plan = SimpleNamespace(buffers=[])
    settings.log.add("compile")
    try:
        program_cuda.prepare_library_calls([step(True), step(False)], plan)
    finally:
        settings.log.discard("compile")
    assert calls == [True, False]
    err = capsys.readouterr().err
    assert "failed, the run will build it: ValueError: no graph for this geometry" in err
