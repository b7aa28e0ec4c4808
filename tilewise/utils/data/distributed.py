"""DistributedSampler: each of ``num_replicas`` processes reads its own share of a dataset.

Every replica computes the same order (a permutation seeded by ``seed + epoch``, or the natural order), pads it
by repeating its start until it divides evenly (or, with ``drop_last``, cuts the tail), and keeps every
``num_replicas``-th index from ``rank``: the shares are disjoint and equally long, as in torch.

[Note: torch's permutation] Replicas and resumed runs must agree with torch on which sample each rank reads, so
the shuffled order is torch's own: ``torch.randperm(n, generator=torch.Generator().manual_seed(s))`` on the CPU is
a Fisher-Yates pass whose ``i``-th swap partner is ``i + x_i % (n - i)``, ``x_i`` the ``i``-th 32-bit output of
a Mersenne Twister seeded by the low 32 bits of ``s`` (``_torch_stream``, see [Note: sampler streams]).
tilewise's own ``randperm`` draws from Philox (the same numbers on CPU and GPU) and gives a different
permutation.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Iterator
from typing import TypeVar

from tilewise.utils.data import _torch_stream
from tilewise.utils.data.dataset import Dataset
from tilewise.utils.data.sampler import Sampler

_DISTRIBUTED = "tilewise.distributed"  # an optional package (torch.distributed's counterpart)

T_co = TypeVar("T_co", covariant=True)


class DistributedSampler(Sampler[T_co]):
    """The indices of ``dataset`` that replica ``rank`` of ``num_replicas`` reads; call ``set_epoch`` before each
    epoch to reshuffle.

    >>> from tilewise.utils.data import DistributedSampler
    >>> [list(DistributedSampler(range(5), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    [[0, 2, 4], [1, 3, 0]]
    """

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = _process_group().get_world_size()
        if rank is None:
            rank = _process_group().get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil((len(self.dataset) - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[T_co]:
        if self.shuffle:
            indices = torch_cpu_randperm(len(self.dataset), self.seed + self.epoch)
        else:
            indices = list(range(len(self.dataset)))
        if not self.drop_last:
            padding_size = self.total_size - len(indices)
            if padding_size <= len(indices):
                indices += indices[:padding_size]
            else:
                indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` in the seed of the next permutation, so that every epoch is shuffled differently (and
        identically on every replica)."""
        self.epoch = epoch


def torch_cpu_randperm(n: int, seed: int) -> list[int]:
    """The permutation torch's CPU ``randperm(n)`` gives under a generator seeded with ``seed`` (see [Note:
    torch's permutation])."""
    if n >= _torch_stream.SMALL_PERMUTATION:
        raise NotImplementedError(f"DistributedSampler: shuffling {n} samples (torch draws 64-bit numbers for "
                                  f"{_torch_stream.SMALL_PERMUTATION} or more); use shuffle=False or a smaller "
                                  "dataset")
    return _torch_stream.TwisterStream(seed).permutation(n)


def _process_group():
    """The distributed package, when tilewise has one; torch's error where it has not. It is looked up by
    name because it is optional: no module here depends on it being present."""
    dist = importlib.import_module(_DISTRIBUTED) if importlib.util.find_spec(_DISTRIBUTED) is not None else None
    if dist is None or not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return dist
