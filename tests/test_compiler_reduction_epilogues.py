"""Reductions make the per-output values computed from their results, and the writes of them, in their own kernel
([Note: reduction epilogues] in ``compiler/lowering/fusion.py``): a batch norm's statistics with its running
statistics' update (the last block of a split column sum holds the combined total), split or unsplit sums with what
follows per column or row. Lowered for the CUDA target (kernel counts, and every kernel compiles with NVRTC where it
is installed) and run on the C target against torch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.codegen.toolchain import nvrtc_available
from tilewise.compiler.targets import get_target
from tilewise.ops.registry import OPS

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")

SHAPE = (8, 64, 14, 14)  # 64 channels of 1568 elements: the statistics of a channels-last input split across blocks


def _lowered(fn, *args) -> list:
    with tw.no_grad():
        _, programs, _ = tw.compile(fn).lowered(get_target("cuda"), *args)
    return programs


def _schedules(programs) -> list:
    return [s for p in programs for s in p.schedules]


def _compiles(programs) -> None:
    """Every kernel of ``programs`` reaches the PTX."""
    from tilewise.codegen.toolchain import compile_cuda

    for p in programs:
        names = sorted(p.sources)
        compiled = compile_cuda("\n".join(p.sources[n] for n in names), names, "sm_90")
        missing = [n for n in names if f".entry {n}(" not in compiled.ptx]
        assert not missing, f"kernels missing from the PTX: {missing}"


def _input(shape, dtype, channels_last: bool, seed: int = 0):
    x = tw.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    if channels_last:
        x = x.to(memory_format=tw.channels_last)
    return x.to(dtype)


def _bn_args(shape, dtype, channels_last):
    c = shape[1]
    rng = np.random.default_rng(1)
    kind = np.float64 if dtype is tw.float64 else np.float32  # torch's parameters: float32 for a half input
    w, b, rm = (tw.from_numpy(rng.standard_normal(c).astype(kind)) for _ in range(3))
    rv = tw.from_numpy(rng.uniform(0.5, 2, c).astype(kind))
    return _input(shape, dtype, channels_last), w, b, rm, rv


def _bn_forward(x, w, b, rm, rv):
    return OPS["native_batch_norm"](x, w, b, rm, rv, True, 0.1, 1e-5)


def _bn_backward(g, x, w, rm, rv, mean, invstd):
    return OPS["_batch_norm_backward"](g, x, w, rm, rv, mean, invstd, True, 1e-5)


# ---------------------------------------------------------------------------- kernel counts (CUDA target)

@pytest.mark.parametrize("dtype", [tw.bfloat16, tw.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("channels_last,shape,kernels", [
    (True, SHAPE, 3),  # statistics + running mean, centred squares + var/invstd + running var, normalisation
    (False, SHAPE, 1),  # rows in phases, the running statistics in the rows' epilogue
    (True, (4, 16, 5, 5), 1),  # short columns: one kernel in phases
], ids=["channels_last", "contiguous", "small"])
def test_a_training_batch_norms_running_statistics_are_made_by_its_statistics_kernels(dtype, channels_last, shape,
                                                                                       kernels):
    programs = _lowered(_bn_forward, *_bn_args(shape, dtype, channels_last))
    schedules = _schedules(programs)
    assert len(schedules) == kernels, "\n".join(s.describe() for s in schedules)
    # no one-block kernel over the channels (an epilogue left out) nor a sibling nest making running_mean * 0.9
    for s in schedules:
        assert all(ns.nest.reduce or len(ns.nest.shape) > 1 for ns in s.nests), s.describe()
    if kernels == 3:
        stats, squares, _ = schedules
        assert all(len(s.nests) == 1 and "split over" in s.describe() for s in (stats, squares))
        # the statistics kernel stores the mean and the running mean written back; the next the running var and
        # invstd, all from the last block's combined totals
        assert [len(s.kernel.nests[0].stores) for s in (stats, squares)] == [2, 2]
        assert all(st.phase is None for s in (stats, squares) for st in s.kernel.nests[0].stores)
    if nvrtc_available():
        _compiles(programs)


@pytest.mark.parametrize("channels_last,kernels", [(True, 2), (False, 1)], ids=["channels_last", "contiguous"])
def test_a_batch_norms_backward_kernels(channels_last, kernels):
    """The column sums (with the weight gradient's cast as their epilogue), then the input gradient over the domain:
    a later phase, which a split column reduction cannot hold."""
    x, w, _, rm, rv = _bn_args(SHAPE, tw.bfloat16, channels_last)
    g = _input(SHAPE, tw.bfloat16, channels_last, seed=2)
    mean, invstd = tw.randn(1, 64, 1, 1), tw.rand(1, 64, 1, 1) + 0.5
    programs = _lowered(_bn_backward, g, x, w, rm, rv, mean, invstd)
    assert len(_schedules(programs)) == kernels, "\n".join(s.describe() for s in _schedules(programs))
    if nvrtc_available():
        _compiles(programs)


@pytest.mark.parametrize("dtype", [tw.bfloat16, tw.float32], ids=["bf16", "f32"])
def test_layer_norm_and_group_norm_kernels(dtype):
    x, w, b = tw.randn(8, 128, 96).to(dtype), tw.randn(96).to(dtype), tw.randn(96).to(dtype)
    programs = _lowered(lambda x, w, b: F.layer_norm(x, (96,), w, b), x, w, b)
    assert len(_schedules(programs)) == 1
    # the group statistics over [N, G, C/G * H * W] and the affine over [N, C, H, W]: two domains
    gn = _lowered(lambda x, w, b: F.group_norm(x, 8, w, b), tw.randn(*SHAPE).to(dtype), tw.randn(64), tw.randn(64))
    assert len(_schedules(gn)) == 2
    if nvrtc_available():
        _compiles(programs + gn)


def _column_epilogue(x, b):
    return (x.sum(0) / 3 + b).rsqrt()


def _row_epilogue(x, b):
    return (x.sum(-1) / 3 + b).rsqrt()


def _running_update(x, r):  # a running statistic written back in place, as a batch norm's
    r.mul_(0.9).add_(x.mean(0) * 0.1)
    return x.mean(0)


def _neighbours(x, b):  # each output needs another column's total: no epilogue
    s = x.sum(0)
    return s[1:] - s[:-1] + b[1:]


def _centred(x, b):  # a later phase over the domain: the split column sum stays apart from it
    return x - x.mean(0) + b


@pytest.mark.parametrize("fn,shape,kernels,split", [
    (_column_epilogue, (4096, 64), 1, True),
    (_row_epilogue, (64, 4096), 1, False),
    (_running_update, (4096, 64), 1, True),
    (_neighbours, (4096, 64), 2, True),
    (_centred, (4096, 64), 2, True),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_per_output_consumers_of_a_reduction_are_its_epilogue_where_legal(fn, shape, kernels, split):
    x = tw.randn(*shape)
    b = tw.rand(shape[1] if fn is not _row_epilogue else shape[0]) + 1
    programs = _lowered(fn, x, b)
    schedules = _schedules(programs)
    assert len(schedules) == kernels, "\n".join(s.describe() for s in schedules)
    assert len(schedules[0].nests) == 1 and ("split over" in schedules[0].describe()) is split
    if nvrtc_available():
        _compiles(programs)
    # on the C target, as torch computes it
    args = (x, b.clone())
    want = fn(*(torch.from_numpy(a.numpy().copy()) for a in args))
    got = tw.compile(fn)(*args)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-3)  # sums of 4096 in another order
    np.testing.assert_allclose(args[1].numpy(), b.numpy() * 0.9 + 0.1 * x.numpy().mean(0) if fn is _running_update
                               else b.numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- values (C target) against torch

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_a_compiled_training_batch_norm_matches_torch(dtype, channels_last):
    x, w, b, rm, rv = _bn_args(SHAPE, getattr(tw, dtype), channels_last)
    tx = torch.from_numpy(x.float().numpy()).to(getattr(torch, dtype))
    if channels_last:
        tx = tx.contiguous(memory_format=torch.channels_last)
    t = [torch.from_numpy(a.numpy().copy()) for a in (w, b, rm, rv)]
    want = torch.native_batch_norm(tx, *t, True, 0.1, 1e-5)
    got = tw.compile(_bn_forward)(x, w, b, rm, rv)
    tol = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 2e-2, "float16": 2e-3}[dtype]
    np.testing.assert_allclose(got[0].float().numpy(), want[0].float().numpy(), rtol=tol, atol=tol)
    assert got[0].dtype is x.dtype and got[0].is_contiguous(memory_format=tw.channels_last) is channels_last
    for ours, theirs in ((got[1], want[1]), (got[2], want[2]), (rm, t[2]), (rv, t[3])):  # statistics in place
        np.testing.assert_allclose(ours.float().numpy().reshape(-1), theirs.float().numpy().reshape(-1),
                                   rtol=max(tol, 1e-5), atol=max(tol, 1e-6))


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_a_compiled_batch_norm_backward_matches_torch(channels_last):
    x, w, b, rm, rv = _bn_args(SHAPE, tw.float32, channels_last)
    g = _input(SHAPE, tw.float32, channels_last, seed=2)
    tx, tg = (torch.from_numpy(a.numpy().copy()) for a in (x, g))
    if channels_last:
        tx, tg = (a.contiguous(memory_format=torch.channels_last) for a in (tx, tg))
    tw_, trm, trv = (torch.from_numpy(a.numpy().copy()) for a in (w, rm, rv))
    _, mean, invstd = torch.native_batch_norm(tx, tw_, None, None, None, True, 0.1, 1e-5)
    want = torch.ops.aten.native_batch_norm_backward(tg, tx, tw_, trm, trv, mean, invstd, True, 1e-5,
                                                     [True, True, True])
    got = tw.compile(_bn_backward)(g, x, w, rm, rv, tw.from_numpy(mean.numpy().reshape(1, -1, 1, 1)),
                                   tw.from_numpy(invstd.numpy().reshape(1, -1, 1, 1)))
    for ours, theirs in zip(got, want):
        np.testing.assert_allclose(ours.numpy().reshape(-1), theirs.numpy().reshape(-1), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- collectives

@pytest.fixture
def one_process():
    """A gloo process group of this process alone."""
    import tilewise.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    from ddp_workers import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_epilogue_waiting_for_a_collective_stays_out_of_the_reduction(one_process):
    """Joined, the column sum would wait for the all-reduce instead of running while it moves bytes."""
    from tilewise.compiler.lowering.memory import steps_of
    from tilewise.distributed import _functional_collectives as fc

    def f(x, v):
        r = fc.all_reduce(v * 2, "sum", None)
        return x.sum(0) * r + 1

    x, v = tw.randn(4096, 64), tw.randn(64)
    _, (low,), _ = tw.compile(f).lowered(get_target("cuda"), x, v)
    steps = steps_of(low.fused)
    assert [n.op for n in steps] == ["fused", "_c10d_functional::all_reduce", "fused"]
    assert low.streams.waits[0] == () and low.streams.waits[2] == (1,)
    assert any(ns.nest.reduce for ns in low.schedules[0].nests)  # the sum runs before the collective
    np.testing.assert_allclose(tw.compile(f)(x, v).numpy(), f(x, v).numpy(), rtol=1e-5, atol=1e-5)


def test_an_epilogue_after_a_library_call_stays_out_of_the_reduction():
    """An optimizer's update of a bias after the rest of backward, made with its gradient's column sum, would run
    that sum after the GEMMs between them and keep its operand alive across them."""
    from tilewise.compiler.lowering.memory import steps_of

    def f(g, w, bias):
        grad = g.sum(0)
        h = g @ w
        return h, bias - 0.1 * grad

    g, w, bias = tw.randn(4096, 64), tw.randn(64, 64), tw.randn(64)
    _, (low,), _ = tw.compile(f).lowered(get_target("cuda"), g, w, bias)
    assert [n.op for n in steps_of(low.fused)] == ["fused", "mm", "fused"], low.fused
    got = tw.compile(f)(g, w, bias)
    np.testing.assert_allclose(got[1].numpy(), (bias - 0.1 * g.sum(0)).numpy(), rtol=1e-5, atol=1e-4)


def test_a_transposed_copy_stays_out_of_a_row_reductions_nest():
    """[Note: transposed copies stay out of reductions]: a layer norm whose output is also stored transposed (an
    FP8 cast's copy for Hopper's K-major GEMM operands) keeps the copy out of its rows nest, where each element
    would be stored a sector apart; the copy is a tiled nest reading the norm's output."""
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    w, b = tw.randn(256), tw.randn(256)

    def norm_both_ways(x):
        h = tw.nn.functional.layer_norm(x, (256,), w, b).bfloat16()
        return h, h.permute(2, 0, 1).contiguous()

    x = tw.randn(4, 64, 256)
    low = lower_program(run_pipeline(trace(norm_both_ways, (x,), {}).graph), CUDA_TARGET)
    plans = [(ns.cuda.strategy, nest.reduce) for s in low.schedules for ns, nest in zip(s.nests, s.kernel.nests)]
    assert sorted(strategy for strategy, _ in plans) == ["rows", "tiles"], plans
    h, t = tw.compile(norm_both_ways)(x)
    eager_h, eager_t = norm_both_ways(x)
    assert (h.float() == eager_h.float()).all() and (t.float() == eager_t.float()).all()
