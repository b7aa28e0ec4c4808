"""The one door to the CUDA driver and NVRTC.

[Note: one check]
cuda-bindings never raises on a CUDA error: every call returns a tuple whose first item is a status
(``CUresult`` or ``nvrtcResult``). Every driver and NVRTC call in tilewise goes through :func:`check`,
which returns the remaining values and raises :class:`CudaError` carrying the call's name, the status
name and the driver's own description (``cuGetErrorString``). The bindings are imported lazily, on
first use, so ``import tilewise`` works on a machine without cuda-bindings, and :func:`is_available`
answers False (never raises) where the driver library or a GPU is missing: on such a machine the
bindings raise ``DynamicLibNotFoundError`` from ``cuInit`` instead of returning a status.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}
_init_state: dict[str, Any] = {"done": False, "error": None}


class CudaError(RuntimeError):
    """A CUDA driver or NVRTC call returned an error status.

    Attributes: ``call`` (the API name), ``code`` (the integer status), ``status_name``, ``description``.
    """

    def __init__(self, call: str, code: int, status_name: str, description: str) -> None:
        self.call = call
        self.code = code
        self.status_name = status_name
        self.description = description
        super().__init__(f"{call} failed: {status_name} ({code}): {description}")


class CudaUnavailableError(RuntimeError):
    """The CUDA driver cannot be used here (no cuda-bindings, no driver library, or no GPU)."""


def driver_api() -> ModuleType:
    """The ``cuda.bindings.driver`` module, imported on first use."""
    return _import("driver")


def nvrtc_api() -> ModuleType:
    """The ``cuda.bindings.nvrtc`` module, imported on first use."""
    return _import("nvrtc")


def _import(name: str) -> ModuleType:
    module = _modules.get(name)
    if module is None:
        import importlib

        try:
            module = importlib.import_module(f"cuda.bindings.{name}")
        except ImportError as exc:
            raise CudaUnavailableError(
                f"cuda.bindings.{name} cannot be imported ({exc}); install the GPU extra: pip install -e '.[cuda]'"
            ) from exc
        _modules[name] = module
    return module


def check(result: tuple, call_name: str) -> Any:
    """Raise :class:`CudaError` unless ``result[0]`` is a success status; return the other values.

    Returns None for a status-only result, the single value for a pair, else a tuple of values.

    >>> from cuda.bindings import nvrtc
    >>> check(nvrtc.nvrtcVersion(), "nvrtcVersion")  # doctest: +SKIP
    (13, 5)
    """
    status, values = result[0], result[1:]
    if int(status) != 0:
        raise _error_for(status, call_name)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def _error_for(status: Any, call_name: str) -> CudaError:
    status_name = getattr(status, "name", str(status))
    return CudaError(call_name, int(status), status_name, _describe(status))


def _describe(status: Any) -> str:
    try:
        if type(status).__name__ == "nvrtcResult":
            _, text = nvrtc_api().nvrtcGetErrorString(status)
        else:
            _, text = driver_api().cuGetErrorString(status)
    except Exception:  # the description is a courtesy; never hide the original error
        return "no description available"
    if isinstance(text, bytes):
        return text.decode(errors="replace")
    return str(text)


def is_status(result: tuple, status_name: str) -> bool:
    """True when a call's status is ``status_name`` (e.g. CUDA_ERROR_NOT_READY), for the polls that expect it."""
    return getattr(result[0], "name", "") == status_name


def init() -> None:
    """Initialise the driver once per process (``cuInit``); raise :class:`CudaUnavailableError` if it can't."""
    with _lock:
        if not _init_state["done"]:
            _init_state["error"] = _try_init()
            _init_state["done"] = True
        error = _init_state["error"]
    if error is not None:
        raise CudaUnavailableError(f"CUDA is not available: {error}")


def _try_init() -> str | None:
    try:
        check(driver_api().cuInit(0), "cuInit")
    except Exception as exc:  # no bindings, no libcuda or a failing cuInit all mean "no CUDA"
        return f"{type(exc).__name__}: {exc}"
    return None


def is_available() -> bool:
    """True when the CUDA driver initialises and at least one GPU is visible. Never raises.

    >>> isinstance(is_available(), bool)
    True
    """
    return device_count() > 0


def device_count() -> int:
    """Number of visible GPUs; 0 where there is no driver, no bindings or no GPU. Never raises."""
    try:
        init()
        return int(check(driver_api().cuDeviceGetCount(), "cuDeviceGetCount"))
    except Exception:  # documented to never raise
        return 0


def driver_version() -> tuple[int, int] | None:
    """The driver's CUDA version as (major, minor), or None where there is no driver."""
    try:
        init()
        version = int(check(driver_api().cuDriverGetVersion(), "cuDriverGetVersion"))
    except Exception:  # documented to never raise
        return None
    return version // 1000, (version % 1000) // 10
