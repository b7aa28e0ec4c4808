"""Warnings that point at the user's line, as torch's do.

torch's warnings raised in C++ ("Triggered internally") and those its Python functions raise with ``stacklevel=2``
name the line of the script that made the call. tilewise reaches an operator through binders, the dispatcher and a
backend, so a fixed ``stacklevel`` names one of those frames or another depending on the path; these helpers count
the frames up to the first one outside the package instead. ``warn_once`` is torch's ``TORCH_WARN_ONCE``: the
warning is given the first time in a process, whatever the warnings filters say later.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_GIVEN_ONCE: set[str] = set()


def inside_tilewise(filename: str) -> bool:
    """A frame of tilewise's own code: one of its files, or the argument binders it generates."""
    return filename.startswith(_PACKAGE) or filename.startswith("<binder ")


def levels_to_the_caller(skip: int = 0) -> int:
    """The ``stacklevel`` that points a warning raised by the function ``skip`` frames below the caller of this one
    at the first frame outside tilewise."""
    frame, level = sys._getframe(2 + skip), 2 + skip
    while frame is not None and inside_tilewise(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` at the user's line."""
    warnings.warn(message, category, stacklevel=levels_to_the_caller(1))


def warn_once(message: str, category: type[Warning] = UserWarning) -> None:
    """``warn_at_caller``, the first time in this process only (torch's ``TORCH_WARN_ONCE``)."""
    if message not in _GIVEN_ONCE:
        _GIVEN_ONCE.add(message)
        warnings.warn(message, category, stacklevel=levels_to_the_caller(1))
