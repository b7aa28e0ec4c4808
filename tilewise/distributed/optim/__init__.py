"""torch.distributed.optim's names: optimizers that know the ranks of a process group."""

from tilewise.distributed.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
