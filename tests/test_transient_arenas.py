"""Transient arenas ([Note: transient arenas] in compiler/program.py): a compiled function whose arena keeps only
small plans gives a larger plan memory for each run only; results are the same as with a kept arena, and on CUDA
the eager fused composites leave nothing allocated behind them."""

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.compiler.program import Arena


def _same(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().cpu().numpy(), rtol=rtol, atol=atol)


def chain(x, w):
    h = (x * 2).exp() @ w  # a library call between kernels: its operands are arena values
    return (h.tanh() * x.sum()).softmax(-1)


def test_for_plan_keeps_small_plans_and_gives_large_ones_their_own():
    made = []
    arena = Arena(lambda n: made.append(n) or bytearray(n))
    assert arena.for_plan(1 << 40) is arena, "no limit: every plan shares the arena"
    arena.keep_up_to = 100
    assert arena.for_plan(100) is arena
    own = arena.for_plan(101)
    assert own is not arena and own.transient
    own.reserve(101)
    assert made == [] and own.buffer is None, "a transient arena allocates nothing until a run"
    own.acquire()
    assert made == [101] and own.generation == 1
    own.release()
    assert own.buffer is None


@pytest.mark.parametrize("keep", [None, 0])
def test_transient_arena_gives_the_kept_arenas_results(keep):
    x, w = tw.randn(16, 32), tw.randn(32, 32)
    fn = tw.compile(chain)
    if keep is not None:
        fn.arena_keep = {"c": keep}
    results = [fn(x, w) for _ in range(3)]
    want = chain(x, w)
    for got in results:
        _same(got, want)
    (program,) = fn.programs()
    assert program.plan.arena_bytes > 0
    assert program.arena.transient is (keep is not None)
    if keep is not None:
        assert program.arena.buffer is None, "released after each run"
        assert program.arena.generation == 3


@pytest.mark.cuda
def test_transient_arena_on_cuda_frees_its_memory_and_replays_no_graph():
    x, w = tw.randn(512, 1024, device="cuda"), tw.randn(1024, 1024, device="cuda")
    fn = tw.compile(chain)
    fn.arena_keep = {"cuda": 0}
    want = chain(x, w)
    for _ in range(3):
        got = fn(x, w)
        tw.cuda.synchronize()
        held = tw.cuda.memory_allocated()
        del got
    (program,) = fn.programs()
    assert program.arena.transient and program.arena.buffer is None
    assert program.runtime.replays == 0 and "transient" in program.runtime.why_not
    got = fn(x, w)
    _same(got, want, rtol=1e-4, atol=1e-5)
    assert held - tw.cuda.memory_allocated() < program.plan.arena_bytes, "the arena is not held between runs"


@pytest.mark.cuda
def test_a_large_eager_composite_leaves_nothing_allocated():
    tw.cuda.empty_cache()
    before = tw.cuda.memory_allocated()
    x = tw.randn(64, 64, 56, 56, device="cuda", requires_grad=True)
    bn = tw.nn.BatchNorm2d(64).cuda()
    with tw.autocast("cuda", dtype=tw.bfloat16):
        y = F.relu(bn(x))
    y.float().sum().backward()
    tw.cuda.synchronize()
    del x, y, bn
    tw.cuda.empty_cache()
    assert tw.cuda.memory_allocated() - before <= (16 << 20) + (1 << 20), "at most the kept arena of small plans"


@pytest.mark.cuda
def test_empty_cache_gives_the_cudnn_workspace_back():
    from tilewise.backends.cuda import cudnn

    if cudnn.unavailable():
        pytest.skip(cudnn.unavailable())
    # workspaces a CUDA graph captured earlier in this process stay (see [Note: cuDNN graphs]); the rest goes
    tw.cuda.empty_cache()
    before = cudnn.workspace_bytes(tw.cuda.current_device())
    conv = tw.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x = tw.randn(32, 64, 56, 56, device="cuda", requires_grad=True)
    conv(x).sum().backward()
    tw.cuda.synchronize()
    del x, conv
    tw.cuda.empty_cache()
    assert cudnn.workspace_bytes(tw.cuda.current_device()) == before
    conv = tw.nn.Conv2d(8, 8, 3).cuda()  # a later call allocates one again
    x = tw.randn(2, 8, 9, 9)
    out = conv(x.cuda())
    _same(out.cpu(), F.conv2d(x, conv.weight.cpu(), conv.bias.cpu()), rtol=1e-3, atol=1e-3)
