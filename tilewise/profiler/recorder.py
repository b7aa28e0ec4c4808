"""One recording of the profiler: the events of every thread while it is active, and the dispatcher's hooks.

[Note: the Profiler key] The dispatcher checks one module flag, ``dispatch.profiling``, per operator call, and
a compiled program one per run (``compiler.program``); nothing else of the profiler costs anything while no
profile records. While one does, ``profile_op`` is the dispatcher's first key: it opens an event named as torch
names the operator (``aten::add``) on the calling thread's stack of open ranges, runs the keys below the
profiler, and closes it, so that the primitives a composite calls, each dispatched again, become its children
(torch's self time is the total less the children). ``profile_program`` does the same for a compiled call,
with one child per program step (a generated kernel, a library call, a copy) named after what it runs.

Every thread has its own stack (``threading.local``), so events of other threads land on their own track and
nest only among themselves; the event list itself is appended to from any thread (a ``list.append`` is atomic).
Memory is followed per tensor storage: a storage an operator returns that none of its inputs held is an
allocation of that operator, and a finalizer on it records the free against whatever range is innermost on the
thread that drops it. Device time, when CUDA activity is asked for, comes from CUPTI's records of every
kernel, copy and memset, each hung on the innermost range open when it was launched (see [Note: device
activity] in ``device_activity``). Without CUPTI it comes from CUDA events recorded on the current stream
around each operator on a CUDA device and each step of a compiled CUDA program; they are read when the
recording stops (one synchronisation), and only events without children keep theirs, so that a composite's
device time is its primitives'.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
import warnings
import weakref

from tilewise import dispatch
from tilewise.autograd import engine as autograd_engine
from tilewise.compiler import program as compiled_programs
from tilewise.dispatch import call_below_profiler, device_of
from tilewise.profiler import device_activity
from tilewise.profiler.events import DeviceKernel, DeviceType, EventList, FunctionEvent
from tilewise.tensor import Tensor

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GENERATED = ("<binder ", "<derivative ")  # the file names of the code ``ops`` generates (schema.make_binder)
_ids = itertools.count()


def now_ns() -> int:
    return time.perf_counter_ns()


class MemoryRecord:
    """One allocation (``nbytes`` > 0) or free (< 0) of tensor storage, as torch's ``[memory]`` events."""

    __slots__ = ("ts_ns", "thread", "nbytes", "total", "device", "addr")

    def __init__(self, ts_ns: int, thread: int, nbytes: int, total: int, device: str, addr: int):
        self.ts_ns, self.thread, self.nbytes, self.total, self.device, self.addr = \
            ts_ns, thread, nbytes, total, device, addr


class Recorder:
    """The events of one recording (one cycle of a schedule): opened and closed by the hooks below."""

    def __init__(self, *, record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                 with_flops: bool = False, use_cuda: bool = False):
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.use_cuda = use_cuda
        self.origin_ns = now_ns()
        self.events: list[FunctionEvent] = []
        self.memory: list[MemoryRecord] = []
        self.allocated: dict[str, int] = {}  # device -> bytes this recording saw allocated and not yet freed
        self.known = weakref.WeakSet()  # storages already counted
        self.device_ranges: list = []  # (event, start Event, end Event, device index), read at ``finish``
        self.clock: dict[int, tuple] = {}  # device index -> (reference Event, its host time in ns)
        self.tracer: device_activity.CuptiTracer | None = None  # CUPTI, while it records device activity
        self.unclaimed_kernels: list[DeviceKernel] = []  # CUPTI's records no range of this recording launched
        self.stand_ins: dict[int, tuple] = {}  # id(program) -> (its steps, the recorders, their ProfiledSteps)
        self.device_timing = "CUDA events" if use_cuda else "none"  # "CUPTI" once CUPTI records for this one
        self.active = False
        self._local = threading.local()
        self._memory_lock = threading.Lock()

    # ------------------------------------------------------------------ ranges
    def stack(self) -> list[FunctionEvent]:
        local = self._local
        stack = getattr(local, "stack", None)
        if stack is None:
            stack = local.stack = []
        return stack

    def open(self, name: str, kind: str, args: tuple | None = None) -> FunctionEvent:
        """Open a range named ``name`` on this thread (``args``: an operator's, for stand-ins that name ranges
        by their shapes; see ``nvtx_ranges``)."""
        stack = self.stack()
        event = FunctionEvent(next(_ids), name, threading.get_native_id(), 0.0, kind=kind,
                              use_device="cuda" if self.use_cuda else None)
        if name.startswith("ProfilerStep#"):  # torch lists every step as "ProfilerStep*", numbered in the trace only
            event.name, event.trace_name = "ProfilerStep*", name
        if self.with_stack:
            event.stack = user_frames()
        if stack:
            event.cpu_parent = stack[-1]
            stack[-1].cpu_children.append(event)
        stack.append(event)
        self.events.append(event)
        if self.tracer is not None:
            self.tracer.push(event.id)
        event.start_us = (now_ns() - self.origin_ns) / 1000
        return event

    def close(self, event: FunctionEvent) -> None:
        event.end_us = (now_ns() - self.origin_ns) / 1000
        if self.tracer is not None:
            self.tracer.pop()
        stack = self.stack()
        if stack and stack[-1] is event:
            stack.pop()
        elif event in stack:  # a range closed out of order (a generator's record_function): drop it where it is
            stack.remove(event)

    # ------------------------------------------------------------------ memory
    def note_outputs(self, event: FunctionEvent, op, args: tuple, result) -> None:
        """Count as the operator's allocations the storages of its results that none of its inputs holds."""
        if op.kind == "view":
            return
        inputs = {id(t._storage) for t in tensors_in(args)}
        for t in tensors_in(result if isinstance(result, (tuple, list)) else (result,)):
            storage = t._storage
            if storage is None or id(storage) in inputs or storage in self.known:
                continue
            self.known.add(storage)
            nbytes = storage.nbytes()
            if not nbytes:
                continue
            device = str(storage.device)
            self._record_memory(nbytes, device, storage.data_ptr())
            if storage.device.type == "cpu":
                event.own_cpu_memory += nbytes
            else:
                event.own_device_memory += nbytes
            weakref.finalize(storage, _storage_freed, weakref.ref(self), nbytes, device, storage.data_ptr())

    def _record_memory(self, nbytes: int, device: str, addr: int) -> None:
        with self._memory_lock:  # frees arrive from whichever thread drops a tensor last
            total = self.allocated[device] = self.allocated.get(device, 0) + nbytes
        self.memory.append(MemoryRecord(now_ns() - self.origin_ns, threading.get_native_id(), nbytes, total,
                                        device, addr))

    def freed(self, nbytes: int, device: str, addr: int) -> None:
        if not self.active:
            return
        self._record_memory(-nbytes, device, addr)
        stack = self.stack()
        if stack:
            if device == "cpu":
                stack[-1].own_cpu_memory -= nbytes
            else:
                stack[-1].own_device_memory -= nbytes

    # ------------------------------------------------------------------ device time
    @property
    def times_with_events(self) -> bool:
        """Whether device time comes from CUDA events around ranges (CUDA asked for, CUPTI not recording)."""
        return self.use_cuda and self.tracer is None

    def host_ns(self) -> int:
        return now_ns() - self.origin_ns

    def start_device_activity(self) -> None:
        """Record CUPTI's kernel, copy and memset records while this recording is active, where CUPTI can."""
        if not self.use_cuda:
            return
        tracer = device_activity.acquire(self)
        if tracer is None:
            return
        try:
            tracer.start(self.host_ns)
        except Exception as exc:  # noqa: BLE001 — CUPTI refused (another profiler attached, no permission): events
            device_activity.release(tracer)
            tracer.abandon()
            warnings.warn(f"tilewise.profiler: CUPTI could not start ({exc}); CUDA activity is timed with CUDA "
                          f"events instead", stacklevel=4)
            return
        self.tracer, self.device_timing = tracer, "CUPTI"

    def stop_device_activity(self) -> None:
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return
        try:
            activity = tracer.stop(self.host_ns)
        finally:
            device_activity.release(tracer)
        by_id = {event.id: event for event in self.events}
        self.unclaimed_kernels, launches = device_activity.attach(activity, by_id, tracer.name_of)
        for launch in launches:
            self.add_launch(launch)

    def add_launch(self, launch) -> None:
        """The API call that launched device work, as torch lists it: a host range (``cuda_runtime`` or
        ``cuda_driver``) inside the range that made it, placed among that range's children by its start."""
        launcher = launch.launcher
        start = min(max(launch.start_us, launcher.start_us), launcher.end_us)  # the clocks' fit is good to ~1 us
        end = min(max(launch.end_us, start), launcher.end_us)
        event = FunctionEvent(next(_ids), launch.name, launcher.thread, start, end,
                              kind="cuda_runtime" if launch.name.startswith("cuda") else "cuda_driver",
                              use_device=launcher.use_device, cpu_parent=launcher)
        event.args["correlation"] = launch.correlation
        children = launcher.cpu_children
        position = next((k for k, c in enumerate(children) if c.start_us > start), len(children))
        children.insert(position, event)
        self.events.append(event)

    def device_range_start(self, device: int, stream=None):
        from tilewise.cuda import Event

        if device not in self.clock:
            reference = Event(enable_timing=True)
            reference.record(stream)
            self.clock[device] = (reference, now_ns() - self.origin_ns)
        start = Event(enable_timing=True)
        start.record(stream)
        return start

    def device_range_end(self, event: FunctionEvent, start, device: int, stream=None) -> None:
        from tilewise.cuda import Event

        end = Event(enable_timing=True)
        end.record(stream)
        self.device_ranges.append((event, start, end, device))

    def finish(self) -> None:
        """Read the device ranges (waiting for them) into kernels: an event keeps its range unless one of its
        children has one (a composite's device time is its primitives'; a program's, its steps')."""
        timed = {id(event) for event, *_ in self.device_ranges}
        for event, start, end, device in self.device_ranges:
            if any(id(c) in timed for c in event.cpu_children):
                continue
            end.synchronize()
            reference, host_ns = self.clock[device]
            began = host_ns / 1000 + reference.elapsed_time(start) * 1000
            event.kernels.append(DeviceKernel(event.name, device, start.elapsed_time(end) * 1000, began))
        self.device_ranges.clear()

    def event_list(self) -> EventList:
        events = sorted(self.events, key=lambda e: (e.start_us, -e.end_us))
        kernels = [kernel_event(e, k) for e in events for k in e.kernels]
        kernels += [kernel_event(None, k) for k in self.unclaimed_kernels]
        return EventList(events + kernels, "cuda" if self.use_cuda else None, self.profile_memory, self.with_flops)


def kernel_event(launcher: FunctionEvent | None, kernel: DeviceKernel) -> FunctionEvent:
    """A device kernel as torch lists one beside the host events: its own row, device time only."""
    thread = launcher.thread if launcher is not None else 0
    event = FunctionEvent(next(_ids), kernel.name, thread, kernel.start, kernel.start, kind=kernel.kind,
                          use_device="cuda", device_type=DeviceType.CUDA)
    event.kernels.append(kernel)
    return event


def _storage_freed(recorder_ref, nbytes: int, device: str, addr: int) -> None:
    recorder = recorder_ref()
    if recorder is not None:
        recorder.freed(nbytes, device, addr)


def tensors_in(values) -> list[Tensor]:
    found = []
    for v in values:
        if type(v) is Tensor or isinstance(v, Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, Tensor))
    return found


def input_shapes(args: tuple) -> list:
    """torch's ``input_shapes``: a tensor's sizes, ``[]`` for anything else (a tensor list included)."""
    return [list(a.shape) if isinstance(a, Tensor) else [] for a in args]


def user_frames() -> list[str]:
    """The calling Python frames outside tilewise, innermost first, as torch writes them: ``file(line): name``.
    tilewise's own frames are those of its modules and of the code it generates (operator binders, derivative
    formulas), which run with a tilewise module's globals."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None:
        if not _is_tilewise(frame):
            frames.append(f"{frame.f_code.co_filename}({frame.f_lineno}): {frame.f_code.co_name}")
        frame = frame.f_back
    return frames


def _is_tilewise(frame) -> bool:
    filename = frame.f_code.co_filename
    module = frame.f_globals.get("__name__") or ""
    return filename.startswith(_GENERATED) or module == "tilewise" or module.startswith("tilewise.") or \
        os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


def matmul_flops(op, args: tuple) -> int:
    """torch's FLOP count for the operators it counts (2·M·N·K for a product), else 0."""
    name = op.name
    tensors = [a for a in args if isinstance(a, Tensor)]
    if name in ("mm", "bmm") and len(tensors) >= 2:
        a, b = tensors[0].shape, tensors[1].shape
    elif name in ("addmm", "baddbmm") and len(tensors) >= 3:
        a, b = tensors[1].shape, tensors[2].shape
    else:
        return 0
    batch = a[0] if len(a) == 3 else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


# ---------------------------------------------------------------------------- the active recordings and hooks

ACTIVE: list[Recorder] = []  # replaced, never mutated, so a hook iterates a stable list
_active_lock = threading.Lock()


def activate(recorder: Recorder) -> None:
    with _active_lock:
        recorder.active = True
        globals()["ACTIVE"] = [*ACTIVE, recorder]
        dispatch.set_profiling(True)


def deactivate(recorder: Recorder) -> None:
    with _active_lock:
        recorder.active = False
        globals()["ACTIVE"] = [r for r in ACTIVE if r is not recorder]
        dispatch.set_profiling(bool(ACTIVE))


def event_name(op) -> str:
    """torch's name for an operator's event: ``aten::add``; a custom operator keeps its own namespace."""
    return op.name if "::" in op.name else "aten::" + op.name


def profile_op(op, args: tuple):
    """The Profiler key (see [Note: the Profiler key])."""
    recorders = ACTIVE
    name = event_name(op)
    opened = []
    for r in recorders:
        event = r.open(name, "cpu_op", args)
        if r.record_shapes:
            event.input_shapes = input_shapes(args)
        if r.with_flops:
            event.flops = matmul_flops(op, args)
        opened.append((r, event))
    device = _cuda_index(op, args, recorders)
    starts = [r.device_range_start(device) for r in recorders if r.times_with_events] if device is not None else ()
    try:
        result = call_below_profiler(op, args)
    finally:
        for r, event in reversed(opened):
            r.close(event)
        if device is not None:
            cuda = [(r, e) for r, e in opened if r.times_with_events]
            for (r, event), start in zip(cuda, starts):
                r.device_range_end(event, start, device)
    for r, event in opened:
        if r.profile_memory:
            r.note_outputs(event, op, args, result)
    return result


def _cuda_index(op, args: tuple, recorders: list[Recorder]) -> int | None:
    if not any(r.times_with_events for r in recorders) or op.kind == "view":
        return None
    device = device_of(op, args)
    return (device.index or 0) if device.type == "cuda" else None


class ProfiledStep:
    """A program step run inside its own event (see ``profile_program``); anything else reads the step."""

    def __init__(self, step, recorders: list[Recorder]):
        self.step = step
        self.recorders = recorders
        self.name = step_name(step)

    def run(self, *args) -> None:
        opened = [(r, r.open(self.name, "program_step")) for r in self.recorders]
        for _, event in opened:
            event.args["step"] = self.step.describe()
        stream = args[1] if len(args) == 2 and isinstance(args[1], int) else None  # a CUDA step: (pointers, stream)
        timed = [(r, event, r.device_range_start(self.device, stream)) for r, event in opened
                 if r.times_with_events] \
            if stream is not None and self.timed else []
        try:
            self.step.run(*args)
        finally:
            for r, event in reversed(opened):
                r.close(event)
            for r, event, start in timed:
                r.device_range_end(event, start, self.device, stream)

    runtime = None  # a CUDA program's runtime: while it may capture its steps into a graph, no events there
    device = 0

    @property
    def timed(self) -> bool:
        runtime = self.runtime
        return runtime is None or not getattr(runtime, "use_graphs", False) or bool(runtime.why_not)

    def __getattr__(self, name):
        return getattr(self.step, name)


def step_name(step) -> str:
    """What a step runs: its kernel's name, the operator it calls (as torch names it), or a copy."""
    kernel = getattr(step, "kernel", None)
    if kernel is not None:
        return kernel.name
    op = getattr(step, "op", None)
    if op is not None:
        return event_name(op)
    return "Memcpy" if "copy" in type(step).__name__.lower() else type(step).__name__


def profile_program(program, inputs: list, staged: frozenset):
    """A compiled program's run as one event, each of its steps a child (the arena's lock is held: no other
    thread walks this program's steps while they are swapped for their profiled stand-ins)."""
    recorders = ACTIVE
    opened = [(r, r.open(f"CompiledProgram ({program.target})", "compiled_program")) for r in recorders]
    for _, event in opened:
        event.args.update(steps=len(program.steps), kernels=program.kernel_count)
    steps = program.steps
    if program.tuner is None:  # the tuner's first run may replace steps: leave them alone then
        program.steps = _stand_ins(program, steps, recorders)
    device = getattr(program.runtime, "device", None)  # a CUDA program: its whole run is timed on the device too
    index = (device.index or 0) if device is not None else None
    timed = [(r, event, r.device_range_start(index)) for r, event in opened if r.times_with_events] \
        if device is not None else []
    try:
        return program.runtime.run(inputs, staged)
    finally:
        program.steps = steps
        for r, event in reversed(opened):
            r.close(event)
        for r, event, start in timed:
            r.device_range_end(event, start, index)


def _stand_ins(program, steps: list, recorders: list[Recorder]) -> list[ProfiledStep]:
    """The program's steps wrapped for these recorders, made once per recording and program (a program replayed
    from a CUDA graph runs none of them, and wrapping every step on every call would delay its launch)."""
    store = getattr(recorders[0], "stand_ins", None)  # a recording's (an NVTX emitter keeps none)
    kept = store.get(id(program)) if store is not None else None
    if kept is not None and kept[0] is steps and kept[1] == recorders:
        return kept[2]
    wrapped = [_profiled(s, program, recorders) for s in steps]
    if store is not None:
        store[id(program)] = (steps, list(recorders), wrapped)
    return wrapped


def _profiled(step, program, recorders: list[Recorder]) -> ProfiledStep:
    wrapped = ProfiledStep(step, recorders)
    runtime = program.runtime
    device = getattr(runtime, "device", None)
    if device is not None:
        wrapped.device = device.index or 0
        wrapped.runtime = runtime
    return wrapped


@contextlib.contextmanager
def profile_node(name: str):
    """An autograd node's work inside ``autograd::engine::evaluate_function: <name>`` and ``<name>``, as torch's
    engine records it."""
    opened = []
    for r in ACTIVE:
        opened.append((r, r.open(f"autograd::engine::evaluate_function: {name}", "cpu_op")))
        opened.append((r, r.open(name, "cpu_op")))
    try:
        yield
    finally:
        for r, event in reversed(opened):
            r.close(event)


dispatch.register_profiler(profile_op)
autograd_engine.register_node_profiler(profile_node)
compiled_programs.register_program_profiler(profile_program)
