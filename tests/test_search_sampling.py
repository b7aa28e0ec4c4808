"""searchsorted, nonzero, repeat_interleave, randperm and multinomial on the CPU: torch's answers where torch is
deterministic (searchsorted's NaN handling included), the draw rules of [Note: multinomial draws], argument
errors, and the ``pin_memory`` flag of the factories. The same operators on a GPU: tests/test_cuda_search.py.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.backends.cpu.kernels import tiled_cumsum
from tilewise.ops.creation import MULTINOMIAL_TILES

NAN = float("nan")


# ---------------------------------------------------------------------------------------------- searchsorted

def _random_search_case(rng: np.random.Generator):
    """A small sequence (sorted or not, maybe with NaN), values (maybe NaN, +-inf) and a side."""
    n = int(rng.integers(0, 9))
    seq = np.sort(rng.integers(-3, 4, n).astype(np.float32))
    if n and rng.random() < 0.4:
        seq[rng.integers(0, n)] = NAN
    if rng.random() < 0.3:
        rng.shuffle(seq)
    values = rng.integers(-4, 5, int(rng.integers(0, 7))).astype(np.float32)
    for special in (NAN, np.inf, -np.inf):
        if values.size and rng.random() < 0.3:
            values[rng.integers(0, values.size)] = special
    return seq, values, bool(rng.integers(0, 2))


def test_searchsorted_is_torchs_binary_search_nan_and_unsorted_sequences_included():
    """numpy puts NaN last; torch's comparisons pass a NaN in the sequence over, and send a NaN value to n."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        seq, values, right = _random_search_case(rng)
        ours = tw.searchsorted(tw.from_numpy(seq), tw.from_numpy(values), right=right)
        ref = torch.searchsorted(torch.from_numpy(seq), torch.from_numpy(values), right=right)
        np.testing.assert_array_equal(ours.numpy(), ref.numpy(), err_msg=f"{seq} {values} right={right}")
        if seq.size:
            order = rng.permutation(seq.size)
            ours = tw.searchsorted(tw.from_numpy(seq), tw.from_numpy(values), sorter=tw.from_numpy(order))
            ref = torch.searchsorted(torch.from_numpy(seq), torch.from_numpy(values), sorter=torch.from_numpy(order))
            np.testing.assert_array_equal(ours.numpy(), ref.numpy(), err_msg=f"{seq} {values} sorter={order}")


def test_searchsorted_promotes_scalars_and_mixed_dtypes_as_torch():
    seq = np.array([1, 3, 5, 7])
    for value in (4, 4.5, 7, -1.5):
        for side in ("left", "right"):
            ours = tw.searchsorted(tw.from_numpy(seq), value, side=side)
            ref = torch.searchsorted(torch.from_numpy(seq), value, side=side)
            assert ours.shape == () and int(ours) == int(ref)
    ours = tw.searchsorted(tw.from_numpy(seq), tw.tensor([2.5, 7.0, 8.0]), right=True)
    np.testing.assert_array_equal(ours.numpy(), [1, 4, 4])
    big = np.array([2**40, 2**40 + 1], np.int64)  # promoted to float32, as torch does: both round to 2**40
    ours = tw.searchsorted(tw.from_numpy(big), tw.tensor([float(2**40)]), right=True)
    ref = torch.searchsorted(torch.from_numpy(big), torch.tensor([float(2**40)]), right=True)
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())


@pytest.mark.parametrize("call,message", [
    (lambda: tw.searchsorted(tw.tensor([1.0, 2.0]), tw.tensor([1.0]), sorter=tw.tensor([0, 1], dtype=tw.int32)),
     r"searchsorted\(\): sorter must be an int64 tensor, got dtype int32"),
    (lambda: tw.searchsorted(tw.tensor([1.0, 2.0]), tw.tensor([1.0]), sorter=tw.tensor([0])),
     r"sorter shape \[1\] must equal sorted_sequence shape \[2\]"),
    (lambda: tw.searchsorted(tw.ones(2, 3), 1.0), r"input value can be a scalar only when boundaries tensor dimension "
                                                  r"is 1, but we got boundaries tensor dim\(2\)"),
    (lambda: tw.searchsorted(tw.ones(2, 3), tw.ones(3, 1)), r"but we got boundaries tensor \[2, 3\] and input value "
                                                            r"tensor \[3, 1\]"),
    (lambda: tw.searchsorted(tw.tensor(1.0), tw.ones(2)), r"at least one dimension"),
    (lambda: tw.searchsorted(tw.ones(3), tw.ones(2), side="middle"),
     r"side can only be 'left' or 'right' but got middle"),
    (lambda: tw.searchsorted(tw.zeros(1).expand(2**31), tw.ones(2), out_int32=True),
     r"out_int32=True holds positions up to 2\*\*31 - 2"),
])
def test_searchsorted_argument_errors(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_searchsorted_sorter_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match=r"searchsorted\(\): sorter: index 5 is out of bounds for dimension 0 with "
                                         r"size 3; valid indices are 0..2"):
        tw.searchsorted(tw.tensor([1.0, 2.0, 3.0]), tw.tensor([1.0]), sorter=tw.tensor([0, 5, 1]))


# ---------------------------------------------------------------------------------------- nonzero, repeat_interleave

def test_nonzero_of_a_0_dim_tensor_and_of_nan_and_negative_zero():
    assert tw.tensor(3.0).nonzero().shape == (1, 0) and tw.tensor(0.0).nonzero().shape == (0, 0)
    x = tw.tensor([0.0, NAN, -0.0, 1.0])
    np.testing.assert_array_equal(x.nonzero().numpy(), torch.tensor([0.0, NAN, -0.0, 1.0]).nonzero().numpy())


def test_repeat_interleave_keeps_int32_repeats_dtype_and_checks_them():
    out = tw.repeat_interleave(tw.tensor([1, 0, 2], dtype=tw.int32))
    assert out.dtype is tw.int32 and out.tolist() == [0, 2, 2]
    assert tw.repeat_interleave(tw.tensor([2, 1], dtype=tw.int16)).dtype is tw.int64
    with pytest.raises(RuntimeError, match=r"repeats can not be negative, got -4"):
        tw.repeat_interleave(tw.tensor([1, -2, -4]))
    with pytest.raises(RuntimeError, match=r"output_size 4 does not match the sum of repeats 3"):
        tw.repeat_interleave(tw.tensor([1, 2]), output_size=4)
    with pytest.raises(RuntimeError, match=r"0-dim or 1-dim integer tensor, got shape \[2\] and dtype"):
        tw.repeat_interleave(tw.tensor([1.0, 2.0]))


# ---------------------------------------------------------------------------------------------- randperm

def test_randperm_values_dtypes_and_errors():
    for dtype in (tw.int64, tw.int32, tw.uint8, tw.float16, tw.float32):
        perm = tw.randperm(200, dtype=dtype)
        assert perm.dtype is dtype and sorted(perm.tolist()) == list(range(200))
    assert tw.randperm(256, dtype=tw.uint8).numel() == 256 and tw.randperm(2049, dtype=tw.float16).numel() == 2049
    with pytest.raises(RuntimeError, match=r"randperm\(\): n=257 is too large for dtype uint8, which numbers at most "
                                           r"256 elements exactly"):
        tw.randperm(257, dtype=tw.uint8)
    with pytest.raises(RuntimeError, match=r"n=2050 is too large for dtype float16"):
        tw.randperm(2050, dtype=tw.float16)
    with pytest.raises(RuntimeError, match=r"randperm\(\): n must be non-negative, got -1"):
        tw.randperm(-1)
    with pytest.raises(RuntimeError, match=r"dtype bool cannot hold a permutation"):
        tw.randperm(3, dtype=tw.bool)


# ---------------------------------------------------------------------------------------------- multinomial

def _cumsum_by_definition(weights: np.ndarray) -> np.ndarray:
    """[Note: multinomial draws]'s cumulative sums, one Python float addition at a time."""
    n = len(weights)
    length = math.ceil(n / MULTINOMIAL_TILES)
    out, before = [], 0.0
    for start in range(0, MULTINOMIAL_TILES * length, length):
        inside = 0.0
        for w in weights[start:start + length]:
            inside += max(float(w), 0.0)
            out.append(before + inside)
        before += inside
    return np.array(out)


@pytest.mark.parametrize("n", [1, 5, 256, 257, 1000, 4099])
def test_multinomial_cumulative_weights_follow_the_tiled_order(n):
    rng = np.random.default_rng(n)
    weights = rng.random(n) * 10.0 ** rng.integers(-30, 3, n)  # magnitudes far apart: the order shows in rounding
    weights[rng.random(n) < 0.2] = 0.0
    cdf, total = tiled_cumsum(weights[None])
    expected = _cumsum_by_definition(weights)
    np.testing.assert_array_equal(cdf[0], expected)
    assert total[0] == expected[-1]


def test_multinomial_never_draws_a_weightless_category_while_weight_remains():
    probs = tw.tensor([[0.0, 0.3, 0.0, 1e-30, 0.7, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0, 0.5]])
    tw.manual_seed(3)
    with_replacement = tw.multinomial(probs, 5000, replacement=True).numpy()
    assert set(with_replacement[0].tolist()) <= {1, 3, 4} and set(with_replacement[1].tolist()) == {0, 5}
    without = tw.multinomial(probs, 6).numpy()
    assert sorted(without[0, :3].tolist()) == [1, 3, 4] and without[0, 3:].tolist() == [0, 2, 5]
    assert sorted(without[1, :2].tolist()) == [0, 5] and without[1, 2:].tolist() == [1, 2, 3, 4]


def test_multinomial_counts_within_statistical_bounds():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    tw.manual_seed(11)
    draws = tw.multinomial(tw.from_numpy(p), 40_000, replacement=True).numpy()
    counts = np.bincount(draws, minlength=4)
    chi2 = ((counts - 40_000 * p) ** 2 / (40_000 * p)).sum()
    assert chi2 < 25, counts  # 3 degrees of freedom: P(chi2 > 25) ~ 2e-5
    pairs = tw.multinomial(tw.from_numpy(np.tile(p, (20_000, 1))), 2).numpy()
    assert (pairs[:, 0] != pairs[:, 1]).all()
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    for column, expected in ((pairs[:, 0], p), (pairs[:, 1], second)):
        counts = np.bincount(column, minlength=4)
        assert ((counts - 20_000 * expected) ** 2 / (20_000 * expected)).sum() < 25, counts


@pytest.mark.parametrize("probs,samples,replacement,message", [
    ([1.0, -0.5], 1, True, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([1.0, NAN], 1, False, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([1.0, math.inf], 1, False, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([[0.0, 0.0], [1.0, 1.0]], 1, True, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    ([1.0, 1.0], 3, False, r"cannot sample n_sample=3 > prob_dist.size\(-1\)=2 samples without replacement"),
    ([1.0, 1.0], 0, True, r"cannot sample n_sample <= 0 samples, got num_samples=0"),
    ([[[1.0]]], 1, True, r"prob_dist must be 1 or 2 dim, got shape \[1, 1, 1\]"),
])
def test_multinomial_errors_leave_the_generator_alone(probs, samples, replacement, message):
    tw.manual_seed(5)
    before = tw.default_generator.get_state().tolist()
    with pytest.raises(RuntimeError, match=message):
        tw.multinomial(tw.tensor(probs), samples, replacement)
    assert tw.default_generator.get_state().tolist() == before


def test_multinomial_refuses_integer_probabilities():
    with pytest.raises(RuntimeError, match=r"multinomial: probabilities must have a floating-point dtype, got int64"):
        tw.multinomial(tw.tensor([1, 2]), 1)


# ---------------------------------------------------------------------------------------------- pin_memory

FACTORIES = {
    "empty": lambda: tw.empty(2, 3, pin_memory=True),
    "zeros": lambda: tw.zeros(2, 3, pin_memory=True),
    "ones": lambda: tw.ones(2, 3, pin_memory=True),
    "full": lambda: tw.full((2, 3), 2.5, pin_memory=True),
    "tensor": lambda: tw.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], pin_memory=True),
    "empty_like": lambda: tw.empty_like(tw.ones(2, 3), pin_memory=True),
    "zeros_like": lambda: tw.zeros_like(tw.ones(2, 3), pin_memory=True),
    "ones_like": lambda: tw.ones_like(tw.ones(2, 3), pin_memory=True),
    "full_like": lambda: tw.full_like(tw.ones(2, 3), 7.0, pin_memory=True),
}
EXPECTED = {"zeros": np.zeros((2, 3)), "ones": np.ones((2, 3)), "full": np.full((2, 3), 2.5),
            "tensor": np.arange(1.0, 7.0).reshape(2, 3), "zeros_like": np.zeros((2, 3)), "ones_like": np.ones((2, 3)),
            "full_like": np.full((2, 3), 7.0)}


@pytest.mark.parametrize("name", FACTORIES)
def test_factories_pin_memory_without_a_gpu_say_so_as_pin_memory_does(name):
    if tw.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError) as from_pin_memory:
        tw.ones(3).pin_memory()
    with pytest.raises(RuntimeError) as from_factory:
        FACTORIES[name]()
    assert str(from_factory.value) == str(from_pin_memory.value)


@pytest.fixture
def page_locked_stand_in(monkeypatch):
    """Pinned allocations served from ordinary memory wearing a PinnedBuffer's type, and the CUDA backend
    registered, so the factories' pinned path runs without a GPU."""
    import tilewise.backends.cuda as cuda_backend
    from tilewise.backends.cuda import runtime
    from tilewise.backends.cuda.runtime.pinned import PinnedBuffer
    from tilewise.dispatch import BACKENDS

    class StandIn(PinnedBuffer):
        def __init__(self, nbytes: int) -> None:
            self.memory = (ctypes.c_byte * max(nbytes, 1))()
            self.nbytes, self.device, self.ptr = nbytes, 0, ctypes.addressof(self.memory)

        def __del__(self) -> None:
            pass

    def pinned_empty(shape, dtype=np.float32):
        dtype = np.dtype(dtype)
        return StandIn(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize).as_array(dtype, tuple(shape))

    monkeypatch.setattr(runtime, "pinned_empty", pinned_empty)
    monkeypatch.setitem(BACKENDS, "cuda", cuda_backend.backend)


@pytest.mark.parametrize("name", FACTORIES)
def test_factories_pin_memory_give_page_locked_cpu_tensors(name, page_locked_stand_in):
    out = FACTORIES[name]()
    assert out.is_pinned() and out.device == tw.device("cpu") and out.shape == (2, 3) and out.is_contiguous()
    if name in EXPECTED:
        np.testing.assert_array_equal(out.numpy(), EXPECTED[name])
    assert tw.zeros(2, pin_memory=True, requires_grad=True).requires_grad
    assert not tw.zeros(2).is_pinned()


def test_pin_memory_for_a_device_tensor_is_refused():
    with pytest.raises(RuntimeError, match=r"empty\(\): pin_memory=True makes a page-locked CPU tensor, but this "
                                           r"one would be made on cuda:0; only CPU tensors can be pinned"):
        tw.empty(3, device="cuda", pin_memory=True)
