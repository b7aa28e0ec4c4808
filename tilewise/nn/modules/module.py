"""Module: the base class of every layer, with torch.nn.Module's behaviour.

[Note: modules] A Module keeps its state in three ordered dicts — ``_parameters``, ``_buffers`` and
``_modules`` — filled by ``__setattr__`` according to what is assigned, and read back by ``__getattr__``.
Every traversal (parameters, buffers, state_dict, apply, to) walks ``named_modules`` and those dicts, so
the dotted names in a state_dict, in ``named_parameters`` and in error messages always agree with torch's.
Device and dtype moves go through ``_apply``, which swaps each tensor's data in place (``param.data =``)
so that optimizers and hooks that hold a parameter keep holding the moved one.
"""

from __future__ import annotations

import functools
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from tilewise.autograd.grad_mode import no_grad
from tilewise.dispatch import STATE
from tilewise.nn.init import zeros_
from tilewise.nn.modules import global_hooks as _global
from tilewise.nn.modules.backward_hooks import BackwardHookRun, hooked_inputs, hooked_output
from tilewise.nn.modules.global_hooks import (  # noqa: F401 — torch's names in this module
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
)
from tilewise.nn.parameter import Buffer, Parameter
from tilewise.tensor import Tensor
from tilewise.tensortypes import typename
from tilewise.utils.hooks import RemovableHandle

# (module) -> a context manager around its forward, set by tilewise.profiler.nvtx_ranges while emit_nvtx is entered
forward_range = None


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


_STATE_VERSION = [0]  # bumped by every change to any module's attributes or member tables (see _Members)


def _bump() -> None:
    _STATE_VERSION[0] += 1


class _Members(OrderedDict):
    """A module's table of parameters, buffers, submodules or hooks: an OrderedDict that bumps the modules'
    state version on every change, so that ``tilewise.compile``'s guards re-check what a compiled function read
    from modules only after something changed (see [Note: Python-state guards] in ``compiler/guards.py``)."""

    _tw_version = _STATE_VERSION

    def __setitem__(self, key, value) -> None:
        _bump()
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        _bump()
        super().__delitem__(key)

    def pop(self, *args):
        _bump()
        return super().pop(*args)

    def popitem(self, last: bool = True):
        _bump()
        return super().popitem(last)

    def setdefault(self, key, default=None):
        _bump()
        return super().setdefault(key, default)

    def clear(self) -> None:
        _bump()
        super().clear()

    def move_to_end(self, key, last: bool = True) -> None:
        _bump()
        super().move_to_end(key, last)


class Module:
    """Base class for neural-network layers; subclasses define ``forward``.

    >>> import tilewise as tw
    >>> class Net(tw.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = tw.nn.Linear(3, 2)
    ...     def forward(self, x):
    ...         return self.fc(x).relu()
    >>> [name for name, _ in Net().named_parameters()]
    ['fc.weight', 'fc.bias']
    """

    training: bool
    call_super_init: bool = False  # torch's flags, kept for code that reads them
    dump_patches: bool = False
    _version: int = 1  # of the state-dict layout; recorded in ``state_dict()._metadata`` (see load_state_dict)
    _tw_version = _STATE_VERSION  # the compiler's guards: one counter every module mutation bumps
    # backward hooks and pre-hooks by handle id (the pre-hooks' ids in _backward_pre_hook_ids); an instance gets
    # its own dict with its first backward hook
    _backward_hooks: Mapping[int, Callable] = MappingProxyType({})
    _backward_pre_hook_ids: frozenset = frozenset()
    _forward_hooks_always_called: frozenset = frozenset()
    _state_dict_pre_hooks: Mapping[int, Callable] = MappingProxyType({})  # an instance's own with its first one

    def __init__(self, *args, **kwargs) -> None:
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments: Module.__init__ takes none")
        setattr_ = object.__setattr__
        setattr_(self, "training", True)
        setattr_(self, "_parameters", _Members())
        setattr_(self, "_buffers", _Members())
        setattr_(self, "_non_persistent_buffers_set", set())
        setattr_(self, "_modules", _Members())
        setattr_(self, "_forward_pre_hooks", _Members())
        setattr_(self, "_forward_pre_hooks_with_kwargs", set())
        setattr_(self, "_forward_hooks", _Members())
        setattr_(self, "_forward_hooks_with_kwargs", set())
        setattr_(self, "_state_dict_hooks", _Members())
        setattr_(self, "_load_state_dict_pre_hooks", _Members())
        setattr_(self, "_load_state_dict_post_hooks", _Members())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------ calling
    _compiled_call = None  # set by compile(): the module's calls, compiled

    def __call__(self, *args, **kwargs):
        if self._compiled_call is not None and not STATE.trace_depth:
            return self._compiled_call(*args, **kwargs)
        return self._eager_call(*args, **kwargs)

    def _eager_call(self, *args, **kwargs):
        """A call as it runs uncompiled (what ``compile()`` compiles)."""
        if forward_range is not None:  # emit_nvtx: the forward inside a range of its own
            with forward_range(self):
                return self._call_unranged(args, kwargs)
        if not self._forward_pre_hooks and not self._forward_hooks and not self._backward_hooks \
                and not _global.any_global_hooks():
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def compile(self, *args, **kwargs) -> None:
        """torch's ``Module.compile``: from now on a call of this module (its forward and hooks) runs compiled by
        ``tilewise.compile(..., *args, **kwargs)``; the module, its class and its state dict stay as they are."""
        from tilewise.compiler import compile as compile_fn

        object.__setattr__(self, "_compile_args", (args, kwargs))
        object.__setattr__(self, "_compiled_call", compile_fn(self._eager_call, *args, **kwargs))

    def __getstate__(self):
        # a copy (deepcopy, pickle) leaves the compiled call behind and compiles its own (__setstate__)
        state = self.__dict__.copy()
        state.pop("_compiled_call", None)
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        if "_compile_args" in state:
            args, kwargs = state["_compile_args"]
            self.compile(*args, **kwargs)

    def _call_unranged(self, args: tuple, kwargs: dict):
        if not self._forward_pre_hooks and not self._forward_hooks and not self._backward_hooks \
                and not _global.any_global_hooks():
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        if not self._forward_hooks_always_called and not _global.forward_hooks_always_called:
            return self._run_with_hooks(args, kwargs, set())
        called: set[int] = set()
        try:
            return self._run_with_hooks(args, kwargs, called)
        except Exception:
            self._run_always_called_hooks(args, kwargs, called)
            raise

    def _run_always_called_hooks(self, args: tuple, kwargs: dict, called: set[int]) -> None:
        """After a forward (or a hook) raised, the ``always_call`` forward hooks that have not run see a None
        output, as torch's; what one of them raises is a warning, the first error being the one raised."""
        for hook_id, hook in (*_global.forward_hooks.items(), *self._forward_hooks.items()):
            if hook_id not in self._forward_hooks_always_called and hook_id not in _global.forward_hooks_always_called \
                    or hook_id in called:
                continue
            try:
                if hook_id in self._forward_hooks_with_kwargs or hook_id in _global.forward_hooks_with_kwargs:
                    hook(self, args, kwargs, None)
                else:
                    hook(self, args, None)
            except Exception as exc:
                warnings.warn("module forward hook with ``always_call=True`` raised an exception that was silenced as "
                              f"another error was raised in forward: {exc}", stacklevel=3)

    def _run_with_hooks(self, args: tuple, kwargs: dict, called: set[int]):
        for hook_id, hook in (*_global.forward_pre_hooks.items(), *self._forward_pre_hooks.items()):
            if hook_id in self._forward_pre_hooks_with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                           f"but got {result!r}.")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        run = self._backward_hook_run(args) if (self._backward_hooks or _global.backward_hooks
                                                or _global.backward_pre_hooks) and STATE.grad_enabled else None
        if run is not None:
            args = hooked_inputs(run, args)
        output = self.forward(*args, **kwargs)
        for hook_id, hook in (*_global.forward_hooks.items(), *self._forward_hooks.items()):
            if hook_id in self._forward_hooks_always_called or hook_id in _global.forward_hooks_always_called:
                called.add(hook_id)
            if hook_id in self._forward_hooks_with_kwargs or hook_id in _global.forward_hooks_with_kwargs:
                result = hook(self, args, kwargs, output)
            else:
                result = hook(self, args, output)
            if result is not None:
                output = result
        return hooked_output(run, output) if run is not None else output

    def _backward_hook_run(self, args: tuple) -> BackwardHookRun:
        hooks = [*_global.backward_hooks.values(),
                 *(h for k, h in self._backward_hooks.items() if k not in self._backward_pre_hook_ids)]
        pre_hooks = [*_global.backward_pre_hooks.values(),
                     *(h for k, h in self._backward_hooks.items() if k in self._backward_pre_hook_ids)]
        return BackwardHookRun(self, hooks, pre_hooks, len(args))

    def register_full_backward_hook(self, hook: Callable, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` runs once the gradients of the module's inputs are computed
        and may return replacements for ``grad_input`` (see [Note: module backward hooks])."""
        return self._add_backward_hook(hook, prepend, pre=False)

    def register_full_backward_pre_hook(self, hook: Callable, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` runs when the gradients of the module's outputs arrive and may return
        replacements for them."""
        return self._add_backward_hook(hook, prepend, pre=True)

    def _add_backward_hook(self, hook: Callable, prepend: bool, pre: bool) -> RemovableHandle:
        if "_backward_hooks" not in self.__dict__:
            object.__setattr__(self, "_backward_hooks", _Members())  # its changes bump the modules' version
            object.__setattr__(self, "_backward_pre_hook_ids", set())
        handle = RemovableHandle(self._backward_hooks, self._backward_pre_hook_ids)
        self._backward_hooks[handle.id] = hook
        if pre:
            self._backward_pre_hook_ids.add(handle.id)
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` (or ``hook(module, args, kwargs)``) runs before forward and may replace args."""
        handle = RemovableHandle(self._forward_pre_hooks, self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs.add(handle.id)
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` runs after forward and may replace the output; with ``always_call`` it
        also runs, with a None output, when forward raises."""
        if always_call and "_forward_hooks_always_called" not in self.__dict__:
            object.__setattr__(self, "_forward_hooks_always_called", set())
        markers = [self._forward_hooks_with_kwargs]
        if always_call:
            markers.append(self._forward_hooks_always_called)
        handle = RemovableHandle(self._forward_hooks, *markers)
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs.add(handle.id)
        if always_call:
            self._forward_hooks_always_called.add(handle.id)
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    # ------------------------------------------------------------------ registration
    def register_parameter(self, name: str, param: Tensor | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{typename(param)}' object to parameter '{name}' "
                            "(tilewise.nn.Parameter or None required)")
        if param is not None and param._grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be created "
                             f"explicitly; to express '{name}' as a function of another Tensor, compute the value in "
                             "the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{typename(tensor)}' object to buffer '{name}' (tilewise Tensor or None "
                            "required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    register_module = add_module

    @staticmethod
    def _check_name(name: str, what: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{what} name should be a string. Got {typename(name)}")
        if "." in name:
            raise KeyError(f'{what} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{what} name can\'t be empty string ""')

    def __setattr__(self, name: str, value: Any) -> None:
        _bump()
        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            if name not in params:  # replacing a parameter (tying weights) keeps its place in the order, as in torch
                self._forget(name)
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{typename(value)}' as parameter '{name}' "
                                "(tilewise.nn.Parameter or None expected)")
            params[name] = None
            return
        modules = self.__dict__.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            if name not in modules:  # replacing a child keeps its place in the order, as in torch
                self._forget(name)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{typename(value)}' as child module '{name}' "
                                "(tilewise.nn.Module or None expected)")
            modules[name] = None
            return
        buffers = self.__dict__.get("_buffers")
        if isinstance(value, Buffer):  # torch.nn.Buffer: registered, persistent as it says
            if buffers is None:
                raise AttributeError("cannot assign buffer before Module.__init__() call")
            self.register_buffer(name, value, value.persistent)
            return
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{typename(value)}' as buffer '{name}' (tilewise.nn.Buffer, "
                                "tilewise.Tensor or None expected)")
            buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        self.__dict__.pop(name, None)
        for store in ("_parameters", "_buffers", "_modules"):
            self.__dict__[store].pop(name, None)
        self._non_persistent_buffers_set.discard(name)

    def __getattr__(self, name: str):
        state = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            values = state.get(store)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        _bump()
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[store]:
                del self.__dict__[store][name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(set(k for k in keys if not k[0].isdigit()))

    # ------------------------------------------------------------------ traversal
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, module in self._modules.items():
            if module is not None and module not in seen:
                seen.add(module)
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def _named_members(self, store: str, prefix: str, recurse: bool,
                       remove_duplicate: bool) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        owners = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for owner_prefix, owner in owners:
            for name, value in getattr(owner, store).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield (f"{owner_prefix}.{name}" if owner_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def get_submodule(self, target: str) -> Module:
        """The submodule at the dotted path ``target`` ("" is this module)."""
        module = self
        for item in target.split(".") if target else ():
            if not hasattr(module, item):
                raise AttributeError(f"{module._get_name()} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module

    def set_submodule(self, target: str, module: Module, strict: bool = False) -> None:
        """Put ``module`` at the dotted path ``target``: the parent must exist; the last name may be new unless
        ``strict``, and where it exists it must name a module."""
        if target == "":
            raise ValueError("Cannot set the submodule without a target name!")
        if not isinstance(module, Module):
            raise ValueError(f"`module` is not an nn.Module, found {type(module)}")
        parent_path, _, name = target.rpartition(".")
        parent = self.get_submodule(parent_path)
        if strict and not hasattr(parent, name):
            raise AttributeError(f"{parent._get_name()} has no attribute `{name}`")
        if hasattr(parent, name) and not isinstance(getattr(parent, name), Module):
            raise AttributeError(f"`{name}` is not an nn.Module")
        setattr(parent, name, module)

    def get_parameter(self, target: str) -> Tensor:
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{module._get_name()} has no attribute `{name}`")
        param = getattr(module, name)
        if not isinstance(param, Parameter):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Tensor:
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{module._get_name()} has no attribute `{name}`")
        if name not in module._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return module._buffers[name]

    # ------------------------------------------------------------------ modes and gradients
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:  # as torch's: a gradient with history is detached, one without only stops requiring grad
                if p.grad._grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                zeros_(p.grad)

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ device and dtype
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Module:
        if recurse:
            for module in self.children():
                module._apply(fn)
        with no_grad():
            for param in self._parameters.values():
                if param is None:
                    continue
                moved = fn(param)
                if moved is not param:
                    param.data = moved
                if param.grad is not None:
                    grad = fn(param.grad)
                    if grad is not param.grad:
                        param._grad = grad
            for name, buf in self._buffers.items():
                if buf is not None:
                    self._buffers[name] = fn(buf)
        return self

    def to(self, *args, **kwargs) -> Module:
        """Move and/or cast parameters and buffers: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
        ``to(tensor)``, ``to(memory_format=...)``. Only floating-point and complex tensors change dtype (a
        complex buffer cast to a real dtype keeps its real part) and only 4-d and 5-d ones change memory format, as
        in torch."""
        from tilewise.tensor import _parse_to

        device, dtype, non_blocking, _, memory_format = _parse_to(None, *args, **kwargs)
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                            f"dtype={dtype}")
        if dtype is not None and dtype.is_complex:
            warnings.warn("Complex modules are a new feature under active development whose design may change, and "
                          "some modules might not work as expected when using complex tensors as parameters or "
                          "buffers.", UserWarning, stacklevel=2)

        def convert(t: Tensor) -> Tensor:
            layout = {"memory_format": memory_format} if memory_format is not None and t.dim() in (4, 5) else {}
            cast = dtype if t.is_floating_point() or t.is_complex() else None
            return t.to(device=device, dtype=cast, non_blocking=non_blocking, **layout)

        return self._apply(convert)

    def to_empty(self, *, device, recurse: bool = True) -> Module:
        """Move parameters and buffers to ``device`` as uninitialised tensors of the same shapes and dtypes (for
        a module built on the meta device, say), keeping the parameter objects."""
        from tilewise.ops.creation import empty_like

        return self._apply(lambda t: empty_like(t, device=device), recurse=recurse)

    def share_memory(self) -> Module:
        """Each parameter and buffer's ``share_memory_()`` (which says what tilewise's storages allow)."""
        return self._apply(lambda t: t.share_memory_())

    def cpu(self) -> Module:
        return self._apply(lambda t: t.cpu())

    def cuda(self, device=None) -> Module:
        return self._apply(lambda t: t.cuda(device))

    def _cast_floats(self, dtype) -> Module:
        return self._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def float(self) -> Module:
        from tilewise import dtypes

        return self._cast_floats(dtypes.float32)

    def double(self) -> Module:
        from tilewise import dtypes

        return self._cast_floats(dtypes.float64)

    def half(self) -> Module:
        from tilewise import dtypes

        return self._cast_floats(dtypes.float16)

    def bfloat16(self) -> Module:
        from tilewise import dtypes

        return self._cast_floats(dtypes.bfloat16)

    def type(self, dst_type) -> Module:
        return self._apply(lambda t: t.to(dst_type))

    # ------------------------------------------------------------------ state dict
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if _overrides(self, "get_extra_state"):
            destination[prefix + _EXTRA_STATE_KEY] = self.get_extra_state()

    def get_extra_state(self) -> Any:
        """State beyond parameters and buffers that ``state_dict`` stores under ``_extra_state``; a module that
        has some overrides this and :meth:`set_extra_state`."""
        raise RuntimeError("Reached a code path in Module.get_extra_state() that should never be called. Please file "
                           "an issue to report this bug.")

    def set_extra_state(self, state: Any) -> None:
        """Restore what :meth:`get_extra_state` returned, from a state dict."""
        raise RuntimeError("Reached a code path in Module.set_extra_state() that should never be called. Please file "
                           "an issue to report this bug.")

    def state_dict(self, *args, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name, sharing storage with the module's tensors. Its
        ``_metadata`` records each module's ``_version`` by prefix, which ``load_state_dict`` hands to the
        module that loads (BatchNorm reads it to accept checkpoints older than ``num_batches_tracked``).
        ``(destination, prefix, keep_vars)`` given by position still work, with torch's FutureWarning."""
        if args:
            warnings.warn("Positional args are being deprecated, use kwargs instead. Refer to "
                          "https://pytorch.org/docs/main/generated/torch.nn.Module.html#torch.nn.Module.state_dict"
                          " for details.", FutureWarning, stacklevel=2)
            destination = args[0] if destination is None else destination
            prefix = args[1] if len(args) > 1 and prefix == "" else prefix
            keep_vars = args[2] if len(args) > 2 and keep_vars is False else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = {"version": self._version}
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=f"{prefix}{name}.", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            result = hook(self, destination, prefix, local_metadata)
            if result is None:
                continue
            if getattr(hook, "_from_public_api", False):
                raise RuntimeError("state_dict post-hook must return None")
            destination = result  # a hook of _register_state_dict_hook may replace the dict, as in torch
        return destination

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        """Take this module's own entries (``prefix`` + name) from ``state_dict``, as torch's does: a missing
        entry is reported (under ``strict``), and so is every key under ``prefix`` that names neither one of its
        tensors nor a key inside one of its submodules."""
        for hook in self.__dict__.get("_load_state_dict_pre_hooks", {}).values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        persistent_buffers = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in {**self._parameters, **persistent_buffers}.items() if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, target in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = _as_tilewise(state_dict[key])
            if value is None:
                error_msgs.append(f'While copying the parameter named "{key}", expected tilewise.Tensor or '
                                  f"Tensor-like object from checkpoint but received {type(state_dict[key])}")
                continue
            if target.ndim == 0 and tuple(value.shape) == (1,):  # torch before 0.4 stored scalars as (1,)
                value = value[0]
            if value.shape != target.shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {value.shape} from "
                                  f"checkpoint, the shape in current model is {target.shape}.")
                continue
            try:
                with no_grad():
                    if assign:
                        self._assign(name, target, value)
                    else:
                        target.copy_(value)
            except Exception as exc:  # noqa: BLE001 — reported with the key, as torch does
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions in the model are '
                                  f"{target.shape} and whose dimensions in the checkpoint are {value.shape}, an "
                                  f"exception occurred : {exc.args}.")
        extra_key = prefix + _EXTRA_STATE_KEY
        if _overrides(self, "set_extra_state"):
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if not key.startswith(prefix) or key == extra_key:
                    continue
                head, *rest = key[len(prefix):].split(".", 1)
                if head not in (self._modules if rest else local_state):
                    unexpected_keys.append(key)

    def _assign(self, name: str, target: Tensor, value: Tensor) -> None:
        """``assign=True``: the module holds the checkpoint's tensor itself (its dtype and device), a parameter
        made one with the requires_grad of the one it replaces."""
        if isinstance(target, Parameter):
            if isinstance(value, Parameter):
                value.requires_grad_(target.requires_grad)
            else:
                value = Parameter(value, requires_grad=target.requires_grad)
        setattr(self, name, value)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Copy tensors from ``state_dict`` into this module's parameters and buffers.

        With ``strict`` every key must match; missing keys, unexpected keys and shape mismatches are all
        reported, each by name, in one error. Returns ``(missing_keys, unexpected_keys)``. ``assign=True``
        keeps the checkpoint's tensors (their dtype and device) instead of copying into the module's.
        Each module sees only the keys under its prefix and runs its post-hooks after its submodules', and
        the hooks may edit the keys reported, as in torch.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)  # load-state-dict pre-hooks may rename keys: the caller's dict stays
        if metadata is not None:
            state_dict._metadata = metadata
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []

        def load(module: Module, local_state_dict: dict, prefix: str) -> None:
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = assign
            module._load_from_state_dict(local_state_dict, prefix, local_metadata, True, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = f"{prefix}{name}."
                    load(child, {k: v for k, v in local_state_dict.items() if k.startswith(child_prefix)},
                         child_prefix)
            result = _IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                if hook(module, result) is not None:
                    raise AssertionError("Hooks registered with ``register_load_state_dict_post_hook`` are not "
                                         "expected to return new values, if incompatible_keys need to be modified, it "
                                         "should be done inplace.")

        load(self, state_dict, "")
        if strict:
            if unexpected:
                errors.insert(0, f"Unexpected key(s) in state_dict: {_quoted(unexpected)}. ")
            if missing:
                errors.insert(0, f"Missing key(s) in state_dict: {_quoted(missing)}. ")
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(type(self).__name__,
                                                                                  "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    def register_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, prefix, keep_vars)`` runs before ``state_dict`` saves this module's entries."""
        if "_state_dict_pre_hooks" not in self.__dict__:
            object.__setattr__(self, "_state_dict_pre_hooks", _Members())
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata)`` runs after ``state_dict`` saved this module and its
        submodules, and may edit the dict in place; it must return None. As torch's, it marks ``hook`` (its
        ``_from_public_api``), which ``_register_state_dict_hook`` then refuses."""
        hook._from_public_api = True
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def _register_state_dict_hook(self, hook: Callable) -> RemovableHandle:
        """The older post-hook: ``hook(module, state_dict, prefix, local_metadata)`` may return a dict that
        replaces the one being built."""
        if getattr(hook, "_from_public_api", False):
            raise RuntimeError("Cannot register the same function as the state dict post hook that was previously "
                               "registered via register_state_dict_post_hook")
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def _register_load_state_dict_pre_hook(self, hook: Callable, with_module: bool = False) -> RemovableHandle:
        """``hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)`` (with the
        module first where ``with_module``) runs before this module takes its entries from a state dict, and may
        edit it (rename old keys, for one)."""
        if with_module:
            hook = functools.partial(hook, self)
        hooks = self.__dict__.setdefault("_load_state_dict_pre_hooks", _Members())
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def register_load_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)``
        runs before this module takes its entries from a state dict."""
        return self._register_load_state_dict_pre_hook(hook, with_module=True)

    def register_load_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    # ------------------------------------------------------------------ printing
    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        lines = [line for line in self.extra_repr().split("\n") if line] if self.extra_repr() else []
        for name, module in self._modules.items():
            lines.append(f"({name}): " + _addindent(repr(module), 2))
        head = self._get_name() + "("
        if not lines:
            return head + ")"
        if len(lines) == 1 and not self._modules:
            return head + lines[0] + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


_EXTRA_STATE_KEY = "_extra_state"


def _overrides(module: Module, method: str) -> bool:
    return getattr(type(module), method) is not getattr(Module, method)


def _quoted(keys: list[str]) -> str:
    return ", ".join(f'"{k}"' for k in keys)


def _as_tilewise(value) -> Tensor | None:
    """State dicts may hold tilewise tensors, numpy arrays or any DLPack producer (a torch tensor, say)."""
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        from tilewise._dlpack import from_dlpack

        return from_dlpack(value.detach() if hasattr(value, "detach") else value)
    return None
