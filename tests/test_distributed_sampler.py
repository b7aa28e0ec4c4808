"""DistributedSampler against torch's: the same index lists for every rank, seed, epoch and dataset length,
the same lengths and the same errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from tilewise.utils.data import DistributedSampler
from tilewise.utils.data.distributed import torch_cpu_randperm


def shares(cls, n, replicas, epoch=0, **kw):
    """Every rank's index list and length for one epoch."""
    out = []
    for rank in range(replicas):
        sampler = cls(range(n), num_replicas=replicas, rank=rank, **kw)
        sampler.set_epoch(epoch)
        out.append((list(sampler), len(sampler)))
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 7, 10, 12, 33, 100])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_index_lists_match_torch(n, replicas, drop_last):
    if n == 0 and not drop_last:
        pytest.skip("torch pads an empty dataset by dividing by zero")
    for seed, epoch, shuffle in [(0, 0, True), (0, 3, True), (7, 1, True), (2**33 + 5, 0, True), (0, 0, False)]:
        kw = dict(seed=seed, shuffle=shuffle, drop_last=drop_last)
        assert shares(DistributedSampler, n, replicas, epoch, **kw) == \
            shares(torch.utils.data.DistributedSampler, n, replicas, epoch, **kw)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 16, 1000, 4099])
@pytest.mark.parametrize("seed", [0, 1, 42, 123456789, 2**32 + 1, -3])
def test_the_permutation_is_torchs_cpu_randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    assert torch_cpu_randperm(n, seed) == torch.randperm(n, generator=g).tolist()


def test_epochs_reshuffle_and_ranks_partition_the_padded_dataset():
    first = [indices for indices, _ in shares(DistributedSampler, 11, 3, epoch=0, seed=5)]
    assert sorted(itertools.chain(*first)) != list(range(12))  # one index repeats as padding
    assert set(itertools.chain(*first)) == set(range(11)) and all(len(share) == 4 for share in first)
    assert [indices for indices, _ in shares(DistributedSampler, 11, 3, epoch=1, seed=5)] != first


@pytest.mark.parametrize("rank,replicas", [(3, 3), (-1, 2)])
def test_invalid_rank_is_torchs_error(rank, replicas):
    errors = []
    for cls in (DistributedSampler, torch.utils.data.DistributedSampler):
        with pytest.raises(ValueError) as info:
            cls(range(3), num_replicas=replicas, rank=rank)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
