"""The package's structure: its import graph keeps the layers of docs/ARCHITECTURE.md, and targets are objects.

See [Note: layers] in tests/import_graph.py for the layers and what counts as an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import import_graph as g
import pytest

EDGES = g.graph()


def test_every_module_has_a_layer():
    assert [m for m in EDGES if g.layer_of(m) < 0] == []


def test_no_module_imports_a_higher_layer():
    arrows = [f"{m}:{line} imports {t} ({g.LAYERS[g.layer_of(m)][0]} -> {g.LAYERS[g.layer_of(t)][0]})"
              for m, t, line in g.upward_arrows(EDGES)]
    assert arrows == [], "register a hook in the lower layer instead (see docs/ARCHITECTURE.md):\n" + "\n".join(arrows)


def test_no_import_cycles():
    cycles = g.cycles(EDGES)
    described = []
    for members in cycles:
        inside = set(members)
        ties = [f"    {m}:{line} -> {t}{' (in a function)' if local else ''}"
                for m in members for t, line, local in EDGES[m] if t in inside]
        described.append(f"{len(members)} modules:\n" + "\n".join(ties))
    assert cycles == [], "import cycles:\n" + "\n".join(described)


def test_allowed_upward_imports_are_still_needed():
    present = {(m, t) for m, ts in EDGES.items() for t, _, _ in ts}
    assert [pair for pair in g.ALLOWED_UPWARD if pair not in present] == []


def test_the_reader_finds_what_it_should():
    """The graph reader sees imports inside functions and resolves relative and ``from package import module``
    forms: a mistake there would let arrows through unseen."""
    edges = dict(EDGES)
    assert any(t == "tilewise.codegen.render.kernel_cuda" for t, _, _ in edges["tilewise.compiler.program_cuda"])
    attention = "tilewise.backends.cuda.attention"
    assert [(t, local) for t, _, local in edges["tilewise.compiler.targets"] if t == attention] == [(attention, True)]
    assert g.layer_of("tilewise.codegen.schedule") < g.layer_of("tilewise.backends.cuda.kernels.pointwise") \
        < g.layer_of("tilewise.compiler.program")


def _string_comparisons(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in ("c", "cuda")
                                                 for c in [node.left, *node.comparators]):
            names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
            if any("target" in n for n in names):
                found.append(f"{path.relative_to(g.ROOT)}:{node.lineno}")
    return found


def test_targets_are_objects_not_strings():
    """No ``if target == "cuda"`` in the compiler or the code generator: what differs per target is a field of its
    ``Target`` (compiler/targets.py)."""
    found = [hit for folder in ("compiler", "codegen", "profiler")
             for p in sorted((g.PACKAGE / folder).rglob("*.py")) for hit in _string_comparisons(p)]
    assert found == []


def test_targets_are_registered_once_and_complete():
    from tilewise.compiler.targets import TARGETS, Target, register_target

    assert sorted(TARGETS) == ["c", "cuda"]
    assert {t.device_type for t in TARGETS.values()} == {"cpu", "cuda"}
    with pytest.raises(ValueError, match="registered already"):
        register_target(TARGETS["c"])
    for target in TARGETS.values():
        assert isinstance(target, Target) and target.passes and callable(target.build)


def test_explain_runs_the_pipeline_compile_runs():
    """explain shows the programs compile built (``compiled.programs()``), or for another target what
    ``CompiledFunction.lowered`` lowers with that target's passes and lowering stages (on CUDA: decompose
    keeping cuDNN attention, then recomputing large activations in the backward, GEMM epilogues, then the
    channels-last layout of convolutions and the order cuDNN writes attention results in); it runs no pipeline of
    its own."""
    from tilewise.compiler.targets import CUDA_TARGET

    source = (g.PACKAGE / "profiler" / "explain.py").read_text()
    assert ".programs()" in source and ".lowered(chosen" in source
    assert "PIPELINE" not in source and "run_pipeline" not in source and "lower_program" not in source
    assert [name for name, _ in CUDA_TARGET.lowering] == ["recompute_activations", "gemm_epilogues", "channels_last",
                                                           "attention_layouts"]


def test_a_formula_helper_name_is_bound_once():
    """Derivative formulas are strings naming helpers: a second module binding a name to another function would
    silently change every formula that calls it, so the registry refuses it."""
    from tilewise.ops.formulas import HELPERS

    def cat_backward(*args):  # not the helper of that name
        return args

    with pytest.raises(RuntimeError, match="'cat_backward' is declared twice"):
        HELPERS.update(cat_backward=cat_backward)
    HELPERS.update(cat_backward=HELPERS["cat_backward"])  # the same function again is no conflict
