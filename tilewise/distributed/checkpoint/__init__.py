"""torch.distributed.checkpoint's names: sharded save and load, and full/sharded state-dict helpers."""

from tilewise.distributed.checkpoint.api import load, save
from tilewise.distributed.checkpoint.metadata import Metadata

__all__ = ["Metadata", "load", "save"]
