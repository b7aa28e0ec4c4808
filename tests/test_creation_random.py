"""Factories against torch, and the Philox-backed random operators (determinism, ranges, statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw


@pytest.mark.parametrize("call", [
    lambda m: m.zeros(2, 3), lambda m: m.ones((2, 3), dtype=m.int32), lambda m: m.full((2, 2), 7),
    lambda m: m.full((2,), 1.5), lambda m: m.arange(5), lambda m: m.arange(1, 2.5, 0.5), lambda m: m.arange(10, 0, -3),
    lambda m: m.linspace(0, 1, 5), lambda m: m.eye(3), lambda m: m.eye(2, 4), lambda m: m.zeros_like(m.ones(2, 2)),
    lambda m: m.full_like(m.ones(2, dtype=m.int64), 3), lambda m: m.tensor([[1, 2], [3, 4]]),
    lambda m: m.tensor([True, False]), lambda m: m.tensor(2.5), lambda m: m.scalar_tensor(3),
])
def test_factories_match_torch(call):
    ours, theirs = call(tw), call(torch)
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.numpy(), theirs.numpy())


def test_manual_seed_reproduces_every_random_op():
    def draw():
        tw.manual_seed(1234)
        return [tw.rand(5), tw.randn(5), tw.randint(0, 10, (5,)), tw.randperm(6),
                tw.bernoulli(tw.full((5,), 0.5)), tw.multinomial(tw.tensor([0.2, 0.3, 0.5]), 4, replacement=True)]

    for a, b in zip(draw(), draw()):
        assert np.array_equal(a.numpy(), b.numpy())


def test_draws_advance_the_stream_and_generators_are_independent():
    tw.manual_seed(0)
    a, b = tw.rand(8), tw.rand(8)
    assert not np.array_equal(a.numpy(), b.numpy())
    g = tw.Generator().manual_seed(0)
    tw.manual_seed(99)
    c = tw.rand(8, generator=g)
    assert np.array_equal(a.numpy(), c.numpy())  # same seed, same stream, whatever the default generator did


def test_rng_state_round_trip():
    tw.manual_seed(5)
    state = tw.get_rng_state()
    x = tw.randn(4)
    tw.set_rng_state(state)
    assert np.array_equal(x.numpy(), tw.randn(4).numpy())


def test_rng_state_is_a_byte_tensor_and_other_states_are_refused_as_torch_refuses_them():
    """torch's generator states are ByteTensors (its CUDA generator's: 16 bytes, the seed then the offset)."""
    import torch

    tw.manual_seed(2**40 + 3)
    tw.randn(5)
    state = tw.get_rng_state()
    assert state.dtype == tw.uint8 and tuple(state.shape) == (16,)
    seed, offset = np.frombuffer(state.numpy().tobytes(), "<u8")
    assert seed == 2**40 + 3 and offset == tw.default_generator.offset > 0
    for lib in (tw, torch):
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            lib.set_rng_state(lib.zeros(16, dtype=lib.int64))
    with pytest.raises(RuntimeError, match="RNG state is wrong size"):
        tw.set_rng_state(tw.zeros(4, dtype=tw.uint8))


def test_distributions_have_the_right_moments_and_ranges():
    tw.manual_seed(0)
    u = tw.rand(200_000).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    n = tw.randn(200_000, dtype=tw.float64).numpy()
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    r = tw.randint(-3, 4, (50_000,)).numpy()
    assert r.min() == -3 and r.max() == 3
    assert sorted(tw.randperm(50).tolist()) == list(range(50))
    counts = np.bincount(tw.multinomial(tw.tensor([0.1, 0.2, 0.7]), 20_000, replacement=True).numpy(), minlength=3)
    np.testing.assert_allclose(counts / 20_000, [0.1, 0.2, 0.7], atol=0.02)
    picks = tw.multinomial(tw.tensor([0.1, 0.2, 0.7, 0.0]), 3).tolist()
    assert sorted(picks) == [0, 1, 2]  # without replacement: each once, never the zero-probability class


def test_inplace_fills():
    x = tw.empty(1000, 10)
    assert x.fill_(2.5).numpy().min() == 2.5 and x.zero_().numpy().max() == 0
    tw.manual_seed(1)
    assert abs(x.normal_(3.0, 0.5).numpy().mean() - 3.0) < 0.01
    v = x.uniform_(-2, -1).numpy()
    assert v.min() >= -2 and v.max() < -1
    assert set(np.unique(x.bernoulli_(0.3).numpy())) <= {0.0, 1.0}
    assert x.exponential_(2.0).numpy().min() >= 0


def test_random_errors_name_the_op_and_values():
    with pytest.raises(RuntimeError, match="randint.*from=5 >= to=5"):
        tw.randint(5, 5, (2,))
    with pytest.raises(RuntimeError, match="multinomial.*cannot sample n_sample=4"):
        tw.multinomial(tw.tensor([0.5, 0.5]), 4)
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        tw.zeros(2, -1)
    with pytest.raises(RuntimeError, match="bernoulli.*\\[0, 1\\]"):
        tw.bernoulli(tw.tensor([1.5]))
