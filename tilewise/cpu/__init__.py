"""``tilewise.cpu``: torch.cpu's device functions (one CPU device, always available, nothing to wait for), and
``tilewise.cpu.amp``, torch.cpu.amp's deprecated spellings.

>>> import tilewise as tw
>>> tw.cpu.is_available(), tw.cpu.device_count(), tw.cpu.current_device()
(True, 1, 'cpu')
"""

from __future__ import annotations

from typing import Any

__all__ = ["current_device", "device_count", "is_available", "set_device", "synchronize"]


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> str:
    return "cpu"


def set_device(device: Any) -> None:
    """A no-op, as torch.cpu.set_device: there is one CPU device."""


def synchronize(device: Any = None) -> None:
    """A no-op: CPU operators have finished when they return."""
