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
from tilewise.compiler.passes.cleanup import cse, dce
from tilewise.compiler.passes.decompose import decompose
from tilewise.compiler.passes.functionalize import functionalize
from tilewise.compiler.passes.indexing import simplify_indexing
from tilewise.compiler.passes.layout import legalize_views
from tilewise.compiler.passes.simplify import simplify
from tilewise.config import log

Pass = Callable[[Graph], Graph]
PIPELINE: tuple[Pass, ...] = (functionalize, decompose, simplify, simplify_indexing, cse, dce, legalize_views)


def pipeline_for(target: str) -> tuple[Pass, ...]:
    """The passes for a code generation target: :data:`PIPELINE`, whose ``decompose`` keeps whole, on CUDA,
    the composites the backend runs as one library call (attention through cuDNN, when its operands allow)."""
    if target != "cuda":
        return PIPELINE

    def decompose_keeping_library_calls(graph: Graph) -> Graph:
        from tilewise.backends.cuda.attention import keeps

        return decompose(graph, keeps)

    decompose_keeping_library_calls.__name__ = "decompose"
    return tuple(decompose_keeping_library_calls if p is decompose else p for p in PIPELINE)


def run_pipeline(graph: Graph, passes: tuple[Pass, ...] = PIPELINE) -> Graph:
    log("graph", lambda: format_graph(graph, "captured"))
    checked(graph, "capture")
    for p in passes:
        with stage(p.__name__):
            graph = checked(p(graph), p.__name__)
        log("graph", lambda g=graph, name=p.__name__: format_graph(g, f"after {name}"))
    return graph


__all__ = ["PIPELINE", "Pass", "cse", "dce", "decompose", "functionalize", "legalize_views", "pipeline_for",
           "run_pipeline", "simplify", "simplify_indexing"]
