"""The import path of a Python process a test starts: this checkout first, then whatever the test's own
``PYTHONPATH`` held (where a host keeps packages outside site-packages, the child needs them as well)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_path(*first: str | Path) -> str:
    """``PYTHONPATH`` for a child: the checkout, then ``first``, then the inherited entries."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(ROOT), *map(str, first), *inherited])
