"""Compile targets: everything the compiler does differently per target, in one object per target.

[Note: targets] A ``Target`` is registered once (``register_target``) and carries what its name used to
select in ``if target == ...`` branches across the compiler:
- ``language``: the C-style language its kernels are rendered in (``codegen.render.C``/``CUDA``);
- ``passes``: the graph passes (``compiler.passes.PIPELINE``; on CUDA, ``decompose`` keeps whole the
  composites the backend runs as one library call: cuDNN attention and convolution, an LSTM layer's time loop,
  and ``grouped_query_attention`` then hands a kept attention the key/value heads a model repeated for it);
- ``lowering``: stages run on the optimised graph before fusion (on CUDA, pointwise values the backward reads
  again recomputed there rather than kept (``lowering/recompute.py``), GEMM epilogues for cuBLASLt,
  channels-last convolutions, and cuDNN attention writing its results in the order their readers permute them
  to; on C, a float16/bfloat16 product's bias added before it is rounded);
- ``scheduler`` and ``variants``: a kernel's heuristic schedule and the knobs ``mode="max-autotune"``
  tries (``codegen.schedule``), with ``policy``, how long candidates are timed;
- ``render``: the program's source from its schedules (one C translation unit; one CUDA unit per kernel), and
  ``compiles``: where each CUDA unit starts compiling as soon as it is rendered;
- ``build``: the program builder (toolchain, steps, runtime), ``arena``: memory for intermediates, and
  ``tuning``: its part of autotuning;
- ``device_type``: the devices whose graphs it compiles; ``machine_code``: what ``explain`` shows below the
  source (PTX and SASS on CUDA).
``build_program`` and ``explain`` both take a Target, so explain shows exactly what compile runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.render.c import C
from tilewise.codegen.render.cstyle import Language
from tilewise.codegen.render.cuda import CUDA
from tilewise.codegen.schedule import (
    HEURISTIC,
    KernelSchedule,
    Knobs,
    schedule_c,
    schedule_cuda,
    variants_c,
    variants_cuda,
)
from tilewise.compiler import program_c, program_cuda
from tilewise.compiler.autotune import Policy
from tilewise.compiler.errors import UnsupportedTargetError
from tilewise.compiler.ir import Graph
from tilewise.compiler.lowering.attention_layouts import attention_layouts
from tilewise.compiler.lowering.channels_last import channels_last
from tilewise.compiler.lowering.epilogues import bias_into_product, gemm_epilogues
from tilewise.compiler.lowering.recompute import recompute_activations
from tilewise.compiler.passes import PIPELINE, Pass, decompose
from tilewise.compiler.passes.attention import grouped_query_attention
from tilewise.compiler.program import Arena, Lowered, Program, aliased_kernels
from tilewise.device import Device, cpu


@dataclass(frozen=True)
class Target:
    name: str
    device_type: str
    language: Language
    source_name: str  # what its generated source is called ("C", "CUDA C")
    passes: tuple[Pass, ...]
    scheduler: Callable[[Kernel, Knobs], KernelSchedule]
    variants: Callable[[KernelSchedule], list[Knobs]]
    policy: Policy
    # (schedules, aliased parameters, each unit as it is rendered or None) -> (source, units)
    render: Callable[[list[KernelSchedule], dict[str, frozenset[int]], Callable | None], tuple[str, dict[str, str]]]
    build: Callable[[Lowered, Device | None, bool], Program]
    arena: Callable[[Device | None], Arena]
    tuning: Callable[[Device | None, Lowered], object]
    lowering: tuple[tuple[str, Callable[[Graph], Graph]], ...] = ()
    # device -> kernel compiles that start as each kernel is rendered (``start(name, text)``), which ``build``
    # then waits for; None where a program is one translation unit (C)
    compiles: Callable[[Device | None], object] | None = None
    # (lowered or built program, arch or None) -> (title, text) sections
    machine_code: Callable[[Lowered | Program, str | None], Iterator[tuple[str, str]]] | None = field(
        default=None, compare=False)

    def schedule(self, kernel: Kernel, knobs: Knobs = HEURISTIC) -> KernelSchedule:
        return self.scheduler(kernel, knobs)

    def candidates(self, kernel: Kernel) -> list[KernelSchedule]:
        """The kernel's distinct legal schedules: the heuristic's first, then one knob changed at a time."""
        heuristic = self.schedule(kernel)
        out, seen = [heuristic], {heuristic.signature()}
        for knobs in self.variants(heuristic):
            candidate = self.schedule(kernel, knobs)
            if candidate.signature() not in seen:
                seen.add(candidate.signature())
                out.append(candidate)
        return out

    def __repr__(self) -> str:
        return f"Target({self.name!r})"


TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    if target.name in TARGETS:
        raise ValueError(f"a compile target named {target.name!r} is registered already")
    TARGETS[target.name] = target
    return target


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"no compile target {name!r}; targets: {sorted(TARGETS)}") from None


def target_for_device(device: Device | None) -> Target:
    device_type = "cpu" if device is None else device.type
    for target in TARGETS.values():
        if target.device_type == device_type:
            return target
    raise UnsupportedTargetError(f"no compile target generates code for {device_type} devices; "
                                 f"targets: {', '.join(f'{t.name} ({t.device_type})' for t in TARGETS.values())}")


def target_of(graph: Graph) -> tuple[Target, Device | None]:
    """The target that compiles ``graph``, and its device (None on the CPU); raise ``UnsupportedTargetError``
    for a graph no target takes, saying why."""
    nodes = [n for n in graph.inputs + graph.body if not n.is_tuple]
    if any(n.type.dtype.is_complex for n in nodes):
        raise UnsupportedTargetError("it uses complex tensors, which the C and CUDA targets do not generate code for "
                                     "(leave the complex part, e.g. the FFT, outside the compiled function)")
    eager_only = sorted({n.op for n in graph.body if n.opdef is not None and n.opdef.attrs.get("compiled") is False})
    if eager_only:
        raise UnsupportedTargetError(f"it calls {', '.join(eager_only)}, which check their results on the host and run "
                                     "eagerly (compile the code around them separately)")
    devices = {n.type.device for n in nodes}
    if not devices or devices == {cpu}:
        return target_for_device(None), None
    if len(devices) == 1:
        (device,) = devices
        if device.type != "cpu":
            return target_for_device(device), device
    names = ", ".join(sorted(str(d) for d in devices))
    raise UnsupportedTargetError(f"it uses tensors on {names}; a compiled function runs on the CPU or on one CUDA "
                                 "device (move the tensors to one device, or leave the transfer outside it)")


# ---------------------------------------------------------------------------- the targets

def _kept_by_cuda_libraries(op: str, args: tuple) -> bool:
    """Whether the CUDA backend runs this composite as one library call (cuDNN, an LSTM layer's time loop)."""
    # the GPU extra is imported when a CUDA graph compiles
    from tilewise.backends.cuda import attention, convolution, recurrent

    return attention.keeps(op, args) or convolution.keeps(op, args) or recurrent.keeps(op, args)


def _decompose_keeping_library_calls(graph: Graph) -> Graph:
    return decompose(graph, _kept_by_cuda_libraries)


_decompose_keeping_library_calls.__name__ = "decompose"


def _grouped_query_attention_for_cudnn(graph: Graph) -> Graph:
    return grouped_query_attention(graph, _kept_by_cuda_libraries)


_grouped_query_attention_for_cudnn.__name__ = "grouped_query_attention"


def _cuda_passes() -> tuple[Pass, ...]:
    """The pipeline with the library calls kept whole, then head repeats before a kept attention handed to it as
    grouped-query attention."""
    passes: list[Pass] = []
    for p in PIPELINE:
        passes += [_decompose_keeping_library_calls, _grouped_query_attention_for_cudnn] if p is decompose else [p]
    return tuple(passes)


def _decompose_keeping_host_calls(graph: Graph) -> Graph:
    # the CPU's convolution kernels beat im2col + GEMM in generated code (see [Note: convolution columns per image])
    from tilewise.backends.cpu import conv_kernels

    return decompose(graph, conv_kernels.keeps)


_decompose_keeping_host_calls.__name__ = "decompose"

C_TARGET = register_target(Target(
    name="c", device_type="cpu", language=C, source_name="C",
    passes=tuple(_decompose_keeping_host_calls if p is decompose else p for p in PIPELINE), scheduler=schedule_c,
    variants=variants_c,
    policy=Policy(warmup=0.002, sample=2e-4, budget=0.1), render=program_c.render_c,
    build=program_c.build_c_program, arena=lambda device: program_c.host_arena(),
    tuning=lambda device, low: program_c.HostTuning(C_TARGET),
    lowering=(("bias_into_product", bias_into_product),),
))

CUDA_TARGET = register_target(Target(
    name="cuda", device_type="cuda", language=CUDA, source_name="CUDA C",
    passes=_cuda_passes(), scheduler=schedule_cuda, variants=variants_cuda,
    policy=Policy(warmup=0.02, sample=2e-5, budget=0.1),  # 20 ms: what cuBLASLt's tuning needs from idle
    render=program_cuda.render_cuda, build=program_cuda.build_cuda_program, arena=program_cuda.device_arena,
    compiles=program_cuda.KernelCompiles,
    tuning=lambda device, low: program_cuda.CudaTuning(CUDA_TARGET, device, aliased_kernels(low.kernels, low.plan)),
    lowering=(("recompute_activations", recompute_activations), ("gemm_epilogues", gemm_epilogues),
              ("channels_last", channels_last), ("attention_layouts", attention_layouts)),
    machine_code=program_cuda.machine_code,
))
