"""legalize_views: give every view a source it can be expressed on, by copying where strides cannot.

Views never materialise, so a view reads its *base* buffer (the first value down its chain of views that
is not a view), laid out contiguously, through the stride arithmetic of every view in between. Some chains
have no such arithmetic: a reshape that merges dims a transpose separated, an ``as_strided`` over a
permuted value. Capture never builds those (eager raises, and ``reshape`` copies first), but rewrites can:
``simplify`` drops the copy in ``clone(x.t()).view(-1)`` when it only sees values. This pass puts a
``clone`` (a contiguous copy, which fusion folds into whatever produces it) in front of each such view.
"""

from __future__ import annotations

from tilewise.codegen.kernel_ir import LoweringError
from tilewise.compiler.ir import Graph, Node, Ref, rewrite
from tilewise.compiler.lowering.lower import geometry


def _expressible(node: Node) -> bool:
    try:
        geometry(node)
    except LoweringError:
        return False
    return True


def _legal(node: Node) -> Node | None:
    if node.kind != "view" or node.srcs[0].kind != "view" or _expressible(node):
        return None
    src = node.srcs[0]
    copy = Node("clone", (src,), (Ref(0), None), src.type)
    return node.replace(srcs=(copy,) + node.srcs[1:])


def legalize_views(graph: Graph, rebuilt=None) -> Graph:
    """``rebuilt(old, new)`` hears of each value rebuilt on a copied source (see ``ir.rewrite``)."""
    return rewrite(graph, _legal, rebuilt)
