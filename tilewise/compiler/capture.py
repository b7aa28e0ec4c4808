"""Capture: run a Python function on trace tensors and record every operator it calls as a graph.

[Note: capture] While ``STATE.trace_depth > 0`` the dispatcher hands every operator (views included) to
this module's ``run``, the Trace backend. It sits below autograd, so a ``loss.backward()`` inside the
traced function runs the ordinary autograd engine on trace tensors and its backward operators land in the
same graph, followed by whatever optimizer update comes next. A trace tensor is a Tensor without storage
whose ``_trace`` is its current graph value.

Memory is modelled per storage, as torch's functionalization does. Every storage the function touches
(an argument's, a captured parameter's, a gradient's) becomes one graph input holding its whole contents
(``StorageEntry``); a tensor on it is a view of that input (``as_strided`` unless it covers the storage
densely). In-place writes never mutate anything: ``_write_(dst, src)`` produces the new value of ``dst``,
a write through a view becomes ``view_scatter`` on its root, and views taken before the write are
regenerated from the root the next time they are read (the ``Alias`` records where a view came from).
What an input's storage holds at the end becomes a write-back. Trace tensors that are views remember
their root in ``_tw_alias``; everything else about them is an ordinary Tensor. A result that eager lays out in
another order than row-major (channels-last, a transposed operand's order) is such a view too, with eager's
strides, of a root holding it in that memory order (see [Note: eager strides of traced values] in formats.py).

A composite operator (softmax, layer_norm, linear) is recorded as one node, which the decompose pass expands
later; capture runs its decomposition on the trace tensors only to learn its results' types and strides, and that
it neither writes in place, reads values nor returns an argument. A later call that looks the same to the
decomposition (``_call_key``: the operator, the modes, the arguments' geometry and dtypes, its numbers) takes what
the first call found: a model's layers and an optimizer's per-parameter updates decompose once per shape, not once
per call (decomposing them again took over a quarter of tracing a transformer's training step).

Real tensors a function reads without receiving them as arguments (module parameters, closure
variables, gradients) are lifted to inputs the first time an operator sees them, with a ``Source`` that
says how to fetch them again on the next call. Python code that needs a traced value (``.item()``,
``bool(t)``, ``.numpy()``) raises ``DataDependentError`` naming the user's line.

[Note: random draws in a trace] A random node's ``tag`` says where its generator stood when it was drawn:
each traced draw moves the generator one step (no numbers are drawn; the trace puts the generator back when
it ends), and the tag is that position counted from where the trace found it. So a draw made again from a
restored state — ``set_rng_state`` to a state taken earlier in the same function, as activation
checkpointing does to recompute its segment — is the same node as the first draw, and the program draws
those numbers once, as eager replays the same Philox counters; any other draw is a node of its own. A
composite whose decomposition draws (dropout) carries the position where its draws began, and its later
decomposition (``trace_decomposition``) starts there, so it names its draws as the trace did.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import threading
import weakref
from dataclasses import dataclass, field

from tilewise import dispatch
from tilewise import strides as S
from tilewise.autograd.graph import refresh_view_history
from tilewise.compiler.errors import DataDependentError, UnsupportedTargetError, data_dependent_error, user_frame
from tilewise.compiler.formats import result_strides
from tilewise.compiler.ir import Graph, Node, Ref, TensorType
from tilewise.compiler.meta import DATA_DEPENDENT_OPS, infer, suspended
from tilewise.dispatch import STATE, register_tracer
from tilewise.dtypes import get_default_dtype
from tilewise.ops.inplace import requires_grad_through_base_alone, watch_view
from tilewise.tensor import TRACE_HOOKS, Tensor


def _complex_operands(args: tuple) -> bool:
    for a in args:
        if type(a) is Tensor:
            if a._dtype.is_complex:
                return True
        elif isinstance(a, tuple) and any(type(x) is Tensor and x._dtype.is_complex for x in a):
            return True
    return False


def _complex_type(ty) -> bool:
    if not isinstance(ty, tuple):
        return ty is not None and ty.dtype.is_complex
    return any(t is not None and t.dtype.is_complex for t in ty)


# ---------------------------------------------------------------------------- where tensors come from

@dataclass(eq=False)
class Source:
    """How to fetch a tensor the graph reads, on every call: argument leaf, held object, or an owner's grad."""

    kind: str  # "arg" | "object" | "grad" | "number" (a dynamic number argument: see compiler/numbers.py)
    label: str
    index: int = -1  # "arg", "number": position among the flattened arguments
    obj: object = None  # "object": the tensor; "number": what makes the 0-dim tensor read from the number
    owner: Source | None = None  # "grad"

    def fetch(self, flat_args: list):
        if self.kind == "arg":
            return flat_args[self.index]
        if self.kind == "object":
            return self.obj
        if self.kind == "number":
            return self.obj(flat_args[self.index])
        owner = self.owner.fetch(flat_args)
        return owner._grad if type(owner) is Tensor else None


LAYOUT_FIELDS = ("_shape", "_strides", "_offset", "_dtype", "_device", "_requires_grad")
_LAYOUT_AND_SIZE = operator.attrgetter(*LAYOUT_FIELDS, "_storage.numel")


THROUGH_BASE = "through its base"  # a signature's requires_grad for a tensor that requires grad through its base alone


def signature(t: Tensor) -> tuple:
    """Everything about a tensor that a compiled program is specialised on, read in one C-level call. Its
    requires_grad is True, False, or ``THROUGH_BASE`` for a view that requires grad through its base alone
    (``ops.inplace.requires_grad_through_base_alone``): its outputs require grad, but no gradient reaches it;
    unless its base has history, which autograd makes it afresh from (``autograd.graph.base_edge``): True."""
    found = _LAYOUT_AND_SIZE(t)
    base = t._base
    if base is None or found[5] or not base._requires_grad:
        return found
    return (*found[:5], THROUGH_BASE if base._grad_fn is None else True, found[6])


@dataclass(eq=False)
class StorageEntry:
    """One storage the graph reads or writes: its graph input and the value it holds now."""

    storage: object
    source: Source
    input: Node
    current: Node
    version: int = 0  # the storage's version counter before the trace (in-place writes bump it as eager does)
    position: int = 0  # its place among the capture's entries

    @property
    def root_shape(self) -> tuple[int, ...]:
        return self.input.type.shape


@dataclass(eq=False)
class Alias:
    """A view's root (a StorageEntry or a root trace tensor), its geometry on it, and the root value it saw."""

    root: object
    geometry: tuple
    seen: Node


@dataclass(eq=False)
class TensorSource:
    source: Source
    signature: tuple
    entry: int  # index of its storage entry


@dataclass(eq=False)
class GradEffect:
    """After a call, ``owner.grad`` must be: output ``output`` (an index), None, or left unchanged."""

    owner: Source
    output: int | None
    clear: bool = False


@dataclass(eq=False)
class StateEffect:
    """After a call, ``state[owner][key]`` of an optimizer must hold graph output ``output``, or ``value``."""

    state: dict
    owner: object
    key: object
    output: int | None = None
    value: object = None

    def apply(self, outputs: list) -> None:
        self.state.setdefault(self.owner, {})[self.key] = outputs[self.output] if self.output is not None \
            else self.value


@dataclass
class BackwardSpec:
    """How the traced function differentiates: graph inputs for the output gradients, graph outputs for the
    input gradients. Outputs ``n_forward`` and later of the joint graph are the gradients, one per ``inputs``."""

    tangents: list[Node]  # graph inputs: the gradient of each differentiable output
    outputs: list[int]  # graph output index of each differentiable output (aligned with tangents)
    inputs: list[Source]  # the tensors the gradients are for
    n_forward: int
    # tensors read that require grad through their base alone (``ops.inplace.requires_grad_through_base_alone``): no
    # gradient reaches them, but the outputs computed from them require grad, as eager's do
    through_base: list[Source] = field(default_factory=list)


@dataclass(frozen=True)
class OutputView:
    """A returned view, made again after each run over the memory it shares: ``base`` is a Source (a tensor the
    function was given or holds) or a graph output's index; ``geometry`` is (shape, strides, storage offset)."""

    base: object
    geometry: tuple
    requires_grad: bool


@dataclass(frozen=True)
class Detached:
    """A returned ``detach()`` or ``.data`` of a tensor the function was given or holds: detached again per call."""

    origin: Source
    requires_grad: bool


@dataclass
class Traced:
    graph: Graph
    tensor_sources: list[TensorSource]
    grad_presence: list[tuple[Source, bool]]
    grad_effects: list[GradEffect]
    output_spec: object  # pytree spec of the function's result
    output_leaves: list[tuple]  # per leaf: ("out", graph output index), ("arg", the flat argument returned
    # as it is: a tensor argument the function returns, updated in place or not), ("const", the value itself), or
    # an output that aliases another tensor (see [Note: outputs that alias] in function.py): ("leaf", an earlier
    # leaf's position), ("view", OutputView over a source), ("view_out", OutputView over a graph output) or
    # ("detached", Detached)
    output_requires_grad: list[bool]
    backward: BackwardSpec | None = None
    state_effects: list[StateEffect] = field(default_factory=list)
    # graph output -> (shape, strides) it is handed back with, eager's: the output holds the value in the memory order
    # of those strides (see [Note: eager strides of traced values] in compiler/formats.py)
    output_layouts: dict[int, tuple] = field(default_factory=dict)


# ---------------------------------------------------------------------------- pytrees

def flatten(tree) -> tuple[list, object]:
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        leaves, specs = [], []
        for item in tree:
            sub, spec = flatten(item)
            leaves += sub
            specs.append((len(sub), spec))
        return leaves, (type(tree), specs)
    if isinstance(tree, dict):
        leaves, spec = flatten(list(tree.values()))
        return leaves, (dict, list(tree.keys()), spec)
    return [tree], None


def unflatten(spec, leaves: list):
    if spec is None:
        return leaves[0]
    if spec[0] is dict:
        return dict(zip(spec[1], unflatten(spec[2], leaves)))
    kind, specs = spec
    out, start = [], 0
    for count, sub in specs:
        out.append(unflatten(sub, leaves[start:start + count]))
        start += count
    return kind(out) if kind is not list else out


# ---------------------------------------------------------------------------- the capture context

def active() -> Capture:
    return STATE.captures[-1]


def trace_tensor(node: Node, strides: tuple | None = None, offset: int = 0) -> Tensor:
    ty = node.type
    t = Tensor._make(None, ty.shape, strides if strides is not None else S.contiguous_strides(ty.shape), offset,
                     ty.dtype, ty.device)
    t._trace = node
    return t


_REFS = tuple(Ref(i) for i in range(16))  # the Refs of a call's first tensor arguments, made once
_RECORDED_INLINE = "inline"  # what ``Capture.composite_results`` holds for a call recorded op by op


def _permutation(geometry: tuple, root_shape: tuple) -> tuple | None:
    """The dims ``d`` for which ``root.permute(d)`` is the view of this geometry on a row-major root, if it is one
    (all of the root from offset 0: a result that eager lays out in another order, over its memory)."""
    shape, strides, offset = geometry
    if offset or len(shape) != len(root_shape) or S.numel(shape) != S.numel(root_shape):
        return None
    root_strides = S.contiguous_strides(root_shape)
    free, dims = list(range(len(root_shape))), []
    for size, stride in zip(shape, strides):
        d = next((d for d in free if root_shape[d] == size and (size == 1 or root_strides[d] == stride)), None)
        if d is None:
            return None
        free.remove(d)
        dims.append(d)
    return tuple(dims)


def _dense_over(geometry: tuple, root: Tensor) -> bool:
    """Whether a view of ``geometry`` is all of ``root``'s memory, densely from its start (a transpose, a reshape,
    a channels-last result over its memory-order value): returned alone, an output of its own laid out in that
    order holds what eager's would."""
    shape, strides, offset = geometry
    return offset == 0 and S.numel(shape) == S.numel(root._shape) and S.dense_order(shape, strides) is not None


def _inverse(dims: tuple) -> tuple:
    return tuple(sorted(range(len(dims)), key=dims.__getitem__))


def _value_dependent(op) -> str:
    return f"{op.name}() (its result's shape depends on tensor values)"


def _aliases_an_input(out, args: tuple) -> bool:
    """Whether a decomposition returned one of its tensor arguments, or a view of one's memory."""
    inputs = set()
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if type(t) is Tensor:
                inputs.add(id(t))
                if t._base is not None:
                    inputs.add(id(t._base))
    for o in out if isinstance(out, (tuple, list)) else (out,):
        if type(o) is Tensor and (id(o) in inputs or (o._base is not None and id(o._base) in inputs)):
            return True
    return False


def _call_key(op, args: tuple) -> tuple | None:
    """What a composite's decomposition can learn of a call without reading values: the operator, the modes it runs
    under, and per argument a tensor's geometry, dtype, device, grad flag, whether it is real or traced and a view or
    not, and which earlier argument it is again, if it is; any other argument by type and value (a float by its repr,
    which tells -0.0 from 0.0). None where the call cannot be told apart so (an unhashable argument; forward AD or
    vmap, whose rules run inside it)."""
    if dispatch.dual_levels or STATE.vmap or STATE.autocast is not None:
        return None
    seen: dict[int, int] = {}

    def part(a):
        if type(a) is Tensor:
            return (a._shape, a._strides, a._offset, a._dtype, a._device, a._requires_grad, a._trace is None,
                    a._base is None, seen.setdefault(id(a), len(seen)))
        if isinstance(a, float):
            return (type(a), repr(a))
        if isinstance(a, (tuple, list)):
            return (type(a), tuple([part(x) for x in a]))
        return (type(a), a)

    key = (op, STATE.grad_enabled, STATE.inference, get_default_dtype(), tuple([part(a) for a in args]))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class Capture:
    def __init__(self, names: dict[int, str] | None = None, inline_composites: bool = False, keep=None,
                 rng_origin: int = 0):
        self.names = names or {}
        self.inline_composites = inline_composites
        self.keep = keep  # with inline_composites: fn(op name, bound args) -> True for a composite to keep whole
        self.body: list[Node] = []
        self.defined: set[Node] = set()
        self.entries: dict[int, StorageEntry] = {}
        self.labels: set[str] = set()  # the entries' input tags (a training step has hundreds of entries)
        self.suffixes: dict[str, int] = {}  # label -> the first ``#k`` suffix that may be free for it
        self.tensor_sources: list[TensorSource] = []
        self.sourced: set[int] = set()  # ids of the real tensors already in tensor_sources
        self.owners: list[tuple[Tensor, Source]] = []  # real tensors whose .grad may be read or set
        self.owner_sources: dict[int, Source] = {}  # id of an owner -> its source (the owners' first)
        # real tensors read that require grad through their base alone: id -> (it, its source) (see BackwardSpec)
        self.through_base: dict[int, tuple[Tensor, Source]] = {}
        self.saved_grads: dict[int, tuple[Tensor, object]] = {}
        self.histories: list[Tensor] = []  # real tensors read with autograd history made before the call
        # ids of the autograd nodes backward passes in the trace reached (a history's node lives as long as its
        # tensor in ``histories``, so no other node can take its id)
        self.backward_nodes: set[int] = set()
        self.backward_from_history = False  # a backward in the trace started at a real tensor's history
        self.arg_sources: dict[int, Source] = {}  # id of an argument tensor -> its Source
        self.arg_index: dict[int, int] = {}  # id of an argument tensor -> its position among the flat arguments
        self.detached: dict[int, tuple[Tensor, Tensor]] = {}  # id of a real tensor detached here -> (it, origin)
        self.output_layouts: dict[int, tuple] = {}  # see ``Traced.output_layouts``
        self.states: list[tuple[dict, dict]] = []  # optimizer state tables and what they held before the trace
        self.live: list[weakref.ref] = []  # every trace tensor made since the last sync (see segments.py)
        # what a data-dependent read does: None raises DataDependentError; a callable(capture, what) runs what
        # was recorded so far and makes every live trace tensor real (a graph break, see segments.py)
        self.breaks = None
        self.on_operator = None  # called as each operator is recorded (the recorder reads the user code on the stack)

        # a composite call's key (``_call_key``) -> the result types and strides its decomposition gave, for calls
        # it recorded as one node, or _RECORDED_INLINE for calls recorded op by op: the same call again (every layer
        # of a model, every parameter of an update) is not decomposed again, or only to be recorded
        self.composite_results: dict[tuple, tuple] = {}

        self.rng_origin = rng_origin  # the position the first draw of the default generator is named after
        self.rng_start: dict[object, int] = {}  # generator -> the offset its positions count from
        self.rng_found: dict[object, int] = {}  # generator -> its offset when this capture first used it

    def track(self, t: Tensor) -> Tensor:
        self.live.append(weakref.ref(t))
        return t

    # ------------------------------------------------------------------ nodes
    def emit(self, op: str, srcs: tuple, args: tuple, type, tag=None) -> Node:
        node = Node(op, srcs, args, type, tag)
        if node not in self.defined:
            self.defined.add(node)
            self.body.append(node)
        return node

    def wrap(self, node: Node):
        if node.is_tuple:
            return tuple(self.track(trace_tensor(self.emit("getitem", (node,), (k,), t))) if t is not None else None
                         for k, t in enumerate(node.type))
        return self.track(trace_tensor(node))

    # ------------------------------------------------------------------ random draws
    def rng_position(self, generator=None) -> int:
        """Where ``generator`` (the default one for None) stands, counted from where this capture found it
        (see [Note: random draws in a trace])."""
        from tilewise.ops.creation import generator_or_default

        gen = generator_or_default(generator)
        start = self.rng_start.get(gen)
        if start is None:
            origin = self.rng_origin if gen is _default_generator() else 0
            start = self.rng_start[gen] = gen.offset - origin
            self.rng_found[gen] = gen.offset
        return gen.offset - start

    def draw(self, generator) -> int:
        """The tag of a random node drawn from ``generator`` now: its position, which the draw then moves on."""
        from tilewise.ops.creation import generator_or_default

        position = self.rng_position(generator)
        generator_or_default(generator).offset += 1
        return position

    def restore_generators(self) -> None:
        """Put every generator a draw moved back where the capture found it."""
        for gen, offset in self.rng_found.items():
            gen.offset = offset

    # ------------------------------------------------------------------ storages and lifting
    def entry_for(self, t: Tensor, source: Source | None = None) -> StorageEntry:
        """The storage entry of a real tensor, creating its graph input (and remembering its source)."""
        key = id(t._storage)
        entry = self.entries.get(key)
        if entry is not None and source is None and id(t) in self.sourced:
            return entry
        described = t  # the tensor the guards fetch through ``source`` and compare with what the trace saw
        if source is None:
            source = self.arg_sources.get(id(t))
        if source is None:
            described = self.origin_of(t)
            source = self.arg_sources.get(id(described)) or self._owner_source(described) or \
                self._source_for(described)
        if t._base is not None and (entry is None or entry.current is entry.input):
            _refresh_history(t)
        if entry is None:
            st = t._storage
            # counted in the tensor's own elements: a view of another dtype's storage (``view_as_real`` of a complex
            # tensor, ``view(dtype)``) spans more or fewer of them than the storage holds of its own, and a root of
            # the storage's count overran its memory (a compiled optimizer over real views of complex parameters)
            size = st.numel if st.dtype is t._dtype else st.numel * st.dtype.itemsize // t._dtype.itemsize
            dense = t._offset == 0 and t.numel() == size and S.is_contiguous(t._shape, t._strides)
            root = TensorType(t._shape if dense else (size,), t._dtype, t._device)
            node = Node("input", (), (), root, tag=self._unique_label(source.label))
            entry = StorageEntry(st, source, node, node, st.version, len(self.entries))
            self.entries[key] = entry
            self.labels.add(node.tag)
        self.sourced.add(id(t))
        if t._grad_fn is not None and not any(h is t for h in self.histories):
            self.histories.append(t)
        self.tensor_sources.append(TensorSource(source, signature(described), entry.position))
        self.add_owner(t, source)
        return entry

    def backward_through_history(self) -> bool:
        """Whether a backward in the trace ran autograd nodes recorded before the call: their structure and
        saved values belong to that one call's history, which no guard sees, so a replay would reuse them."""
        return self.backward_from_history or any(id(t._grad_fn) in self.backward_nodes for t in self.histories)

    def add_owner(self, t: Tensor, source: Source) -> None:
        if t._requires_grad and id(t) not in self.owner_sources:  # (``owners`` keeps ``t``, and so its id)
            self.owners.append((t, source))
            self.owner_sources[id(t)] = source
            self.saved_grads.setdefault(id(t), (t, t._grad))
        elif requires_grad_through_base_alone(t):
            self.through_base.setdefault(id(t), (t, source))

    def _unique_label(self, label: str) -> str:
        taken = self.labels
        if label not in taken:
            return label
        k = self.suffixes.get(label, 1)  # those before it are taken: labels are never given back
        while f"{label}#{k}" in taken:
            k += 1
        self.suffixes[label] = k + 1
        return f"{label}#{k}"

    def origin_of(self, t: Tensor) -> Tensor:
        """The tensor a real tensor was detached from in this call (``detach()``, ``.data``), through any chain
        of detaches: the detached tensor is a new object on every call, which only its origin finds again."""
        found = self.detached.get(id(t))
        while found is not None and found[0] is t:
            t = found[1]
            found = self.detached.get(id(t))
        return t

    def _owner_source(self, t: Tensor) -> Source | None:
        return self.owner_sources.get(id(t))

    def _source_for(self, t: Tensor) -> Source:
        for owner, owner_source in self.owners:
            if owner._grad is t:
                return Source("grad", f"{owner_source.label}.grad", owner=owner_source)
        label = self.names.get(id(t), f"captured{len(self.entries)}")
        return Source("object", label, obj=t)

    def argument(self, index: int, leaf: Tensor, label: str) -> None:
        """Argument ``leaf`` is passed to the function as it is: the first operator that reads it lifts its
        storage to a graph input fetched from that argument on every call (an unused argument is never
        guarded), and autograd records on the caller's own tensor."""
        self.arg_sources[id(leaf)] = Source("arg", label, index=index)
        self.arg_index.setdefault(id(leaf), index)

    # ------------------------------------------------------------------ reading and writing values
    def root_value(self, root) -> Node:
        return root.current if isinstance(root, StorageEntry) else root._trace

    def read(self, root, geometry: tuple) -> Node:
        value = root.current if type(root) is StorageEntry else root._trace
        shape, strides, offset = geometry
        if offset == 0 and shape == value.type.shape and strides == S.contiguous_strides(shape):
            return value
        ty = TensorType(tuple(shape), value.type.dtype, value.type.device)
        dims = _permutation(geometry, value.type.shape)
        if dims is not None and dims == tuple(range(len(dims))):  # row-major but for the strides of size-1 dims
            return value
        if dims is not None:
            return self.emit("permute", (value,), (Ref(0), dims), ty)
        return self.emit("as_strided", (value,), (Ref(0), tuple(shape), tuple(strides), offset), ty)

    def alias_of(self, t: Tensor) -> Alias | None:
        """Where ``t`` lives: its own Alias, or for a real tensor its storage entry."""
        if t._trace is None:
            entry = self.entry_for(t)
            return Alias(entry, (t._shape, t._strides, t._offset), None)
        return t.__dict__.get("_tw_alias")

    def value_of(self, t: Tensor) -> Node:
        if t._trace is None:  # a real tensor: a read of its storage's current value
            return self.read(self.entry_for(t), (t._shape, t._strides, t._offset))
        alias = t.__dict__.get("_tw_alias")
        if alias is None:
            return t._trace
        current = self.root_value(alias.root)
        if t._trace is not None and alias.seen is current:
            return t._trace
        value = self.read(alias.root, alias.geometry)
        if t._trace is not None:
            t._trace, alias.seen = value, current
        return value

    def write(self, dst: Tensor, src: Tensor) -> Tensor:
        """``_write_(dst, src)``: the new value of dst is src; its root (if it is a view) is updated too."""
        old = self.value_of(dst)
        new = self.emit("_write_", (old, self.value_of(src)), (_REFS[0], _REFS[1]), old.type)
        alias = self.alias_of(dst)
        if alias is None:
            dst._trace = new
            return dst
        root_value = self.root_value(alias.root)
        shape, strides, offset = alias.geometry
        root_shape = root_value.type.shape
        if offset == 0 and shape == root_shape and strides == S.contiguous_strides(shape):
            dims = ()  # the whole root, row-major (a parameter or optimizer state updated in place): its new value
        else:
            dims = _permutation(alias.geometry, root_shape)
        if dims is not None and dims == tuple(range(len(dims))):  # all of the root, in its order
            updated = new
        elif dims is not None:  # all of the root, in another order: the new root is the value in its order
            updated = self.emit("permute", (new,), (Ref(0), _inverse(dims)), root_value.type)
        else:
            updated = self.emit("view_scatter", (root_value, new),
                                (Ref(0), Ref(1), tuple(shape), tuple(strides), offset), root_value.type)
        self._set_root(alias.root, updated)
        if dst._trace is not None:
            dst._trace = self.read(alias.root, alias.geometry)
            alias.seen = updated
        return dst

    def _set_root(self, root, value: Node) -> None:
        if isinstance(root, StorageEntry):
            root.current = value
        else:
            root._trace = value

    # ------------------------------------------------------------------ operators
    def operands(self, op, args: tuple) -> tuple[tuple, tuple]:
        """The values of a call's tensor arguments (``srcs``) and its arguments with each tensor a ``Ref`` to its
        value."""
        srcs: list[Node] = []
        frozen = []
        for a in args:
            if type(a) is Tensor:
                frozen.append(_REFS[len(srcs)] if len(srcs) < len(_REFS) else Ref(len(srcs)))
                srcs.append(self.value_of(a))
            elif isinstance(a, tuple) and any(type(x) is Tensor for x in a):
                items = []
                for x in a:
                    if type(x) is Tensor:
                        items.append(_REFS[len(srcs)] if len(srcs) < len(_REFS) else Ref(len(srcs)))
                        srcs.append(self.value_of(x))
                    else:
                        items.append(x)
                frozen.append(tuple(items))
            else:
                frozen.append(a)
        return tuple(srcs), tuple(frozen)

    def view(self, op, args: tuple, device) -> Tensor:
        from tilewise.ops.views import apply_view

        x = args[0]
        if x._dtype.is_complex or op.attrs.get("view_dtype") is not None:
            return self.run_uncompiled(op, args, "on complex tensors", "the C and CUDA targets generate no code for "
                                       "complex dtypes")
        alias = self.alias_of(x)
        root = alias.root if alias is not None else x
        out = apply_view(op, args)
        out._storage = None
        geometry = (out._shape, out._strides, out._offset)
        if op.name == "as_strided":  # storage-relative: read straight from the root
            out._trace = self.read(root, geometry)
        else:
            srcs, frozen = self.operands(op, args)
            out._trace = self.emit(op.full_name, srcs, frozen, TensorType(out._shape, out._dtype, device))
        out.__dict__["_tw_alias"] = Alias(root, geometry, self.root_value(root))
        meta = out._view_meta
        if meta is not None and meta[0] != out._write_count():  # taken on the real storage: count as the trace does
            watch_view(out, meta[1])
        return self.track(out)

    def copy_alias(self, src: Tensor, dst: Tensor) -> None:
        """``dst`` shares ``src``'s memory (``detach``, ``.data =``): the same root and geometry, so that a write
        through either is seen by both, as in eager."""
        alias = src.__dict__.get("_tw_alias")
        if alias is not None:
            dst.__dict__["_tw_alias"] = Alias(alias.root, alias.geometry, alias.seen)
        else:
            geometry = (src._shape, src._strides, src._offset)
            dst.__dict__["_tw_alias"] = Alias(src, geometry, src._trace)
        self.track(dst)

    def composite(self, op, args: tuple, device):
        returns_list = op.schema.text.endswith("Tensor[]")
        if op.schema.is_view or returns_list or (
                self.inline_composites and not (self.keep is not None and self.keep(op.full_name, args))):
            return op.decomposition(*args)
        srcs, frozen = self.operands(op, args)
        key = _call_key(op, args)
        known = self.composite_results.get(key) if key is not None else None
        if known is _RECORDED_INLINE:  # the same call as one whose decomposition wrote in place or returned an argument
            return op.decomposition(*args)
        if known is not None:  # the same call as one before: its decomposition would find what that one found
            return self._composite_node(op, srcs, frozen, *known)
        state = self._snapshot(args)
        position = self.rng_position()
        offsets = [gen.offset for gen in self.rng_found]
        entries = len(self.entries)
        body, defined, breaks = self.body, self.defined, self.breaks
        self.body, self.defined, self.breaks = [], set(defined), None  # no graph break inside a node's body
        needs_values = False
        try:
            out = op.decomposition(*args)
        except DataDependentError:
            if breaks is None:
                raise
            needs_values = True
        finally:
            self.body, self.defined, self.breaks = body, defined, breaks
        grew = len(self.entries) != entries
        if needs_values or grew or self._changed(state) or _aliases_an_input(out, args):
            # the decomposition writes in place, reads values (a graph break), returns an argument or a view of one
            # (as eager does: the result shares its memory and strides), or makes a tensor from host values (pdist's
            # row pairs, an input of this graph that a later re-trace of the op alone could not bind): record what
            # it does, not the op. Writing in place and returning an argument follow from what the key holds: a call
            # alike is recorded so again without this attempt (a layer norm's backward returns its gradient as the
            # bias's)
            drew = len(self.rng_found) != len(offsets) or any(g.offset != o for g, o in zip(self.rng_found, offsets))
            if key is not None and not (needs_values or grew or drew):
                self.composite_results[key] = _RECORDED_INLINE
            self._restore(args, state)
            _default_generator().offset -= self.rng_position() - position
            return op.decomposition(*args)
        if not isinstance(out, (Tensor, tuple, list)):
            return out  # a Python value the decomposition found from shapes alone (``equal`` of different shapes)
        if isinstance(out, (tuple, list)):
            ty = tuple(TensorType(o._shape, o._dtype, o._device) if o is not None else None for o in out)
        else:
            ty = TensorType(out._shape, out._dtype, out._device)
        # the strides eager gives each result are those its decomposition gave
        strides = [None if o is None else o._strides if type(o) is Tensor and o._offset == 0 else
                   result_strides(op, args, o._shape) for o in (out if isinstance(out, (tuple, list)) else (out,))]
        if self.rng_position() != position:  # a random composite (dropout): named by its draws' position
            return self._composite_node(op, srcs, frozen, ty, strides, position)
        if key is not None:
            self.composite_results[key] = (ty, strides)
        return self._composite_node(op, srcs, frozen, ty, strides)

    def _composite_node(self, op, srcs: tuple, frozen: tuple, ty, strides: list, tag=None):
        """The traced result(s) of a composite recorded whole: its node, laid out as its decomposition laid it out."""
        result = self.wrap(self.emit(op.full_name, srcs, frozen, ty, tag))
        for r, s in zip(result if isinstance(result, tuple) else (result,), strides):
            if type(r) is Tensor:
                self.lay_out(r, s)
        return result

    def _snapshot(self, args: tuple) -> tuple:
        tensors = [a for a in args if type(a) is Tensor] + [x for a in args if isinstance(a, tuple) for x in a
                                                            if type(x) is Tensor]
        roots = [alias.root for t in tensors if t._trace is not None and (alias := t.__dict__.get("_tw_alias"))
                 and not isinstance(alias.root, StorageEntry)]
        return ([(e, e.current) for e in self.entries.values()],
                [(t, t._trace) for t in tensors + roots if t._trace is not None])

    def _changed(self, state: tuple) -> bool:
        entries, tensors = state
        return any(e.current is not v for e, v in entries) or any(t._trace is not v for t, v in tensors)

    def _restore(self, args: tuple, state: tuple) -> None:
        for entry, value in state[0]:
            entry.current = value
        for t, value in state[1]:
            t._trace = value

    def primitive(self, op, args: tuple, device):
        if op.attrs.get("compiled") is False:  # the whole function runs eagerly (see targets.target_of)
            raise UnsupportedTargetError(f"it calls {op.name}, which checks its results on the host and runs eagerly "
                                         "(compile the code around it separately)")
        if op.kind == "custom" and op.schema.is_inplace:
            return self.run_uncompiled(op, args, "mutates its arguments", "the graph holds custom operators that "
                                       "return new tensors only")
        if op.full_name in DATA_DEPENDENT_OPS or op.attrs.get("data_dependent"):
            return self.run_real(op, args, device, _value_dependent(op))
        try:
            ty = infer(op, args, device)
        except DataDependentError:
            return self.run_real(op, args, device, _value_dependent(op))
        if _complex_operands(args) or _complex_type(ty):
            return self.run_uncompiled(op, args, "on complex tensors", "the C and CUDA targets generate no code for "
                                       "complex dtypes")
        srcs, frozen = self.operands(op, args)
        tag = self.draw(_generator_argument(op, args)) if op.kind == "random" else None
        out = self.wrap(self.emit(op.full_name, srcs, frozen, ty, tag))
        if type(out) is Tensor:
            self.lay_out(out, result_strides(op, args, out._shape))
            return out
        for t in out:
            if type(t) is Tensor:
                self.lay_out(t, result_strides(op, args, t._shape))
        return out

    def lay_out(self, t: Tensor, strides: tuple | None, reinterpret: bool = False) -> None:
        """Give a result the strides eager gives it (see [Note: eager strides of traced values] in
        compiler/formats.py): one that eager lays out in another dense order becomes a view, with those strides, of
        its value in that memory order. With ``reinterpret``, its values were made in memory order (a factory's
        fill or draws, which eager reads through the strides): the memory holds them as made."""
        if strides is None or tuple(strides) == t._strides:
            return
        order = S.dense_order(t._shape, strides)
        if order is None:  # no dense layout (no rule here gives one): left row-major
            return
        if not order or t.numel() == 0:  # row-major but for the strides of size-1 dims, or no element to address
            t._strides = tuple(strides)
            return
        memory_shape = S.permuted(t._shape, order)
        memory_type = TensorType(memory_shape, t._dtype, t._device)
        made = self.emit("view", (t._trace,), (Ref(0), memory_shape), memory_type) if reinterpret else \
            self.emit("permute", (t._trace,), (Ref(0), order), memory_type)
        memory = self.track(trace_tensor(made))
        t._strides = tuple(strides)
        geometry = (t._shape, t._strides, t._offset)
        if reinterpret:
            t._trace = self.read(memory, geometry)
        t.__dict__["_tw_alias"] = Alias(memory, geometry, memory._trace)
        memory.__dict__["_tw_laid_out"] = weakref.ref(t)

    def run_real(self, op, args: tuple, device, what: str):
        """An operator the graph cannot hold (its result's shape depends on values): a graph break runs what
        was recorded, then the operator on the real values; without breaks (fullgraph=True) it is an error."""
        if self.breaks is None:
            raise data_dependent_error(what)
        self.breaks(self, what)
        with suspended():
            from tilewise.dispatch import run as run_below_autograd

            return run_below_autograd(op, args)

    def run_uncompiled(self, op, args: tuple, what: str, why: str):
        """An operator no program holds (complex tensors, for which neither target generates code; a solver that
        checks its result on the host): a graph break runs it on the real values, and the compiled segments around
        it stay compiled; with ``fullgraph=True`` it is an error."""
        what = f"{op.name}() {what}"
        if self.breaks is None:
            path, line, text = user_frame()
            raise UnsupportedTargetError(f"{what}: {why}.\n  at {path}:{line}: {text}\nLeave it outside the compiled "
                                         "function, or compile with fullgraph=False to run it between compiled "
                                         "segments.")
        self.breaks(self, what)
        with suspended():
            from tilewise.dispatch import run as run_below_autograd

            return run_below_autograd(op, args)

    def value_needed(self, t: Tensor, what: str) -> None:
        """Python code asks for the values of ``t`` (``item()``, ``bool()``, ``numpy()``, printing)."""
        if self.breaks is None:
            raise data_dependent_error(what)
        self.breaks(self, what)

    # ------------------------------------------------------------------ the end of a trace
    def finish(self, result, flat_args: list) -> Traced:
        leaves, spec = flatten(result)
        outputs: list[Node] = []
        out_leaves, traced = [], []
        arguments = self.arg_index
        position: dict[int, int] = {}  # id of a returned tensor -> its first leaf
        bases = self._shared_bases(leaves)
        for k, leaf in enumerate(leaves):
            if type(leaf) is Tensor and position.setdefault(id(leaf), k) != k:
                out_leaves.append(("leaf", position[id(leaf)]))  # returned twice: one object, as eager's
            elif type(leaf) is Tensor and leaf._trace is None and id(leaf) in arguments:
                out_leaves.append(("arg", arguments[id(leaf)]))  # the caller's own tensor (``out.copy_(x)``)
            elif type(leaf) is Tensor and leaf._trace is None and id(leaf) in self.detached:
                out_leaves.append(("detached", self._detached_output(leaf)))
            elif type(leaf) is Tensor and leaf._trace is None and self._grad_of(leaf) is not None:
                out_leaves.append(("grad", self._grad_of(leaf)))  # the gradient the owner holds after each call
            elif type(leaf) is Tensor and leaf._trace is not None:
                view = self._input_view(leaf, flat_args)
                out_leaves.append(("view", view) if view is not None else
                                  self._traced_output(leaf, bases, outputs, traced))
            else:
                out_leaves.append(("const", leaf))
        requires = [leaf._requires_grad for leaf in traced]
        returned = {id(leaf): k for k, leaf in enumerate(traced)}
        effects, presence = self._grad_effects(outputs, requires, returned)
        state_effects = self._state_effects(outputs, requires, returned)
        differentiable = [(k, leaf) for k, leaf in enumerate(traced)
                          if leaf._requires_grad and leaf._dtype.is_floating_point]
        backward = self._backward(differentiable, outputs)
        if backward is None:
            requires = [False] * len(requires)
        writes = [(e.input, e.current) for e in self.entries.values() if e.current is not e.input]
        inputs = [e.input for e in self.entries.values()] + (backward.tangents if backward else [])
        graph = Graph(inputs, list(self.body), outputs, writes)
        return Traced(graph, self.tensor_sources, presence, effects, spec, out_leaves, requires, backward,
                      state_effects, dict(self.output_layouts))

    def _traced_output(self, leaf: Tensor, bases: dict, outputs: list, traced: list) -> tuple:
        """How returned trace tensor ``leaf`` comes back: ("out", its graph output), or ("view_out", its view over
        the output that holds its root's memory) where that root is one returned views are made over (``bases``)."""
        alias = leaf.__dict__.get("_tw_alias")
        root = alias.root if alias is not None else leaf
        if id(root) in bases:
            holder = self._holder(root)
            # a view that needs grad over memory that does not was written in place by a differentiable value: its
            # own output carries that history, a view of the memory would not
            if holder is leaf or holder._requires_grad or not leaf._requires_grad:
                k = bases[id(root)]
                if k is None:  # the memory is an output, returned or not
                    k = bases[id(root)] = len(outputs)
                    outputs.append(self._in_eager_format(holder, k, holder is root))
                    traced.append(holder)
                if holder is leaf:
                    return ("out", k)
                return ("view_out", OutputView(k, alias.geometry, leaf._requires_grad))
        k = len(outputs)
        outputs.append(self._in_eager_format(leaf, k, False))
        traced.append(leaf)
        return ("out", k)

    @staticmethod
    def _holder(root: Tensor) -> Tensor:
        """The tensor whose output holds ``root``'s memory: the root; or, for the memory-order value of a result eager
        lays out in another order (``lay_out``), that result where only it carries autograd history (its output
        holds the same memory, handed back with eager's strides)."""
        ref = root.__dict__.get("_tw_laid_out")
        laid_out = ref() if ref is not None else None
        if root._requires_grad or laid_out is None or not laid_out._requires_grad:
            return root
        alias = laid_out.__dict__.get("_tw_alias")
        dense = alias is not None and alias.root is root and _dense_over(alias.geometry, root)
        return laid_out if dense else root

    def _in_eager_format(self, leaf: Tensor, k: int, is_base: bool) -> Node:
        """The value of returned tensor ``k``; one that eager lays out densely in another order than row-major
        (channels-last, a transposed operand's order) is computed in that memory order and handed back with eager's
        strides (its gradient, differentiated from the traced value, comes in in the logical order; see [Note: eager
        strides of traced values] in ``compiler/formats.py``)."""
        value = self.value_of(leaf)
        strides = leaf._strides
        order = S.dense_order(leaf._shape, strides)
        if order is None or is_base or strides == S.contiguous_strides(leaf._shape):
            return value
        self.output_layouts[k] = (leaf._shape, strides)
        if not order or leaf.numel() == 0:  # row-major but for the strides of size-1 dims, or no element to place
            return value
        ty = TensorType(S.permuted(leaf._shape, order), value.type.dtype, value.type.device)
        in_memory_order = self.emit("permute", (value,), (Ref(0), order), ty)
        return self.emit("clone", (in_memory_order,), (Ref(0), None), ty)

    def _input_view(self, leaf: Tensor, flat_args: list) -> OutputView | None:
        """A returned trace tensor that is a view of the memory of a tensor the function was given or holds (see
        [Note: outputs that alias] in function.py); None for any other."""
        alias = leaf.__dict__.get("_tw_alias")
        entry = alias.root if alias is not None else None
        if not isinstance(entry, StorageEntry) or entry.source.kind not in ("arg", "object"):
            return None
        base = entry.source.fetch(flat_args)
        # a view that needs grad where its base does not was written in place by a differentiable value: the
        # program's output carries that history, a view of the base would not
        if leaf._requires_grad and not (base.requires_grad and base._grad_fn is None):
            return None
        return OutputView(entry.source, alias.geometry, leaf._requires_grad)

    def _shared_bases(self, leaves: list) -> dict[int, None]:
        """The root trace tensors that returned views are made over (see [Note: outputs that alias] in function.py):
        one two returned tensors share (one returned with its view, or two views of one), and one a returned view
        covers only part of, or not densely (a slice, a strided or expanded view), which eager returns with the
        root's strides, storage offset and storage. Each is an output, and those views are made over it."""
        count: dict[int, int] = {}
        seen: set[int] = set()
        for leaf in leaves:
            if type(leaf) is not Tensor or leaf._trace is None or id(leaf) in seen:
                continue
            seen.add(id(leaf))
            alias = leaf.__dict__.get("_tw_alias")
            root = alias.root if alias is not None else leaf
            if type(root) is Tensor and root._trace is not None:
                whole = alias is None or _dense_over(alias.geometry, root)
                count[id(root)] = count.get(id(root), 0) + (1 if whole else 2)
        return {root: None for root, n in count.items() if n > 1}

    def _detached_output(self, leaf: Tensor) -> Detached:
        origin = self.origin_of(leaf)
        source = self.arg_sources.get(id(origin)) or Source("object", "detached", obj=origin)
        return Detached(source, leaf._requires_grad)

    def watch_state(self, state: dict) -> None:
        self.states.append((state, {owner: dict(entry) for owner, entry in state.items()}))

    def _state_effects(self, outputs: list, requires: list, returned: dict[int, int]) -> list[StateEffect]:
        """What the function stored into optimizer state (buffers created on a first step): outputs to assign."""
        effects = []
        for state, before in self.states:
            for owner, entry in state.items():
                old = before.get(owner, {})
                for key, value in entry.items():
                    if key in old and old[key] is value:
                        continue
                    if type(value) is Tensor and value._trace is not None and id(value) in returned:
                        effects.append(StateEffect(state, owner, key, output=returned[id(value)]))
                    elif type(value) is Tensor and value._trace is not None:
                        effects.append(StateEffect(state, owner, key, output=len(outputs)))
                        outputs.append(self.value_of(value))
                        requires.append(False)
                    else:
                        effects.append(StateEffect(state, owner, key, value=value))
        return effects

    def _backward(self, differentiable: list, outputs: list) -> BackwardSpec | None:
        """Differentiate the outputs that require grad, by the autograd engine on trace tensors."""
        from tilewise.autograd import grad

        holders = list(self.owners)
        through_base = [source for _, source in self.through_base.values()]
        if not differentiable or not (holders or through_base):
            return None
        tangents = [Node("input", (), (), self.value_of(leaf).type, tag=f"d_out{k}") for k, leaf in differentiable]
        recorded = len(self.body)
        try:
            grads = grad([leaf for _, leaf in differentiable], [h for h, _ in holders],
                         [trace_tensor(t) for t in tangents], retain_graph=True, allow_unused=True) if holders else []
        except RuntimeError:  # the function already ran backward through its outputs: they stay detached
            self.defined.difference_update(self.body[recorded:])
            del self.body[recorded:]
            return None
        n_forward = len(outputs)
        sources = []
        for g, (_, src) in zip(grads, holders):
            if g is not None:
                outputs.append(self.value_of(g))
                sources.append(src)
        return BackwardSpec(tangents, [k for k, _ in differentiable], sources, n_forward, through_base)

    def _grad_effects(self, outputs: list, requires: list, returned: dict[int, int]):
        """How ``.grad`` of each owner changed, and for those that did, whether it was set when traced (a
        gradient that already exists is accumulated into, so the program depends on it). A gradient the function
        also returns is that output (``returned``: id of a returned trace tensor -> its output): one tensor, as
        eager's."""
        effects, presence = [], []
        for owner, source in self.owners:
            original = self.saved_grads[id(owner)][1]
            final = owner._grad
            if final is original:
                continue
            presence.append((source, original is not None))
            if final is None:
                effects.append(GradEffect(source, None, clear=True))
            elif type(final) is Tensor and final._trace is not None and id(final) in returned:
                effects.append(GradEffect(source, returned[id(final)]))
            elif type(final) is Tensor and final._trace is not None:
                effects.append(GradEffect(source, len(outputs)))
                outputs.append(self.value_of(final))
                requires.append(False)
        return effects, presence

    def _grad_of(self, t: Tensor) -> Source | None:
        """Where a real tensor the function returns is found after each call, when it is a parameter's ``.grad``
        (read, or accumulated into in place): the owner's gradient then, not the one this trace saw."""
        for owner, source in self.owners:
            if owner._grad is t:
                return Source("grad", f"{source.label}.grad", owner=source)
        return None

    def restore(self) -> None:
        """Undo what tracing did to Python state; running the program redoes it with real tensors."""
        self.restore_generators()
        for entry in self.entries.values():
            entry.storage.version = entry.version
        for t, grad in self.saved_grads.values():
            t._grad = grad
        for state, before in self.states:
            for owner in [o for o in state if o not in before]:
                del state[owner]
            for owner, entry in before.items():
                state[owner].clear()
                state[owner].update(entry)


def _refresh_history(view: Tensor) -> None:
    """A real view lifted while its memory holds what it held before the call: if autograd will make it afresh from
    its base when it next takes it (its base was written since it was made), that is done now, eagerly, as eager
    would on its first use, so that the trace reads the view's current history (made afresh inside the trace, its
    history would be the trace's)."""
    grad_mode = STATE.grad_enabled
    if grad_mode is False:  # (``None`` while autograd records the operator that reads it: grad mode is on)
        return
    STATE.grad_enabled = True
    try:
        with suspended():
            refresh_view_history(view)
    finally:
        STATE.grad_enabled = grad_mode


def _default_generator():
    from tilewise.ops.creation import default_generator

    return default_generator


def _generator_argument(op, args: tuple):
    """The Generator a random operator's bound arguments name (None: the default one)."""
    names = op.param_names()
    return args[names.index("generator")] if "generator" in names else None


# ---------------------------------------------------------------------------- the Trace backend

def run(op, args: tuple, device):
    """The dispatcher's Trace key: record ``op`` into the active capture and return trace tensors."""
    cap = active()
    if cap.on_operator is not None:
        cap.on_operator()
    if op.kind == "view":
        return cap.view(op, args, device)
    if op.full_name == "_write_":
        return cap.write(args[0], args[1])
    if op.kind == "composite" and op.decomposition is not None:
        return cap.composite(op, args, device)
    return cap.primitive(op, args, device)


register_tracer(run)


def _lay_out(t: Tensor, strides: tuple) -> None:
    """``TRACE_HOOKS.lay_out``: a fresh traced tensor of a factory takes the strides eager gives it."""
    STATE.captures[-1].lay_out(t, strides, reinterpret=True)


def _value_needed(t: Tensor, what: str, required: bool) -> None:
    """Before Python reads a tensor's values (``TRACE_HOOKS.value_needed``): while this thread traces, a real
    tensor's memory may be stale (the trace has not run) and a trace tensor has none, so the capture breaks
    the graph or, where it cannot, an error names the user's line."""
    state = STATE
    if not state.trace_depth:
        if t._trace is not None and required:
            raise RuntimeError(f"{what}: this tensor was made while tilewise.compile traced a function and was kept "
                               "after the trace ended (stored in a list, a global or an attribute); it has no "
                               "values. Return it from the function instead.")
        return
    cap = state.captures[-1]
    if cap.breaks is None:
        if required:
            raise data_dependent_error(what)
        return
    cap.breaks(cap, what)


def _shares_memory(src: Tensor, dst: Tensor) -> None:
    captures = STATE.captures
    if captures:
        captures[-1].copy_alias(src, dst)


def _memory_of(t: Tensor):
    """The storage a traced tensor's memory is on (a real tensor's, through its entry), or its root trace tensor."""
    alias = t.__dict__.get("_tw_alias")
    root = alias.root if alias is not None else t
    return root.storage if isinstance(root, StorageEntry) else root


def _version(t: Tensor) -> int:
    memory = _memory_of(t)
    return memory.version if type(memory) is not Tensor else memory.__dict__.get("_tw_version", 0)


def _bump_version(t: Tensor) -> None:
    """An in-place write through a traced tensor: the version eager would bump is its memory's (a real tensor's
    storage, or the root trace tensor's counter, which its storage takes when a graph break makes it real)."""
    memory = _memory_of(t)
    if type(memory) is Tensor:
        memory.__dict__["_tw_version"] = memory.__dict__.get("_tw_version", 0) + 1
    else:
        memory.version += 1


TRACE_HOOKS.value_needed = _value_needed
TRACE_HOOKS.shares_memory = _shares_memory
TRACE_HOOKS.version = _version
TRACE_HOOKS.bump_version = _bump_version


def _grad_assigned(t: Tensor) -> None:
    """``t.grad = ...`` while this thread traces: what ``.grad`` held before the call is what it holds now, if
    the trace has not seen ``t`` yet (a step that starts with ``p.grad = None`` must not be guarded on None)."""
    if STATE.trace_depth and t._trace is None and t._requires_grad:
        cap = STATE.captures[-1]
        if id(t) not in cap.owner_sources:  # (an owner already: its source is found; a training step's zero_grad)
            cap.add_owner(t, cap.arg_sources.get(id(t)) or cap._source_for(t))


TRACE_HOOKS.grad_assigned = _grad_assigned
TRACE_HOOKS.lay_out = _lay_out


def _grad_read(t: Tensor) -> None:
    """``t.grad`` read while this thread traces: ``t`` owns a gradient the trace may read or return, found again
    through ``t`` on every call (a tensor held only as the gradient the first call saw would go stale)."""
    if STATE.trace_depth and t._trace is None and t._requires_grad:
        cap = STATE.captures[-1]
        cap.add_owner(t, cap.arg_sources.get(id(t)) or cap._owner_source(t) or cap._source_for(t))


def _backward_started(roots, nodes) -> None:
    cap = STATE.captures[-1]
    cap.backward_nodes.update(map(id, nodes))
    # a root the call was given (a loss passed in) or read with its history; not a real tensor made during the call
    # (a function transform's wrapper of traced values, whose history is the call's own)
    if any(type(t) is Tensor and t._trace is None and t._grad_fn is not None
           and (id(t) in cap.arg_sources or any(t is h for h in cap.histories)) for t in roots):
        cap.backward_from_history = True


TRACE_HOOKS.backward_started = _backward_started


def _detached(src: Tensor, out: Tensor) -> None:
    """A real tensor detached while this thread traces: the capture remembers where it came from."""
    if STATE.trace_depth:
        STATE.captures[-1].detached[id(out)] = (out, src)


_CAPTURING = [0]  # captures in progress, all threads: eager detaches pay for the hook only while there are some
_CAPTURING_LOCK = threading.Lock()  # the count is shared by threads that capture at once


@contextlib.contextmanager
def capturing(cap: Capture):
    state = STATE  # this thread's: another thread's operators are never recorded into this capture
    state.captures = (*state.captures, cap)
    state.trace_depth += 1
    with _CAPTURING_LOCK:
        _CAPTURING[0] += 1
        TRACE_HOOKS.detached = _detached
        TRACE_HOOKS.grad_read = _grad_read
    try:
        yield cap
    finally:
        with _CAPTURING_LOCK:
            _CAPTURING[0] -= 1
            if not _CAPTURING[0]:
                TRACE_HOOKS.detached = None
                TRACE_HOOKS.grad_read = None
        state.trace_depth -= 1
        state.captures = state.captures[:-1]


def leaf_labels(fn, args: tuple, kwargs: dict) -> list[str]:
    """A readable name for each flattened argument leaf: the parameter's name, indexed inside containers."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [params[k] if k < len(params) else f"arg{k}" for k in range(len(args))] + list(kwargs)
    labels = []
    for name, value in zip(names, [*args, *kwargs.values()]):
        n = len(flatten(value)[0])
        labels += [name] if n == 1 else [f"{name}[{k}]" for k in range(n)]
    return labels


def trace(fn, args: tuple, kwargs: dict, names: dict[int, str] | None = None,
          known: list[Tensor] = (), states: list[dict] = ()) -> Traced:
    """Run ``fn(*args, **kwargs)`` on trace tensors and return the recorded graph with its bindings.

    ``names`` labels captured tensors (by id) in the printed graph; ``known`` lists tensors the function
    may touch without an operator seeing them (module parameters: ``zero_grad`` only assigns ``.grad``);
    ``states`` are optimizer state tables the function may fill (a first step creates momentum buffers).
    """
    flat, _ = flatten((list(args), kwargs))
    cap = start(fn, args, kwargs, names, known, states)
    try:
        with capturing(cap):
            result = fn(*args, **kwargs)
            return cap.finish(result, flat)
    finally:
        cap.restore()


def start(fn, args: tuple, kwargs: dict, names: dict[int, str] | None = None, known: list[Tensor] = (),
          states: list[dict] = (), numbers: dict | None = None) -> Capture:
    """A capture ready to record a call of ``fn`` on these arguments (see ``trace``); ``numbers`` maps the ids of
    the 0-dim tensors dynamic numbers stand for to their sources (see compiler/numbers.py)."""
    flat, _ = flatten((list(args), kwargs))
    labels = leaf_labels(fn, args, kwargs)
    cap = Capture(names)
    cap.arg_sources.update(numbers or {})
    for t in known:
        cap.add_owner(t, Source("object", cap.names.get(id(t), "captured"), obj=t))
    for state in states:
        cap.watch_state(state)
    for i, leaf in enumerate(flat):
        if type(leaf) is Tensor:
            cap.argument(i, leaf, labels[i])
    return cap


def trace_decomposition(node: Node, keep=None) -> tuple[Node | None, ...]:
    """Re-trace a composite node's decomposition over its operands; return the node(s) it computes (the
    new nodes reach the graph through them: the rewrite that uses them collects their dependencies). Composites
    it calls are inlined too, but for those ``keep(op name, bound args)`` accepts."""
    op = node.opdef
    origin = node.tag if type(node.tag) is int else 0  # a random composite: its draws start there
    return retrace(lambda *operands: op.decomposition(*node.bound_args(operands)), node.srcs, keep, origin)


def retrace(fn, srcs, keep=None, rng_origin: int = 0) -> tuple[Node | None, ...]:
    """The node(s) ``fn`` computes when called on trace tensors standing for ``srcs``: how a pass builds new
    nodes with the operators' own argument rules and result types rather than by hand. Composites are
    inlined (but those ``keep`` accepts); it runs without grad and below autocast, as a decomposition does.
    Random draws are named from ``rng_origin`` on (see [Note: random draws in a trace])."""
    from tilewise.amp.autocast_mode import suspended as autocast_suspended
    from tilewise.autograd.grad_mode import no_grad

    cap = Capture(inline_composites=True, keep=keep, rng_origin=rng_origin)
    operands = [trace_tensor(s) for s in srcs]
    try:
        with capturing(cap), no_grad(), autocast_suspended():
            out = fn(*operands)
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return tuple(cap.value_of(o) if o is not None else None for o in outs)
    finally:
        cap.restore_generators()
