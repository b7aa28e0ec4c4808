"""Samplers: the order in which a DataLoader reads a map-style dataset.

[Note: samplers] Each sampler draws from a tilewise Generator (its own if given, so ``manual_seed`` makes an
epoch reproducible) and draws lazily: ``RandomSampler(replacement=True)`` draws 32 indices at a time, as torch
does, so ``num_samples=10**10`` costs nothing until it is iterated; without replacement it draws one permutation
per pass over the dataset. Without a generator, ``RandomSampler`` seeds a fresh one from the default generator at
the start of each epoch (torch's rule, so an epoch's order does not depend on what else drew random numbers
during it). The draws are torch's CPU draws for the same seed (see [Note: sampler streams]), so a seeded
sampler gives the indices torch gives; the structure and the errors are torch's too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Generic, TypeVar

from tilewise.utils.data import _torch_stream

T_co = TypeVar("T_co", covariant=True)

_CHUNK = 32  # indices RandomSampler draws per call with replacement (torch's)


class Sampler(Generic[T_co]):
    """Base class of samplers: ``__iter__`` yields indices (or lists of indices), ``__len__`` is optional."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    """``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """A random permutation each epoch; with ``replacement``, ``num_samples`` independent draws (lazily).

    >>> import tilewise as tw
    >>> from tilewise.utils.data import RandomSampler
    >>> sampler = RandomSampler(range(5), generator=tw.Generator().manual_seed(0))
    >>> sorted(sampler)
    [0, 1, 2, 3, 4]
    >>> len(RandomSampler(range(5), replacement=True, num_samples=10**10))
    10000000000
    """

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator=None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        generator = self.generator if self.generator is not None else _fresh_generator()
        if self.replacement:
            for _ in range(self.num_samples // _CHUNK):
                yield from _torch_stream.randint(n, _CHUNK, generator)
            yield from _torch_stream.randint(n, self.num_samples % _CHUNK, generator)
            return
        for _ in range(self.num_samples // n):
            yield from _torch_stream.randperm(n, generator)
        yield from _torch_stream.randperm(n, generator)[:self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


def _fresh_generator():
    """A generator seeded from the default generator (what torch's samplers do when given none)."""
    from tilewise.ops.creation import Generator

    return Generator().manual_seed(_torch_stream.random_seed())


class SubsetRandomSampler(Sampler[int]):
    """The given indices in a random order (without replacement)."""

    def __init__(self, indices: Sequence[int], generator=None) -> None:
        self.indices, self.generator = indices, generator

    def __iter__(self) -> Iterator[int]:
        for i in _torch_stream.randperm(len(self.indices), self.generator):
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """``num_samples`` indices into ``weights``, each drawn with probability proportional to its weight.

    >>> import tilewise as tw
    >>> from tilewise.utils.data import WeightedRandomSampler
    >>> draws = list(WeightedRandomSampler([0.0, 1.0, 0.0], 4, generator=tw.Generator().manual_seed(0)))
    >>> draws
    [1, 1, 1, 1]
    """

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True, generator=None) -> None:
        from tilewise.dtypes import float64
        from tilewise.tensor import as_tensor

        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights_tensor = as_tensor(weights, dtype=float64)
        if len(weights_tensor.shape) != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape "
                             f"{tuple(weights_tensor.shape)}")
        self.weights = weights_tensor
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        if self.weights.device.type != "cpu":  # torch draws these from the device's own generator
            from tilewise.ops.functions import multinomial

            yield from multinomial(self.weights, self.num_samples, self.replacement,
                                   generator=self.generator).tolist()
            return
        yield from _torch_stream.multinomial(self.weights, self.num_samples, self.replacement, self.generator)

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size`` (the last one shorter unless ``drop_last``).

    >>> from tilewise.utils.data import BatchSampler, SequentialSampler
    >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False))
    [[0, 1, 2], [3, 4, 5], [6]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        sampler_iter = iter(self.sampler)
        if self.drop_last:
            yield from (list(batch) for batch in zip(*[sampler_iter] * self.batch_size))
            return
        batch = list(itertools.islice(sampler_iter, self.batch_size))
        while batch:
            yield batch
            batch = list(itertools.islice(sampler_iter, self.batch_size))

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size
