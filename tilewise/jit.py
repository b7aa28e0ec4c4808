"""``torch.jit`` as model code meets it: the decorators and queries TorchScript reads, with the meaning they have when
nothing is scripted (as under ``PYTORCH_JIT=0``). timm, torchvision and many published models mark methods with
``@torch.jit.ignore``, ask ``torch.jit.is_scripting()`` and annotate attributes with ``torch.jit.Final``; in tilewise
these leave the code running as Python. ``script`` and ``trace`` hand back what they are given, as torch does with
TorchScript disabled; ``tilewise.compile`` is what compiles.
"""

from __future__ import annotations

import enum
import warnings
from typing import Final  # noqa: F401 — torch.jit.Final is typing.Final

__all__ = ["Final", "annotate", "export", "ignore", "is_scripting", "is_tracing", "script", "trace", "unused"]


class FunctionModifiers(enum.Enum):
    """What a decorator asks of a function (TorchScript's ``FunctionModifiers``), kept on it as torch keeps it."""

    UNUSED = "unused (ignored and replaced with raising of an exception)"
    IGNORE = "ignore (leave as a call to Python, cannot be torch.jit.save'd)"
    EXPORT = "export (compile this function even if nothing calls it)"
    DEFAULT = "default (compile if called from a exported function / forward)"
    COPY_TO_SCRIPT_WRAPPER = "if this method is not scripted, copy the python method onto the scripted model"
    _DROP = "_drop (function is fully ignored, declaration can be unscriptable)"


def is_scripting() -> bool:
    """False: nothing runs under TorchScript."""
    return False


def is_tracing() -> bool:
    """False: nothing runs under the TorchScript tracer."""
    return False


def annotate(the_type, the_value):
    """The value itself (the type is for the TorchScript compiler)."""
    return the_value


def export(fn):
    fn._torchscript_modifier = FunctionModifiers.EXPORT
    return fn


def unused(fn):
    if isinstance(fn, property):
        fn.fget._torchscript_modifier = FunctionModifiers.UNUSED
        if fn.fset:
            fn.fset._torchscript_modifier = FunctionModifiers.UNUSED
        return fn
    fn._torchscript_modifier = FunctionModifiers.UNUSED
    return fn


def ignore(drop=False, **kwargs):
    """``@ignore`` or ``@ignore(drop=...)``: the function stays Python; ``drop`` says what scripting would do."""
    if callable(drop):
        drop._torchscript_modifier = FunctionModifiers.IGNORE
        return drop
    if not isinstance(drop, bool):
        raise RuntimeError(f"Argument to @torch.jit.ignore must be a bool or a function but got {drop}")
    drop_on_export = kwargs.pop("drop_on_export", None)
    if drop_on_export:
        warnings.warn("ignore(drop_on_export=True) has been deprecated. TorchScript will now drop the function call on "
                      "compilation. Use torch.jit.unused now. {}", stacklevel=2, category=FutureWarning)
        drop = drop_on_export
    elif drop:
        warnings.warn("ignore(True) has been deprecated. TorchScript will now drop the function call on compilation. "
                      "Use torch.jit.unused now. {}", stacklevel=2, category=FutureWarning)

    def decorator(fn):
        fn._torchscript_modifier = FunctionModifiers.UNUSED if drop else FunctionModifiers.IGNORE
        return fn

    return decorator


def script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
    """``obj`` itself, as ``torch.jit.script`` returns it with TorchScript disabled."""
    return obj


def trace(func, example_inputs=None, *args, **kwargs):
    """``func`` itself, as ``torch.jit.trace`` returns it with TorchScript disabled."""
    return func
