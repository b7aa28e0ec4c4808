"""recompute_activations: a pointwise value the backward reads again is computed again there, not kept.

[Note: recomputing activations] A training step's forward writes values that its backward reads much later:
the GELU of a transformer's MLP (read by the next linear layer, then by that layer's weight gradient) and
SwiGLU's ``silu(gate) * up`` likewise. Kept, each holds its bytes from the forward to the backward (for GPT-2
124M at 8x1024 tokens, 48 MiB a layer, 576 MiB in all); yet the backward also reads the value's inputs (the
GELU's input, for its derivative), so computing it again there from them costs one pointwise pass and no
memory held across the step. This is what torch.compile's partitioner does (it recomputes pointwise chains
rather than saving their results). A value is recomputed for its *late* reads when:

* it and everything it is computed from, back to values that exist anyway, is pointwise (its *cone*; no
  random draws, which are extern steps here) and the cone is small; no copied node reads a matrix product
  that nothing else reads (a second reader would stop the product's bias and activation from joining the
  GEMM, ``epilogues.py``, and change how the forward rounds);
* every large value the cone reads is read at or after the first late read anyway, so recomputing extends no
  lifetime; small values (scalars, per-channel vectors) may be read regardless;
* the late reads come long after the early ones (``MIN_DISTANCE`` nodes): only then does a lifetime shrink;
* a library call (a GEMM) is among the late readers: generated kernels that read it late make a cheap value
  again themselves (fusion's own recomputation), and a separate kernel would only add a pass over memory.

The copy is the cone's nodes again, tagged ``recomputed`` (the IR is hash-consed: an untagged copy would be
the original node), placed just before the first late read; fusion gives it a kernel of its own (merged with
siblings of its dependency level it would run in the forward again). Recomputed values are the same
operators on the same inputs, with one exception on CUDA: a tanh GELU whose forward joins its GEMM
(cuBLASLt's GELU_AUX_BIAS) is computed there from the float32 product, and recomputed from the bfloat16
input the epilogue stores (as torch's eager GELU computes it), so the two may differ in the last bit.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, Node, in_program_order
from tilewise.compiler.lowering.fusion import RECOMPUTED, fusion_kind

MIN_BYTES = 16 << 20  # smaller values are not worth a kernel of their own (a launch, a pass over memory)
SMALL_BYTES = 1 << 16  # inputs this small may be read by the recomputation whatever their lifetime
MIN_DISTANCE = 64  # graph nodes between the last early read and the first late one
MAX_CONE = 32  # nodes a recomputation may copy
NEVER = float("inf")


def recompute_activations(graph: Graph) -> Graph:
    position = {n: k for k, n in enumerate(graph.body)}
    uses = _uses(graph, position)
    last_use = {base: max(p for p, _, _ in found) for base, found in uses.items()}
    for root in graph.roots():
        last_use[_base(root)] = NEVER
    plans: dict[Node, list[tuple[Node, int, Node]]] = {}  # late reader -> [(src index, view chain top, value)]
    inserted: dict[Node, list[Node]] = {}  # first late reader -> the copied nodes to place before it
    for value in graph.body:
        found = _plan(value, position, uses, last_use)
        if found is None:
            continue
        cone, late = found
        copies = _copy(cone)
        first = min((u for u in late), key=lambda u: position[u[1]])[1]
        inserted.setdefault(first, []).extend(copies[n] for n in cone)
        for _, reader, index in late:
            plans.setdefault(reader, []).append((index, value, copies[value]))
    if not plans:
        return graph
    return _rebuild(graph, plans, inserted)


def _base(node: Node) -> Node:
    while fusion_kind(node) == "view":
        node = node.srcs[0]
    return node


def _uses(graph: Graph, position: dict) -> dict[Node, list[tuple[int, Node, int]]]:
    """Each value -> its reads by nodes that are not views: (position, reader, index of the source read), a
    read through views counted as a read of the value under them (the reader's source is then the view)."""
    uses: dict[Node, list[tuple[int, Node, int]]] = {}
    for node in graph.body:
        if fusion_kind(node) == "view":
            continue
        for index, src in enumerate(node.srcs):
            uses.setdefault(_base(src), []).append((position[node], node, index))
    return uses


def _plan(value: Node, position: dict, uses: dict, last_use: dict):
    """(cone in program order, late reads) when ``value`` should be recomputed for its late reads, else None."""
    if fusion_kind(value) != "elementwise" or value.type.nbytes < MIN_BYTES or last_use.get(value) == NEVER:
        return None
    reads = sorted(uses.get(value, ()), key=lambda u: u[0])
    if not reads:
        return None
    marks = [position[value]] + [p for p, _, _ in reads]
    gap, split = max((marks[k + 1] - marks[k], k) for k in range(len(marks) - 1))
    if gap < MIN_DISTANCE:
        return None
    late = reads[split:]
    if all(fusion_kind(reader) != "extern" for _, reader, _ in late):
        return None  # kernels that read it late make it again themselves where it is cheap (fusion.py)
    start = late[0][0]
    cone = _cone(value, start, last_use, uses)
    return (cone, late) if cone is not None else None


def _cone(value: Node, start: int, last_use: dict, uses: dict) -> list[Node] | None:
    """The pointwise nodes ``value`` is computed from, down to values live at ``start`` anyway or small, in
    program order (sources first); None when it reaches anything else or grows past ``MAX_CONE``."""
    order: list[Node] = []
    seen: set[Node] = set()

    def visit(node: Node) -> bool:
        if node in seen:
            return True
        seen.add(node)
        for src in node.srcs:
            base = _base(src)
            if base.type.nbytes <= SMALL_BYTES or last_use.get(base, -1) >= start:
                continue  # small, or read at or after the late reads anyway
            if fusion_kind(src) != "elementwise" or not visit(src):
                return False
        if any(_base(src).kind == "matmul" and len(uses.get(_base(src), ())) == 1 for src in node.srcs):
            return False  # a second reader of a product would keep its bias and activation out of the GEMM
        order.append(node)
        return len(order) <= MAX_CONE

    return order if visit(value) else None


def _copy(cone: list[Node]) -> dict[Node, Node]:
    copies: dict[Node, Node] = {}
    for node in cone:
        srcs = tuple(copies.get(s, s) for s in node.srcs)
        copies[node] = Node(node.op, srcs, node.args, node.type, RECOMPUTED)
    return copies


def _reroot(src: Node, value: Node, copy: Node, mapping: dict) -> Node:
    """``src`` (``value`` or a chain of views of it) over ``copy`` instead of ``value``."""
    if src is value:
        return copy
    under = _reroot(src.srcs[0], value, copy, mapping)
    return src.replace(srcs=(under, *(mapping[s] for s in src.srcs[1:])))


def _rebuild(graph: Graph, plans: dict, inserted: dict) -> Graph:
    body: list[Node] = []
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}
    for node in graph.body:
        for copy in inserted.get(node, ()):
            mapping[copy] = copy.replace(srcs=tuple(mapping.get(s, s) for s in copy.srcs))
            body.append(mapping[copy])
        srcs = [mapping[s] for s in node.srcs]
        for index, value, copy in plans.get(node, ()):
            srcs[index] = _reroot(node.srcs[index], value, mapping[copy], mapping)
        new = node.replace(srcs=tuple(srcs)) if tuple(srcs) != node.srcs else node
        mapping[node] = new
        body.append(new)
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    out.body = in_program_order(body, out)
    return out
