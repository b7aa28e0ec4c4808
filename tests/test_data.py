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
