"""torch.distributed.fsdp's names for FSDP2: ``fully_shard`` and its policies."""

from tilewise.distributed.fsdp.api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from tilewise.distributed.fsdp.fully_shard import FSDPModule, UnshardHandle, fully_shard
from tilewise.distributed.fsdp.param_group import ShardSpec

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "ShardSpec", "UnshardHandle",
           "fully_shard"]
