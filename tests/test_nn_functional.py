"""Behaviour of tilewise.nn.functional beyond the op table: dropout's random masks, batch/instance norm's running
statistics, second derivatives through the explicit formulas, and numerically delicate inputs, against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tilewise as tw
import tilewise.nn.functional as F


def pair(array: np.ndarray, requires_grad: bool = False):
    a = tw.from_numpy(array.copy())
    b = torch.from_numpy(array.copy())
    if requires_grad:
        a.requires_grad_(True)
        b.requires_grad_(True)
    return a, b


def close(actual, expected, rtol=1e-6, atol=1e-7):
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    np.testing.assert_allclose(actual.detach().numpy(), expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------- dropout

def test_dropout_identity_when_p_is_zero_or_eval():
    x = tw.randn(3, 4)
    assert F.dropout(x, 0.0) is x
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout2d(tw.randn(2, 3, 4, 4), 0.5, training=False).shape == (2, 3, 4, 4)


def test_dropout_mask_statistics_and_scaling():
    tw.manual_seed(0)
    p, n = 0.3, 200_000
    y = F.dropout(tw.ones(n), p).numpy()
    kept = y != 0
    assert abs((1 - kept.mean()) - p) < 0.005  # the drop rate's std here is about 0.001
    np.testing.assert_array_equal(y[kept], np.float32(1) / np.float32(1 - p))


def test_dropout_gradient_is_the_scaled_mask():
    tw.manual_seed(1)
    x = tw.randn(1000, requires_grad=True)
    y = F.dropout(x, 0.5)
    y.backward(tw.ones(1000))
    mask = (y.detach().numpy() != 0).astype(np.float32)
    np.testing.assert_array_equal(x.grad.numpy(), mask * 2.0)


def test_dropout_is_reproducible_from_the_seed():
    tw.manual_seed(7)
    a = F.dropout(tw.ones(64), 0.5).numpy()
    b = F.dropout(tw.ones(64), 0.5).numpy()
    tw.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(tw.ones(64), 0.5).numpy(), a)
    assert not np.array_equal(a, b)


def test_dropout_p_one_and_inplace():
    np.testing.assert_array_equal(F.dropout(tw.ones(5), 1.0).numpy(), np.zeros(5, np.float32))
    x = tw.ones(100)
    assert F.dropout(x, 0.5, inplace=True) is x
    assert set(np.unique(x.numpy())) <= {0.0, 2.0}


def test_dropout2d_drops_whole_channels():
    tw.manual_seed(3)
    y = F.dropout2d(tw.ones(4, 50, 3, 3), 0.4).numpy().reshape(200, 9)
    assert all(len(set(row)) == 1 for row in y)
    assert set(np.unique(y)) == {0.0, np.float32(1) / np.float32(0.6)}


def test_attention_dropout_is_seeded_and_differentiable():
    q = tw.randn(2, 4, 8, requires_grad=True)
    tw.manual_seed(11)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    tw.manual_seed(11)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    a.sum().backward()
    assert np.isfinite(q.grad.numpy()).all()


# ---------------------------------------------------------------------------- running statistics

def test_batch_norm_updates_running_stats_like_torch():
    rng = np.random.default_rng(0)
    x, tx = pair(rng.standard_normal((8, 3, 4, 5)))
    rm, trm = pair(rng.standard_normal(3))
    rv, trv = pair(rng.uniform(0.5, 2.0, 3))
    versions = rm._version, trm._version
    close(F.batch_norm(x, rm, rv, training=True, momentum=0.2), TF.batch_norm(tx, trm, trv, training=True,
                                                                               momentum=0.2))
    close(rm, trm)
    close(rv, trv)
    # updated in place without a version bump, as torch's kernel does (a second forward before backward is fine)
    assert (rm._version, trm._version) == versions
    before = rm.numpy().copy()
    close(F.batch_norm(x, rm, rv, training=False), TF.batch_norm(tx, trm, trv, training=False))
    np.testing.assert_array_equal(rm.numpy(), before)


def test_batch_norm_running_stats_get_no_gradient_history():
    rm, rv = tw.zeros(3), tw.ones(3)
    x = tw.randn(4, 3, requires_grad=True)
    F.batch_norm(x, rm, rv, training=True).sum().backward()
    assert rm.grad_fn is None and not rm.requires_grad and x.grad is not None


def test_instance_norm_updates_running_stats_like_torch():
    rng = np.random.default_rng(1)
    x, tx = pair(rng.standard_normal((2, 3, 6)))
    rm, trm = pair(np.zeros(3))
    rv, trv = pair(np.ones(3))
    close(F.instance_norm(x, rm, rv, momentum=0.3), TF.instance_norm(tx, trm, trv, momentum=0.3))
    close(rm, trm)
    close(rv, trv)


def test_embedding_max_norm_renormalizes_rows_in_place_like_torch():
    rng = np.random.default_rng(2)
    w, tw_ = pair(rng.uniform(-3, 3, (6, 4)))
    idx = np.array([[0, 2], [2, 5]])
    out = F.embedding(tw.from_numpy(idx), w, max_norm=1.5)
    expected = TF.embedding(torch.from_numpy(idx), tw_, max_norm=1.5)
    close(out, expected)
    close(w, tw_)


# ---------------------------------------------------------------------------- second derivatives

def _second_derivative_matches(fn_tw, fn_torch, *arrays):
    tws, ths = zip(*(pair(a, requires_grad=True) for a in arrays))
    first_tw = tw.autograd.grad(fn_tw(*tws).sum(), tws, create_graph=True)
    first_th = torch.autograd.grad(fn_torch(*ths).sum(), ths, create_graph=True)
    second_tw = tw.autograd.grad(sum((g * g).sum() for g in first_tw), tws)
    second_th = torch.autograd.grad(sum((g * g).sum() for g in first_th), ths)
    for a, b in zip(second_tw, second_th):
        close(a, b, rtol=1e-7, atol=1e-9)


SECOND_ORDER = {
    "layer_norm": (lambda nnf: lambda x, w: nnf.layer_norm(x, (5,), w) ** 2, [(3, 5), (5,)]),
    "rms_norm": (lambda nnf: lambda x, w: nnf.rms_norm(x, (5,), w) ** 3, [(3, 5), (5,)]),
    "batch_norm": (lambda nnf: lambda x: nnf.batch_norm(x, None, None, training=True) ** 3, [(4, 3)]),
    "group_norm": (lambda nnf: lambda x: nnf.group_norm(x, 2) ** 3, [(2, 4, 3)]),
    "cross_entropy": (lambda nnf: lambda x: nnf.cross_entropy(x, (torch if nnf is TF else tw).tensor([1, 2, 0]),
                                                            label_smoothing=0.1), [(3, 5)]),
    "attention": (lambda nnf: lambda q, k, v: nnf.scaled_dot_product_attention(q, k, v) ** 2,
                  [(2, 3, 4), (2, 5, 4), (2, 5, 3)]),
    "max_pool2d": (lambda nnf: lambda x: nnf.max_pool2d(x, 3, 2, 1, ceil_mode=True) ** 2, [(2, 3, 7, 6)]),
    "avg_pool2d": (lambda nnf: lambda x: nnf.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False) ** 2,
                   [(2, 3, 7, 6)]),
    "adaptive_avg_pool2d": (lambda nnf: lambda x: nnf.adaptive_avg_pool2d(x, (3, 2)) ** 2, [(2, 3, 7, 5)]),
}


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_derivatives_match_torch(name):
    build, shapes = SECOND_ORDER[name]
    rng = np.random.default_rng(3)
    _second_derivative_matches(build(F), build(TF), *(rng.standard_normal(s) for s in shapes))


# ---------------------------------------------------------------------------- delicate inputs

def test_cross_entropy_with_minus_inf_logits_stays_finite():
    logits = np.array([[0.5, -np.inf, 1.0], [-np.inf, 2.0, 0.1]])
    x, tx = pair(logits, requires_grad=True)
    target = np.array([0, 1])
    loss = F.cross_entropy(x, tw.from_numpy(target))
    expected = TF.cross_entropy(tx, torch.from_numpy(target))
    close(loss, expected)
    loss.backward()
    expected.backward()
    close(x.grad, tx.grad)


def test_attention_fully_masked_rows_give_zeros_like_torch():
    rng = np.random.default_rng(4)
    (q, tq), (k, tk), (v, tv) = (pair(rng.standard_normal(s), True) for s in ((3, 4), (5, 4), (5, 2)))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=tw.from_numpy(mask))
    expected = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(mask))
    close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for a, b in ((q, tq), (k, tk), (v, tv)):
        close(a.grad, b.grad)


ATTENTION_LAYOUTS = {  # name: (query layout, keyword arguments); "heads-last": (B, L, H, E) storage, transposed
    "contiguous": ("contiguous", {}),
    "heads-last": ("heads-last", {}),
    "heads-last-causal": ("heads-last", {"is_causal": True}),
    "heads-last-bool-mask": ("heads-last", {"attn_mask": np.tril(np.ones((5, 5), dtype=bool))}),
    "heads-last-padding-mask": ("heads-last", {"attn_mask": np.ones((3, 1, 1, 5), dtype=bool)}),
    "heads-last-3d-mask": ("heads-last", {"attn_mask": np.ones((1, 5, 5), dtype=bool)}),
    "heads-last-dropout": ("heads-last", {"dropout_p": 0.5}),
    "fused-qkv": ("fused-qkv", {"is_causal": True}),
    "last-dim-strided": ("last-dim-strided", {}),
    "three-dims": ("three-dims", {}),
}


def _attention_query(lib, layout: str):
    rng = np.random.default_rng(6)
    if layout == "contiguous":
        return lib.tensor(rng.standard_normal((3, 2, 5, 4), dtype=np.float32))
    if layout == "heads-last":
        return lib.tensor(rng.standard_normal((3, 5, 2, 4), dtype=np.float32)).transpose(1, 2)
    if layout == "fused-qkv":  # nanoGPT's: a third of a (B, T, 3C) projection, split into heads
        return lib.tensor(rng.standard_normal((3, 5, 24), dtype=np.float32))[..., :8].view(3, 5, 2, 4).transpose(1, 2)
    if layout == "last-dim-strided":
        return lib.tensor(rng.standard_normal((3, 2, 4, 5), dtype=np.float32)).transpose(-1, -2)
    return lib.tensor(rng.standard_normal((2, 5, 4), dtype=np.float32))


@pytest.mark.parametrize("name", ATTENTION_LAYOUTS)
def test_attention_output_is_laid_out_as_torchs_cpu_kernels_lay_it(name):
    """torch's CPU flash kernel lays its output out as the query, its math kernel contiguously: after a head
    split of (B, T, C), ``out.transpose(1, 2).view(B, T, C)`` works exactly where torch's does."""
    layout, kwargs = ATTENTION_LAYOUTS[name]

    def run(lib, functional):
        q = _attention_query(lib, layout)
        extra = {k: lib.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        return functional.scaled_dot_product_attention(q, q, q, **extra)

    out, expected = run(tw, F), run(torch, TF)
    assert out.stride() == expected.stride()
    if "dropout_p" not in kwargs:
        close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["layer_norm", "attention", "cross_entropy", "conv2d"])
def test_half_precision_computes_in_float32_like_torch(name):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float16)
    a, b = pair(x)
    if name == "layer_norm":
        out, expected = F.layer_norm(a, (4,)), TF.layer_norm(b, (4,))
    elif name == "attention":
        out, expected = F.scaled_dot_product_attention(a, a, a), TF.scaled_dot_product_attention(b, b, b)
    elif name == "cross_entropy":
        target = rng.integers(0, 3, (2, 4, 4))
        out = F.cross_entropy(a, tw.from_numpy(target))
        expected = TF.cross_entropy(b, torch.from_numpy(target))
    else:
        w = rng.standard_normal((2, 3, 3, 3)).astype(np.float16)
        out, expected = F.conv2d(a, tw.from_numpy(w)), TF.conv2d(b, torch.from_numpy(w))
    assert out.dtype is tw.float16
    close(out.float(), expected.float(), rtol=2e-3, atol=2e-3)


def test_convolution_output_is_contiguous():
    out = F.conv2d(tw.randn(2, 3, 6, 6), tw.randn(4, 3, 3, 3), padding=1)
    assert out.is_contiguous()
    assert out.view(2, -1).shape == (2, 144)
