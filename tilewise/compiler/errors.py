"""The compiler's errors, and where in the user's code they point.

A compiled function reports what it cannot do at the user's own line: ``user_frame`` walks out of
tilewise's frames (and the generated binders, derivatives and numpy kernels) to the innermost frame of the
caller's code.
"""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GENERATED = ("<binder", "<derivative", "<numpy kernel")


class DataDependentError(RuntimeError):
    """Python code asked for the value of a tensor while ``tilewise.compile`` was tracing it."""


class UnsupportedTargetError(RuntimeError):
    """What the function does has no generated code (mixed devices, complex tensors, host-checked solvers): it runs
    eagerly, or with ``fullgraph=True`` raises."""


def user_frame() -> tuple[str, int, str]:
    """(file, line, source text) of the innermost frame outside tilewise."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        inside = os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep) or path.startswith(_GENERATED)
        if not inside:
            import linecache

            return path, frame.f_lineno, linecache.getline(path, frame.f_lineno).strip()
        frame = frame.f_back
    return "<unknown>", 0, ""


def data_dependent_error(what: str) -> DataDependentError:
    path, line, text = user_frame()
    return DataDependentError(
        f"{what} needs the value of a tensor, but inside tilewise.compile tensors are traced and have no values "
        f"yet.\n  at {path}:{line}: {text}\nKeep the computation in tensors (tilewise.where(cond, a, b) instead of "
        "`if`, arithmetic masks instead of boolean indexing), or move this line out of the compiled function "
        "and compile the code before and after it separately.")
