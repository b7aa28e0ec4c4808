"""``tilewise.compile``: compiled callables with guards, variants, graph breaks, recompilation and side effects.

[Note: compiled functions] A call that no variant's guards admit is *recorded*: the function runs on the
caller's own tensors while the capture records every operator instead of running it (``capture.py``) and a
``Recorder`` notes the Python state the function reads and any side effect it has (``guards.py``). Then:
  - a call without graph breaks or side effects becomes a *variant*: a ``Program`` built from the recording,
    with the ``Guards`` that say when it applies — the structure and non-tensor values of the arguments; for
    every tensor the function reads (arguments, captured parameters and buffers, gradients) its shape,
    strides, storage offset and size, dtype, device and ``requires_grad``; which of them share storage; whether
    a parameter whose gradient the function changed had one; grad mode; the autocast state; the default dtype
    and device; the ``training`` flags of a compiled module; what reachable optimizers' state tables hold and
    their hyperparameters; and every global, closure variable and attribute the function's Python read
    ([Note: Python-state guards]). Later calls its guards admit replay it without running any Python;
  - a call with a graph break or a side effect ran its Python once, as eagerly, its operators executed as
    compiled segments ([Note: segmented calls]); nothing is replayed, so the next call records again (and
    becomes a variant if it turns out free of breaks and effects, as a function that fills a cache on its
    first call does). A backward that runs through autograd history made before the call (REINFORCE's saved
    log-probabilities, a loss passed in) counts as such an effect: that history is new on every call and
    reachable from no guarded tensor.
An int or float argument is at first guarded by value; when a call fails no guard but such values, those arguments
are made dynamic and the next variant reads them at run time ([Note: dynamic numbers] in ``numbers.py``), so a
loss scale or a temperature that changes at every step compiles twice, as torch's automatic dynamic does.
At most ``settings.recompile_limit`` variants (and eight times as many segment programs) are kept; calls
that fit none of them then run eagerly, with one warning. ``TILEWISE_LOG=recompiles`` says which guard
failed, ``TILEWISE_LOG=graph_breaks`` where and why a function's Python has to run. With ``fullgraph=True``
a graph break raises ``DataDependentError`` naming the user's line instead.

[Note: sliced arguments] A batch is often a slice of a tensor loaded whole (``x[i:i + batch]``): same shape and
strides at every step, a new storage offset. A program is specialised on each tensor's offset, so such a loop would
compile a variant per batch and run the rest eagerly past the recompile limit. A tensor argument given at the top
level that is a slice of a larger storage, needs no gradient and shares its storage with no other argument is
handed to the function as a tensor of its own: a window of that memory from the 16-byte boundary at or before its
first element (``compiler/windows.py``), so the slices of a tensor share a variant or a few (an
offset within the boundary keeps its alignment, on which vector loads depend). A function that writes such an
argument in place or returns it runs that call on the window (the same memory: the write lands where it would, the
argument's version counter moves as the window's did, and the argument as given is returned), and its later calls
pass their arguments as they are. One that also reads a tensor held elsewhere (a parameter, an optimizer's state)
in the storage a window was cut from would take the two for separate memory: that call is recorded again on the
arguments as given (its Python runs a second time, the one case where it does), and so are its later calls.

Running a variant reproduces every effect the traced function had: outputs are fresh tensors, inputs
written in place are updated in their own memory (their version counters bump, as eager in-place ops
do), ``.grad`` of parameters is set or cleared as the function did, and optimizer state the function
created (momentum buffers on a first step) is stored; the next call sees that state changed and compiles
the steady-state step, which updates the buffers in place. Recording holds a per-function lock, and a
program runs under its arena's lock, so compiled functions may be called from several threads.

[Note: outputs that alias] A program's outputs are fresh memory, but what eager returns may share memory with
another tensor: a view, ``detach()`` or ``.data`` of an argument or of a tensor the function holds, one tensor
returned twice, a tensor returned with a view of it. A write through such a result after the call lands in that
other tensor in eager (and in what the next call reads). So these outputs are made again after each run: a view of
an argument's or a held tensor's memory is taken over that tensor once the program has written it back
(``as_strided``, recording autograd where the view needs grad); a tensor returned twice is one object; an
intermediate returned with its views, two views of one, or one view that is not all of it densely (a slice, a
strided, diagonal or expanded view) is one program output and the views are taken over it, so they have eager's
strides, storage offset and storage. The program then stores all of that intermediate, as eager keeps it alive
behind a small slice; a view that is all of it densely (a transpose, a reshape) is an output of its own laid out in
eager's order (``output_layouts``), which is the same memory. The one exception is a view that needs grad over
memory that does not (written in place by a differentiable value after the memory was made): it comes back as an
output of its own, row-major, with its values and gradients.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from tilewise import strides as S
from tilewise._stages import Stages, collector_paused, stage
from tilewise.autograd.function import Function
from tilewise.autograd.grad_mode import no_grad
from tilewise.compiler.capture import OutputView, Source, Traced, capturing, flatten, leaf_labels, start, unflatten
from tilewise.compiler.errors import DataDependentError, UnsupportedTargetError, user_frame
from tilewise.compiler.guards import Guards, Recorder, make_guards
from tilewise.compiler.lowering.partition import partition
from tilewise.compiler.meta import suspended
from tilewise.compiler.numbers import NumberTrace, admits, substituted, undone
from tilewise.compiler.passes import dce, run_pipeline
from tilewise.compiler.program import Lowered, Program, build_program, lower_program
from tilewise.compiler.segments import Segments
from tilewise.compiler.targets import Target, target_of
from tilewise.compiler.windows import rebased
from tilewise.config import log, settings
from tilewise.device import default_device
from tilewise.dispatch import STATE, numbers_traced
from tilewise.ops.inplace import check_inference_write
from tilewise.storage import Storage
from tilewise.tensor import Tensor, from_array, from_contiguous_array

MODES = ("default", "reduce-overhead", "max-autotune")


# ---------------------------------------------------------------------------- what a call reaches

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
                                if source.kind in ("arg", "number") and k not in self.written)
        # the held tensors are the same objects at every call: a training step's ~600 are copied as one list, and
        # only the arguments and gradients are fetched
        self._held = [source.obj if source.kind == "object" else None for source in self.entries]
        self._fetched = [(k, source) for k, source in enumerate(self.entries) if source.kind != "object"]
        self.aliasing = any(kind not in ("out", "arg", "const") for kind, _ in self.traced.output_leaves)

    def run(self, flat: list):
        traced = self.traced
        if self.backward is not None and STATE.grad_enabled:
            spec = traced.backward
            inputs = [source.fetch(flat) for source in spec.inputs] + [source.fetch(flat) for source in
                                                                        spec.through_base]
            outputs = CompiledCall.apply(self, flat, *inputs)
        else:
            outputs, _ = self.run_forward(flat)
        if STATE.inference:  # as eager's, the outputs of a call inside inference mode are inference tensors
            for t in outputs:
                t._storage.inference = True
        if self.aliasing:
            return unflatten(traced.output_spec, _aliasing_outputs(traced.output_leaves, outputs, flat))
        values = [outputs[k] if kind == "out" else flat[k] if kind == "arg" else k for kind, k in traced.output_leaves]
        return unflatten(traced.output_spec, values)

    def run_forward(self, flat: list) -> tuple[list[Tensor], tuple]:
        """Run the forward program and apply its effects; return the function's outputs and what backward reads."""
        traced, graph = self.traced, self.forward.graph
        tensors = self._held.copy()
        for k, source in self._fetched:
            tensors[k] = source.fetch(flat)
        written = [tensors[k] for k in self.written]
        if not STATE.inference and any(t._storage.inference for t in written):
            for t in written:  # before any write, as eager refuses it
                check_inference_write(t)
        inputs = list(map(_STORAGE_DATA, tensors))
        arrays = self.forward.run(inputs, self.staged)
        outputs = [_tensor(a, node) for a, node in zip(arrays, graph.outputs)]
        for k, (shape, strides) in traced.output_layouts.items():
            outputs[k] = _with_eager_strides(outputs[k], shape, strides)
        for t in written:  # a program's input is a tensor with storage: its version is its storage's
            t._storage.version += 1
            t._array = None
        for effect in traced.grad_effects:
            owner = effect.owner.fetch(flat)
            owner._grad = None if effect.clear else outputs[effect.output]
        for effect in traced.state_effects:
            effect.apply(outputs)
        return outputs[:len(traced.output_requires_grad)], (inputs, arrays)

    def run_backward(self, residuals: tuple, grads: list) -> list[Tensor]:
        inputs, arrays = residuals
        spec = self.traced.backward
        tangents = [_flat(grads[k]) for k in spec.outputs]  # in the returned tensors' logical (N, C, *S) order
        saved = [inputs[k] if kind == "input" else arrays[k] for kind, k in self.saved]
        results = self.backward.run(tangents + saved)
        return [_tensor(a, node) for a, node in zip(results, self.backward.graph.outputs)]


_STORAGE_DATA = operator.attrgetter("_storage.data")


def _aliasing_outputs(leaves: list[tuple], outputs: list, flat: list) -> list:
    """The returned values of a call whose outputs alias other tensors (see [Note: outputs that alias])."""
    values: list = []
    for kind, k in leaves:
        if kind == "out":
            values.append(outputs[k])
        elif kind == "arg":
            values.append(flat[k])
        elif kind == "leaf":
            values.append(values[k])
        elif kind == "view":
            values.append(_view_over(k.base.fetch(flat), k))
        elif kind == "view_out":
            values.append(_view_over(outputs[k.base], k))
        elif kind == "detached":
            values.append(_detached_again(k.origin.fetch(flat), k.requires_grad))
        elif kind == "grad":
            values.append(k.fetch(flat))
        else:
            values.append(k)
    return values


def _view_over(base: Tensor, view: OutputView) -> Tensor:
    shape, strides, offset = view.geometry
    if view.requires_grad:
        return base.as_strided(shape, strides, offset)
    # a view of the detached base: a view made under no_grad of a tensor that requires grad would refuse in-place
    # writes, which torch allows on what ``detach()`` (the usual source of such an output) returns
    with no_grad():
        return base.detach().as_strided(shape, strides, offset)


def _detached_again(origin: Tensor, requires_grad: bool) -> Tensor:
    out = origin.detach()
    return out.requires_grad_() if requires_grad else out


def _flat(t: Tensor):
    """A tensor's elements as a program input: a flat array, or a device buffer holding them contiguously."""
    if t._device.type == "cpu":
        return np.ascontiguousarray(t.detach()._np()).reshape(-1)
    if not (t.is_contiguous() and t._offset == 0):
        t = t.detach().clone()
    return t._storage.data


def _tensor(data, node) -> Tensor:
    """The tensor a program output is: a flat array on the CPU, a device buffer on CUDA."""
    ty = node.type
    shape, dtype = ty.shape, ty.dtype
    if isinstance(data, np.ndarray):
        if data.dtype is dtype.np:  # a fresh output buffer: contiguous, of the value's dtype
            return from_contiguous_array(data.reshape(shape), dtype)
        return from_array(data.reshape(shape), dtype)
    return Tensor._make(Storage(data, ty.device, dtype, ty.numel), shape, S.contiguous_strides(shape), 0, dtype,
                        ty.device)


def _with_eager_strides(t: Tensor, shape: tuple, strides: tuple) -> Tensor:
    """A program output holding a value in the memory order of eager's ``strides``, handed back as the tensor of
    ``shape`` it stands for: the same memory, those strides, no view of anything (see [Note: eager strides of traced
    values] in formats.py)."""
    return Tensor._make(t._storage, shape, strides, 0, t._dtype, t._device)


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
        through_base = [None] * len(ctx.variant.traced.backward.through_base)  # no gradient reaches those
        return (None, None, *ctx.variant.run_backward(ctx.residuals, list(grads)), *through_base)


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


def _refuse_subclass_instances(name: str, flat: list) -> None:
    """A Tensor subclass's instance cannot be traced (its ``__torch_function__`` would run on trace tensors):
    refused by name, before the trace."""
    for a in flat:
        if type(a) is not Tensor and isinstance(a, Tensor):
            raise TypeError(f"tilewise.compile({name}): an argument is an instance of {type(a).__qualname__}, a "
                            "Tensor subclass, which the compiler cannot trace; pass a plain tensor "
                            f"(x.as_subclass(tilewise.Tensor)) or call {name} uncompiled")


def _slices_rebased(args: tuple, kwargs: dict) -> tuple[tuple, dict, dict | None]:
    """The arguments with each top-level slice rebased onto a window of its memory (see [Note: sliced arguments]),
    and ``{id(window storage): (window tensor, the argument as given)}``; None when nothing was rebased."""
    storages = [a._storage for a in (*args, *kwargs.values()) if type(a) is Tensor]
    if not storages:
        return args, kwargs, None
    windows: dict = {}

    def window(a):
        if type(a) is not Tensor or a.requires_grad or a._trace is not None or a._vmap is not None \
                or a._offset == 0 and a._storage.numel == S.numel(a._shape) or a._device.type not in ("cpu", "cuda") \
                or a._storage.data is None or sum(s is a._storage for s in storages) > 1:
            return a
        out = rebased(a)
        if out is not a:
            windows[id(out._storage)] = (out, a)
        return out

    args = tuple(window(a) for a in args)
    kwargs = {k: window(v) for k, v in kwargs.items()} if kwargs else kwargs
    return args, kwargs, windows or None


def _window_misused(traced: Traced, flat: list, windows: dict) -> str | None:
    """"held" when the recorded call reads a held tensor in the storage a rebased argument was cut from (the
    program would take them for separate memory); "written" when it writes a rebased argument or returns one; else
    None."""
    written = {id(node) for node, _ in traced.graph.writes}
    originals = {id(given._storage) for _, given in windows.values()}
    found = None
    for ts in traced.tensor_sources:
        t = ts.source.fetch(flat)
        if type(t) is not Tensor:
            continue
        if ts.source.kind == "object" and id(t._storage) in originals:
            return "held"
        if id(t._storage) in windows and id(traced.graph.inputs[ts.entry]) in written:
            found = "written"
    if any(type(t) is Tensor and id(t._storage) in windows for t in _returned_arguments(traced, flat)):
        found = "written"
    return found


def _returned_arguments(traced: Traced, flat: list) -> list:
    """The argument tensors a recorded call returns, or returns views or detached aliases of."""
    found = []
    for kind, k in traced.output_leaves:
        if kind == "arg":
            found.append(flat[k])
        elif kind == "view" and k.base.kind == "arg" or kind == "detached" and k.origin.kind == "arg":
            found.append((k.base if kind == "view" else k.origin).fetch(flat))
    return found


def _windows_undone(result, windows: dict):
    """After a call run on rebased arguments: the arguments as given bump their version counters by what their
    windows' did, and a window the function returned is the argument as given again."""
    for window, given in windows.values():
        if window._storage.version:
            given._storage.version += window._storage.version
            window._storage.version = 0
    leaves, spec = flatten(result)
    if not any(type(leaf) is Tensor and id(leaf._storage) in windows for leaf in leaves):
        return result
    return unflatten(spec, [_over_given(leaf, windows) if type(leaf) is Tensor and id(leaf._storage) in windows
                            else leaf for leaf in leaves])


def _over_given(leaf: Tensor, windows: dict) -> Tensor:
    """A returned tensor over a window's memory, over the memory of the argument as given instead."""
    window, given = windows[id(leaf._storage)]
    if leaf is window:
        return given
    if leaf._base is None and (leaf._shape, leaf._strides, leaf._offset) == \
            (window._shape, window._strides, window._offset):
        return given.detach()
    with no_grad():
        return given.detach().as_strided(leaf._shape, leaf._strides, leaf._offset - window._offset + given._offset)


class CompiledFunction:
    """A function compiled per specialisation; see [Note: compiled functions]."""

    def __init__(self, fn, mode: str = "default", fullgraph: bool = False, dynamic: bool = False, module=None):
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
        self.graph_bytes: int | None = None  # the most a program's CUDA graph may copy and hold (None: by cost)
        # CUDA graphs that read the arguments in place and write fresh outputs, one per set of addresses (see
        # [Note: graphs in place] in program_cuda.py): for arguments too large to copy into a graph (a backward's
        # saved activations) whose addresses repeat from call to call
        self.graphs_in_place = False
        # flattened argument positions whose storage the caller gives up to the call: its programs may write
        # their intermediates there once the argument has been read for the last time (see [Note: donated inputs])
        self.donated: frozenset[int] = frozenset()
        self.arena_keep: dict[str, int] = {}  # target name -> the largest plan its arena keeps (see [Note: transient
        # arenas] in program.py)
        self.rebase_slices = True  # see [Note: sliced arguments]
        self.segments = Segments(getattr(fn, "__name__", type(fn).__name__), self._build_segment)
        self.eager_reason: str | None = None  # set when the function runs eagerly from now on, and why
        self.limit_warned = False
        self.breaks_seen: set[str] = set()  # the graph breaks already logged
        self.dynamic: dict[int, str] = {}  # argument leaves read at run time: see [Note: dynamic numbers]
        self.specialised: set[int] = set()  # argument leaves a trace needed the value of: never dynamic again
        self._lock = threading.RLock()  # one recording at a time; variants are appended under it
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if STATE.trace_depth or self.eager_reason:  # inside another capture, or given up: the original function
            return self.fn(*args, **kwargs)
        given = (args, kwargs)
        windows = None
        if self.rebase_slices:  # see [Note: sliced arguments]
            args, kwargs, windows = _slices_rebased(args, kwargs)
        flat, spec = _flatten_call(args, kwargs)
        reasons = []
        for variant in self.variants:
            reason = variant.guards.failure(flat, spec, self.module)
            if reason is None:
                if windows and variant.guards.holds_any(windows):
                    return self._unrebased(given)
                return variant.run(flat)
            reasons.append(reason)
        with self._lock:
            for variant in self.variants[len(reasons):]:  # compiled by another thread while this one waited
                if variant.guards.failure(flat, spec, self.module) is None:
                    if windows and variant.guards.holds_any(windows):
                        return self._unrebased(given)
                    return variant.run(flat)
            if self.eager_reason:  # eagerly, on the arguments as given (not their windows)
                return self.fn(*given[0], **given[1])
            if len(self.variants) >= settings.recompile_limit or \
                    len(self.segments.programs) >= settings.recompile_limit * 8:
                return self._over_limit(reasons, *given)
            if reasons:
                made = self._made_dynamic(flat, spec, args, kwargs)
                log("recompiles", f"recompiling {self.__name__} (variant {len(self.variants) + 1}): {reasons[-1]}"
                                  + (f"; made {made} dynamic" if made else ""))
            return self._record(args, kwargs, flat, spec, windows, given)

    def _made_dynamic(self, flat: list, spec, args: tuple, kwargs: dict) -> str:
        """Make dynamic the int and float arguments whose values alone keep every variant from this call (see [Note:
        dynamic numbers]); their names, or "" when there are none."""
        for variant in self.variants:
            changed = [k for k in variant.guards.numbers_changed(flat, spec, self.module)
                       if k not in self.specialised and k not in self.dynamic]
            if changed:
                labels = leaf_labels(self.fn, args, kwargs)
                for k in changed:
                    self.dynamic[k] = labels[k] if k < len(labels) else f"argument leaf {k}"
                return ", ".join(self.dynamic[k] for k in changed)
        return ""

    def _record(self, args: tuple, kwargs: dict, flat: list, spec, windows: dict | None = None,
                given: tuple | None = None):
        """``_record_once``, with the call's dynamic numbers if it has some; where that trace fails, once more with
        them as given (see [Note: dynamic numbers])."""
        _refuse_subclass_instances(self.__name__, flat)
        numbers = self._number_trace(args, kwargs, flat)
        if numbers is None:
            return self._record_once(args, kwargs, flat, spec, windows, given)
        try:
            return self._record_once(args, kwargs, flat, spec, windows, given, numbers)
        except _Respecialised as failed:
            names = ", ".join(self.dynamic.get(k, str(k)) for k in failed.leaves)
            log("recompiles", f"{self.__name__}: traced with {names} dynamic, it raised {failed.reason}; recorded "
                              "again with their values, guarded by value from now on")
            for k in failed.leaves:
                self.dynamic.pop(k, None)
            return self._record_once(args, kwargs, flat, spec, windows, given)

    def _number_trace(self, args: tuple, kwargs: dict, flat: list) -> NumberTrace | None:
        """The dynamic numbers of this call: its dynamic leaves that hold an int or a float."""
        leaves = [k for k in self.dynamic if k < len(flat) and type(flat[k]) in (int, float)
                  and admits(flat[k], type(flat[k]))]
        if not leaves:
            return None
        numbers = NumberTrace(self._number_device(flat))
        for k in leaves:
            numbers.leaf(k, flat[k], self.dynamic[k])
        return numbers

    def _number_device(self, flat: list):
        """Where a call's dynamic numbers live: the device of its first tensor argument, else of the module."""
        for leaf in flat:
            if type(leaf) is Tensor:
                return leaf._device
        _, known = _module_tensors(self.module)
        if known:
            return known[0]._device
        return default_device()

    def _unrebased(self, given: tuple):
        """The call again, its arguments as given and no longer rebased from now on (see [Note: sliced
        arguments])."""
        self.rebase_slices = False
        log("recompiles", f"{self.__name__}: its sliced arguments are passed as they are from now on (one is "
                          "written, returned, or shares its storage with a tensor the function holds)")
        return self(*given[0], **given[1])

    def _over_limit(self, reasons: list[str], args: tuple, kwargs: dict):
        """Calls that fit no variant run eagerly once the limit is reached (calls its variants fit still run
        compiled)."""
        if not self.limit_warned:
            self.limit_warned = True
            last = reasons[-1] if reasons else "its graph breaks recorded other operators"
            warnings.warn(f"tilewise.compile: {self.__name__} reached the recompile limit "
                          f"({settings.recompile_limit} variants, TILEWISE_RECOMPILES); calls that fit none of "
                          f"them run eagerly. Last guard failure: {last}", RuntimeWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _record_once(self, args: tuple, kwargs: dict, flat: list, spec, windows: dict | None = None,
                     given: tuple | None = None, numbers: NumberTrace | None = None):
        """Run the function with its operators recorded (see [Note: compiled functions]): a call without graph
        breaks or side effects becomes a variant, replayed by later calls its guards admit; any other call
        ran its Python once, as eagerly, and its recorded segments run as compiled programs. With ``numbers``,
        the function is given their dynamic numbers in place of those arguments."""
        cap, optimizers = self._start(args, kwargs, numbers)
        if not self.fullgraph:
            cap.breaks = self._break
        recorder = Recorder(self.fn, flat, self.fullgraph)
        cap.on_operator = recorder.operator_called
        traced, effects, misused = None, [], None
        call_args, call_kwargs, undo = substituted(args, kwargs, numbers.leaves) if numbers else (args, kwargs, [])
        with Stages() as stages, collector_paused():
            synced = self.segments.syncs
            try:
                with stage("trace"), recorder, capturing(cap), _numbers_traced(numbers):
                    try:
                        result = self.fn(*call_args, **call_kwargs)
                    finally:
                        undone(undo)
                    if numbers:
                        result = numbers.concrete(result)
                    effects = recorder.side_effects() if self.segments.syncs == synced else []
                    if self.segments.syncs == synced and cap.backward_through_history():
                        if self.fullgraph:
                            raise self._history_error()
                        effects.append("its backward runs through autograd history made before the call")
                    if self.segments.syncs == synced and not effects:
                        traced = cap.finish(result, flat)
                        misused = _window_misused(traced, flat, windows) if windows else None
            except UnsupportedTargetError as exc:
                if self.fullgraph or self.segments.syncs != synced:
                    raise
                cap.restore()  # nothing ran (e.g. complex tensors inside a composite, where no break can be)
                if numbers:
                    raise _Respecialised(list(numbers.leaves), exc) from exc
                return self._give_up(str(exc).split("\n")[0], *(given or (args, kwargs)))
            except BaseException as exc:
                if self.segments.syncs == synced:
                    cap.restore()  # nothing ran: the tensors and optimizer state are as before the call
                    if numbers and isinstance(exc, Exception):
                        raise _Respecialised(list(numbers.leaves), exc) from exc
                raise
            if misused == "held":  # nothing ran yet: record the call again on the arguments as given (its Python runs
                cap.restore()  # a second time: the one case where it does, and a rare one)
                return self._unrebased(given)
            if misused:  # it writes or returns a window: this call keeps it, later calls pass arguments as given
                self.rebase_slices = False
            if traced is None:
                why = effects[0] if effects else "a graph break"
                self._log_break(why)
                self.segments.sync(cap, "the end of the call")
                return _windows_undone(result, windows) if windows else result
            cap.restore()
            dynamic = self._still_dynamic(numbers, flat)
            try:
                variant = self._compile(traced, flat, spec, optimizers, recorder, dynamic)
            except UnsupportedTargetError as exc:
                return self._give_up(str(exc), *(given or (args, kwargs)))
            self.variants.append(variant)
            with stage("first run"):
                result = variant.run(flat)
            if windows:
                result = _windows_undone(result, windows)
        log("compile", lambda: stages.report(f"compiled {self.__name__} (variant {len(self.variants)}) and ran "
                                             "it once"))
        return result

    def _still_dynamic(self, numbers: NumberTrace | None, flat: list) -> dict:
        """After a trace with dynamic numbers: {leaf: (int or float, divided by)} for those the variant reads at run
        time; the leaves whose values the trace used are specialised from now on."""
        if not numbers:
            return {}
        if numbers.specialised:
            self.specialised |= numbers.specialised
            log("recompiles", lambda: f"{self.__name__}: "
                f"{', '.join(self.dynamic.get(k, str(k)) for k in sorted(numbers.specialised))} specialised again (the "
                "function needs the value: a shape, an index, a comparison, a Scalar argument)")
            for k in numbers.specialised:
                self.dynamic.pop(k, None)
        return {k: (type(flat[k]), k in numbers.nonzero) for k in numbers.leaves if k not in numbers.specialised}

    def _history_error(self) -> DataDependentError:
        path, line, text = user_frame()
        return DataDependentError(
            f"tilewise.compile(fullgraph=True): the backward inside {self.__name__} runs through autograd history "
            f"made before the call (a tensor with a grad_fn it was given or holds), which no graph can replay: each "
            f"call brings a new history.\n  at {path}:{line}: {text}\nCompute the loss from leaf tensors inside the "
            "function, or compile without fullgraph=True (such a call then runs as compiled segments, its backward "
            "over the caller's graph); torch.compile(fullgraph=True) refuses any Tensor.backward().")

    def _start(self, args: tuple, kwargs: dict, numbers: NumberTrace | None = None):
        """A capture of a call of the function, with the optimizers it reaches."""
        names, known = _module_tensors(self.module)
        optimizers = reachable_optimizers(self.fn, (*args, *kwargs.values()))
        for optimizer in optimizers:  # the state a first step creates exists before the trace: one trace, not two
            init = getattr(optimizer, "init_state", None)
            if init is not None:
                init()
        known = known + _optimizer_params(optimizers, known)
        cap = start(self.fn, args, kwargs, names=names, known=known, states=[o.state for o in optimizers],
                    numbers=numbers.sources if numbers else None)
        return cap, optimizers

    def _break(self, cap, what: str) -> None:
        """A graph break: Python needs values (or an operator the graph cannot hold); run what was recorded."""
        self._log_break(what)
        with suspended():
            self.segments.sync(cap, what)

    def _log_break(self, what: str) -> None:
        if what not in self.breaks_seen:
            self.breaks_seen.add(what)
            path, line, text = user_frame()
            log("graph_breaks", f"{self.__name__}: {what} at {path}:{line}: {text} (its Python runs on every call; "
                                "the operators between such points run as compiled segments)")

    def _give_up(self, reason: str, args: tuple, kwargs: dict):
        """Run eagerly, now and on every later call (the function cannot be compiled as it is)."""
        self.eager_reason = reason
        warnings.warn(f"tilewise.compile: running {self.__name__} eagerly from now on: {reason}", RuntimeWarning,
                      stacklevel=4)
        return self.fn(*args, **kwargs)

    def _compile(self, traced: Traced, flat: list, spec, optimizers: list, recorder, numbers: dict | None = None
                 ) -> Variant:
        target, device = target_of(traced.graph)
        guards = make_guards(traced, flat, spec, self.module, optimizers, recorder, numbers)
        history: list = []
        graphs, saved = program_graphs(traced, target, history)
        arena = self._arena(target, device)
        # a differentiable call's programs exchange activations that are fresh on every call: no CUDA graphs
        donated = frozenset()
        if self.donated and traced.backward is None:  # (a differentiable call's backward reads its inputs later)
            donated = frozenset(k for k, source in enumerate(_entry_sources(traced))
                                if source.kind == "arg" and source.index in self.donated)
        programs = [build_program(g, target, device, traced.backward is None, arena, self.mode == "max-autotune",
                                  self.graph_bytes, donated, self.graphs_in_place) for g in graphs]
        for program in programs:
            program.passes = history
        forward, *backward = programs
        variant = Variant(guards, traced, forward, backward[0] if backward else None, saved)
        if self.graphs_in_place:
            variant.staged = frozenset()  # nothing is copied into a graph: its addresses are part of its key
        return variant

    def lowered(self, target: Target, *args, **kwargs) -> tuple[Traced, list[Lowered], list]:
        """What a call would compile to for ``target``, without building or running anything (so CUDA code can
        be generated and shown where no GPU is): the recorded call, the lowered forward (and backward)
        programs, and the graph after each pass. A graph break raises, as with ``fullgraph=True``."""
        flat, _ = _flatten_call(args, kwargs)
        cap, _ = self._start(args, kwargs)
        with collector_paused():
            try:
                with capturing(cap):
                    traced = cap.finish(self.fn(*args, **kwargs), flat)
            finally:
                cap.restore()
            history: list = []
            graphs, _ = program_graphs(traced, target, history)
            return traced, [lower_program(g, target) for g in graphs], history

    def _build_segment(self, graph):
        """The program of one segment of a call that runs its Python (see [Note: segmented calls])."""
        target, device = target_of(graph)
        history: list = []
        graph = run_pipeline(graph, target.passes, history)
        program = build_program(graph, target, device, False, self._arena(target, device),
                                self.mode == "max-autotune")
        program.passes = history
        return program

    def _arena(self, target: Target, device):
        """The arena the function's programs for ``target`` share (see ``program.Arena``)."""
        key = (target.name, device)
        arena = self.arenas.get(key)
        if arena is None:
            arena = self.arenas[key] = target.arena(device)
            arena.keep_up_to = self.arena_keep.get(target.name)
        return arena

    def programs(self) -> list[Program]:
        """Every compiled program, forward and backward, of every variant, then every segment's."""
        return [p for v in self.variants for p in (v.forward, v.backward) if p is not None] + \
            list(self.segments.programs.values())


def program_graphs(traced: Traced, target: Target, history: list | None = None) -> tuple[list, list]:
    """The optimised graphs a recorded call compiles to for ``target`` — the forward, and the backward when the
    call is differentiable — and, per value the backward saves, where the forward has it (("input"|"output",
    index)). ``history`` receives the graph after each pass."""
    with stage("passes"):
        graph = run_pipeline(traced.graph, target.passes, history)
    if traced.backward is None:
        return [graph], []
    parts = partition(graph, traced.backward.n_forward, traced.backward.tangents)
    inputs = parts.forward.inputs
    saved = [("input", inputs.index(s)) if s not in parts.computed else
             ("output", traced.backward.n_forward + parts.computed.index(s)) for s in parts.saved]
    return [dce(parts.forward), dce(parts.backward)], saved


class _Respecialised(Exception):  # noqa: N818 — not an error: the call is recorded again
    """A trace with dynamic numbers failed before anything ran: it is recorded again with their values."""

    def __init__(self, leaves: list[int], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.leaves = leaves
        self.reason = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"


@contextlib.contextmanager
def _numbers_traced(numbers: NumberTrace | None):
    """The dispatcher resolves dynamic numbers in operators' arguments while this trace has some."""
    if not numbers:
        yield
        return
    numbers_traced(1)
    try:
        yield
    finally:
        numbers_traced(-1)


def _optimizer_params(optimizers: list, known: list[Tensor]) -> list[Tensor]:
    """The parameters of reachable optimizers not already known: their gradients, set outside the function (a
    compiled ``optimizer.step``), are then read from ``param.grad`` on every call, not kept from the first."""
    seen = {id(t) for t in known}
    found = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if type(p) is Tensor and id(p) not in seen:
                    seen.add(id(p))
                    found.append(p)
    return found


def _module_tensors(module) -> tuple[dict[int, str], list[Tensor]]:
    if module is None:
        return {}, []
    named = list(module.named_parameters()) + (list(module.named_buffers()) if hasattr(module, "named_buffers") else [])
    return {id(t): name for name, t in named}, [t for _, t in named if type(t) is Tensor]


# torch.compile's backends that run the captured program operator by operator: the function's own eager run
EAGER_BACKENDS = ("eager", "aot_eager")


def compile(fn_or_module=None, *, fullgraph: bool = False, dynamic: bool | None = None,  # noqa: A001
            backend: str = "inductor", mode: str | None = None, options: dict | None = None, disable: bool = False):
    """Compile a function (or a module's forward) into fused kernels; returns a callable (a module stays one).

    torch.compile's signature: ``backend="inductor"`` (the default) is this compiler, the eager backends
    (``"eager"``, ``"aot_eager"``) give the function to run as it is, ``disable=True`` returns it unchanged;
    ``dynamic=None`` is ``False``; ``options`` (inductor's settings) are refused but for an empty dict.

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
    if not isinstance(backend, str) or backend not in ("inductor", *EAGER_BACKENDS):
        raise RuntimeError(f"Invalid backend: {backend!r}; tilewise.compile has 'inductor' (its compiler) and the "
                           f"eager backends {EAGER_BACKENDS}")
    if options:
        raise RuntimeError(f"tilewise.compile takes no backend options (got {sorted(options)}); its settings are "
                           "mode= and the TILEWISE_* environment variables")
    mode = "default" if mode is None else mode
    dynamic = bool(dynamic)
    if fn_or_module is None:
        return lambda fn: compile(fn, mode=mode, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                  disable=disable)
    if disable or backend in EAGER_BACKENDS:
        return fn_or_module
    if hasattr(fn_or_module, "named_parameters") and hasattr(type(fn_or_module), "forward"):
        return compiled_module(fn_or_module, CompiledFunction(type(fn_or_module).forward.__get__(fn_or_module), mode,
                                                              fullgraph, dynamic, module=fn_or_module))
    return CompiledFunction(fn_or_module, mode, fullgraph, dynamic)


def compiled_module(module, forward: CompiledFunction):
    """The module ``compile`` returns: the same module seen through another class whose ``forward`` is compiled.

    It shares the original's attribute dictionary, so parameters, buffers, ``training`` flags and every other
    attribute are one state whichever object is read or changed (``model.eval()`` on either affects both, as
    on torch's compiled module), its state_dict keys are the original's, and ``isinstance`` holds; calling the
    original still runs eagerly. The compiled forward is bound to the original module."""
    cls = type(module)
    compiled_cls = type(cls.__name__, (cls,), {"forward": forward, "_orig_mod": property(lambda self: module),
                                               "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    proxy = object.__new__(compiled_cls)
    object.__setattr__(proxy, "__dict__", module.__dict__)
    return proxy
