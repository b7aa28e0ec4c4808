"""Custom operators: Python functions (numpy, CUDA C through ``tilewise.cuda.load_inline``, Triton) as operators.

[Note: custom operators] ``custom_op("mylib::name", mutates_args=())`` turns a typed Python function into an
operator of the operator table, as torch.library does: its schema is inferred from the annotations
(``infer_schema``, torch's rules and spellings), it is declared with kind ``"custom"``, and from then on it is
an operator like any declared one. Calls bind through the schema and walk the dispatcher: the Profiler key
names it, the Autocast key casts it once ``register_autocast`` gave it a policy, the Autograd key records it as
an ``autograd.Function`` as torch.library does (``setup_context`` runs right after the kernel and saves what it
chooses; the node is torch's ``GeneratedBackwardFor_<ns>_<name>_defaultBackward``; a gradient reaching an operator
without a registered backward raises torch's error), and the backend key calls the kernel registered for
the inputs' device type (``register_kernel``, or the decorated function itself). While ``tilewise.compile``
traces, the operator is one opaque node of the graph: its result types come from the fake implementation
(``register_fake``), called on the trace tensors (what it builds is never read and dead-code elimination drops
it), and the program runs it as one library-call step over planned buffers, like the cuBLAS and cuDNN calls; on
CUDA that step is captured into the program's CUDA graph with the rest unless the operator is tagged
``Tag.cudagraph_unsafe`` or its capture fails (see [Note: custom operators in CUDA graphs]).
Operators that mutate an argument run between compiled segments (a graph break), since the compiler's graph
holds functional steps only. torch checks a fake implementation against the kernel only in ``opcheck``; here the
first real call on each device type compares the two (shapes and dtypes) and names the operator when they
differ, so a wrong fake fails before it plans wrong buffers.
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import threading
import typing
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from numbers import Number

from tilewise import dispatch
from tilewise.amp.autocast_mode import cast_inputs_policy
from tilewise.autograd.function import Function
from tilewise.cuda.extension import ACTIVE_OPERATOR
from tilewise.device import Device
from tilewise.dtypes import DType, as_dtype
from tilewise.ops import registry
from tilewise.ops.registry import declare
from tilewise.ops.tags import Tag
from tilewise.tensor import Tensor

__all__ = ["CustomOpDef", "custom_op", "infer_schema", "register_autocast", "register_autograd", "register_fake",
           "register_kernel", "triton_op", "wrap_triton"]

UNKNOWN_MUTATES = "unknown"
DEVICE_TYPES = ("cpu", "cuda")

# ---------------------------------------------------------------------------- schema inference (torch's rules)


def _sequences(t) -> tuple:
    return (typing.Sequence[t], typing.List[t], collections.abc.Sequence[t], list[t])  # noqa: UP006


def _param_types() -> dict:
    """Python annotation -> schema type, as torch.library.infer_schema spells them."""
    table: dict = {}
    rows = ((Tensor, "Tensor", True, True, False), (int, "SymInt", True, False, True),
            (float, "float", True, False, True), (bool, "bool", True, False, True), (str, "str", False, False, False),
            (Number, "Scalar", True, False, False), (DType, "ScalarType", False, False, False),
            (Device, "Device", False, False, False))
    for base, name, lists, optional_items, optional_list in rows:
        table[base] = name
        table[typing.Optional[base]] = f"{name}?"  # noqa: UP045
        if lists:
            table.update((seq, f"{name}[]") for seq in _sequences(base))
        if optional_items:
            table.update((seq, f"{name}?[]") for seq in _sequences(typing.Optional[base]))  # noqa: UP045
        if optional_list:
            table.update((typing.Optional[seq], f"{name}[]?") for seq in _sequences(base))  # noqa: UP045
    return table


PARAM_TYPES = _param_types()
RETURN_TYPES = {Tensor: "Tensor", typing.List[Tensor]: "Tensor[]", list[Tensor]: "Tensor[]",  # noqa: UP006
                int: "SymInt", float: "float", bool: "bool", Number: "Scalar"}


def _default_text(name: str, default, fail: Callable) -> str:
    if default is None or isinstance(default, (bool, int, float)):
        return str(default)
    if isinstance(default, (str, Device)):
        return f'"{default}"'
    if isinstance(default, DType):
        return default.name
    fail(f"Parameter {name} has an unsupported default value type {type(default)}.")


def _return_text(annotation, fail: Callable) -> str:
    if annotation is None or annotation is type(None):
        return "()"
    if annotation is inspect.Parameter.empty:
        fail("No return type annotation was provided. Please add one.")
    if typing.get_origin(annotation) is not tuple:
        if annotation not in RETURN_TYPES:
            fail(f"Return has unsupported type {annotation}. The valid types are: {list(RETURN_TYPES)}.")
        return RETURN_TYPES[annotation]
    items = typing.get_args(annotation)
    for item in items:
        if item not in RETURN_TYPES:
            fail(f"Return has unsupported type {annotation}. The valid types are: {list(RETURN_TYPES)}.")
    text = ", ".join(RETURN_TYPES[item] for item in items)
    return f"(({text}))" if len(items) == 1 else f"({text})"


def _type_hints(fn: Callable, sig: inspect.Signature, fail: Callable) -> dict:
    """The annotations as types, strings (``from __future__ import annotations``) evaluated in ``fn``'s module."""
    raw = {name: p.annotation for name, p in sig.parameters.items()} | {"return": sig.return_annotation}
    hints = {}
    for name, annotation in raw.items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, getattr(fn, "__globals__", {}))  # noqa: S307 — the user's own annotation
            except Exception as exc:  # noqa: BLE001 — any failure is an annotation that is not a type
                fail(f"Unsupported type annotation {annotation}. It is not a type. ({type(exc).__name__}: {exc}). "
                     "With 'from __future__ import annotations', the types an annotation names must be importable "
                     "at module scope.")
        hints[name] = annotation
    return hints


def infer_schema(fn: Callable, /, *, mutates_args, op_name: str | None = None) -> str:
    """The schema torch.library.infer_schema writes for ``fn``'s annotations.

    >>> def scale(x: tilewise.Tensor, alpha: float = 2.0) -> tilewise.Tensor: ...
    >>> infer_schema(scale, mutates_args=())
    '(Tensor x, float alpha=2.0) -> Tensor'
    """
    sig = inspect.signature(fn)

    def fail(what: str):
        raise ValueError(f"infer_schema(func): {what} Got func with signature {sig})")

    hints = _type_hints(fn, sig, fail)

    if type(mutates_args) is str and mutates_args != UNKNOWN_MUTATES:
        raise ValueError("mutates_args must either be a sequence of the names of the arguments that are mutated or "
                         "the string 'unknown'. ")
    mutated = mutates_args if type(mutates_args) is str else tuple(mutates_args)
    params, kwarg_only = [], False
    for idx, (name, p) in enumerate(sig.parameters.items()):
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            fail("We do not support positional-only args, varargs, or varkwargs.")
        if p.kind is p.KEYWORD_ONLY and not kwarg_only:
            params.append("*")
            kwarg_only = True
        if p.annotation is inspect.Parameter.empty:
            fail(f"Parameter {name} must have a type annotation.")
        annotation = hints[name]
        if annotation not in PARAM_TYPES:
            fail(f"Parameter {name} has unsupported type {p.annotation}. The valid types are: {list(PARAM_TYPES)}.")
        ty = PARAM_TYPES[annotation]
        if mutated == UNKNOWN_MUTATES and ty.startswith("Tensor") or name in mutated:
            if not ty.startswith("Tensor"):
                fail(f"Parameter {name} is in mutable_args but only Tensors or collections of Tensors can be mutated")
            ty = f"Tensor(a{idx}!){ty[len('Tensor'):]}"
        text = f"{ty} {name}"
        if p.default is not inspect.Parameter.empty:
            text += f"={_default_text(name, p.default, fail)}"
        params.append(text)
    if mutated != UNKNOWN_MUTATES:
        unseen = set(mutated) - set(sig.parameters)
        if unseen:
            fail(f"{unseen} in mutates_args were not found in the custom op's signature. mutates_args should contain "
                 "the names of all args that the custom op mutates, or just the string 'unknown' if you don't know.")
    returns = _return_text(hints["return"], fail)
    return f"{op_name or ''}({', '.join(params)}) -> {returns}"


# ---------------------------------------------------------------------------- the operator


def _split_name(qualname: str) -> tuple[str, str]:
    namespace, sep, name = qualname.partition("::")
    if not sep or not namespace.isidentifier() or not name.isidentifier():
        raise ValueError(f"Expected there to be a namespace in {qualname!r}, i.e. the name should look like "
                         "'mylib::my_op' (a namespace and an operator name, both identifiers).")
    return namespace, name


def _device_types(device_types) -> tuple[str, ...]:
    types = (device_types,) if isinstance(device_types, str) else tuple(device_types)
    for t in types:
        kind = t.type if isinstance(t, Device) else str(t).partition(":")[0]
        if kind not in DEVICE_TYPES:
            raise RuntimeError(f"Expected one of {', '.join(DEVICE_TYPES)} device type at start of device string: {t}")
    return tuple(t.type if isinstance(t, Device) else str(t).partition(":")[0] for t in types)


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class CustomOpDef:
    """A custom operator: call it like a function; register its fake, kernels, autograd and autocast on it."""

    def __init__(self, qualname: str, schema: str, fn: Callable | None, device_types, mutates_args, tags=(),
                 launches_triton: bool = False):
        self.namespace, self._name = _split_name(qualname)
        self.tags = _tags(qualname, tags)
        self._launches_triton = launches_triton  # triton_op: Triton launches on tilewise's current stream
        self.qualname = qualname
        self._kernels: dict[str, Callable] = {}
        self._fake: Callable | None = None
        self._checked: set[str] = set()  # device types whose first real call checked the fake
        self._backward = self._setup_context = None
        self.modules: dict = {}  # name -> tilewise.cuda.load_inline module its kernels launch
        self.op = _declare(qualname, schema, self)
        self._mutated = tuple(k for k, p in enumerate(self.op.schema.params) if p.mutated)
        if fn is not None:
            for device_type in _device_types(device_types) if device_types is not None else DEVICE_TYPES:
                self._kernels[device_type] = fn
        self._public = registry.public_function(qualname)
        self._public.default = self._public
        self._public.tags = list(self.tags)
        self.__name__ = self._name
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self) -> str:
        return f"<CustomOpDef({self.qualname})>"

    def __call__(self, *args, **kwargs):
        return self._public(*args, **kwargs)

    @property
    def default(self):
        """The operator's one overload, as ``torch.ops.mylib.name.default``."""
        return self._public

    # ------------------------------------------------------------------------ registrations

    def register_fake(self, fn: Callable, /) -> Callable:
        """Result shapes and dtypes without running the kernel: ``fn`` takes the operator's arguments and returns
        tensors of the right shape and dtype (``x.new_empty(...)``, ``tilewise.empty_like(x)``); ``compile``
        calls it on trace tensors to plan the results' buffers."""
        self._fake = fn
        self._checked.clear()
        return fn

    def register_kernel(self, device_types, fn: Callable | None = None, /):
        """The implementation for inputs on ``device_types`` (``"cpu"``, ``"cuda"`` or a sequence of them)."""
        types = _device_types(device_types)

        def register(fn: Callable) -> Callable:
            for device_type in types:
                self._kernels[device_type] = fn
                self._checked.discard(device_type)
            return fn

        return register(fn) if fn is not None else register

    def register_autograd(self, backward: Callable, /, *, setup_context: Callable | None = None) -> None:
        """``backward(ctx, *grads)`` returns one gradient per input (None for non-tensors); ``setup_context(ctx,
        inputs, output)`` saves on ``ctx`` what it needs."""
        if self.op.schema.is_inplace:
            raise RuntimeError(f"{self.qualname}: register_autograd is not supported for operators that mutate "
                               "their inputs (mutates_args); declare a functional operator instead.")
        self._backward, self._setup_context = backward, setup_context

    def register_autocast(self, device_type: str, cast_inputs: DType) -> None:
        """Inside ``tilewise.autocast`` for ``device_type``, cast the floating inputs (float64 and integers left
        alone) to ``cast_inputs`` itself, whatever the region's autocast dtype, then run with autocast off: a policy
        for that device type alone, as torch registers it."""
        (kind,) = _device_types(device_type)
        self.op.autocast = {**(self.op.autocast or {}), kind: cast_inputs_policy(as_dtype(cast_inputs))}

    # ------------------------------------------------------------------------ running

    def _run(self, args: tuple, device: Device):
        kernel = self._kernels.get(device.type)
        if kernel is None:
            raise NotImplementedError(f"{self.qualname}: no kernel registered for device type {device.type!r} "
                                      f"(registered: {sorted(self._kernels) or 'none'}); add one with "
                                      f"@{self._name}.register_kernel({device.type!r})")
        if device.type == "cuda":
            out = self._run_cuda(kernel, args)
        else:
            out = kernel(*_below_autograd(args))
        for k in self._mutated:  # a kernel may write through pointers: the version counter says it wrote
            for t in _tensor_args((args[k],)):
                t._storage.version += 1
        self._check_aliasing(args, out)
        if device.type not in self._checked and self._fake is not None:
            self._check_fake(args, out, device)
        return tuple(out) if isinstance(out, list) else out

    def _run_cuda(self, kernel: Callable, args: tuple):
        """Run a CUDA kernel function; the ``load_inline`` kernels it launches are remembered (``launched``)."""
        active = ACTIVE_OPERATOR.__dict__.get("custom")
        ACTIVE_OPERATOR.custom = self
        try:
            if self._launches_triton:
                with _triton_on_current_stream():
                    return kernel(*_below_autograd(args))
            return kernel(*_below_autograd(args))
        finally:
            ACTIVE_OPERATOR.custom = active

    def launched(self, module) -> None:
        """A ``tilewise.cuda.load_inline`` module one of this operator's kernels launched (``explain`` shows its
        PTX and SASS); also to be called directly, to show a module's code before anything ran."""
        self.modules.setdefault(module.name, module)

    def _check_aliasing(self, args: tuple, out) -> None:
        storages = {id(a._storage) for a in _tensor_args(args)}
        for o in _outputs(out):
            if type(o) is Tensor and id(o._storage) in storages:
                raise RuntimeError(f"{self.qualname}: the output of this custom operator (1) must not also be an "
                                   "input to this custom operator and (2) may not alias any inputs to this custom "
                                   "operator or other returns. Return a clone (x.clone()) instead.")

    def _check_fake(self, args: tuple, out, device: Device) -> None:
        """The first real call on a device type: the fake's results must match the kernel's."""
        fake = _outputs(self._fake(*args))
        real = _outputs(out)
        if len(fake) != len(real):
            raise RuntimeError(f"{self.qualname}: the fake implementation returned {len(fake)} value(s) and the "
                               f"{device.type} kernel {len(real)}")
        for k, (f, r) in enumerate(zip(fake, real)):
            if type(r) is not Tensor:
                continue
            if type(f) is not Tensor or f._shape != r._shape or f._dtype is not r._dtype:
                what = f"shape {list(f._shape)}, dtype {f._dtype}" if type(f) is Tensor else type(f).__name__
                raise RuntimeError(f"{self.qualname}: the fake implementation's output {k} ({what}) does not match "
                                   f"the {device.type} kernel's (shape {list(r._shape)}, dtype {r._dtype}); "
                                   "tilewise.compile plans buffers from the fake, so it must describe the kernel's "
                                   "results exactly")
        self._checked.add(device.type)

    def _fake_results(self, args: tuple):
        """The fake's results for the compiler's capture (see ``compiler/meta``)."""
        if self._fake is None:
            raise RuntimeError(f"There was no fake impl registered for {self!r}. This is necessary for "
                               f"tilewise.compile to work. Please use `{self._name}.register_fake` to add a fake "
                               "impl.")
        return self._fake(*args)

    # ------------------------------------------------------------------------ autograd

    def _record(self, args: tuple):
        """The Autograd key: the operator's call as an ``autograd.Function``, as torch.library makes it, so that
        ``setup_context`` runs right after the kernel and saves exactly what it chooses."""
        return self._function.apply(*args)

    def _make_function(self) -> type:
        custom = self

        def forward(ctx, *args):
            out = dispatch.run(custom.op, args)  # below autograd: the backend's kernel, or the Trace key
            if custom._setup_context is not None:
                custom._setup_context(ctx, args, out)
            return out

        def backward(ctx, *grads):
            if custom._backward is None:
                raise RuntimeError(f"Trying to backward through {custom.qualname} but no autograd formula was "
                                   "registered. Please use register_autograd to add one.")
            return custom._backward(ctx, *grads)

        name = f"GeneratedBackwardFor_{self.namespace}_{self._name}_default"  # its node: torch's name + "Backward"
        return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _below_autograd(args: tuple) -> tuple:
    """A kernel's arguments: inputs that require grad are handed over detached, so that the kernel may read them
    (``.numpy()``, ``data_ptr()``) as torch's kernels, which run with grad mode off, may."""
    return tuple(_detached(a) if type(a) is Tensor else
                 type(a)(_detached(x) for x in a) if isinstance(a, (tuple, list)) else a for a in args)


def _detached(a):
    return a.detach() if type(a) is Tensor and a._requires_grad else a


def _tensor_args(args: tuple) -> Iterable[Tensor]:
    for a in args:
        if type(a) is Tensor:
            yield a
        elif isinstance(a, (tuple, list)):
            yield from (x for x in a if type(x) is Tensor)


def _tags(qualname: str, tags) -> tuple[Tag, ...]:
    """An operator's tags as torch.library.custom_op takes them (one Tag or a sequence), pt2_compliant_tag first."""
    given = (tags,) if isinstance(tags, Tag) else tuple(tags or ())
    for tag in given:
        if not isinstance(tag, Tag):
            raise TypeError(f"custom_op({qualname!r}): tags must be tilewise.Tag values (such as "
                            f"tilewise.Tag.cudagraph_unsafe), got {tag!r} of type {type(tag).__name__}")
    return tuple(dict.fromkeys((Tag.pt2_compliant_tag, *given)))


def _declare(qualname: str, schema: str, custom: CustomOpDef):
    _undeclare(qualname)  # torch lets a script run its registrations again; the newest one wins
    op = declare(f"{qualname}{schema}", "custom", differentiable=True, public=False, run=custom._run,
                 record=custom._record, fake=custom._fake_results, custom=custom, tags=custom.tags)
    custom.op = op
    custom._function = custom._make_function()
    return op


def _undeclare(qualname: str) -> None:
    for op in registry.OVERLOADS.pop(qualname, ()):
        registry.OPS.pop(op.full_name, None)
    registry._PUBLIC.pop(qualname, None)


# ---------------------------------------------------------------------------- torch.library's functions


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args, device_types=None,
              schema: str | None = None, tags=None):
    """Make ``fn`` an operator named ``name`` ("namespace::op"), with a schema inferred from its annotations.

    ``tags``: a :class:`tilewise.Tag` or a sequence of them; ``tilewise.Tag.cudagraph_unsafe`` keeps compiled
    programs that call the operator out of CUDA graphs (for a kernel that synchronizes, reads results on the
    host, or launches on a stream other than the current one).

    >>> @custom_op("demo::scale", mutates_args=())
    ... def scale(x: tilewise.Tensor, alpha: float) -> tilewise.Tensor:
    ...     return x * alpha
    >>> scale(tilewise.ones(2), 3.0)
    tensor([3., 3.])
    """
    _split_name(name)

    def make(fn: Callable) -> CustomOpDef:
        text = schema if schema is not None else infer_schema(fn, mutates_args=mutates_args)
        return CustomOpDef(name, text, fn, device_types, mutates_args, tags)

    return make(fn) if fn is not None else make


def triton_op(name: str, fn: Callable | None = None, /, *, mutates_args, schema: str | None = None):
    """A Python function that launches Triton kernels on its tensors, as one operator (``torch.library.
    triton_op``): ``compile`` holds it as one step, like any custom operator (its fake: ``register_fake``).
    Triton reads a tilewise tensor as it reads a torch one (``data_ptr()`` and ``dtype``). Its launches inside the
    operator go to tilewise's current stream (Triton's driver otherwise reports torch's), so they are ordered
    with tilewise's work and captured with it into a compiled program's CUDA graph."""
    _split_name(name)

    def make(fn: Callable) -> CustomOpDef:
        text = schema if schema is not None else infer_schema(fn, mutates_args=mutates_args)
        return CustomOpDef(name, text, fn, "cuda", mutates_args, launches_triton=True)

    return make(fn) if fn is not None else make


_TRITON_STREAM = threading.local()  # .active: this thread is inside a triton_op's kernel


@contextmanager
def _triton_on_current_stream():
    """Within the block, Triton launches on this thread's tilewise current stream (see ``triton_op``)."""
    _hook_triton_stream()
    previous = getattr(_TRITON_STREAM, "active", False)
    _TRITON_STREAM.active = True
    try:
        yield
    finally:
        _TRITON_STREAM.active = previous


def _hook_triton_stream() -> None:
    """Wrap the active Triton driver's ``get_current_stream`` once: on a thread inside a triton_op it reports
    tilewise's current stream of the device, elsewhere what it reported before (torch's)."""
    triton = sys.modules.get("triton")
    if triton is None:  # the kernel launches no Triton kernel, or imports Triton itself (hooked at the next call)
        return
    config = triton.runtime.driver
    driver = getattr(config, "active", config)  # Triton 3: DriverConfig.active; before: the driver itself
    original = driver.get_current_stream
    if getattr(original, "tilewise_hook", False):
        return
    from tilewise.backends.cuda import stream_handle
    from tilewise.backends.cuda.runtime import current_device

    def get_current_stream(device=None):
        if getattr(_TRITON_STREAM, "active", False):
            return stream_handle(device if device is not None else current_device())
        return original(device) if device is not None else original()

    get_current_stream.tilewise_hook = True
    driver.get_current_stream = get_current_stream


def wrap_triton(kernel):
    """torch.library.wrap_triton's spelling inside a ``triton_op``: the compiler holds the whole operator as one
    step, so a kernel is launched as it is (``wrap_triton(k)[grid](...)`` is ``k[grid](...)``)."""
    return kernel


def _custom(op) -> CustomOpDef:
    if isinstance(op, CustomOpDef):
        return op
    found = registry.OPS.get(op) if isinstance(op, str) else None
    if found is None or found.kind != "custom":
        raise RuntimeError(f"operator {op} does not exist" if isinstance(op, str) else
                           f"expected a custom operator or its name ('mylib::op'), got {type(op).__name__}")
    return found.attrs["custom"]


def register_fake(op, fn: Callable | None = None, /):
    """``register_fake("mylib::op")(fn)`` or ``register_fake("mylib::op", fn)``."""
    custom = _custom(op)
    return custom.register_fake(fn) if fn is not None else custom.register_fake


def register_kernel(op, device_types, fn: Callable | None = None, /):
    return _custom(op).register_kernel(device_types, fn)


def register_autograd(op, backward: Callable, /, *, setup_context: Callable | None = None) -> None:
    _custom(op).register_autograd(backward, setup_context=setup_context)


def register_autocast(op, device_type: str, cast_inputs: DType) -> None:
    _custom(op).register_autocast(device_type, cast_inputs)
