"""Making modules: ``skip_init`` (parameters left uninitialised) and the weight memory-format converters."""

from __future__ import annotations

import inspect


def skip_init(module_cls, *args, **kwargs):
    """``module_cls(*args, **kwargs)`` with its parameters and buffers left as ``empty`` made them: the
    initialisers of ``nn.init`` leave them alone and draw no random numbers (torch builds on the meta device and
    then allocates; the result is the same: values that were never written)."""
    from tilewise.nn.modules.module import Module

    if not (isinstance(module_cls, type) and issubclass(module_cls, Module)):
        raise RuntimeError(f"Expected a Module; got {module_cls}")
    if "device" not in inspect.signature(module_cls).parameters:
        raise RuntimeError("Module must support a 'device' arg to skip initialization")
    from tilewise.nn.init import SKIPPING

    outer, SKIPPING.on = SKIPPING.on, True
    try:
        return module_cls(*args, **kwargs)
    finally:
        SKIPPING.on = outer


def convert_conv2d_weight_memory_format(module, memory_format):
    """Put the weights of every Conv2d/ConvTranspose2d below ``module`` in ``memory_format``; returns ``module``."""
    return _convert(module, memory_format, ("Conv2d", "ConvTranspose2d"))


def convert_conv3d_weight_memory_format(module, memory_format):
    """Put the weights of every Conv3d/ConvTranspose3d below ``module`` in ``memory_format``; returns ``module``."""
    return _convert(module, memory_format, ("Conv3d", "ConvTranspose3d"))


def _convert(module, memory_format, kinds):
    if type(module).__name__ in kinds:
        module.weight.data = module.weight.detach().clone(memory_format=memory_format)
    for child in module.children():
        _convert(child, memory_format, kinds)
    return module
