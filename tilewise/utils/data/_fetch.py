"""Fetching one batch (or one sample) from a dataset: the step a worker and the single-process loader share.

A map-style dataset is indexed (``__getitems__`` when the dataset has it, else one ``__getitem__`` per index)
and the samples are collated. A ``TensorDataset`` read with ``default_collate`` skips the per-sample lookups and
the stack: one gather per tensor gives the same batch. An iterable dataset is read ``len(indices)`` samples at a
time; the stream's end raises StopIteration (and a short last batch is dropped under ``drop_last``).
"""

from __future__ import annotations

from tilewise.utils.data import collate as _collate
from tilewise.utils.data.dataset import TensorDataset


class DatasetKind:
    Map = 0
    Iterable = 1


class _MapDatasetFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn, self.drop_last = dataset, auto_collation, collate_fn, \
            drop_last
        self._gather = _gathers_rows(dataset, auto_collation, collate_fn)

    def fetch(self, possibly_batched_index):
        if self._gather:
            return [_collate.gather_rows(t, possibly_batched_index) for t in self.dataset.tensors]
        if self.auto_collation:
            if hasattr(self.dataset, "__getitems__") and self.dataset.__getitems__:
                data = self.dataset.__getitems__(possibly_batched_index)
            else:
                data = [self.dataset[idx] for idx in possibly_batched_index]
        else:
            data = self.dataset[possibly_batched_index]
        return self.collate_fn(data)


def _gathers_rows(dataset, auto_collation: bool, collate_fn) -> bool:
    """True when ``default_collate`` of ``dataset``'s samples is exactly one gather per tensor."""
    return (auto_collation and collate_fn is _collate.default_collate and isinstance(dataset, TensorDataset)
            and type(dataset).__getitem__ is TensorDataset.__getitem__
            and getattr(type(dataset), "__getitems__", None) is None
            and not any(t.requires_grad for t in dataset.tensors))


class _IterableDatasetFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn, self.drop_last = dataset, auto_collation, collate_fn, \
            drop_last
        self.dataset_iter = iter(dataset)
        self.ended = False

    def fetch(self, possibly_batched_index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.dataset_iter))
        data = []
        for _ in possibly_batched_index:
            try:
                data.append(next(self.dataset_iter))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(possibly_batched_index)):
            raise StopIteration
        return self.collate_fn(data)


def create_fetcher(kind: int, dataset, auto_collation: bool, collate_fn, drop_last: bool):
    fetcher = _MapDatasetFetcher if kind == DatasetKind.Map else _IterableDatasetFetcher
    return fetcher(dataset, auto_collation, collate_fn, drop_last)
