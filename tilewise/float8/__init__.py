"""FP8 training: ``convert_to_float8_training(model)`` swaps ``nn.Linear`` layers for :class:`Float8Linear`, whose
GEMMs run in FP8 (see [Note: FP8 training] in ``float8/linear.py``). The names follow torchao.float8.

>>> import tilewise as tw
>>> from tilewise.float8 import convert_to_float8_training
>>> model = convert_to_float8_training(tw.nn.Sequential(tw.nn.Linear(32, 32), tw.nn.ReLU(), tw.nn.Linear(32, 8)),
...                                    module_filter_fn=lambda mod, fqn: fqn != "2")
>>> [type(m).__name__ for m in model]
['Float8Linear', 'ReLU', 'Linear']
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise import dtypes
from tilewise._grad_mode import no_grad
from tilewise.float8.config import (
    CastConfig,
    DelayedScalingConfig,
    Float8GemmConfig,
    Float8LinearConfig,
    ScalingGranularity,
    ScalingType,
)
from tilewise.float8.linear import Float8Linear, amax_to_scale, cast_to_float8
from tilewise.nn import Linear, Module


def convert_to_float8_training(module: Module, *, module_filter_fn: Callable[[Module, str], bool] | None = None,
                               config: Float8LinearConfig | None = None) -> Module:
    """Swap every ``nn.Linear`` of ``module`` (in place, and ``module`` itself if it is one) for a
    :class:`Float8Linear` sharing its parameters; ``module_filter_fn(mod, fqn)`` returning False keeps a layer as
    it is. Returns the module."""
    config = config or Float8LinearConfig()

    def swap(mod: Module, fqn: str) -> Module:
        # every Linear, subclasses too (torchao's isinstance), but not one already converted
        if isinstance(mod, Linear) and not isinstance(mod, Float8Linear) and (
                module_filter_fn is None or module_filter_fn(mod, fqn)):
            return Float8Linear.from_float(mod, config)
        for name, child in list(mod.named_children()):
            new = swap(child, f"{fqn}.{name}" if fqn else name)
            if new is not child:
                mod.add_module(name, new)  # in place: the order of the children stays
        return mod

    return swap(module, "")


def sync_float8_amax_and_scale_history(model: Module) -> None:
    """Delayed scaling, once per step (after the backward): each history takes the amax recorded this step at
    its front (the oldest drops off) and each scale is recomputed from its reduced history."""
    with no_grad():
        for mod in model.modules():
            if not isinstance(mod, Float8Linear) or not mod.config.uses_delayed_scaling:
                continue
            reduce = mod.config.delayed_scaling_config.scale_fn_name
            for name in Float8Linear.OPERANDS:
                if mod.cast_config(name).scaling_type is not ScalingType.DELAYED:
                    continue
                history = getattr(mod, f"fp8_amax_history_{name}")
                rolled = history.roll(1)
                rolled[0:1] = getattr(mod, f"fp8_amax_{name}")
                history.copy_(rolled)
                amax = history.amax() if reduce == "max" else history.mean()
                dtype = dtypes.float8_e5m2 if name == "grad_output" else dtypes.float8_e4m3fn
                getattr(mod, f"fp8_scale_{name}").copy_(amax_to_scale(amax, dtype).reshape(1))
            if not mod.delayed_scales_synced:  # set once: a compiled step that sets it records again next call
                mod.delayed_scales_synced = True


__all__ = ["CastConfig", "DelayedScalingConfig", "Float8GemmConfig", "Float8Linear", "Float8LinearConfig",
           "ScalingGranularity", "ScalingType", "amax_to_scale", "cast_to_float8", "convert_to_float8_training",
           "sync_float8_amax_and_scale_history"]
