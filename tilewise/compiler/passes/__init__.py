"""The compiler's passes: named functions from Graph to Graph, run in order by ``run_pipeline``.

[Note: passes] Like tinygrad's list of rewrites, every stage of the compiler is one named function that
takes a graph and returns a new one, so each can be dumped (``TILEWISE_LOG=graph`` prints the graph after
every pass), bisected (``run_pipeline(graph, PIPELINE[:k])``) and tested alone. The invariant checker
runs after each pass, so a pass that breaks the IR fails where it ran, not three stages later.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise._stages import stage
from tilewise.compiler.ir import Graph, checked, format_graph
from tilewise.compiler.passes.cats import cats_of_pointwise
from tilewise.compiler.passes.cleanup import cse, dce
from tilewise.compiler.passes.decompose import decompose
from tilewise.compiler.passes.functionalize import functionalize
from tilewise.compiler.passes.indexing import simplify_indexing
from tilewise.compiler.passes.layout import legalize_views
from tilewise.compiler.passes.simplify import simplify
from tilewise.config import log

Pass = Callable[[Graph], Graph]
PIPELINE: tuple[Pass, ...] = (functionalize, decompose, simplify, simplify_indexing, cats_of_pointwise, cse, dce,
                              legalize_views)


def run_pipeline(graph: Graph, passes: tuple[Pass, ...] = PIPELINE, history: list | None = None) -> Graph:
    """Run ``passes`` in order; ``history``, when given, receives (stage, graph) for the captured graph and
    the graph after each pass (what ``explain`` shows of a compiled program)."""
    log("graph", lambda: format_graph(graph, "captured"))
    checked(graph, "capture")
    if history is not None:
        history.append(("captured", graph))
    for p in passes:
        with stage(p.__name__):
            graph = checked(p(graph), p.__name__)
        log("graph", lambda g=graph, name=p.__name__: format_graph(g, f"after {name}"))
        if history is not None:
            history.append((p.__name__, graph))
    return graph


__all__ = ["PIPELINE", "Pass", "cats_of_pointwise", "cse", "dce", "decompose", "functionalize", "legalize_views",
           "run_pipeline", "simplify", "simplify_indexing"]
