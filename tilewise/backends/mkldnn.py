"""``tilewise.backends.mkldnn``: torch.backends.mkldnn's flags. tilewise's CPU backend runs on numpy and OpenBLAS,
not oneDNN, so ``is_available()`` is False and ``enabled`` is kept and read back (True, torch's default) without
effect. ``matmul.fp32_precision`` is part of the float32 precision state that
``tilewise.set_float32_matmul_precision`` writes (see [Note: backend flags]).
"""

from __future__ import annotations

import sys
import types

from tilewise.backends import flags as _state

_enabled = [True]


def is_available() -> bool:
    return False


def _set_enabled(value) -> None:
    if not isinstance(value, bool):
        raise RuntimeError(f"set_enabled_mkldnn expects a bool, but got {type(value).__name__}")
    _enabled[0] = value


class _MkldnnModule(types.ModuleType):
    enabled = property(lambda module: _enabled[0], lambda module, value: _set_enabled(value))
    fp32_precision = property(lambda module: _state.get_fp32_precision("mkldnn", "all"),
                              lambda module, value: _state.set_fp32_precision("mkldnn", "all", value))
    matmul = _state.OpPrecision("mkldnn", "matmul")
    conv = _state.OpPrecision("mkldnn", "conv")
    rnn = _state.OpPrecision("mkldnn", "rnn")


sys.modules[__name__].__class__ = _MkldnnModule
