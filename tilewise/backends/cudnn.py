"""``tilewise.backends.cudnn``: torch.backends.cudnn's flags and queries.

tilewise calls cuDNN (through the cuDNN frontend) for attention only; its convolutions and recurrent layers are
matrix products, which follow ``tilewise.backends.cuda.matmul``'s _state. So ``enabled``, ``benchmark``,
``deterministic`` and ``allow_tf32`` are kept and read back with torch's defaults and checks, and change no result
(deterministic mode itself is ``tilewise.use_deterministic_algorithms``). ``version()`` and ``is_available()``
describe the cuDNN frontend tilewise would use.

>>> import tilewise as tw
>>> tw.backends.cudnn.enabled, tw.backends.cudnn.benchmark, tw.backends.cudnn.deterministic
(True, False, False)
"""

from __future__ import annotations

import contextlib
import sys
import types

from tilewise.backends import flags as _state  # ``flags`` is torch's context manager, below


def _frontend():
    try:
        import cudnn
    except Exception:  # noqa: BLE001 — not installed, or no library to load: cuDNN is unavailable
        return None
    return cudnn


def is_available() -> bool:
    """Whether the cuDNN frontend is installed and loads."""
    return _frontend() is not None


def version() -> int | None:
    """cuDNN's version as an integer (e.g. 91000 for 9.10.0), or None where cuDNN is not available (as torch)."""
    cudnn = _frontend()
    if cudnn is None:
        return None
    try:
        return int(cudnn.backend_version())
    except Exception:  # noqa: BLE001 — the frontend loads but its library does not
        return None


def is_acceptable(tensor) -> bool:
    """Whether cuDNN could take ``tensor``: a CUDA tensor of a floating dtype, where cuDNN is available."""
    return (_state.cudnn_flag("enabled") and tensor.device.type == "cuda" and tensor.is_floating_point()
            and is_available())


def set_flags(_enabled=None, _benchmark=None, _benchmark_limit=None, _deterministic=None, _allow_tf32=None,
              _fp32_precision="none", _depthwise_kernel=None) -> tuple:
    """Set the flags given (None leaves one as it is) and return the previous ones, as torch's ``set_flags``."""
    module = sys.modules[__name__]
    saved = (module.enabled, module.benchmark, None, module.deterministic, module.allow_tf32,
             _state.get_fp32_precision("cuda", "all"), None)
    for name, value in (("enabled", _enabled), ("benchmark", _benchmark), ("deterministic", _deterministic),
                        ("allow_tf32", _allow_tf32)):
        if value is not None:
            setattr(module, name, value)
    if _fp32_precision is not None:
        _state.set_fp32_precision("cuda", "all", _fp32_precision)
    return saved


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False, allow_tf32=True,
          fp32_precision="none", depthwise_kernel="auto"):
    """Set the cuDNN flags for a ``with`` block and restore them after (torch.backends.cudnn.flags)."""
    saved = set_flags(enabled, benchmark, benchmark_limit, deterministic, allow_tf32, fp32_precision)
    try:
        yield
    finally:
        set_flags(*saved)


def _cudnn_flag(name: str) -> property:
    return property(lambda module: _state.cudnn_flag(name), lambda module, value: _state.set_cudnn_flag(name, value))


class _CudnnModule(types.ModuleType):
    enabled = _cudnn_flag("enabled")
    benchmark = _cudnn_flag("benchmark")
    deterministic = _cudnn_flag("deterministic")
    allow_tf32 = property(lambda module: _state.cudnn_allow_tf32(),
                          lambda module, value: _state.set_cudnn_allow_tf32(value))
    fp32_precision = property(lambda module: _state.get_fp32_precision("cuda", "all"),
                              lambda module, value: _state.set_fp32_precision("cuda", "all", value))
    benchmark_limit = None  # torch's value where cuDNN's benchmark limit does not apply
    conv = _state.OpPrecision("cuda", "conv")
    rnn = _state.OpPrecision("cuda", "rnn")


sys.modules[__name__].__class__ = _CudnnModule
