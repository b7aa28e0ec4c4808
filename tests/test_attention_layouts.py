"""Attention written in the order its readers permute to (see [Note: attention written in a given order]): the CUDA
lowering (made here without a GPU) of MultiheadAttention and of a GPT-style block has no transposing copy around
cuDNN's attention and no kernel joining the three gradients of the packed projection, and a self-attention's
in-projection is one GEMM; on a GPU, compiled steps that take this path give eager's results."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.backends.cuda import cudnn
from tilewise.compiler import targets
from tilewise.compiler.lowering.memory import steps_of
from tilewise.ops.registry import OPS

FORWARD, BACKWARD = "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward"
BATCH, LENGTH, HEADS, DIM = 2, 16, 4, 16
WIDTH = HEADS * DIM


@pytest.fixture
def cudnn_importable(monkeypatch):
    """Lowering for CUDA from CPU tensors asks cuDNN's frontend only whether it imports (it need not here)."""
    monkeypatch.setattr(cudnn, "unavailable", lambda: None)


def _mha_step(device="cpu"):
    tw.manual_seed(0)
    attn = tw.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True).to(device)

    def step(x):
        with tw.autocast(device, dtype=tw.bfloat16):
            y, _ = attn(x, x, x, need_weights=False)
        loss = y.float().square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in attn.parameters()]
        attn.zero_grad()
        return loss, *grads

    return step


def _gpt_step(device="cpu", returned=False):
    tw.manual_seed(0)
    proj = tw.nn.Linear(WIDTH, 3 * WIDTH).to(device)

    def step(x):
        with tw.autocast(device, dtype=tw.bfloat16):
            q, k, v = proj(x).split(WIDTH, dim=2)
            q, k, v = (t.view(BATCH, LENGTH, HEADS, DIM).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(BATCH, LENGTH, WIDTH)
        loss = y.float().square().mean()
        loss.backward()
        grad = proj.weight.grad.clone()
        proj.zero_grad()
        return (loss, grad, y) if returned else (loss, grad)

    return step


def _cuda_steps(step, x):
    """Each step of the lowered CUDA programs: a kernel's name, or a library call's operator and result shapes."""
    _, programs, _ = tw.compile(step).lowered(targets.get_target("cuda"), x)
    out = []
    for low in programs:
        for n in steps_of(low.fused):
            if n in low.kernels:
                out.append(low.kernels[n].name)
            else:
                types = n.type if isinstance(n.type, tuple) else (n.type,)
                out.append((n.op, *(t.shape for t in types if t is not None)))
    return out


def _copies(steps):
    """Kernels that only copy: a transposing copy, a concatenation."""
    return [s for s in steps if isinstance(s, str) and re.fullmatch(r"k\d+_(clone|cat)(_clone|_cat)*", s)]


def _calls(steps, name):
    return [s for s in steps if isinstance(s, tuple) and s[0] == name]


def test_multihead_attention_lowers_with_no_copy_around_cudnn(cudnn_importable):
    steps = _cuda_steps(_mha_step(), tw.randn(BATCH, LENGTH, WIDTH))
    forward, backward = _calls(steps, FORWARD + "_ordered"), _calls(steps, BACKWARD + "_packed")
    assert len(forward) == 1 and len(backward) == 1, steps
    # the output as the out-projection reads it, (L, N, heads, dim); the gradients joined as the projection's
    assert forward[0][1] == (LENGTH, BATCH, HEADS, DIM), forward
    assert backward[0][1:] == ((LENGTH, BATCH, 3, WIDTH),), backward
    assert not _copies(steps), steps
    assert not _calls(steps, "cat"), steps
    # one in-projection of the (L * N, E) tokens into 3E, as torch's packed projection
    projections = [s for s in _calls(steps, "addmm") if s[1] == (LENGTH * BATCH, 3 * WIDTH)]
    assert len(projections) == 1 and not [s for s in _calls(steps, "addmm") if s[1] == (LENGTH * BATCH, WIDTH)][1:]


def test_gpt_block_lowers_with_no_copy_around_cudnn(cudnn_importable):
    steps = _cuda_steps(_gpt_step(), tw.randn(BATCH, LENGTH, WIDTH))
    forward, backward = _calls(steps, FORWARD + "_ordered"), _calls(steps, BACKWARD + "_packed")
    assert len(forward) == 1 and len(backward) == 1, steps
    assert forward[0][1] == (BATCH, LENGTH, HEADS, DIM)
    assert backward[0][1:] == ((BATCH, LENGTH, 3 * WIDTH),)
    assert not _copies(steps), steps


def test_a_returned_output_keeps_its_own_copy(cudnn_importable):
    """The contiguous copy the caller gets back is not the attention's buffer itself dropped into place: it is
    returned, so it stays a value of its own."""
    steps = _cuda_steps(_gpt_step(returned=True), tw.randn(BATCH, LENGTH, WIDTH))
    assert _calls(steps, FORWARD + "_ordered")


@pytest.mark.parametrize("op", [FORWARD, BACKWARD])
def test_ordered_variants_are_the_operator_permuted(op):
    """Anywhere but cuDNN the variants are their operator and a transposing copy."""
    rng = np.random.default_rng(0)
    q, k, v, g = (tw.tensor(rng.standard_normal((2, 3, 5, 8)).astype(np.float32)) for _ in range(4))
    order = (2, 0, 1, 3)
    if op == FORWARD:
        expected = OPS[op](q, k, v, None, 0.3, True, False)
        got = OPS[op + "_ordered"](q, k, v, None, 0.3, True, False, list(order))
        pairs = [(got[0], expected[0].permute(*order)), (got[1], expected[1])]
    else:
        out, lse = OPS[FORWARD](q, k, v, None, 0.3, False, False)
        expected = OPS[op](g, q, k, v, None, 0.3, False, out, lse, False)
        got = OPS[op + "_ordered"](g, q, k, v, None, 0.3, False, out, lse, False, list(order), [0, 1, 2, 3],
                                   list(order))
        pairs = [(got[0], expected[0].permute(*order)), (got[1], expected[1]), (got[2], expected[2].permute(*order))]
    for ours, theirs in pairs:
        assert ours.is_contiguous() and tuple(ours.shape) == tuple(theirs.shape)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_packed_variant_is_the_gradients_joined():
    rng = np.random.default_rng(1)
    q, k, v, g = (tw.tensor(rng.standard_normal((2, 3, 5, 8)).astype(np.float32)) for _ in range(4))
    out, lse = OPS[FORWARD](q, k, v, None, 0.3, True, False)
    dq, dk, dv, _ = OPS[BACKWARD](g, q, k, v, None, 0.3, True, out, lse, False)
    order = [0, 2, 1, 3]
    got = OPS[BACKWARD + "_packed"](g, q, k, v, None, 0.3, True, out, lse, False, order, order, order, [2, 5, 24],
                                    [2, 5, 24], [2, 5, 24], 2)
    expected = tw.cat([t.transpose(1, 2).reshape(2, 5, 24) for t in (dq, dk, dv)], 2)
    assert tuple(got.shape) == (2, 5, 72) and got.is_contiguous()
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("model", ["mha", "gpt", "gpt-returned"])
def test_compiled_steps_through_ordered_attention_match_eager(model):
    if not tw.cuda.is_available():
        pytest.skip("no GPU")
    step = {"mha": lambda: _mha_step("cuda"), "gpt": lambda: _gpt_step("cuda"),
            "gpt-returned": lambda: _gpt_step("cuda", returned=True)}[model]()
    compiled = tw.compile(step)
    for seed in range(3):
        tw.manual_seed(seed + 1)
        x = tw.randn(BATCH, LENGTH, WIDTH, device="cuda")
        got, expected = compiled(x), step(x)
        for ours, theirs in zip(got, expected):
            assert tuple(ours.shape) == tuple(theirs.shape) and ours.stride() == theirs.stride()
            scale = max(float(theirs.float().abs().max().item()), 1e-6)
            ours, theirs = ours.detach(), theirs.detach()
            np.testing.assert_allclose(ours.float().cpu().numpy(), theirs.float().cpu().numpy(), rtol=2e-2,
                                       atol=2e-2 * scale)
    (program,) = compiled.programs()
    calls = [s.describe() for s in program.steps if "call" in s.describe()]
    assert any(f"{FORWARD}_ordered [into its buffer]" in c for c in calls), calls
    assert any(f"{BACKWARD}_packed [into its buffer]" in c for c in calls), calls
    assert len(program.runtime.graphs) == 1 and not program.runtime.why_not
