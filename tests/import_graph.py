"""The package's import graph, read from the source (every ``import``, at module level or inside a function).

[Note: layers] ``LAYERS`` lists the package's layers from the bottom up, each with the modules it holds
(a module belongs to the layer of its longest matching prefix). A module may import from its own layer or
from any layer below it; an import of a higher layer is an *upward arrow*. The few places where a lower
layer must reach a higher one at run time are *plug-in points*: the higher layer registers a function into
a hook the lower layer owns, and nothing is imported upward. ``ALLOWED_UPWARD`` names the upward imports
that remain on purpose, each with its reason; the test in ``test_architecture.py`` fails on any other
upward arrow and on any import cycle between modules (an import inside a function counts: it still makes
the two modules depend on each other; one under ``if TYPE_CHECKING:`` does not, since it never runs), and
``test_plugins.py`` holds the core layers (``CORE_LAYERS``) to the same. ``python tests/import_graph.py [-v]``
prints every upward arrow and every cycle, then the core's count and the plug-in points.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tilewise"

# Bottom first. The tensor model, then the dispatcher, the operator library, autograd, code generation, the
# device backends, the compiler, and the API built over all of them.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", (
        "tilewise.config", "tilewise.dtypes", "tilewise.device", "tilewise.strides", "tilewise._philox",
        "tilewise.fileio", "tilewise._stages", "tilewise._cuda_api", "tilewise.data", "tilewise._plugins",
        "tilewise.layouts", "tilewise._warnings",
    )),
    ("tensor", ("tilewise.storage", "tilewise.tensor", "tilewise.tensortypes", "tilewise._tensor_str",
                "tilewise.overrides", "tilewise._C")),
    # grad modes only switch the dispatcher's Autograd key, so the operator library may use them
    ("dispatch", ("tilewise.dispatch", "tilewise._grad_mode")),
    ("ops", ("tilewise.ops",)),
    ("autograd", ("tilewise.autograd", "tilewise.amp.autocast_mode")),
    ("codegen", ("tilewise.codegen",)),
    ("backends", ("tilewise.backends",)),
    ("compiler", ("tilewise.compiler",)),
    ("api", (
        "tilewise", "tilewise.nn", "tilewise.optim", "tilewise.utils", "tilewise.distributions", "tilewise.amp",
        "tilewise.cuda", "tilewise.cpu", "tilewise.linalg", "tilewise.fft", "tilewise.serialization",
        "tilewise._pickle", "tilewise._torch_format", "tilewise._dlpack", "tilewise.accelerator",
        "tilewise.models", "tilewise.coverage", "tilewise.quant", "tilewise.float8", "tilewise.testing",
    )),
    ("cli", ("tilewise.cli", "tilewise.__main__")),
]

# (importer, imported) -> why this upward import stays. Keep this list short: every entry is a layer
# reaching up, which a registration point would usually serve better (``tilewise/_plugins.py`` lists those).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# The layers whose own modules, together, must have no upward arrow and no cycle (the test in
# ``test_plugins.py`` holds them to it while the layers above are being untangled).
CORE_LAYERS = ("base", "tensor", "dispatch", "ops", "autograd", "backends")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to: itself if it is one, else its longest prefix that is."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a tilewise module in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((t, child.lineno, local) for a in child.names if (t := _resolve(a.name, modules)))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    target = _resolve(f"{base}.{alias.name}", modules) if base else None
                    if target and target != module:
                        found.append((target, child.lineno, local))
            if not isinstance(child, ast.If) or not _is_type_checking(child):
                visit(child, inner)

    visit(tree, False)
    return [f for f in found if f[0].startswith("tilewise") and f[0] != module]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for k, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = k, len(prefix)
    return best


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    modules = all_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def upward_arrows(edges: dict[str, list[tuple[str, int, bool]]]) -> list[tuple[str, str, int]]:
    out = []
    for module, targets in edges.items():
        for target, line, _ in targets:
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED_UPWARD:
                out.append((module, target, line))
    return sorted(set(out))


def cycles(edges: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    succ = {m: sorted({t for t, _, _ in ts if t in edges}) for m, ts in edges.items()}
    # a package's __init__ importing its own submodules to re-export them is no cycle of meaning, but a
    # submodule importing its package's __init__ back is: keep both directions, as Python sees them
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for root in succ:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = succ[node]
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return comps


def plug_ins() -> tuple:
    """The plug-in points that stand in for upward imports (see [Note: plug-in points] in ``_plugins.py``)."""
    sys.path.insert(0, str(ROOT))
    from tilewise._plugins import PLUG_INS

    return PLUG_INS


def core_problems(edges: dict[str, list[tuple[str, int, bool]]]) -> tuple[list, list]:
    """Upward arrows from a module of ``CORE_LAYERS``, and cycles among those modules."""
    core = {m for m in edges if LAYERS[layer_of(m)][0] in CORE_LAYERS}
    arrows = [a for a in upward_arrows(edges) if a[0] in core]
    sub = {m: [e for e in edges[m] if e[0] in core] for m in core}
    return arrows, cycles(sub)


def main() -> None:
    edges = graph()
    unplaced = [m for m in edges if layer_of(m) < 0]
    for m in unplaced:
        print(f"module without a layer: {m}")
    arrows = upward_arrows(edges)
    by_pair: dict[tuple[str, str], list] = defaultdict(list)
    for module, target, line in arrows:
        by_pair[(LAYERS[layer_of(module)][0], LAYERS[layer_of(target)][0])].append(f"{module}:{line} -> {target}")
    print(f"{len(arrows)} upward arrows")
    for pair, items in sorted(by_pair.items(), key=lambda kv: -len(kv[1])):
        print(f"  {pair[0]} -> {pair[1]}: {len(items)}")
        if "-v" in sys.argv:
            for item in items:
                print(f"      {item}")
    comps = cycles(edges)
    print(f"{len(comps)} cycles: sizes {[len(c) for c in comps]}")
    if "-v" in sys.argv:
        for c in comps:
            print("   ", " ".join(c))
    core_arrows, core_cycles = core_problems(edges)
    print(f"core layers ({', '.join(CORE_LAYERS)}): {len(core_arrows)} upward arrows, {len(core_cycles)} cycles")
    points = plug_ins()
    print(f"{len(points)} plug-in points (tilewise/_plugins.py)")
    if "-v" in sys.argv:
        for p in points:
            print(f"    {p.slot:45} <- {p.filled_by}: {p.why}")


if __name__ == "__main__":
    main()
