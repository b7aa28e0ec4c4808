"""Programs: a compiled graph as a list of steps over a static buffer plan, and the build that makes one.

[Note: programs] ``build_program`` runs the back half of the compiler on an optimised graph for one
``Target`` (``compiler.targets``): the target's lowering stages, fusion, lowering of each fused kernel to
kernel IR, memory planning, scheduling and rendering, then the target's own program builder (the toolchain,
and the steps). The result is a ``Program``: steps in order — a generated kernel, a library call or
fallback operator, end-of-call copies (write-backs that could not be done in place, outputs that are views
of other values) — and a ``runtime`` that walks them (``program_c.HostRuntime``,
``program_cuda.CudaRuntime``). Running it binds the inputs' storages, allocates the outputs, and walks the
steps. The arena of intermediate buffers is allocated once, when the program is built (a transient one, for
each run: [Note: transient arenas]). In
``mode="max-autotune"`` a program may carry a ``Tuner``: its first run walks the steps through it, timing
kernel candidates on that call's buffers (``autotune``). A program keeps the graph after each pass
(``passes``) and, on CUDA, each kernel's translation unit, so ``explain`` shows the programs ``compile`` built.
While a profiler records, ``Program.run`` hands the run to the profiler's hook, which times each step (see
[Note: the Profiler key] in ``profiler/recorder``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from tilewise import dispatch
from tilewise._stages import stage
from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.schedule import KernelSchedule
from tilewise.compiler.autotune import Tuner, choose, default_decisions
from tilewise.compiler.ir import Graph, Node, checked, format_graph
from tilewise.compiler.lowering.fusion import fuse
from tilewise.compiler.lowering.lower import lower
from tilewise.compiler.lowering.memory import MemoryPlan, order_for_reuse, plan_memory, steps_of
from tilewise.compiler.lowering.streams import StreamSchedule, schedule_streams
from tilewise.config import log, settings

if TYPE_CHECKING:
    from tilewise.compiler.targets import Target


class Arena:
    """Memory for the intermediate values of the programs of one compiled function.

    They run one after another (variants, a forward and its backward), so one buffer as large as the
    largest plan serves them all; a function compiled twice does not hold two arenas. ``generation``
    counts reallocations: a program re-derives its views of the arena when it changed (and a CUDA program
    drops the graphs that baked in the old address).

    [Note: transient arenas] An arena kept between runs is memory held for good: the eager fused composites
    (``compiler.composites``) share one per device, and a ResNet-50's batch-norm backward grew it to 0.3-0.65 GiB
    that stayed allocated after the model was gone, on top of the training's own peak. An arena with
    ``keep_up_to`` set keeps only plans up to that size; ``for_plan`` gives a larger plan a *transient* arena of
    its own, allocated when a run begins and released when it ends (on CUDA from the caching allocator in the
    run's stream order, as the intermediates of an eager operator are). A transient arena's address changes from
    run to run, so its program replays no CUDA graph; its runs are the large ones, where a launch's host time
    matters least."""

    def __init__(self, make, transient: bool = False):
        self.make = make  # nbytes -> a buffer (a numpy uint8 array, a DeviceBuffer)
        self.buffer = None
        self.nbytes = 0
        self.generation = 0
        self.transient = transient  # allocated for each run only (see the note)
        self.keep_up_to: int | None = None  # larger plans get a transient arena of their own (``for_plan``)
        # one program at a time uses the arena: a compiled function called from several threads runs its
        # programs one after another (on CUDA, a program on another stream than the last also waits for it)
        self.lock = threading.RLock()
        self.stream = None  # the CUDA stream that last used the arena, and an event recorded after that use
        self.event = None

    def for_plan(self, nbytes: int) -> Arena:
        """The arena a program whose plan needs ``nbytes`` uses: this one, or a transient one of its own where this
        one keeps only smaller plans."""
        if self.keep_up_to is None or nbytes <= self.keep_up_to:
            return self
        return Arena(self.make, transient=True)

    def acquire(self) -> None:
        """A transient arena's memory for one run (``release`` ends it)."""
        self.buffer = self.make(self.nbytes)
        self.generation += 1

    def release(self) -> None:
        self.buffer = None

    def reserve(self, nbytes: int) -> None:
        nbytes = max(nbytes, 1)
        if self.transient:
            self.nbytes = max(self.nbytes, nbytes)
            return
        if self.buffer is None or nbytes > self.nbytes:
            self.buffer = None  # release the old block first: the allocator may hand it back grown
            self.buffer = self.make(nbytes)
            self.nbytes = nbytes
            self.generation += 1


def _profiler_missing(program, inputs, staged):
    raise RuntimeError("compiler.program: the profiler's hook is not registered; it is filled when "
                       "tilewise.profiler is imported (import tilewise rather than its submodules alone)")


profile_program = _profiler_missing  # (program, inputs, staged) -> outputs: a run inside profiler events


def register_program_profiler(fn) -> None:
    """The profiler (a layer above) runs a program's steps inside its events while ``dispatch.profiling``."""
    global profile_program
    profile_program = fn


@dataclass
class Program:
    graph: Graph  # after fusion
    plan: MemoryPlan
    steps: list
    kernels: list[Kernel]
    schedules: list[KernelSchedule]
    source: str
    target: str = "c"  # the name of the target it was built for
    runtime: object = None  # walks the steps: program_c.HostRuntime, program_cuda.CudaRuntime
    arena: Arena | None = None
    tuner: Tuner | None = None  # max-autotune: kernels whose candidates the first run times
    autotune: bool = False  # max-autotune: the first run also times library calls' candidates (cuDNN plans)
    graph_bytes: int | None = None  # the most its CUDA graphs may copy in and out (and so hold); None: by cost
    graphs_in_place: bool = False  # CUDA graphs read and write the run's own memory, one per address set (see
    # [Note: graphs in place] in program_cuda.py)
    sources: dict[str, str] = field(default_factory=dict)  # CUDA: kernel name -> its translation unit
    passes: list = field(default_factory=list)  # (stage, graph): captured, then after each pass (``explain``)

    def run(self, inputs: list, staged: frozenset[int] = frozenset()) -> list:
        """Run on the inputs' storage data (flat arrays; device buffers on CUDA); return the outputs' data.

        ``staged``: input slots that are arguments of the compiled function (a CUDA graph copies them in)."""
        with self.arena.lock:
            if not self.arena.transient:
                if dispatch.profiling:  # one check per run, none per step (see [Note: the Profiler key])
                    return profile_program(self, inputs, staged)
                return self.runtime.run(inputs, staged)
            self.arena.acquire()  # see [Note: transient arenas]
            try:
                if dispatch.profiling:
                    return profile_program(self, inputs, staged)
                return self.runtime.run(inputs, staged)
            finally:
                self.arena.release()

    def describe(self) -> str:
        lines = [self.plan.describe(), "steps:"]
        order = getattr(self.runtime, "order", None)  # CUDA: collectives on the communication stream
        for k, step in enumerate(self.steps):
            where = ""
            if order is not None and k in order.done:
                where = " [on the communication stream]"
            elif order is not None and order.waits[k]:
                where = f" [after collective step(s) {', '.join(map(str, order.waits[k]))}]"
            lines.append(f"  {k}: {step.describe()}{where}")
        return "\n".join(lines)

    @property
    def kernel_count(self) -> int:
        return sum(getattr(s, "kernel", None) is not None for s in self.steps)


@dataclass
class Lowered:
    """A program's generated code before anything is compiled or allocated."""

    fused: Graph
    kernels: dict[Node, Kernel]
    schedules: list[KernelSchedule]
    plan: MemoryPlan
    source: str  # the whole program's text (CUDA: the kernels' translation units one after another)
    sources: dict[str, str] = field(default_factory=dict)  # CUDA: kernel name -> its translation unit
    streams: StreamSchedule | None = None  # the stream of each step (see [Note: collectives on their own stream])
    compiling: object = None  # the target's compiles of the kernels, started as each was rendered (CUDA)


def lower_program(graph: Graph, target: Target, donated: frozenset[int] = frozenset(), compiling=None) -> Lowered:
    """The target's lowering stages, then fuse, lower to kernel IR, plan memory, schedule and render.
    ``donated``: inputs whose memory the program may reuse after their last read (see [Note: donated inputs]).
    With ``compiling`` (the target's ``compiles``), each kernel's compile starts as soon as it is rendered."""
    for name, lowering in target.lowering:
        with stage(name):
            graph = checked(lowering(graph), name)
        log("graph", lambda g=graph, name=name: format_graph(g, f"after {name}"))
    with stage("fuse"):
        fused = checked(fuse(graph), "fuse")
    log("graph", lambda: format_graph(fused, "after fuse"))
    kernels: dict[Node, Kernel] = {}
    with stage("lower to kernel IR"):
        for node in fused.body:
            if node.op == "fused":
                kernels[node] = lower(node.args[0])
    with stage("plan memory"):
        fused = order_for_reuse(fused, kernels)
        plan = plan_memory(fused, kernels, donated)
        streams = schedule_streams(fused, plan)
    with stage("schedule"):
        schedules = _schedules(list(kernels.values()), target)
    with stage("render"):
        return render_lowered(Lowered(fused, kernels, schedules, plan, "", streams=streams, compiling=compiling),
                              target)


def _schedules(kernels: list[Kernel], target: Target) -> list[KernelSchedule]:
    """Each kernel's schedule for ``target``: worked out once for the kernels of one structure (a transformer's
    layers make each kernel once per layer: 214 kernels of 34 structures in a GPT-2 step), which a schedule is
    a function of, and given to each of them over its own kernel."""
    made: dict[tuple, KernelSchedule] = {}
    out = []
    for kernel in kernels:
        key = kernel.structure()
        found = made.get(key)
        if found is None:
            found = made[key] = target.schedule(kernel)
            out.append(found)
        else:
            out.append(replace(found, kernel=kernel, nests=[replace(ns) for ns in found.nests]))
    return out


def render_lowered(low: Lowered, target: Target) -> Lowered:
    """Render ``low``'s kernels as their schedules say (again, after autotuning replaced some), each handed to
    ``low.compiling`` as it is made."""
    low.sources = {}
    if not low.schedules:
        low.source = ""
    else:
        started = low.compiling.start if low.compiling is not None else None
        low.source, low.sources = target.render(low.schedules, aliased_kernels(low.kernels, low.plan), started)
    return low


def aliased_kernels(kernels: dict[Node, Kernel], plan: MemoryPlan) -> dict[str, frozenset[int]]:
    """For each kernel some of whose parameters lie in the same memory, those parameters' positions: they are the
    ones not declared ``__restrict__``. A value shares memory with an input of its kernel when it is written back
    into that input (one buffer), and with an arena operand when it takes the operand's bytes (in-place reuse, see
    [Note: memory planning]: its own buffer, at the same offset). Declared ``const __restrict__``, such an operand
    is read through the non-coherent cache and may be loaded after the result was stored over it: the Llama
    block's backward stored an RMSNorm gradient over the residual gradient, then read the residual back."""
    out = {}
    for kernel in kernels.values():
        shared = _overlapping([plan.memory_of(v) for v in kernel.values])
        if shared:
            out[kernel.name] = shared
    return out


def _overlapping(spans: list[tuple[str, int, int]]) -> frozenset[int]:
    """The positions of the spans (kind, first, end) that overlap another of their kind: every pair compared at once
    (an optimizer's kernel has hundreds of parameters)."""
    if len(spans) < 2:
        return frozenset()
    kinds = {kind: k for k, kind in enumerate(dict.fromkeys(kind for kind, _, _ in spans))}
    kind = np.array([kinds[span[0]] for span in spans])
    first = np.array([span[1] for span in spans], dtype=np.int64)
    end = np.array([span[2] for span in spans], dtype=np.int64)
    overlap = (kind[:, None] == kind[None, :]) & (first[:, None] < end[None, :]) & (first[None, :] < end[:, None])
    np.fill_diagonal(overlap, False)
    return frozenset(np.flatnonzero(overlap.any(axis=1)).tolist())


def build_program(graph: Graph, target: Target, device=None, graphs: bool = True,
                  arena: Arena | None = None, autotune: bool = False, graph_bytes: int | None = None,
                  donated: frozenset[int] = frozenset(), graphs_in_place: bool = False) -> Program:
    """Lower, schedule, render, compile and plan memory for an optimised graph, for ``target``.

    ``arena``: shared with the other programs of the same function (the target's own when None).
    ``graphs``: let the program replay its steps as one captured graph where the target can; ``graph_bytes``: the
    most such a graph may copy in and out, and so hold (None: where copying costs less than launching).
    ``autotune``: choose each kernel's schedule by timing its candidates (``mode="max-autotune"``).
    ``donated``: the inputs whose memory it may reuse once read for the last time (see [Note: donated inputs]).
    ``graphs_in_place``: its graphs read the arguments where they lie and write fresh outputs, keyed by every
    address (see [Note: graphs in place] in ``program_cuda.py``)."""
    # autotuning renders its choices again: compiles start once they are made
    compiling = target.compiles(device) if target.compiles is not None and not autotune else None
    low = lower_program(graph, target, donated, compiling)
    tuner = None
    if autotune and low.schedules:
        tuning = target.tuning(device, low)
        low.schedules, pending = choose(low.schedules, tuning, default_decisions())
        render_lowered(low, target)
        tuner = Tuner(pending, tuning, default_decisions()) if pending else None
    program = target.build(low, device, graphs and settings.cuda_graphs)
    program.arena = (arena if arena is not None else target.arena(device)).for_plan(low.plan.arena_bytes)
    program.arena.reserve(low.plan.arena_bytes)
    program.tuner = tuner
    program.autotune = autotune
    program.graph_bytes = graph_bytes
    program.graphs_in_place = graphs_in_place
    if tuner is None:  # else once the first run has chosen
        log_program(program)
    return program


def log_program(program: Program) -> None:
    """The ``kernels`` dump of a built program: kernel IR, schedules (with autotuning's choices), steps, source."""
    if "kernels" in settings.log:
        log("kernels", "\n\n".join([*(str(k) for k in program.kernels), *(s.describe() for s in program.schedules),
                                    program.describe(), program.source]))


def step_nodes(fused: Graph) -> list[tuple[Node, list]]:
    """Each step node with the graph values its results are (getitems of a tuple-valued call)."""
    getitems: dict[Node, dict[int, Node]] = {}
    for node in fused.body:
        if node.op == "getitem":
            getitems.setdefault(node.srcs[0], {})[node.args[0]] = node
    out = []
    for node in steps_of(fused):
        results = [node] if not node.is_tuple else [getitems.get(node, {}).get(k) for k in range(len(node.type))]
        out.append((node, results))
    return out
