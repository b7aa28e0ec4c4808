"""tilewise.utils.data: datasets, samplers, collation and the DataLoader (compared with torch where it is exact)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)


def _dataset(n=10):
    return TensorDataset(tw.arange(n * 2.0).view(n, 2), tw.arange(n))


def test_tensor_dataset_indexing_and_errors():
    ds = _dataset()
    x, y = ds[3]
    assert len(ds) == 10 and x.tolist() == [6.0, 7.0] and y.item() == 3
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(tw.zeros(3), tw.zeros(4))


@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (3, False), (3, True), (10, True), (4, False)])
def test_batches_match_torch_in_order(batch_size, drop_last):
    ours = DataLoader(_dataset(), batch_size=batch_size, drop_last=drop_last)
    theirs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2),
                                                                        torch.arange(10)),
                                         batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    got = [(x.tolist(), y.tolist()) for x, y in ours]
    expected = [(x.tolist(), y.tolist()) for x, y in theirs]
    assert got == expected


def test_tensor_dataset_batches_by_gather_equal_stacked_samples():
    ds = TensorDataset(tw.randn(10, 3, 2), tw.arange(10))

    def batches(collate):
        loader = DataLoader(ds, batch_size=4, shuffle=True, generator=tw.Generator().manual_seed(1), collate_fn=collate)
        return [(x.tolist(), y.tolist()) for x, y in loader]

    assert batches(None) == batches(lambda samples: default_collate(samples))


def test_shuffle_is_a_seeded_permutation_each_epoch():
    loader = DataLoader(_dataset(), batch_size=4, shuffle=True, generator=tw.Generator().manual_seed(0))
    first = [i for _, y in loader for i in y.tolist()]
    second = [i for _, y in loader for i in y.tolist()]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second
    again = DataLoader(_dataset(), batch_size=4, shuffle=True, generator=tw.Generator().manual_seed(0))
    assert [i for _, y in again for i in y.tolist()] == first


def test_shuffle_without_a_generator_follows_manual_seed():
    def order():
        tw.manual_seed(123)
        return [i for _, y in DataLoader(_dataset(), batch_size=3, shuffle=True) for i in y.tolist()]

    assert order() == order()


def test_default_collate_structures():
    Point = namedtuple("Point", "x y")
    batch = [{"a": tw.ones(2), "b": 1, "c": "s", "d": (1.5, np.zeros(2, dtype=np.float32)), "p": Point(1, 2)},
             {"a": tw.zeros(2), "b": 2, "c": "t", "d": (2.5, np.ones(2, dtype=np.float32)), "p": Point(3, 4)}]
    out = default_collate(batch)
    assert out["a"].shape == (2, 2) and out["b"].tolist() == [1, 2] and out["b"].dtype is tw.int64
    assert out["c"] == ["s", "t"] and out["d"][0].tolist() == [1.5, 2.5] and out["d"][1].shape == (2, 2)
    assert isinstance(out["p"], Point) and out["p"].x.tolist() == [1, 3]


def test_batch_size_none_yields_single_samples_and_custom_collate():
    samples = list(DataLoader(_dataset(3), batch_size=None))
    assert len(samples) == 3 and samples[1][1].item() == 1
    sums = [b for b in DataLoader(_dataset(4), batch_size=2, collate_fn=lambda b: sum(y.item() for _, y in b))]
    assert sums == [1, 5]


def test_batch_sampler_and_samplers():
    loader = DataLoader(_dataset(), batch_sampler=BatchSampler(SequentialSampler(range(10)), 4, drop_last=False))
    assert [y.tolist() for _, y in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(_dataset(), batch_size=4, batch_sampler=BatchSampler(range(10), 4, False))
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(_dataset(), num_workers=-1)


def test_iterable_dataset_batches():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(tw.tensor(float(i)) for i in range(7))

    assert [b.tolist() for b in DataLoader(Stream(), batch_size=3)] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0]]
    assert [b.tolist() for b in DataLoader(Stream(), batch_size=3, drop_last=True)] == [[0.0, 1.0, 2.0],
                                                                                      [3.0, 4.0, 5.0]]


def test_subset_concat_and_random_split():
    class Squares(Dataset):
        def __getitem__(self, i):
            return i * i

        def __len__(self):
            return 5

    both = ConcatDataset([Squares(), Squares()])
    assert len(both) == 10 and both[6] == 1 and both[-1] == 16
    assert Subset(Squares(), [4, 0])[0] == 16
    parts = random_split(Squares(), [3, 2], generator=tw.Generator().manual_seed(0))
    assert sorted(parts[0].indices + parts[1].indices) == [0, 1, 2, 3, 4]
    halves = random_split(range(10), [0.5, 0.5])
    assert [len(h) for h in halves] == [5, 5]
    with pytest.raises(ValueError, match="does not equal the length"):
        random_split(Squares(), [2, 2])


# ------------------------------------------------------------------------------------------------ against torch

def _same_error(make):
    """``make(lib, utils_data)`` raises the same error type and message under torch and tilewise (tilewise may put
    the operator's name in front)."""
    with pytest.raises(Exception) as theirs:
        make(torch, torch.utils.data)
    with pytest.raises(type(theirs.value)) as ours:
        make(tw, tw.utils.data)
    assert str(ours.value).removeprefix("multinomial: ") == str(theirs.value)


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.7], [0.25, 0.25, 0.5]])
def test_random_split_takes_lengths_as_a_tensor_like_torch(lengths):
    ours = random_split(range(10), tw.tensor(lengths), generator=tw.Generator().manual_seed(0))
    theirs = torch.utils.data.random_split(range(10), torch.tensor(lengths), generator=torch.Generator().manual_seed(0))
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert sorted(i for s in ours for i in s.indices) == list(range(10))
    assert all(type(i) is int for s in ours for i in s.indices)


@pytest.mark.parametrize("n", [np.int64(4), 4, [[4]], [4, 5], 4.0, "4", True])
def test_randperm_reads_its_length_as_torch_does(n):
    """torch reads ``n`` through ``__index__``: a numpy integer or a one-element integer tensor is a length."""
    def make(lib):
        return lib.tensor(n) if isinstance(n, list) else n

    try:
        expected = sorted(torch.randperm(make(torch)).tolist())
    except TypeError:
        with pytest.raises(TypeError, match="randperm"):
            tw.randperm(make(tw))
        return
    assert sorted(tw.randperm(make(tw)).tolist()) == expected


@pytest.mark.parametrize("weights,num_samples,replacement", [
    ([-1.0, 1.0, 0.0], 4, True), ([float("inf"), 1.0], 4, True), ([1.0, float("nan")], 4, True),
    ([-1.0, 1.0], 1, True), ([0.0, 0.0], 3, True), ([0.0, 0.0], 2, False), ([-1.0, 1.0, 2.0], 2, False)])
def test_weighted_random_sampler_bad_weights_are_torchs_errors(weights, num_samples, replacement):
    _same_error(lambda lib, m: list(m.WeightedRandomSampler(weights, num_samples, replacement=replacement)))


def test_weighted_random_sampler_without_replacement_and_too_few_non_zero_weights_is_torchs():
    """torch draws without complaint once the non-zero weights run out (the rest come from zero weights)."""
    for m, lib in ((tw.utils.data, tw), (torch.utils.data, torch)):
        draws = list(m.WeightedRandomSampler([0.0, 1.0, 0.0], 2, replacement=False,
                                             generator=lib.Generator().manual_seed(0)))
        assert len(draws) == len(set(draws)) == 2 and 1 in draws


def test_concat_dataset_negative_indices_and_cumulative_sizes_match_torch():
    def probe(m):
        both = m.ConcatDataset([range(3), range(0), range(10, 12)])
        return both.cumulative_sizes, len(both), [both[i] for i in range(-5, 5)]

    assert probe(tw.utils.data) == probe(torch.utils.data)
    for index in (-6, 5):
        _same_error(lambda lib, m, index=index: m.ConcatDataset([range(3), range(10, 12)])[index])


@pytest.mark.parametrize("n", [0, 3, 7, 10, 11])
@pytest.mark.parametrize("fractions", [[0.1] * 10, [1 / 3] * 3, [0.7, 0.2, 0.1], [0.999, 0.001], [0.5, 0.5, 0.0]])
def test_random_split_hands_out_the_remainder_as_torch_does(n, fractions):
    with _recorded() as ours_warned:
        ours = [len(s) for s in random_split(range(n), fractions)]
    with _recorded() as theirs_warned:
        theirs = [len(s) for s in torch.utils.data.random_split(range(n), fractions)]
    assert ours == theirs
    assert [str(w.message) for w in ours_warned] == [str(w.message) for w in theirs_warned]


def _recorded():
    import warnings

    class Recorded(warnings.catch_warnings):
        def __enter__(self):
            caught = super().__enter__()
            warnings.simplefilter("always")
            return caught

    return Recorded(record=True)


@pytest.mark.parametrize("n,replicas,drop_last", [(5, 2, False), (5, 2, True), (1, 3, False), (3, 5, False),
                                                  (10, 4, True), (13, 3, False)])
def test_distributed_sampler_shuffled_shares_partition_like_torchs(n, replicas, drop_last):
    """The shuffled shares equal torch's exactly (same permutation), each epoch, padding and cutting included."""
    def shares(m, epoch):
        samplers = [m.DistributedSampler(range(n), num_replicas=replicas, rank=r, seed=7, drop_last=drop_last)
                    for r in range(replicas)]
        for s in samplers:
            s.set_epoch(epoch)
        return [(list(s), len(s)) for s in samplers]

    for epoch in (0, 1, 2):
        assert shares(tw.utils.data, epoch) == shares(torch.utils.data, epoch)


@pytest.mark.parametrize("batch", [
    [np.bool_(True), np.bool_(False)], [np.float64(1.5), np.float64(2.5)], [np.array(3.0), np.array(4.0)],
    [True, False], [2**40, 1], [1, 2.5], [1.5, 2],
    [np.array([True, False])] * 2, [np.zeros((2, 3), np.float16)] * 2, [((1, 2), (3,)), ((4, 5), (6,))],
    [{"a": {"b": 1.5, "c": "s"}, "d": b"x"}] * 2])
def test_default_collate_numpy_scalars_and_python_numbers_match_torch(batch):
    from test_data_workers import plain

    assert plain(default_collate(batch)) == plain(torch.utils.data.default_collate(batch))


@pytest.mark.parametrize("batch", [[tw.zeros(2), tw.zeros(3)], [np.zeros(2), np.zeros(3)], [2**64, 1], [1 + 2j, 3j]])
def test_default_collate_ragged_and_overflowing_batches_are_torchs_errors(batch):
    theirs_batch = [torch.zeros(b.shape[0]) if isinstance(b, tw.Tensor) else b for b in batch]
    with pytest.raises(Exception) as theirs:
        torch.utils.data.default_collate(theirs_batch)
    with pytest.raises(type(theirs.value)) as ours:
        default_collate(batch)
    assert str(theirs.value).replace("stack ", "") in str(ours.value)


def test_pin_memory_on_a_host_without_an_accelerator_is_torchs():
    import warnings

    messages, pinned = [], []
    for m in (tw.utils.data, torch.utils.data):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pinned.append([b.is_pinned() for b in m.DataLoader(range(4), batch_size=2, pin_memory=True)])
        messages.append([str(w.message) for w in caught])
    assert pinned[0] == pinned[1] and messages[0] == messages[1]
