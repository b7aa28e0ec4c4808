"""``tilewise.cpu.amp``: torch.cpu.amp's deprecated spellings of ``tilewise.amp`` (``autocast`` for "cpu",
``GradScaler("cpu", ...)``), each warning as torch's do (FutureWarning)."""

from __future__ import annotations

import warnings

from tilewise import amp as _amp
from tilewise.dtypes import DType, bfloat16

__all__ = ["GradScaler", "autocast"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


class autocast(_amp.autocast):  # noqa: N801 — torch's name
    """``tilewise.amp.autocast("cpu", ...)`` (torch.cpu.amp.autocast, deprecated)."""

    def __init__(self, enabled: bool = True, dtype: DType = bfloat16, cache_enabled: bool = True) -> None:
        _deprecated("tilewise.cpu.amp.autocast(args...)", "tilewise.amp.autocast('cpu', args...)")
        super().__init__("cpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_amp.GradScaler):
    """``tilewise.amp.GradScaler("cpu", ...)`` (torch.cpu.amp.GradScaler, deprecated)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        _deprecated("tilewise.cpu.amp.GradScaler(args...)", "tilewise.amp.GradScaler('cpu', args...)")
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
