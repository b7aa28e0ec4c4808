"""Eager backward passes replayed as compiled programs: ``tilewise.autograd.compiled_backward``.

[Note: compiled backward] An eager training step records the same autograd graph on every step: the same
operators, shapes and wiring, with new tensors saved in it. The engine interprets that graph node by node, a
Python call (formula, dispatch, kernel launch) per operator of the backward, which makes the eager backward
host-bound on a GPU (a GPT-2 124M backward: 39 ms of host time against torch's 11). With compiled backward on,
``backward()`` first describes the graph it is given: per node in a fixed walk order, its operator, the
(shape, dtype, device) of its inputs and outputs, its edges as walk positions, and what it saved (tensors by
position in one flat list, with their layouts; everything else by value). A description seen before is the key
of a compiled function: its *replay* runs the engine's own algorithm (the same ready stack, the same order of
gradient sums, the operators' own derivative formulas through ``OpNode.apply``) over the description, on the flat
tensors, and returns the gradient each leaf receives. ``tilewise.compile`` of the replay fuses the backward into
generated kernels; the leaves then take their gradients through ``AccumulateGrad.accumulate`` as the engine would
give them, and the saved tensors are released unless ``retain_graph``.

Only what the engine would do without calling back into Python is replayed: a graph whose nodes are all
operator nodes and leaf accumulators, with no hooks on any node or leaf, no retained gradients, no saved-tensor
hooks, no anomaly mode, no profiler, no ``create_graph``, ``inputs`` or ``autograd.grad``, outside ``compile``,
vmap and forward AD. Anything else, and a saved tensor modified in place since it was saved (the engine raises
torch's error for it), runs through the engine. A description is compiled on its second sighting (a graph built
once is not worth a compile), and one whose compile gives up runs through the engine from then on. Results agree
with the engine's to the compiler's tolerances (the fused kernels keep intermediates in registers, at float32).

[Note: donated saved tensors] The engine frees each node's saved tensors as soon as the node has run, so the
memory of a backward falls as it goes: the activations of the last layers are gone by the time the large gradients
of the first layers are made. A replay holds its arguments until it returns, so its intermediates would need an
arena of their own on top of every saved activation (a ResNet-50 bf16 backward: 1.68 GiB more at its peak). Where
nothing outside the graph can reach a saved tensor's memory, the replay may reuse it instead: the compiled program
places intermediates in the memory of such an argument after its last read (see [Note: donated inputs] in
``compiler/lowering/memory.py``), as the engine's caching allocator would have reused the freed block. Nothing
outside the graph can reach it when the tensor is referenced only by the graph's saved values (and the replay's own
list), is the only tensor on its storage, and its storage's memory is its own (a plain device block, or a NumPy
array that owns its data, viewed only through the tensor's own cached array): reference counts tell all three
exactly, so a user's reference, a view, a ``.numpy()`` array or a DLPack export keeps a tensor intact. Which
arguments are donated is part of the description, so each set compiles its own plan. ``retain_graph`` donates
nothing; ``TILEWISE_DONATE_SAVED=0`` (``settings.donate_saved``) turns donation off. A replay that fails after a
program wrote into donated memory cannot fall back to the engine (the saved tensors may be overwritten): it raises.

On CUDA a replay launches one CUDA graph where a step's memory lies where an earlier step's did: its programs are
built ``graphs_in_place`` (see [Note: graphs in place] in ``compiler/program_cuda.py``), keyed by the addresses of
the saved activations, the gradients and the arena, never copying them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from sys import getrefcount

import numpy as np

from tilewise.autograd import engine
from tilewise.autograd.graph import AccumulateGrad, OpNode, SavedTensor
from tilewise.compiler.capture import signature
from tilewise.config import settings
from tilewise.dispatch import STATE
from tilewise.storage import Storage
from tilewise.tensor import Tensor

SEEN_LIMIT = 64  # descriptions remembered (compiled or counted); the least recently used is forgotten
ARENA_KEEP = {"cuda": 16 << 20}  # intermediates above this are allocated per call (see [Note: transient arenas])

_lock = threading.Lock()
_seen: OrderedDict = OrderedDict()  # description -> [sightings, compiled function or None (given up)]
stats = {"compiled": 0, "replayed": 0, "eager": 0}  # counters the tests and benchmarks read


class _Unsupported(Exception):  # noqa: N818 — not an error: the engine runs this graph
    pass


def _saved_value(value, flat: list, index: dict, holders: list):
    """The description of one saved value: a tensor as ("t", position, layout), a tuple of optional tensors
    element by element, anything else as (type, value)."""
    if type(value) is SavedTensor:
        t = value.tensor
        if t is None or value.unpack_hook is not None or t._version != value.version:
            raise _Unsupported  # freed, packed by a hook, or modified in place: the engine says what is wrong
        return _tensor_position(t, flat, index, holders)
    if type(value) is tuple and any(type(v) is SavedTensor for v in value):
        return ("l", tuple(_saved_value(v, flat, index, holders) for v in value))
    if type(value) is Tensor:
        return _tensor_position(value, flat, index, holders)
    hash(value)  # unhashable: TypeError, and the engine runs it
    return (type(value), value)


def _tensor_position(t: Tensor, flat: list, index: dict, holders: list, saved: bool = True) -> tuple:
    """``saved``: a saved value holds one more reference to ``t`` (else a root gradient: the caller's)."""
    k = index.get(id(t))
    if k is None:
        k = index[id(t)] = len(flat)
        flat.append(t)
        holders.append(0)
    holders[k] = holders[k] + 1 if saved and holders[k] >= 0 else -1
    return ("t", k, signature(t), t._requires_grad)


def describe(root_edges: list, grad_tensors) -> tuple:
    """(description, flat tensors, the graph's references to each, live accumulators, live operator nodes) of the
    graph below ``root_edges``; raises _Unsupported where the engine must run it."""
    position: dict = {}
    order: list = []
    stack = [node for node, _ in reversed(root_edges)]
    while stack:
        node = stack.pop()
        if node in position:
            continue
        position[node] = len(order)
        order.append(node)
        for nxt, _ in reversed(node.next_functions):
            if nxt is not None and nxt not in position:
                stack.append(nxt)
    flat: list = []
    holders: list = []  # per flat tensor: the references the graph's saved values hold to it (-1: not the graph's)
    index: dict = {}
    parts = []
    accumulators, op_nodes = [], []
    for node in order:
        if node.pre_hooks or node.retained:
            raise _Unsupported
        kind = type(node)
        if kind is AccumulateGrad:
            v = node.variable
            if v._hooks or v.__dict__.get("_post_accumulate_grad_hooks"):
                raise _Unsupported
            accumulators.append(node)
            parts.append(("acc", v._shape))
            continue
        if kind is not OpNode:
            raise _Unsupported
        op_nodes.append(node)
        saved = []
        for name, value in node.saved.items():
            if type(value) is SavedTensor:  # the common case inline: a tensor saved as it was
                t = value.tensor
                storage = t._storage if t is not None else None
                if (storage is None or value.unpack_hook is not None
                        or storage.version - storage.untracked != value.version):
                    raise _Unsupported  # freed, packed by a hook, modified in place: the engine says what is wrong
                k = index.get(id(t))
                if k is None:
                    k = index[id(t)] = len(flat)
                    flat.append(t)
                    holders.append(0)
                if holders[k] >= 0:
                    holders[k] += 1
                saved.append((name, ("t", k, signature(t), t._requires_grad)))
            else:
                saved.append((name, _saved_value(value, flat, index, holders)))
        edges = tuple([(-1, 0) if nxt is None else (position[nxt], nr) for nxt, nr in node.next_functions])
        parts.append((node.op, node.slots, tuple(node.input_meta), tuple(node.output_meta), edges,
                      tuple(node.shapes.items()), tuple(saved)))
    roots = []
    for (node, nr), g in zip(root_edges, grad_tensors):
        if type(g) is not Tensor:
            raise _Unsupported
        roots.append((position[node], nr, _tensor_position(g, flat, index, holders, saved=False)))
    return (tuple(parts), tuple(roots)), flat, holders, accumulators, op_nodes


def _donatable(flat: list, holders: list) -> frozenset[int]:
    """The positions of the flat tensors whose memory nothing but the graph can reach: referenced only by the
    graph's saved values and ``flat``, the only tensor on its storage, its storage's memory its own (see
    [Note: donated saved tensors]). Each count below includes the reference of a local name and of
    getrefcount's argument."""
    out = []
    for k in range(len(flat)):
        t = flat[k]
        if holders[k] <= 0 or getrefcount(t) != holders[k] + 3:  # the saved values' and ``flat``'s
            continue
        storage = t._storage
        if type(storage) is not Storage or storage.__dict__ or getrefcount(storage) != 3:  # ``t._storage``
            continue
        data = storage.data
        if type(data) is np.ndarray:
            owner = data if data.base is None else data.base  # (numpy makes every view's base the owner)
            view = t._array  # a tensor's cached array: the owner itself (``t._array`` and ``view``), or a view of it
            views = 0 if view is None else 2 if view is owner else 1 if view.base is owner else -1
            if (type(owner) is not np.ndarray or not owner.flags.owndata or views < 0
                    or (owner is data and getrefcount(data) != 4 + views)  # ``storage.data``, ``owner``
                    or (owner is not data and (getrefcount(data) != 3 or getrefcount(owner) != 3 + views))):
                continue  # (``data.base``, ``owner``)
        else:
            from tilewise.backends.cuda.device_memory import DeviceBuffer  # (a device tensor: its backend is loaded)

            if type(data) is not DeviceBuffer or getrefcount(data) != 3:  # ``storage.data``
                continue
        out.append(k)
    return frozenset(out)


def _donating_runs(fn) -> int:
    """How many times ``fn``'s programs that write into donated memory have run."""
    return sum(getattr(p.runtime, "calls", 0) for p in fn.programs()
               if any(b.kind == "donated" for b in p.plan.buffers))


def _resolved(desc, tensors: tuple):
    if desc[0] == "t":
        return tensors[desc[1]]
    if desc[0] == "l":
        return tuple(_resolved(d, tensors) for d in desc[1])
    return desc[1]


def _replay_function(description: tuple, produced: list):
    """The engine's loop over ``description``, as a function of the flat tensors; it returns the gradients of
    the accumulators that receive one, and records which (``produced``, filled as it is traced)."""
    parts, roots = description
    accumulator_of = {}
    for k, part in enumerate(parts):
        if part[0] == "acc":
            accumulator_of[k] = len(accumulator_of)

    def replay(*tensors):
        deps: dict[int, int] = {}
        for part in parts:
            if part[0] != "acc":
                for nxt, _ in part[4]:
                    if nxt >= 0:
                        deps[nxt] = deps.get(nxt, 0) + 1
        buffers: dict[int, list] = {}
        for k, nr, g in roots:
            buf = buffers.setdefault(k, [None] * _outputs(parts[k]))
            g = tensors[g[1]]
            buf[nr] = g if buf[nr] is None else buf[nr] + g
        ready = [k for k in dict.fromkeys(k for k, _, _ in roots) if deps.get(k, 0) == 0]
        grads_out: dict[int, Tensor] = {}
        while ready:
            k = ready.pop()
            part = parts[k]
            grads = buffers.pop(k, None) or [None] * _outputs(part)
            if part[0] == "acc":
                g = grads[0]
                if g is not None:
                    grads_out[accumulator_of[k]] = g if g._shape == part[1] else g.sum_to_size(part[1])
                continue
            op, slots, input_meta, output_meta, edges, shapes, saved = part
            node = OpNode(op, slots, (), list(input_meta), list(output_meta))
            node.saved = {name: _resolved(value, tensors) for name, value in saved}
            if shapes:
                node.shapes = dict(shapes)
            in_grads = node.apply(grads)
            for (nxt, nr), g in zip(edges, in_grads):
                if nxt < 0:
                    continue
                if g is not None:
                    buf = buffers.setdefault(nxt, [None] * _outputs(parts[nxt]))
                    buf[nr] = g if buf[nr] is None else buf[nr] + g
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    ready.append(nxt)
        produced[:] = sorted(grads_out)
        return tuple(grads_out[j] for j in produced)

    replay.__name__ = replay.__qualname__ = "backward"
    return replay


def _outputs(part) -> int:
    return 1 if part[0] == "acc" else max(len(part[3]), 1)


def _compiled(key: tuple):
    from tilewise.compiler.function import compile as compile_fn

    description, donated = key
    produced: list = []
    fn = compile_fn(_replay_function(description, produced))
    fn.arena_keep = ARENA_KEEP
    fn.graphs_in_place = True  # its arguments are the saved activations: read where they lie, never copied
    fn.donated = donated
    return fn, produced


def run(root_edges: list, grad_tensors, retain_graph: bool) -> bool:
    """Run the backward of ``root_edges`` as a compiled replay (see the note); False where the engine must run
    it (nothing has been changed then)."""
    try:
        description, flat, holders, accumulators, op_nodes = describe(root_edges, grad_tensors)
        hash(description)
    except (_Unsupported, TypeError, AttributeError):  # AttributeError: a tensor without storage (no layout)
        stats["eager"] += 1
        return False
    donated = frozenset() if retain_graph or not settings.donate_saved else _donatable(flat, holders)
    description = (description, donated)
    with _lock:
        entry = _seen.get(description)
        if entry is None:
            _seen[description] = [1, None]
            while len(_seen) > SEEN_LIMIT:
                _seen.popitem(last=False)
            stats["eager"] += 1
            return False
        _seen.move_to_end(description)
        if entry[0] == 1:
            entry[0] = 2
            entry[1] = _compiled(description)
            stats["compiled"] += 1
    if entry[1] is None:
        stats["eager"] += 1
        return False
    fn, produced = entry[1]
    prev_mode, prev_autocast = STATE.grad_enabled, STATE.autocast
    STATE.grad_enabled, STATE.autocast = False, None  # as the engine runs formulas without create_graph
    runs = _donating_runs(fn) if donated else 0
    try:
        grads = list(fn(*flat))
    except Exception as exc:  # the engine runs it and raises what is wrong in the user's terms
        entry[1] = None
        if donated and _donating_runs(fn) != runs:  # a program ran and may have written over saved tensors
            raise RuntimeError("compiled backward failed while running, after it may have reused the memory of "
                               "the graph's saved tensors: the graph cannot be run again (the error is below; "
                               "tilewise.autograd.compiled_backward(False) runs backward through the engine)") from exc
        stats["eager"] += 1
        return False
    finally:
        STATE.grad_enabled, STATE.autocast = prev_mode, prev_autocast
    if fn.eager_reason is not None:  # the compiler gave up: the replay ran eagerly, later calls take the engine
        entry[1] = None
    stats["replayed"] += 1
    flat = None
    for j, k in enumerate(produced):
        g, grads[j] = grads[j], None  # held by ``g`` alone, as the engine holds it (see AccumulateGrad.accumulate)
        accumulators[k].accumulate(g, False)
        g = None
    if not retain_graph:
        for node in op_nodes:
            node.release()
    return True


engine.register_graph_runner(run)
