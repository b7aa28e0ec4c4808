"""cse and dce: common-subexpression and dead-code elimination.

Nodes are hash-consed, so equal expressions are already one object once their operands are; ``cse``
rebuilds the graph bottom-up so that merges made possible by earlier rewrites happen, and ``dce`` keeps
only what an output or a write-back needs.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, rewrite, toposort


def cse(graph: Graph) -> Graph:
    return rewrite(graph, lambda node: None)


def dce(graph: Graph) -> Graph:
    live = set(toposort(graph.roots(), stop=set(graph.inputs)))
    return Graph(list(graph.inputs), [n for n in graph.body if n in live], list(graph.outputs), list(graph.writes))
