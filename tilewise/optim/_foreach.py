"""Multi-tensor updates: an optimizer step or a gradient clip over many tensors as one compiled program.

[Note: foreach updates] torch updates all of a group's parameters at once on CUDA (its ``foreach`` and
``fused`` implementations) instead of launching a few kernels per parameter. tilewise gets the same from its
compiler: the per-parameter update, written once as ordinary tensor operations, is compiled over the whole
list (``tilewise.compile`` fuses the pointwise work of every parameter into a few kernels and replays them as
a CUDA graph), and the compiled program writes parameters and state back in place. The arithmetic is the
single-tensor loop's, so both give the same values. Hyperparameters that change during training (the
learning rate under a scheduler) go in as a 0-dim tensor, so a new value does not recompile.

``foreach``/``fused``: None (the default) compiles on CUDA, and on the CPU where the tensors hold at least
``settings.cpu_fused_min_elements`` elements in all (``TILEWISE_CPU_FUSED``): there the loop runs about a
dozen numpy calls per parameter, and a small nanoGPT's AdamW step took 56 ms looped against 3.2 ms compiled
(28 parameters, 2 cores); fewer elements loop, as torch's CPU default does. True compiles on any device (C on
the CPU); False loops. Inside a function being compiled the loop is always
used: it is what the enclosing trace records and fuses.
"""

from __future__ import annotations

from tilewise.config import settings
from tilewise.dispatch import STATE
from tilewise.tensor import Tensor

MAX_PROGRAMS = 64  # compiled update functions kept per cache; past it, the oldest is dropped


def use_compiled(choice: bool | None, tensors: list[Tensor]) -> bool:
    """Whether to run a multi-tensor update compiled (see [Note: foreach updates])."""
    if STATE.trace_depth or choice is False or not tensors:
        return False
    if choice:
        return True
    if all(t._device.type == "cuda" for t in tensors):
        return True
    least = settings.cpu_fused_min_elements
    return least >= 0 and all(t._device.type == "cpu" for t in tensors) and sum(t.numel() for t in tensors) >= least


def compiled(cache: dict, key, fn):
    """The compiled form of ``fn`` kept in ``cache`` under ``key``, made on first use."""
    found = cache.get(key)
    if found is None:
        from tilewise.compiler import compile as compile_fn

        if len(cache) >= MAX_PROGRAMS:
            cache.pop(next(iter(cache)))
        found = cache[key] = compile_fn(fn)
    return found


class ScalarTensors:
    """0-dim float64 tensors holding Python numbers, one per (name, device), refilled when the number changes:
    what a compiled update reads as a run-time value."""

    def __init__(self) -> None:
        self._held: dict = {}

    def find(self, name: str, value: float, device) -> Tensor | None:
        """The tensor held for ``name`` on ``device`` if it holds ``value`` now, else None (nothing is filled)."""
        held = self._held.get((name, device))
        return held[1] if held is not None and held[0] == value else None

    def get(self, name: str, value: float, device) -> Tensor:
        from tilewise import dtypes
        from tilewise.ops.creation import full

        key = (name, device)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = [value, full((), value, dtype=dtypes.float64, device=device)]
        elif held[0] != value:
            held[1].fill_(value)
            held[0] = value
        return held[1]
