"""Concatenations computed by the kernels that read them: compiled results against eager and torch, and the
structure of what a cat along an inner dim lowers to (no copy step of its own, pointwise inputs made in place)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.codegen.kernel_ir import Index, Load, Nest, Store
from tilewise.codegen.schedule import coalesce, vector_width
from tilewise.compiler.lowering.memory import steps_of
from tilewise.compiler.targets import get_target
from tilewise.dtypes import bfloat16, float32


def _both(fn, arrays, grad=False):
    """``fn`` compiled by tilewise, eager tilewise and torch on the same numbers: their results (and gradients of
    the first argument with ``grad``) as numpy arrays."""
    out = []
    for lib, run in ((tw, tw.compile), (tw, lambda f: f), (torch, lambda f: f)):
        args = [lib.tensor(a.copy()) for a in arrays]
        if grad:
            args[0].requires_grad_(True)
        result = run(lambda *a, lib=lib: fn(lib, *a))(*args)
        if grad:
            (result * result).sum().backward()
            out.append((result.detach().numpy(), args[0].grad.numpy()))
        else:
            out.append((result.detach().numpy(),))
    return out


def _check(fn, *shapes, grad=False, rtol=1e-6, atol=1e-6):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    compiled, eager, reference = _both(fn, arrays, grad)
    for got, want, expected in zip(compiled, eager, reference):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
        np.testing.assert_allclose(want, expected, rtol=rtol, atol=atol)


def _lowered_steps(fn, *args, target="cuda") -> list[str]:
    """What each step of ``fn``'s compiled programs is, lowered for ``target`` (CUDA needs no GPU to lower):
    a kernel's name or a library call's operator."""
    _, programs, _ = tw.compile(fn).lowered(get_target(target), *args)
    return [low.kernels[n].name if n in low.kernels else n.op for low in programs for n in steps_of(low.fused)]


def _rotate_half(lib, x):
    x1, x2 = x.chunk(2, dim=-1)
    return lib.cat((-x2, x1), dim=-1)


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_a_cat_of_two_inputs_along_an_inner_dim_in_any_position(dim):
    shapes = {1: ((3, 2, 5, 4), (3, 6, 5, 4)), 2: ((3, 4, 2, 6), (3, 4, 7, 6)), -1: ((3, 4, 5, 3), (3, 4, 5, 5))}[dim]
    _check(lambda lib, a, b: (lib.cat((a.exp(), b * 2), dim) + 1).sin(), *shapes)


def test_a_cat_of_three_inputs_of_unequal_sizes_with_broadcasting_readers():
    def fn(lib, a, b, c, row, col):
        x = lib.cat((a, b.neg(), c * c), -1)  # 3 + 1 + 6 along the last dim
        return x * row + col - x.amax(-1, keepdim=True)

    _check(fn, (4, 5, 3), (4, 5, 1), (4, 5, 6), (5, 1), (10,))


def test_a_cat_along_the_first_dim_read_by_pointwise_kernels():
    _check(lambda lib, a, b: lib.cat((a * 3, b), 0).tanh() * 2, (2, 8), (5, 8))


def test_a_cat_of_a_constant_and_of_integers_promotes_like_torch():
    def fn(lib, a, b):
        ones = lib.ones(a.shape[0], 2)
        whole = lib.cat((a, ones, (b * 4).to(lib.int32)), 1)  # float32 beside int32: float32
        return whole * 0.5

    _check(fn, (6, 3), (6, 4))


def test_backward_through_cats_along_inner_dims():
    def fn(lib, x, w):
        y = lib.cat((x[:, :, 1:] * w[1:], x[:, :, :1].exp()), -1)
        return lib.cat((y, y[:, :1] * 2), 1).sigmoid()

    _check(fn, (3, 4, 6), (6,), grad=True, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rotary_embeddings_forward_and_backward_match_torch(dtype):
    def fn(lib, q, cos, sin):
        q = q.to(getattr(lib, dtype))
        return (q * cos + _rotate_half(lib, q) * sin).float()

    tol = 1e-6 if dtype == "float32" else 2e-2
    _check(fn, (2, 3, 8, 16), (8, 16), (8, 16), grad=True, rtol=tol, atol=tol)


def test_rotary_embeddings_lower_without_a_cat_step_or_a_negation_kernel():
    """RoPE's ``cat((-x2, x1), -1)`` is read in place by the kernel that computes ``q * cos + rotate_half(q) * sin``,
    its negation made there too, and the backward's cat of the gradient's halves likewise: for two layers of it
    (whose position tests are one shared constant), forward and backward are one kernel each per layer."""
    w1, w2 = tw.randn(16, 16, requires_grad=True), tw.randn(16, 16, requires_grad=True)
    cos, sin = tw.randn(8, 8), tw.randn(8, 8)

    def step(x):
        h = x
        for w in (w1, w2):
            q = (h @ w).view(2, 8, 2, 8).transpose(1, 2)
            h = (q * cos + _rotate_half(tw, q) * sin).transpose(1, 2).reshape(2, 8, 16)
        (h * h).sum().backward()
        return h

    steps = _lowered_steps(step, tw.randn(2, 8, 16))
    assert "cat" not in steps
    assert not [s for s in steps if s.split("_", 1)[-1] in ("neg", "neg_clone", "clone_neg")], steps
    rope = [s for s in steps if "cat" in s]
    assert len(rope) == 4, steps  # forward and backward of each layer
    cf = tw.compile(step)
    x = tw.randn(2, 8, 16)
    got = cf(x).detach().numpy()
    grads = w1.grad.numpy().copy()
    w1.grad = w2.grad = None
    np.testing.assert_allclose(got, step(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads, w1.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_cat_along_an_inner_dim_is_no_step_on_the_c_target_either():
    a, b = tw.randn(4, 3), tw.randn(4, 5)
    steps = _lowered_steps(lambda a, b: tw.cat((a, b.exp()), 1) * 2, a, b, target="c")
    assert steps and "cat" not in steps and len(steps) == 1, steps


def test_a_cat_that_a_library_call_reads_is_written_by_a_kernel():
    a, b, w = tw.randn(4, 3), tw.randn(4, 5), tw.randn(8, 2)
    fn = lambda a, b: tw.cat((a.exp(), b), 1) @ w  # noqa: E731
    steps = _lowered_steps(fn, a, b, target="c")
    assert "cat" not in steps and "mm" in steps
    np.testing.assert_allclose(tw.compile(fn)(a, b).numpy(), fn(a, b).numpy(), rtol=1e-5, atol=1e-6)


def test_guarded_loads_keep_their_dim_and_vectors_inside_their_bounds():
    """A dim a load is guarded on is not merged with its neighbours, and a vector along it never straddles one of
    the guard's bounds: 8 bfloat16 lanes where the bounds are multiples of 8, 4 where one is 36."""
    def nest(lo, hi):
        guarded = Load(0, Index(-lo, ((0, 64), (1, 1))), bfloat16, guard=(1, lo, hi))
        store = Store(1, Index(0, ((0, 64), (1, 1))), guarded_value(), bfloat16, None)
        return Nest((128, 64), (), [guarded], [], [store])

    def guarded_value():
        from tilewise.ops.expr import Expr
        return Expr("cast", (Expr("input", (), 0),), float32)

    merged = coalesce(nest(32, 64))
    assert merged.shape == (128, 64) and merged.loads[0].guard == (1, 32, 64)
    assert vector_width(merged, 1) == 8
    assert vector_width(coalesce(nest(36, 64)), 1) == 4
    unguarded = Nest((128, 64), (), [Load(0, Index(0, ((0, 64), (1, 1))), bfloat16)], [], [])
    assert coalesce(unguarded).shape == (8192,)
