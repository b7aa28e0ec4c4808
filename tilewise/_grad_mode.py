"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode — context managers and decorators.

They switch the dispatcher's Autograd key (``STATE.grad_enabled``) and nothing else, so they belong to the
dispatcher's layer, where the operator library's composites can use them (``with no_grad():`` around a
statistic that needs no gradient) without reaching up into autograd; ``tilewise.autograd.grad_mode`` is
their public name, as in torch.
"""

from __future__ import annotations

import functools
import threading

from tilewise.dispatch import STATE
from tilewise.tensor import register_grad_mode


class _InferenceMode(threading.local):
    enabled = False


_INFERENCE = _InferenceMode()


class _GradModeContext:
    enabled: bool = True

    def __enter__(self):
        self._prev = STATE.grad_enabled
        STATE.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc):
        STATE.grad_enabled = self._prev
        return False

    def __call__(self, fn):
        enabled = self.enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = STATE.grad_enabled
            STATE.grad_enabled = enabled
            try:
                return fn(*args, **kwargs)
            finally:
                STATE.grad_enabled = prev

        return wrapper


class no_grad(_GradModeContext):  # noqa: N801 — torch's name
    """Disable gradient recording. Usable as ``with no_grad():`` or ``@no_grad()``.

    >>> import tilewise as tw
    >>> x = tw.ones(2, requires_grad=True)
    >>> with tw.no_grad():
    ...     (x * 2).requires_grad
    False
    """

    enabled = False


class enable_grad(_GradModeContext):  # noqa: N801
    enabled = True


class inference_mode(_GradModeContext):  # noqa: N801
    """no_grad that ``is_inference_mode_enabled`` sees (tensors made inside are ordinary tensors here)."""

    def __init__(self, mode: bool = True):
        self.enabled = not mode
        self.mode = bool(mode)

    def __enter__(self):
        self._prev_inference, _INFERENCE.enabled = _INFERENCE.enabled, self.mode
        return super().__enter__()

    def __exit__(self, *exc):
        _INFERENCE.enabled = self._prev_inference
        return super().__exit__(*exc)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(self.mode):
                return fn(*args, **kwargs)

        return wrapper


class set_grad_enabled(_GradModeContext):  # noqa: N801
    def __init__(self, mode: bool):
        self.enabled = bool(mode)
        self._prev = STATE.grad_enabled
        STATE.grad_enabled = self.enabled  # takes effect as a plain function call too, like torch

    def __enter__(self):
        STATE.grad_enabled = self.enabled
        return self

    def __call__(self, fn):
        STATE.grad_enabled = self._prev  # as a decorator it only applies inside fn, like torch
        return super().__call__(fn)


def is_grad_enabled() -> bool:
    return bool(STATE.grad_enabled)  # falsy GRAD_OFF_FOR_RECORDING while autograd runs an op it records


register_grad_mode(is_grad_enabled)


def is_inference_mode_enabled() -> bool:
    return _INFERENCE.enabled
