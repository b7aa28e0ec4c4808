"""NVTX ranges from the profiler's hooks: what ``tilewise.autograd.profiler.emit_nvtx`` turns on.

[Note: NVTX ranges] ``emit_nvtx`` needs the same moments the profiler records — an operator call, an autograd
node's work, a compiled program and each of its steps, a ``record_function`` block — so it does not add hooks
of its own: an ``NvtxRanges`` joins ``recorder.ACTIVE`` beside any profile, and where a ``Recorder`` would
open and close an event it pushes and pops an NVTX range named the same (an operator's name gets ``, sizes =
[...]`` with ``record_shapes``, as torch's). It records nothing else (no memory, no device time). Module
forwards get a range too, ``nn.Module: <class name>``, through ``module.forward_range``, set only while
ranges are emitted. When none is, nothing here runs: the dispatcher's Profiler key is off unless a profile
or an ``emit_nvtx`` is active.
"""

from __future__ import annotations

import contextlib

from tilewise.autograd import profiler as autograd_profiler
from tilewise.cuda import nvtx
from tilewise.nn.modules import module as nn_module
from tilewise.profiler.recorder import activate, deactivate, input_shapes


class Range:
    """What ``open`` returns: the profiler's hooks may write a range's trace ``args``, which NVTX ignores."""

    __slots__ = ("args", "input_shapes")

    def __init__(self):
        self.args = {}
        self.input_shapes = []


class NvtxRanges:
    """A stand-in for a ``Recorder`` in ``recorder.ACTIVE`` whose events are NVTX ranges."""

    profile_memory = False
    with_flops = False
    use_cuda = False
    times_with_events = False
    tracer = None

    def __init__(self, record_shapes: bool = False):
        self.record_shapes = record_shapes
        self.active = False

    def open(self, name: str, kind: str, args: tuple | None = None) -> Range:
        if self.record_shapes and args is not None:
            name = f"{name}, sizes = {input_shapes(args)}"
        nvtx.range_push(name)
        return Range()

    def close(self, event: Range) -> None:
        nvtx.range_pop()


@contextlib.contextmanager
def module_range(module):
    nvtx.range_push(f"nn.Module: {type(module).__name__}")
    try:
        yield
    finally:
        nvtx.range_pop()


@contextlib.contextmanager
def emitting(record_shapes: bool):
    """NVTX ranges while entered (``emit_nvtx``'s body); like torch, the device is synchronised on both sides,
    so ranges and the work before or after them do not overlap on the timeline."""
    ranges = NvtxRanges(record_shapes)
    _synchronize()
    activate(ranges)
    nn_module.forward_range = module_range
    try:
        yield ranges
    finally:
        nn_module.forward_range = None
        deactivate(ranges)
        _synchronize()


def _synchronize() -> None:
    from tilewise import cuda

    if cuda.is_available():
        cuda.synchronize()


autograd_profiler.register_nvtx_ranges(emitting)
