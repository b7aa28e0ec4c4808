"""The compiler's graph IR: SSA values over logical tensors, hash-consed, printable, checkable.

[Note: graph IR] A ``Node`` is one operator application: the operator's full name (``add``, ``sum``,
``view``, ``mm``, or one of the IR's own ops ``input``, ``getitem``, ``fused``), its tensor operands
(``srcs``, other Nodes), its remaining bound arguments (``args``, in schema order, with each tensor
position replaced by a ``Ref`` into ``srcs``) and its result type (shape, dtype, device). Values are
*logical* tensors: a view node such as ``permute`` or ``as_strided`` describes which elements it selects
from its source's row-major layout; where a value lives in memory is decided much later, by memory
planning and lowering. Nodes are hash-consed like tinygrad's UOps: building a node equal to an existing
one returns that object, so common-subexpression elimination happens by construction, equality is
identity and nodes serve as cache keys. Nodes that must stay distinct although they look alike (two
inputs, two random draws) carry a distinguishing ``tag``.

A ``Graph`` is a straight-line SSA program: its inputs (one per captured storage), a body in
definition order, the values it returns, and write-backs (``writes``: an input whose memory must hold a
new value once the program has run — how in-place updates of parameters and optimizer state survive
functionalization). ``verify`` checks the invariants; the pipeline runs it after every pass under
``TILEWISE_VERIFY=1`` (``checked``; the test suite sets it). ``format_graph`` prints the text form, e.g.
``%3 = add(%2, 1.0) : f32[4096,4096] cpu``.
"""

from __future__ import annotations

import weakref
from _weakref import _remove_dead_weakref
from dataclasses import dataclass, field
from functools import partial
from numbers import Number

from tilewise import strides as S
from tilewise.device import Device
from tilewise.dtypes import DType

SHORT_DTYPE = {"bool": "b8", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
               "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
               "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}
IR_OPS = ("input", "getitem", "fused")


class GraphError(RuntimeError):
    """A graph that breaks an IR invariant (raised by ``verify``, naming the node and the pass)."""


class TensorType:
    """A graph value's type: its logical shape, dtype and device; equal and hashed by value, and never changed once
    made (as a node). A plain class rather than a frozen dataclass: a compile makes one for nearly every node and
    hashes it into the node's key, and the dataclass's ``__init__`` (a call per field) cost three times as much,
    its ``__hash__`` (a tuple per call) twice."""

    __slots__ = ("shape", "dtype", "device", "_hash")

    def __init__(self, shape: tuple[int, ...], dtype: DType, device: Device):
        self.shape, self.dtype, self.device, self._hash = shape, dtype, device, None

    def __eq__(self, other) -> bool:
        if other.__class__ is not TensorType:
            return NotImplemented
        return self is other or (self.shape == other.shape and self.dtype == other.dtype and
                                 self.device == other.device)

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash((self.shape, self.dtype, self.device))
        return h

    def __reduce__(self):
        return (TensorType, (self.shape, self.dtype, self.device))

    def __repr__(self) -> str:
        return f"TensorType(shape={self.shape!r}, dtype={self.dtype!r}, device={self.device!r})"

    @property
    def numel(self) -> int:
        return S.numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{SHORT_DTYPE.get(self.dtype.name, self.dtype.name)}[{','.join(map(str, self.shape))}] {self.device}"


class Ref:
    """Marks a tensor operand inside ``Node.args``: the ``i``-th entry of ``Node.srcs``."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __eq__(self, other) -> bool:
        return type(other) is Ref and other.i == self.i

    def __hash__(self) -> int:
        return hash(("Ref", self.i))

    def __repr__(self) -> str:
        return f"Ref({self.i})"


_ATOMS = {int: "int", bool: "bool", str: "str", type(None): "NoneType"}


def _freeze(value):
    """A hashable key for an argument that tells apart values Python considers equal (1, 1.0, True, -0.0)."""
    kind = _ATOMS.get(type(value))  # the common arguments first, by exact type (a node is made for every op)
    if kind is not None:
        return (kind, value)
    if type(value) is Ref:
        return ("Ref", value.i)  # hashed in C, not by Ref.__hash__
    if type(value) is tuple:
        return ("tuple", _freeze_items(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, _freeze_items(value))
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (bool, int, str, type(None), Ref, Number)):
        return (type(value).__name__, value)
    if isinstance(value, (DType, Device)):
        return (type(value).__name__, value)
    return ("object", id(value), value)


def _freeze_items(values) -> tuple:
    """``_freeze`` of each item, the common kinds without a call (every node's arguments are such a tuple)."""
    out = []
    for v in values:
        kind = _ATOMS.get(type(v))
        if kind is not None:
            out.append((kind, v))
        elif type(v) is Ref:
            out.append(("Ref", v.i))
        else:
            out.append(_freeze(v))
    return tuple(out)


_KINDS: dict[str, str] = {}  # operator name -> kind: passes ask for a node's kind millions of times a compile
_OPS: list = []


def _registry() -> dict:
    """The operator registry (imported at first use: the registry's modules import the compiler's)."""
    if not _OPS:
        from tilewise.ops.registry import OPS

        _OPS.append(OPS)
    return _OPS[0]


def _kind_of(op: str) -> str:
    kind = _KINDS.get(op)
    if kind is None:
        if op in IR_OPS:
            kind = op
        else:
            opdef = _registry().get(op)
            kind = opdef.kind if opdef is not None else "unknown"
        _KINDS[op] = kind
    return kind


class Node:
    """One immutable, hash-consed SSA value (see [Note: graph IR]).

    A compile makes tens of thousands of nodes, over half of them again: every pass rebuilds the users of what it
    replaced (``replace``). A node keeps its arguments' part of the cache key (``args_key``, which ``_freeze``
    makes), so a rebuilt node does not make it again. ``facts`` holds what a pass derived from the node alone
    (``fusion_kind``): a node never changes, so neither does what follows from it. ``kind`` is its operator's
    (pointwise, reduction, view, ...; the IR's own ops are their own kind), which passes ask for millions of
    times a compile."""

    __slots__ = ("op", "srcs", "args", "type", "tag", "args_key", "facts", "kind", "__weakref__")

    def __new__(cls, op: str, srcs: tuple = (), args: tuple = (), type=None, tag=None):
        if args.__class__ is tuple:
            return cls._made(op, tuple(srcs), args, _freeze(args), type, tag)
        return cls._made(op, tuple(srcs), tuple(args), _freeze(args), type, tag, _freeze(tuple(args)))

    @classmethod
    def _made(cls, op: str, srcs: tuple, args: tuple, args_key: tuple, type, tag, kept_key=None) -> Node:
        """The node of these parts, ``args_key`` being ``_freeze``'s key of the arguments as given (a list of them
        keys apart from the same tuple, as it always has); ``kept_key``, that of ``args`` as the node keeps them."""
        key = (op, tuple(map(id, srcs)), args_key, type, None if tag is None else _freeze(tag))
        ref = _NODES.get(key)
        node = ref() if ref is not None else None
        if node is None:
            node = object.__new__(cls)
            node.op, node.srcs, node.args, node.type, node.tag = op, srcs, args, type, tag
            node.args_key = args_key if kept_key is None else kept_key
            node.facts = {}
            node.kind = _KINDS.get(op) or _kind_of(op)
            _NODES[key] = weakref.ref(node, partial(_forget, key))
        return node

    @property
    def opdef(self):
        return _registry().get(self.op)

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.type, tuple)

    def replace(self, srcs: tuple | None = None, args: tuple | None = None, type=None) -> Node:
        if args is not None:
            return Node(self.op, self.srcs if srcs is None else srcs, args, self.type if type is None else type,
                        self.tag)
        return Node._made(self.op, self.srcs if srcs is None else tuple(srcs), self.args, self.args_key,
                          self.type if type is None else type, self.tag)

    def bound_args(self, values: list | tuple) -> tuple:
        """``args`` with every ``Ref`` replaced by the corresponding entry of ``values``."""
        return tuple(_substitute(a, values) for a in self.args)

    def __repr__(self) -> str:
        return f"<Node {self.op} : {format_type(self.type)}>"


# the nodes alive, by their parts (``Node._made``'s key, which holds its sources by id: a node keeps its sources
# alive, so no other object takes their ids while it is here): weak references in a plain dict, which C reads and
# writes (a WeakValueDictionary's get and set are Python calls, and a compile makes a node for every operator)
_NODES: dict[tuple, weakref.ref] = {}


def _forget(key: tuple, ref: weakref.ref) -> None:
    """A node died: its key leaves ``_NODES``, unless a node made since holds it (checked and removed in one C call,
    as WeakValueDictionary does, so that a thread making that node meanwhile keeps it)."""
    _remove_dead_weakref(_NODES, key)


def _substitute(arg, values):
    if type(arg) is Ref:
        return values[arg.i]
    if isinstance(arg, tuple) and any(type(a) is Ref for a in arg):
        return tuple(values[a.i] if type(a) is Ref else a for a in arg)
    return arg


def format_type(t) -> str:
    if isinstance(t, tuple):
        return "(" + ", ".join(str(x) for x in t) + ")"
    return str(t)


# ---------------------------------------------------------------------------- graphs

@dataclass
class Graph:
    inputs: list[Node] = field(default_factory=list)
    body: list[Node] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
    writes: list[tuple[Node, Node]] = field(default_factory=list)  # (input, value it must hold afterwards)

    def roots(self) -> list[Node]:
        return list(self.outputs) + [v for _, v in self.writes]

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in (*self.inputs, *self.body)}
        for n in self.body:
            for s in n.srcs:
                out[s].append(n)
        return out

    def __str__(self) -> str:
        return format_graph(self)


def toposort(roots: list[Node], stop: frozenset | set = frozenset(), sources=None) -> list[Node]:
    """Nodes reachable from ``roots`` (excluding ``stop``), each after its sources; roots keep their order.
    ``sources(node)``, if given, says what a node depends on instead of its ``srcs``. A depth-first walk that keeps,
    for each node on its path, where it is in the node's sources: every pass ends with one over the whole graph."""
    order, seen = [], set(stop)
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        deps = root.srcs if sources is None else sources(root)
        for dep in deps:
            if dep not in seen:
                break
        else:  # the usual root (a pass's body is mostly in order already): placed at once
            order.append(root)
            continue
        path = [(root, iter(deps))]
        while path:
            node, deps = path[-1]
            for dep in deps:
                if dep not in seen:
                    seen.add(dep)
                    path.append((dep, iter(dep.srcs if sources is None else sources(dep))))
                    break
            else:
                path.pop()
                order.append(node)
    return order


def in_program_order(nodes: list[Node], graph: Graph) -> list[Node]:
    """The nodes ``graph``'s outputs and writes need, each after its sources, in the order of ``nodes`` (the
    order the function ran them in). Ordered from the outputs instead, whatever only a later output needs (a
    batch norm's weight gradient, read by the optimizer's last updates) would run last and keep what it reads
    alive through the whole backward."""
    live = set(toposort(graph.roots(), stop=set(graph.inputs)))
    return [n for n in toposort(nodes, stop=set(graph.inputs)) if n in live]


def rewrite(graph: Graph, fn, rebuilt=None) -> Graph:
    """Rebuild ``graph`` bottom-up: each node gets its rewritten sources, then ``fn(node)`` may replace it
    (returning None keeps it). New nodes that ``fn`` builds join the body in dependency order. ``rebuilt(old,
    new)``, if given, hears of each node rebuilt only because its sources were (what a pass knows of ``old``
    it may then know of ``new``)."""
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}
    for node in graph.body:
        srcs = tuple([mapping[s] for s in node.srcs])
        new = node.replace(srcs=srcs) if srcs != node.srcs else node
        if rebuilt is not None and new is not node:
            rebuilt(node, new)
        mapping[node] = fn(new) or new
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    out.body = toposort([mapping[n] for n in graph.body], stop=set(graph.inputs))
    return out


# ---------------------------------------------------------------------------- text form

def node_names(graph: Graph) -> dict[Node, str]:
    names = {}
    for k, n in enumerate([*graph.inputs, *graph.body]):
        names.setdefault(n, f"%{k}")
    return names


def _format_value(value, srcs, names) -> str:
    if type(value) is Ref:
        return names.get(srcs[value.i], "%?")
    if isinstance(value, tuple):
        inner = ", ".join(_format_value(v, srcs, names) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, DType):
        return value.name
    if isinstance(value, Device):
        return f"'{value}'"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (Number, type(None))):
        return repr(value)
    return type(value).__name__


def format_args(node: Node, names: dict) -> str:
    opdef = node.opdef
    if opdef is None or len(opdef.schema.params) != len(node.args):
        return ", ".join(_format_value(a, node.srcs, names) for a in node.args)
    params = opdef.schema.params
    last = len(params)
    while last > 0 and params[last - 1].has_default and _is_default(node.args[last - 1], params[last - 1].default):
        last -= 1
    parts = []
    for k in range(last):
        p, a = params[k], node.args[k]
        if p.kwarg_only:
            if not (p.has_default and _is_default(a, p.default)):
                parts.append(f"{p.name}={_format_value(a, node.srcs, names)}")
        else:
            parts.append(_format_value(a, node.srcs, names))
    return ", ".join(parts)


def _is_default(value, default) -> bool:
    return type(value) is not Ref and _freeze(value) == _freeze(default) or (value is None and default is None)


def format_node(node: Node, names: dict) -> str:
    if node.op == "input":
        label = node.tag if isinstance(node.tag, str) else node.tag[0] if isinstance(node.tag, tuple) else node.tag
        return f"{names[node]} = input({label}) : {format_type(node.type)}"
    if node.op == "getitem":
        return f"{names[node]} = getitem({names.get(node.srcs[0], '%?')}, {node.args[0]}) : {format_type(node.type)}"
    if node.op == "fused":
        group = node.args[0]
        srcs = ", ".join(names.get(s, "%?") for s in node.srcs)
        return f"{names[node]} = {group.name}({srcs}) : {format_type(node.type)}"
    return f"{names[node]} = {node.op}({format_args(node, names)}) : {format_type(node.type)}"


def format_graph(graph: Graph, title: str = "graph") -> str:
    names = node_names(graph)
    head = f"graph({', '.join(names[i] for i in graph.inputs)}):"
    lines = [head if title == "graph" else f"{title}: {head}"]
    lines += ["  " + format_node(n, names) for n in graph.inputs]
    lines += ["  " + format_node(n, names) for n in graph.body]
    lines.append("  return (" + ", ".join(names.get(o, "%?") for o in graph.outputs) + ")")
    lines += [f"  write {names[i]} <- {names.get(v, '%?')}" for i, v in graph.writes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- invariants

def checked(graph: Graph, after: str) -> Graph:
    """:func:`verify` when ``settings.verify`` is on (``TILEWISE_VERIFY=1``: the test suite runs every pass
    under it); else ``graph`` as it is, as the checks cost a tenth of a large graph's compile."""
    from tilewise.config import settings

    return verify(graph, after) if settings.verify else graph


def verify(graph: Graph, after: str = "") -> Graph:
    """Check the IR invariants; raise ``GraphError`` naming the first offending node."""
    where = f" after pass {after!r}" if after else ""
    defined: set[Node] = set()
    for n in graph.inputs:
        if n.op != "input":
            raise GraphError(f"graph input {n!r} is not an input node{where}")
        defined.add(n)
    names = node_names(graph)
    for n in graph.body:
        if n in defined:
            raise GraphError(f"{format_node(n, names)} is defined twice{where}")
        for s in n.srcs:
            if s not in defined:
                raise GraphError(f"{format_node(n, names)} uses a value that is not defined before it{where}")
        problem = _check_node(n)
        if problem:
            raise GraphError(f"{format_node(n, names)}: {problem}{where}")
        defined.add(n)
    for o in graph.outputs:
        if o not in defined:
            raise GraphError(f"an output ({o!r}) is not defined in the graph{where}")
    for i, v in graph.writes:
        if i not in graph.inputs or v not in defined:
            raise GraphError(f"write-back {i!r} <- {v!r} names a value outside the graph{where}")
        if i.type != v.type:
            raise GraphError(f"write-back into {names[i]} ({i.type}) has type {format_type(v.type)}{where}")
    return graph


def _check_node(n: Node) -> str | None:
    if n.op == "input":
        return "input nodes belong in graph.inputs"
    if n.op == "getitem":
        (k,) = n.args
        if not n.srcs[0].is_tuple or not 0 <= k < len(n.srcs[0].type) or n.srcs[0].type[k] != n.type:
            return f"getitem {k} does not match the tuple type {format_type(n.srcs[0].type)}"
        return None
    if n.op == "fused":
        return None
    opdef = n.opdef
    if opdef is None:
        return f"unknown operator {n.op!r}"
    if len(n.args) != len(opdef.schema.params):
        return f"{len(n.args)} arguments for a schema with {len(opdef.schema.params)}"
    refs = _refs(n.args)
    if sorted(refs) != list(range(len(n.srcs))):
        return "srcs and the Refs in args disagree"
    if opdef.kind == "pointwise":
        shapes = [n.srcs[r].type.shape for r in refs]
        try:
            expected = S.broadcast_shapes(*shapes, op=n.op) if shapes else None
        except RuntimeError as exc:
            return str(exc)
        if expected is not None and expected != n.type.shape:
            return f"pointwise result shape {list(n.type.shape)} is not the broadcast shape {list(expected)}"
    if opdef.kind == "view":
        src = n.srcs[0].type
        shape, _, _ = opdef.view(src.shape, S.contiguous_strides(src.shape), 0, *n.args[1:])
        if tuple(shape) != n.type.shape:
            return f"view result shape {list(n.type.shape)} differs from the view rule's {list(shape)}"
    return None


def _refs(args) -> list[int]:
    out = []
    for a in args:
        if type(a) is Ref:
            out.append(a.i)
        elif isinstance(a, tuple):
            out += [x.i for x in a if type(x) is Ref]
    return out
