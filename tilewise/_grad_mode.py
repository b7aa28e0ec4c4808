"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode — context managers and decorators.

They switch the dispatcher's Autograd key (``STATE.grad_enabled``) and, for inference_mode, its Inference key
(``STATE.inference``; see [Note: inference tensors] in ``storage.py``) and nothing else, so they belong to the
dispatcher's layer, where the operator library's composites can use them (``with no_grad():`` around a
statistic that needs no gradient) without reaching up into autograd; ``tilewise.autograd.grad_mode`` is
their public name, as in torch.
"""

from __future__ import annotations

import functools
import inspect
import sys

from tilewise.dispatch import STATE
from tilewise.tensor import register_grad_mode


def _grad_mode():
    """The grad mode ``is_grad_enabled`` reports. Inside inference mode the dispatcher's flag stays off (torch's
    InferenceMode records nothing whatever the grad mode), so there the grad modes change only what is reported."""
    return STATE.inference_grad if STATE.inference else STATE.grad_enabled


def _set_grad_mode(enabled) -> None:
    if STATE.inference:
        STATE.inference_grad = enabled
    else:
        STATE.grad_enabled = enabled


class _GradModeContext:
    enabled: bool = True

    def __enter__(self):
        self._prev = _grad_mode()
        _set_grad_mode(self.enabled)
        return self

    def __exit__(self, *exc):
        _set_grad_mode(self._prev)
        return False

    def __call__(self, fn):
        enabled = self.enabled
        if inspect.isgeneratorfunction(fn):
            return _generator_in_mode(fn, lambda: _GradMode(enabled))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = _grad_mode()
            _set_grad_mode(enabled)
            try:
                return fn(*args, **kwargs)
            finally:
                _set_grad_mode(prev)

        return wrapper


class _GradMode(_GradModeContext):
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled


def _generator_in_mode(fn, mode):
    """A decorated generator function runs every step of its body in the mode (``mode()`` makes a fresh context),
    while the code that drives it keeps its own, as torch's ``_wrap_generator``."""

    @functools.wraps(fn)
    def generator(*args, **kwargs):
        gen = fn(*args, **kwargs)
        try:
            with mode():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with mode():
                        gen.close()
                    raise
                except BaseException:
                    with mode():
                        response = gen.throw(*sys.exc_info()[1:2])
                else:
                    with mode():
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value

    return generator


class _NoParameterDecorator(_GradModeContext):
    """A grad mode that takes no argument, so that ``@no_grad`` without parentheses decorates too (torch's
    ``_NoParamDecoratorContextManager``)."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParameterDecorator):  # noqa: N801 — torch's name
    """Disable gradient recording. Usable as ``with no_grad():``, ``@no_grad()`` or ``@no_grad``.

    >>> import tilewise as tw
    >>> x = tw.ones(2, requires_grad=True)
    >>> with tw.no_grad():
    ...     (x * 2).requires_grad
    False
    """

    enabled = False


class enable_grad(_NoParameterDecorator):  # noqa: N801
    enabled = True


class inference_mode:  # noqa: N801
    """no_grad that also makes every tensor created inside an *inference tensor*, as torch's: such a tensor cannot
    be written in place, saved for backward or made to require grad outside the mode (clone it to get a normal
    one), and nothing inside is recorded for autograd, whatever the grad mode. ``inference_mode(False)`` turns
    it off again (grad mode on, new tensors normal). Usable as ``with``, ``@inference_mode()`` and
    ``@inference_mode``.

    >>> import tilewise as tw
    >>> with tw.inference_mode():
    ...     y = tw.ones(2) * 2
    >>> y.is_inference(), y.requires_grad
    (True, False)
    """

    def __new__(cls, mode=True):
        if mode is None or isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)  # ``@inference_mode`` without parentheses: mode is the function

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def __enter__(self):
        state = STATE
        self._prev = (state.inference, state.grad_enabled, state.inference_grad)
        state.inference = self.mode
        state.grad_enabled = state.inference_grad = not self.mode
        return self

    def __exit__(self, *exc):
        STATE.inference, STATE.grad_enabled, STATE.inference_grad = self._prev
        return False

    def __call__(self, fn):
        mode = self.mode
        if inspect.isgeneratorfunction(fn):
            return _generator_in_mode(fn, lambda: inference_mode(mode))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(mode):
                return fn(*args, **kwargs)

        return wrapper


class set_grad_enabled(_GradModeContext):  # noqa: N801
    def __init__(self, mode: bool):
        if type(mode) is not bool:
            raise TypeError(f"set_grad_enabled(): argument 'enabled' (position 1) must be bool, not "
                            f"{type(mode).__name__}")
        self.enabled = mode
        self._prev = _grad_mode()
        _set_grad_mode(self.enabled)  # takes effect as a plain function call too, like torch

    def __enter__(self):
        _set_grad_mode(self.enabled)
        return self

    def __call__(self, fn):
        _set_grad_mode(self._prev)  # as a decorator it only applies inside fn, like torch
        return super().__call__(fn)


def is_grad_enabled() -> bool:
    return bool(_grad_mode())  # falsy GRAD_OFF_FOR_RECORDING while autograd runs an op it records


def is_inference_mode_enabled() -> bool:
    return STATE.inference


register_grad_mode(is_grad_enabled, is_inference_mode_enabled)
