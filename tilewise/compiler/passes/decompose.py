"""decompose: replace composite operators by the primitives their decomposition calls.

Capture keeps composites whole (``softmax(%3, -1)``), which keeps the captured graph readable and leaves a
target free to map one to a library call. This pass re-traces each composite's declared decomposition
over the same operands (``capture.trace_decomposition``), so the graph holds primitives only, except the
nodes ``keep`` accepts: a target keeps those it runs as one library call (``compiler.targets``).

[Note: decompositions made once] A decomposition runs on trace tensors that stand for its operands' types
alone (``capture.retrace``: no memory format, no history), so what it records is a function of the operator,
its arguments, its operands' types, which operands are the same value, its result type and its tag (where a
random composite's draws start): the same composite over other operands records the same nodes over those.
A transformer's layers repeat each composite once per layer, and a re-trace runs every operator of the
decomposition through the dispatcher; so the pass traces the first of each kind and makes the others by
rebuilding its nodes over their own operands (``_over``), as the trace would have made them.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise.compiler.capture import trace_decomposition
from tilewise.compiler.ir import Graph, Node, rewrite, toposort


def decompose(graph: Graph, keep: Callable[[str, tuple], bool] | None = None) -> Graph:
    """``keep(op name, bound args)``, where tensors are anything with shape, dtype and device (a node's
    ``TensorType``, a trace tensor), accepts the composites to keep whole, at any depth."""
    expanded: dict[Node, tuple[Node, ...]] = {}
    traced: dict[tuple, tuple[tuple[Node, ...], tuple[Node | None, ...]]] = {}  # see the note

    def expand(node: Node) -> Node | None:
        if node.op == "getitem" and node.srcs[0] in expanded:  # (None results have no getitem)
            return expanded[node.srcs[0]][node.args[0]]
        if node.kind != "composite":
            return None
        if keep is not None and keep(node.op, node.bound_args([s.type for s in node.srcs])):
            return None
        results = _decomposition(node, keep, traced)
        if node.is_tuple:
            expanded[node] = results
            return None
        return results[0]

    return rewrite(graph, expand)


def _decomposition(node: Node, keep, traced: dict) -> tuple[Node | None, ...]:
    """``trace_decomposition(node, keep)``: traced for the first composite of its kind, made over the operands
    for the others (see [Note: decompositions made once])."""
    first: dict[Node, int] = {}
    same = tuple(first.setdefault(s, k) for k, s in enumerate(node.srcs))  # which operands are one value
    kind = (node.op, node.args_key, tuple(s.type for s in node.srcs), same, node.type, node.tag)
    found = traced.get(kind)
    if found is None:
        results = trace_decomposition(node, keep)
        traced[kind] = (node.srcs, results)
        return results
    operands, results = found
    return _over(results, dict(zip(operands, node.srcs)))


def _over(results: tuple[Node | None, ...], operands: dict[Node, Node]) -> tuple[Node | None, ...]:
    """``results`` rebuilt over other operands (``operands``: each old one -> its new one)."""
    made = dict(operands)
    for n in toposort([r for r in results if r is not None], stop=set(operands)):
        made[n] = n.replace(srcs=tuple([made[s] for s in n.srcs])) if n.srcs else n
    return tuple(made[r] if r is not None else None for r in results)
