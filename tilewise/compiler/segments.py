"""Segmented calls: a compiled function whose Python runs on every call, its operators compiled between breaks.

[Note: segmented calls] A variant replays one trace, which is right only for a function whose call has no
effects beyond its tensors. A function that prints, appends to a list, counts its calls, reads a tensor's
value into Python (``.item()``, ``if loss > 0``, ``print(loss)``) or calls an operator whose result's shape
depends on values cannot be replayed; torch.compile splits such a function at a *graph break* and runs the
Python between the pieces. Here the function's Python runs on every call, as in eager, while the capture
records its operators instead of running them (the tensors it makes are trace tensors, as in a trace). When
Python needs values — a break — or the function returns, ``Segments.sync`` runs what was recorded since the
last sync as one compiled program and turns every trace tensor still alive into a real tensor in place:
its own new memory, or a view of a real tensor's storage (written back by the program) or of another
materialised tensor; version counters carry over. Programs are cached by the recorded graph's structure
(hash-consed nodes make it a tuple of objects), so a second call that records the same operators compiles
nothing. Autograd records on the same tensors as it does eagerly, so a backward after the call runs
eagerly over the segments' saved values. The price is the Python of the function and the recording on
every call; a function with no breaks and no side effects stays a replayed variant.
"""

from __future__ import annotations

import warnings

from tilewise import strides as S
from tilewise._stages import stage
from tilewise.compiler.capture import Capture, StorageEntry
from tilewise.compiler.ir import Graph
from tilewise.compiler.meta import suspended
from tilewise.config import log
from tilewise.dispatch import STATE
from tilewise.storage import Storage
from tilewise.tensor import Tensor


class Segments:
    """The programs of one compiled function's segments, keyed by what each segment recorded."""

    def __init__(self, name: str, build) -> None:
        self.name = name
        self.build = build  # Graph -> Program (the compile pipeline for the graph's target)
        self.programs: dict[tuple, object] = {}
        self.syncs = 0  # syncs so far: a recording during which one happened is not a variant
        self.warned: set[str] = set()

    def sync(self, cap: Capture, why: str) -> None:
        """Run what ``cap`` recorded since the last sync; make every live trace tensor real."""
        roots, views = _live_tensors(cap)
        outputs, first = [], {}
        for t in roots:
            node = t._trace
            if node not in first:
                first[node] = len(outputs)
                outputs.append(node)
        entries = list(cap.entries.values())
        writes = [(e.input, e.current) for e in entries if e.current is not e.input]
        cap.restore_generators()  # the program's draws move them, as eager's would have
        arrays = []
        self.syncs += 1  # a sync with nothing to run still ends the recording's one-graph form
        if outputs or writes:
            graph = Graph([e.input for e in entries], list(cap.body), outputs, writes)
            arrays = self._program(graph, why).run([e.storage.data for e in entries])
        _materialize(roots, views, outputs, first, arrays)  # views of real tensors too, when nothing ran
        _reset(cap)

    def _program(self, graph: Graph, why: str):
        key = (tuple(graph.inputs), tuple(graph.body), tuple(graph.outputs), tuple(graph.writes))
        program = self.programs.get(key)
        if program is None:
            log("recompiles", f"{self.name}: compiling a segment of {len(graph.body)} operators (it ends at {why})")
            with stage("segment"):
                try:
                    program = self.build(graph)
                except Exception as exc:  # noqa: BLE001 — the segment still runs, operator by operator
                    program = Interpreter(graph)
                    self._warn_once(f"a segment of {self.name} runs eagerly, operator by operator, as its "
                                    f"program could not be built: {type(exc).__name__}: {exc}".split("\n")[0])
            self.programs[key] = program
        return program

    def _warn_once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            warnings.warn(f"tilewise.compile: {message}", RuntimeWarning, stacklevel=2)


class Interpreter:
    """A segment's graph run by the eager operators, node by node: the program of a segment the compiler cannot
    build (tensors on several devices, an operator without code generation), with ``Program.run``'s interface."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, inputs: list, staged: frozenset = frozenset()) -> list:
        from tilewise.autograd.grad_mode import no_grad
        from tilewise.dispatch import call

        values = {}
        for node, data in zip(self.graph.inputs, inputs):
            ty = node.type
            storage = Storage(data, ty.device, ty.dtype, ty.numel)
            values[node] = Tensor._make(storage, ty.shape, S.contiguous_strides(ty.shape), 0, ty.dtype, ty.device)
        with no_grad():
            for node in self.graph.body:
                operands = [values[src] for src in node.srcs]
                if node.op == "getitem":
                    values[node] = operands[0][node.args[0]]
                elif node.op == "_write_":
                    values[node] = operands[1]
                else:
                    values[node] = call(node.opdef, node.bound_args(operands))
            outputs = [_flat_data(values[node]) for node in self.graph.outputs]  # before write-backs change
            for target, value in self.graph.writes:                             # the memory views read
                if values[target] is not values[value]:
                    values[target].copy_(values[value])
            return outputs


def _flat_data(t: Tensor):
    """The elements of ``t`` as a new flat buffer (what a program returns for an output)."""
    t = t.clone()
    return t._storage.data


def _live_tensors(cap: Capture) -> tuple[list[Tensor], list[tuple[Tensor, object]]]:
    """The trace tensors still alive: roots (memory of their own) and views (tensor, root)."""
    roots, views, seen = [], [], set()
    for ref in cap.live:
        t = ref()
        if t is None or t._trace is None or id(t) in seen:
            continue
        seen.add(id(t))
        alias = t.__dict__.get("_tw_alias")
        if alias is None:
            roots.append(t)
        else:
            views.append((t, alias.root))
    for _, root in views:  # a root only views keep alive is still a root
        if type(root) is Tensor and root._trace is not None and id(root) not in seen:
            seen.add(id(root))
            roots.append(root)
    return roots, views


def _materialize(roots: list[Tensor], views: list, outputs: list, first: dict, arrays: list) -> None:
    taken: set[int] = set()
    for t in roots:
        k = first[t._trace]
        storage = _storage(arrays[k], outputs[k])
        version = t.__dict__.pop("_tw_version", 0)
        if k in taken:  # another tensor holds this value's memory: eager gave each its own
            with suspended():
                storage = _storage_copy(storage)
        taken.add(k)
        storage.version = version
        if STATE.inference:  # made inside inference mode: an inference tensor, as eagerly
            storage.inference = True
        _make_real(t, storage)
    for t, root in views:
        _make_real(t, root.storage if isinstance(root, StorageEntry) else root._storage)


def _make_real(t: Tensor, storage: Storage) -> None:
    t._storage = storage
    t._trace = None
    t._array = None
    t.__dict__.pop("_tw_alias", None)


def _storage(data, node) -> Storage:
    ty = node.type
    if ty.device.type == "cpu":
        data = data.reshape(-1)
    return Storage(data, ty.device, ty.dtype, ty.numel)


def _storage_copy(storage: Storage) -> Storage:
    if storage.device.type == "cpu":
        return Storage(storage.data.copy(), storage.device, storage.dtype, storage.numel)
    from tilewise.tensor import Tensor as _Tensor

    flat = _Tensor._make(storage, (storage.numel,), (1,), 0, storage.dtype, storage.device)
    return flat.clone()._storage


def _reset(cap: Capture) -> None:
    """Start the next segment: what was recorded has run, and the real tensors hold its results."""
    cap.body = []
    cap.defined = set()
    cap.entries, cap.labels = {}, set()
    cap.tensor_sources = []
    cap.sourced = set()
    cap.live = []
    cap.rng_start, cap.rng_found = {}, {}
