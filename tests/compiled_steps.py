"""What the programs written against ``torch`` wrap their steps in when a test runs them compiled."""

from __future__ import annotations


def compiled_if(framework, compiled: bool):
    """``framework.compile`` around the step a program marks, when ``compiled`` and the framework is tilewise; the
    torch reference always runs eagerly."""
    return framework.compile if compiled and framework.__name__ == "tilewise" else (lambda fn: fn)
