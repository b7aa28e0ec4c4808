"""The autograd graph: nodes, edges, saved tensors, hooks, and recording an operator call.

[Note: autograd graph] As in torch, a tensor that requires grad points at the node that produced it
(``grad_fn``, ``_output_nr``); a leaf points at nothing and is reached through its ``AccumulateGrad``
node. A node's ``next_functions`` are edges ``(node, output_nr)`` to the producers of its inputs.
``OpNode`` is the only node type operators need: it evaluates the operator's declared derivative
formulas, saving just the arguments those formulas read (and the outputs they read of the result).
Saved tensors remember the storage version at save time; if an in-place op bumped it before backward,
unpacking raises torch's error, in torch's words (the tensor, the node it is an output of, the versions),
instead of returning silently wrong gradients.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Mapping
from types import MappingProxyType

from tilewise import dispatch
from tilewise import strides as S
from tilewise.device import BACKENDS
from tilewise.dispatch import GRAD_OFF_FOR_RECORDING, STATE, run
from tilewise.dtypes import FLOAT as FLOATING
from tilewise.layouts import contiguous_format
from tilewise.ops.creation import empty
from tilewise.ops.inplace import (
    REGENERATE,
    memory_order,
    requires_grad_through_base_alone,
    row_major,
    short_node_name,
    stale_view_error,
    strided_view,
    watch_view,
)
from tilewise.tensor import AUTOGRAD_HOOKS, INFERENCE_SAVED, TRACE_HOOKS, Tensor


class Node:
    """Base class of graph nodes; ``apply(grads)`` maps output gradients to input gradients."""

    next_functions: tuple = ()
    n_outputs: int = 1
    # output_nr -> tensor hooks, and output_nr -> retained output: few nodes have any, so these empty read-only
    # defaults are shared and a node gets dicts of its own on the first registration (``_own``). The node's own
    # hooks (``register_prehook``, ``register_hook``) live in ``pre_hooks`` too, under the keys NODE_PRE and
    # NODE_POST, so that the engine's one test of a node for hooks covers every kind.
    pre_hooks: Mapping[int | str, list] = MappingProxyType({})
    retained: Mapping[int, weakref.ref] = MappingProxyType({})

    def _own(self, name: str) -> dict:
        found = self.__dict__.get(name)
        if found is None:
            found = self.__dict__[name] = {}
        return found

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads: list):
        raise NotImplementedError

    def release(self) -> None:
        pass

    def register_hook(self, hook):
        """``hook(grad_inputs, grad_outputs)`` runs after this node has computed the gradients of its inputs and may
        return replacements for them (torch's ``Node.register_hook``)."""
        hooks = self._own("pre_hooks").setdefault(NODE_POST, [])
        hooks.append(hook)
        return _Handle(hooks, hook)

    def register_prehook(self, hook):
        """``hook(grad_outputs)`` runs before this node, after the tensor hooks of its outputs, and may return
        replacements for the gradients (torch's ``Node.register_prehook``)."""
        hooks = self._own("pre_hooks").setdefault(NODE_PRE, [])
        hooks.append(hook)
        return _Handle(hooks, hook)

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    def __call__(self, *grads):
        return self.apply(list(grads))


NODE_PRE, NODE_POST = "node_pre", "node_post"  # keys of a node's own hooks in ``Node.pre_hooks``


class _Handle:
    """torch's ``RemovableHandle`` for a hook: ``remove()``, also as a context manager that removes on exit."""

    def __init__(self, hooks: list, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        for k, h in enumerate(self._hooks):
            if h is self._hook:  # by identity: the same function registered twice is two hooks
                del self._hooks[k]
                return

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class AccumulateGrad(Node):
    """The sink for a leaf tensor: adds the incoming gradient to ``variable.grad``."""

    def __init__(self, variable: Tensor):
        self.variable = variable

    def apply(self, grads: list):
        return []

    def accumulate(self, grad: Tensor, create_graph: bool) -> None:
        """Add ``grad`` to ``variable.grad``. The engine calls this holding ``grad`` in one local name and
        nowhere else, so that a gradient nothing else can reach becomes ``.grad`` without a copy (see
        :func:`_owned`)."""
        t = self.variable
        if grad is None:
            return
        if grad._shape != t._shape:
            grad = grad.sum_to_size(t._shape)
        assigned = TRACE_HOOKS.grad_assigned  # a trace learns what .grad held before, as for ``t.grad = ...``
        if assigned is not None:
            assigned(t)
        if t._grad is None:
            if create_graph:
                t._grad = grad if _obeys_layout(grad, t) else _copy_in_layout_of(grad, t)
            elif sys.getrefcount(grad) <= _ENGINE_REFS and _owned(grad, t):
                t._grad = grad.detach()
            else:
                t._grad = _copy_in_layout_of(grad.detach(), t)
        elif create_graph:
            t._grad = t._grad + grad
        else:
            from tilewise.autograd.grad_mode import no_grad

            with no_grad():
                t._grad = t._grad + grad


def _refs_in_callee(value) -> int:
    return sys.getrefcount(value)


def _refs_of_one_local() -> int:
    value = object()
    return _refs_in_callee(value)


# What sys.getrefcount reports inside AccumulateGrad.accumulate for a gradient that only the engine's one local
# name holds (that name, accumulate's parameter, getrefcount's argument: 3 on CPython 3.11 and 3.12), measured
# once on this interpreter rather than assumed.
_ENGINE_REFS = _refs_of_one_local()


def _owned(grad: Tensor, variable: Tensor) -> bool:
    """Whether ``variable.grad`` may be ``grad`` itself rather than a copy: torch's AccumulateGrad takes a
    gradient no one else references when it has the parameter's layout, and so does this one. No other tensor
    (a view, a caller's tensor, a second parameter's gradient) may reach its memory, which must be exactly the
    parameter's shape, strides and dtype, dense from offset 0; and not while a function is being compiled,
    whose trace records the copy."""
    storage = grad._storage  # referenced by grad, by this local name and by getrefcount's argument
    return (not STATE.trace_depth and grad._base is None and grad._grad_fn is None and storage is not None
            and sys.getrefcount(storage) <= _ENGINE_REFS and grad._offset == 0 and grad._strides == variable._strides
            and grad._dtype is variable._dtype and grad._device is variable._device
            and storage.dtype is grad._dtype and storage.numel == math.prod(grad._shape))


def _obeys_layout(grad: Tensor, variable: Tensor) -> bool:
    """torch's layout contract for ``.grad``: the strides of a dense parameter (size-1 dims aside), else
    row-major."""
    if not S.is_non_overlapping_and_dense(variable._shape, variable._strides):
        return S.is_contiguous(grad._shape, grad._strides)
    return all(size == 1 or a == b for size, a, b in zip(grad._shape, grad._strides, variable._strides))


def _copy_in_layout_of(grad: Tensor, variable: Tensor) -> Tensor:
    """A copy of ``grad`` that keeps the layout contract: a channels-last weight gets a channels-last ``.grad``."""
    if not S.is_non_overlapping_and_dense(variable._shape, variable._strides):
        return grad.clone(memory_format=contiguous_format)
    if _obeys_layout(grad, variable):
        return grad.clone()
    return grad.new_empty_strided(variable._shape, variable._strides).copy_(grad)


class GraphTask:
    """One running backward pass, as the hooks inside it see it (torch's graph task): the nodes it will run, and the
    callbacks queued to run at its end."""

    __slots__ = ("id", "deps", "roots", "needed", "captures", "accumulate", "callbacks")
    _ids = iter(range(1 << 62))

    def __init__(self, deps: dict, roots: list, needed, captures: dict, accumulate: bool) -> None:
        self.id = next(GraphTask._ids)
        self.deps, self.roots, self.needed = deps, roots, needed  # the engine's own, read only when a hook asks
        self.captures, self.accumulate = captures, accumulate
        self.callbacks: list = []

    def will_execute(self, node: Node) -> bool:
        """torch's ``_will_engine_execute_node``."""
        if self.needed is None:
            return node in self.deps or node in self.roots
        if isinstance(node, AccumulateGrad):
            if not self.accumulate:
                raise RuntimeError("A leaf node was passed to _will_engine_execute_node but we are currently running "
                                   "autograd.grad(). This is currently not supported.")
            return (node, 0) in self.captures
        return node in self.needed or any(captured is node for captured, _ in self.captures)


class _GraphTasks(threading.local):
    """Per thread, the running backward passes, innermost last (a hook may run a backward of its own)."""

    def __init__(self) -> None:
        self.running: list[GraphTask] = []


GRAPH_TASKS = _GraphTasks()


def _current_task(what: str) -> GraphTask:
    if not GRAPH_TASKS.running:
        raise RuntimeError(f"{what} should only be called during the backward pass")
    return GRAPH_TASKS.running[-1]


class _MultiHandle:
    """The handle of a multi-grad hook: removes the tensor hook it put on each tensor."""

    def __init__(self, handles: tuple) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def register_multi_grad_hook(tensors, fn, *, mode: str = "all"):
    """torch.autograd.graph's multi-grad hook. ``mode="all"``: ``fn(grads)`` runs once per backward pass, when the
    gradients of every tensor of ``tensors`` that the pass reaches are computed, with None for the others.
    ``mode="any"``: ``fn(grad)`` runs once per pass, on the first of their gradients computed.

    >>> import tilewise as tw
    >>> a, b = tw.ones(2, requires_grad=True), tw.ones(2, requires_grad=True)
    >>> seen = []
    >>> _ = tw.autograd.graph.register_multi_grad_hook((a, b), lambda grads: seen.append(grads[1] is None))
    >>> (a * 2).sum().backward()
    >>> seen
    [True]
    """
    supported = ("all", "any")
    if mode not in supported:
        raise ValueError(f"Expects mode to be one of {supported} but got {mode}")
    lock = threading.Lock()
    if mode == "any":
        ran: set[int] = set()

        def first_only(grad) -> None:
            task = _current_task("a multi-grad hook")
            with lock:
                if task.id in ran:
                    return
                ran.add(task.id)
            fn(grad)

        return _MultiHandle(tuple(t.register_hook(first_only) for t in tensors if t.requires_grad))
    nodes = [t.grad_fn if t.grad_fn is not None else accumulate_node(t) for t in tensors]
    pending: dict[int, list] = {}  # per backward pass: [gradients so far, how many are left]

    def collecting(k: int):
        def hook(grad) -> None:
            task = _current_task("a multi-grad hook")
            with lock:
                state = pending.get(task.id)
                if state is None:
                    state = pending[task.id] = [[None] * len(nodes), sum(map(task.will_execute, nodes))]
                state[0][k] = grad
                state[1] -= 1
                done = state[1] == 0
                if done:
                    del pending[task.id]
            if done:
                fn(state[0])

        return hook

    return _MultiHandle(tuple(t.register_hook(collecting(k)) for k, t in enumerate(tensors)))


class saved_tensors_hooks:  # noqa: N801 — torch's name
    """While active, each tensor saved for backward is stored as ``pack_hook(tensor)`` and given back to its
    formula as ``unpack_hook(packed)``, as in torch.autograd.graph; activation checkpointing is built on it."""

    def __init__(self, pack_hook, unpack_hook):
        self.hooks = (pack_hook, unpack_hook)

    def __enter__(self):
        if STATE.saved_tensor_hooks_refused is not None:
            raise RuntimeError(STATE.saved_tensor_hooks_refused)
        STATE.saved_tensor_hooks = (*STATE.saved_tensor_hooks, self.hooks)  # per thread, as torch's
        return self

    def __exit__(self, *exc):
        STATE.saved_tensor_hooks = STATE.saved_tensor_hooks[:-1]
        return False


class save_on_cpu(saved_tensors_hooks):  # noqa: N801 — torch's name
    """Tensors saved for backward inside it are kept on the CPU (in pinned memory with ``pin_memory=True`` where a
    GPU is present) and copied back to their device when backward needs them, as torch.autograd.graph's.

    >>> import tilewise as tw
    >>> x = tw.ones(2, requires_grad=True)
    >>> with tw.autograd.graph.save_on_cpu():
    ...     y = (x * x).sum()
    >>> y.backward(); x.grad.tolist()
    [2.0, 2.0]
    """

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        def pack_to_cpu(t: Tensor):
            if not pin_memory:
                return t.device, t.cpu()
            packed = empty(t.size(), dtype=t.dtype, pin_memory=any(b.pins_host_memory for b in BACKENDS.values()))
            packed.copy_(t)
            return t.device, packed

        def unpack_from_cpu(packed) -> Tensor:
            device, t = packed
            return t.to(device, non_blocking=pin_memory)

        super().__init__(pack_to_cpu, unpack_from_cpu)


class disable_saved_tensors_hooks:  # noqa: N801 — torch's name
    """Inside it, entering ``saved_tensors_hooks`` (or ``save_on_cpu``) raises ``RuntimeError(error_message)``: for
    a feature that cannot work with them."""

    def __init__(self, error_message: str) -> None:
        self.error_message = error_message

    def __enter__(self):
        self._prev = STATE.saved_tensor_hooks_refused
        STATE.saved_tensor_hooks_refused = self.error_message
        return self

    def __exit__(self, *exc):
        STATE.saved_tensor_hooks_refused = self._prev
        return False


class SavedTensor:
    """A tensor saved for backward, with the storage version it had when saved."""

    __slots__ = ("tensor", "version", "is_output", "node_ref", "output_nr", "op_name", "unpack_hook")

    def __init__(self, t: Tensor, is_output: bool = False, node=None, output_nr: int = 0, op_name: str = ""):
        storage = t._storage
        if storage is not None and storage.inference:  # see [Note: inference tensors] in storage.py
            raise RuntimeError(INFERENCE_SAVED)
        # the property's common case inline: autograd's version of the memory (see ``Storage.untracked``)
        self.version = storage.version - storage.untracked if storage is not None else t._version
        self.is_output = is_output
        self.output_nr = output_nr if is_output else t._output_nr
        self.op_name = op_name
        self.unpack_hook = None
        hooks = STATE.saved_tensor_hooks
        if hooks:
            pack_hook, self.unpack_hook = hooks[-1]
            self.tensor = pack_hook(t)
            if t._version != self.version:
                raise RuntimeError("A saved tensor pack hook is modifying its input in place. Tensors provided as "
                                   "input to pack hook cannot be modified by in-place operations as this can lead to "
                                   "unexpected side-effects. Please open an issue if you need to perform in-place "
                                   "operations on the input to a pack hook.")
            self.node_ref = weakref.ref(node) if is_output else None
        elif is_output:
            # keep the data, not the Python object: an output saved by its own grad_fn would be a cycle
            self.tensor = _share_tangents(t, t.detach())
            self.node_ref = weakref.ref(node)
        else:
            self.tensor = t
            self.node_ref = None

    def unpack(self) -> Tensor:
        t = self.tensor
        if t is None:
            raise RuntimeError("Trying to backward through the graph a second time (or directly access saved tensors "
                               "after they have already been freed). Saved intermediate values of the graph are "
                               "freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you "
                               "need to backward through the graph a second time or if you need to access saved "
                               "tensors after calling backward.")
        if self.unpack_hook is not None:
            t = self.unpack_hook(t)
            if not isinstance(t, Tensor):
                raise TypeError("Output of saved tensor unpack_hook expected to be a Tensor but got result of type "
                                f"{type(t).__name__}")
        elif t._version != self.version:
            raise RuntimeError(self._modified_message(t))
        if self.is_output:
            node = self.node_ref()
            if node is not None and STATE.grad_enabled:
                out = _share_tangents(t, t.detach())
                out._grad_fn, out._output_nr, out._requires_grad = node, self.output_nr, True
                return out
        return t

    def _modified_message(self, t: Tensor) -> str:
        """torch's words: the tensor, the node it is an output of (an output names the node that saved it, an
        input the node that produced it last, as torch's SavedVariable does), and the versions."""
        kind = f"tilewise.{'' if t.device.type == 'cpu' else t.device.type + '.'}{t.dtype.name}"
        node = self.op_name if self.is_output else (t._grad_fn.name() if t._grad_fn is not None else None)
        produced_by = f", which is output {self.output_nr} of {short_node_name(node)}," if node else ""
        return ("one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{kind} {list(t.shape)}]{produced_by} is at version {t._version}; expected version {self.version} "
                "instead. Hint: the operation that modified it ran after it was saved; use an out-of-place operation "
                "or .clone() before modifying.")

    def release(self) -> None:
        self.tensor = None


def _share_tangents(t: Tensor, copy: Tensor) -> Tensor:
    """A saved output keeps the forward-AD tangents its tensor has or will get (the ForwardAD key attaches them
    after the call that saved it), so that a backward formula reading it carries them (forward-over-reverse)."""
    if dispatch.dual_levels:
        tangents = t.__dict__.get("_tangents")
        if tangents is None:
            tangents = t.__dict__["_tangents"] = {}
        copy.__dict__["_tangents"] = tangents
    return copy


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"_+", name.strip("_")) if part)


_NODE_NAMES: dict = {}  # op -> torch-style node name, e.g. MulBackward0


class OpNode(Node):
    """Backward of one operator call, driven by the operator's derivative formulas."""

    # "<input>_shape" -> shape, "<input>_geometry" -> (shape, strides, storage offset), for the formulas that read one
    shapes: Mapping[str, tuple] = MappingProxyType({})
    # what the derivative formulas read, only that (holding ``args`` would keep every input alive): a node that saves
    # nothing (add's, a view's) shares this empty default, and ``_save`` gives the others a dict of their own
    saved: Mapping[str, object] = MappingProxyType({})

    def __init__(self, op, slots: tuple, edges: tuple, input_meta: list, output_meta: list):
        self.op = op
        self.slots = slots  # (param index, list position) per tensor input, in the order of ``next_functions``
        self.next_functions = edges
        self.input_meta = input_meta  # (shape, dtype, device) per input that needs a gradient, else None
        self.output_meta = output_meta  # (shape, dtype, device) per differentiable output, else None

    def name(self) -> str:
        name = _NODE_NAMES.get(self.op)
        if name is None:
            name = _NODE_NAMES[self.op] = f"{_camel(self.op.name)}Backward0"
        return name

    @property
    def n_outputs(self) -> int:
        return max(len(self.output_meta), 1)

    def _env(self, grads: list) -> dict:
        env = dict(self.shapes)
        for key, value in self.saved.items():
            if type(value) is SavedTensor:
                value = value.unpack()
            elif isinstance(value, tuple) and any(isinstance(v, SavedTensor) for v in value):
                value = tuple(v.unpack() if isinstance(v, SavedTensor) else v for v in value)
            env[key] = value
        if len(grads) == 1 and grads[0] is not None:  # one output and its gradient: the common case
            g = grads[0]
            env["grads"] = env["output_grads"] = (g,)
            env["grad"] = g
            return env
        filled = []
        reads = _RECIPES[self.op].grad_reads
        for k, g in enumerate(grads):
            if g is None and k < reads and k < len(self.output_meta) and self.output_meta[k] is not None:
                shape, dtype, device = self.output_meta[k]
                from tilewise.ops.creation import zeros

                g = zeros(shape, dtype=dtype, device=device)
            filled.append(g)
        env["grads"] = tuple(filled)
        env["output_grads"] = tuple(grads)
        env["grad"] = filled[0] if filled else None
        return env

    def apply(self, grads: list):
        for g in grads:
            if g is not None:
                break
        else:  # no gradient reached this node
            return [None] * len(self.slots)
        env = self._env(grads)
        names = self.op.param_names()
        results: list = []
        cache: dict[str, object] = {}
        for (pk, pos), meta in zip(self.slots, self.input_meta):
            if meta is None:
                results.append(None)
                continue
            name = names[pk]
            if name not in cache:
                formula = self.op.derivatives.get(name)
                if formula is None:
                    raise RuntimeError(f"the derivative of {self.op.name} with respect to '{name}' is not implemented")
                cache[name] = formula(env)
            g = cache[name]
            if pos is not None:
                g = g[pos] if g is not None else None
            results.append(_fit_grad(g, meta, self.op.name, name))
        return results

    def release(self) -> None:
        for value in self.saved.values():
            if isinstance(value, SavedTensor):
                value.release()
            elif isinstance(value, tuple):
                for v in value:
                    if isinstance(v, SavedTensor):
                        v.release()


def _fit_grad(g, meta, op_name: str, input_name: str):
    """Reduce a broadcast gradient to the input's shape and dtype, on the input's device."""
    if g is None:
        return None
    shape, dtype, device = meta
    if g._device is not device:
        g = g.to(device)
    if g._shape != shape:
        try:
            g = g.sum_to_size(shape)
        except RuntimeError as exc:
            raise RuntimeError(f"{op_name} backward: gradient for '{input_name}' has shape {list(g._shape)}, which "
                               f"does not reduce to the input's shape {list(shape)}") from exc
    if g._dtype is not dtype:
        if g._dtype.is_complex and not dtype.is_complex:  # a real input of a complex result: torch's handle_r_to_c
            g = g.real
        if g._dtype is not dtype:
            g = g._to_dtype(dtype)  # ``g.to(dtype)`` without parsing to()'s arguments (every autocast weight's grad)
    return g


# ---------------------------------------------------------------------------- edges and recording

def accumulate_node(t: Tensor) -> AccumulateGrad:
    ref = t._acc  # a weak reference once the leaf has a node (Tensor's class default: None)
    node = ref() if ref is not None else None
    if node is None:
        node = AccumulateGrad(t)
        t.__dict__["_acc"] = weakref.ref(node)
    return node


def edge(t) -> tuple:
    if type(t) is not Tensor:
        return (None, 0)
    if t._view_meta is not None and t._requires_grad:
        check_view_history(t)
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    if t._requires_grad:
        return (accumulate_node(t), 0)
    if requires_grad_through_base_alone(t):
        return base_edge(t)
    return (None, 0)


def base_edge(t: Tensor) -> tuple:
    """The edge to a view that requires grad through its base alone (``ops.inplace.requires_grad_through_base_alone``):
    none, as in torch, where such a view has no grad accumulator: a gradient that reaches it goes nowhere. Unless
    its base was given history by an in-place write since the view was made (the view was made before the base
    required grad): then a view made under grad mode is made afresh from its base first, as torch regenerates a
    view whose base was written, and the edge is that view's; one made under no_grad or in inference mode is
    refused, as torch refuses it (``check_view_history``)."""
    if t._view_meta is not None:
        check_view_history(t)
    elif t._base._grad_fn is not None:
        regenerate(t, f"a view of shape {list(t._shape)}")
        watch_view(t, REGENERATE)  # current now: made afresh again only after another write
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    return _NO_EDGE


def refresh_view_history(view: Tensor) -> None:
    """Make ``view`` afresh from its base now if autograd would when it next takes it as an input (``edge``): a
    view that requires grad through its base alone whose base was given history since, or a watched view of kind
    ``REGENERATE`` whose memory was written since it was made."""
    meta = view._view_meta
    if meta is None and requires_grad_through_base_alone(view) or \
            meta is not None and meta[1] == REGENERATE and view.requires_grad:
        edge(view)


def check_view_history(view: Tensor) -> None:
    """Before autograd takes a watched view as an input (see [Note: watched views] in ops/inplace.py): when its memory
    was written since it was made, an output of split or unbind is refused, as torch refuses it, and an output of
    tensor_split becomes a fresh strided view of its base, whose history holds the write."""
    version, kind = view._view_meta
    base = view._base
    if view._write_count() == version or view._grad_fn is None and (base is None or not base._requires_grad):
        return  # as torch's, which checks a view only while it or its base has history
    if kind != REGENERATE:
        raise stale_view_error(view)
    regenerate(view, f"a view of shape {list(view._shape)} (output {view._output_nr} of "
                     f"{short_node_name(view._grad_fn.name())})")
    watch_view(view, kind)


def refuse_stale_view(view: Tensor) -> None:
    """Reading ``grad_fn`` (or ``is_leaf``) of a watched view that autograd would refuse to take raises that
    refusal, as torch's getter, which regenerates a view's grad_fn once its memory was written, does. A view of
    kind ``REGENERATE`` is made afresh only when autograd takes it (``edge``)."""
    version, kind = view._view_meta
    base = view._base
    if kind == REGENERATE or view._write_count() == version or \
            view._grad_fn is None and (base is None or not base._requires_grad):
        return
    raise stale_view_error(view)


AUTOGRAD_HOOKS.refuse_stale_view = refuse_stale_view


def regenerate(view: Tensor, described: str) -> None:
    """Give ``view`` the history of a fresh strided view of its base, which holds the base's in-place writes."""
    base = view._base
    if base is None or not base._requires_grad or memory_order(base) is None:
        raise RuntimeError(f"{described} is used by autograd after its memory was modified in place, and its base is "
                           "not a dense tensor that requires grad, from which it could be made afresh; take the view "
                           "again after the in-place write")
    fresh = strided_view(row_major(base)[0], view)
    view._grad_fn, view._output_nr, view._requires_grad = fresh._grad_fn, fresh._output_nr, True


class _Recipe:
    """What recording a call of one operator reads from the operator, worked out once per operator."""

    __slots__ = ("inputs", "slots", "shape_params", "saves", "grad_reads")

    def __init__(self, op):
        tensor_params = [(k, p) for k, p in enumerate(op.schema.params) if p.type == "Tensor"]
        # (bit, position, is a list, has a derivative) per tensor parameter; the bit marks it in ``wanted`` masks
        self.inputs = tuple((1 << i, k, p.is_list, op.derivatives.get(p.name) is not None)
                            for i, (k, p) in enumerate(tensor_params))
        lists = any(p.is_list for _, p in tensor_params)
        self.slots = None if lists else tuple((k, None) for k, _ in tensor_params)  # with lists: _list_slots
        read = frozenset().union(*(f.uses for f in op.derivatives.values() if f is not None))
        self.shape_params = tuple((k, key, p.is_list) for k, p in tensor_params
                                  for key in (f"{p.name}_shape", f"{p.name}_geometry") if key in read)
        self.saves: dict[int, tuple] = {}  # ``wanted`` mask -> _saves(op, mask)
        # how many outputs' missing gradients the formulas read, so many get zeros (OpNode._env): all of them
        # through ``grads``, the first through ``grad``; the others (a layer norm's mean and rstd) need none
        self.grad_reads = sys.maxsize if "grads" in read else int("grad" in read)


_RECIPES: dict = {}  # op -> _Recipe
_NO_EDGE = (None, 0)


def _takes_a_node(recipe: _Recipe, args: tuple, into: Tensor) -> bool:
    """Whether a call recorded with its result written into ``into`` makes ``into`` the output of a new node: an
    input with a derivative requires grad, and the result is floating (otherwise ``into`` would keep its old
    history under values that no longer follow from it); and nothing recording checks after the run can refuse
    the call (a watched view's history, a view through its base, an inference tensor to save), which would leave
    ``into`` written by a call that raised."""
    if into._dtype.category < FLOATING:
        return False
    found = False
    for _, k, is_list, diff in recipe.inputs:
        a = args[k]
        if is_list:
            return False
        if type(a) is not Tensor:
            continue
        if a._view_meta is not None or a._base is not None or a._storage is None or a._storage.inference:
            return False
        found = found or diff and a._requires_grad
    return found


def record(op, args: tuple, into: Tensor | None = None):
    """Run ``op`` below autograd and attach a backward node to its outputs. ``into``: an in-place operator's
    target, which the backend may write the result into (it is then the output; see [Note: in-place writes])."""
    if op.kind == "composite" and not op.derivatives:
        return op.decomposition(*args)  # autograd flows through the primitives it calls
    if op.kind == "custom":  # a custom operator records itself, as an autograd.Function (tilewise.library)
        return op.attrs["record"](args)
    recipe = _RECIPES.get(op)
    if recipe is None:
        recipe = _RECIPES[op] = _Recipe(op)
    if into is not None and not _takes_a_node(recipe, args, into):
        into = None  # the write would need recording as an overwrite (commit's): computed apart, as before
    STATE.grad_enabled = GRAD_OFF_FOR_RECORDING
    try:
        out = None if into is None else dispatch.run_written(op, args, into)
        if out is None:
            out = run(op, args)
    finally:
        STATE.grad_enabled = True
    edges, metas, wanted = [], [], 0  # wanted: the bits of the inputs that need a gradient
    slots = recipe.slots
    if slots is not None:  # no tensor lists, the common case: one input per tensor parameter
        for bit, k, _, diff in recipe.inputs:
            a = args[k]
            if diff and type(a) is Tensor and a._requires_grad:
                if a._view_meta is not None:
                    check_view_history(a)
                producer = a._grad_fn
                edges.append((producer, a._output_nr) if producer is not None else (accumulate_node(a), 0))
                metas.append((a._shape, a._dtype, a._device))
                wanted |= bit
            elif diff and type(a) is Tensor and a._base is not None and a._base._requires_grad:
                edges.append(base_edge(a))
                metas.append((a._shape, a._dtype, a._device))
                wanted |= bit
            else:
                edges.append(_NO_EDGE)
                metas.append(None)
    else:
        for bit, k, is_list, diff in recipe.inputs:
            value = args[k]
            for a in value if is_list else (value,):
                if diff and type(a) is Tensor and a._requires_grad:
                    if a._view_meta is not None:
                        check_view_history(a)
                    edges.append((a._grad_fn, a._output_nr) if a._grad_fn is not None else (accumulate_node(a), 0))
                    metas.append((a._shape, a._dtype, a._device))
                    wanted |= bit
                elif diff and type(a) is Tensor and a._base is not None and a._base._requires_grad:
                    edges.append(base_edge(a))
                    metas.append((a._shape, a._dtype, a._device))
                    wanted |= bit
                else:
                    edges.append(_NO_EDGE)
                    metas.append(None)
        slots = _list_slots(recipe, args)
    if not wanted:  # no input that needs a gradient has a derivative here
        return out
    if type(out) is Tensor and not op.nondiff_outputs:  # one output, the common case
        if out._dtype.category >= FLOATING:
            node = OpNode(op, slots, tuple(edges), metas, [(out._shape, out._dtype, out._device)])
            out._grad_fn, out._output_nr, out._requires_grad = node, 0, True
        else:
            node = OpNode(op, slots, tuple(edges), metas, [None])
    else:
        outputs = out if isinstance(out, tuple) else (out,)
        output_meta = []
        node = OpNode(op, slots, tuple(edges), metas, output_meta)
        group = op.attrs.get("view_group")  # views of the input sharing this node: watched (see [Note: view groups])
        for i, o in enumerate(outputs):
            differentiable = i not in op.nondiff_outputs and type(o) is Tensor and o._dtype.category >= FLOATING
            output_meta.append((o._shape, o._dtype, o._device) if differentiable else None)
            if differentiable:
                o._grad_fn, o._output_nr, o._requires_grad = node, i, True
                if group is not None:
                    watch_view(o, group)
    if recipe.shape_params:
        node.shapes = _input_shapes(recipe, args)
    saves = recipe.saves.get(wanted)
    if saves is None:
        saves = recipe.saves[wanted] = _saves(op, recipe, wanted)
    if saves[0] or saves[1] is None or saves[1]:
        _save(node, args, out, saves)
    return out


def _input_shapes(recipe: _Recipe, args: tuple) -> dict[str, tuple]:
    shapes = {}
    for k, key, is_list in recipe.shape_params:
        value = args[k]
        described = _geometry if key.endswith("_geometry") else _shape
        if type(value) is Tensor:
            shapes[key] = described(value)
        elif is_list:  # a list's shapes, so a formula like cat's need not save the tensors themselves
            shapes[key] = tuple(described(a) if type(a) is Tensor else () for a in value)
    return shapes


def _shape(t: Tensor) -> tuple:
    return t._shape


def _geometry(t: Tensor) -> tuple:
    return t._shape, t._strides, t._offset


def _list_slots(recipe: _Recipe, args: tuple) -> tuple:
    """(param index, list position) per tensor input of an operator with tensor-list parameters."""
    slots = []
    for _, k, is_list, _ in recipe.inputs:
        if is_list:
            slots.extend((k, pos) for pos in range(len(args[k])))
        else:
            slots.append((k, None))
    return tuple(slots)


def _saves(op, recipe: _Recipe, wanted: int) -> tuple[tuple[tuple[str, int], ...], frozenset[int] | None]:
    """The arguments (name, position) that the derivative formulas of the inputs in ``wanted`` read, and the
    outputs they read (None: all of them): torch saves no more."""
    params = op.schema.params
    formulas = [op.derivatives[params[k].name] for bit, k, _, diff in recipe.inputs if diff and wanted & bit]
    uses = frozenset().union(*(f.uses for f in formulas))
    outputs: frozenset[int] | None = frozenset()
    for f in formulas:
        if "result" in f.uses:
            outputs = None if outputs is None or f.outputs is None else outputs | f.outputs
    return tuple((p.name, k) for k, p in enumerate(params) if p.name in uses), outputs


def _saved_output(o, node: OpNode, i: int, name: str):
    if type(o) is not Tensor:
        return o
    if o._grad_fn is not node:  # an output autograd does not track (indices): saved as any other tensor
        return SavedTensor(o)
    return SavedTensor(o, True, node, i, name)


def _save(node: OpNode, args: tuple, out, saves: tuple) -> None:
    saved = node.saved = {}
    arguments, outputs = saves
    for name, k in arguments:
        value = args[k]
        if type(value) is Tensor:
            value = SavedTensor(value)
        elif isinstance(value, tuple) and any(type(v) is Tensor for v in value):  # a list of optional tensors
            value = tuple(SavedTensor(v) if type(v) is Tensor else v for v in value)
        saved[name] = value
    if outputs is None or outputs:
        name = node.name()
        if isinstance(out, tuple):
            saved["result"] = tuple(_saved_output(o, node, i, name) if outputs is None or i in outputs else None
                                    for i, o in enumerate(out))
        else:
            saved["result"] = _saved_output(out, node, 0, name)


# ---------------------------------------------------------------------------- tensor hooks

def register_tensor_hook(t: Tensor, hook):
    if not t.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    node = t.grad_fn  # torch's getter: a view autograd would refuse raises here
    if node is None:
        if t._hooks is None:
            t._hooks = []
        hooks = t._hooks
    else:
        hooks = node._own("pre_hooks").setdefault(t._output_nr, [])
    hooks.append(hook)
    return _Handle(hooks, hook)


def retain_grad(t: Tensor) -> None:
    if not t.requires_grad:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    if t._grad_fn is None:  # a leaf, as torch reads it here (no view's history is made afresh)
        return
    t.grad_fn._own("retained")[t._output_nr] = weakref.ref(t)
    t._retains_grad = True


dispatch.register_recorder(record)


def _record_with_forward_stack(op, args: tuple, into: Tensor | None = None):
    """``record`` while anomaly mode is on: the node made keeps the Python stack of the forward call, which the
    engine shows in torch's warning when that node fails in backward. Swapped in for ``record`` by
    ``record_forward_stacks``, so that operators pay nothing for it while the mode is off."""
    out = record(op, args, into)
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    node = first._grad_fn if type(first) is Tensor else None
    if node is not None and "forward_stack" not in node.__dict__:  # a composite's primitives made it: theirs
        keep_forward_stack(node)
    return out


def keep_forward_stack(node: Node) -> None:
    node.__dict__["forward_stack"] = traceback.extract_stack()[:-2]


def record_forward_stacks(enabled: bool) -> None:
    dispatch.register_recorder(_record_with_forward_stack if enabled else record)


def forward_stack_warning(node: Node) -> None:
    """torch's anomaly-mode warning when a node fails in backward: the forward call that made it, as a traceback
    of the user's frames."""
    stack = node.__dict__.get("forward_stack")
    if stack is None:
        return
    package = __file__.rsplit("/autograd/", 1)[0]
    while stack and (stack[-1].filename.startswith(package) or stack[-1].filename.startswith("<")):  # generated
        stack = stack[:-1]
    warnings.warn(f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
                  + "".join(traceback.format_list(stack)), UserWarning, stacklevel=3)


def _retain_grad(self: Tensor) -> None:
    retain_grad(self)


def _register_hook(self: Tensor, hook):
    return register_tensor_hook(self, hook)


_retain_grad.__name__ = _retain_grad.__qualname__ = "retain_grad"
_register_hook.__name__ = _register_hook.__qualname__ = "register_hook"
Tensor.retain_grad = _retain_grad  # see [Note: methods from above] in tensor.py
Tensor.register_hook = _register_hook


def register_post_accumulate_grad_hook(self: Tensor, hook):
    """``hook(tensor)`` runs after backward has accumulated this leaf's gradient into ``.grad``."""
    if not self.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if self._grad_fn is not None:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    hooks = self.__dict__.setdefault("_post_accumulate_grad_hooks", [])
    hooks.append(hook)
    return _Handle(hooks, hook)


Tensor.register_post_accumulate_grad_hook = register_post_accumulate_grad_hook  # see tilewise/_plugins.py
