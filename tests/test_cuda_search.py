"""searchsorted, nonzero, repeat_interleave, randperm and multinomial on a GPU, and pinned tensors from the
factories.

searchsorted, nonzero and repeat_interleave must equal torch exactly (NaN, sorters, any dim, strided inputs,
lengths across the kernels' tiles of 2048 elements). randperm and multinomial draw from the generator the CPU
kernels use, so for the same seed they must equal the CPU results bit for bit, besides being valid
permutations and samples of the right distribution. None of these operators may reach the host fallback.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int64", "int32", "int16", "int8", "uint8")
NAN = float("nan")


def _torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(np.array(a, order="C")).to(getattr(torch, dtype))  # a 0-dim array stays 0-dim


def _device(t: torch.Tensor) -> tw.Tensor:
    """The same values in a tilewise CUDA tensor (bfloat16 through float32, which holds it exactly)."""
    if t.dtype == torch.bfloat16:
        return tw.from_numpy(t.float().numpy()).to(tw.bfloat16).cuda()
    return tw.from_numpy(t.numpy().copy()).cuda()


def _same(ours: tw.Tensor, expected: torch.Tensor) -> None:
    assert ours.is_cuda
    got = ours.cpu()
    assert tuple(got.shape) == tuple(expected.shape), (tuple(got.shape), tuple(expected.shape))
    assert got.dtype.name == str(expected.dtype).removeprefix("torch."), (got.dtype, expected.dtype)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def _halves(rng: np.random.Generator, shape, special: bool) -> np.ndarray:
    """Multiples of 0.5 in [-20, 20] (exact in every float dtype), with NaN and +-inf when ``special``."""
    values = rng.integers(-40, 41, shape) / 2.0
    if special and values.size:
        flat = values.reshape(-1)
        for value in (NAN, np.inf, -np.inf):
            flat[rng.random(flat.size) < 0.03] = value
    return values


# ---------------------------------------------------------------------------------------------- searchsorted

@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("n", [0, 1, 7, 1000, 70000])
def test_searchsorted_matches_torch(n, dtype):
    rng = np.random.default_rng(n)
    floating = dtype in FLOATS
    seq = torch.sort(_torch(_halves(rng, (n,), floating) if floating else rng.integers(-100, 100, n), dtype))[0]
    values = _torch(_halves(rng, (3, 500), floating) if floating else rng.integers(-110, 110, (3, 500)), dtype)
    x, v = _device(seq), _device(values)
    for right in (False, True):
        for out_int32 in (False, True):
            _same(tw.searchsorted(x, v, right=right, out_int32=out_int32),
                  torch.searchsorted(seq, values, right=right, out_int32=out_int32))


def test_searchsorted_rows_sorters_and_strided_inputs():
    rng = np.random.default_rng(1)
    seq = _torch(_halves(rng, (4, 5, 300), True), "float32")  # unsorted: searched through its sorter
    sorter = seq.argsort(-1)
    values = _torch(_halves(rng, (17, 5, 4), True), "float32").permute(2, 1, 0)  # (4, 5, 17), strided
    x, order = _device(seq), _device(sorter)
    v = _device(values.permute(2, 1, 0).contiguous()).permute(2, 1, 0)
    assert not v.is_contiguous()
    for side in ("left", "right"):
        _same(tw.searchsorted(x, v, side=side, sorter=order), torch.searchsorted(seq, values, side=side, sorter=sorter))
    sorted_seq = seq.sort(-1)[0]
    strided_seq = _device(sorted_seq.transpose(0, 1).contiguous()).transpose(0, 1)
    _same(tw.searchsorted(strided_seq, v), torch.searchsorted(sorted_seq, values))
    strided_sorter = _device(sorter.transpose(0, 1).contiguous()).transpose(0, 1)
    _same(tw.searchsorted(x, v, sorter=strided_sorter), torch.searchsorted(seq, values, sorter=sorter))


def test_searchsorted_nan_inside_unsorted_sequences_as_torch():
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        seq = _halves(rng, (n,), True).astype(np.float32)
        values = _halves(rng, (9,), True).astype(np.float32)
        ref_seq, ref_values = torch.from_numpy(seq), torch.from_numpy(values)
        for right in (False, True):
            _same(tw.searchsorted(tw.from_numpy(seq).cuda(), tw.from_numpy(values).cuda(), right=right),
                  torch.searchsorted(ref_seq, ref_values, right=right))


def test_searchsorted_scalars_host_scalars_mixed_dtypes_and_empty():
    seq = torch.tensor([1, 3, 5, 7])
    x = _device(seq)
    for value in (4, 4.5, -2.0, 7):
        _same(tw.searchsorted(x, value, side="right"), torch.searchsorted(seq, value, side="right"))
    _same(tw.searchsorted(x, tw.tensor(5.5)), torch.searchsorted(seq, torch.tensor(5.5)))  # a 0-dim CPU value
    floats = torch.tensor([[2.5, 7.0], [0.5, 9.0]])
    _same(tw.searchsorted(x, _device(floats)), torch.searchsorted(seq, floats))
    _same(tw.searchsorted(_device(torch.ones(0)), _device(floats)), torch.searchsorted(torch.ones(0), floats))
    _same(tw.searchsorted(x, _device(torch.ones(0, 3))), torch.searchsorted(seq, torch.ones(0, 3)))


def test_searchsorted_sorter_out_of_range_is_an_index_error_at_the_next_synchronisation():
    x = _device(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    bad = _device(torch.tensor([0, 9, 1, 2]))
    tw.searchsorted(x, _device(torch.tensor([10.0])), sorter=bad)  # the search never reads entry 1: still found
    with pytest.raises(IndexError, match=r"searchsorted\(\): sorter: index 9 is out of bounds for dimension 0 with "
                                         r"size 4; valid indices are 0..3"):
        tw.cuda.synchronize()
    ok = tw.searchsorted(x, _device(torch.tensor([2.5])), sorter=_device(torch.tensor([0, 1, 2, 3])))
    assert ok.tolist() == [2]


# ---------------------------------------------------------------------------------------------- nonzero

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "int64", "uint8", "bool"])
@pytest.mark.parametrize("shape", [(1,), (7,), (2048,), (2049,), (3, 700), (5, 6, 7), ((1 << 20) + 5,), (4, 0, 3), ()])
def test_nonzero_matches_torch(shape, dtype):
    rng = np.random.default_rng(sum(shape) + len(dtype))
    for density in (0.0, 0.01, 0.5, 1.0):
        values = rng.integers(1, 5, shape) * (rng.random(shape) < density)
        if dtype == "float32" and values.size:
            flat = values.reshape(-1).astype(np.float32)
            flat[rng.random(flat.size) < 0.05] = NAN  # NaN is non-zero, -0.0 is zero
            flat[(flat == 0) & (rng.random(flat.size) < 0.5)] = -0.0
            values = flat.reshape(shape)
        t = _torch(np.asarray(values), dtype) if dtype != "bool" else torch.from_numpy(np.array(values != 0))
        _same(_device(t).nonzero(), t.nonzero())


def test_nonzero_of_strided_views():
    rng = np.random.default_rng(3)
    t = torch.from_numpy((rng.random((300, 50)) < 0.3).astype(np.float32))
    x = _device(t)
    for view_t, view_x in ((t.t(), x.t()), (t[::3, 1::2], x[::3, 1::2]), (t[:, 7], x[:, 7])):
        _same(view_x.nonzero(), view_t.nonzero())


# ---------------------------------------------------------------------------------------------- repeat_interleave

@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("n", [1, 5, 2048, 2049, 100000])
def test_repeat_interleave_positions_match_torch(n, dtype):
    rng = np.random.default_rng(n)
    repeats = _torch(rng.integers(0, 6, n) * (rng.random(n) < 0.7), dtype)
    _same(tw.repeat_interleave(_device(repeats)), torch.repeat_interleave(repeats))
    total = int(repeats.sum())
    _same(tw.repeat_interleave(_device(repeats), output_size=total), torch.repeat_interleave(repeats))


def test_repeat_interleave_along_dims_and_strided_repeats():
    rng = np.random.default_rng(4)
    t = torch.from_numpy(rng.standard_normal((6, 5000)).astype(np.float32))
    x = _device(t)
    along_rows = torch.from_numpy(rng.integers(0, 4, 5000))
    _same(x.repeat_interleave(_device(along_rows), dim=1), t.repeat_interleave(along_rows, dim=1))
    wide = torch.from_numpy(rng.integers(0, 4, 12))
    strided = _device(wide)[::2]
    _same(x.repeat_interleave(strided, dim=0), t.repeat_interleave(wide[::2], dim=0))
    _same(tw.repeat_interleave(_device(torch.zeros(0, dtype=torch.int64))), torch.zeros(0, dtype=torch.int64))


def test_repeat_interleave_errors():
    with pytest.raises(RuntimeError, match=r"repeat_interleave\(\): repeats can not be negative, got -7"):
        tw.repeat_interleave(_device(torch.tensor([3, -1, 2, -7])))
    with pytest.raises(RuntimeError, match=r"output_size 4 does not match the sum of repeats 5"):
        tw.repeat_interleave(_device(torch.tensor([3, 2])), output_size=4)
    with pytest.raises(RuntimeError, match=r"0-dim or 1-dim integer tensor"):
        tw.repeat_interleave(_device(torch.ones(2, 2, dtype=torch.int64)))


# ---------------------------------------------------------------------------------------------- randperm

@pytest.mark.parametrize("dtype", ["int64", "int32", "float32"])
@pytest.mark.parametrize("n", [0, 1, 2, 1000, 4096, 4097, 100000])
def test_randperm_equals_the_cpu_for_the_same_seed(n, dtype):
    def draw(device):
        tw.manual_seed(n + 17)
        first = tw.randperm(n, dtype=getattr(tw, dtype), device=device)
        return first, tw.randperm(5, device=device), tw.default_generator.get_state().tolist()

    on_cpu, on_gpu = draw("cpu"), draw("cuda")
    assert on_gpu[0].is_cuda and on_gpu[0].dtype is getattr(tw, dtype)
    np.testing.assert_array_equal(on_gpu[0].cpu().numpy(), on_cpu[0].numpy())
    np.testing.assert_array_equal(on_gpu[1].cpu().numpy(), on_cpu[1].numpy())  # the stream moved on alike
    assert on_gpu[2] == on_cpu[2]
    assert sorted(on_gpu[0].cpu().tolist()) == list(range(n))


def test_randperm_is_uniform_and_follows_its_generator():
    g = tw.Generator().manual_seed(7)
    counts: dict = {}
    for _ in range(12000):
        key = tuple(tw.randperm(4, device="cuda", generator=g).cpu().tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24
    observed = np.array(list(counts.values()))
    assert ((observed - 500) ** 2 / 500).sum() < 70  # 23 degrees of freedom: P(chi2 > 70) ~ 1e-6
    a = tw.randperm(1000, device="cuda", generator=tw.Generator().manual_seed(1)).cpu()
    b = tw.randperm(1000, generator=tw.Generator().manual_seed(1))
    np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------------------------------------------- multinomial

def _probabilities(shape, seed: int) -> np.ndarray:
    """Random weights with zeros and tiny values among them; every row holds a sizeable one."""
    rng = np.random.default_rng(seed)
    p = rng.random(shape)
    p[p < 0.3] = 0.0
    rows = p.reshape(-1, shape[-1])
    rows[:, rng.integers(0, shape[-1])] = 0.5
    if shape[-1] > 4:
        rows[:, 1:3] = 1e-30
    return p


MULTINOMIAL_CASES = [((5,), 3, False), ((5,), 1, True), ((5,), 9, True), ((3, 300), 1, False), ((3, 300), 50, True),
                     ((3, 300), 300, False), ((2, 257), 5, False), ((4, 1000), 7, True), ((8, 50304), 1, True),
                     ((2, 50304), 3, False), ((1, 70000), 1000, True)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,samples,replacement", MULTINOMIAL_CASES)
def test_multinomial_equals_the_cpu_for_the_same_seed(shape, samples, replacement, dtype):
    probs = tw.from_numpy(_probabilities(shape, len(shape) + shape[-1])).to(getattr(tw, dtype))

    def draw(device):
        tw.manual_seed(shape[-1] + samples)
        out = tw.multinomial(probs.to(device), samples, replacement)
        return out, tw.default_generator.get_state().tolist()

    (on_cpu, cpu_state), (on_gpu, gpu_state) = draw("cpu"), draw("cuda")
    assert on_gpu.is_cuda and on_gpu.dtype is tw.int64 and on_gpu.shape == on_cpu.shape
    np.testing.assert_array_equal(on_gpu.cpu().numpy(), on_cpu.numpy())
    assert gpu_state == cpu_state
    picks = on_gpu.cpu().numpy().reshape(-1, samples)
    weights = probs.float().numpy().reshape(-1, shape[-1])
    for row, chosen in zip(weights, picks):
        positive = int((row > 0).sum())
        if replacement:
            assert (row[chosen] > 0).all()
        else:
            assert len(set(chosen.tolist())) == samples and (row[chosen[:positive]] > 0).all()


def test_multinomial_counts_within_statistical_bounds():
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.0])
    tw.manual_seed(11)
    draws = tw.multinomial(tw.from_numpy(p).cuda(), 200_000, replacement=True).cpu().numpy()
    counts = np.bincount(draws, minlength=5)
    assert counts[4] == 0
    chi2 = ((counts[:4] - 200_000 * p[:4]) ** 2 / (200_000 * p[:4])).sum()
    assert chi2 < 25, counts  # 3 degrees of freedom: P(chi2 > 25) ~ 2e-5
    rows = tw.from_numpy(np.tile(p[:4], (20_000, 1))).cuda()
    pairs = tw.multinomial(rows, 2).cpu().numpy()
    assert (pairs[:, 0] != pairs[:, 1]).all()
    q = p[:4]
    second = np.array([sum(q[i] * q[j] / (1 - q[i]) for i in range(4) if i != j) for j in range(4)])
    for column, expected in ((pairs[:, 0], q), (pairs[:, 1], second)):
        counts = np.bincount(column, minlength=4)
        assert ((counts - 20_000 * expected) ** 2 / (20_000 * expected)).sum() < 25, counts


@pytest.mark.parametrize("probs,samples,replacement,message", [
    ([1.0, -0.5], 1, True, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([[1.0, NAN], [1.0, 1.0]], 1, False, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([1.0, float("inf")], 2, True, r"probability tensor contains either `inf`, `nan` or element < 0"),
    ([[1.0, 1.0], [0.0, 0.0]], 2, True, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    ([1.0, 1.0], 3, False, r"cannot sample n_sample=3 > prob_dist.size\(-1\)=2 samples without replacement"),
])
def test_multinomial_errors_as_on_the_cpu(probs, samples, replacement, message):
    tw.manual_seed(5)
    before = tw.default_generator.get_state().tolist()
    with pytest.raises(RuntimeError, match=message):
        tw.multinomial(tw.tensor(probs, device="cuda"), samples, replacement)
    assert tw.default_generator.get_state().tolist() == before
    ok = tw.multinomial(tw.tensor([0.0, 1.0], device="cuda"), 1)  # the device goes on working
    assert ok.tolist() == [1]


# ---------------------------------------------------------------------------------------------- dispatch, pinning

def test_search_and_sampling_ops_run_on_the_device(monkeypatch):
    """None of these operators reaches the host fallback."""
    import tilewise.backends.cuda as backend

    x = _device(torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]]))
    x.nonzero()  # binds the backend's entry points before they are replaced

    def no_host(op, args, device):
        raise AssertionError(f"{op.full_name} ran on the host")

    monkeypatch.setattr(backend, "_host", no_host)
    tw.searchsorted(_device(torch.tensor([1.0, 2.0, 3.0])), x)
    tw.searchsorted(x.sort(-1)[0], x, right=True, sorter=x.argsort(-1))
    x.nonzero()
    tw.repeat_interleave(_device(torch.tensor([1, 0, 2])))
    x.repeat_interleave(_device(torch.tensor([2, 1])), dim=0)
    tw.randperm(10, device="cuda")
    tw.multinomial(x.abs() + 0.1, 2)
    tw.multinomial(x.abs() + 0.1, 4, replacement=True)
    tw.cuda.synchronize()


@pytest.mark.parametrize("make", [lambda: tw.empty(1000, 33, pin_memory=True),
                                  lambda: tw.zeros(1000, 33, pin_memory=True),
                                  lambda: tw.full((1000, 33), 1.5, dtype=tw.bfloat16, pin_memory=True),
                                  lambda: tw.tensor(np.ones((1000, 33)), pin_memory=True),
                                  lambda: tw.empty_like(tw.ones(1000, 33), pin_memory=True),
                                  lambda: tw.ones_like(tw.ones(1000, 33), dtype=tw.int32, pin_memory=True)])
def test_factories_pin_memory_give_pinned_tensors_that_upload_asynchronously(make):
    host = make()
    assert host.is_pinned() and host.device == tw.device("cpu") and host.is_contiguous()
    host.copy_(tw.arange(1000 * 33).reshape(1000, 33).to(host.dtype))
    x = host.to("cuda", non_blocking=True)
    tw.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), host.numpy())
    with pytest.raises(RuntimeError, match=r"only CPU tensors can be pinned"):
        tw.zeros(3, device="cuda", pin_memory=True)
