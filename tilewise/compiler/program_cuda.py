"""Programs on the CUDA target: planned device buffers, kernel launches, library calls, CUDA graphs.

[Note: CUDA programs] A CUDA ``Program`` has the same steps as a CPU one over the same memory plan, with
device memory: the arena is one device allocation shared by the programs of a compiled function (they
run one after another on the stream; see ``program.Arena``); output buffers come from the caching
allocator on every call; inputs are the callers' storages. A generated kernel is one ``cuLaunchKernel``
of its module; ``mm``/``bmm``/``addmm``/``_addmm_activation`` call cuBLASLt writing straight into their
planned buffer (the last two with a bias epilogue); other library operators run through the eager CUDA
backend on tensors viewing the planned buffers, their results copied in.

CUDA graphs: from the second call on, a program of several steps that are all capturable (generated kernels,
GEMMs that need no operand copy, end-of-call copies, custom operators) is captured once into a CUDA graph
(``backends.cuda.graphs``, see [Note: graph capture]) and replayed, so a call costs one ``cuGraphLaunch``
instead of a launch per step. A graph bakes in addresses, so: arguments of the compiled function are copied
into static staging buffers the graph reads (one device-to-device copy each, as torch's CUDA graphs do); the
other inputs (parameters, gradients, optimizer state: what a training step updates in place) are read where
they live, and a graph is kept per set of their addresses (a few; beyond that the program stops capturing);
outputs are written to the graph's own buffers and copied to fresh ones for the caller. Those copies are why a
program is captured only where they cost less than the launches a replay saves (``worth_a_graph``): up to
``GRAPH_COPY_BYTES`` always; beyond, where copying at ``COPY_BYTES_PER_US`` takes less than launching the steps
one by one (``LAUNCH_US`` a kernel, ``CALL_US`` a library call, a host cost that a GPU can wait on). The staging
and output buffers are the graph's for as long as it lives: a program given ``graph_bytes`` (an eager fused
composite's, kept for the process: 1 MiB) is captured only up to that many. A training
step's gradients (``zero_grad(set_to_none=True)``) are outputs: 249 MB for GPT-2 124M, about 0.12 ms of copying,
where its FP8 step's 700 launches took 11-25 ms of host time a step (the step ran at 32 ms instead of its 21 ms
of device work); a small composite's few kernels over a large activation stay uncaptured. ``TILEWISE_LOG=graphs``
reports captures and why a program is not captured.

[Note: graphs in place] A compiled backward (``compiler/backward.py``) takes the step's saved activations as
arguments, gigabytes of them, and returns the gradients: staging those into a graph would cost more than the
launches it saves. Yet an eager training loop allocates the same sizes in the same order on every step, so the
caching allocator hands back the same blocks: the activations, the gradients' buffers and a transient arena lie
at the same addresses from one step to the next. A program built with ``graphs_in_place`` therefore copies
nothing: from its second call on it binds its memory as an uncaptured run would (the arguments where they lie,
fresh output buffers from the allocator, the arena, donated memory) and looks the whole set of addresses up: a
graph captured at exactly those addresses is replayed; addresses seen in one of the last ``SIGHTINGS`` runs get a
graph captured there (up to ``MAX_GRAPHS`` sets; past that the program walks its steps, as it does when a capture
fails); addresses never seen before are walked, so memory that never lies in the same place twice costs no
capture. An input that moved since the last run is staged from then on (copied into a buffer of the graphs'
before each replay) while the staged inputs come to at most ``STAGED_BYTES``: a batch that a loop takes from a
list of batches already on the device is at another address every step, and its tokens or image are small beside
the activations. The allocator's part is to hand blocks out deterministically ([Note: small-block fast path]). A graph
is used only where every address it baked in belongs to this run's memory, so it reads and writes nothing else;
it holds no memory of its own beyond what its library calls allocate while captured.

[Note: custom operators in CUDA graphs] A custom operator (``tilewise.library``) is captured as torch captures
one: its Python kernel runs once under capture, and what it launches on the current stream (the capture
stream: a ``load_inline`` kernel, a Triton kernel behind ``triton_op``, tilewise's own operators) becomes part of
the graph. What it allocates meanwhile, its results and temporaries, comes from the graph's private pool, so
those addresses stay the graph's while it may replay; its results are copied into their planned buffers inside
the graph (one copy kernel each). An operator that cannot be captured is found in one of two ways: tagged
``tilewise.Tag.cudagraph_unsafe``, as torch's opt-out, its program never captures; or its capture fails (it
synchronizes, reads device memory on the host, uploads from the host, draws random numbers: refused while
capturing, [Note: host operations under capture]; or the driver invalidates the capture), and the program
runs its steps uncaptured from then on. Nothing that was captured ran, so that call runs uncaptured too, and
its results are the eager walk's; ``TILEWISE_LOG=graphs`` names the step and the cause.

Collectives (a DDP bucket's all-reduce) run on a communication stream of the runtime, with events between it and
the program's stream as the lowering's ``StreamSchedule`` says ([Note: collectives on their own stream]): the
same events and waits are captured into the CUDA graph, which forks onto the communication stream and joins it
back before the graph ends.

Autotuning (``mode="max-autotune"``) happens in the first call, which never replays a graph: the walk goes
through the program's ``Tuner``, which times each pending kernel's candidates with CUDA events on the
program's stream (``CudaBench``); a graph captured from the second call on launches the winners.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from tilewise import strides as S
from tilewise._cuda_api import driver_api, is_available
from tilewise._stages import stage
from tilewise.backends.cuda import DeviceBuffer, stream_handle
from tilewise.backends.cuda import run as cuda_run
from tilewise.backends.cuda.graphs import CudaGraph, GraphCaptureError, capture
from tilewise.backends.cuda.kernels import INTO, PREPARE, launch, launch_packed, packer_for
from tilewise.backends.cuda.kernels.copy import copy_into
from tilewise.backends.cuda.matmul import SUPPORTED, bias_epilogue, gemm_into
from tilewise.backends.cuda.runtime import (
    Event,
    Stream,
    check,
    copy_dtod,
    current_device,
    ensure_context,
    get_device_properties,
)
from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing
from tilewise.backends.cuda.runtime.stream import stream as using
from tilewise.backends.cuda.tuning import tuning
from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.schedule import KernelSchedule
from tilewise.compiler.autotune import Pending, Sampler, clobbered, renamed
from tilewise.compiler.ir import Node
from tilewise.compiler.lowering.fusion import is_collective
from tilewise.compiler.lowering.lower import buffer_of, geometry
from tilewise.compiler.lowering.memory import MemoryPlan
from tilewise.compiler.lowering.streams import COMM, StreamSchedule
from tilewise.compiler.program import Arena, Lowered, Program, log_program, step_nodes
from tilewise.config import log, settings
from tilewise.device import Device
from tilewise.ops.tags import Tag, tags_of
from tilewise.storage import Storage
from tilewise.tensor import Tensor

MAX_GRAPHS = 4
SIGHTINGS = 16  # address sets a program in place remembers having run at (see [Note: graphs in place])
STAGED_BYTES = 64 << 20  # the most a program in place copies into its graphs: arguments that move from run to run
GRAPH_COPY_BYTES = 1 << 20
COPY_BYTES_PER_US = 2_000_000  # a device-to-device copy, read and written, on an H100/H200 (about 2 TB/s each way)
LAUNCH_US, CALL_US = 4.0, 20.0  # host time of a kernel launch, and of a library call, from a compiled program


def worth_a_graph(copied: int, steps: list, most: int | None = None) -> bool:
    """Whether copying ``copied`` bytes in and out of a graph costs less than launching ``steps`` one by one (see
    [Note: CUDA programs]); never beyond ``most`` bytes where that is given."""
    if copied <= GRAPH_COPY_BYTES:
        return True
    if most is not None and copied > most:
        return False
    launches = sum(CALL_US if isinstance(step, CudaExternStep) else LAUNCH_US for step in steps)
    return copied / COPY_BYTES_PER_US < launches


class Borrowed:
    """Device memory a tensor views without owning it (a planned buffer)."""

    __slots__ = ("nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes


def device_tensor(ptr: int, value: Node, geom: tuple, device: Device) -> Tensor:
    """A CUDA tensor viewing planned buffer memory at ``ptr`` with a value's geometry."""
    dtype = value.type.dtype
    shape, strides, offset = geom
    size = max((offset + sum((n - 1) * s for n, s in zip(shape, strides) if n)) + 1, 0) if all(shape) else 0
    storage = Storage(Borrowed(ptr, size * dtype.itemsize), device, dtype, size)
    return Tensor._make(storage, tuple(shape), tuple(strides), offset, dtype, device)


class CudaKernelStep:
    capturable = True

    def __init__(self, kernel: Kernel, function, grid: int, block: int, buffers: list[int], scratch_bytes: int,
                 device: Device, pending: tuple | None = None):
        self.kernel, self.function, self.grid, self.block, self.buffers = kernel, function, grid, block, buffers
        self.pending = pending  # (PendingFunctions, unit) while ``function`` is None: compiling
        self.scratch = None
        if scratch_bytes:  # split reductions' partials and counters: zero once, each launch leaves it zeroed
            stream = stream_handle(device.index)
            self.scratch = DeviceBuffer(scratch_bytes, device.index, stream)
            check(driver_api().cuMemsetD8Async(self.scratch.ptr, 0, scratch_bytes, stream), "cuMemsetD8Async")
        self.extra = [self.scratch.ptr] if self.scratch is not None else []
        self.packer = None  # the arguments' struct, made at the first launch (they are all addresses)

    def run(self, pointers: list, stream: int) -> None:
        if not self.grid:  # every nest is empty
            return
        args = [pointers[b] for b in self.buffers] + self.extra
        if self.packer is None:  # a 1-D launch of addresses (False: the general path)
            if self.function is None:
                self.resolve()
            one_d = type(self.grid) is int and type(self.block) is int
            self.packer = (packer_for(self.function, args) if one_d else None) or False
        if self.packer is False:
            launch(self.function, self.grid, self.block, args, stream)
        else:
            launch_packed(self.function, self.grid, self.block, self.packer, args, stream)

    def resolve(self) -> None:
        """Wait for this step's kernel to be compiled and loaded (see [Note: the first run overlaps the compiles])."""
        if self.function is None:
            functions, unit = self.pending
            self.function, self.pending = functions.function(unit), None

    def writes(self) -> list[int]:
        """The buffers this step writes."""
        return [b for b, p in zip(self.buffers, self.kernel.params) if p.written]

    def describe(self) -> str:
        if self.pending is not None:  # still compiling: the name its function will have
            shared = self.pending[0].keys[self.pending[1]][0]
        else:
            shared = getattr(self.function, "name", self.kernel.name)
        alias = f" as {shared}" if shared != self.kernel.name else ""  # one function for kernels of one text
        return (f"launch {self.kernel.name}{alias}<<<{self.grid}, {self.block}>>>"
                f"({', '.join(f'b{b}' for b in self.buffers)})")


class CudaExternStep:
    """A library operator: cuBLASLt for mm/bmm into the planned buffer; an operator with a kernel into a given
    output (see [Note: kernels into a given output]) straight into its planned buffer; else the eager CUDA
    backend, its result copied into the planned buffer."""

    def __init__(self, node: Node, plan: MemoryPlan, results: list[Node | None], device: Device, sm_count: int = 0):
        self.node, self.op, self.device = node, node.opdef, device
        self.inputs = [(plan.of[buffer_of(s)], s, geometry(s)) for s in node.srcs]
        self.outputs = [(plan.of[r], r) if r is not None else None for r in results]
        self.gemm = node.op in GEMM_CALLS and node.type.dtype.name in SUPPORTED
        dense = node.is_tuple or (len(self.outputs) == 1 and self.outputs[0] is not None)
        self.into = INTO.get(self.op.full_name) if dense else None  # an op of several results takes a tuple
        # what ``into`` will need, built when the program is (see [Note: library calls prepared at build])
        self.prepare = PREPARE.get(self.op.full_name) if self.into is not None else None
        # the SMs its GEMM is planned for (0: all; see [Note: GEMMs beside collectives])
        self.sm_count = sm_count
        if sm_count and self.into is not None and node.op in GEMM_EPILOGUE_CALLS:
            self.into = partial(self.into, sm_count=sm_count)
        self.custom = self.op.kind == "custom"
        self.unsafe = Tag.cudagraph_unsafe in tags_of(self.op)
        # a custom operator is captured as it runs ([Note: custom operators in CUDA graphs]); a GEMM, or a kernel
        # into the planned buffer, becomes capturable once a run showed it needs no temporary
        self.capturable = self.custom and not self.unsafe

    def run(self, pointers: list, stream: int) -> None:
        tensors = [device_tensor(pointers[b], value, geom, self.device) for b, value, geom in self.inputs]
        if self.into is not None:
            done = self.into(*self._into_args(pointers, tensors))
            self.capturable = (done or self.custom) and not self.unsafe
            if done:
                return
        if self.gemm:
            buffer, value = self.outputs[0]
            out = device_tensor(pointers[buffer], value, geometry(value), self.device)
            if self.node.op in ("mm", "bmm"):
                self.capturable = not gemm_into(out, tensors[0], tensors[1], sm_count=self.sm_count)
                return
            args = self.node.bound_args(tensors)
            epilogue = bias_epilogue(self.node.op, *args)
            if epilogue is not None:
                bias = args[0] if args[0].is_contiguous() else args[0].contiguous()
                self.capturable = not gemm_into(out, args[1], args[2], bias, epilogue,
                                                sm_count=self.sm_count) and bias is args[0]
                return
        result = cuda_run(self.op, self.node.bound_args(tensors), self.device)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for out, produced in zip(self.outputs, results):
            if out is not None:
                buffer, value = out
                copy_into(device_tensor(pointers[buffer], value, geometry(value), self.device), produced)

    def prepare_call(self, pointers: list) -> None:
        """Build what the kernel into the planned buffers will need for this step, its operands standing at
        ``pointers``, addresses where nothing is (see [Note: library calls prepared at build])."""
        tensors = [device_tensor(pointers[b], value, geom, self.device) for b, value, geom in self.inputs]
        self.prepare(*self._into_args(pointers, tensors))

    def _into_args(self, pointers: list, tensors: list) -> tuple:
        """The arguments of ``into``: the planned outputs (a tuple of an operator of several results), then the
        bound arguments over ``tensors``."""
        outs = tuple(self._dense(pointers, out) for out in self.outputs)
        return (outs if self.node.is_tuple else outs[0], *self.node.bound_args(tensors))

    def writes(self) -> list[int] | None:
        """The buffers this step writes; None for a custom operator or one that writes its arguments."""
        if self.custom or self.op.schema.is_inplace:
            return None
        return [o[0] for o in self.outputs if o is not None]

    def _dense(self, pointers: list, output) -> Tensor | None:
        if output is None:
            return None
        buffer, value = output
        shape = value.type.shape
        return device_tensor(pointers[buffer], value, (shape, S.contiguous_strides(shape), 0), self.device)

    def describe(self) -> str:
        outs = ", ".join(f"b{o[0]}" for o in self.outputs if o is not None)
        what = ("cuBLASLt" if self.gemm else "into its buffer" if self.into is not None else
                "custom operator" if self.custom else "eager")
        if self.sm_count:
            what += f" for {self.sm_count} SMs"
        return f"call {self.node.op} [{what}]({', '.join(f'b{b}' for b, _, _ in self.inputs)}) -> {outs}"

    def capture_blocker(self) -> str:
        """Why this step keeps its program out of CUDA graphs (when it is not ``capturable``)."""
        if self.unsafe:
            return f"{self.describe()}: the operator is tagged cudagraph_unsafe"
        return f"{self.describe()} cannot be captured"


class CudaCopyStep:
    """Copy ``value`` (read through its views) into buffer ``dst``, laid out contiguously from byte ``offset``."""

    capturable = True

    def __init__(self, value: Node, src: int, dst: int, device: Device, offset: int = 0):
        self.value, self.src, self.dst, self.device, self.offset = value, src, dst, device, offset
        self.geometry = geometry(value)

    def writes(self) -> list[int]:
        return [self.dst]

    def run(self, pointers: list, stream: int) -> None:
        shape = self.value.type.shape
        dst = device_tensor(pointers[self.dst] + self.offset, self.value, (shape, S.contiguous_strides(shape), 0),
                            self.device)
        copy_into(dst, device_tensor(pointers[self.src], self.value, self.geometry, self.device))

    def describe(self) -> str:
        return f"copy b{self.src} -> b{self.dst}" + (f" at byte {self.offset}" if self.offset else "")


class _Graph:
    """One captured CUDA graph of a program and the static output buffers it writes."""

    def __init__(self, graph: CudaGraph, outputs: list[DeviceBuffer]):
        self.graph, self.outputs = graph, outputs


SNAPSHOT_BYTES = 16 << 20  # inputs' memory a first run may write, copied, before its kernels are all compiled


class CudaRuntime:
    """The CUDA half of a ``Program``: the module, the device arena, running the steps, graphs."""

    def __init__(self, program, device: Device, use_graphs: bool):
        self.program, self.device = program, device
        self.use_graphs = use_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.staging: dict[int, DeviceBuffer] = {}
        self.slots: tuple | None = None  # (staged, input buffer slots, the slots read in place) of the last replay
        self.sightings: dict[tuple, None] = {}  # in place: the address sets of recent runs, oldest first
        self.last_pointers: list | None = None  # in place: the last run's addresses
        self.staged_in_place: dict[int, tuple[int, DeviceBuffer]] = {}  # in place: slot -> (buffer, its staging)
        self.staged_bytes = 0
        self.written_inputs: frozenset[int] | None = None  # in place: input buffers a step writes (None: unknown)
        self.calls = 0
        self.replays = 0  # calls served by launching a captured graph
        self.why_not = "" if use_graphs else "CUDA graphs off"
        if use_graphs and len(program.steps) < 2:
            self.why_not = "one step: a graph would save nothing"
        self.generation = -1  # the arena generation ``base_pointers`` (and the graphs) were made for
        self.base_pointers: list = []
        self.order: StepOrder | None = None  # where collectives run and who waits for them; None: all in order
        self.comm: Stream | None = None  # the communication stream, made by the first overlapped walk
        self.compiling: PendingFunctions | None = None  # the kernels' functions until every one is loaded
        self.kernel_steps = [s for s in program.steps if isinstance(s, CudaKernelStep)]
        self.bound: list | None = None  # the buffers ``_bind`` binds at each run, made at the first

    def _bind_arena(self) -> None:
        arena = self.program.arena
        if arena.generation != self.generation:
            base = arena.buffer.ptr
            self.base_pointers = [base + b.slot if b.kind == "arena" else 0 for b in self.program.plan.buffers]
            if not (arena.transient and self.program.graphs_in_place):  # (keyed by the arena's address too)
                self.graphs.clear()  # they read and write the old arena
            self.generation = arena.generation

    # ------------------------------------------------------------------ eager walk
    def _bind(self, inputs: list, stream: int) -> tuple[list, list]:
        if self.bound is None:  # per buffer bound at each run: (kind, position, its input or size, byte offset)
            self.bound = [(b.kind, k, b.ty.nbytes if b.kind == "output" else b.slot, b.offset)
                          for k, b in enumerate(self.program.plan.buffers) if b.kind != "arena"]
        pointers = list(self.base_pointers)
        outputs = []
        index = self.device.index
        for kind, k, what, offset in self.bound:
            if kind == "output":
                out = DeviceBuffer(what, index, stream)
                outputs.append(out)
                pointers[k] = out.ptr
            else:  # an input; a donated one's memory (see [Note: donated inputs]) from a byte offset in it
                pointers[k] = inputs[what].ptr + offset
        return pointers, outputs

    def _walk(self, pointers: list, stream: int) -> None:
        if self.program.autotune and self.calls == 1:
            with tuning():  # cuDNN and cuBLASLt time their candidates too (remembered on disk)
                self._walk_steps(pointers, stream)
            return
        self._walk_steps(pointers, stream)

    def _walk_steps(self, pointers: list, stream: int) -> None:
        if self.program.tuner is not None:
            self._loaded()
            self.program.tuner.walk(self.program, CudaBench(pointers, stream, self.program.plan, self.device))
            return
        if self.compiling is not None:
            if self.order is None and not is_current_stream_capturing():
                self._first_walk(pointers, stream)
                return
            self._loaded()
        if self.order is not None:
            self._walk_overlapped(pointers, stream)
            return
        for step in self.program.steps:
            step.run(pointers, stream)

    def _first_walk(self, pointers: list, stream: int) -> None:
        """The steps, each kernel waiting for its own compile as it comes up ([Note: the first run overlaps the
        compiles]). Inputs' memory a step writes while compiles are pending (an optimizer's step counts, at the
        start of a training step) is copied first, up to ``SNAPSHOT_BYTES`` in all, and written back should the
        run fail before every compile is done; before a step that would write more (a parameter's update), or
        calls a custom operator or one that writes its arguments, every compile is waited for."""
        buffers = self.program.plan.buffers
        outside = {k for k, b in enumerate(buffers) if b.kind in ("input", "donated")}
        saved: list[tuple[int, DeviceBuffer]] = []
        left = SNAPSHOT_BYTES
        try:
            for step in self.program.steps:
                if self.compiling is not None:
                    writes = getattr(step, "writes", None)  # (a step wrapped by a profiler may not say: all first)
                    written = writes() if writes is not None else None
                    touched = [] if written is None else \
                        [b for b in dict.fromkeys(written) if b in outside and all(b != k for k, _ in saved)]
                    need = sum(buffers[b].ty.nbytes for b in touched)
                    if written is None or need > left:
                        self._loaded()
                        saved = []  # compiled: the run goes on as any run does
                    else:
                        for b in touched:
                            copy = DeviceBuffer(buffers[b].ty.nbytes, self.device.index, stream)
                            copy_dtod(copy.ptr, pointers[b], buffers[b].ty.nbytes, stream)
                            saved.append((b, copy))
                        left -= need
                step.run(pointers, stream)
            self._loaded()
        except BaseException:
            for b, copy in reversed(saved):  # as they were before the call
                copy_dtod(pointers[b], copy.ptr, buffers[b].ty.nbytes, stream)
            raise

    def _loaded(self) -> None:
        """Wait for every kernel's compile and give each step its function."""
        if self.compiling is not None:
            with stage("compile kernels (NVRTC) and load"):
                self.compiling.all()
            for step in self.kernel_steps:
                step.resolve()
            self.compiling = None

    def _walk_overlapped(self, pointers: list, stream: int, running: list | None = None) -> None:
        """The steps, each collective on the communication stream (see [Note: collectives on their own stream]).
        ``running[0]`` follows the step being run (for the report of a capture that fails)."""
        order, cu = self.order, driver_api()
        if self.comm is None:
            self.comm = Stream(self.device.index)
        comm = self.comm.handle
        for k, step in enumerate(self.program.steps):
            if running is not None:
                running[0] = step
            for c in order.waits[k]:
                check(cu.cuStreamWaitEvent(stream, order.done[c].handle, 0), "cuStreamWaitEvent")
            if k in order.done:
                order.forks[k].record(stream)
                check(cu.cuStreamWaitEvent(comm, order.forks[k].handle, 0), "cuStreamWaitEvent")
                with using(self.comm):
                    step.run(pointers, comm)
                order.done[k].record(comm)
            else:
                step.run(pointers, stream)
        for c in order.at_end:
            check(cu.cuStreamWaitEvent(stream, order.done[c].handle, 0), "cuStreamWaitEvent")

    def run(self, inputs: list, staged: frozenset[int]) -> list:
        ensure_context(self.device.index)  # see [Note: the operation's device]
        stream = stream_handle(self.device.index)
        self.calls += 1
        if (self.calls == 1 and self.program.arena.transient and self.use_graphs and not self.why_not
                and not self.program.graphs_in_place):  # (in place, the arena's address is part of a graph's key)
            self.why_not = "its intermediates are allocated for each run (a transient arena)"
        self._bind_arena()
        self._after_last_use(stream)
        return self._run(inputs, staged, stream)

    def _after_last_use(self, stream: int) -> None:
        """Order this run after the arena's last use when that was on another stream (another thread's): an
        event recorded on that stream now follows everything it was given, that use included."""
        arena = self.program.arena
        if arena.stream is not None and arena.stream != stream and not is_current_stream_capturing():
            # (a capture cannot wait on work outside it; a graph's capture begins after the device has finished
            # all earlier work, as ``tilewise.cuda.graph`` synchronises first, as torch's does)
            if arena.event is None:
                arena.event = Event()
            arena.event.record(arena.stream)
            check(driver_api().cuStreamWaitEvent(stream, arena.event.handle, 0), "cuStreamWaitEvent")
        arena.stream = stream

    def _run(self, inputs: list, staged: frozenset[int], stream: int) -> list:
        # under a capture of the caller's own (``tilewise.cuda.graph``), the steps are launched and so join that
        # graph: a graph of the program's own can be neither captured nor launched inside it
        if self.use_graphs and self.calls > 1 and not self.why_not and not is_current_stream_capturing():
            if self.program.graphs_in_place:
                return self._run_in_place(inputs, stream)
            replayed = self._replay(inputs, staged, stream)
            if replayed is not None:
                return replayed
        pointers, outputs = self._bind(inputs, stream)
        self._walk(pointers, stream)
        if self.use_graphs and not self.why_not:
            blockers = [s for s in self.program.steps if not s.capturable]
            if blockers:
                self.why_not = blockers[0].capture_blocker()
                log("graphs", f"program not captured into a CUDA graph: {self.why_not}")
        return outputs

    # ------------------------------------------------------------------ graphs
    def _replay(self, inputs: list, staged: frozenset[int], stream: int) -> list | None:
        plan = self.program.plan
        slots = self.slots
        if slots is None or slots[0] is not staged:  # the same for every call of a variant
            input_slots = [(k, b.slot) for k, b in enumerate(plan.buffers) if b.kind == "input"]
            self.slots = slots = (staged, input_slots, [slot for _, slot in input_slots if slot not in staged])
        _, input_slots, read_in_place = slots
        if not self.graphs:
            copied = sum(b.ty.nbytes for b in plan.buffers if b.kind == "output" or
                         (b.kind == "input" and b.slot in staged))
            most = self.program.graph_bytes
            if not worth_a_graph(copied, self.program.steps, most):
                self.why_not = (f"arguments and outputs of {copied} bytes would be copied in and out of a graph, "
                                + (f"more than the {most} its graphs may hold" if most is not None and copied > most
                                   else f"longer than launching its {len(self.program.steps)} steps"))
                log("graphs", f"program not captured into a CUDA graph: {self.why_not}")
                return None
        key = tuple([inputs[slot].ptr for slot in read_in_place])
        graph = self.graphs.get(key)
        if graph is not None and graph.graph.released:  # its communicator was destroyed: capture again
            del self.graphs[key]
            graph = None
        if graph is None:
            if len(self.graphs) >= MAX_GRAPHS:
                self.why_not = f"more than {MAX_GRAPHS} sets of input addresses"
                log("graphs", f"program stops using CUDA graphs: {self.why_not}")
                return None
            try:
                graph = self._capture(inputs, staged, input_slots, stream)
            except _CaptureFailedError as failed:
                self.why_not = str(failed)
                log("graphs", f"program not captured into a CUDA graph, its steps run uncaptured: {self.why_not}")
                return None
            self.graphs[key] = graph
        for k, slot in input_slots:
            if slot in staged:
                copy_dtod(self.staging[slot].ptr, inputs[slot].ptr, plan.buffers[k].ty.nbytes, stream)
        graph.graph.replay(stream)
        self.replays += 1
        results = []
        for buf, static in zip(self._output_buffers(), graph.outputs):
            out = DeviceBuffer(buf.ty.nbytes, self.device.index, stream)
            if buf.ty.nbytes:
                copy_dtod(out.ptr, static.ptr, buf.ty.nbytes, stream)
            results.append(out)
        return results

    def _run_in_place(self, inputs: list, stream: int) -> list:
        """A run replaying the graph captured at this run's addresses, capturing one there first if need be (see
        [Note: graphs in place]); the steps walked where no graph can be had."""
        pointers, outputs = self._bind(inputs, stream)
        key = self._in_place_key(inputs, pointers)
        graph = self.graphs.get(key)
        if graph is not None and graph.graph.released:  # its communicator was destroyed: capture again
            del self.graphs[key]
            graph = None
        if graph is None:
            if key not in self.sightings:  # addresses seen once may never come back: not worth a capture yet
                self.sightings[key] = None
                if len(self.sightings) > SIGHTINGS:
                    del self.sightings[next(iter(self.sightings))]
                self._walk(pointers, stream)
                return outputs
            if len(self.graphs) >= MAX_GRAPHS:
                self.why_not = f"more than {MAX_GRAPHS} sets of addresses that repeat"
                log("graphs", f"program stops using CUDA graphs: {self.why_not}")
                self.graphs.clear()
                self._walk(pointers, stream)
                return outputs
            try:
                graph = _Graph(self._captured(list(key)), [])
            except _CaptureFailedError as failed:
                self.why_not = str(failed)
                log("graphs", f"program not captured into a CUDA graph, its steps run uncaptured: {self.why_not}")
                self._walk(pointers, stream)  # nothing that was captured ran
                return outputs
            self.graphs[key] = graph
        plan = self.program.plan
        for slot, (k, staging) in self.staged_in_place.items():
            copy_dtod(staging.ptr, inputs[slot].ptr, plan.buffers[k].ty.nbytes, stream)
        graph.graph.replay(stream)
        self.replays += 1
        return outputs

    def _in_place_key(self, inputs: list, pointers: list) -> tuple:
        """The addresses a graph of this run would bake in: the run's own, but for the arguments copied into
        staging buffers. Small arguments that moved since the last run (a batch's tokens, a new image) are staged
        from then on, up to ``STAGED_BYTES`` in all, so that the large ones alone key the graphs."""
        plan = self.program.plan
        last, self.last_pointers = self.last_pointers, pointers
        if self.written_inputs is None:  # a copy of an input the program writes would take the write: never staged
            writes = [step.writes() if hasattr(step, "writes") else None for step in self.program.steps]
            self.written_inputs = (None if any(w is None for w in writes)
                                   else frozenset(k for w in writes for k in w if plan.buffers[k].kind == "input"))
        if last is not None and self.written_inputs is not None:
            moved = {plan.buffers[k].slot: k for k, (a, b) in enumerate(zip(last, pointers))
                     if a != b and plan.buffers[k].kind == "input" and k not in self.written_inputs
                     and plan.buffers[k].slot not in self.staged_in_place}
            more = sum(plan.buffers[k].ty.nbytes for k in moved.values())
            if moved and self.staged_bytes + more <= STAGED_BYTES:
                for slot, k in moved.items():
                    self.staged_in_place[slot] = (k, DeviceBuffer(plan.buffers[k].ty.nbytes, self.device.index,
                                                                  stream_handle(self.device.index)))
                self.staged_bytes += more
                self.graphs.clear()  # keyed by the addresses these arguments had
                self.sightings.clear()
        if not self.staged_in_place:
            return tuple(pointers)
        key = list(pointers)
        for k, buf in enumerate(plan.buffers):
            if buf.kind in ("input", "donated") and buf.slot in self.staged_in_place:
                key[k] = self.staged_in_place[buf.slot][1].ptr + (buf.offset if buf.kind == "donated" else 0)
        return tuple(key)

    def _output_buffers(self) -> list:
        return [b for b in self.program.plan.buffers if b.kind == "output"]

    def _capture(self, inputs: list, staged: frozenset[int], input_slots: list, stream: int) -> _Graph:
        plan = self.program.plan
        index = self.device.index
        for k, slot in input_slots:
            if slot in staged and slot not in self.staging:
                self.staging[slot] = DeviceBuffer(plan.buffers[k].ty.nbytes, index, stream)
        pointers = list(self.base_pointers)
        for k, slot in input_slots:
            pointers[k] = self.staging[slot].ptr if slot in staged else inputs[slot].ptr
        outputs = []
        for k, buf in enumerate(plan.buffers):
            if buf.kind == "output":
                out = DeviceBuffer(buf.ty.nbytes, index, stream)
                outputs.append(out)
                pointers[k] = out.ptr
            elif buf.kind == "donated":  # in the memory the input is read from: its staging buffer if staged
                pointers[k] = (self.staging[buf.slot].ptr if buf.slot in staged else inputs[buf.slot].ptr) + buf.offset
        return _Graph(self._captured(pointers), outputs)

    def _captured(self, pointers: list):
        """The program's steps over ``pointers`` captured into a CUDA graph (not run)."""
        from tilewise.backends.cuda import cudnn
        from tilewise.backends.cuda.runtime.bounds import keeping_sites

        index = self.device.index
        cudnn.note_capture()  # the cuDNN calls captured keep their workspace's address
        running: list = [None]  # the step being captured, for the report of a capture that fails

        def walk(capture_stream: int) -> None:
            with keeping_sites():
                if self.order is not None:  # collectives fork onto the communication stream and join back
                    self._walk_overlapped(pointers, capture_stream, running)
                else:
                    for step in self.program.steps:
                        running[0] = step
                        step.run(pointers, capture_stream)
            running[0] = None

        try:
            graph = capture(walk, index)
        except GraphCaptureError as exc:
            raise _CaptureFailedError(self._failure(exc, running[0])) from exc
        custom = sum(getattr(s, "custom", False) for s in self.program.steps)
        log("graphs", f"captured a CUDA graph of {len(self.program.steps)} step(s)"
                      f"{f', {custom} custom operator call(s) among them' if custom else ''} "
                      f"({len(self.graphs) + 1} graph(s) for this program)")
        return graph

    def _failure(self, exc: GraphCaptureError, step) -> str:
        """Why a capture failed: the step that raised, or, where the driver ended it, its custom operators."""
        if step is not None:
            return f"capturing {step.describe()} failed: {exc}"
        custom = [s.node.op for s in self.program.steps if getattr(s, "custom", False)]
        among = f"; its custom operators: {', '.join(custom)}" if custom else ""
        return f"capturing it failed: {exc}{among}"


class _CaptureFailedError(Exception):
    """A program's capture failed; the message says at which step and why."""


def device_arena(device: Device) -> Arena:
    """An arena (``program.Arena``) in device memory from the caching allocator."""
    return Arena(lambda nbytes: DeviceBuffer(nbytes, device.index, stream_handle(device.index)))


class KernelCompiles:
    """The compiles of a program's kernels on the compile pool: each kernel is noted as its unit is rendered
    (``start``, which ``lower_program`` calls), and :meth:`start_all` starts them, the texts no cache holds
    compiled together in as many units as there are compile threads (see [Note: kernels compiled together] in
    ``codegen/toolchain/pool.py``), the largest first; ``compile_units`` then waits for them. Units that differ
    only in the kernel's name start one compile (see :func:`compile_units`)."""

    def __init__(self, device: Device):
        self.device = device
        self.arch = get_device_properties(device.index).arch
        self.cache = None  # the kernel cache compiled through (None: the process's)
        self.started: dict[tuple[str, str], object] = {}  # (shared name, its unit) -> the compile's future
        self.together: dict[tuple[str, str], bool] = {}  # those compiled in a unit with others: True
        self.noted: dict[tuple[str, str], None] = {}  # rendered, not started yet

    def start(self, name: str, source: str) -> None:
        """Note the kernel ``name`` of ``source`` (under its shared name) for :meth:`start_all`."""
        key = shared_name(name, source)
        if key not in self.started:
            self.noted[key] = None

    def start_all(self, keys: list[tuple[str, str]]) -> None:
        """Start compiling every kernel noted and each of ``keys`` (shared names) not started yet."""
        from tilewise.codegen.toolchain import default_cache
        from tilewise.codegen.toolchain.pool import compile_groups, compile_threads, start_compile

        waiting = [key for key in dict.fromkeys([*self.noted, *keys]) if key not in self.started]
        self.noted.clear()
        cache = self.cache if self.cache is not None else default_cache()
        threads = compile_threads()
        held = {key for key in waiting if threads > 1 and cache.holds(key[1], key[0], self.arch)}
        fresh = [key for key in waiting if key not in held]
        groups = [[k] for k in range(len(fresh))] if threads == 1 else compile_groups([k[1] for k in fresh], threads)
        units = [[key] for key in waiting if key in held] + [[fresh[k] for k in group] for group in groups]
        for unit in sorted(units, key=lambda unit: sum(len(key[1]) for key in unit), reverse=True):
            if len(unit) == 1:
                self.started[unit[0]] = start_compile(unit[0][1], unit[0][0], self.arch, self.cache)
                continue
            future = start_compile("\n".join(key[1] for key in unit), [key[0] for key in unit], self.arch, self.cache)
            for key in unit:
                self.started[key] = future
                self.together[key] = True


def compile_kernels(sources: dict[str, str], device: Device, compiles: KernelCompiles | None = None) -> dict:
    """Compile each kernel's CUDA source for ``device`` (in parallel, through the kernel cache) and load it;
    ``compiles``: the kernels' compiles started as they were rendered."""
    return dict(zip(sources, compile_units(list(sources.items()), device, compiles)))


def compile_units(units: list[tuple[str, str]], device: Device, compiles: KernelCompiles | None = None) -> list:
    """The function of each (kernel name, translation unit), compiled in parallel through the kernel cache and
    loaded: several units may define kernels of one name (a kernel's schedule candidates).

    Units that differ only in the kernel's name (a transformer's layers make the same kernels once per layer)
    are compiled and loaded once, under a name made from their text (:func:`shared_name`): the program's steps
    then launch one function, and the kernel cache serves it to every program and process that makes it. The
    compiles not started yet start longest first, and each module is loaded as soon as its compile is done, while
    the others compile ([Note: parallel compiles])."""
    return PendingFunctions(units, device, compiles).all()


class PendingFunctions:
    """The functions of a program's kernels while the compile pool works on them (see :func:`compile_units`):
    ``function(k)`` waits for unit ``k``'s compile alone and loads its module, ``all()`` for every one.

    [Note: the first run overlaps the compiles] A program's first run does not wait for all its kernels before it
    starts: each kernel step waits for its own function as it comes up, so the library work of the first run —
    cuBLASLt's timed algorithm choices, cuDNN's graph builds, which take seconds on a first compile — runs while
    NVRTC still compiles later kernels (cuDNN's attention graphs are built even before the run, as the program is:
    [Note: library calls prepared at build]). What a user could see of a failed compile stays as before (an error, and
    the arguments as they were): an input's memory written while compiles are pending is copied first and written
    back if the run fails, and the run waits for every compile before a step that would write more than a little
    of it (see :meth:`CudaRuntime._first_walk`)."""

    def __init__(self, units: list[tuple[str, str]], device: Device, compiles: KernelCompiles | None = None):
        from tilewise.codegen.toolchain import default_cache

        self.device = device
        compiles = compiles if compiles is not None else KernelCompiles(device)
        self.keys = [shared_name(name, source) for name, source in units]
        self.unique = list(dict.fromkeys(self.keys))
        with stage("toolchain"):  # on a first compile, NVRTC's version and the CUDA headers are looked up
            default_cache().toolchain()
        compiles.start_all(self.unique)
        self.compiles = compiles
        self.futures = {key: compiles.started[key] for key in self.unique}
        self.loaded: dict[tuple[str, str], object] = {}
        self.modules: dict[int, object] = {}  # id of a compiled unit -> its module (units of several kernels)
        self.summarised = False  # every module loaded and the compile log written

    def _load(self, key: tuple[str, str]):
        from tilewise.backends.cuda.runtime.module import load_module

        fn = self.loaded.get(key)
        if fn is None:
            compiled = self._compiled(key)
            with stage("load modules"):
                module = self.modules.get(id(compiled))
                if module is None:
                    module = self.modules[id(compiled)] = load_module(compiled.cubin, self.device.index)
                fn = self.loaded[key] = module.get_function(key[0])
            fn.source = key[1]
        return fn

    def _compiled(self, key: tuple[str, str]):
        """The compiled unit holding ``key``'s kernel: a unit of several that failed is compiled text by text, so
        that an error is the kernel's own (see [Note: kernels compiled together])."""
        future = self.futures[key]
        if not future.cancelled():  # (dropped after another kernel's compile failed: started again here)
            if not self.compiles.together.get(key):
                return future.result()
            try:
                return future.result()
            except Exception:  # noqa: BLE001, S110 — this kernel alone: compiled, or its own error raised
                pass
        from tilewise.codegen.toolchain.pool import start_compile

        self.futures[key] = self.compiles.started[key] = start_compile(key[1], key[0], self.compiles.arch,
                                                                        self.compiles.cache)
        self.compiles.together[key] = False
        return self.futures[key].result()

    def function(self, k: int):
        """Unit ``k``'s function, once its compile is done (waited for here)."""
        key = self.keys[k]
        found = self.loaded.get(key)
        if found is not None:
            return found
        with stage("compile kernels (NVRTC) and load"):
            return self._load(key)

    def all(self) -> list:
        """Every unit's function, each module loaded as its compile is done."""
        from tilewise.codegen.toolchain.pool import finished

        if not self.summarised:
            waiting: dict[int, list] = {}  # per compile (a unit may hold several kernels), its kernels
            for key in self.unique:
                if key not in self.loaded:
                    waiting.setdefault(id(self.futures[key]), []).append(key)
            units = list(waiting.values())
            try:
                for k in finished([self.futures[unit[0]] for unit in units]):
                    for key in units[k]:
                        self._load(key)
            except Exception:  # noqa: BLE001 — a unit failed: each kernel in order, a failed unit's text by text
                for key in self.unique:
                    self._load(key)  # raises the first kernel's own error
            self.summarised = True
            log("compile", lambda: _compile_summary(len(self.keys), {key: self._compiled(key)
                                                                     for key in self.unique}))
        return [self.loaded[key] for key in self.keys]


def _compile_summary(units: int, compiled: dict) -> str:
    by_unit: dict[int, list] = {}  # a compile of several texts (see [Note: kernels compiled together]) counts once
    for key, k in compiled.items():
        by_unit.setdefault(id(k), [k, []])[1].append(key[0])
    fresh = sorted(((k.compile_seconds, names) for k, names in by_unit.values() if not k.from_cache),
                   key=lambda item: item[0], reverse=True)
    texts = sum(len(names) for _, names in fresh)
    slowest = ", ".join(f"{names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''} {seconds:.2f} s"
                        for seconds, names in fresh[:3])
    return (f"{units} kernels, {len(compiled)} different texts: {texts} compiled by NVRTC in {len(fresh)} "
            f"compiles{f' (slowest: {slowest})' if fresh else ''}, the rest from the kernel cache")


def shared_name(name: str, source: str) -> tuple[str, str]:
    """(name, source) of a kernel under a name made from its text: ``k12_gelu_backward_sum`` becomes
    ``gelu_backward_sum_<hash of the text>``, the same for every kernel whose text differs only in its name.
    A unit that names its kernel other than once in its head keeps its own name."""
    head = f" {name}("
    if source.count(head) != 1 or source.count(name) != 1:
        return name, source
    digest = hashlib.sha1(source.replace(head, " tw_kernel(").encode()).hexdigest()[:10]
    readable = re.sub(r"^k\d+_", "", name)
    new = f"{readable}_{digest}" if readable and readable != name else f"tw_{digest}"
    return new, source.replace(head, f" {new}(")


# ---------------------------------------------------------------------------- autotuning

class CudaBench:
    """Runs the steps of one call of a CUDA program and times kernel candidates on its buffers with events."""

    def __init__(self, pointers: list, stream: int, plan: MemoryPlan, device: Device):
        self.pointers, self.stream, self.plan, self.device = pointers, stream, plan, device

    def run(self, step) -> None:
        step.run(self.pointers, self.stream)

    def samplers(self, steps: list[CudaKernelStep]) -> list[Sampler]:
        """The candidates' steps (one kernel's) timed on this call's buffers; what it updates in place, on a
        scratch copy restored before every run."""
        nbytes = lambda b: self.plan.buffers[b].ty.nbytes
        extent = lambda b: (self.pointers[b], self.pointers[b] + nbytes(b))
        pointers = list(self.pointers)
        copies = []
        for b in clobbered(steps[0].kernel, steps[0].buffers, extent):
            pristine = DeviceBuffer(nbytes(b), self.device.index, self.stream)
            scratch = DeviceBuffer(nbytes(b), self.device.index, self.stream)
            copy_dtod(pristine.ptr, self.pointers[b], nbytes(b), self.stream)
            pointers[b] = scratch.ptr
            copies.append((scratch, pristine, nbytes(b)))
        events = Event(enable_timing=True), Event(enable_timing=True)
        return [Sampler(partial(self._sample, step, pointers, copies, events), not copies) for step in steps]

    def _sample(self, step: CudaKernelStep, pointers: list, copies: list, events: tuple, repeats: int) -> float:
        start, end = events
        for scratch, pristine, n in copies:
            copy_dtod(scratch.ptr, pristine.ptr, n, self.stream)
        start.record(self.stream)
        for _ in range(repeats):
            step.run(pointers, self.stream)
        end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats


class CudaTuning:
    """The CUDA target's part of autotuning: a translation unit per candidate, under the kernel's own name, so
    the winner's unit is the one a later process builds from the decision cache (and finds in the kernel
    cache)."""

    def __init__(self, target, device: Device, aliased: dict[str, frozenset[int]]):
        self.target, self.device, self.aliased = target, device, aliased

    def machine(self) -> dict:
        from tilewise.codegen.toolchain import nvrtc_version

        props = get_device_properties(self.device.index)
        return {"gpu": props.name, "arch": props.arch, "nvrtc": list(nvrtc_version())}

    def source(self, sched: KernelSchedule, name: str) -> str:
        from tilewise.codegen.render.kernel_cuda import render_program

        shared = self.aliased.get(sched.kernel.name)
        return render_program([renamed(sched, name)], {name: shared} if shared else None)[name]

    def compile(self, pending: dict[str, Pending]) -> dict[str, list]:
        units = [(name, self.source(c, name)) for name, p in pending.items() for c in p.candidates]
        functions = iter(compile_units(units, self.device))
        return {name: [next(functions) for _ in p.candidates] for name, p in pending.items()}

    def step(self, step: CudaKernelStep, sched: KernelSchedule, function) -> CudaKernelStep:
        return CudaKernelStep(step.kernel, function, sched.grid, sched.block, step.buffers, sched.scratch_bytes,
                              self.device)

    def finish(self, program) -> None:
        program.source = "\n".join(self.source(s, s.kernel.name) for s in program.schedules)
        log_program(program)


# ---------------------------------------------------------------------------- building

def render_cuda(schedules: list[KernelSchedule], aliased: dict[str, frozenset[int]], rendered=None
                ) -> tuple[str, dict[str, str]]:
    """One translation unit per kernel (compiled in parallel, each cached on its own), and their text together;
    ``rendered(name, text)`` hears of each unit as it is made."""
    from tilewise.codegen.render.kernel_cuda import render_program

    sources = render_program(schedules, aliased, rendered)
    return "\n".join(sources.values()), sources


class StepOrder:
    """A ``StreamSchedule`` on a program's steps (a node may make several steps, or none): per step the
    collectives (by step index) the program's stream waits for before it; the events of each collective step."""

    def __init__(self, waits: list[tuple[int, ...]], collectives: list[int], at_end: tuple[int, ...]):
        self.waits, self.at_end = waits, at_end
        self.forks = {k: Event() for k in collectives}  # recorded on the program's stream before the collective
        self.done = {k: Event() for k in collectives}  # recorded on the communication stream after it

    @staticmethod
    def of(schedule: StreamSchedule, made: list[list[int]], step_count: int) -> StepOrder:
        """``made[k]``: the indices of the steps node ``k`` of the schedule made; the steps after the last node's
        (end-of-call copies) come after every collective."""
        waits: list[tuple[int, ...]] = [() for _ in range(step_count)]
        collectives, carried = [], []
        for k, indices in enumerate(made):
            carried += [made[c][0] for c in schedule.waits[k]]
            if schedule.streams[k] == COMM:
                collectives.append(indices[0])
            elif indices:
                waits[indices[0]], carried = tuple(carried), []
        carried += [made[c][0] for c in schedule.at_end]
        tail = sum(len(i) for i in made)
        if tail < step_count:
            waits[tail], carried = tuple(carried), []
        return StepOrder(waits, collectives, tuple(carried))


GEMM_CALLS = ("mm", "bmm", "addmm", "_addmm_activation")  # library calls a step runs through cuBLASLt
GEMM_EPILOGUE_CALLS = ("_addmm_gelu", "_mm_gelu_backward")  # cuBLASLt with a second matrix: kernels into an output


def gemm_sm_counts(nodes: list[Node], schedule: StreamSchedule | None, sm_total: int, carveout: int) -> list[int]:
    """Per step node, the SMs its GEMM is planned for: the device's ``sm_total`` less ``carveout`` for a GEMM
    call that runs beside a collective, 0 (all of them) for every other step (see [Note: GEMMs beside
    collectives]). A carveout of 0 or less plans every GEMM for the whole device, as does a program whose
    collectives each span one rank; a carveout that leaves no SM is refused."""
    if schedule is None or not schedule.beside or carveout <= 0 or not any(map(_between_devices, nodes)):
        return [0] * len(nodes)
    if carveout >= sm_total:
        raise ValueError(f"the GEMM SM carveout (settings.gemm_sm_carveout, TILEWISE_GEMM_SM_CARVEOUT) is "
                         f"{carveout}, which leaves no SM of the device's {sm_total}; 0 turns it off")
    gemms = GEMM_CALLS + GEMM_EPILOGUE_CALLS
    return [sm_total - carveout if beside and node.op in gemms else 0 for node, beside in zip(nodes, schedule.beside)]


def _between_devices(node: Node) -> bool:
    """Whether a step is a collective that may run kernels beside the program: not one over a single rank (a DDP
    step on one GPU), where the transport moves nothing."""
    if not is_collective(node):
        return False
    ranks = node.opdef.attrs.get("ranks")
    try:
        return ranks is None or ranks(*node.args) > 1
    except Exception:  # noqa: BLE001 — a group that cannot be told counts as several ranks
        return True


STAND_IN_BASE = 1 << 40  # where a prepared step's operands stand: an address aligned as an allocation's is


def stand_in_pointers(plan: MemoryPlan) -> list[int]:
    """An address per planned buffer with the alignment its memory will have at a run (an arena buffer at its
    slot from the arena's start, donated memory at its offset, an input or output at an allocation's start),
    where nothing is: what preparing a step reads of its operands is their geometry."""
    return [STAND_IN_BASE + (b.slot if b.kind == "arena" else b.offset) for b in plan.buffers]


def prepare_library_calls(steps: list, plan: MemoryPlan) -> None:
    """Call the preparation of every library step that has one, on stand-ins for its operands.

    [Note: library calls prepared at build] Some library calls build something for their operands' geometry
    the first time they run: cuDNN's attention graphs take 0.5-1 s each on a first compile (validation,
    heuristics, the fused kernel's compile). A program's first run
    (see [Note: the first run overlaps the compiles]) would come to them only after waiting for the kernels
    before them, so the builds would follow the NVRTC compiles instead of running beside them. The geometry is
    known when the program is built, so an operator whose kernel into its planned buffers needs such a build
    registers a ``prepare`` with it (``kernel_into``), called here, after the compile pool has been handed the
    kernels, with tensors standing for the step's operands and outputs (their shape, strides, dtype and device,
    at ``stand_in_pointers``, where nothing is). It builds and keeps what the run will look up, under the key
    the run will compute: the same function computes the call from the operands in both (``attention.py``'s
    ``_kernel_into``). A build that fails is remembered as the run would remember it, and the run then takes
    its fallback; nothing runs on the device here. A preparation that raises is logged and passed over: the run
    then builds what it needs itself, and any error is the run's, where the eager call would raise it. The
    builds are mostly outside the interpreter's lock (a thread spinning in Python kept 73-80% of its pace beside
    a first attention call on an H200), but they draw on the same cores as the NVRTC compiles: built here they
    take 1.2-3.1 s for two graphs, built where the run meets them (the compiles mostly done) 0.4-0.7 s, and the
    first step is the same either way within its spread between processes (ViT-B/16, GPT-2 and Llama, 2 runs each
    way in one session). Builder threads of their own, each with its handle, were tried: no faster (the NVRTC
    waits grew by what the builds took). Only
    programs built to run on CUDA prepare (``lowered()`` builds none); ``TILEWISE_LOG=compile`` shows the time
    under "prepare library calls"."""
    prepared = [step for step in steps if isinstance(step, CudaExternStep) and step.prepare is not None]
    if not prepared:
        return
    pointers = stand_in_pointers(plan)
    with stage("prepare library calls (cuDNN graphs)"):
        for step in prepared:
            try:
                step.prepare_call(pointers)
            except Exception as exc:  # noqa: BLE001 — only a head start: the run builds what it needs, or says why
                log("compile", f"preparing {step.describe()} failed, the run will build it: "
                               f"{type(exc).__name__}: {exc}")


def build_cuda_program(low: Lowered, device: Device, graphs: bool = True) -> Program:
    """The CUDA target's program: compile and load each kernel (NVRTC), make the steps, and the runtime that
    launches them (or replays them as one CUDA graph)."""
    fused, plan = low.fused, low.plan
    nodes = step_nodes(fused)
    sm_total = get_device_properties(device.index).multi_processor_count
    sm_counts = gemm_sm_counts([node for node, _ in nodes], low.streams, sm_total, settings.gemm_sm_carveout)
    with stage("compile kernels (NVRTC) and load"):  # the first run waits for each (see PendingFunctions)
        functions = PendingFunctions(list(low.sources.items()), device, low.compiling)
    unit = {name: k for k, name in enumerate(low.sources)}
    by_kernel = {s.kernel.name: s for s in low.schedules}
    steps: list = []
    made: list[list[int]] = []  # per step node, the steps it made
    for (node, results), sm_count in zip(nodes, sm_counts):
        made.append([len(steps)])
        if node.op == "fused":
            kernel = low.kernels[node]
            sched = by_kernel[kernel.name]
            steps.append(CudaKernelStep(kernel, None, sched.grid, sched.block, [plan.of[v] for v in kernel.values],
                                        sched.scratch_bytes, device, (functions, unit[kernel.name])))
        elif node in plan.cat_copies:  # a cat in place copies only the inputs not written into it
            steps += [CudaCopyStep(src, plan.of[buffer_of(src)], plan.of[node], device, byte)
                      for src, byte in plan.cat_copies[node]]
        else:
            steps.append(CudaExternStep(node, plan, results, device, sm_count))
        made[-1] = list(range(made[-1][0], len(steps)))
    for copy in plan.copies:
        steps.append(CudaCopyStep(copy.value, plan.of[buffer_of(copy.value)], copy.dst, device))
    prepare_library_calls(steps, plan)  # beside the compiles just started
    program = Program(fused, plan, steps, list(low.kernels.values()), low.schedules, low.source, "cuda",
                      sources=low.sources)
    program.runtime = CudaRuntime(program, device, graphs)
    program.runtime.compiling = functions
    if low.streams is not None and low.streams.overlapped:
        program.runtime.order = StepOrder.of(low.streams, made, len(steps))
    return program


# ---------------------------------------------------------------------------- explain

PTX_LINES = 60
SASS_LINES = 80


def default_arch() -> str:
    """The architecture machine code is shown for: the current GPU's, or sm_90 without one."""
    return get_device_properties(current_device()).arch if is_available() else "sm_90"


@dataclass
class MachineCode:
    """One kernel's PTX, SASS (or why there is none) and resource line, for ``arch``."""

    ptx: str
    sass: str
    resources: str
    sass_missing: bool = False  # ``sass`` says why there is no disassembly (no nvdisasm)
    usage: object = None  # the kernel's ``ResourceUsage``, where the cubin tells it


def kernels_machine_code(sources: dict[str, str], arch: str) -> dict[str, MachineCode]:
    """The machine code of each kernel (name -> its translation unit), as ``compile`` builds it: kernels whose
    text differs only in their name are compiled and disassembled once, under their shared name (see
    :func:`compile_units`; a program's own build has put those cubins in the kernel cache), and the disassembler
    runs on the different texts at once. Each kernel's text is shown under its own name."""
    from concurrent.futures import ThreadPoolExecutor

    from tilewise.codegen.toolchain import ToolNotFoundError, disassemble_all, resource_usage
    from tilewise.codegen.toolchain.pool import compile_all, compile_threads

    keys = {name: shared_name(name, source) for name, source in sources.items()}
    unique = list(dict.fromkeys(keys.values()))
    compiled = dict(zip(unique, compile_all(unique, arch)))
    with ThreadPoolExecutor(max_workers=max(1, min(len(unique), compile_threads()))) as pool:
        usages = dict(zip(unique, pool.map(lambda key: _resource_usage(resource_usage, compiled[key].cubin), unique)))
    try:
        texts = dict(zip(unique, disassemble_all([compiled[key].cubin for key in unique])))
        missing = None
    except ToolNotFoundError as exc:
        texts, missing = {}, str(exc)
    out = {}
    for name, key in keys.items():
        shown = partial(_renamed, key[0], name)
        usage = usages[key]
        resources = "; ".join(f"{u.registers} registers/thread, {u.shared_bytes} B shared/block, "
                              f"{u.local_bytes} B local (spills)/thread" for u in usage.values())
        out[name] = MachineCode(shown(compiled[key].ptx), missing if missing else shown(texts[key]), resources,
                                missing is not None, usage.get(key[0]))
    return out


def _renamed(shared: str, name: str, text: str) -> str:
    """Machine code of a kernel compiled under its shared name, shown under the kernel's own."""
    return text.replace(shared, name) if shared != name else text


_usages: dict[bytes, dict] = {}  # a cubin's digest -> its kernels' resource use (the cubin alone determines it)


def _resource_usage(read, cubin: bytes) -> dict:
    key = hashlib.sha256(cubin).digest()
    found = _usages.get(key)
    if found is None:
        found = _usages[key] = read(cubin) or {}
    return found


def machine_code(low: Lowered | Program, arch: str | None = None) -> Iterator[tuple[str, str]]:
    """What ``explain`` shows below the CUDA C: each kernel's PTX, SASS and resource use (NVRTC and nvdisasm,
    for ``arch``, by default the current GPU's architecture, or sm_90 without one)."""
    arch = arch or default_arch()
    for name, code in kernels_machine_code(low.sources, arch).items():
        ptx = code.ptx.splitlines()
        more = f"\n... ({len(ptx) - PTX_LINES} more lines)" if len(ptx) > PTX_LINES else ""
        yield f"kernel {name}: PTX ({arch})", "\n".join(ptx[:PTX_LINES]) + more
        if code.sass_missing:
            yield f"kernel {name}: SASS", code.sass
            continue
        sass = code.sass.splitlines()
        more = f"\n... ({len(sass) - SASS_LINES} more lines)" if len(sass) > SASS_LINES else ""
        yield f"kernel {name}: SASS ({arch})", (code.resources + "\n" if code.resources else "") \
            + "\n".join(sass[:SASS_LINES]) + more
