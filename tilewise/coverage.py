"""``python -m tilewise coverage``: how much of torch's API that training code uses tilewise has, and tests.

[Note: API coverage] The names come from ``tilewise/data/torch_api.json``, recorded from an installed torch by
``tests/torch_api_names.py`` (tilewise never imports torch), one list per namespace: ``torch``, ``Tensor``
methods and properties, ``nn`` classes, ``nn.functional``, ``nn.init``, ``nn.utils(.rnn)``, ``optim``,
``optim.lr_scheduler``, ``utils.data``, ``amp``, ``cuda``, the ``backends`` flags, ``linalg``, ``fft``,
``testing`` and the basic ``distributions``. Complex, sparse, quantized and named-tensor APIs, TorchScript
internals and the like are left out by rules that the JSON file records beside each name it leaves out.

A name is *present* when the same path resolves in tilewise (``tilewise.nn.functional.glu``,
``tilewise.Tensor.addcmul_``). It is *tested* when a test file that compares with torch (one that imports
torch) refers to it: as an attribute (``F.glu``, ``x.addcmul_``), a name, or the operator name of an OpInfo
entry (``OpInfo("glu")``). That is a static reading of the tests, not a run: it says a comparison exists,
and the test suite says whether it passes.
"""

from __future__ import annotations

import ast
import importlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

# The targets: the share of names present in each group of namespaces.
TARGETS = {"nn, nn.functional, optim, lr_scheduler, utils.data": (
    ("nn", "nn.functional", "optim", "optim.lr_scheduler", "utils.data"), 0.95),
    "torch and Tensor": (("torch", "Tensor"), 0.90)}

_NAMESPACE_ROOTS = {"torch": "tilewise", "Tensor": "tilewise.Tensor"}


@dataclass
class Namespace:
    name: str
    present: list[str] = field(default_factory=list)
    tested: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    excluded: int = 0

    @property
    def total(self) -> int:
        return len(self.present) + len(self.missing)


def load_names() -> dict:
    return json.loads(resources.files("tilewise").joinpath("data", "torch_api.json").read_text())


def resolve(path: str):
    """The object at a dotted path below tilewise (``nn.utils.rnn.pad_sequence``), or raise LookupError."""
    parts = path.split(".")
    obj = importlib.import_module("tilewise")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule that the package does not import eagerly
            obj = importlib.import_module("tilewise." + ".".join(parts[:i + 1]))
        except ImportError:
            raise LookupError(path) from None
    return obj


def _exists(path: str) -> bool:
    try:
        resolve(path)
        return True
    except (LookupError, AttributeError):
        return False


def names_in_tests(tests: Path | None) -> set[str] | None:
    """Identifiers the torch-comparing test files refer to; None when there is no test folder (an installed copy)."""
    if tests is None or not tests.is_dir():
        return None
    seen: set[str] = set()
    for path in sorted(tests.rglob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        if "torch" not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        if not _imports_torch(tree) and path.parent.name != "opinfos":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                seen.add(node.attr)
            elif isinstance(node, ast.Name):
                seen.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                seen.update(p for p in node.value.split(".") if p.isidentifier())  # "glu", "nn.functional.glu"
    return seen


def _imports_torch(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            return True
    return False


def measure(tests: Path | None = None) -> tuple[dict, list[Namespace], bool]:
    data = load_names()
    referenced = names_in_tests(tests)
    spaces = []
    for space, entry in data["namespaces"].items():
        ns = Namespace(space, excluded=len(entry["excluded"]))
        root = _NAMESPACE_ROOTS.get(space, "tilewise." + space).removeprefix("tilewise").lstrip(".")
        for name in entry["names"]:
            path = f"{root}.{name}" if root else name
            if _exists(path):
                ns.present.append(name)
                if referenced is not None and name.rsplit(".", 1)[-1] in referenced:
                    ns.tested.append(name)
            else:
                ns.missing.append(name)
        spaces.append(ns)
    return data, spaces, referenced is not None


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def report(data: dict, spaces: list[Namespace], counted_tests: bool) -> str:
    by_name = {ns.name: ns for ns in spaces}
    lines = ["# API coverage", "",
             f"Generated by `python -m tilewise coverage` against the public names of torch {data['torch_version']} "
             "(see `tilewise/coverage.py` for what counts as present and as tested).", "",
             "| namespace | torch names | present | tested | missing | present share |",
             "|---|---:|---:|---:|---:|---:|"]
    for ns in spaces:
        tested = str(len(ns.tested)) if counted_tests else "-"
        lines.append(f"| `{ns.name}` | {ns.total} | {len(ns.present)} | {tested} | {len(ns.missing)} | "
                     f"{_share(len(ns.present), ns.total)} |")
    lines += ["", "| target | present | share | target share | met? |", "|---|---:|---:|---:|---|"]
    for label, (members, goal) in TARGETS.items():
        present = sum(len(by_name[m].present) for m in members)
        total = sum(by_name[m].total for m in members)
        met = "yes" if total and present / total >= goal else "no"
        lines.append(f"| {label} | {present} / {total} | {_share(present, total)} | {goal:.0%} | {met} |")
    lines += ["", "## Missing, by namespace", ""]
    for ns in spaces:
        if ns.missing:
            lines += [f"**{ns.name}** ({len(ns.missing)}): " + ", ".join(f"`{n}`" for n in ns.missing), ""]
    if counted_tests:
        lines += ["## Present but referred to by no torch-comparing test", ""]
        for ns in spaces:
            untested = [n for n in ns.present if n not in set(ns.tested)]
            if untested:
                lines += [f"**{ns.name}** ({len(untested)}): " + ", ".join(f"`{n}`" for n in untested), ""]
    lines += ["## Left out of the count", "",
              "| reason | pattern |", "|---|---|"]
    lines += [f"| {reason} | `{pattern.replace('|', chr(92) + '|')}` |" for reason, pattern in data["rules"].items()]
    return "\n".join(lines) + "\n"


def summary(spaces: list[Namespace], counted_tests: bool) -> str:
    width = max(len(ns.name) for ns in spaces)
    rows = [f"{'namespace':<{width}}  present/total  tested"]
    for ns in spaces:
        tested = f"{len(ns.tested):>6}" if counted_tests else "     -"
        rows.append(f"{ns.name:<{width}}  {len(ns.present):>5}/{ns.total:<5} {_share(len(ns.present), ns.total):>6}"
                    f"  {tested}")
    return "\n".join(rows)


def default_tests_folder() -> Path | None:
    here = Path(__file__).resolve().parent.parent / "tests"
    return here if here.is_dir() else None


def run(out: Path | None, tests: Path | None) -> int:
    from tilewise.fileio import atomic_write_bytes

    data, spaces, counted = measure(tests)
    print(summary(spaces, counted))
    if not counted:
        print("(no tests/ folder beside the package: the tested column is not counted)")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, report(data, spaces, counted).encode(), durable=False)
        print(f"wrote {out}")
    return 0
