"""functionalize: drop the ``_write_`` markers capture left where the traced code wrote in place.

Capture already turned every in-place write into a new value (see [Note: capture]): ``_write_(old, src)``
*is* ``src``, written through views as ``view_scatter`` on the root, with write-backs for the inputs whose
storage changed. This pass replaces each marker by its value, so later passes see a pure dataflow graph.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, Node, rewrite


def _value_of_write(node: Node) -> Node | None:
    if node.op != "_write_":
        return None
    old, src = node.srcs
    if src.type != old.type:
        raise ValueError(f"_write_ of a {src.type} value into a {old.type} tensor: capture should have cast and "
                         "broadcast it first")
    return src


def functionalize(graph: Graph) -> Graph:
    return rewrite(graph, _value_of_write)
