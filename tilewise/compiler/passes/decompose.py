"""decompose: replace composite operators by the primitives their decomposition calls.

Capture keeps composites whole (``softmax(%3, -1)``), which keeps the captured graph readable and leaves a
target free to map one to a library call. This pass re-traces each composite's declared decomposition
over the same operands (``capture.trace_decomposition``), so the graph holds primitives only, except the
nodes ``keep`` accepts: a target keeps those it runs as one library call (``compiler.targets``).
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise.compiler.capture import trace_decomposition
from tilewise.compiler.ir import Graph, Node, rewrite


def decompose(graph: Graph, keep: Callable[[str, tuple], bool] | None = None) -> Graph:
    """``keep(op name, bound args)``, where tensors are anything with shape, dtype and device (a node's
    ``TensorType``, a trace tensor), accepts the composites to keep whole, at any depth."""
    expanded: dict[Node, tuple[Node, ...]] = {}

    def expand(node: Node) -> Node | None:
        if node.op == "getitem" and node.srcs[0] in expanded:  # (None results have no getitem)
            return expanded[node.srcs[0]][node.args[0]]
        if node.kind != "composite":
            return None
        if keep is not None and keep(node.op, node.bound_args([s.type for s in node.srcs])):
            return None
        results = trace_decomposition(node, keep)
        if node.is_tuple:
            expanded[node] = results
            return None
        return results[0]

    return rewrite(graph, expand)
