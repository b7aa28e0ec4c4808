"""``tilewise.compile``: compiled callables with guards, variants, recompilation and side effects.

[Note: compiled functions] A ``CompiledFunction`` keeps a list of *variants*, each a ``Program`` built
for one specialisation of the function, with the ``Guards`` that say when it applies: the structure and
the non-tensor values of the arguments, and for every tensor the function reads (arguments, captured
parameters and buffers, gradients) its shape, strides, storage offset and size, dtype, device and
``requires_grad``; which of them share storage; whether a parameter whose gradient the function changed
had one; grad mode; the autocast state (the traced graph holds the casts it made); the ``training`` flags
of a module; what the state tables of reachable optimizers hold. A call runs the first variant whose
guards pass; on a miss the function is traced again and a new variant compiled, up to
``settings.recompile_limit`` variants, after which it runs eagerly (with one warning).
``TILEWISE_LOG=recompiles`` says which guard failed.

Running a variant reproduces every effect the traced function had: outputs are fresh tensors, inputs
written in place are updated in their own memory (their version counters bump, as eager in-place ops
do), ``.grad`` of parameters is set or cleared as the function did, and optimizer state the function
created (momentum buffers on a first step) is stored; the next call sees that state changed and compiles
the steady-state step, which updates the buffers in place.
"""

from __future__ import annotations

import copy
import inspect
import operator
import warnings
from dataclasses import dataclass, field

import numpy as np

from tilewise import _strides as S
from tilewise._stages import Stages, stage
from tilewise.amp.autocast_mode import describe as describe_autocast
from tilewise.autograd.function import Function
from tilewise.compiler.capture import (
    LAYOUT_FIELDS,
    DataDependentError,
    Source,
    Traced,
    flatten,
    signature,
    trace,
    unflatten,
)
from tilewise.compiler.passes import dce, pipeline_for, run_pipeline
from tilewise.compiler.passes.partition import partition
from tilewise.compiler.program import Program, build_program, host_arena
from tilewise.config import log, settings
from tilewise.device import Device, cpu
from tilewise.dispatch import STATE
from tilewise.storage import Storage
from tilewise.tensor import Tensor, from_array

MODES = ("default", "reduce-overhead", "max-autotune")


class UnsupportedTargetError(RuntimeError):
    """The function runs on a device the compiler has no code generation for yet."""


# ---------------------------------------------------------------------------- guards

def _describe_signature(sig) -> str:
    if sig is None:
        return "None"
    shape, strides, offset, dtype, device, requires_grad, size = sig
    return (f"shape {list(shape)}, strides {list(strides)}, offset {offset}, {dtype.name} on {device}, "
            f"requires_grad={requires_grad}, storage of {size}")


def _constant_key(value):
    return (type(value), value) if isinstance(value, (int, float, bool, str, type(None))) else (type(value), id(value))


@dataclass
class Guards:
    spec: object
    constants: list[tuple[int, object]]
    tensors: list[tuple[Source, tuple]]
    aliasing: tuple
    grad_presence: list[tuple[Source, bool]]
    grad_enabled: bool
    training: tuple
    optimizers: list  # the optimizers the function reaches: their state tables and param groups are guarded
    state_layout: list  # _state_layout(optimizers) when traced
    hyperparameters: tuple  # _hyperparameters(optimizers) when traced: the trace baked them in
    autocast: tuple = ()  # AutocastState.key when traced: the casts it recorded

    def failure(self, flat: list, spec, module) -> str | None:
        """None when this variant applies to the call, else which guard failed."""
        if spec != self.spec:
            return "the arguments have a different structure (number, nesting or keyword names)"
        for index, key in self.constants:
            if _constant_key(flat[index]) != key:
                return f"argument leaf {index} is {flat[index]!r}, compiled for {key[1]!r}"
        if STATE.grad_enabled != self.grad_enabled:
            return f"grad mode is {'on' if STATE.grad_enabled else 'off'}, compiled with it " \
                   f"{'on' if self.grad_enabled else 'off'}"
        if _autocast_key() != self.autocast:
            return f"the autocast guard failed: called under {describe_autocast(_autocast_key())}, compiled under " \
                   f"{describe_autocast(self.autocast)}"
        if module is not None and _training_flags(module) != self.training:
            return "a module's training flag changed (train()/eval())"
        if _state_layout(self.optimizers) != self.state_layout:
            return "an optimizer's state changed (buffers created or replaced)"
        if _hyperparameters(self.optimizers) != self.hyperparameters:
            return _hyperparameter_change(self.optimizers, self.hyperparameters)
        reason = self._tensor_failure(flat)
        if reason is not None:
            return reason
        for source, had in self.grad_presence:
            owner = source.fetch(flat)
            if (owner._grad is not None) != had:
                return f"{source.label}.grad is {'set' if owner._grad is not None else 'None'}; compiled with it " \
                       f"{'set' if had else 'None'}"
        return None

    def __post_init__(self) -> None:
        # [Note: fast guards] A training step reads every parameter and optimizer state tensor: GPT-2's is
        # 594 tensors, and checking them one by one in Python took half a millisecond a call, more than some
        # steps' kernels. The tensors held as objects are checked with one C-level map of an attrgetter over a
        # fixed list, and the storages' sharing is recomputed only when some storage is another object than
        # at the last call that passed. A failure is then explained by the one-by-one walk.
        objects = [k for k, (source, _) in enumerate(self.tensors) if source.kind == "object"]
        others = [k for k, (source, _) in enumerate(self.tensors) if source.kind != "object"]
        self._order = objects + others
        self._objects = [self.tensors[k][0].obj for k in objects]
        self._others = [self.tensors[k][0] for k in others]
        self._expected = [self.tensors[k][1] for k in self._order]
        self._held_passed: list[tuple] | None = None
        self._other_storages_passed: list[int] | None = None

    def _tensor_failure(self, flat: list) -> str | None:
        others = [source.fetch(flat) for source in self._others]
        other_signatures = [signature(t) if type(t) is Tensor else None for t in others]
        other_storages = [id(t._storage) if type(t) is Tensor else 0 for t in others]
        held = list(map(_LAYOUT, self._objects))
        if held == self._held_passed and other_storages == self._other_storages_passed:
            # the held tensors are as at the last call that passed, their storages the same objects: only the
            # arguments' signatures are left to check
            if other_signatures == self._expected[len(held):]:
                return None
            return self._explain(flat)
        if list(map(signature, self._objects)) + other_signatures != self._expected:
            return self._explain(flat)
        storages = [id(t._storage) for t in self._objects] + other_storages
        in_order = [0] * len(storages)
        for position, k in enumerate(self._order):
            in_order[k] = storages[position]
        if _alias_pattern(in_order) != self.aliasing:
            return "tensors that shared storage when compiled no longer do (or the reverse)"
        self._held_passed = held  # holds the storages: no other storage can take their ids while compared
        self._other_storages_passed = other_storages
        return None

    def _explain(self, flat: list) -> str | None:
        for source, expected in self.tensors:
            t = source.fetch(flat)
            got = signature(t) if type(t) is Tensor else None
            if got != expected:
                return f"{source.label}: {_describe_signature(got)}; compiled for {_describe_signature(expected)}"
        return None


_LAYOUT = operator.attrgetter(*LAYOUT_FIELDS, "_storage")  # ``signature`` with the storage itself, not its size


def _autocast_key() -> tuple:
    state = STATE.autocast
    return state.key if state is not None else ()


def _alias_pattern(ids: list[int]) -> tuple:
    first: dict[int, int] = {}
    return tuple(first.setdefault(i, k) for k, i in enumerate(ids))


def _training_flags(module) -> tuple:
    modules = module.modules() if hasattr(module, "modules") else [module]
    return tuple(bool(getattr(m, "training", False)) for m in modules)


_PLAIN = (int, float, bool, str, type(None))


def _state_layout(optimizers: list) -> list:
    """Which entries the optimizers' state tables hold (the tables they hold now: ``load_state_dict`` replaces
    them): tensors by identity, other values by value, flat (one list, compared in one step)."""
    out: list = []
    for o in optimizers:
        out.append(len(o.state))
        for owner, entry in o.state.items():
            out.append(id(owner))
            out.append(len(entry))
            out.extend(entry)
            out.extend([id(v) if type(v) is Tensor else v if type(v) in _PLAIN else repr(v) for v in entry.values()])
    return out


def _value_key(value):
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_value_key(v) for v in value)
    return _constant_key(value)


def _hyperparameters(optimizers: list) -> tuple:
    """What the optimizers' param groups hold besides their parameters (lr, betas, weight_decay, ...), by value:
    a trace reads them as Python numbers, so the program holds them as constants."""
    return tuple(tuple(tuple((k, _value_key(v)) for k, v in group.items() if k != "params")
                       for group in o.param_groups) for o in optimizers)


def _hyperparameter_change(optimizers: list, compiled: tuple) -> str:
    now = _hyperparameters(optimizers)
    for o, groups, old_groups in zip(optimizers, now, compiled):
        for k, (group, old) in enumerate(zip(groups, old_groups)):
            for (name, value), (old_name, old_value) in zip(group, old):
                if (name, value) != (old_name, old_value):
                    return (f"{type(o).__name__}.param_groups[{k}][{name!r}] is {o.param_groups[k].get(name)!r}, "
                            f"compiled for {old_value[-1]!r}")
    return "an optimizer's param groups changed (groups or hyperparameters added or removed)"


def reachable_optimizers(fn, arguments: tuple = ()) -> list:
    """The optimizers (objects with ``param_groups`` and a ``state`` table) a function can reach: its arguments,
    default values, closure, globals, or bound object."""
    candidates = list(arguments)
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        candidates += [owner, *getattr(owner, "__dict__", {}).values()]
    function = getattr(fn, "__func__", fn)
    candidates += [*(getattr(function, "__defaults__", None) or ()),
                   *(getattr(function, "__kwdefaults__", None) or {}).values()]
    try:
        found = inspect.getclosurevars(function)
        candidates += [*found.nonlocals.values(), *found.globals.values()]
    except (TypeError, ValueError):
        pass
    found_optimizers = []
    for c in candidates:
        state = getattr(c, "state", None) if hasattr(c, "param_groups") else None
        if isinstance(state, dict) and not any(state is o.state for o in found_optimizers):
            found_optimizers.append(c)
    return found_optimizers


def make_guards(traced: Traced, flat: list, spec, module, optimizers: list) -> Guards:
    constants = [(k, _constant_key(v)) for k, v in enumerate(flat) if type(v) is not Tensor]
    tensors = [(ts.source, ts.signature) for ts in traced.tensor_sources]
    storages = [id(ts.source.fetch(flat)._storage) for ts in traced.tensor_sources]
    return Guards(spec, constants, tensors, _alias_pattern(storages), traced.grad_presence, STATE.grad_enabled,
                  _training_flags(module) if module is not None else (), optimizers, _state_layout(optimizers),
                  _hyperparameters(optimizers), _autocast_key())


# ---------------------------------------------------------------------------- variants

@dataclass
class Variant:
    guards: Guards
    traced: Traced
    forward: Program
    backward: Program | None = None
    saved: list[tuple[str, int]] = field(default_factory=list)  # per saved value: ("input"|"output", index)

    def __post_init__(self) -> None:
        self.entries = _entry_sources(self.traced)
        graph = self.forward.graph
        self.written = sorted({graph.inputs.index(i) for i, _ in graph.writes})
        self.staged = frozenset(k for k, source in enumerate(self.entries)
                                if source.kind == "arg" and k not in self.written)

    def run(self, flat: list):
        traced = self.traced
        if self.backward is not None and STATE.grad_enabled:
            inputs = [source.fetch(flat) for source in traced.backward.inputs]
            outputs = CompiledCall.apply(self, flat, *inputs)
        else:
            outputs, _ = self.run_forward(flat)
        values = [outputs[k] if kind == "out" else flat[k] if kind == "arg" else k for kind, k in traced.output_leaves]
        return unflatten(traced.output_spec, values)

    def run_forward(self, flat: list) -> tuple[list[Tensor], tuple]:
        """Run the forward program and apply its effects; return the function's outputs and what backward reads."""
        traced, graph = self.traced, self.forward.graph
        tensors = [source.fetch(flat) for source in self.entries]
        inputs = [t._storage.data for t in tensors]
        arrays = self.forward.run(inputs, self.staged)
        outputs = [_tensor(a, node) for a, node in zip(arrays, graph.outputs)]
        for k in self.written:
            tensors[k]._bump_version()
        for effect in traced.grad_effects:
            owner = effect.owner.fetch(flat)
            owner._grad = None if effect.clear else outputs[effect.output]
        for effect in traced.state_effects:
            effect.apply(outputs)
        return outputs[:len(traced.output_requires_grad)], (inputs, arrays)

    def run_backward(self, residuals: tuple, grads: list) -> list[Tensor]:
        inputs, arrays = residuals
        spec = self.traced.backward
        tangents = [_flat(grads[k]) for k in spec.outputs]
        saved = [inputs[k] if kind == "input" else arrays[k] for kind, k in self.saved]
        results = self.backward.run(tangents + saved)
        return [_tensor(a, node) for a, node in zip(results, self.backward.graph.outputs)]


def _flat(t: Tensor):
    """A tensor's elements as a program input: a flat array, or a device buffer holding them contiguously."""
    if t._device.type == "cpu":
        return np.ascontiguousarray(t.detach()._np()).reshape(-1)
    if not (t.is_contiguous() and t._offset == 0):
        t = t.detach().clone()
    return t._storage.data


def _tensor(data, node) -> Tensor:
    """The tensor a program output is: a flat array on the CPU, a device buffer on CUDA."""
    shape, dtype = node.type.shape, node.type.dtype
    if isinstance(data, np.ndarray):
        return from_array(data.reshape(shape), dtype)
    device = node.type.device
    storage = Storage(data, device, dtype, S.numel(shape))
    return Tensor._make(storage, shape, S.contiguous_strides(shape), 0, dtype, device)


class CompiledCall(Function):
    """Autograd's view of a compiled call: the forward program, then the backward program on its residuals."""

    @staticmethod
    def forward(ctx, variant: Variant, flat: list, *inputs):
        outputs, residuals = variant.run_forward(flat)
        ctx.variant, ctx.residuals = variant, residuals
        differentiable = set(variant.traced.backward.outputs)
        ctx.mark_non_differentiable(*(o for k, o in enumerate(outputs) if k not in differentiable))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.variant.run_backward(ctx.residuals, list(grads)))


def _entry_sources(traced: Traced) -> list[Source]:
    """The source of each graph input (one per storage), in input order."""
    by_entry: dict[int, Source] = {}
    for ts in traced.tensor_sources:
        by_entry.setdefault(ts.entry, ts.source)
    return [by_entry[k] for k in range(len(by_entry))]


_FLAT_SPECS: dict[int, object] = {}


def _flatten_call(args: tuple, kwargs: dict) -> tuple[list, object]:
    """``flatten((list(args), kwargs))``; a call of only leaf arguments (tensors, numbers), the usual one, takes
    a spec made once per argument count (flattening the nested structure took 3 us of a call's 20)."""
    if not kwargs:
        for a in args:
            if isinstance(a, (list, tuple, dict)):
                break
        else:
            spec = _FLAT_SPECS.get(len(args))
            if spec is None:
                spec = _FLAT_SPECS[len(args)] = flatten((list(args), kwargs))[1]
            return list(args), spec
    return flatten((list(args), kwargs))


class CompiledFunction:
    """A function compiled per specialisation; see [Note: compiled functions]."""

    def __init__(self, fn, mode: str = "default", fullgraph: bool = True, dynamic: bool = False, module=None):
        if mode not in MODES:
            raise ValueError(f"tilewise.compile: unknown mode {mode!r}; modes: {', '.join(MODES)}")
        if dynamic:
            raise NotImplementedError("tilewise.compile(dynamic=True): shapes are specialised; compile with "
                                      "dynamic=False (each new shape compiles a new variant)")
        self.fn = fn
        self.mode = mode
        self.fullgraph = fullgraph
        self.module = module
        self.variants: list[Variant] = []
        self.arenas: dict = {}  # (target, device) -> the Arena its programs share
        self.eager_reason: str | None = None  # set when the function runs eagerly from now on, and why
        self.limit_warned = False
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if STATE.trace_depth or self.eager_reason:  # inside another capture, or given up: the original function
            return self.fn(*args, **kwargs)
        flat, spec = _flatten_call(args, kwargs)
        reasons = []
        for variant in self.variants:
            reason = variant.guards.failure(flat, spec, self.module)
            if reason is None:
                return variant.run(flat)
            reasons.append(reason)
        if len(self.variants) >= settings.recompile_limit:  # calls its variants fit still run compiled
            if not self.limit_warned:
                self.limit_warned = True
                warnings.warn(f"tilewise.compile: {self.__name__} reached the recompile limit "
                              f"({settings.recompile_limit} variants, TILEWISE_RECOMPILES); calls that fit none of "
                              f"them run eagerly. Last guard failure: {reasons[-1]}", RuntimeWarning, stacklevel=2)
            return self.fn(*args, **kwargs)
        if reasons:
            log("recompiles", f"recompiling {self.__name__} (variant {len(self.variants) + 1}): {reasons[-1]}")
        with Stages() as stages:
            try:
                variant = self._compile(args, kwargs, flat, spec)
            except DataDependentError as exc:
                if self.fullgraph:
                    raise
                return self._give_up(f"it needs tensor values while tracing (fullgraph=False):\n{exc}", args,
                                     kwargs)
            except UnsupportedTargetError as exc:
                return self._give_up(str(exc), args, kwargs)
            self.variants.append(variant)
            with stage("first run"):
                result = variant.run(flat)
        log("compile", lambda: stages.report(f"compiled {self.__name__} (variant {len(self.variants)}) and ran "
                                             "it once"))
        return result

    def _give_up(self, reason: str, args: tuple, kwargs: dict):
        """Run eagerly, now and on every later call (the function cannot be compiled as it is)."""
        self.eager_reason = reason
        warnings.warn(f"tilewise.compile: running {self.__name__} eagerly from now on: {reason}", RuntimeWarning,
                      stacklevel=3)
        return self.fn(*args, **kwargs)

    def _compile(self, args: tuple, kwargs: dict, flat: list, spec) -> Variant:
        names, known = _module_tensors(self.module)
        optimizers = reachable_optimizers(self.fn, (*args, *kwargs.values()))
        for optimizer in optimizers:  # the state a first step creates exists before the trace: one trace, not two
            init = getattr(optimizer, "init_state", None)
            if init is not None:
                init()
        states = [o.state for o in optimizers]
        with stage("trace"):
            traced = trace(self.fn, args, kwargs, names=names, known=known, states=states)
        target, device = _target(traced)
        guards = make_guards(traced, flat, spec, self.module, optimizers)
        with stage("passes"):
            graph = run_pipeline(traced.graph, pipeline_for(target))

        arena = self._arena(target, device)
        autotune = self.mode == "max-autotune"

        def build(g, graphs: bool = True):
            return build_program(g, target, device, graphs, arena, autotune)

        if traced.backward is None:
            return Variant(guards, traced, build(graph))
        # a differentiable call's programs exchange activations that are fresh on every call: no CUDA graphs
        parts = partition(graph, traced.backward.n_forward, traced.backward.tangents)
        forward, backward = build(dce(parts.forward), False), build(dce(parts.backward), False)
        inputs = parts.forward.inputs
        saved = [("input", inputs.index(s)) if s not in parts.computed else
                 ("output", traced.backward.n_forward + parts.computed.index(s)) for s in parts.saved]
        return Variant(guards, traced, forward, backward, saved)

    def _arena(self, target: str, device):
        """The arena the function's programs for ``target`` share (see ``program.Arena``)."""
        key = (target, device)
        arena = self.arenas.get(key)
        if arena is None:
            if target == "cuda":
                from tilewise.compiler.program_cuda import device_arena

                arena = device_arena(device)
            else:
                arena = host_arena()
            self.arenas[key] = arena
        return arena

    def programs(self) -> list[Program]:
        """Every compiled program, forward and backward, of every variant."""
        return [p for v in self.variants for p in (v.forward, v.backward) if p is not None]


def _target(traced: Traced) -> tuple[str, Device | None]:
    """The code generation target of a traced function: "c" on the CPU, "cuda" on one CUDA device."""
    devices = {n.type.device for n in traced.graph.inputs + traced.graph.body if not n.is_tuple}
    if not devices or devices == {cpu}:
        return "c", None
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda":
            return "cuda", device
    names = ", ".join(sorted(str(d) for d in devices))
    raise UnsupportedTargetError(f"it uses tensors on {names}; a compiled function runs on the CPU or on one CUDA "
                                 "device (move the tensors to one device, or leave the transfer outside it)")


def _module_tensors(module) -> tuple[dict[int, str], list[Tensor]]:
    if module is None:
        return {}, []
    named = list(module.named_parameters()) + (list(module.named_buffers()) if hasattr(module, "named_buffers") else [])
    return {id(t): name for name, t in named}, [t for _, t in named if type(t) is Tensor]


def compile(fn_or_module=None, *, mode: str = "default", fullgraph: bool = True, dynamic: bool = False):  # noqa: A001
    """Compile a function (or a module's forward) into fused kernels; returns a callable (a module stays one).

    Tensors on the CPU compile to C (OpenMP), tensors on one CUDA device to CUDA C (NVRTC), replayed as a
    CUDA graph from the second call where every step can be captured. "default" and "reduce-overhead" build
    the same programs, each kernel scheduled by the heuristics; "max-autotune" times each kernel's candidate
    schedules on the first call's tensors, keeps the fastest and remembers the choice on disk for later
    processes (``TILEWISE_LOG=kernels`` shows the candidates, their times and the winner).

    >>> import tilewise as tw
    >>> f = tw.compile(lambda x: x.relu() * 0.5 + 1)
    >>> f(tw.tensor([-1.0, 2.0])).tolist()
    [1.0, 2.0]
    """
    if fn_or_module is None:
        return lambda fn: compile(fn, mode=mode, fullgraph=fullgraph, dynamic=dynamic)
    if hasattr(fn_or_module, "named_parameters") and hasattr(type(fn_or_module), "forward"):
        module = copy.copy(fn_or_module)
        forward = type(fn_or_module).forward.__get__(module)
        object.__setattr__(module, "forward", CompiledFunction(forward, mode, fullgraph, dynamic, module=module))
        return module
    return CompiledFunction(fn_or_module, mode, fullgraph, dynamic)
