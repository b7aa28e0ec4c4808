"""Results written over the memory of a kernel's operands (write-backs, in-place reuse of arena bytes): on CUDA the
parameters that share memory are not declared ``__restrict__``, and the Llama block, whose backward stores an
RMSNorm gradient over the residual gradient it still reads, computes the same gradients compiled as eager."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tilewise as tw
from tilewise.compiler.lowering.memory import steps_of
from tilewise.compiler.program import Lowered
from tilewise.compiler.targets import get_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import llama_block_grads as grads  # noqa: E402


def _signature(low: Lowered, name: str) -> list[str]:
    return low.sources[name].split(f" {name}(", 1)[1].split(")", 1)[0].split(", ")


def _kernels_sharing_memory(low: Lowered) -> list[str]:
    """The kernels some of whose parameters lie in the same memory; assert that exactly those parameters lack
    ``__restrict__``."""
    sharing = []
    for kernel in low.kernels.values():
        spans = [low.plan.memory_of(v) for v in kernel.values]
        shared = [any(j != k and a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for j, b in enumerate(spans))
                  for k, a in enumerate(spans)]
        for declaration, is_shared in zip(_signature(low, kernel.name), shared):
            assert ("__restrict__" in declaration) != is_shared, (kernel.name, declaration, spans)
        if any(shared):
            sharing.append(kernel.name)
    return sharing


def _lowered_for_cuda(fn, *args) -> Lowered:
    _, (low,), _ = tw.compile(fn).lowered(get_target("cuda"), *args)
    return low


def test_a_result_taking_the_arena_bytes_of_its_operand_drops_restrict_on_both():
    w1, w2 = tw.randn(16, 32), tw.randn(32, 8)
    low = _lowered_for_cuda(lambda x: ((x @ w1).relu() * 3) @ w2, tw.randn(4, 16))
    (kernel,) = low.kernels.values()
    operand, result = kernel.values  # the first product, and its relu written over it
    assert low.plan.of[operand] != low.plan.of[result]
    assert low.plan.memory_of(operand) == low.plan.memory_of(result)
    assert _kernels_sharing_memory(low) == [kernel.name]


def test_a_kernel_with_no_shared_memory_keeps_restrict_everywhere():
    low = _lowered_for_cuda(lambda x, y: (x * y).exp() + x, tw.randn(64), tw.randn(64))
    assert _kernels_sharing_memory(low) == []
    (kernel,) = low.kernels.values()
    assert all("__restrict__" in d for d in _signature(low, kernel.name))


@pytest.mark.parametrize("bf16", [True, False])
def test_the_llama_blocks_backward_declares_restrict_only_where_memory_is_unshared(bf16):
    case = grads.Case(grads.config(width=64, heads=4, kv_heads=2, hidden=128, tokens=16), "cpu", 2, 16)
    fn, args = case.pieces["block"]

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16, enabled=bf16):
            y = fn(x)
        (y.float() * case.probe(tuple(y.shape))).sum().backward()
        return y.float()

    low = _lowered_for_cuda(step, *args)
    sharing = _kernels_sharing_memory(low)
    # SwiGLU's backward over its products, each RMSNorm's backward over the gradient it accumulates, ...
    steps = [low.kernels[n].name if n in low.kernels else n.op for n in steps_of(low.fused)]
    assert len(sharing) >= 3, (sharing, steps)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("piece", ["block", "attention"])
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_llama_block_gradients_compiled_match_eager(device, piece, bf16):
    case = grads.default_case(device)
    worst = case.differences(piece, bf16)
    assert len(worst) >= 3, worst  # the output, the input's gradient and the parameters'
    assert worst[0][0] < (2e-2 if bf16 else 1e-4), worst
