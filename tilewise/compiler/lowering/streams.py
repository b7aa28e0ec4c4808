"""Which stream runs each step of a program, and which collectives a step waits for.

[Note: collectives on their own stream] A collective step (an operator declared ``collective``: the functional
all-reduce of a DDP bucket) moves bytes between GPUs while the GPU's SMs could run the rest of backward. A CUDA
program therefore runs each collective on a *communication stream*, at its place in program order (DDP records
a bucket's all-reduce right after the step that writes its last gradient): the communication stream first
waits for an event recorded on the program's stream after the steps before it (so it sees its buffer
written), then the program's stream goes on with the steps after it. One communication stream runs the
program's collectives one after another in program order, the order every rank issues them in.

A later step on the program's stream waits for a collective's end (an event recorded on the communication stream
after it) before it runs if it reads or writes bytes the collective reads or writes: the first step that reads
the reduced bucket (the optimizer, the end of backward), or one whose buffer the planner laid over the
collective's. The memory plan keeps a collective's input live until its result is first read ([Note: memory
planning]), so in a training step the first such step is the first reader. Waiting once suffices: a stream is
ordered, so every later step follows too. The end of the program waits for every collective not yet waited for,
so a caller, and the next program on the stream, see their results, and a CUDA graph's capture joins the
communication stream back before it ends (events and cross-stream waits are captured as graph edges).

``schedule_streams`` computes this from the fused graph and its plan, for every target; the C target runs its
steps in order on the host (its collectives are synchronous), the CUDA target as the schedule says.

[Note: GEMMs beside collectives] A collective's kernel (NCCL's all-reduce: 24 CTAs on two H200s) takes SMs
while the program's stream goes on with backward. cuBLASLt plans a GEMM for the whole GPU, and its Hopper
kernels run in thread-block clusters that each need free SMs within one GPC: beside the all-reduce, a
weight-gradient GEMM of GPT-2 124M planned for 120 CTAs in 2x4 clusters took 99 us instead of 54 us (not
all of its clusters find room at once), which cost a DDP step 0.55 ms; every other kernel ran within
4% of its time alone, and fewer NCCL CTAs did not help. So the schedule also says which steps run *beside* a
collective: those after a collective the program's stream has not yet waited for, or waited for one issued
after it (one communication stream runs them in order, so a collective's end is the end of every one before
it). A CUDA program plans its GEMM steps there for fewer SMs (cuBLASLt's SM count target: the device's SMs
less ``settings.gemm_sm_carveout``, ``TILEWISE_GEMM_SM_CARVEOUT``; 0, the default, turns it off), so that they
leave room for the collective's CTAs instead of being stretched by them; not where every collective spans one rank
(a DDP step on one GPU: the transport moves nothing). Measured on two H200s (compiled DDP GPT-2 124M, 8x1024
tokens a rank) it is off by default: "beside" holds from a bucket's launch to the wait at the end of backward, so 95
GEMMs a step were planned for fewer SMs while each all-reduce runs for a fraction of that time, and the step went
from 21.06 ms (no carveout) to 23.05 / 22.92 / 22.72 ms with 16 / 24 / 32 SMs left free. It stays a setting for
hosts whose collectives run longer beside the backward (slower links, more ranks). It is decided once, when the
program is built, and the program's steps say it (``call mm [cuBLASLt for 108 SMs]``); the plan's key and its timed
choice on disk carry the target, so GEMMs of one shape planned for the whole GPU (eager, or away from a collective)
keep their own plans. Other steps, generated kernels included, are launched as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.compiler.ir import Graph, Node
from tilewise.compiler.lowering.fusion import is_collective
from tilewise.compiler.lowering.lower import buffer_of
from tilewise.compiler.lowering.memory import MemoryPlan, steps_of

MAIN, COMM = "main", "comm"


@dataclass(frozen=True)
class StreamSchedule:
    """Per step of ``steps_of(graph)``: its stream, and the positions of the collectives the program's stream
    waits for before it; ``at_end``: the collectives waited for after the last step; ``beside``: per step, whether
    a collective may still be running on the communication stream while it runs (see [Note: GEMMs beside
    collectives]; empty: none)."""

    streams: tuple[str, ...]
    waits: tuple[tuple[int, ...], ...]
    at_end: tuple[int, ...]
    beside: tuple[bool, ...] = ()

    @property
    def overlapped(self) -> bool:
        return COMM in self.streams

    def describe(self, steps: list[Node]) -> str:
        lines = []
        for k, (node, stream, waits) in enumerate(zip(steps, self.streams, self.waits)):
            after = f" after collective(s) {', '.join(map(str, waits))}" if waits else ""
            beside = " beside a collective" if self.beside and self.beside[k] else ""
            lines.append(f"  {k}: {node.op} on {stream}{after}{beside}")
        if self.at_end:
            lines.append(f"  end: after collective(s) {', '.join(map(str, self.at_end))}")
        return "\n".join(lines)


def schedule_streams(graph: Graph, plan: MemoryPlan) -> StreamSchedule:
    """The streams of ``graph``'s steps and their waits (see the note)."""
    steps = steps_of(graph)
    results: dict[Node, list[Node]] = {}
    for value in plan.of:
        step = value.srcs[0] if value.op == "getitem" else value
        results.setdefault(step, []).append(value)
    streams, waits, beside = [], [], []
    in_flight: dict[int, list[tuple]] = {}  # collective position -> the byte regions it reads and writes
    last, ended = -1, -1  # the last collective issued; the last one the program's stream has waited for
    for k, node in enumerate(steps):
        if is_collective(node):
            streams.append(COMM)
            waits.append(())
            beside.append(False)
            in_flight[k] = _regions(node, results.get(node, []), plan)
            last = k
            continue
        regions = _regions(node, results.get(node, []), plan) if in_flight else []
        touched = tuple(c for c, theirs in in_flight.items() if _overlap(regions, theirs))
        for c in touched:
            del in_flight[c]
        ended = max(ended, *touched) if touched else ended
        streams.append(MAIN)
        waits.append(touched)
        beside.append(last > ended)
    return StreamSchedule(tuple(streams), tuple(waits), tuple(sorted(in_flight)), tuple(beside))


def _regions(node: Node, results: list[Node], plan: MemoryPlan) -> list[tuple]:
    """The buffers a step reads and writes, as (kind, slot, first byte, end byte): arena buffers by their bytes,
    inputs and outputs whole (each its own memory)."""
    out = []
    for value in [buffer_of(s) for s in node.srcs] + results:
        buffer = plan.buffers[plan.of[value]]
        if buffer.kind == "arena":
            out.append(("arena", 0, buffer.slot, buffer.slot + buffer.ty.nbytes))
        else:  # a value in a donated input's memory counts as that input (see [Note: donated inputs])
            out.append(("input" if buffer.kind == "donated" else buffer.kind, buffer.slot, 0, 1))
    return out


def _overlap(ours: list[tuple], theirs: list[tuple]) -> bool:
    return any(a[0] == b[0] and a[1] == b[1] and a[2] < b[3] and b[2] < a[3] for a in ours for b in theirs)
