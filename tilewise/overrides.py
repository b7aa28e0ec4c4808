"""Tensor subclasses and the ``__torch_function__`` protocol (torch.overrides).

[Note: subclasses and __torch_function__] A class that subclasses ``Tensor``, or any object whose type has a
``__torch_function__``, may take over the public functions, Tensor methods and properties it is passed to, as
in torch: ``cls.__torch_function__(func, types, args, kwargs)`` is called with the public callable
(``tilewise.add``, ``Tensor.add``, ``Tensor.shape.__get__``), and ``Tensor.__torch_function__``, the default,
runs ``func`` with subclass handling off and gives tensor results the subclass's type (``_convert``).

Where the check lives. The eager hot path never pays for it: an operator's public function binds its
arguments with an inline ``type(x) is Tensor`` test (``ops/schema.py``'s binder), and only a value that fails it
reaches a checker, which raises ``TorchFunctionRequest`` for a subclass instance or an object with
``__torch_function__``. The binder catches it (a ``try`` costs nothing until it raises) and hands the call here:
``overridden_call`` runs the overrides, or, with subclass handling off, runs the operator on the subclass
instances *lowered* to plain tensors. The dispatcher and autograd read ``type(t) is Tensor`` on their own hot
paths, so a subclass instance never reaches them: lowering sets its ``__class__`` to ``Tensor`` for the call's
length (the same object: autograd's leaf, its ``.grad`` and in-place history stay its own) and back after.
Methods written by hand (``size``, ``detach``, the properties) are not binders: a subclass gets, at its creation,
a wrapper of each in its own class dict (``Tensor.__init_subclass__``), so a plain tensor's methods stay as they
were. Reflected operators (``__radd__``) are left out of those wrappers, since a subclass's own ``__radd__`` would
make Python try it before the left operand's ``__add__``, which torch does not.
"""

from __future__ import annotations

import contextlib
import threading

from tilewise.tensor import Tensor


class TorchFunctionRequest(Exception):  # noqa: N818 — a request to the binder, no error
    """Raised by an argument checker that met a subclass instance or an object with ``__torch_function__``; the
    public function that bound the arguments catches it (see [Note: subclasses and __torch_function__])."""


ENABLED, SUBCLASSES_DISABLED, ALL_DISABLED = 0, 1, 2


class _State(threading.local):
    disabled = ENABLED


STATE = _State()


def _is_torch_function_enabled() -> bool:
    return STATE.disabled == ENABLED


class _Disabling:
    level = SUBCLASSES_DISABLED

    def __enter__(self):
        self._saved = STATE.disabled
        STATE.disabled = max(self._saved, self.level)
        return self

    def __exit__(self, *exc) -> None:
        STATE.disabled = self._saved


class DisableTorchFunctionSubclass(_Disabling):
    """Within it, subclasses' ``__torch_function__`` (and duck types') are not called (torch._C's)."""

    level = SUBCLASSES_DISABLED


class DisableTorchFunction(_Disabling):
    """Within it, no ``__torch_function__`` is called (torch._C's; torch's function modes too, which tilewise has
    not)."""

    level = ALL_DISABLED


def _disabled_torch_function_impl(func, types, args=(), kwargs=None):
    """The ``__torch_function__`` of a subclass that opts out (torch's ``nn.Parameter`` has it): run ``func``."""
    with DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))


# ------------------------------------------------------------------ finding the overloaded arguments
def _overloading(obj) -> bool:
    tp = type(obj)
    if tp is Tensor:
        return False
    tf = getattr(tp, "__torch_function__", None)
    return tf is not None and tf is not _disabled_torch_function_impl


def _append_overloaded(obj, found: list) -> None:
    tp = type(obj)
    if any(type(f) is tp for f in found):
        return
    for k, f in enumerate(found):  # a subclass before its parents, otherwise left to right
        if issubclass(tp, type(f)):
            found.insert(k, obj)
            return
    found.append(obj)


def _get_overloaded_args(relevant_args) -> list:
    found: list = []
    for a in relevant_args:
        if _overloading(a):
            _append_overloaded(a, found)
        elif type(a) in (list, tuple):
            for b in a:
                if _overloading(b):
                    _append_overloaded(b, found)
    return found


def has_torch_function(relevant_args) -> bool:
    """Whether any of ``relevant_args`` (tensors, or sequences of them) would have its ``__torch_function__`` called."""
    return STATE.disabled == ENABLED and any(_overloading(a) for a in relevant_args)


def has_torch_function_unary(obj) -> bool:
    return STATE.disabled == ENABLED and _overloading(obj)


def has_torch_function_variadic(*args) -> bool:
    return has_torch_function(args)


def _func_name(func) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    return f"{getattr(func, '__module__', None) or 'tilewise'}.{name}"


def _call_overrides(public_api, overloaded: list, args: tuple, kwargs: dict):
    types = tuple(type(a) for a in overloaded)
    for a in overloaded:
        result = a.__torch_function__(public_api, types, args, kwargs)  # a classmethod, or a duck's own method
        if result is not NotImplemented:
            return result
    return NotImplemented


def handle_torch_function(public_api, relevant_args, *args, **kwargs):
    """Call the ``__torch_function__`` of the overloaded arguments among ``relevant_args`` (subclasses first),
    until one returns something other than ``NotImplemented``."""
    overloaded = _get_overloaded_args(relevant_args)
    result = _call_overrides(public_api, overloaded, args, kwargs)
    if result is NotImplemented:
        raise TypeError(f"no implementation found for '{_func_name(public_api)}' on types that implement "
                        f"__torch_function__: {[type(a) for a in overloaded]}")
    return result


def _dispatch_overrides(public_api, overloaded: list, args: tuple, kwargs: dict):
    """The overrides of a public function or method's call, refused as torch's argument parser refuses when every
    one returns ``NotImplemented``."""
    result = _call_overrides(public_api, overloaded, args, kwargs)
    if result is NotImplemented:
        kinds = "".join(f"  - {'tensor subclass' if isinstance(a, Tensor) else 'object of'} {type(a)}\n"
                        for a in overloaded)
        raise TypeError(f"Multiple dispatch failed for '{_func_name(public_api)}'; all __torch_function__ handlers "
                        f"returned NotImplemented:\n\n{kinds}\nFor more information, try re-running with "
                        "TORCH_LOGS=not_implemented")
    return result


def get_default_nowrap_functions() -> set:
    """The methods whose results the default ``__torch_function__`` leaves as they are (torch's)."""
    return {Tensor._base.__get__, Tensor.grad.__get__, Tensor._grad.__get__}


def is_tensor_like(inp) -> bool:
    """A Tensor, a Tensor subclass instance, or an object whose type has ``__torch_function__``."""
    return type(inp) is Tensor or hasattr(inp, "__torch_function__")


def is_tensor_method_or_property(func) -> bool:
    return func in _wrapped_originals() or getattr(func, "__self__", None) in _properties()


# ------------------------------------------------------------------ lowering subclass instances for a call
def _subclass_instances(args: tuple, kwargs: dict) -> list:
    found = []
    for a in (*args, *kwargs.values()):
        if type(a) is not Tensor and isinstance(a, Tensor):
            found.append(a)
        elif type(a) in (list, tuple):
            found += [b for b in a if type(b) is not Tensor and isinstance(b, Tensor)]
    return found


def has_subclass_instances(args: tuple) -> bool:
    return bool(_subclass_instances(args, {}))


def _set_class(t: Tensor, cls: type) -> None:
    try:
        object.__setattr__(t, "__class__", cls)
    except TypeError:
        slotted = cls if cls is not Tensor else type(t)
        raise TypeError(f"{slotted.__name__}: a Tensor subclass that adds __slots__ is not supported by tilewise (its "
                        "instances must have Tensor's layout; keep attributes in the instance's __dict__)") from None


@contextlib.contextmanager
def _lowered(instances: list):
    instances = list({id(t): t for t in instances}.values())
    classes = [type(t) for t in instances]
    for t in instances:
        _set_class(t, Tensor)
    try:
        yield
    finally:
        for t, cls in zip(instances, classes):
            object.__setattr__(t, "__class__", cls)


def lowered_call(fn, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)`` with the subclass instances among the arguments seen as plain tensors."""
    instances = _subclass_instances(args, kwargs)
    if not instances:
        return fn(*args, **kwargs)
    with _lowered(instances):
        return fn(*args, **kwargs)


def routed_to_overrides(x) -> bool:
    """For a function written by hand, whose first argument is not a plain tensor: whether it is one that
    ``overridden_call`` takes (a subclass instance, or with overrides on, a ``__torch_function__`` object)."""
    return isinstance(x, Tensor) or STATE.disabled == ENABLED and hasattr(type(x), "__torch_function__")


def overridden_call(entry, args: tuple, kwargs: dict):
    """A public function's arguments hold a subclass instance or a ``__torch_function__`` object: run the
    overrides, or with them off, the function on the lowered arguments."""
    if STATE.disabled == ENABLED:
        overloaded = _get_overloaded_args((*args, *kwargs.values()))
        if overloaded:
            return _dispatch_overrides(entry, overloaded, args, kwargs)
    return lowered_call(entry, args, kwargs)


# ------------------------------------------------------------------ Tensor's side of the protocol
def _convert(ret, cls):
    if cls is Tensor:
        return ret
    if isinstance(ret, Tensor) and not isinstance(ret, cls):
        return ret.as_subclass(cls)
    if type(ret) in (list, tuple):
        return type(ret)(_convert(r, cls) for r in ret)
    if isinstance(ret, tuple) and hasattr(ret, "_fields"):  # the named results (tilewise.return_types)
        return type(ret)(*(_convert(r, cls) for r in ret))
    return ret


def _default_torch_function(cls, func, types, args=(), kwargs=None):
    """Tensor's ``__torch_function__``: run ``func`` with subclass handling off and give the tensors it returns the
    subclass's type (those of ``get_default_nowrap_functions()`` aside)."""
    if kwargs is None:
        kwargs = {}
    if not all(issubclass(cls, t) for t in types):
        return NotImplemented
    with DisableTorchFunctionSubclass():
        ret = func(*args, **kwargs) if func is _UNLOWERED.get("__repr__") else lowered_call(func, args, kwargs)
        if func in get_default_nowrap_functions():
            return ret
        return _convert(ret, cls)


def _retyped(t: Tensor, cls: type) -> Tensor:
    """``t`` (a fresh plain tensor) as an instance of ``cls``."""
    if cls is not Tensor:
        _set_class(t, cls)
    return t


def _check_subclass(cls) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Tensor)):
        raise TypeError("Creating a Tensor subclass from a class that does not inherit from Tensor is not possible. "
                        "Make sure your class inherits from Tensor.")


def as_subclass(self, cls):
    """This tensor as an instance of ``cls``, a Tensor subclass: an alias of its memory, with its autograd history.

    >>> import tilewise as tw
    >>> class Tagged(tw.Tensor): pass
    >>> type(tw.ones(2).as_subclass(Tagged) + 1).__name__
    'Tagged'
    """
    _check_subclass(cls)
    with DisableTorchFunctionSubclass():
        return _retyped(lowered_call(Tensor.view_as, (self, self), {}), cls)


def _make_subclass(cls, data, require_grad: bool = False):
    """torch.Tensor._make_subclass: a new leaf of type ``cls`` on ``data``'s memory."""
    _check_subclass(cls)
    if not isinstance(data, Tensor):
        raise TypeError(f"_make_subclass(): argument 'data' (position 2) must be Tensor, not {type(data).__name__}")
    with DisableTorchFunctionSubclass():
        made = lowered_call(Tensor.detach, (data,), {})
        made.requires_grad_(require_grad)
    return _retyped(made, cls)


# ------------------------------------------------------------------ a subclass's own method wrappers
_NOT_WRAPPED = frozenset({
    "__new__", "__init__", "__init_subclass__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__",
    "__class__", "__dict__", "__weakref__", "__slots__", "__module__", "__doc__", "__torch_function__",
    "__reduce_ex__", "__reduce__", "__deepcopy__", "__copy__", "__getstate__", "__setstate__", "__sizeof__",
    "__subclasshook__", "__array_priority__", "__dir__", "as_subclass", "_make_subclass",
})
_REFLECTED = frozenset({"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rdiv__", "__rfloordiv__", "__rmod__",
                        "__rpow__", "__rmatmul__", "__rand__", "__ror__", "__rxor__", "__rlshift__", "__rrshift__"})
_ORIGINALS: dict[str, object] = {}
_UNLOWERED: dict[str, object] = {}  # originals that read their tensor's type (repr prints the subclass's name)


def _wrapped_originals() -> dict:
    if not _ORIGINALS:
        for name, attr in Tensor.__dict__.items():
            if name in _NOT_WRAPPED or name in _REFLECTED or (name.startswith("_") and not name.startswith("__")):
                continue
            if callable(attr) and not isinstance(attr, (staticmethod, classmethod, type)) or isinstance(attr, property):
                _ORIGINALS[name] = attr
                own = getattr(attr, "__name__", name)
                if name.startswith("__") and not hasattr(Tensor, own):  # getitem as __getitem__ (x + y keeps "add")
                    attr.__name__ = name
        _UNLOWERED["__repr__"] = _ORIGINALS["__repr__"]
    return _ORIGINALS


def _properties() -> set:
    return {a for a in _wrapped_originals().values() if isinstance(a, property)}


def _method_wrapper(name: str, original):
    def method(self, *args, **kwargs):
        if STATE.disabled == ENABLED:
            overloaded = _get_overloaded_args((self, *args, *kwargs.values()))
            if overloaded:
                return _dispatch_overrides(original, overloaded, (self, *args), kwargs)
        return lowered_call(original, (self, *args), kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(original, "__doc__", None)
    return method


def _property_wrapper(prop: property) -> property:
    get, put = prop.__get__, prop.__set__

    def getter(self):
        if STATE.disabled == ENABLED and _overloading(self):
            return _dispatch_overrides(get, [self], (self,), {})
        return get(self)

    def setter(self, value):
        if STATE.disabled == ENABLED and _overloading(self):
            return _dispatch_overrides(put, _get_overloaded_args((self, value)), (self, value), {})
        return put(self, value)

    return property(getter, setter if prop.fset is not None else None, prop.fdel, prop.__doc__)


def _first_definer(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


def _init_subclass(cls, **kwargs) -> None:
    """A Tensor subclass is made: give it a wrapper of every Tensor method and property it does not define itself,
    so that calling one on its instances goes through ``__torch_function__``."""
    super(Tensor, cls).__init_subclass__(**kwargs)
    for name, original in _wrapped_originals().items():
        if _first_definer(cls, name) is not Tensor:
            continue
        wrapped = _property_wrapper(original) if isinstance(original, property) else _method_wrapper(name, original)
        setattr(cls, name, wrapped)


def _rebuild_subclass(cls, rebuild, args, state):
    with DisableTorchFunctionSubclass():
        t = rebuild(*args)
    t = _retyped(t, cls)
    if state:
        t.__dict__.update(state)
    return t


def _reduce_ex(self, protocol):
    """Pickling a subclass instance: the plain tensor's recipe, then its type and attributes (torch's
    ``_rebuild_from_type_v2``)."""
    if type(self) is Tensor:
        return _PLAIN["__reduce_ex__"](self, protocol)
    with _lowered([self]):
        rebuild, args, state = _PLAIN["__reduce_ex__"](self, protocol)
    return (_rebuild_subclass, (type(self), rebuild, args, state))


def _deepcopy(self, memo):
    if type(self) is Tensor:
        return _PLAIN["__deepcopy__"](self, memo)
    with DisableTorchFunctionSubclass():
        probe = self.new_empty([])
    if type(probe) is not type(self):
        raise RuntimeError("The default implementation of __deepcopy__() for non-wrapper subclasses only works for "
                           "subclass types that implement new_empty() and for which that function returns another "
                           "instance of the same subclass. You should either properly implement new_empty() for your "
                           "subclass or override __deepcopy__() if it is intended behavior for new_empty() to return "
                           "an instance of a different type.")
    with _lowered([self]):
        out = _PLAIN["__deepcopy__"](self, memo)
    return _retyped(out, type(self))


_PLAIN: dict = {}


def install() -> None:
    """Give Tensor its side of the protocol (called once, by the package on import)."""
    Tensor.__torch_function__ = classmethod(_default_torch_function)
    Tensor.__init_subclass__ = classmethod(_init_subclass)
    Tensor.as_subclass = as_subclass
    Tensor._make_subclass = staticmethod(_make_subclass)
    for name, method in (("__reduce_ex__", _reduce_ex), ("__deepcopy__", _deepcopy)):
        _PLAIN[name] = Tensor.__dict__[name]
        method.__name__ = name
        setattr(Tensor, name, method)


install()
