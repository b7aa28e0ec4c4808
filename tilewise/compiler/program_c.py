"""Programs on the C target: generated kernels in one shared library, called through ctypes on host memory.

[Note: C programs] A C program's steps are ``KernelStep`` (one ctypes call with buffer pointers),
``ExternStep`` (an operator no kernel holds — a library call or fallback — run by the CPU backend on tensors
that view the planned buffers; ``mm``/``bmm`` write their result straight into its buffer) and ``CopyStep``.
All kernels of a program are one C translation unit, compiled by the host C compiler through the C cache.
``HostRuntime`` binds the arena and the call's inputs and outputs and walks the steps; ``HostTuning`` and
``HostBench`` are the C target's part of autotuning.
"""

from __future__ import annotations

import ctypes
import os
import time
from functools import partial

import numpy as np

from tilewise.backends.cpu import run as cpu_run
from tilewise.backends.cpu.render import zero_division_error
from tilewise.backends.cpu.threads import gemm_threads, use_blas_threads
from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.render.c import C
from tilewise.codegen.render.cstyle import ZERO_DIVISION_FLAG
from tilewise.codegen.render.kernel_c import render_program
from tilewise.codegen.schedule import KernelSchedule
from tilewise.codegen.toolchain.cc import c_flags, compiler_version, default_c_cache, host_cpu
from tilewise.compiler.autotune import Pending, Sampler, clobbered, renamed
from tilewise.compiler.ir import Graph, Node
from tilewise.compiler.lowering.fusion import FusedKernel
from tilewise.compiler.lowering.lower import buffer_of, geometry
from tilewise.compiler.lowering.memory import MemoryPlan
from tilewise.compiler.program import Arena, Lowered, Program, log_program, step_nodes
from tilewise.config import settings
from tilewise.device import cpu
from tilewise.storage import Storage
from tilewise.tensor import Tensor


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
            a = tensors[0]._np()
            use_blas_threads(gemm_threads(2 * a.size * value.type.shape[-1]))
            np.matmul(a, tensors[1]._np(), out=arrays[buffer].reshape(value.type.shape))
            return
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


def data_pointer(array: np.ndarray) -> int:
    """The address of a contiguous array's first element: through ``ctypes.c_char.from_buffer`` (0.3 us) where the
    array is writable, else ``array.ctypes.data`` (1 us; a program binds several arrays per call)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


class HostRuntime:
    """Walks a C program's steps on host memory: the arena's buffers viewed once per arena generation, the
    call's inputs and fresh outputs bound per call."""

    def __init__(self, program: Program):
        self.program = program
        self.arrays: list = []  # per buffer: the arena view, or None (bound per call)
        self.pointers: list = []
        self.arena_generation = -1  # the arena generation ``arrays`` and ``pointers`` view
        self.calls = 0
        buffers = program.plan.buffers
        self.inputs = [(k, buf.slot) for k, buf in enumerate(buffers) if buf.kind == "input"]
        self.outputs = [(k, buf.ty.numel, buf.ty.dtype.np) for k, buf in enumerate(buffers) if buf.kind == "output"]
        # values in the memory of donated inputs (see [Note: donated inputs]): (buffer, input, first byte, end, dtype)
        self.donated = [(k, buf.slot, buf.offset, buf.offset + buf.ty.nbytes, buf.ty.dtype.np)
                        for k, buf in enumerate(buffers) if buf.kind == "donated"]

    def run(self, inputs: list, staged: frozenset[int] = frozenset()) -> list:
        program = self.program
        self.calls += 1
        if self.arena_generation != program.arena.generation:
            self._bind_arena()
        arrays, pointers = list(self.arrays), list(self.pointers)
        for k, slot in self.inputs:
            array = arrays[k] = inputs[slot]
            pointers[k] = data_pointer(array)
        for k, numel, dtype in self.outputs:
            array = arrays[k] = np.empty(numel, dtype=dtype)
            pointers[k] = data_pointer(array)
        for k, slot, first, end, dtype in self.donated:
            array = arrays[k] = inputs[slot].view(np.uint8)[first:end].view(dtype)
            pointers[k] = data_pointer(array)
        if program.tuner is not None:
            program.tuner.walk(program, HostBench(arrays, pointers))
        else:
            for step in program.steps:
                step.run(arrays, pointers)
        return [arrays[b] for b in program.plan.outputs]

    def _bind_arena(self) -> None:
        """Views of the (shared) arena for the program's arena buffers."""
        plan, arena = self.program.plan, self.program.arena
        self.arrays = [None] * len(plan.buffers)
        self.pointers = [0] * len(plan.buffers)
        for k, buf in enumerate(plan.buffers):
            if buf.kind == "arena":
                view = arena.buffer[buf.slot:buf.slot + buf.ty.nbytes].view(buf.ty.dtype.np)
                self.arrays[k], self.pointers[k] = view, view.ctypes.data
        self.arena_generation = arena.generation


def build_c_program(low: Lowered, device=None, graphs: bool = False) -> Program:
    """The C target's program: compile the translation unit (through the C cache), load it, make the steps."""
    from tilewise._stages import stage

    with stage("compile kernels (C compiler) and load"):
        library = default_c_cache().load(low.source) if low.schedules else None
    program = Program(low.fused, low.plan, _steps(low.fused, low.plan, low.kernels, library),
                      list(low.kernels.values()), low.schedules, low.source)
    program.runtime = HostRuntime(program)
    return program


def render_c(schedules: list[KernelSchedule], aliased: dict[str, frozenset[int]], rendered=None
             ) -> tuple[str, dict[str, str]]:
    """All kernels of a program as one C translation unit (compiled whole by ``build_c_program``)."""
    return render_program(schedules, C), {}


def _steps(fused: Graph, plan: MemoryPlan, kernels: dict[Node, Kernel], library) -> list:
    steps: list = []
    for node, results in step_nodes(fused):
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

    def __init__(self, target):
        self.target = target

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
