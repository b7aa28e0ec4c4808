"""``tilewise.profiler``: torch.profiler's API over tilewise's dispatcher and compiled programs.

[Note: profile] ``profile`` is torch's state machine, action for action: a ``schedule`` maps each step number
to a ``ProfilerAction`` (NONE, WARMUP, RECORD, RECORD_AND_SAVE), and the pair (previous action, next action)
picks the same transitions torch's ``action_map`` does (prepare a recording, start it, stop it, hand it to
``on_trace_ready``), warnings for malformed schedules included. A recording is a ``recorder.Recorder``; while
one is started the dispatcher's Profiler key puts every operator call, compiled program and program step into
it (see [Note: the Profiler key]). What the user reads — ``events()``, ``key_averages()``, the table,
``export_chrome_trace`` — is built from the last recording that stopped, as torch reports only the last cycle.
With CUDA among the activities, the device's kernels, copies and memsets come from CUPTI where cupti-python is
installed (see [Note: device activity]), each its own row under its kernel's name.

>>> import tilewise as tw
>>> from tilewise.profiler import profile, ProfilerActivity
>>> x = tw.ones(4)
>>> with profile(activities=[ProfilerActivity.CPU]) as prof:
...     y = x + x
>>> [e.name for e in prof.events()]
['aten::add']
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Callable, Iterable
from contextlib import ContextDecorator
from enum import Enum
from functools import partial

from tilewise.profiler import recorder as _recorder
from tilewise.profiler.chrome_trace import write_chrome_trace
from tilewise.profiler.events import EventList
from tilewise.profiler.recorder import Recorder, activate, deactivate


class ProfilerActivity(Enum):
    CPU = 0
    CUDA = 1


class ProfilerAction(Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def supported_activities() -> set[ProfilerActivity]:
    from tilewise import cuda

    return {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if cuda.is_available() else set())


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0) -> Callable[[int], ProfilerAction]:
    """torch.profiler.schedule: skip ``skip_first`` steps, then cycles of ``wait`` idle, ``warmup`` and ``active``
    recorded steps (the last one saved), ``repeat`` times (0: until the profiler stops).

    >>> s = schedule(wait=1, warmup=1, active=2, repeat=1)
    >>> [s(k).name for k in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
    """
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise AssertionError(
            f"Invalid profiler schedule arguments. Got wait={wait} (need >= 0), warmup={warmup} (need >= 0), "
            f"active={active} (need > 0), repeat={repeat} (need >= 0), skip_first={skip_first} (need >= 0).")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results", stacklevel=2)

    def schedule_fn(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"Step must be non-negative. Got {step}.")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait != 0:
            step += wait
        cycle = wait + warmup + active
        if repeat > 0 and step / cycle >= repeat:
            return ProfilerAction.NONE
        position = step % cycle
        if position < wait:
            return ProfilerAction.NONE
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if position < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return schedule_fn


def _default_schedule(_: int) -> ProfilerAction:
    return ProfilerAction.RECORD


class record_function(ContextDecorator):  # noqa: N801 — torch's name
    """A named range of user code, recorded as a ``user_annotation`` event around what runs inside it.

    >>> import tilewise as tw
    >>> from tilewise.profiler import profile, record_function
    >>> x = tw.ones(2)
    >>> with profile() as prof:
    ...     with record_function("block"):
    ...         y = x * 2 + 1
    >>> [(e.name, [c.name for c in e.cpu_children]) for e in prof.events()][0]
    ('block', ['aten::mul', 'aten::add'])
    """

    def __init__(self, name: str, args: str | None = None):
        self.name = name
        self.args = args
        self._opened: list = []

    def __enter__(self) -> record_function:
        self._opened = [(r, r.open(self.name, "user_annotation")) for r in _recorder.ACTIVE]
        return self

    def __exit__(self, *exc) -> bool:
        opened, self._opened = self._opened, []
        for r, event in reversed(opened):
            r.close(event)
        return False


class profile:  # noqa: N801 — torch's name
    """torch.profiler.profile: a context manager (or ``start()``/``step()``/``stop()``) recording operators,
    compiled programs and their steps, ``record_function`` ranges, memory and device time."""

    def __init__(self, *, activities: Iterable[ProfilerActivity] | None = None,
                 schedule: Callable[[int], ProfilerAction] | None = None,
                 on_trace_ready: Callable | None = None, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False, with_modules: bool = False,
                 acc_events: bool = False):
        self.activities = set(activities) if activities is not None else supported_activities()
        if not self.activities:
            raise AssertionError("No valid profiler activities found")
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules  # accepted for torch's signature: tilewise's modules are not recorded
        self.acc_events = acc_events
        self.record_steps = schedule is not None
        self.schedule = schedule or _default_schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self.step_rec_fn: record_function | None = None
        self.recorder: Recorder | None = None  # the recording being prepared or made
        self.profiler: Recorder | None = None  # the last recording that stopped: what the results read
        self._events: EventList | None = None
        self._accumulated: list = []
        self.action_map = self._actions()

    def _actions(self) -> dict:
        a = ProfilerAction
        prepare, start, stop, ready = self.prepare_trace, self.start_trace, self.stop_trace, self._trace_ready
        return {
            (a.NONE, a.NONE): [], (a.NONE, a.WARMUP): [prepare], (a.NONE, a.RECORD): [prepare, start],
            (a.NONE, a.RECORD_AND_SAVE): [prepare, start],
            (a.WARMUP, a.NONE): [partial(warnings.warn, "Incorrect schedule: WARMUP followed by NONE"), start, stop],
            (a.WARMUP, a.WARMUP): [], (a.WARMUP, a.RECORD): [start], (a.WARMUP, a.RECORD_AND_SAVE): [start],
            (a.RECORD, a.NONE): [partial(warnings.warn, "Incorrect schedule: RECORD followed by NONE"), stop],
            (a.RECORD, a.WARMUP): [partial(warnings.warn, "Incorrect schedule: RECORD followed by WARMUP"), stop],
            (a.RECORD, a.RECORD): [], (a.RECORD, a.RECORD_AND_SAVE): [],
            (a.RECORD_AND_SAVE, a.NONE): [stop, ready], (a.RECORD_AND_SAVE, a.WARMUP): [stop, ready, prepare],
            (a.RECORD_AND_SAVE, a.RECORD): [stop, ready, prepare, start],
            (a.RECORD_AND_SAVE, a.RECORD_AND_SAVE): [stop, ready, prepare, start],
            (a.WARMUP, None): [start, stop], (a.RECORD, None): [stop, ready],
            (a.RECORD_AND_SAVE, None): [stop, ready],
        }

    # ------------------------------------------------------------------ torch's state machine
    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._transit_action(ProfilerAction.NONE, self.current_action)
        if self.record_steps:
            self.step_rec_fn = record_function(f"ProfilerStep#{self.step_num}")
            self.step_rec_fn.__enter__()

    def stop(self) -> None:
        try:
            if self.record_steps and self.step_rec_fn:
                self.step_rec_fn.__exit__(None, None, None)
                self.step_rec_fn = None
        finally:  # whatever failed, the dispatcher stops recording
            self._transit_action(self.current_action, None)

    def step(self) -> None:
        """Signal that the next step has started: the schedule's next action decides what happens."""
        if self.record_steps and self.step_rec_fn:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None
        previous = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit_action(previous, self.current_action)
        if self.record_steps:
            self.step_rec_fn = record_function(f"ProfilerStep#{self.step_num}")
            self.step_rec_fn.__enter__()

    def _transit_action(self, previous, current) -> None:
        for action in self.action_map.get((previous, current), ()):
            action()

    def prepare_trace(self) -> None:
        self.recorder = Recorder(record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                                 with_stack=self.with_stack, with_flops=self.with_flops,
                                 use_cuda=ProfilerActivity.CUDA in self.activities)

    def start_trace(self) -> None:
        if self.recorder is None:
            self.prepare_trace()
        self.recorder.start_device_activity()
        activate(self.recorder)

    def stop_trace(self) -> None:
        recorder = self.recorder
        if recorder is None or not recorder.active:
            return
        deactivate(recorder)
        recorder.stop_device_activity()
        recorder.finish()
        self.profiler, self.recorder, self._events = recorder, None, None
        if self.acc_events:
            self._accumulated.append(recorder)

    def _trace_ready(self) -> None:
        if self.on_trace_ready:
            self.on_trace_ready(self)

    # ------------------------------------------------------------------ results
    def events(self) -> EventList:
        """The last recording's events, host ranges in start order, then the device kernels."""
        if self._events is None:
            recorders = self._accumulated if self.acc_events else [self.profiler] if self.profiler else []
            events = [e for r in recorders for e in r.event_list()]
            use_device = "cuda" if ProfilerActivity.CUDA in self.activities else None
            self._events = EventList(events, use_device, self.profile_memory, self.with_flops)
        return self._events

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        return self.events().key_averages(group_by_input_shape, group_by_stack_n)

    def export_chrome_trace(self, path: str) -> None:
        """Write the last recording as Chrome trace-event JSON (Perfetto, chrome://tracing), atomically."""
        if self.profiler is None:
            raise RuntimeError("export_chrome_trace: the profiler has recorded nothing yet (use it as a context "
                               "manager, or call start() and stop() first)")
        write_chrome_trace(path, self.profiler, self.events(), self._metadata())

    def _metadata(self) -> dict:
        return {"with_stack": self.with_stack, "profile_memory": self.profile_memory,
                "record_shapes": self.record_shapes, "host_name": socket.gethostname()}


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, use_gzip: bool = False,
                              use_python_export: bool = False) -> Callable:
    """An ``on_trace_ready`` that writes each saved recording to ``dir_name`` as torch's handler names it:
    ``{worker}.{time in ns}.pt.trace.json``, with ``.gz`` and gzip-compressed when ``use_gzip``. The name carries
    nanoseconds, so two recordings saved within one millisecond do not overwrite each other.
    ``use_python_export`` picks torch's exporter; tilewise has one, so it changes nothing."""
    del use_python_export

    def handler(prof: profile) -> None:
        try:
            os.makedirs(dir_name, exist_ok=True)
        except OSError as error:
            raise RuntimeError(f"tensorboard_trace_handler: can't create directory: {dir_name}") from error
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        name = f"{worker}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, name))

    return handler

