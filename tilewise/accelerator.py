"""``tilewise.accelerator``: torch.accelerator's device-agnostic functions. tilewise's accelerator is CUDA, where a
GPU is found (``tilewise.cuda.is_available()``); elsewhere there is none: ``current_accelerator()`` is None, the
counts are 0, and what needs a device raises torch's error.

>>> import tilewise as tw
>>> device = tw.accelerator.current_accelerator() or tw.device("cpu")
>>> tw.accelerator.is_available() == (device.type == "cuda")
True
"""

from __future__ import annotations

import warnings
from typing import Any

from tilewise import cuda
from tilewise.device import Device

__all__ = ["current_accelerator", "current_device_idx", "current_device_index", "device_count", "device_index",
           "empty_cache", "get_memory_info", "is_available", "max_memory_allocated", "memory_allocated",
           "reset_peak_memory_stats", "set_device_idx", "set_device_index", "synchronize"]

NO_ACCELERATOR = "Cannot access accelerator device when none is available."


def current_accelerator(check_available: bool = False) -> Device | None:
    """``tilewise.device("cuda")`` where a GPU is found, else None (a CPU-only machine has no accelerator, whether
    or not the ``[cuda]`` extra is installed)."""
    return Device("cuda") if cuda.is_available() else None


def is_available() -> bool:
    return cuda.is_available()


def device_count() -> int:
    return cuda.device_count() if cuda.is_available() else 0


def _require() -> None:
    if not cuda.is_available():
        raise RuntimeError(NO_ACCELERATOR)


def _index(device: Any) -> int | None:
    """A device index from an int, "cuda", "cuda:1" or a Device of the accelerator's type (None: the current)."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return device
    dev = device if isinstance(device, Device) else Device(str(device))
    if dev.type != "cuda":
        raise ValueError(f"{dev.type} doesn't match the current accelerator cuda.")
    return dev.index


def current_device_index() -> int:
    _require()
    return cuda.current_device()


def set_device_index(device: Any, /) -> None:
    """Make ``device`` the current one; a negative index is a no-op, as in torch."""
    _require()
    index = _index(device)
    if index is not None and index >= 0:
        cuda.set_device(index)


def current_device_idx() -> int:
    warnings.warn("`tilewise.accelerator.current_device_idx` is deprecated, use "
                  "`tilewise.accelerator.current_device_index` instead.", FutureWarning, stacklevel=2)
    return current_device_index()


def set_device_idx(device: Any, /) -> None:
    warnings.warn("`tilewise.accelerator.set_device_idx` is deprecated, use `tilewise.accelerator.set_device_index` "
                  "instead.", FutureWarning, stacklevel=2)
    set_device_index(device)


class device_index:  # noqa: N801 — torch's name
    """A ``with`` block during which ``device`` is the current device (None: no change)."""

    def __init__(self, device: int | None, /) -> None:
        self.idx = device
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx is not None:
            self.prev_idx = current_device_index()
            set_device_index(self.idx)

    def __exit__(self, *exc) -> None:
        if self.idx is not None:
            set_device_index(self.prev_idx)


def synchronize(device: Any = None, /) -> None:
    """Wait for the work queued on ``device`` (default: the current one)."""
    _require()
    cuda.synchronize(_index(device))


def empty_cache() -> None:
    _require()
    cuda.empty_cache()


def memory_allocated(device_index: Any = None, /) -> int:
    _require()
    return cuda.memory_allocated(_index(device_index))


def max_memory_allocated(device_index: Any = None, /) -> int:
    _require()
    return cuda.max_memory_allocated(_index(device_index))


def reset_peak_memory_stats(device_index: Any = None, /) -> None:
    _require()
    cuda.reset_peak_memory_stats(_index(device_index))


def get_memory_info(device_index: Any = None, /) -> tuple[int, int]:
    """(free, total) bytes of the device's memory."""
    _require()
    return cuda.mem_get_info(_index(device_index))


def get_device_module(device: Any = None):
    """The module of a device type (torch.get_device_module): ``tilewise.cuda`` for "cuda", ``tilewise.cpu`` for
    "cpu"; with no device, the accelerator's module, else ``tilewise.cpu``."""
    import importlib

    if device is None:
        accelerator = current_accelerator()
        device_type = accelerator.type if accelerator is not None else "cpu"
    elif isinstance(device, (str, Device)):
        device_type = Device(device).type if isinstance(device, str) else device.type
    else:
        raise RuntimeError(f"Invalid value of device '{device}', expect tilewise.device, str, or None")
    if device_type not in ("cpu", "cuda"):
        raise RuntimeError(f"Device '{device_type}' does not have a corresponding module registered as "
                           f"'tilewise.{device_type}'.")
    return importlib.import_module(f"tilewise.{device_type}")
