"""The package root re-exports; the package's own modules never import it.

``tilewise/__init__.py`` imports nearly every module of the package, so a module that imports the root back
(``import tilewise as tw``, ``from tilewise import log``) closes an import cycle through all of them. Modules
import a name from the module that defines it: dtypes from ``tilewise.dtypes``, tensors from
``tilewise.tensor``, factories from ``tilewise.ops.creation``, operators from ``tilewise.ops.functions``.
Only the top of the stack, which nothing imports back, may use the public API as a user does.
"""

from __future__ import annotations

import import_graph

import tilewise
from tilewise.ops import functions
from tilewise.ops.registry import OVERLOADS

# the command line, the demo and explain are the top of the stack and use the public API as a user does
_USERS_OF_THE_PUBLIC_API = {"tilewise.cli", "tilewise.models.demo", "tilewise.profiler.explain"}
# upward imports of the root that remain; each should go, and leave this set
_ROOT_IMPORTS_TO_REMOVE = {"tilewise.tensor"}


def _importers_of_root(edges) -> set[str]:
    return {module for module, targets in edges.items() if any(t == "tilewise" for t, _, _ in targets)}


def test_no_module_imports_the_package_root():
    importers = _importers_of_root(import_graph.graph())
    assert importers <= _USERS_OF_THE_PUBLIC_API | _ROOT_IMPORTS_TO_REMOVE, sorted(
        importers - _USERS_OF_THE_PUBLIC_API - _ROOT_IMPORTS_TO_REMOVE)


def test_users_of_the_public_api_are_in_no_import_cycle():
    in_cycles = {m for cycle in import_graph.cycles(import_graph.graph()) for m in cycle}
    assert not in_cycles & _USERS_OF_THE_PUBLIC_API, sorted(in_cycles & _USERS_OF_THE_PUBLIC_API)


def test_root_operators_are_the_ops_functions():
    """One list of public operator functions: the root's are ``tilewise.ops.functions``'s, the same objects."""
    assert functions.FUNCTIONS, "no public operator functions"
    for name, fn in functions.FUNCTIONS.items():
        assert getattr(tilewise, name) is fn, name
        assert getattr(functions, name) is fn, name
    public = {name for name, ops in OVERLOADS.items()
              if ops[0].attrs.get("public", True) and ops[0].attrs.get("function", True)}
    assert public <= set(functions.FUNCTIONS), sorted(public - set(functions.FUNCTIONS))
    assert sorted(functions.__all__) == sorted(functions.FUNCTIONS)


def test_operators_import_by_name_from_ops_functions():
    from tilewise.ops.functions import clip, log, where  # clip: an alias of clamp, under its own name as torch's

    assert (log, where, clip) == (tilewise.log, tilewise.where, tilewise.clip) and clip.__name__ == "clip"
