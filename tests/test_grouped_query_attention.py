"""Grouped-query attention: ``scaled_dot_product_attention(..., enable_gqa=True)`` against torch, forward and
backward, and compiled programs whose model repeats the key/value heads itself (``repeat_interleave``, or
``expand`` + ``reshape``): their results against eager, and the CUDA lowering (made here without a GPU), where
the repeat is gone and cuDNN's attention takes the key/value heads as they are."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.backends.cuda import attention as cuda_attention
from tilewise.backends.cuda import cudnn
from tilewise.compiler import targets
from tilewise.compiler.ir import format_graph
from tilewise.compiler.lowering.memory import steps_of
from tilewise.compiler.passes import decompose
from tilewise.compiler.passes.attention import BACKWARD, FORWARD, grouped_query_attention

BATCH, HEADS, GROUPS, LENGTH, DIM = 2, 4, 2, 8, 16
KV_HEADS = HEADS // GROUPS


def _arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _attention(lib, arrays, dtype, grad, **kwargs):
    """Output and gradients of query, key and value (upstream gradient ``grad``) as float32 numpy arrays."""
    q, k, v = (lib.tensor(a).to(getattr(lib, dtype)).requires_grad_(True) for a in arrays)
    out = lib.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    out.backward(lib.tensor(grad).to(out.dtype))
    return [t.detach().float().numpy() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("query", "key", "value", "kwargs"), [
    ((2, 6, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8), {"is_causal": True}),
    ((2, 6, 5, 8), (2, 3, 7, 8), (2, 1, 7, 4), {}),
    ((1, 4, 3, 8), (2, 2, 1, 6, 8), (2, 2, 1, 6, 8), {"scale": 0.4}),
    ((4, 3, 8), (1, 3, 8), (2, 3, 8), {"is_causal": True}),
])
def test_enable_gqa_matches_torch(dtype, query, key, value, kwargs):
    """Key and value heads each divide the query's, and may differ from each other; leading dims broadcast."""
    arrays, grad = _arrays(query, key, value), _grad_for(query, key, value)
    expected = _attention(torch, arrays, dtype, grad, enable_gqa=True, **kwargs)
    got = _attention(tw, arrays, dtype, grad, enable_gqa=True, **kwargs)
    tol = 1e-5 if dtype == "float32" else 3e-2
    for name, ours, theirs in zip(("output", "query grad", "key grad", "value grad"), got, expected):
        assert ours.shape == theirs.shape, name
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol * max(1.0, np.abs(theirs).max()), err_msg=name)


def _grad_for(query, key, value):
    out = torch.nn.functional.scaled_dot_product_attention(torch.zeros(query), torch.zeros(key), torch.zeros(value),
                                                           enable_gqa=True)
    return _arrays(tuple(out.shape), seed=1)[0]


def test_enable_gqa_is_the_repeat_written_out_bit_for_bit():
    """Where attention runs its decomposition, grouping the heads inside it gives exactly what repeating them
    before it gave (bfloat16: each repeated head's gradient rounded, then summed per group)."""
    arrays = _arrays((2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8))
    grad = _arrays((2, 4, 6, 8), seed=3)[0]
    grouped = _attention(tw, arrays, "bfloat16", grad, enable_gqa=True, is_causal=True)
    q, k, v = (tw.tensor(a).bfloat16().requires_grad_(True) for a in arrays)
    out = tw.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                        is_causal=True)
    out.backward(tw.tensor(grad).bfloat16())
    for ours, written in zip(grouped, (out, q.grad, k.grad, v.grad)):
        np.testing.assert_array_equal(ours, written.detach().float().numpy())


# ---------------------------------------------------------------------------- compiled head repeats

def _repeat(x, how):
    if how == "repeat_interleave":
        return x.repeat_interleave(GROUPS, dim=1)
    if how == "expand-reshape":  # Hugging Face's repeat_kv
        return x[:, :, None, :, :].expand(BATCH, KV_HEADS, GROUPS, LENGTH, DIM).reshape(BATCH, HEADS, LENGTH, DIM)
    assert how == "tile"  # k.repeat: heads in another order, not a grouping
    return x.repeat(1, GROUPS, 1, 1)


def _layer(how, autocast, enable_gqa=False):
    """A step of a grouped-query attention layer (RoPE-like float32 arithmetic on the key under autocast, as the
    Llama benchmark has it), forward and backward; returns the loss, the output and the weights' gradients."""
    tw.manual_seed(0)
    wq = tw.randn(HEADS * DIM, HEADS * DIM, requires_grad=True)
    wk = tw.randn(KV_HEADS * DIM, HEADS * DIM, requires_grad=True)
    wv = tw.randn(KV_HEADS * DIM, HEADS * DIM, requires_grad=True)
    rotation = tw.randn(LENGTH, DIM)

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16, enabled=autocast):
            q = (x @ wq.T).view(BATCH, LENGTH, HEADS, DIM).transpose(1, 2)
            k = (x @ wk.T).view(BATCH, LENGTH, KV_HEADS, DIM).transpose(1, 2) * rotation
            v = (x @ wv.T).view(BATCH, LENGTH, KV_HEADS, DIM).transpose(1, 2)
            if not enable_gqa:
                k, v = _repeat(k, how), _repeat(v, how)
            y = tw.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
        loss = y.float().square().mean()
        loss.backward()
        grads = [w.grad.clone() for w in (wq, wk, wv)]
        for w in (wq, wk, wv):
            w.grad = None
        return loss, y, *grads

    return step


def _x():
    tw.manual_seed(1)
    return tw.randn(BATCH, LENGTH, HEADS * DIM)


def _assert_close(got, expected, tol):
    for ours, theirs in zip(got, expected):
        a, b = ours.detach().float().numpy(), theirs.detach().float().numpy()
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


@pytest.fixture
def c_target_keeping_attention(monkeypatch):
    """The C target with attention kept whole (run by the CPU backend: its decomposition) and head repeats
    handed to it as grouped-query attention, as the CUDA target does for cuDNN: the rewrite's numbers on a CPU."""
    def keep_attention(graph):
        return decompose(graph, lambda op, args: op in (FORWARD, BACKWARD))

    def grouped(graph):
        return grouped_query_attention(graph, lambda op, args: True)

    keep_attention.__name__, grouped.__name__ = "decompose", "grouped_query_attention"
    passes = []
    for p in targets.C_TARGET.passes:
        passes += [keep_attention, grouped] if p.__name__ == "decompose" else [p]
    target = dataclasses.replace(targets.C_TARGET, passes=tuple(passes))
    monkeypatch.setitem(targets.TARGETS, "c", target)
    return target


def _final_graph(step, target):
    _, _, history = tw.compile(step).lowered(target, _x())
    return history[-1][1]


def _attention_calls(graph):
    return [n for n in graph.body if n.op in (FORWARD, BACKWARD)]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("how", ["repeat_interleave", "expand-reshape", "tile"])
def test_compiled_head_repeats_match_eager_on_the_c_target(how, autocast):
    """The C target decomposes attention: its graph keeps the repeat, and the step gives eager's numbers."""
    step = _layer(how, autocast)
    _assert_close(tw.compile(step)(_x()), step(_x()), 1e-4 if not autocast else 2e-2)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("how", ["repeat_interleave", "expand-reshape"])
def test_head_repeats_become_grouped_attention_with_eagers_numbers(c_target_keeping_attention, how, autocast):
    """With attention kept whole, the repeat's source goes to attention with enable_gqa, forward and backward,
    and the gradients still match eager's (bfloat16: summed per group before rounding, within its tolerance)."""
    step = _layer(how, autocast)
    calls = _attention_calls(_final_graph(step, c_target_keeping_attention))
    assert [n.op for n in calls] == [FORWARD, BACKWARD]
    for call in calls:
        key, value = call.srcs[1:3] if call.op == FORWARD else call.srcs[2:4]
        assert call.args[-1] is True and key.type.shape[1] == value.type.shape[1] == KV_HEADS, format_graph(
            _final_graph(step, c_target_keeping_attention))
    _assert_close(tw.compile(step)(_x()), step(_x()), 1e-4 if not autocast else 2e-2)


def test_a_tiling_repeat_is_not_a_grouping(c_target_keeping_attention):
    """``k.repeat(1, g, 1, 1)`` puts head ``h`` at ``h % h_kv``, not ``h // g``: attention keeps the copy."""
    calls = _attention_calls(_final_graph(_layer("tile", False), c_target_keeping_attention))
    assert calls and all(c.args[-1] is False and c.srcs[2 if c.op == FORWARD else 3].type.shape[1] == HEADS
                         for c in calls)


def test_a_repeated_key_gradient_read_elsewhere_keeps_the_backward_as_it_is(c_target_keeping_attention):
    """When the repeated key's gradient has another part (the loss reads the repeated key too), the backward's
    key gradient must stay per query head: only the forward is grouped, and the numbers are eager's."""
    tw.manual_seed(0)
    w = tw.randn(KV_HEADS * DIM, HEADS * DIM, requires_grad=True)

    def step(x):
        q = x.view(BATCH, LENGTH, HEADS, DIM).transpose(1, 2)
        k = (x @ w.T).view(BATCH, LENGTH, KV_HEADS, DIM).transpose(1, 2).repeat_interleave(GROUPS, 1)
        y = tw.nn.functional.scaled_dot_product_attention(q, k, k * 0.5, is_causal=True)
        loss = y.square().mean() + k.sin().mean()
        loss.backward()
        grad = w.grad.clone()
        w.grad = None
        return loss, grad

    calls = _attention_calls(_final_graph(step, c_target_keeping_attention))
    assert [(c.op, c.args[-1]) for c in calls] == [(FORWARD, True), (BACKWARD, False)]
    _assert_close(tw.compile(step)(_x()), step(_x()), 1e-4)


# ---------------------------------------------------------------------------- the CUDA lowering

@pytest.fixture
def cudnn_importable(monkeypatch):
    """Lowering for CUDA from CPU tensors asks cuDNN's frontend only whether it imports (it need not here)."""
    monkeypatch.setattr(cudnn, "unavailable", lambda: None)


def _cuda_steps(step):
    """Each step of the step's lowered CUDA programs: a kernel's name, or a library call's operator with the
    shapes of its tensor operands."""
    _, programs, _ = tw.compile(step).lowered(targets.get_target("cuda"), _x())
    out = []
    for low in programs:
        for n in steps_of(low.fused):
            out.append(low.kernels[n].name if n in low.kernels else (n.op, *(s.type.shape for s in n.srcs)))
    return out


@pytest.mark.parametrize("how", ["repeat_interleave", "expand-reshape"])
def test_cuda_lowering_passes_cudnn_the_key_value_heads_with_no_repeat_copy(cudnn_importable, how):
    """The model's repeat lowers to exactly the program of ``enable_gqa=True`` on the un-repeated tensors: no
    copy kernel, and cuDNN's forward and backward read key and value with their own head count."""
    repeated = _cuda_steps(_layer(how, True))
    grouped = _cuda_steps(_layer(how, True, enable_gqa=True))
    assert repeated == grouped
    # written in the order their readers permute them to (see [Note: attention written in a given order])
    calls = [s for s in repeated if isinstance(s, tuple) and s[0].removesuffix("_ordered") in (FORWARD, BACKWARD)]
    assert [c[0] for c in calls] == [FORWARD + "_ordered", BACKWARD + "_ordered"], repeated
    kv = (BATCH, KV_HEADS, LENGTH, DIM)
    assert calls[0][2:4] == (kv, kv) and calls[1][3:5] == (kv, kv), calls
    assert not any(isinstance(s, tuple) and (BATCH, KV_HEADS, GROUPS, LENGTH, DIM) in s[1:] for s in repeated)


def test_cuda_lowering_keeps_the_repeat_where_cudnn_would_not_take_the_grouped_call(cudnn_importable):
    """float32 attention is not cuDNN's: it decomposes on CUDA too, repeat included (no grouped call is left)."""
    _, _, history = tw.compile(_layer("repeat_interleave", False)).lowered(targets.get_target("cuda"), _x())
    assert not _attention_calls(history[-1][1])
    assert cuda_attention.unsupported(tw.float32, (2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16), False, tw.device("cpu"),
                                      True) is not None


def test_cuda_accepts_the_head_counts_torch_accepts():
    cpu = tw.device("cpu")

    def reason(key_heads, value_heads, enable_gqa=True):
        return cuda_attention.unsupported(tw.bfloat16, (2, 8, 64, 64), (2, key_heads, 64, 64),
                                          (2, value_heads, 64, 64), False, cpu, enable_gqa)

    cudnn_missing = cudnn.unavailable()
    assert reason(2, 2) == cudnn_missing and reason(1, 4) == cudnn_missing and reason(8, 8) == cudnn_missing
    assert "head dims differ" in reason(3, 3) and "head dims differ" in reason(2, 2, enable_gqa=False)


def test_every_layer_of_the_llama_benchmark_model_lowers_to_grouped_attention(cudnn_importable):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from models import llama
    finally:
        sys.path.pop(0)
    config = llama.LlamaConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, hidden=96)
    tw.manual_seed(0)
    model = llama.Llama(config)
    idx = tw.randint(0, 64, (2, 16))

    def step(idx, targets):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = model(idx, targets)
        loss.backward()
        return loss

    _, _, history = tw.compile(step).lowered(targets.get_target("cuda"), idx, idx)
    calls = _attention_calls(history[-1][1])
    assert [c.op for c in calls].count(FORWARD) == 2 and [c.op for c in calls].count(BACKWARD) == 2
    assert all(c.args[-1] is True for c in calls)
    assert not [n for n in history[-1][1].body if n.op == "expand" and len(n.type.shape) == 5]
