"""``tilewise.explain``: one call of a function followed through every layer, from its Python to SASS.

[Note: explain] ``explain(fn, *args)`` shows what ``tilewise.compile(fn)(*args)`` builds and runs, read off
the compiled callable itself rather than from a pipeline run beside it, so that the two cannot differ: the
programs of ``compiled.programs()`` (a training step has a forward and a backward program, a call with graph
breaks one per segment) keep the graph after each pass, the fused graph, the kernels' IR and schedules, the
generated source and their steps (kernels, library calls, copies). The sections are what each layer makes of
the call, in the order the layers run: the call, the operators it reaches and their declarations, how eager
mode would run them, the graph after each pass, the fused graph, each kernel's IR, schedule and source, for
CUDA its PTX and SASS, then the steps of each program with their measured per-call time, their place on the
device's roofline (``roofline``), and the whole call compiled against eager.

Times are per step of the program as it runs: the function is called ``repeats`` times after the call that
compiles it, with each program's steps timed where they run (wall clock around each step on the CPU; on CUDA,
where the steps are then launched one by one rather than replayed as a CUDA graph, the device time of what
each step launched from CUPTI's records, as the profiler reads them, or without CUPTI CUDA events around each
step queued behind a short device-side wait, so that they time the kernels and not their launch: [Note:
explain's device clock]). The call that compiles is not timed, nor are the calls after it that
compile again (a training step's second call, now that gradients exist, up to ``WARMUP_CALLS``): a training
step therefore trains a few more steps than ``repeats``, as it would under a profiler.

For a target other than the device the arguments live on (``target="cuda"`` on a machine without a GPU),
nothing can run: the call is lowered for that target by ``CompiledFunction.lowered`` (the same recording,
passes and lowering ``compile`` uses, without building), down to PTX and SASS for ``arch``, and the roofline
section gives each kernel's bytes and FLOPs without times.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from tilewise.compiler import compile
from tilewise.compiler.capture import flatten
from tilewise.compiler.function import CompiledFunction
from tilewise.compiler.ir import IR_OPS, format_graph
from tilewise.compiler.lowering.memory import steps_of
from tilewise.compiler.targets import Target, get_target, target_for_device
from tilewise.device import cpu
from tilewise.ops.expr import render_text
from tilewise.profiler.roofline import (
    DEFAULT_SIZE,
    GEMM_OPS,
    Placement,
    Roofline,
    gemm_flops,
    kernel_bytes,
    kernel_dtype,
    kernel_flops,
    roofline,
    theoretical_occupancy,
)
from tilewise.tensor import Tensor


@dataclass
class StepRecord:
    """One step of a compiled program — a generated kernel, a library call or a copy — with its work and time."""

    program: str  # which program: "forward", "backward", "variant 2 forward", "segment 1", or "" for the only one
    index: int  # its position among the program's steps
    kind: str  # "kernel", "library call", "copy"
    name: str  # the kernel's name, the library operator's, or "copy"
    text: str  # the step as the program describes it
    nbytes: int  # minimum bytes moved
    flops: int
    dtype: str
    times: list[float] = field(default_factory=list)  # seconds, one per timed call
    placement: Placement | None = None
    resources: str = ""  # CUDA: registers, shared memory, spills, occupancy
    untimed: str = ""  # why a step has no time
    symbol: str = ""  # the function the device runs (kernels of one text share one, see ``compile_units``)

    @property
    def seconds(self) -> float | None:
        """Median time per call, or None when the step was not timed."""
        return statistics.median(self.times) if self.times else None

    def describe(self) -> str:
        where = f"{self.program} " if self.program else ""
        head = f"{where}step {self.index} {self.kind} {self.name}"
        if self.seconds is None:
            return f"{head}: not timed{self.untimed}; {self.nbytes} bytes, {self.flops} FLOPs"
        placed = self.placement.describe() if self.placement is not None else f"{self.nbytes} bytes, {self.flops} FLOPs"
        return f"{head}: {1e3 * self.seconds:.4f} ms; {placed}"


@dataclass
class Explanation:
    """What ``explain`` found: (title, text) sections in the order the layers run, and a record per program step.

    ``str()`` is the text ``tilewise explain`` prints; iterating gives the sections."""

    call: str
    sections: list[tuple[str, str]]
    kernels: list[StepRecord]
    roofline: Roofline | None = None
    compiled: object = None  # the ``CompiledFunction`` whose programs these are
    programs: list = field(default_factory=list)  # each program as shown (``_Shown``): what ``report`` draws

    def __iter__(self):
        return iter(self.sections)

    def section(self, title: str) -> str:
        for name, text in self.sections:
            if name == title:
                return text
        raise KeyError(f"explain: no section {title!r}; sections: {[t for t, _ in self.sections]}")

    def __str__(self) -> str:
        return "\n".join(f"== {title} " + "=" * max(0, 76 - len(title)) + f"\n{text}\n"
                         for title, text in self.sections)


def explain(fn, *args, target: str | None = None, arch: str | None = None, repeats: int = 20,
            run: bool = True, roofline_size: int = DEFAULT_SIZE, name: str | None = None) -> Explanation:
    """Explain ``tilewise.compile(fn)(*args)``: every layer of the call, each program step timed and placed on
    the device's roofline (see [Note: explain]).

    ``target``: "c" or "cuda" (default: the arguments' device's); a target other than that device's generates
    code without running it. ``arch``: the CUDA architecture PTX and SASS are shown for (``sm_90``, ``sm_100``;
    default: the current GPU's, or sm_90); given alone, it picks the CUDA target. ``repeats``: timed calls after
    those that compile. ``run``: False stops before anything runs. ``roofline_size``: bytes per roofline
    measurement (once per device, then cached). ``name``: how the call is shown (default: the function's name and
    line). The result's ``kernels`` are the steps of every program, ``compiled`` the compiled function. ``fn`` may
    be a function ``tilewise.compile`` made: its programs are explained and timed as they are, not compiled again.

    >>> import tilewise as tw
    >>> e = tw.explain(lambda x, y: (x + y).relu(), tw.randn(64), tw.randn(64), repeats=2)  # doctest: +SKIP
    >>> [k.name for k in e.kernels]  # doctest: +SKIP
    ['k0_add_relu']
    """
    if repeats < 1:
        raise ValueError(f"explain: repeats must be at least 1, got {repeats}")
    device = _device_of(args)
    own = target_for_device(device if device.type != "cpu" else None)
    chosen = get_target(target) if target is not None else get_target("cuda") if arch is not None else own
    if arch is not None and chosen.machine_code is None:
        raise ValueError(f"explain: arch={arch!r} picks the machine code of the CUDA target; the {chosen.name} "
                         "target generates none (pass target='cuda')")
    # a function ``tilewise.compile`` already made is explained as it is, its programs reused (not compiled again)
    compiled = fn if isinstance(fn, CompiledFunction) else compile(fn)
    fn = compiled.fn
    call = name or _call_name(fn)
    sections = [("the call", f"{call}\n  with {_describe_args(args)}")]
    if chosen is own and run:
        return _explain_run(compiled, fn, args, chosen, arch, repeats, roofline_size, call, sections, device)
    traced, lowered, history = compiled.lowered(chosen, *args)
    why = "run=False" if not run else f"the arguments are on {device}, the code is for the {chosen.name} target"
    programs = [_Shown(label, low.fused, list(low.kernels.values()), low.schedules, low.source, low.sources,
                       history, None, low) for label, low in zip(_labels(len(lowered)), lowered)]
    sections += _layers(programs, chosen, arch, str(device))
    records = [r for p in programs for r in _records(p)]
    _add_resources(records, programs, chosen, arch)
    sections.append(("roofline", _roofline_text(records, None, f"not run ({why}): work per step only")))
    sections.append(("run", f"not run: {why}"))
    return Explanation(call, sections, records, compiled=compiled, programs=programs)


# ---------------------------------------------------------------------------- the call and its layers

def _device_of(args: tuple):
    leaves, _ = flatten(list(args))
    tensors = [t for t in leaves if isinstance(t, Tensor)]
    return tensors[0].device if tensors else cpu


def _call_name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        where = f" at {inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (TypeError, OSError):
        where = ""
    return f"{name}{where}"


def _describe_args(args: tuple) -> str:
    def one(a) -> str:
        if isinstance(a, Tensor):
            return f"{a.dtype.name}{list(a.shape)} on {a.device}"
        if isinstance(a, (list, tuple)):
            return "(" + ", ".join(one(b) for b in a) + ")"
        return type(a).__name__ if not isinstance(a, (int, float, bool, str, type(None))) else repr(a)

    return ", ".join(one(a) for a in args) or "no arguments"


@dataclass
class _Shown:
    """A program as explain shows it: a built ``Program`` (``program`` set) or a ``Lowered`` one."""

    label: str
    fused: object
    kernels: list
    schedules: list
    source: str
    sources: dict
    passes: list
    program: object = None
    lowered: object = None


def _labels(count: int, variant: int | None = None) -> list[str]:
    prefix = f"variant {variant} " if variant else ""
    if count == 1:
        return [prefix.strip()]
    return [f"{prefix}forward", f"{prefix}backward"]


def _layers(programs: list[_Shown], target: Target, arch: str | None, device: str) -> list[tuple[str, str]]:
    out, shown_histories = [], set()
    for p in programs:
        if p.passes and id(p.passes) not in shown_histories:
            captured = p.passes[0][1]
            if not shown_histories:
                out += [("operators", _operators(captured)), ("eager", _eager(captured, device))]
            shown_histories.add(id(p.passes))
            out.append((_titled(p.label.replace("forward", "").replace("backward", "").strip(), "graph passes"),
                        _passes(p.passes)))
        fused = format_graph(p.fused, "after fuse") + f"\n\n{len(p.kernels)} generated kernel(s)"
        out.append((_titled(p.label, "fusion"), fused))
        for kernel, sched in zip(p.kernels, p.schedules):
            out.append((_titled(p.label, f"kernel {kernel.name}: IR"), str(kernel)))
            out.append((_titled(p.label, f"kernel {kernel.name}: schedule"), sched.describe()))
        out.append((_titled(p.label, f"generated {target.source_name}"), p.source or "(no generated kernel)"))
        if target.machine_code is not None and p.sources:
            out += [(_titled(p.label, title), text) for title, text in target.machine_code(p, arch)]
        out += _custom_machine_code(p)
    return out


def _custom_machine_code(p: _Shown) -> list[tuple[str, str]]:
    """The PTX and SASS of the ``load_inline`` kernels each custom operator of the program launches."""
    out = []
    for node in p.fused.body:
        op = node.opdef
        if op is None or op.kind != "custom":
            continue
        for module in op.attrs["custom"].modules.values():
            out += [(_titled(p.label, f"{op.name} {title}"), text) for title, text in module.machine_code()]
    return out


def _titled(label: str, title: str) -> str:
    return f"{label}: {title}" if label else title


def _passes(history: list) -> str:
    lines, before = [], None
    for (name, _), now in zip(history, pass_texts(history)):
        if name == "captured":
            lines.append("captured: " + now)
        else:
            lines.append(f"after {name}: " + now if now != before else f"after {name}: unchanged")
        before = now
    return "\n\n".join(lines)


_pass_texts: dict[int, tuple[list, list[str]]] = {}  # id(history) -> (the history, its graphs' text)


def pass_texts(history: list) -> list[str]:
    """``format_graph`` of each graph of a pass history, made once for explain's text and the report's page (a
    transformer step's history is tens of thousands of lines)."""
    kept = _pass_texts.get(id(history))
    if kept is not None and kept[0] is history:
        return kept[1]
    texts = [format_graph(graph) for _, graph in history]
    if len(_pass_texts) >= 2:  # a call's histories (a forward and a backward share one), kept until the next
        _pass_texts.pop(next(iter(_pass_texts), None), None)  # another thread may have emptied it
    _pass_texts[id(history)] = (history, texts)
    return texts


def _operators(graph) -> str:
    lines, seen = [], set()
    for node in graph.body:
        op = node.opdef
        if node.op in IR_OPS or op is None or op.full_name in seen:
            continue
        seen.add(op.full_name)
        lines.append(f"{op.schema.text}\n  kind: {op.kind}")
        if op.expr is not None:
            lines.append(f"  meaning: {render_text(op.expr)}")
        if op.decomposition is not None:
            lines.append(f"  decomposition: {op.decomposition.__module__}.{op.decomposition.__qualname__}")
        for name, formula in op.derivatives.items():
            lines.append(f"  d/d{name}: {formula.text if formula is not None else 'not differentiable'}")
    return "\n".join(lines)


def _eager(graph, device: str) -> str:
    calls = [n for n in graph.body if n.op not in IR_OPS and n.kind not in ("view", "unknown")]
    backend = "a generated CUDA kernel (or a library call)" if device.startswith("cuda") else "a numpy kernel"
    return (f"{len(calls)} operator call(s) eagerly, each: binder (schema) -> Autograd (records a node when an "
            f"input requires grad) -> the {device.split(':')[0].upper()} backend -> {backend}; each result is "
            "written to memory and read back by the next call. Views cost no kernel.")


# ---------------------------------------------------------------------------- steps and their work

def _records(p: _Shown) -> list[StepRecord]:
    if p.program is not None:
        return [_record(p.label, k, step) for k, step in enumerate(p.program.steps)]
    kernels = {k.name: k for k in p.kernels}
    by_node = dict(zip(p.lowered.kernels, p.lowered.kernels.values()))
    out = []
    for k, node in enumerate(steps_of(p.fused)):
        kernel = by_node.get(node)
        if kernel is not None and kernel.name in kernels:
            out.append(_kernel_record(p.label, k, kernel, f"kernel {kernel.name}"))
        else:
            out.append(_library_record(p.label, k, node, f"call {node.op}"))
    return out


def _record(label: str, index: int, step) -> StepRecord:
    if getattr(step, "kernel", None) is not None:
        return _kernel_record(label, index, step.kernel, step.describe(),
                              getattr(getattr(step, "function", None), "name", ""))
    if getattr(step, "node", None) is not None:
        return _library_record(label, index, step.node, step.describe())
    value = step.value
    return StepRecord(label, index, "copy", "copy", step.describe(), 2 * value.type.nbytes, 0, value.type.dtype.name)


def _kernel_record(label: str, index: int, kernel, text: str, symbol: str = "") -> StepRecord:
    return StepRecord(label, index, "kernel", kernel.name, text, kernel_bytes(kernel), kernel_flops(kernel),
                      kernel_dtype(kernel), symbol=symbol or kernel.name)


def _library_record(label: str, index: int, node, text: str) -> StepRecord:
    # a tuple result may leave entries out (None: an attention's optional outputs where none was asked for)
    results = [t for t in (node.type if node.is_tuple else (node.type,)) if t is not None]
    nbytes = sum(s.type.nbytes for s in node.srcs) + sum(t.nbytes for t in results)
    flops = gemm_flops(node.op, list(node.srcs), node) if node.op in GEMM_OPS and not node.is_tuple else 0
    dtype = results[0].dtype.name if results else "float32"
    return StepRecord(label, index, "library call", node.op, text, nbytes, flops, dtype)


# ---------------------------------------------------------------------------- running and timing

def _explain_run(compiled, fn, args, target: Target, arch, repeats: int, roofline_size: int, call: str,
                 sections: list, device) -> Explanation:
    start = time.perf_counter()
    compiled(*args)  # records, compiles and runs once: what is timed below is the compiled program's steps only
    first = time.perf_counter() - start
    for _ in range(WARMUP_CALLS):  # a first call may leave state (gradients, optimizer state) the next recompiles for
        known = len(compiled.programs())
        compiled(*args)
        if len(compiled.programs()) == known:
            break
    timers: dict[int, _Timers] = {}
    call_times = []
    cupti = _CuptiClock.start() if device.type == "cuda" else None
    try:
        for _ in range(repeats):
            for program in compiled.programs():
                if id(program) not in timers:
                    timers[id(program)] = _Timers(program, device, cupti)
            for t in timers.values():
                t.install()
            start = time.perf_counter()
            try:
                compiled(*args)
                for t in timers.values():
                    t.collect()
            finally:
                for t in timers.values():
                    t.remove()
            call_times.append(time.perf_counter() - start)
    finally:
        if cupti is not None:
            cupti.stop()
    for t in timers.values():
        t.resolve()
    programs = _shown_programs(compiled)
    if not programs:
        sections.append(("run", f"compile ran the function eagerly: {compiled.eager_reason}"))
        return Explanation(call, sections, [], compiled=compiled)
    sections += _layers(programs, target, arch, str(device))
    roof = roofline(str(device) if device.type != "cpu" else "cpu", size=roofline_size)
    records = []
    for p in programs:
        timed = timers.get(id(p.program))
        for k, record in enumerate(_records(p)):
            record.times = timed.times[k] if timed is not None else []
            if record.times:
                record.placement = roof.place(record.nbytes, record.flops, record.seconds, record.dtype)
            else:  # a variant for the state before the first call (no gradients yet), or a segment not met again
                record.untimed = " (its program ran only in the calls that compiled)"
            records.append(record)
    _add_resources(records, programs, target, arch)
    sections += [(_titled(p.label, "steps"), p.program.describe()) for p in programs]
    how = ("CUPTI's kernel records per step" if cupti is not None else
           "CUDA events per step, each queued behind a device-side wait") + ", CUDA graphs off" \
        if device.type == "cuda" else "wall clock per step"
    sections.append(("roofline", _roofline_text(records, roof, f"median of {repeats} calls, {how}")))
    sections.append(("run", _run_text(compiled, fn, args, call_times, first, device)))
    return Explanation(call, sections, records, roof, compiled, programs)


WARMUP_CALLS = 3


class _Timers:
    """Times each step of one program while installed: its steps are wrapped in place and restored after."""

    def __init__(self, program, device, cupti: _CuptiClock | None = None):
        self.program = program
        self.steps = list(program.steps)
        self.times: list[list[float]] = [[] for _ in self.steps]
        self.clock = cupti if cupti is not None else partial(_cuda_clock, device.index or 0) \
            if device.type == "cuda" else _host_clock
        self.pending: list = []
        self.measured: list = []
        self.runtime_graphs = None

    def install(self) -> None:
        self.program.steps = [_TimedStep(step, k, self) for k, step in enumerate(self.steps)]
        runtime = self.program.runtime
        if hasattr(runtime, "use_graphs"):  # a replayed CUDA graph runs no step of ours
            self.runtime_graphs, runtime.use_graphs = runtime.use_graphs, False

    def remove(self) -> None:
        self.program.steps = self.steps
        if self.runtime_graphs is not None:
            self.program.runtime.use_graphs = self.runtime_graphs

    def collect(self) -> None:
        self.measured += self.pending
        self.pending = []

    def resolve(self) -> None:
        """Read the times (CUPTI's records arrive once its tracer has stopped)."""
        for k, measured in self.measured:
            self.times[k].append(measured())
        self.measured = []


class _TimedStep:
    """A program step that reports how long each run of it took."""

    def __init__(self, step, index: int, timers: _Timers):
        self.step, self.index, self.timers = step, index, timers
        self.host = 0.0  # seconds the host took to issue this step last time (the device wait before it covers it)

    def run(self, *args) -> None:
        start = time.perf_counter()
        self.timers.pending.append((self.index, self.timers.clock(lambda: self.step.run(*args), args, self.host)))
        self.host = time.perf_counter() - start

    def __getattr__(self, name: str):
        return getattr(self.step, name)


def _host_clock(run, args, host: float):
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    return lambda: elapsed


class _CuptiClock:
    """Device time per step from CUPTI's kernel, copy and memset records, as the profiler reads them: each step
    runs with its own id on CUPTI's external correlation stack, and every record its launches made is added to
    that step's time. Used when cupti-python is there and no profiler holds CUPTI; else CUDA events."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.count = 0
        self.seconds: dict[int, float] = {}

    @classmethod
    def start(cls) -> _CuptiClock | None:
        from tilewise.profiler import device_activity

        tracer = device_activity.acquire(cls)
        if tracer is None:
            return None
        try:
            tracer.start(time.perf_counter_ns)
        except Exception:  # noqa: BLE001 — CUPTI refused (another tool attached, no permission): CUDA events
            device_activity.release(tracer)
            tracer.abandon()
            return None
        return cls(tracer)

    def __call__(self, run, args, host: float):
        self.count += 1
        token = self.count
        self.tracer.push(token)
        try:
            run()
        finally:
            self.tracer.pop()
        return lambda: self.seconds.get(token, 0.0)

    def stop(self) -> None:
        from tilewise.profiler import device_activity

        try:
            activity = self.tracer.stop(time.perf_counter_ns)
        finally:
            device_activity.release(self.tracer)
        for record in activity.records:
            token = activity.correlations.get(record.correlation)
            if token is not None:
                self.seconds[token] = self.seconds.get(token, 0.0) + (record.end_ns - record.start_ns) / 1e9


# [Note: explain's device clock] CUDA events around a launch on an idle device also time the launch's own
# latency: the start event is passed as soon as it is queued, while the kernel starts only once the host has
# issued it (microseconds for a kernel, more for a library call's host work). The profiler's kernel records
# (CUPTI) have no such gap. So each step is queued behind a short device-side wait, longer than the host took to
# issue that step the last time: by the time the device reaches the start event, the step's kernels are queued
# behind it and run back to back, as they do in a replayed graph.
_DELAY_SOURCE = r"""extern "C" __global__ void tilewise_explain_wait(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
_MIN_WAIT_S, _FIRST_WAIT_S, _MAX_WAIT_S = 20e-6, 200e-6, 5e-3


def _cuda_clock(device: int, run, args, host: float):
    from tilewise.backends.cuda.kernels import launch, load
    from tilewise.backends.cuda.runtime import Event

    stream = args[-1]
    wait = min(_MAX_WAIT_S, max(_MIN_WAIT_S, 2 * host + 10e-6)) if host else _FIRST_WAIT_S
    launch(load(_DELAY_SOURCE, "tilewise_explain_wait", device), 1, 1, [int(wait * 1e9)], stream)
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    start.record(stream)
    run()
    end.record(stream)

    def elapsed() -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return elapsed


def _shown_programs(compiled) -> list[_Shown]:
    """Each program once: a variant whose program another variant already has (its graph compiled to the same
    program) adds none, so that no step's time is counted twice."""
    shown, seen = [], set()
    for k, variant in enumerate(compiled.variants):
        built = [p for p in (variant.forward, variant.backward) if p is not None]
        labels = _labels(len(built), k + 1 if len(compiled.variants) > 1 else None)
        shown += [_from_program(label, p) for label, p in zip(labels, built) if id(p) not in seen]
        seen.update(id(p) for p in built)
    for k, program in enumerate(compiled.segments.programs.values()):
        shown.append(_from_program(f"segment {k + 1}", program))
    return shown


def _from_program(label: str, program) -> _Shown:
    return _Shown(label, program.graph, program.kernels, program.schedules, program.source, program.sources,
                  program.passes, program)


def _add_resources(records: list[StepRecord], programs: list[_Shown], target: Target, arch: str | None) -> None:
    """Registers, shared memory, spills and theoretical occupancy of each CUDA kernel, from its cubin."""
    if target.machine_code is None:  # resources are read from the machine code (the cubin)
        return
    from tilewise.compiler.program_cuda import default_arch, kernels_machine_code

    arch = arch or default_arch()
    blocks = {s.kernel.name: s.block for p in programs for s in p.schedules}
    sources = {name: source for p in programs for name, source in p.sources.items()}
    code = kernels_machine_code(sources, arch) if sources else {}
    for r in records:
        if r.kind != "kernel" or r.name not in sources:
            continue
        usage = code[r.name].usage
        if usage is None:
            continue
        occupancy, limiter = theoretical_occupancy(arch, blocks.get(r.name) or 1, usage.registers, usage.shared_bytes)
        r.resources = (f"{usage.registers} registers/thread, {usage.shared_bytes} B shared/block, "
                       f"{usage.local_bytes} B spilled/thread, theoretical occupancy {100 * occupancy:.0f}% "
                       f"(limited by {limiter}, {arch})")


def _roofline_text(records: list[StepRecord], roof: Roofline | None, how: str) -> str:
    lines = [roof.describe() if roof is not None else "no roofline: nothing ran", f"({how})"]
    for r in records:
        lines.append(r.describe())
        if r.resources:
            lines.append(f"    {r.resources}")
    timed = [r.seconds for r in records if r.seconds is not None]
    if timed:
        lines.append(f"steps together: {1e3 * sum(timed):.4f} ms per call")
    return "\n".join(lines)


def _run_text(compiled, fn, args, call_times: list[float], first: float, device) -> str:
    ours = statistics.median(call_times) * 1e3
    sync = _synchronizer(device)
    eager_times = []
    for _ in range(len(call_times)):
        start = time.perf_counter()
        fn(*args)
        sync()
        eager_times.append(time.perf_counter() - start)
    eager = statistics.median(eager_times) * 1e3
    kernels = sum(p.kernel_count for p in compiled.programs())
    text = (f"on {device}: first call (record, compile, run) {first * 1e3:.1f} ms; compiled {ours:.3f} ms per call "
            f"({kernels} kernel(s), steps timed one by one); eager {eager:.3f} ms; {eager / ours:.2f}x "
            f"(median of {len(call_times)} calls, wall clock including the host)")
    if _is_pure(compiled):
        got, want = compiled(*args), fn(*args)
        pairs = [(got, want)] if isinstance(got, Tensor) else list(zip(flatten(got)[0], flatten(want)[0]))
        diffs = [float(np.max(np.abs(a.double().cpu().numpy() - b.double().cpu().numpy()), initial=0.0))
                 for a, b in pairs if isinstance(a, Tensor)]
        text += f"; largest difference from eager {max(diffs, default=0.0):.3g}"
    else:
        text += "; not compared with eager (the call updates state: each call changes what the next computes)"
    return text


def _is_pure(compiled) -> bool:
    return not compiled.segments.programs and all(
        not v.traced.grad_effects and not v.traced.state_effects and not v.forward.graph.writes
        for v in compiled.variants)


def _synchronizer(device):
    if device.type != "cuda":
        return lambda: None
    from tilewise.backends.cuda.runtime import synchronize

    return synchronize
