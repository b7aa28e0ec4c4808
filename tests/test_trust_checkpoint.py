"""Activation checkpointing replays random operators bit-exactly, in eager and inside tilewise.compile.

A checkpointed segment is run again during backward; its dropout masks and other random draws must be the
forward's, or the gradients are those of another network. Each test runs the same seeded step without
checkpointing, with ``checkpoint`` (both variants) and with ``checkpoint_sequential``, eager and compiled,
and asserts that outputs and every gradient are identical, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.utils.checkpoint import checkpoint, checkpoint_sequential

VARIANTS = [("plain", None), ("checkpoint", False), ("checkpoint", True), ("sequential", False),
            ("sequential", True)]


def _every_random_op(x, w):
    """A segment drawing from every random operator, each draw feeding the output (so a different draw in the
    recomputation changes the gradient)."""
    h = F.dropout(x @ w, 0.3)
    h = h * tw.rand_like(h) + tw.randn(h.shape, device=h.device) * 0.1
    h = h * tw.bernoulli(tw.full_like(h, 0.7))
    h = h * tw.bernoulli(h.detach().sigmoid())  # probabilities computed inside the segment
    h = h[:, tw.randperm(h.shape[1], device=h.device)]
    picked = tw.multinomial(tw.ones(h.shape[1], device=h.device), 3)
    h = tw.cat([h, h[:, picked]], 1)
    h = F.dropout2d(h.reshape(h.shape[0], h.shape[1], 1, 1), 0.5).reshape(h.shape)
    return h * tw.empty_like(h).uniform_(0.5, 1.5) + tw.empty_like(h).normal_() * 0.01


def _model(device: str) -> tw.nn.Sequential:
    tw.manual_seed(0)
    return tw.nn.Sequential(tw.nn.Linear(6, 8), tw.nn.Dropout(0.5), tw.nn.ReLU(), tw.nn.Linear(8, 8),
                            tw.nn.Dropout(0.25), tw.nn.ReLU(), tw.nn.Linear(8, 4)).to(device)


def _step(model, w, how: str, reentrant: bool | None):
    def step(x):
        h = x * 2
        if how == "plain":
            y = _every_random_op(model(h), w)
        elif how == "checkpoint":
            y = checkpoint(lambda a: _every_random_op(model(a), w), h, use_reentrant=reentrant)
        else:
            y = checkpoint_sequential([*model, lambda a: _every_random_op(a, w)], 3, h, use_reentrant=reentrant)
        (y * y).sum().backward()
        return y.detach()

    return step


def _results(device: str, compiled: bool, how: str, reentrant: bool | None, calls: int = 2):
    """Outputs and gradients of ``calls`` seeded steps, then a draw after them (the generator's final state)."""
    model = _model(device)
    w = tw.randn(4, 5, device=device, requires_grad=True)
    step = _step(model, w, how, reentrant)
    step = tw.compile(step) if compiled else step
    tw.manual_seed(1234)
    x = tw.randn(3, 6, device=device)
    results = []
    for _ in range(calls):
        leaf = x.clone().requires_grad_(True)
        for p in [*model.parameters(), w]:
            p.grad = None
        results.append([step(leaf), leaf.grad, w.grad, *(p.grad for p in model.parameters())])
    results.append([tw.rand(4, device=device)])
    return [[t.cpu().numpy() for t in call] for call in results]


def _assert_identical(got, want, what: str) -> None:
    for k, (g_call, w_call) in enumerate(zip(got, want)):
        for j, (g, w) in enumerate(zip(g_call, w_call)):
            assert np.array_equal(g, w), f"{what}: call {k}, value {j} differs by {np.abs(g - w).max()}"


@pytest.mark.parametrize("how,reentrant", VARIANTS[1:], ids=[f"{h}-reentrant={r}" for h, r in VARIANTS[1:]])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_checkpointed_random_ops_replay_exactly(compiled, how, reentrant):
    want = _results("cpu", compiled, "plain", None)
    _assert_identical(_results("cpu", compiled, how, reentrant), want,
                      f"{'compiled' if compiled else 'eager'} {how} (reentrant={reentrant})")


def _dropout_block_results(device: str, compiled: bool, how: str, reentrant: bool | None = None):
    """Two seeded steps of Linear, Dropout, ReLU, ...: outputs and gradients."""
    model = _model(device)

    def step(x):
        if how == "plain":
            y = model(x)
        elif how == "checkpoint":
            y = checkpoint(model, x, use_reentrant=reentrant)
        else:
            y = checkpoint_sequential(model, 2, x, use_reentrant=reentrant)
        y.sum().backward()
        return y.detach()

    fn = tw.compile(step) if compiled else step
    tw.manual_seed(99)
    out = []
    for _ in range(2):
        x = tw.randn(5, 6, device=device, requires_grad=True)
        for p in model.parameters():
            p.grad = None
        out.append([fn(x), x.grad, *(p.grad for p in model.parameters())])
    return [[t.cpu().numpy() for t in call] for call in out]


@pytest.mark.parametrize("how,reentrant", VARIANTS, ids=[f"{h}-reentrant={r}" for h, r in VARIANTS])
def test_a_compiled_block_with_dropout_matches_eager_exactly(how, reentrant):
    """Compiled, with or without checkpointing, as eager without it, bit for bit on the CPU."""
    _assert_identical(_dropout_block_results("cpu", True, how, reentrant),
                      _dropout_block_results("cpu", False, "plain"), f"compiled {how} (reentrant={reentrant})")


def test_compiled_draws_of_different_random_ops_keep_eager_order():
    """Fusion may place independent draws anywhere; the program keeps them in the order the function made them
    (each claims the generator's next counters when it runs)."""
    def draws(h):
        h = tw.cat([h, h[:, tw.multinomial(tw.ones(h.shape[1]), 3)]], 1)
        return F.dropout2d(h.reshape(h.shape[0], h.shape[1], 1, 1), 0.5).reshape(h.shape)

    x = tw.randn(3, 5)
    tw.manual_seed(5)
    want = draws(x).numpy()
    tw.manual_seed(5)
    assert np.array_equal(tw.compile(draws)(x).numpy(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("how,reentrant", VARIANTS[1:], ids=[f"{h}-reentrant={r}" for h, r in VARIANTS[1:]])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_checkpointed_random_ops_replay_exactly_on_cuda(compiled, how, reentrant):
    want = _results("cuda", compiled, "plain", None)
    _assert_identical(_results("cuda", compiled, how, reentrant), want,
                      f"{'compiled' if compiled else 'eager'} {how} (reentrant={reentrant}) on cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("how,reentrant", VARIANTS, ids=[f"{h}-reentrant={r}" for h, r in VARIANTS])
def test_a_compiled_block_with_dropout_matches_eager_on_cuda(how, reentrant):
    """The same masks as eager; the generated kernels may round the arithmetic around them differently."""
    got, want = _dropout_block_results("cuda", True, how, reentrant), _dropout_block_results("cuda", False, "plain")
    for g_call, w_call in zip(got, want):
        for g, w in zip(g_call, w_call):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_without_preserved_rng_state_the_recomputation_draws_anew(compiled):
    """The control: with ``preserve_rng_state=False`` the masks differ, so the tests above can fail."""
    def step(x, w):
        y = checkpoint(lambda a: F.dropout(a @ w, 0.5), x, use_reentrant=False, preserve_rng_state=False)
        (y * y).sum().backward()
        return y.detach()

    grads = []
    for fn in (step, tw.compile(step) if compiled else step):
        tw.manual_seed(7)
        x, w = tw.randn(16, 16, requires_grad=True), tw.randn(16, 16, requires_grad=True)
        fn(x, w)
        grads.append(w.grad.numpy())
    plain = _results_of_plain_dropout()
    assert not np.array_equal(grads[1], plain)


def _results_of_plain_dropout():
    tw.manual_seed(7)
    x, w = tw.randn(16, 16, requires_grad=True), tw.randn(16, 16, requires_grad=True)
    y = F.dropout(x @ w, 0.5)
    (y * y).sum().backward()
    return w.grad.numpy()


def test_compiled_random_composites_on_the_same_input_draw_apart():
    """Two dropouts of one tensor are two draws, also where the compiler keeps dropout whole (no grad): as in
    eager, and the same numbers as eager from the same seed."""
    def two_masks(x):
        return F.dropout(x, 0.5), F.dropout(x, 0.5), tw.rand(8), tw.rand(8)

    x = tw.ones(64)
    tw.manual_seed(3)
    want = [t.numpy() for t in two_masks(x)]
    tw.manual_seed(3)
    got = [t.numpy() for t in tw.compile(two_masks)(x)]
    assert not np.array_equal(want[0], want[1])
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_a_restored_rng_state_inside_a_compiled_function_redraws_the_same_numbers():
    def redraw():
        state = tw.get_rng_state()
        a = tw.randn(5)
        tw.set_rng_state(state)
        return a, tw.randn(5), tw.randn(5)

    tw.manual_seed(11)
    want = [t.numpy() for t in redraw()]
    after_eager = tw.rand(3).numpy()
    tw.manual_seed(11)
    got = [t.numpy() for t in tw.compile(redraw)()]
    assert np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2])
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    assert np.array_equal(tw.rand(3).numpy(), after_eager)  # the generator ends where eager leaves it
