"""tilewise.utils.data: datasets, samplers, collation and the DataLoader, with torch.utils.data's names,
module paths (``dataloader``, ``dataset``, ``sampler``, ``distributed``) and behaviour.

The DataLoader reads a dataset in the calling process or in worker processes (``num_workers``); workers hand
their batches over through shared memory, so a batch's bytes are never pickled (see [Note: data loading] in
``dataloader`` and [Note: shared-memory batches] in ``_shared_memory``).

>>> import tilewise as tw
>>> from tilewise.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(tw.arange(6.0), tw.arange(6)), batch_size=4)
>>> [(x.tolist(), y.tolist()) for x, y in loader]
[([0.0, 1.0, 2.0, 3.0], [0, 1, 2, 3]), ([4.0, 5.0], [4, 5])]
"""

from tilewise.utils.data import _utils
from tilewise.utils.data._pin_memory import pin_memory
from tilewise.utils.data._worker_info import WorkerInfo, get_worker_info
from tilewise.utils.data.collate import default_collate, default_convert
from tilewise.utils.data.dataloader import DataLoader
from tilewise.utils.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from tilewise.utils.data.distributed import DistributedSampler
from tilewise.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ["BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset", "DistributedSampler",
           "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler", "StackDataset", "Subset",
           "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler", "WorkerInfo", "default_collate",
           "default_convert", "get_worker_info", "random_split"]
