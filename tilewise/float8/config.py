"""Settings of FP8 training, with torchao.float8's names (``Float8LinearConfig``, ``CastConfig``, ...)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ScalingType(enum.Enum):
    """How a tensor's scale is found: from this step's amax (``DYNAMIC``, "current" scaling) or from a history
    of past amaxes (``DELAYED``)."""

    DYNAMIC = "dynamic"
    DELAYED = "delayed"


class ScalingGranularity(enum.Enum):
    """One scale per tensor (``TENSORWISE``) or per row (``AXISWISE``, rowwise ``_scaled_mm`` scales)."""

    TENSORWISE = "tensorwise"
    AXISWISE = "axiswise"


@dataclass(frozen=True)
class CastConfig:
    """How one operand of the FP8 GEMMs (input, weight or grad_output) is cast."""

    scaling_type: ScalingType = ScalingType.DYNAMIC
    scaling_granularity: ScalingGranularity = ScalingGranularity.TENSORWISE
    target_dtype: object = None  # None: e4m3 for input and weight, e5m2 for grad_output

    def __post_init__(self):
        if not isinstance(self.scaling_type, ScalingType):
            raise TypeError(f"CastConfig: scaling_type must be a ScalingType, got {self.scaling_type!r}")
        if self.scaling_granularity is not ScalingGranularity.TENSORWISE:
            raise NotImplementedError(f"CastConfig: scaling_granularity {self.scaling_granularity.value} is not "
                                      "implemented; FP8 training here scales tensorwise")


@dataclass(frozen=True)
class DelayedScalingConfig:
    """Delayed scaling: the scale comes from the last ``history_len`` amaxes, reduced by ``scale_fn_name``
    ("max", torchao's only choice, or "mean")."""

    history_len: int = 16
    scale_fn_name: str = "max"

    def __post_init__(self):
        if self.history_len < 1:
            raise ValueError(f"DelayedScalingConfig: history_len must be at least 1, got {self.history_len}")
        if self.scale_fn_name not in ("max", "mean"):
            raise ValueError(f"DelayedScalingConfig: scale_fn_name must be 'max' or 'mean', got "
                             f"{self.scale_fn_name!r}")


@dataclass(frozen=True)
class Float8GemmConfig:
    """One of the three FP8 GEMMs: ``use_fast_accum`` takes Hopper's faster FP8 accumulation, which adds the
    tensor cores' partial sums in less than float32's precision (cuBLASLt's ``FAST_ACCUM``; no effect on the CPU
    reference or with ``emulate``).

    >>> from tilewise.float8 import Float8GemmConfig, Float8LinearConfig
    >>> Float8LinearConfig().gemm_config_output, Float8LinearConfig().gemm_config_grad_weight
    (Float8GemmConfig(use_fast_accum=True), Float8GemmConfig(use_fast_accum=False))
    """

    use_fast_accum: bool = False


@dataclass(frozen=True)
class Float8LinearConfig:
    """The casts of a ``Float8Linear``: ``cast_config_input``, ``cast_config_weight`` (e4m3) and
    ``cast_config_grad_output`` (e5m2); its GEMMs: ``gemm_config_output`` (the forward's, fast accumulation by
    default, as torchao's), ``gemm_config_grad_input`` and ``gemm_config_grad_weight``; the delayed-scaling
    history, and ``emulate`` (run the FP8 GEMMs by the CPU reference on any device, for tests).

    >>> from tilewise.float8 import Float8LinearConfig, CastConfig, ScalingType
    >>> Float8LinearConfig(cast_config_weight=CastConfig(ScalingType.DELAYED)).cast_config_weight.scaling_type
    <ScalingType.DELAYED: 'delayed'>
    """

    cast_config_input: CastConfig = field(default_factory=CastConfig)
    cast_config_weight: CastConfig = field(default_factory=CastConfig)
    cast_config_grad_output: CastConfig = field(default_factory=CastConfig)
    delayed_scaling_config: DelayedScalingConfig = field(default_factory=DelayedScalingConfig)
    emulate: bool = False
    pad_inner_dim: bool = False
    gemm_config_output: Float8GemmConfig = field(default_factory=lambda: Float8GemmConfig(use_fast_accum=True))
    gemm_config_grad_input: Float8GemmConfig = field(default_factory=Float8GemmConfig)
    gemm_config_grad_weight: Float8GemmConfig = field(default_factory=Float8GemmConfig)

    def __post_init__(self):
        if self.pad_inner_dim:
            raise NotImplementedError("Float8LinearConfig: pad_inner_dim is not implemented; leave out layers whose "
                                      "features are not multiples of 16 with module_filter_fn")

    @staticmethod
    def from_recipe_name(name: str) -> Float8LinearConfig:
        """"tensorwise" (current scaling of every operand) or "delayed" (delayed scaling of every operand)."""
        if name == "tensorwise":
            return Float8LinearConfig()
        if name == "delayed":
            delayed = CastConfig(ScalingType.DELAYED)
            return Float8LinearConfig(delayed, delayed, delayed)
        raise ValueError(f"Float8LinearConfig.from_recipe_name: unknown recipe {name!r}; recipes: 'tensorwise', "
                         "'delayed'")

    @property
    def uses_delayed_scaling(self) -> bool:
        return any(c.scaling_type is ScalingType.DELAYED for c in
                   (self.cast_config_input, self.cast_config_weight, self.cast_config_grad_output))
