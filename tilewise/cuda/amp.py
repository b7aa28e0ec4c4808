"""``tilewise.cuda.amp``: torch.cuda.amp's deprecated spellings of ``tilewise.amp`` (``autocast`` for "cuda",
``GradScaler("cuda", ...)``, ``custom_fwd``/``custom_bwd``), each warning as torch's do (FutureWarning)."""

from __future__ import annotations

import functools
import warnings

from tilewise import amp as _amp
from tilewise.dtypes import DType, float16

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


class autocast(_amp.autocast):  # noqa: N801 — torch's name
    """``tilewise.amp.autocast("cuda", ...)`` (torch.cuda.amp.autocast, deprecated)."""

    def __init__(self, enabled: bool = True, dtype: DType = float16, cache_enabled: bool = True) -> None:
        _deprecated("tilewise.cuda.amp.autocast(args...)", "tilewise.amp.autocast('cuda', args...)")
        super().__init__("cuda", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_amp.GradScaler):
    """``tilewise.amp.GradScaler("cuda", ...)`` (torch.cuda.amp.GradScaler, deprecated)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        _deprecated("tilewise.cuda.amp.GradScaler(args...)", "tilewise.amp.GradScaler('cuda', args...)")
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``tilewise.amp.custom_fwd(..., device_type="cuda")`` (deprecated)."""
    _deprecated("tilewise.cuda.amp.custom_fwd(args...)", "tilewise.amp.custom_fwd(args..., device_type='cuda')")
    return functools.partial(_amp.custom_fwd, device_type="cuda")(fwd=fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """``tilewise.amp.custom_bwd(..., device_type="cuda")`` (deprecated)."""
    _deprecated("tilewise.cuda.amp.custom_bwd(args...)", "tilewise.amp.custom_bwd(args..., device_type='cuda')")
    return functools.partial(_amp.custom_bwd, device_type="cuda")(bwd)
