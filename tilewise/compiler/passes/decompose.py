"""decompose: replace composite operators by the primitives their decomposition calls.

Capture keeps composites whole (``softmax(%3, -1)``), which keeps the captured graph readable and leaves a
target free to map one to a library call. This pass re-traces each composite's declared decomposition
over the same operands (``capture.trace_decomposition``), so the graph holds primitives only; operators
named in ``keep`` stay whole.
"""

from __future__ import annotations

from tilewise.compiler.capture import trace_decomposition
from tilewise.compiler.ir import Graph, Node, rewrite


def decompose(graph: Graph, keep: frozenset[str] = frozenset()) -> Graph:
    expanded: dict[Node, tuple[Node, ...]] = {}

    def expand(node: Node) -> Node | None:
        if node.op == "getitem" and node.srcs[0] in expanded:  # (None results have no getitem)
            return expanded[node.srcs[0]][node.args[0]]
        if node.kind != "composite" or node.op in keep:
            return None
        results = trace_decomposition(node)
        if node.is_tuple:
            expanded[node] = results
            return None
        return results[0]

    return rewrite(graph, expand)
