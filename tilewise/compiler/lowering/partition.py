"""partition: split a joint forward+backward graph into a forward graph and a backward graph.

When a compiled function's outputs require grad, capture differentiates them right away (the autograd
engine on trace tensors, with one graph input per output gradient, the *tangents*), so the passes see
forward and backward as one graph and can simplify and share work across both. This pass then cuts it:
everything that depends on a tangent runs in the backward program; everything else in the forward one.
The values the backward half reads from the forward half are *saved*: the forward program returns them
as extra outputs (inputs of the function are not copied: the backward program reads their storage).

[Note: saving less by recomputing] The cut right at the boundary saves whatever the backward reads, which is
often a float32 value computed element-wise from a smaller one: a bf16 batch norm's normalised input
``(x.float() - mean) * invstd`` (4 bytes an element, where the bf16 convolution output it comes from is 2),
a layer norm's normalised input made from the function's own input (which costs nothing to keep). Such a
value is computed again in the backward instead, from its element-wise *cone* down to values that are free
to keep (inputs of the function not written in place, the forward's own outputs, small values, values saved
anyway) or that are kept in its place (anything else: a convolution's or GEMM's output), when what is kept in
its place takes fewer bytes than the value itself. torch.compile's partitioner makes the same trade (its
min-cut recomputes element-wise chains). Recomputing runs the same operators on the same operands, so the
gradients are the same bits; the cost is one element-wise pass in the backward's kernels, which fusion joins
to the kernel that reads the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.compiler.ir import Graph, Node
from tilewise.compiler.lowering.fusion import fusion_kind

SMALL_BYTES = 1 << 16  # values this small are kept rather than recomputed, and may be read by a recomputation
MAX_CONE = 32  # nodes one recomputation may copy


@dataclass
class Partition:
    forward: Graph  # outputs: the joint graph's forward outputs, then the saved values computed in forward
    backward: Graph  # inputs: the tangents, then one per saved value
    saved: list[Node]  # in backward input order (after the tangents)
    computed: list[Node]  # the saved values the forward returns (after its own outputs); the rest are inputs


def partition(graph: Graph, n_forward: int, tangents: list[Node]) -> Partition:
    tangent_set = set(tangents)
    depends: set[Node] = set(tangents)
    for node in graph.body:
        if any(s in depends for s in node.srcs):
            depends.add(node)
    grads = graph.outputs[n_forward:]
    primal = [i for i in graph.inputs if i not in tangent_set]
    written = {i for i, _ in graph.writes}
    saved = _saved(graph, depends, grads)
    # the backward runs what depends on a tangent, and computes again what it would rather not have saved
    recomputed = _recomputed(saved, set(primal) - written, set(graph.outputs[:n_forward]), written)
    in_backward = depends | recomputed
    if recomputed:  # see [Note: saving less by recomputing]
        saved = _saved(graph, in_backward, grads)
    computed = [s for s in saved if s.op != "input" or s in written]  # an input written in place is copied
    forward = Graph(primal, [n for n in graph.body if n not in depends], graph.outputs[:n_forward] + computed,
                    list(graph.writes))
    placeholders = {s: Node("input", (), (), s.type, tag=f"saved{k}") for k, s in enumerate(saved)}
    mapping: dict[Node, Node] = {**placeholders, **{t: t for t in tangents}}
    body: list[Node] = []
    for node in graph.body:
        if node in in_backward:
            mapping[node] = node.replace(srcs=tuple(mapping[s] for s in node.srcs))
            if mapping[node] not in body:
                body.append(mapping[node])
    backward = Graph(list(tangents) + [placeholders[s] for s in saved], body, [mapping[g] for g in grads], [])
    return Partition(forward, backward, saved, computed)


def _saved(graph: Graph, in_backward: set, grads: list) -> list[Node]:
    """The values the backward's nodes (``in_backward``) and its results read from outside it, in program order."""
    saved: list[Node] = []
    seen: set[Node] = set()
    for value in [s for n in graph.body if n in in_backward for s in n.srcs] + list(grads):
        if value not in in_backward and value not in seen:
            seen.add(value)
            saved.append(value)
    return saved


def _recomputed(saved: list[Node], inputs: set, outputs: set, written: set) -> set[Node]:
    """The forward nodes the backward computes again rather than have saved (see the note), cone by cone."""
    kept = set(saved)
    recomputed: set[Node] = set()

    def free(node: Node) -> bool:
        return node in inputs or node in outputs or node in kept or node.type.nbytes <= SMALL_BYTES

    for value in sorted(saved, key=lambda n: -n.type.nbytes):
        if value.op == "input" or value in outputs or value.type.nbytes <= SMALL_BYTES:
            continue  # free to keep
        if fusion_kind(value) not in ("elementwise", "view"):
            continue
        found = _cone(value, free, written)
        if found is None:
            continue
        cone, leaves = found
        cost = sum(leaf.type.nbytes for leaf in leaves if not free(leaf))
        if cost >= value.type.nbytes:
            continue
        recomputed.update(cone)
        kept.discard(value)
        kept.update(leaves)
    return recomputed


def _cone(value: Node, free, written: set) -> tuple[list[Node], set[Node]] | None:
    """(the element-wise and view nodes ``value`` is computed from, the values they read that are kept instead),
    or None when the cone reads an input written in place or grows past ``MAX_CONE``."""
    cone: list[Node] = []
    leaves: set[Node] = set()
    seen: set[Node] = set()

    def visit(node: Node) -> bool:
        if node in seen:
            return True
        seen.add(node)
        for src in node.srcs:
            if src in written:
                return False  # the backward would read it after the forward's write
            if not free(src) and fusion_kind(src) in ("elementwise", "view"):
                if not visit(src):
                    return False
            else:
                leaves.add(src)
        cone.append(node)
        return len(cone) <= MAX_CONE

    return (cone, leaves) if visit(value) else None
