"""Datasets, samplers and the DataLoader (torch.utils.data's names and behaviour, single-process).

[Note: data loading] A DataLoader is three pieces: a sampler that yields indices (in order, or a
permutation drawn from a tilewise Generator, so ``manual_seed`` makes shuffling reproducible), a batch
sampler that groups indices (``drop_last`` drops a short final batch), and a collate function that turns
a list of samples into a batch (tensors are stacked, numbers become tensors, tuples/lists/dicts are
collated field by field). Loading runs in the calling process. With ``pin_memory=True`` (and a GPU) every
CPU tensor of a batch is copied into page-locked memory, so ``batch.to("cuda", non_blocking=True)`` returns
before the copy has finished and the next batch can be loaded meanwhile.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from numbers import Number
from typing import Any, Generic, TypeVar

import numpy as np

from tilewise.tensor import Tensor

T_co = TypeVar("T_co", covariant=True)


# ---------------------------------------------------------------------------- datasets

class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses implement ``__getitem__`` and ``__len__``."""

    def __getitem__(self, index) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co]):
    """A stream of samples: subclasses implement ``__iter__``."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class TensorDataset(Dataset[tuple]):
    """Samples are ``(t[i] for t in tensors)``; every tensor must have the same first dimension.

    >>> import tilewise as tw
    >>> ds = tw.utils.data.TensorDataset(tw.arange(6).view(3, 2), tw.tensor([0, 1, 0]))
    >>> len(ds), ds[1][0].tolist(), ds[1][1].item()
    (3, [2, 3], 1)
    """

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        sizes = [t.shape[0] for t in tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"Size mismatch between tensors: first dimensions are {sizes}; they must all be equal")
        self.tensors = tensors

    def __getitem__(self, index) -> tuple:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def batch(self, indices: list[int]) -> tuple:
        """The collated batch of the samples at ``indices``: what ``default_collate`` would build, by one gather."""
        from tilewise.tensor import tensor

        return tuple(t[tensor(indices, device=t.device)] for t in self.tensors)


class ConcatDataset(Dataset):
    """Several datasets, one after another."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]))

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def __getitem__(self, index: int):
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index += len(self)
        k = bisect.bisect_right(self.cumulative_sizes, index)
        start = int(self.cumulative_sizes[k - 1]) if k else 0
        return self.datasets[k][index - start]


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``."""

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, index) -> T_co:
        if isinstance(index, list):
            return [self.dataset[self.indices[i]] for i in index]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset: Dataset, lengths: Sequence[float | int], generator=None) -> list[Subset]:
    """Split into non-overlapping subsets of the given lengths (or fractions summing to 1)."""
    from tilewise.ops.creation import randperm

    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts = [int(math.floor(n * frac)) for frac in lengths]
        for k in range(n - sum(counts)):
            counts[k % len(counts)] += 1
        lengths = counts
    if sum(lengths) != n:
        raise ValueError(f"Sum of input lengths ({sum(lengths)}) does not equal the length of the input dataset ({n})")
    order = randperm(n, generator=generator).tolist()
    out, offset = [], 0
    for length in lengths:
        out.append(Subset(dataset, order[offset:offset + length]))
        offset += length
    return out


# ---------------------------------------------------------------------------- samplers

class Sampler(Generic[T_co]):
    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """A fresh random permutation each epoch, from ``generator`` (or tilewise's default generator)."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator=None) -> None:
        self.data_source, self.replacement, self._num_samples, self.generator = (data_source, replacement,
                                                                                 num_samples, generator)
        if self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        from tilewise.ops.creation import randint, randperm

        n = len(self.data_source)
        if self.replacement:
            yield from randint(0, n, (self.num_samples,), generator=self.generator).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=self.generator).tolist()
        yield from randperm(n, generator=self.generator).tolist()[:self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    def __init__(self, indices: Sequence[int], generator=None) -> None:
        self.indices, self.generator = indices, generator

    def __iter__(self) -> Iterator[int]:
        from tilewise.ops.creation import randperm

        for k in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[k]

    def __len__(self) -> int:
        return len(self.indices)


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size


# ---------------------------------------------------------------------------- collation

def default_convert(data: Any) -> Any:
    """numpy arrays become tensors (recursively in containers); everything else is left alone."""
    from tilewise.tensor import as_tensor

    if isinstance(data, np.ndarray):
        return as_tensor(data)
    if isinstance(data, Mapping):
        return type(data)({k: default_convert(v) for k, v in data.items()}) if isinstance(data, dict) else data
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(v) for v in data)
    return data


def default_collate(batch: list) -> Any:
    """Stack a list of samples into a batch, field by field.

    >>> import tilewise as tw
    >>> x, y = tw.utils.data.default_collate([(tw.ones(2), 0), (tw.zeros(2), 1)])
    >>> x.shape, y.tolist()
    (tilewise.Size([2, 2]), [0, 1])
    """
    from tilewise import stack
    from tilewise.tensor import as_tensor, tensor

    first = batch[0]
    if isinstance(first, Tensor):
        return stack(batch, 0)
    if isinstance(first, np.ndarray):
        return stack([as_tensor(b) for b in batch], 0)
    if isinstance(first, (bool, Number, np.number)) and not isinstance(first, str):
        return tensor(batch)
    if isinstance(first, (str, bytes)):
        return batch
    if isinstance(first, Mapping):
        return {key: default_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(default_collate(list(field)) for field in zip(*batch)))
    if isinstance(first, Sequence):
        if any(len(sample) != len(first) for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [default_collate(list(field)) for field in zip(*batch)]
        return tuple(fields) if isinstance(first, tuple) else fields
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
                    f"{type(first).__name__}")


# ---------------------------------------------------------------------------- the loader

class DataLoader(Generic[T_co]):
    """Iterate over ``dataset`` in batches.

    >>> import tilewise as tw
    >>> ds = tw.utils.data.TensorDataset(tw.arange(10.0))
    >>> [b[0].tolist() for b in tw.utils.data.DataLoader(ds, batch_size=4, drop_last=True)]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """

    def __init__(self, dataset: Dataset[T_co], batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | Iterable | None = None, batch_sampler: Sampler | Iterable | None = None,
                 num_workers: int = 0, collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False,
                 drop_last: bool = False, generator=None) -> None:
        if num_workers != 0:
            raise ValueError(f"DataLoader: num_workers={num_workers}, but tilewise loads data in the calling process; "
                             "use num_workers=0")
        self.dataset, self.num_workers, self.pin_memory, self.generator = dataset, num_workers, pin_memory, generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle, sampler and batch_sampler")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        auto_batching = batch_sampler is not None or (self._iterable and batch_size is not None)
        self.collate_fn = collate_fn or (default_collate if auto_batching else default_convert)

    def __iter__(self) -> Iterator:
        if not self.pin_memory or not _pinning_available():
            yield from self._batches()
            return
        for batch in self._batches():
            yield pin_memory(batch)

    def _batches(self) -> Iterator:
        if self._iterable:
            yield from self._iterate_stream()
        elif self.batch_sampler is not None:
            for indices in self.batch_sampler:
                yield self._fetch(indices)
        else:
            for index in self.sampler:
                yield self.collate_fn(self.dataset[index])

    def _fetch(self, indices: list[int]):
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is default_collate:
            return self.dataset.batch(indices)  # one gather per tensor instead of len(indices) lookups and a stack
        return self.collate_fn([self.dataset[i] for i in indices])

    def _iterate_stream(self) -> Iterator:
        if self.batch_size is None:
            for sample in self.dataset:
                yield self.collate_fn(sample)
            return
        batch: list = []
        for sample in self.dataset:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)


def _pinning_available() -> bool:
    """torch's rule: without a GPU, ``pin_memory=True`` warns and loads into ordinary memory."""
    from tilewise import cuda

    if cuda.is_available():
        return True
    import warnings

    warnings.warn("DataLoader: pin_memory=True, but no GPU was found, so batches stay in ordinary (pageable) memory",
                  stacklevel=3)
    return False


def pin_memory(batch):
    """``batch`` with every CPU tensor in it copied to page-locked memory (tuples, lists, dicts and named tuples
    are rebuilt around the pinned tensors; anything else is returned as it is)."""
    if isinstance(batch, Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, Mapping):
        return type(batch)({k: pin_memory(v) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pin_memory(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(pin_memory(v) for v in batch)
    return batch


__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "Subset", "random_split", "Sampler",
           "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "BatchSampler", "default_collate",
           "default_convert", "DataLoader"]
