"""tilewise.compile(mode="max-autotune"): candidate schedules, timing on real buffers, the decision cache, the dump.

The C target's tests run anywhere; the CUDA candidates are checked to compile without a GPU and to run on one.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.codegen.schedule import HEURISTIC
from tilewise.codegen.toolchain import nvrtc_available
from tilewise.compiler import autotune
from tilewise.compiler.autotune import DecisionCache, Policy, Sampler, fastest, measure
from tilewise.compiler.capture import trace
from tilewise.compiler.passes import run_pipeline
from tilewise.compiler.program import lower_program
from tilewise.compiler.program_c import HostTuning
from tilewise.compiler.targets import C_TARGET, CUDA_TARGET, get_target
from tilewise.config import settings

W, B = tw.randn(768), tw.randn(768)

# name -> (function, argument shapes); each compiles to kernels with several candidates
CASES = {
    "seed_chain": (lambda x: x.relu() * 0.5 + 1, [(512, 512)]),
    "softmax": (lambda x: x.softmax(-1), [(64, 4096)]),
    "whole_sum": (lambda x: (x * x).sum(), [(1 << 20,)]),
    "column_sum": (lambda x: x.sum(0), [(2048, 96)]),
    "layer_norm": (lambda x, r: F.layer_norm(x + r, (768,), W, B), [(64, 768), (64, 768)]),
}


@pytest.fixture
def decisions(tmp_path, monkeypatch):
    """A fresh decision cache, so every kernel is timed (not read from earlier runs)."""
    cache = DecisionCache(tmp_path / "autotune")
    monkeypatch.setattr(autotune, "_default", cache)
    return cache


def _close(a, b, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(a.detach().cpu().float().numpy(), b.detach().cpu().float().numpy(), rtol=rtol,
                               atol=atol)


def _args(shapes, device="cpu"):
    return [tw.randn(*s, device=device) for s in shapes]


def _lowered(fn, args, target):
    return lower_program(run_pipeline(trace(fn, tuple(args), {}).graph), get_target(target))


# ---------------------------------------------------------------------------- candidates

@pytest.mark.parametrize("target", ["c", "cuda"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_candidates_start_with_the_heuristic_and_are_distinct(name, target):
    fn, shapes = CASES[name]
    for sched in _lowered(fn, _args(shapes), target).schedules:
        options = get_target(target).candidates(sched.kernel)
        assert options[0].signature() == get_target(target).schedule(sched.kernel).signature()
        assert options[0].knobs == HEURISTIC and all(c.knobs != HEURISTIC for c in options[1:])
        assert len({c.signature() for c in options}) == len(options) > 1
        assert len({c.knobs.label() for c in options}) == len(options)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_candidates_are_legal_launches(name):
    fn, shapes = CASES[name]
    for sched in _lowered(fn, _args(shapes), "cuda").schedules:
        for c in CUDA_TARGET.candidates(sched.kernel):
            assert 32 <= c.block <= 1024 and c.block % 32 == 0
            for ns in c.nests:
                plan = ns.cuda
                row = int(np.prod([ns.nest.shape[d] for d in ns.nest.reduce]))
                dim = plan.vector_dim
                assert plan.vector == 1 or ns.nest.shape[dim] % plan.vector == 0
                if plan.strategy == "rows":
                    assert plan.team * plan.rows_per_block == c.block
                    assert plan.split == 1 or plan.rows_per_block == 1
                    assert plan.team * plan.vector * plan.steps * plan.split >= row
                elif plan.strategy == "columns":
                    assert plan.team * 32 == c.block




@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_cuda_candidate_compiles(name):
    from tilewise.codegen.render.kernel_cuda import render_program
    from tilewise.codegen.toolchain import compile_cached

    fn, shapes = CASES[name]
    for sched in _lowered(fn, _args(shapes), "cuda").schedules:
        kernel = sched.kernel.name
        for c in CUDA_TARGET.candidates(sched.kernel):
            assert f".entry {kernel}" in compile_cached(render_program([c])[kernel], kernel, "sm_90").ptx


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_c_candidate_computes_what_eager_does(name):
    fn, shapes = CASES[name]
    args = _args(shapes)
    expected = fn(*args)
    f = tw.compile(fn)
    f(*args)
    (program,) = f.programs()
    for k, sched in enumerate(list(program.schedules)):
        for c in C_TARGET.candidates(sched.kernel):
            program.schedules[k] = c
            HostTuning(C_TARGET).finish(program)  # the program's library rebuilt with this candidate
            _close(f(*args), expected, 1e-4, 1e-4)
        program.schedules[k] = sched


# ---------------------------------------------------------------------------- max-autotune on the C target

@pytest.mark.parametrize("name", sorted(CASES))
def test_max_autotune_matches_eager_and_default(name, decisions):
    fn, shapes = CASES[name]
    args = _args(shapes)
    tuned = tw.compile(fn, mode="max-autotune")
    _close(tuned(*args), fn(*args), 1e-4, 1e-4)
    _close(tuned(*args), tw.compile(fn)(*args), 1e-4, 1e-4)
    (program,) = tuned.programs()
    assert program.tuner is None, "the first call chose every schedule"
    scheds = program.schedules
    assert scheds and all(s.tuned is not None and not s.tuned.cached for s in scheds)
    assert decisions.stats.timed == len(scheds)
    for s in scheds:
        assert len(s.tuned.seconds) == len(C_TARGET.candidates(s.kernel)) and all(t > 0 for t in s.tuned.seconds)
        assert s.knobs.label() == s.tuned.labels[s.tuned.winner]


def test_default_mode_times_nothing(decisions):
    fn, shapes = CASES["softmax"]
    f = tw.compile(fn)
    f(*_args(shapes))
    (program,) = f.programs()
    assert program.tuner is None and all(s.tuned is None and s.knobs == HEURISTIC for s in program.schedules)
    assert decisions.stats.timed == 0 and decisions.stats.memory_hits == decisions.stats.disk_hits == 0


def test_a_second_compile_reuses_the_decision_without_timing(decisions):
    fn, shapes = CASES["layer_norm"]
    args = _args(shapes)
    first = tw.compile(fn, mode="max-autotune")
    first(*args)
    assert decisions.stats.timed == 1
    decisions.clear_memory()  # as a new process would: only the disk remembers
    second = tw.compile(fn, mode="max-autotune")
    _close(second(*args), fn(*args), 1e-4, 1e-4)
    (program,) = second.programs()
    assert decisions.stats.timed == 1 and decisions.stats.disk_hits == 1
    (a,), (b,) = first.programs()[0].schedules, program.schedules
    assert b.tuned.cached and b.tuned.winner == a.tuned.winner and b.signature() == a.signature()
    assert program.source == first.programs()[0].source


def test_a_new_shape_is_timed_again(decisions):
    f = tw.compile(lambda x: x.softmax(-1), mode="max-autotune")
    f(tw.randn(64, 1024))
    f(tw.randn(64, 2048))
    assert decisions.stats.timed == 2 and decisions.stats.memory_hits == 0


def test_an_in_place_update_is_applied_once(decisions):
    def step(p, g):
        p.sub_(g * 0.1)

    p, g = tw.randn(1 << 16), tw.randn(1 << 16)
    expected = p.numpy() - g.numpy() * np.float32(0.1)
    version = p._version
    f = tw.compile(step, mode="max-autotune")
    f(p, g)
    np.testing.assert_array_equal(p.numpy(), expected)
    assert p._version == version + 1
    (sched,) = f.programs()[0].schedules
    assert sched.tuned is not None and not sched.tuned.cached


def test_forward_and_backward_programs_are_tuned(decisions):
    w = tw.randn(32, 64, requires_grad=True)
    fn = lambda x: (x @ w).relu().softmax(-1).sum()
    x = tw.randn(16, 32)
    fn(x).backward()
    expected, w.grad = w.grad, None
    tw.compile(fn, mode="max-autotune")(x).backward()
    _close(w.grad, expected, 1e-4, 1e-5)
    assert decisions.stats.timed >= 2


def test_the_dump_shows_candidates_times_and_winner(decisions, capsys, monkeypatch):
    monkeypatch.setattr(settings, "log", {"kernels"})
    fn, shapes = CASES["whole_sum"]
    f = tw.compile(fn, mode="max-autotune")
    f(*_args(shapes))
    err = capsys.readouterr().err
    (sched,) = f.programs()[0].schedules
    assert "autotuned over" in err and "<- chosen" in err and "timed now" in err
    for label in sched.tuned.labels:
        assert f" {label}: " in err
    assert sched.describe() in err, "the final dump shows the chosen schedule"
    decisions.clear_memory()
    tw.compile(fn, mode="max-autotune")(*_args(shapes))
    assert "from the decision cache" in capsys.readouterr().err


def test_a_second_process_reads_the_decisions_and_the_library_from_disk(outputs_of_two_processes):
    script = textwrap.dedent("""
        import tilewise as tw
        from tilewise.compiler.autotune import default_decisions
        from tilewise.codegen.toolchain.cc import default_c_cache
        f = tw.compile(lambda x: (x.relu() * 0.5 + 1).softmax(-1), mode="max-autotune")
        total = f(tw.ones(64, 256)).sum().item()
        stats = default_decisions().stats
        print(round(total, 3), stats.timed, stats.disk_hits, default_c_cache().stats.compiles)
    """)
    first, second = outputs_of_two_processes(script)
    assert first[0] == second[0] == "64.0"
    assert (first[1], first[2]) == ("1", "0")
    assert (second[1], second[2], second[3]) == ("0", "1", "0"), "no timing, no C compile"


# ---------------------------------------------------------------------------- the timing loop

def test_measure_rotates_the_order_and_takes_medians():
    order = []

    def sampler(k, seconds):
        times = iter(seconds)

        def run(repeats):
            order.append(k)
            return next(times)
        return Sampler(run)

    policy = Policy(warmup=0.0, sample=0.0, budget=0.0, rounds=(5, 5))
    # per candidate: one untimed run, then one run in each of five rounds
    times = measure([sampler(0, [9, 3, 1, 2, 5, 4]), sampler(1, [9, 5, 5, 5, 5, 5]), sampler(2, [9, 1, 8, 8, 8, 1])],
                    policy)
    assert times == [3, 5, 8]
    assert order == [0, 1, 2] + [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2, 1, 2, 0], "each round starts one candidate later"


def test_the_heuristic_stays_unless_clearly_beaten():
    assert fastest([1.0, 0.99, 1.2]) == 0
    assert fastest([1.0, 0.9, 0.8]) == 2


# ---------------------------------------------------------------------------- CUDA (on a GPU)

GPU_CASES = {**CASES, "bf16_softmax": (lambda x: x.float().softmax(-1).bfloat16(), [(256, 4096)]),
             "long_rows_softmax": (lambda x: x.softmax(-1), [(3, 70000)])}


def _gpu_args(name):
    args = _args(GPU_CASES[name][1], "cuda")
    return [a.bfloat16() for a in args] if name.startswith("bf16") else args


def _gpu_case(name: str):
    """(function, its CUDA arguments, tolerance) of a GPU case."""
    fn = GPU_CASES[name][0]
    if name == "layer_norm":
        w, b = W.to("cuda"), B.to("cuda")
        fn = lambda x, r: F.layer_norm(x + r, (768,), w, b)
    return fn, _gpu_args(name), 2e-2 if name.startswith("bf16") else 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_max_autotune_on_cuda_matches_eager(name, decisions):
    fn, args, tol = _gpu_case(name)
    tuned = tw.compile(fn, mode="max-autotune")
    for _ in range(3):  # the tuning call, then the tuned program (and its graph, where it has one)
        _close(tuned(*args), fn(*args), tol, tol)
    (program,) = tuned.programs()
    assert program.tuner is None and all(s.tuned is not None for s in program.schedules)
    assert decisions.stats.timed == len(program.schedules)
    for s in program.schedules:
        assert all(t > 0 for t in s.tuned.seconds)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_every_cuda_candidate_computes_what_eager_does(name):
    from tilewise.compiler.autotune import Pending
    from tilewise.compiler.program_cuda import CudaTuning

    fn, args, tol = _gpu_case(name)
    expected = fn(*args)
    f = tw.compile(fn)
    f(*args)
    (program,) = f.programs()
    assert len(program.steps) == 1, "one kernel: the program replays no graph, so a swapped step runs"
    (sched,) = program.schedules
    options = CUDA_TARGET.candidates(sched.kernel)
    tuning = CudaTuning(CUDA_TARGET, program.runtime.device, {})
    functions = tuning.compile({sched.kernel.name: Pending("", options)})[sched.kernel.name]
    original = program.steps[0]
    for c, function in zip(options, functions):
        program.steps[0] = tuning.step(original, c, function)
        for _ in range(2):  # split reductions leave their counters zeroed for the next launch
            _close(f(*args), expected, tol, tol)


@pytest.mark.cuda
def test_an_in_place_update_on_cuda_is_applied_once(decisions):
    def step(p, g):
        p.sub_(g * 0.1)

    p, g = tw.randn(1 << 20, device="cuda"), tw.randn(1 << 20, device="cuda")
    expected = p.cpu().numpy() - g.cpu().numpy() * np.float32(0.1)
    tw.compile(step, mode="max-autotune")(p, g)
    np.testing.assert_allclose(p.cpu().numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
def test_a_second_cuda_compile_reuses_the_decision_and_replays_a_graph(decisions):
    def fn(x):
        return (x.softmax(-1) * x.sum(0)).amax(0)  # three kernels: graphs replay from the second call

    x = tw.randn(64, 128, device="cuda")
    first = tw.compile(fn, mode="max-autotune")
    _close(first(x), fn(x))
    timed = decisions.stats.timed
    assert timed >= 2
    decisions.clear_memory()
    second = tw.compile(fn, mode="max-autotune")
    for _ in range(4):
        x = tw.randn(64, 128, device="cuda")
        _close(second(x), fn(x))
    (program,) = second.programs()
    assert decisions.stats.timed == timed and decisions.stats.disk_hits == timed
    assert all(s.tuned.cached for s in program.schedules)
    assert program.source == first.programs()[0].source
    assert len(program.runtime.graphs) == 1 and not program.runtime.why_not
