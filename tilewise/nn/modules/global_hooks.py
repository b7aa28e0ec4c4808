"""Hooks on every module's call: ``torch.nn.modules.module.register_module_forward_hook`` and its siblings.

They run before the module's own hooks of the same kind, on every module, as torch's. A module call checks the
four tables once (``any_global_hooks``) and takes its plain path when all are empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from tilewise.utils.hooks import RemovableHandle

forward_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
forward_hooks: OrderedDict[int, Callable] = OrderedDict()
forward_hooks_with_kwargs: set[int] = set()
forward_hooks_always_called: set[int] = set()
backward_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
backward_hooks: OrderedDict[int, Callable] = OrderedDict()


def any_global_hooks() -> bool:
    return bool(forward_pre_hooks or forward_hooks or backward_pre_hooks or backward_hooks)


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, args)`` runs before every module's forward (before its own pre-hooks) and may replace args."""
    handle = RemovableHandle(forward_pre_hooks)
    forward_pre_hooks[handle.id] = hook
    return handle


def register_module_forward_hook(hook: Callable, *, with_kwargs: bool = False,
                                 always_call: bool = False) -> RemovableHandle:
    """``hook(module, args, output)`` (with ``with_kwargs``: ``hook(module, args, kwargs, output)``) runs after every
    module's forward, before its own forward hooks, and may replace the output; with ``always_call`` also, with a
    None output, when forward raises.

    >>> import tilewise as tw
    >>> seen = []
    >>> handle = tw.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
    >>> _ = tw.nn.Linear(2, 2)(tw.ones(1, 2))
    >>> handle.remove(); seen
    ['Linear']
    """
    handle = RemovableHandle(forward_hooks, forward_hooks_with_kwargs, forward_hooks_always_called)
    forward_hooks[handle.id] = hook
    if with_kwargs:
        forward_hooks_with_kwargs.add(handle.id)
    if always_call:
        forward_hooks_always_called.add(handle.id)
    return handle


def register_module_full_backward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_output)`` runs for every module, before its own backward pre-hooks."""
    handle = RemovableHandle(backward_pre_hooks)
    backward_pre_hooks[handle.id] = hook
    return handle


def register_module_full_backward_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_input, grad_output)`` runs for every module, before its own backward hooks."""
    handle = RemovableHandle(backward_hooks)
    backward_hooks[handle.id] = hook
    return handle
