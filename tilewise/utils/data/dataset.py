"""Datasets: the map-style and iterable protocols, and the ways torch combines them.

A map-style ``Dataset`` answers ``dataset[i]`` (and optionally ``__getitems__`` for a whole batch) and ``len``;
an ``IterableDataset`` is a stream. ``TensorDataset`` indexes tensors along their first dimension,
``StackDataset`` zips datasets into tuples or dicts, ``ConcatDataset`` puts datasets end to end, ``ChainDataset``
chains streams, ``Subset`` picks indices and ``random_split`` cuts a dataset into random disjoint subsets (by
lengths or by fractions). Errors are torch's, type and message.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import warnings
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from tilewise.tensor import Tensor
from tilewise.utils.data import _torch_stream

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses implement ``__getitem__`` (and usually ``__len__``)."""

    def __getitem__(self, index) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], Iterable[T_co]):
    """A stream of samples: subclasses implement ``__iter__``. With ``num_workers > 0`` every worker iterates its
    own copy of the whole stream; shard it with ``get_worker_info()`` so that workers do not repeat samples.

    >>> import tilewise as tw
    >>> from tilewise.utils.data import DataLoader, IterableDataset
    >>> class Numbers(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(5))
    >>> [b.tolist() for b in DataLoader(Numbers(), batch_size=2)]
    [[0, 1], [2, 3], [4]]
    """

    def __add__(self, other: Dataset[T_co]):
        return ChainDataset([self, other])


class TensorDataset(Dataset[tuple[Tensor, ...]]):
    """Samples are ``tuple(t[i] for t in tensors)``; every tensor must have the same first dimension.

    >>> import tilewise as tw
    >>> ds = tw.utils.data.TensorDataset(tw.arange(6).view(3, 2), tw.tensor([0, 1, 0]))
    >>> len(ds), ds[1][0].tolist(), ds[1][1].item()
    (3, [2, 3], 1)
    """

    tensors: tuple[Tensor, ...]

    def __init__(self, *tensors: Tensor) -> None:
        if any(tensors[0].size(0) != t.size(0) for t in tensors):
            sizes = [t.size(0) for t in tensors]
            raise AssertionError(f"Size mismatch between tensors: their first dimensions are {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].size(0)


class StackDataset(Dataset):
    """Several datasets of one length, zipped: samples are tuples (datasets given positionally) or dicts (given
    by keyword).

    >>> from tilewise.utils.data import StackDataset
    >>> StackDataset(image=[10, 11], label=[0, 1])[1]
    {'image': 11, 'label': 1}
    """

    datasets: tuple | dict

    def __init__(self, *args: Dataset, **kwargs: Dataset) -> None:
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) like "
                             "input/output, but both types are given.")
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        parts = args or list(kwargs.values())
        self._length = len(parts[0])
        if any(self._length != len(dataset) for dataset in parts):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args or kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: dataset[index] for k, dataset in self.datasets.items()}
        return tuple(dataset[index] for dataset in self.datasets)

    def __getitems__(self, indices: list):
        named = isinstance(self.datasets, dict)
        parts = self.datasets.items() if named else enumerate(self.datasets)
        samples: list = [{} if named else [] for _ in indices]
        for key, dataset in parts:
            for sample, item in zip(samples, _items(dataset, indices)):
                if named:
                    sample[key] = item
                else:
                    sample.append(item)
        return samples if named else [tuple(sample) for sample in samples]

    def __len__(self) -> int:
        return self._length


def _items(dataset, indices: list) -> list:
    if callable(getattr(dataset, "__getitems__", None)):
        items = dataset.__getitems__(indices)
        if len(items) != len(indices):
            raise ValueError(f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}")
        return items
    return [dataset[i] for i in indices]


class ConcatDataset(Dataset[T_co]):
    """Several datasets, one after another.

    >>> from tilewise.utils.data import ConcatDataset
    >>> both = ConcatDataset([[0, 1, 2], [10, 11]])
    >>> len(both), both[3], both[-1]
    (5, 10, 11)
    """

    datasets: list[Dataset[T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence) -> list[int]:
        return list(itertools.accumulate(len(e) for e in sequence))

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        sample_idx = idx - self.cumulative_sizes[dataset_idx - 1] if dataset_idx else idx
        return self.datasets[dataset_idx][sample_idx]


class ChainDataset(IterableDataset):
    """Several iterable datasets, one stream after another (chained lazily)."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            total += len(d)
        return total


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``."""

    dataset: Dataset[T_co]
    indices: Sequence[int]

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices
        if type(self).__getitem__ is not Subset.__getitem__ and type(self).__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{type(self).__name__} overrides __getitem__ but not __getitems__. When subclassing Subset and "
                "overriding __getitem__, you must also override __getitems__ to ensure DataLoader works correctly "
                "with your custom logic. A simple implementation:\n\ndef __getitems__(self, indices):\n"
                "    return [self.__getitem__(idx) for idx in indices]")

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list[T_co]:
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[idx] for idx in indices])
        return [self.dataset[self.indices[idx]] for idx in indices]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset: Dataset[T], lengths: Sequence[int | float], generator=None) -> list[Subset[T]]:
    """Split ``dataset`` into random, non-overlapping subsets of the given lengths, or of the given fractions
    (``floor(fraction * len(dataset))`` each, the remainder handed out one by one, round robin). The permutation
    is the one torch draws from ``generator`` seeded alike (tilewise's default generator when None; see [Note:
    sampler streams]).

    >>> import tilewise as tw
    >>> from tilewise.utils.data import random_split
    >>> train, val = random_split(range(10), [0.7, 0.3], generator=tw.Generator().manual_seed(0))
    >>> len(train), len(val), sorted(train.indices + val.indices) == list(range(10))
    (7, 3, True)
    """
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        lengths = _lengths_of_fractions(len(dataset), lengths)
    if sum(lengths) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    indices = _torch_stream.randperm(operator.index(sum(lengths)), generator)
    return [Subset(dataset, indices[offset - length:offset])
            for offset, length in zip(itertools.accumulate(lengths), lengths)]


def _lengths_of_fractions(n: int, fractions: Sequence[float]) -> list[int]:
    lengths = []
    for i, frac in enumerate(fractions):
        if frac < 0 or frac > 1:
            raise ValueError(f"Fraction at index {i} is not between 0 and 1")
        lengths.append(math.floor(n * frac))
    for i in range(n - sum(lengths)):
        lengths[i % len(lengths)] += 1
    for i, length in enumerate(lengths):
        if length == 0:
            warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.", stacklevel=3)
    return lengths
