"""Programs: a compiled graph as a list of steps over a static buffer plan, and the build that makes one.

[Note: programs] ``build_program`` runs the back half of the compiler on an optimised graph: fusion,
lowering of each fused kernel to kernel IR, scheduling and rendering for the target (all kernels of a
program go into one C translation unit), the toolchain, and memory planning. The result is a
``Program``: steps in order — a generated kernel (``KernelStep``: one ctypes call with buffer
pointers), a library call or fallback operator (``ExternStep``: the CPU backend's kernel on tensors that
view the planned buffers; ``mm``/``bmm`` write their result straight into its buffer), and end-of-call
copies (write-backs that could not be done in place, outputs that are views of other values). Running
it binds the inputs' storages, allocates the outputs, and walks the steps. The arena of intermediate
buffers is allocated once, when the program is built. In ``mode="max-autotune"`` a program may carry a
``Tuner``: its first run walks the steps through it, timing kernel candidates on that call's buffers
(``autotune``); ``HostTuning`` and ``HostBench`` are the C target's part of that.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from tilewise._stages import stage
from tilewise.backends.cpu.render import zero_division_error
from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.render.c import C
from tilewise.codegen.render.cstyle import ZERO_DIVISION_FLAG
from tilewise.codegen.render.kernel_c import render_program
from tilewise.codegen.schedule import KernelSchedule, schedule
from tilewise.codegen.toolchain.cc import c_flags, compiler_version, default_c_cache, host_cpu
from tilewise.compiler.autotune import Pending, Sampler, Tuner, choose, clobbered, default_decisions, renamed
from tilewise.compiler.ir import Graph, Node, checked, format_graph
from tilewise.compiler.lowering.epilogues import gemm_epilogues
from tilewise.compiler.lowering.fusion import FusedKernel, fuse
from tilewise.compiler.lowering.lower import buffer_of, geometry, lower
from tilewise.compiler.lowering.memory import MemoryPlan, plan_memory, steps_of
from tilewise.config import log, settings
from tilewise.device import cpu
from tilewise.storage import Storage
from tilewise.tensor import Tensor

LANGUAGES = {"c": C}


class Arena:
    """Memory for the intermediate values of the programs of one compiled function.

    They run one after another (variants, a forward and its backward), so one buffer as large as the
    largest plan serves them all; a function compiled twice does not hold two arenas. ``generation``
    counts reallocations: a program re-derives its views of the arena when it changed (and a CUDA program
    drops the graphs that baked in the old address)."""

    def __init__(self, make):
        self.make = make  # nbytes -> a buffer (a numpy uint8 array, a DeviceBuffer)
        self.buffer = None
        self.nbytes = 0
        self.generation = 0
        # one program at a time uses the arena: a compiled function called from several threads runs its
        # programs one after another (on CUDA, a program on another stream than the last also waits for it)
        self.lock = threading.RLock()
        self.stream = None  # the CUDA stream that last used the arena, and an event recorded after that use
        self.event = None

    def reserve(self, nbytes: int) -> None:
        nbytes = max(nbytes, 1)
        if self.buffer is None or nbytes > self.nbytes:
            self.buffer = None  # release the old block first: the allocator may hand it back grown
            self.buffer = self.make(nbytes)
            self.nbytes = nbytes
            self.generation += 1


def host_arena() -> Arena:
    return Arena(lambda nbytes: np.empty(nbytes, dtype=np.uint8))


def strided_tensor(array: np.ndarray, value: Node, geom: tuple) -> Tensor:
    """A tensor viewing a flat buffer with a value's geometry (how library calls see planned buffers)."""
    dtype = value.type.dtype
    shape, strides, offset = geom
    return Tensor._make(Storage(array, cpu, dtype, array.shape[0]), tuple(shape), tuple(strides), offset, dtype, cpu)


INTEGER_DIVISIONS = ("floor_divide", "remainder", "fmod", "div")  # operators that may divide integers by zero


def integer_divisions(fused: FusedKernel) -> tuple[tuple[str, str], ...]:
    """(operator, dtype) of each integer division a fused kernel runs (their C helpers flag a zero divisor)."""
    found = ((m.op, m.type.dtype.name) for g in fused.groups for m in g.members
             if m.op in INTEGER_DIVISIONS and not m.type.dtype.is_floating_point)
    return tuple(dict.fromkeys(found))


class KernelStep:
    """One call of a generated kernel. ``divisions``: the integer-dividing operators it runs, after which it
    reads its library's zero-division flag (see [Note: integer division] in ``render/cstyle``)."""

    def __init__(self, kernel: Kernel, function, buffers: list[int], library=None,
                 divisions: tuple[tuple[str, str], ...] = ()):
        self.kernel = kernel
        self.function = function
        self.buffers = buffers
        self.divisions = divisions
        self.zero_division = ctypes.c_int.in_dll(library, ZERO_DIVISION_FLAG) if divisions else None
        function.argtypes = [ctypes.c_void_p] * len(buffers)
        function.restype = None

    def run(self, arrays: list, pointers: list) -> None:
        self.function(*[pointers[b] for b in self.buffers])
        if self.zero_division is not None and self.zero_division.value:
            self.zero_division.value = 0
            ops, dtypes = zip(*self.divisions)
            raise zero_division_error("/".join(dict.fromkeys(ops)), "/".join(dict.fromkeys(dtypes)))

    def describe(self) -> str:
        return f"kernel {self.kernel.name}({', '.join(f'b{b}' for b in self.buffers)})"


class ExternStep:
    """An operator no kernel holds, run by the CPU backend on tensors viewing the planned buffers."""

    def __init__(self, node: Node, plan: MemoryPlan, results: list[Node | None]):
        self.node = node
        self.op = node.opdef
        self.inputs = [(plan.of[buffer_of(s)], s, geometry(s)) for s in node.srcs]
        self.outputs = [(plan.of[r], r) if r is not None else None for r in results]
        self.direct = self.op.kind == "matmul" and node.type.dtype.name in ("float32", "float64")

    def run(self, arrays: list, pointers: list) -> None:
        tensors = [strided_tensor(arrays[b], value, geom) for b, value, geom in self.inputs]
        if self.direct:
            buffer, value = self.outputs[0]
            np.matmul(tensors[0]._np(), tensors[1]._np(), out=arrays[buffer].reshape(value.type.shape))
            return
        from tilewise.backends.cpu import run as cpu_run

        result = cpu_run(self.op, self.node.bound_args(tensors), cpu)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for out, produced in zip(self.outputs, results):
            if out is not None:
                buffer, value = out
                np.copyto(arrays[buffer].reshape(value.type.shape), produced._np(), casting="unsafe")

    def describe(self) -> str:
        outs = ", ".join(f"b{o[0]}" for o in self.outputs if o is not None)
        return f"call {self.node.op}({', '.join(f'b{b}' for b, _, _ in self.inputs)}) -> {outs}"


class CopyStep:
    """Copy ``value`` (read through its views) into buffer ``dst``, laid out contiguously from byte ``offset``."""

    def __init__(self, value: Node, src: int, dst: int, offset: int = 0):
        self.value, self.src, self.dst, self.offset = value, src, dst, offset
        self.geometry = geometry(value)

    def run(self, arrays: list, pointers: list) -> None:
        source = strided_tensor(arrays[self.src], self.value, self.geometry)._np()
        first = self.offset // self.value.type.dtype.itemsize
        dst = arrays[self.dst][first:first + self.value.type.numel]
        np.copyto(dst.reshape(self.value.type.shape), source, casting="unsafe")

    def describe(self) -> str:
        return f"copy b{self.src} -> b{self.dst}" + (f" at byte {self.offset}" if self.offset else "")


@dataclass
class Program:
    graph: Graph  # after fusion
    plan: MemoryPlan
    steps: list
    kernels: list[Kernel]
    schedules: list[KernelSchedule]
    source: str
    target: str = "c"
    arrays: list = field(default_factory=list)  # per buffer: the arena view, or None (bound per call)
    pointers: list = field(default_factory=list)
    cuda: object = None  # the CUDA target's runtime (program_cuda.CudaRuntime)
    arena: Arena | None = None
    arena_generation: int = -1  # the arena generation ``arrays`` and ``pointers`` view
    tuner: Tuner | None = None  # max-autotune: kernels whose candidates the first run times

    def run(self, inputs: list, staged: frozenset[int] = frozenset()) -> list:
        """Run on the inputs' storage data (flat arrays; device buffers on CUDA); return the outputs' data.

        ``staged``: input slots that are arguments of the compiled function (a CUDA graph copies them in)."""
        with self.arena.lock:
            if self.cuda is not None:
                return self.cuda.run(inputs, staged)
            return self._run_host(inputs)

    def _run_host(self, inputs: list) -> list:
        if self.arena_generation != self.arena.generation:
            _bind_arena(self)
        arrays, pointers = list(self.arrays), list(self.pointers)
        for k, buf in enumerate(self.plan.buffers):
            if buf.kind == "input":
                array = inputs[buf.slot]
            elif buf.kind == "output":
                array = np.empty(buf.ty.numel, dtype=buf.ty.dtype.np)
            else:
                continue
            arrays[k], pointers[k] = array, array.ctypes.data
        if self.tuner is not None:
            self.tuner.walk(self, HostBench(arrays, pointers))
        else:
            for step in self.steps:
                step.run(arrays, pointers)
        return [arrays[b] for b in self.plan.outputs]

    def describe(self) -> str:
        lines = [self.plan.describe(), "steps:"]
        lines += [f"  {k}: {step.describe()}" for k, step in enumerate(self.steps)]
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


def lower_program(graph: Graph, target: str = "c") -> Lowered:
    """Fuse, lower to kernel IR, plan memory, schedule and render for ``target`` ("c" or "cuda")."""
    with stage("fuse"):
        fused = checked(fuse(graph), "fuse")
    log("graph", lambda: format_graph(fused, "after fuse"))
    kernels: dict[Node, Kernel] = {}
    with stage("lower to kernel IR"):
        for node in fused.body:
            if node.op == "fused":
                kernels[node] = lower(node.args[0])
    with stage("plan memory"):
        plan = plan_memory(fused, kernels)
    with stage("schedule"):
        schedules = [schedule(k, target) for k in kernels.values()]
    with stage("render"):
        return render_lowered(Lowered(fused, kernels, schedules, plan, ""), target)


def render_lowered(low: Lowered, target: str) -> Lowered:
    """Render ``low``'s kernels as their schedules say (again, after autotuning replaced some)."""
    low.sources = {}
    if not low.schedules:
        low.source = ""
    elif target == "cuda":
        from tilewise.codegen.render.kernel_cuda import render_program as render_cuda

        low.sources = render_cuda(low.schedules, _aliased_kernels(low.kernels, low.plan))
        low.source = "\n".join(low.sources.values())
    else:
        low.source = render_program(low.schedules, LANGUAGES[target])
    return low


def _aliased_kernels(kernels: dict[Node, Kernel], plan: MemoryPlan) -> dict[str, frozenset[int]]:
    """For each kernel some of whose parameters are one buffer (a value written in place of its input), those
    parameters' positions: they are the ones not declared ``__restrict__``."""
    out = {}
    for kernel in kernels.values():
        buffers = [plan.of[v] for v in kernel.values]
        shared = frozenset(k for k, b in enumerate(buffers) if buffers.count(b) > 1)
        if shared:
            out[kernel.name] = shared
    return out


def build_program(graph: Graph, target: str = "c", device=None, graphs: bool = True,
                  arena: Arena | None = None, autotune: bool = False) -> Program:
    """Fuse, lower, schedule, render, compile and plan memory for an optimised graph.

    ``arena``: shared with the other programs of the same function (a private one when None).
    ``autotune``: choose each kernel's schedule by timing its candidates (``mode="max-autotune"``)."""
    if target == "cuda":
        with stage("gemm_epilogues"):
            graph = checked(gemm_epilogues(graph), "gemm_epilogues")
        log("graph", lambda: format_graph(graph, "after gemm_epilogues"))
    low = lower_program(graph, target)
    tuner = None
    if autotune and low.schedules:
        tuning = _tuning(target, device, low)
        low.schedules, pending = choose(low.schedules, tuning, default_decisions())
        render_lowered(low, target)
        tuner = Tuner(pending, tuning, default_decisions()) if pending else None
    fused, kernels, schedules, plan, source = low.fused, low.kernels, low.schedules, low.plan, low.source
    if target == "cuda":
        program = _cuda_program(low, device, graphs, arena)
    else:
        with stage("compile kernels (C compiler) and load"):
            library = default_c_cache().load(source) if schedules else None
        program = Program(fused, plan, _steps(fused, plan, kernels, library), list(kernels.values()), schedules,
                          source)
        program.arena = arena if arena is not None else host_arena()
        program.arena.reserve(plan.arena_bytes)
    program.tuner = tuner
    if tuner is None:  # else once the first run has chosen
        log_program(program)
    return program


def log_program(program: Program) -> None:
    """The ``kernels`` dump of a built program: kernel IR, schedules (with autotuning's choices), steps, source."""
    if "kernels" in settings.log:
        log("kernels", "\n\n".join([*(str(k) for k in program.kernels), *(s.describe() for s in program.schedules),
                                    program.describe(), program.source]))


def _tuning(target: str, device, low: Lowered):
    if target == "cuda":
        from tilewise.compiler.program_cuda import CudaTuning

        return CudaTuning(device, _aliased_kernels(low.kernels, low.plan))
    return HostTuning()


def _cuda_program(low: Lowered, device, graphs: bool, arena: Arena | None) -> Program:
    from tilewise.compiler import program_cuda as pc

    fused, plan = low.fused, low.plan
    with stage("compile kernels (NVRTC) and load"):
        functions = pc.compile_kernels(low.sources, device)
    by_kernel = {s.kernel.name: s for s in low.schedules}
    steps: list = []
    for node, results in _step_nodes(fused):
        if node.op == "fused":
            kernel = low.kernels[node]
            sched = by_kernel[kernel.name]
            steps.append(pc.CudaKernelStep(kernel, functions[kernel.name], sched.grid, sched.block,
                                           [plan.of[v] for v in kernel.values], sched.scratch_bytes, device))
        elif node in plan.cat_copies:  # a cat in place copies only the inputs not written into it
            steps += [pc.CudaCopyStep(src, plan.of[buffer_of(src)], plan.of[node], device, byte)
                      for src, byte in plan.cat_copies[node]]
        else:
            steps.append(pc.CudaExternStep(node, plan, results, device))
    for copy in plan.copies:
        steps.append(pc.CudaCopyStep(copy.value, plan.of[buffer_of(copy.value)], copy.dst, device))
    program = Program(fused, plan, steps, list(low.kernels.values()), low.schedules, low.source, "cuda")
    program.arena = arena if arena is not None else pc.device_arena(device)
    program.arena.reserve(low.plan.arena_bytes)
    program.cuda = pc.CudaRuntime(program, device, graphs)
    return program


def _step_nodes(fused: Graph) -> list[tuple[Node, list]]:
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


def _steps(fused: Graph, plan: MemoryPlan, kernels: dict[Node, Kernel], library) -> list:
    steps: list = []
    for node, results in _step_nodes(fused):
        if node.op == "fused":
            kernel = kernels[node]
            steps.append(KernelStep(kernel, getattr(library, kernel.name), [plan.of[v] for v in kernel.values],
                                    library, integer_divisions(node.args[0])))
        elif node in plan.cat_copies:  # a cat in place copies only the inputs not written into it
            steps += [CopyStep(src, plan.of[buffer_of(src)], plan.of[node], byte)
                      for src, byte in plan.cat_copies[node]]
        else:
            steps.append(ExternStep(node, plan, results))
    for copy in plan.copies:
        steps.append(CopyStep(copy.value, plan.of[buffer_of(copy.value)], copy.dst))
    return steps


def _bind_arena(program: Program) -> None:
    """Views of the (shared) arena for the program's arena buffers."""
    plan, arena = program.plan, program.arena.buffer
    program.arrays = [None] * len(plan.buffers)
    program.pointers = [0] * len(plan.buffers)
    for k, buf in enumerate(plan.buffers):
        if buf.kind == "arena":
            view = arena[buf.slot:buf.slot + buf.ty.nbytes].view(buf.ty.dtype.np)
            program.arrays[k], program.pointers[k] = view, view.ctypes.data
    program.arena_generation = program.arena.generation


# ---------------------------------------------------------------------------- autotuning on the C target

class HostBench:
    """Runs the steps of one call of a C program and times kernel candidates on its buffers (``autotune``)."""

    def __init__(self, arrays: list, pointers: list):
        self.arrays, self.pointers = arrays, pointers

    def run(self, step) -> None:
        step.run(self.arrays, self.pointers)

    def samplers(self, steps: list[KernelStep]) -> list[Sampler]:
        """The candidates' steps (one kernel's) timed on this call's buffers; what it updates in place, on a
        scratch copy restored before every run."""
        pointers = list(self.pointers)
        copies = []
        extent = lambda b: (self.pointers[b], self.pointers[b] + self.arrays[b].nbytes)
        for b in clobbered(steps[0].kernel, steps[0].buffers, extent):
            pristine = self.arrays[b].copy()
            scratch = pristine.copy()
            pointers[b] = scratch.ctypes.data
            copies.append((scratch, pristine))
        return [Sampler(partial(self._sample, step, pointers, copies), not copies) for step in steps]

    def _sample(self, step: KernelStep, pointers: list, copies: list, repeats: int) -> float:
        for scratch, pristine in copies:
            np.copyto(scratch, pristine)
        start = time.perf_counter()
        for _ in range(repeats):
            step.run(self.arrays, pointers)
        return (time.perf_counter() - start) / repeats


def _cpus() -> int:
    """The CPUs this process may run on (OpenMP's default thread count)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class HostTuning:
    """The C target's part of autotuning: every candidate of a program's pending kernels compiled into one
    library; once all are chosen, the program's library rebuilt from the winners (what a later process
    builds directly from the decision cache, so it finds that library in the C cache too)."""

    target = "c"

    def machine(self) -> dict:
        cc = settings.cc
        threads = os.environ.get("OMP_NUM_THREADS") or str(_cpus())
        return {"cc": compiler_version(cc), "flags": list(c_flags(cc)), "cpu": host_cpu(), "threads": threads}

    def source(self, sched: KernelSchedule, name: str) -> str:
        return render_program([renamed(sched, name)], C)

    def compile(self, pending: dict[str, Pending]) -> dict[str, list]:
        named = {name: [f"{name}__c{k}" for k in range(len(p.candidates))] for name, p in pending.items()}
        scheds = [renamed(c, n) for name, p in pending.items() for c, n in zip(p.candidates, named[name])]
        library = default_c_cache().load(render_program(scheds, C))
        return {name: [(getattr(library, n), library) for n in names] for name, names in named.items()}

    def step(self, step: KernelStep, sched: KernelSchedule, function) -> KernelStep:
        function, library = function
        return KernelStep(step.kernel, function, step.buffers, library, step.divisions)

    def finish(self, program: Program) -> None:
        program.source = render_program(program.schedules, C)
        library = default_c_cache().load(program.source)
        program.steps = [KernelStep(s.kernel, getattr(library, s.kernel.name), s.buffers, library, s.divisions)
                         if isinstance(s, KernelStep) else s for s in program.steps]
        log_program(program)
