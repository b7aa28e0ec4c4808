"""scaled_dot_product_attention on a GPU: cuDNN's fused attention (bfloat16/float16) against torch's on CUDA,
forward and backward, eager and compiled, and the cases that run the decomposition instead.

Inputs are drawn in torch and copied into tilewise tensors, so both sides see the same values; torch's
flash/memory-efficient attention is the reference for low precision (both round the probabilities before
the second product, so the tolerances are those of two independent bf16/fp16 kernels), and torch's float32
math for the log-sum-exp.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from compiled_steps import qkv_attention_step

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.backends.cuda import attention as cudnn_attention
from tilewise.ops.registry import OPS

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")

TOL = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 2e-5, "float64": 1e-5}


def _tw(t: torch.Tensor, requires_grad: bool = False) -> tw.Tensor:
    x = tw.from_numpy(t.detach().float().cpu().numpy()).to(getattr(tw, str(t.dtype).split(".")[1])).cuda()
    return x.requires_grad_(requires_grad)


def _close(ours: tw.Tensor, theirs: torch.Tensor, dtype: str, what: str) -> None:
    a = ours.detach().float().cpu().numpy()
    b = theirs.detach().float().cpu().numpy()
    scale = max(float(np.abs(b).max()), 1e-3)
    np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype] * scale, err_msg=what)


def _qkv(shape_q, shape_kv, dtype: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    return [torch.randn(s, generator=g).to(dt).cuda() for s in (shape_q, shape_kv, shape_kv)]


def _built(shape, backward: bool) -> bool:
    """Whether a cuDNN graph was built for a query of ``shape`` (the fused path ran, not the decomposition)."""
    return any(key[0] is backward and key[-1][0][0] == tuple(shape) and graph is not None
               for key, graph in cudnn_attention._graphs.items())


def _compare(q, k, v, dtype: str, **kwargs) -> None:
    """Forward and backward of tilewise against torch on the same values (and the same upstream gradient)."""
    tq, tk, tv = (t.clone().requires_grad_(True) for t in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kwargs)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7)).to(expected.dtype).cuda()
    expected.backward(grad)
    wq, wk, wv = (_tw(t, True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(wq, wk, wv, **kwargs)
    assert out.dtype == getattr(tw, dtype) and tuple(out.shape) == tuple(expected.shape)
    _close(out, expected, dtype, "output")
    out.backward(_tw(grad))
    for name, ours, theirs in (("query", wq, tq), ("key", wk, tk), ("value", wv, tv)):
        assert ours.grad.dtype == ours.dtype
        _close(ours.grad, theirs.grad, dtype, f"grad of {name}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 128, 64), (1, 2, 100, 32), (3, 1, 17, 128), (1, 4, 256, 8)])
def test_fused_attention_matches_torch(dtype, causal, shape):
    q, k, v = _qkv(shape, shape, dtype)
    _compare(q, k, v, dtype, is_causal=causal)
    assert _built(shape, False) and _built(shape, True)


def test_later_calls_of_a_built_graph_bind_their_own_operands():
    """The first call of a graph goes through the frontend's execute, later ones through the graph it lowered
    to: each call must read its own inputs and write its own outputs."""
    shape = (2, 2, 192, 64)
    for seed in range(3):
        q, k, v = _qkv(shape, shape, "bfloat16", seed=20 + seed)
        _compare(q, k, v, "bfloat16", is_causal=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_causal_rectangular_and_scale(dtype):
    q, k, v = _qkv((2, 2, 48, 64), (2, 2, 80, 64), dtype, seed=1)
    _compare(q, k, v, dtype, is_causal=True, scale=0.3)
    q, k, v = _qkv((2, 2, 80, 64), (2, 2, 48, 64), dtype, seed=2)
    _compare(q, k, v, dtype, is_causal=True)


def test_the_fused_path_is_taken_and_its_log_sum_exp_is_the_decompositions():
    q, k, v = _qkv((2, 3, 64, 64), (2, 3, 64, 64), "bfloat16", seed=3)
    wq, wk, wv = (_tw(t) for t in (q, k, v))
    out, lse = OPS["_scaled_dot_product_attention_math"](wq, wk, wv, None, 0.125, True)
    assert _built((2, 3, 64, 64), False)
    assert lse.dtype == tw.float32 and tuple(lse.shape) == (2, 3, 64, 1)
    scores = (q.float() @ k.float().transpose(-2, -1)) * 0.125
    scores = scores.masked_fill(torch.ones(64, 64, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    np.testing.assert_allclose(lse.cpu().numpy(), torch.logsumexp(scores, -1, keepdim=True).cpu().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_per_head_views_of_a_fused_projection_need_no_copy():
    """The GPT layout: q, k, v are strided views of one [B, T, 3, H, D] projection, and the output gradient
    arrives transposed; cuDNN reads them all in place."""
    batch, length, heads, dim = 2, 96, 4, 64
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(batch, length, 3, heads, dim, generator=g).bfloat16().cuda()
    views = qkv.permute(2, 0, 3, 1, 4)
    q, k, v = views[0], views[1], views[2]
    wqkv = _tw(qkv)
    wviews = wqkv.permute(2, 0, 3, 1, 4)
    wq, wk, wv = wviews[0], wviews[1], wviews[2]
    assert all(cudnn_attention._fits(t) for t in (wq, wk, wv))
    out = F.scaled_dot_product_attention(wq, wk, wv, is_causal=True)
    _close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), "bfloat16", "output")


@pytest.mark.parametrize("case", ["float32", "mask", "head-dim-12", "float32-gqa"])
def test_what_cudnn_does_not_take_runs_the_decomposition(case):
    dtype = "float32" if case.startswith("float32") else "bfloat16"
    dim = 12 if case == "head-dim-12" else 32
    heads_kv = 2 if case == "float32-gqa" else 4
    q, k, v = _qkv((2, 4, 40, dim), (2, heads_kv, 40, dim), dtype, seed=5)
    kwargs = {"is_causal": True}
    if case == "mask":
        kwargs = {"attn_mask": torch.rand(40, 40, generator=torch.Generator().manual_seed(6)).cuda() > 0.3}
    if case == "float32-gqa":
        kwargs["enable_gqa"] = True
    if "attn_mask" in kwargs:
        tq, tk, tv = (t.clone().requires_grad_(True) for t in (q, k, v))
        expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kwargs)
        wq, wk, wv = (_tw(t, True) for t in (q, k, v))
        mask = tw.from_numpy(kwargs["attn_mask"].cpu().numpy()).cuda()
        out = F.scaled_dot_product_attention(wq, wk, wv, attn_mask=mask)
        _close(out, expected, dtype, "output")
        return
    _compare(q, k, v, dtype, **kwargs)


def _built_grouped(query_shape, key_shape, value_shape) -> bool:
    """Whether cuDNN graphs were built, forward and backward, for these operands as they are (no repeat)."""
    def built(backward):
        return any(key[0] is backward and tuple(s for s, _ in key[-1][:3]) == (query_shape, key_shape, value_shape)
                   and graph is not None for key, graph in cudnn_attention._graphs.items())

    return built(False) and built(True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("heads", "key_heads", "value_heads", "causal"), [
    (12, 4, 4, True), (8, 1, 1, False), (8, 2, 4, True), (6, 3, 3, False)])
def test_grouped_query_attention_runs_cudnn_on_the_key_value_heads(dtype, heads, key_heads, value_heads, causal):
    """enable_gqa: cuDNN reads key and value with their own head counts and returns their gradients in them."""
    length, dim = 128, 64
    q, k, _ = _qkv((2, heads, length, dim), (2, key_heads, length, dim), dtype, seed=11)
    _, _, v = _qkv((2, heads, length, dim), (2, value_heads, length, dim), dtype, seed=12)
    _compare(q, k, v, dtype, is_causal=causal, enable_gqa=True)
    assert _built_grouped((2, heads, length, dim), (2, key_heads, length, dim), (2, value_heads, length, dim))


@pytest.mark.parametrize("how", ["repeat_interleave", "expand-reshape"])
def test_compiled_head_repeat_runs_grouped_cudnn_attention(how):
    """A Llama-style layer repeating its key/value heads: compiled, cuDNN reads the un-repeated tensors (no copy
    kernel writes the repeated heads), and loss and gradients match eager (which runs the repeat as written)."""
    batch, length, heads, kv_heads, dim = 2, 128, 8, 2, 64
    groups = heads // kv_heads
    tw.manual_seed(0)
    wq = tw.nn.Linear(heads * dim, heads * dim, bias=False).cuda()
    wkv = tw.nn.Linear(heads * dim, 2 * kv_heads * dim, bias=False).cuda()

    def repeat(x):
        if how == "repeat_interleave":
            return x.repeat_interleave(groups, dim=1)
        return x[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, heads, length, dim)

    def step(x):
        with tw.autocast("cuda", dtype=tw.bfloat16):
            q = wq(x).view(batch, length, heads, dim).transpose(1, 2)
            k, v = wkv(x).view(batch, length, 2, kv_heads, dim).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, repeat(k.float() * 1.5), repeat(v), is_causal=True)
        loss = y.float().square().mean()
        loss.backward()
        grads = [w.weight.grad.clone() for w in (wq, wkv)]
        wq.zero_grad()
        wkv.zero_grad()
        return loss, *grads

    compiled = tw.compile(step)
    for seed in range(2):
        tw.manual_seed(seed + 1)
        x = tw.randn(batch, length, heads * dim, device="cuda")
        got, expected = compiled(x), step(x)
        np.testing.assert_allclose(float(got[0].item()), float(expected[0].item()), rtol=2e-2)
        for ours, theirs in zip(got[1:], expected[1:]):
            scale = float(theirs.float().abs().max().item())
            np.testing.assert_allclose(ours.float().cpu().numpy(), theirs.float().cpu().numpy(), rtol=5e-2,
                                       atol=3e-2 * scale)
    (program,) = compiled.programs()
    calls = [s.describe() for s in program.steps if "call" in s.describe()]
    assert any(re.search(r"_scaled_dot_product_attention_math(_ordered)? \[into its buffer\]", c) for c in calls), calls
    assert any("_scaled_dot_product_attention_backward_ordered [into its buffer]" in c for c in calls), calls
    assert _built_grouped((batch, heads, length, dim), (batch, kv_heads, length, dim), (batch, kv_heads, length, dim))
    final = program.passes[-1][1]  # the graph fusion started from
    assert not [n for n in final.body if n.op == "expand" and len(n.type.shape) == 5]
    gqa = {"_scaled_dot_product_attention_math": -1, "_scaled_dot_product_attention_math_ordered": -2,
           "_scaled_dot_product_attention_backward": -1, "_scaled_dot_product_attention_backward_ordered": -4}
    assert all(n.args[gqa[n.op]] is True for n in final.body if n.op.startswith("_scaled_dot_product_attention"))


def test_double_backward_runs_the_decomposition():
    q, k, v = _qkv((1, 2, 16, 16), (1, 2, 16, 16), "float16", seed=8)
    tq, tk, tv = (t.float().clone().requires_grad_(True) for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (gq,) = torch.autograd.grad(out.square().sum(), tq, create_graph=True)
    gq.sum().backward()
    wq, wk, wv = (_tw(t, True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(wq, wk, wv, is_causal=True)
    (wgq,) = tw.autograd.grad(out.float().square().sum(), wq, create_graph=True)
    wgq.float().sum().backward()
    np.testing.assert_allclose(wgq.float().detach().cpu().numpy(), gq.detach().cpu().numpy(), rtol=5e-2, atol=5e-2)
    scale = float(tk.grad.abs().max())
    np.testing.assert_allclose(wk.grad.float().cpu().numpy(), tk.grad.cpu().numpy(), rtol=5e-2, atol=5e-2 * scale)


def test_compiled_attention_step_is_one_cudnn_call_each_way_inside_a_cuda_graph():
    """A compiled forward + backward keeps attention whole (not decomposed) and replays it from a CUDA graph."""
    batch, length, heads, dim = 2, 64, 2, 64
    width = heads * dim
    tw.manual_seed(0)
    proj = tw.nn.Linear(width, 3 * width).cuda().bfloat16()

    step = qkv_attention_step(tw, proj, batch, length, heads, dim)

    compiled = tw.compile(step)
    for seed in range(3):
        tw.manual_seed(seed + 1)
        x = tw.randn(batch, length, width, device="cuda").bfloat16()
        loss, grad = compiled(x)
        eager_loss, eager_grad = step(x)
        np.testing.assert_allclose(float(loss.item()), float(eager_loss.item()), rtol=2e-2)
        scale = float(eager_grad.float().abs().max().item())
        np.testing.assert_allclose(grad.float().cpu().numpy(), eager_grad.float().cpu().numpy(), rtol=5e-2,
                                   atol=3e-2 * scale)
    (program,) = compiled.programs()
    calls = [s.describe() for s in program.steps if "call" in s.describe()]
    assert any(re.search(r"_scaled_dot_product_attention_math(_ordered)? \[into its buffer\]", c) for c in calls), calls
    assert any(re.search(r"_scaled_dot_product_attention_backward(_ordered)? \[into its buffer\]", c) for c in calls), \
        calls
    assert len(program.runtime.graphs) == 1 and not program.runtime.why_not


def test_attention_benchmark_shape_runs_fused():
    """B8 H12 T1024 D64 causal, the benchmark's case, forward and backward against torch."""
    q, k, v = _qkv((8, 12, 1024, 64), (8, 12, 1024, 64), "bfloat16", seed=9)
    _compare(q, k, v, "bfloat16", is_causal=True)
    assert _built((8, 12, 1024, 64), False) and _built((8, 12, 1024, 64), True)


def _layouts(shape, dtype: str):
    """Queries of ``shape`` (B, H, L, E) in the memory orders models make: contiguous, (B, L, H, E) storage, (L, B,
    H, E) storage, and head-split slices of packed (B, L, 3E) and (L, B, 3, E) projections."""
    b, h, length, e = shape
    dt = getattr(torch, dtype)
    yield "contiguous", torch.randn(b, h, length, e, dtype=dt, device="cuda")
    yield "BLHD", torch.randn(b, length, h, e, dtype=dt, device="cuda").transpose(1, 2)
    yield "LBHD", torch.randn(length, b, h, e, dtype=dt, device="cuda").permute(1, 2, 0, 3)
    packed = torch.randn(b, length, 3 * h * e, dtype=dt, device="cuda")
    yield "packed-BL3E", packed[..., : h * e].unflatten(-1, (h, e)).transpose(1, 2)
    packed = torch.randn(length, b, 3, h * e, dtype=dt, device="cuda")
    yield "packed-LB3E", packed.select(2, 1).unflatten(-1, (h, e)).permute(1, 2, 0, 3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("head_dim", [64, 20, 256])
@pytest.mark.parametrize("extra", ["none", "causal", "bool-mask", "dropout"])
def test_output_is_laid_out_as_torch_lays_it_out(dtype, head_dim, extra):
    """[Note: attention's output layout] on CUDA: the output's strides are torch's for every memory order of
    the query, so ``.transpose(1, 2).view(B, L, H * E)`` works (and fails) where it does in torch."""
    length = 16
    kwargs = {"none": {}, "causal": {"is_causal": True}, "dropout": {"dropout_p": 0.25},
              "bool-mask": {"attn_mask": torch.ones(length, length, dtype=torch.bool, device="cuda").tril()}}[extra]
    for name, q in _layouts((2, 3, length, head_dim), dtype):
        expected = torch.nn.functional.scaled_dot_product_attention(q, q, q, **kwargs)
        ours = _tw_strided(q)
        ours_kwargs = {k: _tw(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        out = F.scaled_dot_product_attention(ours, ours, ours, **ours_kwargs)
        assert out.stride() == expected.stride(), (name, ours.stride(), out.stride(), expected.stride())
        if extra != "dropout":
            _close(out, expected, dtype, name)


def _tw_strided(t: torch.Tensor) -> tw.Tensor:
    """``t`` on the GPU with its strides: the same storage layout, copied through the storage it views."""
    base = t
    while base._base is not None:
        base = base._base
    storage = _tw(base.contiguous())
    return storage.as_strided(tuple(t.shape), t.stride(), t.storage_offset() - base.storage_offset())
