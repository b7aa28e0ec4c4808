"""tilewise.nn.parallel: torch.nn.parallel's DistributedDataParallel (see [Note: DistributedDataParallel]).

>>> from tilewise.nn.parallel import DistributedDataParallel as DDP
"""

from tilewise.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
