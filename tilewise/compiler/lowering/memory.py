"""Memory planning: one static buffer for every value a step materialises, reused when lifetimes allow.

[Note: memory planning] After fusion the graph is a sequence of steps (kernels and library calls); views
and ``getitem`` only name parts of other buffers. Each step's results get a buffer:

* a value the function returns gets a fresh *output* buffer on every call (the caller keeps it); so does the
  value a returned view lays out row-major (a reshape, a permute moving only dims of size 1: a batch norm's
  statistics leaving a channels-last program), which is then written there directly; other views of values
  are copied into their output buffer at the end of the call;
* a value written back into an input (an updated parameter, optimizer state) is stored straight into
  that input's memory when that is safe: every other reader of the input runs earlier, and inside the
  producing kernel the input is read only at the element being written, before it is written (the usual
  ``p = p - lr * g``; a running statistic read and stored once per row in a reduction's epilogue);
  otherwise it goes to a temporary and a copy at the end of the program writes it back;
* everything else lives in one *arena*, allocated once per compiled program: a value occupies its
  bytes from the step that writes it to the last step that reads it, and values whose lifetimes do not
  overlap share bytes (greedy placement, largest first). ``peak_bytes`` is the arena's size.

A ``cat`` whose inputs are contiguous slabs of its result (it joins along its first dim of more than one
element, and converts no dtype) is laid out *in place* (other cats are read in place by their readers' kernels:
see [Note: concatenations in kernels] in ``fusion``): each input a step before it writes in full gets, as
its buffer, its slab of the result's buffer, so writing the input is writing the result and the cat copies
nothing for it (``cat_copies`` lists what it still copies: graph inputs, views, values other cats placed). An input slab
that does not start on a 16-byte boundary is placed only for a one-element value a generated kernel stores
(such stores are never vectorised; kernels and libraries assume aligned buffers otherwise). The placed
inputs and the result share one arena interval, from the first input's step to the last read of any.

An operator declared with ``in_place_of`` (the functional all-reduce: NCCL reduces in place) writes its result
into the buffer of that argument when the argument is a whole arena value nothing reads after the step (nor any
cat input placed in it): result and argument then share one buffer and one interval. A *collective* (an
operator declared ``collective``) may run on a stream of its own (see [Note: collectives on their own stream]
in ``streams``): what it reads stays live until the first step that reads its result, so that no value the
program writes meanwhile lands in memory the collective may still be reading.

A generated kernel's result may also take the arena bytes of an operand it is the last reader of (*in-place
reuse*): same size and element size, and the kernel reads the operand only at the element it stores, either
in a nest without reduction or in the last phase of a reduction nest (whose earlier phases have read the whole
row before any of it is stored; such nests are never split across blocks). The gradient of a cross-entropy
over a 50k vocabulary is the case that matters: it replaces the logits it is computed from (786 MiB for
8x1024 tokens in bfloat16) instead of needing a second buffer as large. ``order_for_reuse`` moves the steps
that still read such an operand afterwards (the loss's ``gather`` of the target logits) before the kernel when
they can run there, so that the kernel becomes the last reader. The kernel's parameters for the operand and the
result then lie in the same memory (``MemoryPlan.memory_of`` overlaps), and the CUDA renderer declares neither
``__restrict__`` (``program.aliased_kernels``): a compiler told they do not alias may load the operand after storing
the result over it.

[Note: donated inputs] A caller may *donate* inputs (``plan_memory``'s ``donated``): give the program their memory
once it has read them for the last time, as a compiled backward gives the saved activations it alone holds (see
[Note: donated saved tensors] in ``compiler/backward.py``). Arena values are then placed, largest first, in the
memory of a donated input where they fit after its last reader (inputs smallest first, first fit, the same
lifetimes as the arena's), and only the rest in the arena. Such a buffer is kind ``"donated"``: the input's
position and a byte offset, bound at each call to the input's address plus the offset. An input the call writes
back into, or returns, is never donated (its last use is the end of the call).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tilewise import strides as S
from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.schedule import VECTOR_BYTES
from tilewise.compiler.ir import Graph, Node, format_type
from tilewise.compiler.lowering.fusion import fusion_kind, is_collective
from tilewise.compiler.lowering.lower import buffer_of, geometry

ALIGN = 64


@dataclass
class Buffer:
    kind: str  # "input" | "output" | "arena" | "donated"
    ty: object  # TensorType of the buffer (contiguous)
    slot: int  # input index, output index, or arena byte offset; "donated": the input whose memory it is in
    offset: int = 0  # "donated": the byte offset in that input's memory


@dataclass
class Copy:
    """At the end of a call: copy ``value`` (read through its views) into buffer ``dst``."""

    value: Node
    dst: int


@dataclass
class MemoryPlan:
    buffers: list[Buffer] = field(default_factory=list)
    of: dict[Node, int] = field(default_factory=dict)  # materialised value -> buffer
    copies: list[Copy] = field(default_factory=list)
    cat_copies: dict[Node, list[tuple[Node, int]]] = field(default_factory=dict)  # cat in place -> (input, byte)
    outputs: list[int] = field(default_factory=list)  # graph output k -> buffer
    arena_bytes: int = 0
    unshared_bytes: int = 0  # what the arena would need without reuse
    live_bytes: int = 0  # the largest set of arena bytes live at one step (values sharing bytes counted once)
    live_step: str = ""  # that step: "k op"

    def memory_of(self, value: Node) -> tuple[str, int, int]:
        """Where ``value``'s buffer lies: (kind, first, end) in arena bytes for an arena value; an input or output
        buffer is one allocation of its own, (kind, slot, slot + 1). Two values share memory where these overlap."""
        buffer = self.buffers[self.of[value]]
        if buffer.kind == "arena":
            return buffer.kind, buffer.slot, buffer.slot + buffer.ty.nbytes
        if buffer.kind == "donated":
            return f"input {buffer.slot}", buffer.offset, buffer.offset + buffer.ty.nbytes
        return buffer.kind, buffer.slot, buffer.slot + 1

    def describe(self) -> str:
        lines = [f"memory plan: arena {self.arena_bytes} bytes (without reuse {self.unshared_bytes}), "
                 f"{sum(b.kind == 'output' for b in self.buffers)} output buffer(s), {len(self.copies)} copy(ies), "
                 f"{len(self.cat_copies)} cat(s) in place; largest live set {self.live_bytes} bytes at step "
                 f"{self.live_step}"]
        for k, b in enumerate(self.buffers):
            at = f" +{b.offset}" if b.kind == "donated" else ""
            lines.append(f"  buffer {k}: {b.kind} {b.slot}{at} : {format_type(b.ty)}")
        return "\n".join(lines)


def steps_of(graph: Graph) -> list[Node]:
    """The nodes that run: kernels and library calls, in program order."""
    return _steps_in(graph.body)


def _steps_in(body: list[Node]) -> list[Node]:
    return [n for n in body if n.op == "fused" or (n.op != "getitem" and fusion_kind(n) == "extern")]


def plan_memory(graph: Graph, kernels: dict[Node, Kernel], donated: frozenset[int] = frozenset()) -> MemoryPlan:
    """``donated``: the positions of inputs whose memory the call may overwrite once it has read them for the last
    time (see [Note: donated inputs])."""
    plan = MemoryPlan()
    accesses = {step: _Accesses(kernel) for step, kernel in kernels.items()}
    steps = steps_of(graph)
    position = {s: k for k, s in enumerate(steps)}
    produced = _produced_values(graph, steps)
    for k, node in enumerate(graph.inputs):
        plan.of[node] = _add(plan, Buffer("input", node.type, k))
    last_use = _last_uses(graph, steps, position)
    _assign_outputs(graph, plan, produced)
    _assign_writes(graph, plan, produced, position, accesses, steps)
    shared = _cats_in_place(plan, produced, steps)
    _results_in_place(plan, produced, steps, position, _last_reads(graph, steps, position), shared)
    reused = _reuse_in_place(plan, produced, position, last_use, accesses, shared)
    regions = [(graph.inputs[k], k) for k in sorted(donated)
               if not any(i is graph.inputs[k] for i, _ in graph.writes)]
    _assign_arena(plan, produced, position, last_use, shared, reused, regions)
    _largest_live_set(plan, produced, position, last_use, steps)
    return plan


def _largest_live_set(plan: MemoryPlan, produced: dict, position: dict, last_use: dict, steps: list[Node]) -> None:
    """``plan.live_bytes`` and ``plan.live_step``: what the arena must hold at its fullest step (its size less
    what placement wastes): the union of the byte spans of the values live at a step, a value live from the step
    making it to its last reader. A sweep over the steps: the spans starting at a step join the live set, those
    whose last reader came before it leave, and the union is measured where spans joined (it grows only there),
    kept up to date by a ``_Coverage`` of the spans' ends (measured afresh at each such step, it was a tenth of a
    GPT-2 step's lowering)."""
    joining: dict[int, list[tuple[int, int]]] = {}
    leaving: dict[int, list[tuple[int, int]]] = {}
    for value, step in produced.items():
        buffer = plan.buffers[plan.of[value]]
        if buffer.kind != "arena":
            continue
        start = position[step]
        span = (buffer.slot, buffer.slot + value.type.nbytes)
        joining.setdefault(start, []).append(span)
        leaving.setdefault(max(last_use.get(value, start), start) + 1, []).append(span)
    live = _Coverage(sorted({end for spans in joining.values() for span in spans for end in span}))
    for k in sorted(joining.keys() | leaving.keys()):
        for lo, hi in leaving.get(k, ()):
            live.add(lo, hi, -1)
        if k not in joining:
            continue
        for lo, hi in joining[k]:
            live.add(lo, hi, 1)
        if live.covered[1] > plan.live_bytes:
            plan.live_bytes = live.covered[1]
            plan.live_step = f"{k} {steps[k].op}" if k < len(steps) else f"{k} (end)"


class _Coverage:
    """How many bytes a changing set of spans covers, their ends among fixed ``points`` (sorted, distinct): a segment
    tree over the gaps between the points, each tree node counting the spans that cover its whole range and no
    range of its parent's (a span is such a set of nodes, the same when it leaves as when it joined), and knowing how
    many of its bytes some span covers. ``covered[1]`` is the union's size; adding or removing a span visits the
    nodes on the paths from its two ends to the root."""

    def __init__(self, points: list[int]):
        self.index = {p: k for k, p in enumerate(points)}
        self.leaves = 1
        while self.leaves < len(points) - 1:
            self.leaves *= 2
        self.count = [0] * (2 * self.leaves)
        self.covered = [0] * (2 * self.leaves)
        self.length = [0] * (2 * self.leaves)  # the bytes of each node's range
        for k in range(len(points) - 1):
            self.length[self.leaves + k] = points[k + 1] - points[k]
        for node in range(self.leaves - 1, 0, -1):
            self.length[node] = self.length[2 * node] + self.length[2 * node + 1]

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add (``delta`` 1) or remove (-1) the span ``[lo, hi)``."""
        first, end = self.index[lo] + self.leaves, self.index[hi] + self.leaves
        left, right = first, end
        while left < right:
            if left & 1:
                self.count[left] += delta
                self._measure(left)
                left += 1
            if right & 1:
                right -= 1
                self.count[right] += delta
                self._measure(right)
            left, right = left // 2, right // 2
        for node in (first // 2, (end - 1) // 2):  # the nodes above the ones counted: the ends' paths to the root
            while node:
                self._measure(node)
                node //= 2

    def _measure(self, node: int) -> None:
        if self.count[node]:
            self.covered[node] = self.length[node]
        else:
            self.covered[node] = 0 if node >= self.leaves else self.covered[2 * node] + self.covered[2 * node + 1]


def order_for_reuse(graph: Graph, kernels: dict[Node, Kernel]) -> Graph:
    """``graph`` with the steps that read an operand after a kernel that could write in place of it moved before
    that kernel, where their operands are ready there and their results are smaller than the operand (see
    [Note: memory planning]); the graph itself when nothing moves."""
    body = list(graph.body)
    readers: dict[Node, list[Node]] = {}  # a buffer -> the steps reading it
    for step in _steps_in(body):
        for value in _reads(step):
            readers.setdefault(value, []).append(step)
    position = {n: k for k, n in enumerate(body)}
    moved = False
    for step in [n for n in body if n in kernels]:
        for operand in _replaceable_operands(_Accesses(kernels[step]), step, readers):
            at = position[step]
            later = [r for r in readers[operand] if position[r] > at]
            hoisted = _hoistable(later, position, at, operand.type.nbytes)
            if hoisted:
                moving = set(hoisted)
                body = body[:at] + hoisted + [n for n in body[at:] if n not in moving]
                position = {n: k for k, n in enumerate(body)}
                moved = True
    return Graph(graph.inputs, body, graph.outputs, graph.writes) if moved else graph


def _replaceable_operands(kernel: _Accesses, step: Node, readers: dict[Node, list[Node]]) -> list[Node]:
    """The operands of ``step``'s kernel, made by other steps and read after it, that one of its results could
    overwrite as the kernel goes."""
    results = {v: (v.type.nbytes, v.type.dtype.itemsize) for v in kernel.values
               if v is step or (v.op == "getitem" and v.srcs[0] is step)}
    candidates = [v for v in kernel.values if v not in results and v.op != "input" and len(readers.get(v, ())) > 1]
    return [operand for operand in candidates if any(
        (operand.type.nbytes, operand.type.dtype.itemsize) == size and _reads_only_where_stored(kernel, operand, v)
        for v, size in results.items())]


def _hoistable(readers: list[Node], position: dict[Node, int], at: int, limit: int) -> list[Node]:
    """``readers`` with the views they read through, in program order, if all can run before the node at
    ``at`` (their other operands are ready there) and their results take fewer than ``limit`` bytes; else []."""
    if not readers:
        return []
    needed: set[Node] = set()

    def ready(node: Node) -> bool:
        for src in node.srcs:
            if position.get(src, -1) < at or src in needed:
                continue
            if src.op == "fused" or src.op == "getitem" or fusion_kind(src) == "extern" or not ready(src):
                return False  # produced by a step at or after ``body[at]``
            needed.add(src)
        return True

    if not all(ready(r) for r in readers):
        return []
    if sum(_result_bytes(r) for r in readers) >= limit:
        return []
    return sorted(needed | set(readers), key=position.__getitem__)


def _result_bytes(step: Node) -> int:
    return sum(t.nbytes for t in step.type) if step.is_tuple else step.type.nbytes


def _add(plan: MemoryPlan, buffer: Buffer) -> int:
    plan.buffers.append(buffer)
    return len(plan.buffers) - 1


def _produced_values(graph: Graph, steps: list[Node]) -> dict[Node, Node]:
    """Materialised value -> the step that writes it."""
    produced: dict[Node, Node] = {}
    step_set = set(steps)
    for node in graph.body:
        if node in step_set and not node.is_tuple:
            produced[node] = node
        elif node.op == "getitem" and node.srcs[0] in step_set:
            produced[node] = node.srcs[0]
    return produced


def _reads(step: Node) -> list[Node]:
    return [buffer_of(s) for s in step.srcs]


def _last_reads(graph: Graph, steps: list[Node], position: dict) -> dict[Node, int]:
    """Each value's last reading step (``len(steps)`` for what the call returns or writes back)."""
    last: dict[Node, int] = {}
    for step in steps:
        for value in _reads(step):
            last[value] = max(last.get(value, -1), position[step])
    for root in graph.roots():
        last[buffer_of(root)] = len(steps)
    return last


def _last_uses(graph: Graph, steps: list[Node], position: dict) -> dict[Node, int]:
    """Each value's last read, where a collective's inputs count as read until its result is first read."""
    last = _last_reads(graph, steps, position)
    end = len(steps)
    produced = _produced_values(graph, steps)
    for step in steps:
        if is_collective(step):  # its inputs stay put while it may run: until its result is first read
            results = {v for v, s in produced.items() if s is step}
            join = _first_reader(results, steps[position[step] + 1:], end)
            for value in _reads(step):
                last[value] = max(last.get(value, -1), join)
    return last


def _first_reader(values: set[Node], later: list[Node], end: int) -> int:
    """The position of the first of the ``later`` steps that reads one of ``values`` (``end`` if none does)."""
    first = end - len(later)
    for k, step in enumerate(later):
        if values & set(_reads(step)):
            return first + k
    return end


def _assign_outputs(graph: Graph, plan: MemoryPlan, produced: dict) -> None:
    for k, out in enumerate(graph.outputs):
        dst = _add(plan, Buffer("output", out.type, k))
        plan.outputs.append(dst)
        if out in produced and out not in plan.of:
            plan.of[out] = dst
        elif _row_major_view(out, produced, plan):
            plan.of[buffer_of(out)] = dst
        else:
            plan.copies.append(Copy(out, dst))


def _row_major_view(out: Node, produced: dict, plan: MemoryPlan) -> bool:
    """Whether ``out`` is a view of a value a step makes that lays out that value's elements as ``out``'s own
    row-major order (a reshape; a permute that moves only dims of size 1, as a batch norm's per-channel
    statistics leave a channels-last program): the value is then written straight into the output buffer."""
    if out.kind != "view":
        return False
    base = buffer_of(out)
    if base not in produced or base in plan.of or base.type.dtype is not out.type.dtype \
            or base.type.numel != out.type.numel:
        return False
    shape, strides, offset = geometry(out)
    row_major = S.contiguous_strides(shape)
    return offset == 0 and all(s == r for n, s, r in zip(shape, strides, row_major) if n != 1)


def _assign_writes(graph: Graph, plan: MemoryPlan, produced: dict, position: dict, accesses: dict,
                   steps: list[Node]) -> None:
    targets = Counter(v for _, v in graph.writes)
    # an input an end-of-call copy returns (``y = x.clone(); x.add_(1); return y``) keeps its old value until
    # then: its new value goes to a temporary and is copied back after the outputs are
    returned = {buffer_of(c.value) for c in plan.copies}
    last_reader: dict[Node, int] = {}  # value -> position of the last step reading its buffer
    for other in steps:
        for read in _reads(other):
            last_reader[read] = position[other]
    for inp, value in graph.writes:
        dst = plan.of[inp]
        step = produced.get(value)
        if (step is not None and value not in plan.of and targets[value] == 1 and inp not in returned
                and _in_place_ok(inp, value, step, position, accesses, last_reader)):
            plan.of[value] = dst
        else:
            plan.copies.append(Copy(value, dst))


def _in_place_ok(inp: Node, value: Node, step: Node, position: dict, accesses: dict, last_reader: dict) -> bool:
    kernel = accesses.get(step)
    if kernel is None:
        return False
    if last_reader.get(inp, -1) > position[step]:  # a later step still reads the input
        return False
    return inp not in kernel.param or _reads_before_storing(kernel, inp, value)


def _reads_before_storing(kernel: _Accesses, inp: Node, value: Node) -> bool:
    """Whether ``value`` may be stored over ``inp`` as ``kernel`` goes: every nest that reads ``inp`` stores
    ``value``, each element it reads is the one it stores there, and it stores each element once, after every read of
    it: element by element in a nest without reduction; in a reduction nest, in its last phase (earlier phases have
    read the row) or once per row after the phases (a running statistic updated in the epilogue of the reduction
    that reads it: split rows store it in the row's last block, once every block has read its part)."""
    stores = kernel.stores.get(kernel.param[value], {})
    for k, loads in kernel.loads.get(kernel.param[inp], {}).items():
        nest, written = kernel.nests[k], stores.get(k)
        if not written:
            return False
        index = written[0].index
        if any(st.index != index for st in written) or any(ld.index != index for ld in loads):
            return False
        if nest.reduce and any(st.phase is not None and st.phase != nest.phases - 1 for st in written):
            return False
        per_row = nest.reduce and all(st.phase is None for st in written)
        walked = nest.outer if per_row else range(len(nest.shape))
        if any(nest.shape[d] != 1 and d not in index.dims() for d in walked):
            return False  # several iterations would store one element, the later ones after reading it stored
    return True


def _reuse_in_place(plan: MemoryPlan, produced: dict, position: dict, last_use: dict, accesses: dict,
                    cats: dict) -> dict[Node, Node]:
    """value -> the operand whose arena bytes it takes (see [Note: memory planning])."""
    in_cats = set(cats) | {v for placed in cats.values() for v, _ in placed}
    reused: dict[Node, Node] = {}
    taken: set[Node] = set()
    for value, step in produced.items():
        kernel = accesses.get(step)
        if kernel is None or value in plan.of or value in in_cats:
            continue
        for operand in kernel.values:
            if (operand in produced and operand not in plan.of and operand not in in_cats and operand not in taken
                    and operand is not value and last_use.get(operand) == position[step]
                    and operand.type.nbytes == value.type.nbytes
                    and operand.type.dtype.itemsize == value.type.dtype.itemsize
                    and _reads_only_where_stored(kernel, operand, value)):
                reused[value] = operand
                taken.add(operand)
                break
    return reused


class _Accesses:
    """A kernel's loads and stores of each parameter, nest by nest: what the planner asks of a kernel for every
    write-back and every operand a result might take the place of (an optimizer's kernel has a hundred nests, which
    walked for each of them took a tenth of a GPT-2 step's memory plan)."""

    def __init__(self, kernel: Kernel):
        self.values, self.nests = kernel.values, kernel.nests
        self.param = {v: k for k, v in reversed(list(enumerate(kernel.values)))}  # value -> its (first) parameter
        self.loads: dict[int, dict[int, list]] = {}  # parameter -> {nest: its loads there}
        self.stores: dict[int, dict[int, list]] = {}  # parameter -> {nest: its stores there}
        for k, nest in enumerate(kernel.nests):
            for load in nest.loads:
                self.loads.setdefault(load.param, {}).setdefault(k, []).append(load)
            for store in nest.stores:
                self.stores.setdefault(store.param, {}).setdefault(k, []).append(store)


def _reads_only_where_stored(kernel: _Accesses, operand: Node, value: Node) -> bool:
    """Whether every read of ``operand`` in ``kernel`` is of the element the same iteration stores of ``value``,
    after every other read of its row: so ``value`` may overwrite ``operand`` as it goes."""
    reads, writes = kernel.loads.get(kernel.param[operand], {}), kernel.stores.get(kernel.param[value], {})
    for k in reads.keys() | writes.keys():
        nest, loads, stores = kernel.nests[k], reads.get(k), writes.get(k)
        if not loads or not stores or any(ld.index != stores[0].index for ld in loads):
            return False
        if any(st.index != stores[0].index for st in stores):
            return False
        if nest.reduce and any(st.phase is None or st.phase != nest.phases - 1 for st in stores):
            return False
    return True


def _cats_in_place(plan: MemoryPlan, produced: dict, steps: list[Node]) -> dict[Node, list[tuple[Node, int]]]:
    """cat -> [(input value placed in its slab, byte offset)] for the cats laid out in place; fills
    ``plan.cat_copies`` with the inputs those cats still copy."""
    cats: dict[Node, list[tuple[Node, int]]] = {}
    claimed: set[Node] = set()
    for node in steps:
        if node.op != "cat" or node.is_tuple or node in plan.of:
            continue
        shape, dtype = node.type.shape, node.type.dtype
        dim = S.normalize_dim(node.args[1], len(shape))
        if S.numel(shape[:dim]) != 1 or any(node.srcs[r.i].type.dtype is not dtype for r in node.args[0]):
            continue  # a cat that converts copies through its own kernel
        placed, copied, offset = [], [], 0
        for ref in node.args[0]:
            src = node.srcs[ref.i]
            value = buffer_of(src)
            whole = (value.type.numel == src.type.numel
                     and geometry(src) == (src.type.shape, S.contiguous_strides(src.type.shape), 0))
            aligned = offset % VECTOR_BYTES == 0 or (value.type.numel == 1 and produced.get(value, node).op == "fused")
            if whole and aligned and value in produced and value not in plan.of and value not in claimed:
                placed.append((value, offset))
                claimed.add(value)
            else:
                copied.append((src, offset))
            offset += src.type.numel * dtype.itemsize
        if placed:
            cats[node] = placed
            plan.cat_copies[node] = copied
    return cats


def _results_in_place(plan: MemoryPlan, produced: dict, steps: list[Node], position: dict, last_read: dict,
                      shared: dict[Node, list[tuple[Node, int]]]) -> None:
    """Add to ``shared`` (value -> the values placed in its buffer) each result that an ``in_place_of`` operator
    writes over its argument (see the note)."""
    members = {v for placed in shared.values() for v, _ in placed}
    for node in steps:
        argument = node.opdef.attrs.get("in_place_of") if node.opdef is not None else None
        if argument is None or node.is_tuple or node in plan.of or node not in produced:
            continue
        src = node.srcs[argument]  # the position of the tensor argument
        host = buffer_of(src)
        placed_here = [v for v, _ in shared.get(host, ())]
        if (host not in produced or host in plan.of or host in members or host.type.nbytes != node.type.nbytes
                or host.type.dtype is not node.type.dtype
                or geometry(src) != (host.type.shape, S.contiguous_strides(host.type.shape), 0)
                or any(last_read.get(v, -1) > position[node] for v in (host, *placed_here))):
            continue
        shared.setdefault(host, []).append((node, 0))
        members.add(node)


def _assign_arena(plan: MemoryPlan, produced: dict, position: dict, last_use: dict,
                  cats: dict[Node, list[tuple[Node, int]]], reused: dict[Node, Node],
                  regions: list[tuple[Node, int]] = ()) -> None:
    members = {v for placed in cats.values() for v, _ in placed} | set(reused)
    heirs: dict[Node, list[Node]] = {}  # an operand -> the chain of values that take its bytes in turn
    for value, operand in reused.items():
        heirs.setdefault(operand, []).append(value)
    intervals = []
    for value, step in produced.items():
        if value in plan.of or value in members:
            continue
        start = position[step]
        end = max(last_use.get(value, start), start)
        for v, _ in cats.get(value, ()):  # a cat in place, a result in place: the lifetimes of its members
            start = min(start, position[produced[v]])
            end = max(end, last_use.get(v, position[produced[v]]))
        for v in _chain(value, heirs):  # values written in place of it, in turn: the interval runs to the last
            end = max(end, last_use.get(v, position[produced[v]]), position[produced[v]])
        size = -(-value.type.nbytes // ALIGN) * ALIGN
        intervals.append((size, start, end, value))
    # donated inputs, smallest first: each holds its own bytes until its last reader, then what fits after it
    donated = []
    for inp, k in sorted(regions, key=lambda r: (r[0].type.nbytes, r[1])):
        taken, read = _Blocks(), last_use.get(inp, len(position))
        taken.place(0, inp.type.nbytes, -1, read)
        donated.append((inp.type.nbytes, k, read, taken))
    placed = _Blocks()
    for size, start, end, value in sorted(intervals, key=lambda t: (-t[0], t[1])):
        plan.unshared_bytes += size
        kind, slot, offset = "arena", 0, None
        for capacity, k, read, taken in donated:
            if size <= capacity and start > read:
                offset = taken.first_fit(size, start, end)
                if offset + size <= capacity:
                    kind, slot = "donated", k
                    taken.place(offset, size, start, end)
                    break
        if kind == "arena":
            offset = placed.first_fit(size, start, end)
            placed.place(offset, size, start, end)
            plan.arena_bytes = max(plan.arena_bytes, offset + size)
        plan.of[value] = _add(plan, _placed(kind, value.type, slot, offset))
        for v, byte in cats.get(value, ()):
            plan.of[v] = _add(plan, _placed(kind, v.type, slot, offset + byte))
        for v in _chain(value, heirs):
            plan.of[v] = _add(plan, _placed(kind, v.type, slot, offset))


class _Blocks:
    """The blocks placed in one memory so far, each taken from one step to another: columns of (first byte, end
    byte, first step, last step), so that finding room looks at every block in a few array operations (a loop over
    them for each value placed was a third of a GPT-2 step's memory plan)."""

    def __init__(self):
        self.table = np.empty((4, 64), dtype=np.int64)
        self.n = 0

    def place(self, offset: int, size: int, start: int, end: int) -> None:
        if self.n == self.table.shape[1]:
            self.table = np.concatenate([self.table, np.empty_like(self.table)], axis=1)
        self.table[:, self.n] = (offset, offset + size, start, end)
        self.n += 1

    def first_fit(self, size: int, start: int, end: int) -> int:
        """The lowest offset where ``size`` bytes are free from step ``start`` to ``end``: past every block in use
        then that begins below it (walked in the order of their first bytes, the offset moves past each block
        until the room before the next is large enough)."""
        lo, hi, first, last = self.table[:, :self.n]
        in_use = (last >= start) & (first <= end)
        lo, hi = lo[in_use], hi[in_use]
        if not len(lo):
            return 0
        order = np.argsort(lo, kind="stable")
        lo, reach = lo[order], np.maximum.accumulate(hi[order])
        before = np.concatenate(([0], reach[:-1]))  # the offset reached before each block
        fits = np.flatnonzero(before + size <= lo)
        return int(before[fits[0]]) if len(fits) else int(reach[-1])


def _placed(kind: str, ty, slot: int, offset: int) -> Buffer:
    return Buffer("arena", ty, offset) if kind == "arena" else Buffer("donated", ty, slot, offset)


def _chain(value: Node, heirs: dict[Node, list[Node]]) -> list[Node]:
    out, todo = [], list(heirs.get(value, ()))
    while todo:
        v = todo.pop()
        out.append(v)
        todo.extend(heirs.get(v, ()))
    return out


def lifetimes(graph: Graph) -> dict[Node, tuple[int, int]]:
    """Each materialised value's first and last step: the step that writes it and the last that reads it
    (``len(steps_of(graph))`` for a value the call returns or writes back), as the arena placement sees them."""
    steps = steps_of(graph)
    position = {s: k for k, s in enumerate(steps)}
    last_use = _last_uses(graph, steps, position)
    return {value: (position[step], max(last_use.get(value, position[step]), position[step]))
            for value, step in _produced_values(graph, steps).items()}
