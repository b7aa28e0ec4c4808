"""The policies ``fully_shard`` takes, with torch.distributed.fsdp's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.dtypes import DType


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: the dtype parameters are all-gathered in and the forward/backward compute in (None: the
    parameters' own); ``reduce_dtype``: the dtype gradients are reduce-scattered in (None: ``param_dtype``);
    ``output_dtype``: the dtype of the module's floating-point outputs (None: unchanged);
    ``cast_forward_inputs``: cast floating-point inputs of the forward to ``param_dtype``.

    >>> import tilewise as tw
    >>> MixedPrecisionPolicy(param_dtype=tw.bfloat16, reduce_dtype=tw.float32).reduce_dtype
    tilewise.float32
    """

    param_dtype: DType | None = None
    reduce_dtype: DType | None = None
    output_dtype: DType | None = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading: the shards stay on the parameters' device."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """The shards (and so the optimizer's state and step) live on the CPU; they are copied to the parameters'
    device for the all-gather, and the reduce-scattered gradients are copied back."""

    pin_memory: bool = True
