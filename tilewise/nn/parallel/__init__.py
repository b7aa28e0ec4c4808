"""tilewise.nn.parallel: torch.nn.parallel's DistributedDataParallel (see [Note: DistributedDataParallel]) and
DataParallel with its scatter, replicate, parallel_apply and gather (see [Note: DataParallel]).

>>> from tilewise.nn.parallel import DistributedDataParallel as DDP
"""

from tilewise.nn.parallel.data_parallel import (
    DataParallel,
    data_parallel,
    gather,
    parallel_apply,
    replicate,
    scatter,
    scatter_kwargs,
)
from tilewise.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DataParallel", "DistributedDataParallel", "data_parallel", "gather", "parallel_apply", "replicate",
           "scatter", "scatter_kwargs"]
