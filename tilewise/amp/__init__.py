"""``tilewise.amp``: automatic mixed precision (``autocast``, its helpers for custom autograd Functions, and
``GradScaler``).

See [Note: autocast] in ``autocast_mode.py`` for the casting policy, [Note: gradient scaling] in
``grad_scaler.py`` for loss scaling.

>>> import tilewise as tw
>>> tw.amp.autocast is tw.autocast
True
"""

from __future__ import annotations

import functools

from tilewise.amp.autocast_mode import (
    autocast,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_available,
    is_autocast_cache_enabled,
    is_autocast_enabled,
)
from tilewise.amp.grad_scaler import GradScaler, OptState
from tilewise.dtypes import DType, float64
from tilewise.tensor import Tensor

__all__ = ["GradScaler", "OptState", "autocast", "clear_autocast_cache", "custom_bwd", "custom_fwd",
           "get_autocast_dtype", "is_autocast_available", "is_autocast_cache_enabled", "is_autocast_enabled"]


def _cast(value, device_type: str, dtype: DType):
    """``value`` with its floating tensors on ``device_type`` (float64 excepted) cast to ``dtype``, inside
    lists, tuples and dicts too."""
    if isinstance(value, Tensor):
        eligible = value.is_floating_point() and value.dtype is not float64 and value.device.type == device_type
        return value.to(dtype) if eligible else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, device_type, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, device_type, dtype) for k, v in value.items()}
    return value


def custom_fwd(fwd=None, *, device_type: str, cast_inputs: DType | None = None):
    """Decorate the ``forward`` of a custom ``autograd.Function`` (torch.amp.custom_fwd): with ``cast_inputs``,
    inside an autocast region forward runs with autocast off on inputs cast to that dtype; without it,
    forward runs under the region's autocast and ``custom_bwd`` runs backward under the same state."""
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(ctx, *args, **kwargs):
        ctx._autocast_dtype = get_autocast_dtype(device_type)
        enabled = is_autocast_enabled(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = enabled
            return fwd(ctx, *args, **kwargs)
        ctx._fwd_used_autocast = False
        if not enabled:
            return fwd(ctx, *args, **kwargs)
        with autocast(device_type, enabled=False):
            return fwd(ctx, *_cast(args, device_type, cast_inputs), **_cast(kwargs, device_type, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str):
    """Decorate the ``backward`` of a custom ``autograd.Function`` whose forward has ``custom_fwd``: backward
    runs under the autocast state forward ran under (torch.amp.custom_bwd)."""
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(ctx, *args, **kwargs):
        with autocast(device_type, dtype=ctx._autocast_dtype, enabled=ctx._fwd_used_autocast):
            return bwd(ctx, *args, **kwargs)

    return decorate_bwd
