"""partition: split a joint forward+backward graph into a forward graph and a backward graph.

When a compiled function's outputs require grad, capture differentiates them right away (the autograd
engine on trace tensors, with one graph input per output gradient, the *tangents*), so the passes see
forward and backward as one graph and can simplify and share work across both. This pass then cuts it:
everything that depends on a tangent runs in the backward program; everything else in the forward one.
The values the backward half reads from the forward half are *saved*: the forward program returns them
as extra outputs (inputs of the function are not copied: the backward program reads their storage). The
saved set is the cut right at the boundary, so the backward recomputes nothing the forward already has.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.compiler.ir import Graph, Node


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
    saved: list[Node] = []

    def save(value: Node) -> None:
        if value not in depends and value not in saved:
            saved.append(value)

    for node in graph.body:
        if node in depends:
            for s in node.srcs:
                save(s)
    for g in grads:
        save(g)
    primal = [i for i in graph.inputs if i not in tangent_set]
    written = {i for i, _ in graph.writes}
    computed = [s for s in saved if s.op != "input" or s in written]  # an input written in place is copied
    forward = Graph(primal, [n for n in graph.body if n not in depends], graph.outputs[:n_forward] + computed,
                    list(graph.writes))
    placeholders = {s: Node("input", (), (), s.type, tag=f"saved{k}") for k, s in enumerate(saved)}
    mapping: dict[Node, Node] = {**placeholders, **{t: t for t in tangents}}
    body: list[Node] = []
    for node in graph.body:
        if node in depends:
            mapping[node] = node.replace(srcs=tuple(mapping[s] for s in node.srcs))
            if mapping[node] not in body:
                body.append(mapping[node])
    backward = Graph(list(tangents) + [placeholders[s] for s in saved], body, [mapping[g] for g in grads], [])
    return Partition(forward, backward, saved, computed)
