"""One model source for both libraries: a file written against ``tilewise`` runs as a PyTorch program once its
import lines say ``torch`` instead, the rest of the file unchanged (which is the point of a torch-compatible API).
The benchmarks that compare tilewise with torch load their models through here, so both sides run the same code.
"""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path


def as_torch(source: str) -> str:
    """The same program for PyTorch: ``tilewise`` becomes ``torch`` in the import lines, nothing else changes."""
    lines = []
    for line in source.splitlines(keepends=True):
        if re.match(r"\s*(import|from)\s+tilewise\b", line):
            line = re.sub(r"\btilewise\b", "torch", line)
        lines.append(line)
    return "".join(lines)


@functools.cache
def module_for(path: Path, library: types.ModuleType) -> types.ModuleType:
    """The model file at ``path`` as a module of ``library`` (tilewise, or torch through ``as_torch``)."""
    source = path.read_text()
    if library.__name__ == "torch":
        source = as_torch(source)
    module = types.ModuleType(f"{path.stem}_on_{library.__name__}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{path.name} ({library.__name__} imports)", "exec"), module.__dict__)
    return module
