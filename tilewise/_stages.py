"""Where the time of a compile goes: seconds per named stage, reported by ``TILEWISE_LOG=compile``.

A compile opens a :class:`Stages` (``with Stages() as stages: ...``); code anywhere below it, in the compiler
or in a backend it calls (cuBLASLt's algorithm choice, cuDNN's graph builds), marks its work with
``with stage("name"):``, which costs one global read when no compile is being timed. Stages nest: a stage's
time includes the stages inside it, and the report indents them under it.
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager

_active: list[Stages] = []  # the compiles being timed, innermost last


class Stages:
    def __init__(self) -> None:
        self.seconds: dict[tuple[str, ...], float] = {}  # path of stage names -> seconds, in first-seen order
        self.counts: dict[tuple[str, ...], int] = {}
        self.path: tuple[str, ...] = ()
        self.start = time.perf_counter()
        self.total = 0.0
        self.thread = 0  # the thread compiling (set on entry): other threads' work is not its stages

    def __enter__(self) -> Stages:
        _active.append(self)
        self.thread = threading.get_ident()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.total = time.perf_counter() - self.start
        _active.remove(self)

    def add(self, key: tuple[str, ...], seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.counts[key] = self.counts.get(key, 0) + 1

    def report(self, title: str) -> str:
        lines = [f"{title}: {self.total:.2f} s"]
        for key, seconds in self.seconds.items():
            count = self.counts[key]
            times = f" ({count} times)" if count > 1 else ""
            lines.append(f"{'  ' * len(key)}{key[-1]}: {seconds:.3f} s{times}")
        return "\n".join(lines)


@contextmanager
def stage(name: str):
    """Count the time of the ``with`` body as stage ``name`` of the compile being timed, if one is."""
    if not _active or _active[-1].thread != threading.get_ident():
        yield
        return
    stages = _active[-1]
    outer = stages.path
    stages.path = key = (*outer, name)
    stages.seconds.setdefault(key, 0.0)  # listed where it starts: before the stages inside it
    start = time.perf_counter()
    try:
        yield
    finally:
        stages.path = outer
        stages.add(key, time.perf_counter() - start)


_pause_lock = threading.Lock()
_pauses = 0  # compiles under way with the collector paused (threads may compile at once)
_was_enabled = False


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the ``with`` body: a compile makes hundreds of thousands of small
    objects (graph nodes, kernel IR, rendered text) that live until it ends, and each automatic collection walks
    them all again, a third of a GPT-2 step's compile on the host. Garbage the body leaves in cycles is
    collected by the first automatic collection after it. Nested and concurrent pauses count; the collector comes
    back on when the last ends, if it was on before the first."""
    global _pauses, _was_enabled
    with _pause_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
