"""Training steps of the transformers people write — GPT-2, a Llama-style decoder, ViT-B/16 — in tilewise beside
torch, eager and compiled: a matrix of (model, size, side).

The models are ``benchmarks/models/{gpt2,llama,vit}.py``, written in plain torch style against ``tilewise as
torch``; torch runs the same files with its own name in their import lines (``torch_source.module_for``). Every
side builds a fresh model from the same initial weights (torch's initialisation, copied through numpy) and sees
the same batches. A step is the forward and the loss under bf16 autocast (``--dtype fp32``: none),
``loss.backward()``, ``clip_grad_norm_(1.0)``, fused ``AdamW`` (both libraries have one) and
``zero_grad(set_to_none=True)``. The sides:

* ``tilewise-eager``; ``tilewise-eager-cb``: eager with compiled backward (``tw.autograd.compiled_backward()``: the
  backward replayed as one compiled program from its second step); ``tilewise-compiled``: the whole step in one
  ``tw.compile`` (``gpt_train_step.py``'s ``whole_step_compiled``; AdamW's state exists from the first call, so a
  step compiles on its first call only);
* ``torch-eager``; ``torch-compile``: ``torch.compile(model)`` with the optimizer eager, as torch users run it;
  ``torch-compile-max-autotune``: the same with ``mode="max-autotune-no-cudagraphs"``.

Reported per (model, size, side): the median step time after ``--warmup`` steps (host wall time, synchronised at
the step's end), tokens/s (images/s for ViT), speed against torch eager and torch.compile (default mode), the
seconds of the first step (compilation lands there, from empty caches), peak device memory on CUDA, tilewise's
kernel count per compiled program, and the largest difference of the losses from torch eager's. With
``--breakdown`` (the default), where a step's time goes: for torch, from ``torch.profiler`` over a few steps
(on CUDA its kernels, on the CPU its operators, each as GEMM, attention or other, and the rest of the step's wall
time as gaps); for tilewise compiled, from ``tilewise.explain`` of the step (each program step timed, library
GEMMs, attention and generated kernels apart, the rest of the call as gaps). ``--cuda-lowering`` runs nothing and
lists, per model, the generated kernels and library calls of tilewise's compiled step lowered for CUDA: what the
matrix will show unfused, seen without a GPU.

Model names: ``gpt2`` (biases, tanh GELU, tied LM head, as GPT-2), variants of it named by their differences in
any order (``gpt2-nobias-erf-tied``, ``gpt2-untied``), ``llama`` and ``vit``. A size names a class that every
model has one of: ``124M`` is GPT-2 124M, Llama 125M and ViT-B/16 (86M); ``350M`` GPT-2 350M, Llama 340M, ViT-L/16;
``774M`` GPT-2 774M only. ``--tiny`` is every model at 2 layers, width 64, sequence 32 (ViT: 32x32 images of
8x8 patches), a run on the CPU in seconds. Nothing is written to RESULTS.md; ``--append FILE`` adds the report.

    python benchmarks/transformer_matrix.py [--models gpt2,gpt2-nobias-erf-tied,llama,vit] [--sizes 124M,350M]
        [--sides tilewise-eager,tilewise-eager-cb,tilewise-compiled,torch-eager,torch-compile,
                 torch-compile-max-autotune]
        [--steps 10] [--warmup 3] [--device cuda|cpu] [--dtype bf16|fp32] [--batch N] [--seq N] [--tiny]
        [--breakdown | --no-breakdown] [--cuda-lowering] [--append FILE]
    python benchmarks/transformer_matrix.py --tiny --device cpu   # every model, a check in seconds
    python benchmarks/transformer_matrix.py --cuda-lowering --device cpu   # the CUDA kernels, without a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import re
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-bench-cache-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpt_train_step import no_kernels, ratio, report_error, whole_step_compiled  # noqa: E402
from torch_source import module_for  # noqa: E402
from vision_train_step import comma_list, free_memory, measure_side  # noqa: E402

import tilewise as tw  # noqa: E402
from tilewise.compiler.lowering.memory import steps_of  # noqa: E402
from tilewise.compiler.targets import get_target  # noqa: E402

MODELS_DIR = Path(__file__).with_name("models")
FAMILIES = ("gpt2", "llama", "vit")
GPT2_OPTIONS = {"bias": ("bias", True), "nobias": ("bias", False), "tanh": ("gelu", "tanh"), "erf": ("gelu", "none"),
                "tied": ("tied", True), "untied": ("tied", False)}
SIZE_CLASSES = ("124M", "350M", "774M")
# each family's model of a size class: the name shown, and the family's own size key in its model file
FAMILY_SIZES = {"gpt2": {"124M": "124M", "350M": "350M", "774M": "774M"},
                "llama": {"124M": "125M", "350M": "340M"},
                "vit": {"124M": "B/16", "350M": "L/16"}}
SIDES = ("tilewise-eager", "tilewise-eager-cb", "tilewise-compiled", "torch-eager", "torch-compile",
         "torch-compile-max-autotune")
REFERENCE, PEER = "torch-eager", "torch-compile"
TINY = {"layers": 2, "width": 64, "heads": 4, "kv_heads": 2, "seq": 32, "batch": 2, "vocab": 96, "image": 32,
        "patch": 8, "classes": 10}
DEFAULT_BATCH = {"gpt2": 8, "llama": 8, "vit": 64}
DEFAULT_SEQ = 1024
NAN = float("nan")


# ---------------------------------------------------------------------------------------------- models

@dataclass(frozen=True)
class Case:
    """One model variant at one size, with the batch it trains on."""

    model: str  # gpt2, gpt2-nobias-erf-tied, llama, vit
    size: str  # a size class ("124M"), or "tiny"
    batch: int
    seq: int  # tokens a sequence; for ViT the image side
    dtype: str  # bf16 (autocast) or fp32
    device: str

    @property
    def family(self) -> str:
        return self.model.split("-")[0]

    @property
    def items_per_step(self) -> int:
        """Tokens a step (images for ViT)."""
        return self.batch if self.family == "vit" else self.batch * self.seq

    @property
    def title(self) -> str:
        size = "tiny (2 layers, width 64)" if self.size == "tiny" else FAMILY_SIZES[self.family][self.size]
        shape = f"{self.batch}x3x{self.seq}x{self.seq}" if self.family == "vit" else f"{self.batch}x{self.seq}"
        precision = "bf16 autocast" if self.dtype == "bf16" else "float32"
        return f"{self.model} {size}, batch {shape}, {precision}"


def parse_model(name: str) -> str:
    """``name`` if it is a model this benchmark builds (a family, or gpt2 with options), else an error."""
    family, *options = name.split("-")
    if family not in FAMILIES or (options and family != "gpt2"):
        raise argparse.ArgumentTypeError(f"unknown model {name!r}: expected gpt2[-{'|'.join(GPT2_OPTIONS)}...], "
                                         "llama or vit")
    unknown = [o for o in options if o not in GPT2_OPTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{name!r}: unknown GPT-2 option(s) {unknown}; options: {list(GPT2_OPTIONS)}")
    return name


def gpt2_options(name: str) -> dict[str, Any]:
    return dict(GPT2_OPTIONS[option] for option in name.split("-")[1:])


def model_source(library: types.ModuleType, family: str) -> types.ModuleType:
    return module_for(MODELS_DIR / f"{family}.py", library)


def build_model(library: types.ModuleType, case: Case):
    source = model_source(library, case.family)
    tiny = case.size == "tiny"
    if case.family == "gpt2":
        layers, heads, width = ((TINY["layers"], TINY["heads"], TINY["width"]) if tiny
                                else source.SIZES[FAMILY_SIZES["gpt2"][case.size]])
        vocab = TINY["vocab"] if tiny else 50304
        return source.GPT(source.GPTConfig(vocab_size=vocab, block_size=case.seq, n_layer=layers, n_head=heads,
                                           n_embd=width, **gpt2_options(case.model)))
    if case.family == "llama":
        layers, heads, kv_heads, width, hidden = (
            (TINY["layers"], TINY["heads"], TINY["kv_heads"], TINY["width"], 176) if tiny
            else source.SIZES[FAMILY_SIZES["llama"][case.size]])
        vocab = TINY["vocab"] if tiny else 32000
        return source.Llama(source.LlamaConfig(vocab_size=vocab, block_size=case.seq, n_layer=layers, n_head=heads,
                                               n_kv_head=kv_heads, n_embd=width, hidden=hidden))
    layers, heads, width, mlp = ((TINY["layers"], TINY["heads"], TINY["width"], 4 * TINY["width"]) if tiny
                                 else source.SIZES[FAMILY_SIZES["vit"][case.size]])
    patch, classes = (TINY["patch"], TINY["classes"]) if tiny else (16, 1000)
    return source.VisionTransformer(source.ViTConfig(image_size=case.seq, patch_size=patch, num_classes=classes,
                                                     n_layer=layers, n_head=heads, n_embd=width, mlp_dim=mlp))


def classes_of(case: Case) -> int:
    if case.family == "vit":
        return TINY["classes"] if case.size == "tiny" else 1000
    return TINY["vocab"] if case.size == "tiny" else {"gpt2": 50304, "llama": 32000}[case.family]


def initial_weights(case: Case) -> tuple[dict[str, np.ndarray], int]:
    """torch's initial weights of the case's model as numpy arrays, and its parameter count."""
    torch.manual_seed(0)
    model = build_model(torch, case)
    count = sum(p.numel() for p in model.parameters())
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, count


def sample_batches(case: Case, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    classes = classes_of(case)
    if case.family == "vit":
        return [(rng.standard_normal((case.batch, 3, case.seq, case.seq), dtype=np.float32),
                 rng.integers(0, classes, size=(case.batch,))) for _ in range(steps)]
    tokens = (case.batch, case.seq)
    return [(rng.integers(0, classes, size=tokens), rng.integers(0, classes, size=tokens)) for _ in range(steps)]


# ---------------------------------------------------------------------------------------------- the step

def make_step(model, optimizer, library: types.ModuleType, autocast: Callable) -> Callable:
    def step(x, y):
        with autocast():  # the forward and the loss, as torch's mixed-precision recipe has it
            loss = model(x, y)
        loss.backward()
        library.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def autocast_for(library: types.ModuleType, case: Case) -> Callable:
    if case.dtype == "fp32":
        return contextlib.nullcontext
    return functools.partial(library.autocast, device_type=case.device.split(":")[0], dtype=library.bfloat16)


def loaded_model(library: types.ModuleType, case: Case, weights: dict[str, np.ndarray]):
    model = build_model(library, case)
    model.load_state_dict({k: library.from_numpy(v.copy()) for k, v in weights.items()})
    return model.to(case.device)


def adamw(library: types.ModuleType, model):
    return library.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)


def with_compiled_backward(step: Callable) -> Callable:
    """``step`` with its ``backward()`` run as a compiled replay (``tilewise.autograd.compiled_backward``)."""
    def run(x, y):
        with tw.autograd.compiled_backward():
            return step(x, y)

    return run


def step_builder(name: str, case: Case, weights: dict[str, np.ndarray]) -> Callable[[], tuple[Callable, Callable]]:
    """A function that builds side ``name``'s step afresh: (step, its kernel count text)."""
    library = tw if name.startswith("tilewise") else torch

    def build():
        model = loaded_model(library, case, weights)
        optimizer = adamw(library, model)
        if name == "torch-compile":
            model = torch.compile(model)
        elif name == "torch-compile-max-autotune":
            model = torch.compile(model, mode="max-autotune-no-cudagraphs")
        step = make_step(model, optimizer, library, autocast_for(library, case))
        if name == "tilewise-eager-cb":
            step = with_compiled_backward(step)
        return whole_step_compiled(step, "default") if name == "tilewise-compiled" else (step, no_kernels)

    return build


def raw_tilewise_step(case: Case, weights: dict[str, np.ndarray]) -> Callable:
    """tilewise's step uncompiled, for ``tilewise.explain`` to compile and time."""
    model = loaded_model(tw, case, weights)
    return make_step(model, adamw(tw, model), tw, autocast_for(tw, case))


@dataclass
class Side:
    name: str
    library: Any
    build: Callable[[], tuple[Callable, Callable[[], str]]]
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds of every step, warm-up included
    step_ms: float = NAN
    peak_bytes: int | None = None
    kernels: str = ""
    error: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)  # ms a step: GEMM, attention, other, gaps


def on_device(library: types.ModuleType, case: Case, batch: tuple[np.ndarray, np.ndarray]) -> tuple:
    return tuple(library.from_numpy(a).to(case.device) for a in batch)


def synchronizer(library: types.ModuleType, device: str) -> Callable[[], None]:
    return library.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def run_side(side: Side, case: Case, batches: list, warmup: int) -> None:
    measure_side(side, case.device, batches, lambda batch: on_device(side.library, case, batch), warmup)


# ---------------------------------------------------------------------------------------------- where time goes

# GEMMs and convolutions: torch's kernels and operators, and tilewise's library calls
GEMM_NAME = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|conv(?!ert)|^aten::(mm|addmm_?|bmm|baddbmm_?|matmul|linear)$"
                       r"|^(mm|addmm|bmm|baddbmm|_addmm_activation|_addmm_gelu|_mm_gelu_backward)$", re.I)
ATTENTION_NAME = re.compile(r"flash|fmha|attention|sdpa|scaled_dot_product", re.I)
PARTS = ("GEMM", "attention", "other", "gaps")  # GEMM includes convolutions


def part_of(name: str) -> str:
    if ATTENTION_NAME.search(name):
        return "attention"
    return "GEMM" if GEMM_NAME.search(name) else "other"


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals``."""
    total, end = 0.0, -float("inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def outermost_operator(event) -> bool:
    """An ``aten::`` operator called by none (a compiled region's calls of library operators count)."""
    if not event.name.startswith("aten::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def torch_breakdown(side: Side, case: Case, batches: list, steps: int = 3) -> dict[str, float]:
    """ms a step of GEMM, attention and other work, and gaps, from torch.profiler over ``steps`` steps."""
    step, _ = side.build()
    sync = synchronizer(torch, case.device)
    on_cuda = case.device.startswith("cuda")
    for batch in batches[:2]:  # compiled: compile before profiling
        step(*on_device(torch, case, batch))
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        sync()
        start = time.perf_counter()
        for batch in batches[:steps]:
            step(*on_device(torch, case, batch))
        sync()
        wall_us = (time.perf_counter() - start) * 1e6
    parts = dict.fromkeys(PARTS, 0.0)
    intervals = []
    for event in prof.events():
        if on_cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if not on_cuda and not outermost_operator(event):
            continue  # an operator's time holds its callees'
        parts[part_of(event.name)] += event.time_range.elapsed_us()
        intervals.append((event.time_range.start, event.time_range.end))
    parts["gaps"] = max(wall_us - busy_time(intervals), 0.0)
    return {k: v / 1e3 / steps for k, v in parts.items()}


def tilewise_breakdown(case: Case, weights: dict[str, np.ndarray], batches: list, repeats: int = 3) -> dict[str, float]:
    """ms a step of GEMM, attention and other work, and gaps, from ``tilewise.explain`` of the compiled step."""
    x, y = on_device(tw, case, batches[0])
    explanation = tw.explain(raw_tilewise_step(case, weights), x, y, repeats=repeats)
    parts = dict.fromkeys(PARTS, 0.0)
    for record in explanation.kernels:  # per call: a step whose program ran in only some calls counts for those
        parts[part_of(record.name)] += sum(record.times) * 1e3 / repeats
    call_ms = call_milliseconds(explanation)
    parts["gaps"] = max(call_ms - sum(parts.values()), 0.0) if call_ms == call_ms else NAN
    return parts


def call_milliseconds(explanation) -> float:
    """The median compiled call's ms, as ``explain``'s run section states it (NaN where it states none)."""
    found = re.search(r"compiled ([0-9.]+) ms per call", explanation.section("run"))
    return float(found.group(1)) if found else NAN


def add_breakdowns(all_sides: list[Side], case: Case, weights: dict[str, np.ndarray], batches: list,
                   tilewise_side: bool) -> None:
    """The breakdowns of tilewise's compiled side (``tilewise_side``) or of torch's sides."""
    for side in all_sides:
        if side.error or side.name.startswith("tilewise-eager") or (side.name == "tilewise-compiled") != tilewise_side:
            continue
        try:
            if side.name == "tilewise-compiled":
                side.breakdown = tilewise_breakdown(case, weights, batches)
            else:
                side.breakdown = torch_breakdown(side, case, batches)
        except Exception as exc:  # noqa: BLE001 — a breakdown that fails leaves the step figures standing
            side.breakdown = {"error": report_error(exc)}
        free_memory(side.library, case.device)


# ---------------------------------------------------------------------------------------------- CUDA lowering

@dataclass
class Lowering:
    """What tilewise's compiled step becomes on the CUDA target: generated kernels and library calls."""

    kernels: list[str]  # each kernel's name without its index: the operators it fuses
    calls: Counter  # library calls by operator
    arena_bytes: int = 0  # the programs' planned arena (they share one: the largest)
    input_bytes: int = 0  # what the step reads in place: parameters, optimizer state, the batch


def cuda_lowering(case: Case, weights: dict[str, np.ndarray], batch: tuple) -> Lowering:
    """The compiled step lowered for the CUDA target from CPU tensors: generated, neither built nor run, so
    it needs no GPU (cuDNN's attention and convolution are kept whole only where the cuDNN frontend imports)."""
    x, y = on_device(tw, case, batch)
    compiled = tw.compile(raw_tilewise_step(case, weights))
    _, programs, _ = compiled.lowered(get_target("cuda"), x, y)
    kernels, calls = [], Counter()
    for low in programs:
        for node in steps_of(low.fused):
            if node in low.kernels:
                kernels.append(re.sub(r"^k\d+_", "", low.kernels[node].name))
            else:
                calls[node.op] += 1
    arena = max((low.plan.arena_bytes for low in programs), default=0)
    inputs = max((sum(n.type.nbytes for n in low.fused.inputs) for low in programs), default=0)
    return Lowering(kernels, calls, arena, inputs)


def lowering_report(case: Case, params: int, lowering: Lowering) -> str:
    kernels = Counter(lowering.kernels)
    lines = [f"### {case.title}, {params / 1e6:.1f}M parameters: the compiled step on the CUDA target (lowered, "
             "not run)", "",
             f"{len(lowering.kernels)} generated kernels, {sum(lowering.calls.values())} library calls "
             f"({', '.join(f'{op} x{n}' for op, n in lowering.calls.most_common())})", "",
             f"planned device memory: arena {lowering.arena_bytes / 2**30:.2f} GiB, read in place (parameters, "
             f"optimizer state, the batch) {lowering.input_bytes / 2**30:.2f} GiB; library workspaces come on top",
             "",
             "| generated kernel (the operators it fuses) | count |", "|---|---:|"]
    lines += [f"| {name} | {n} |" for name, n in kernels.most_common()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- report

def loss_note(side: Side, reference: Side | None) -> str:
    n = min(len(side.losses), len(reference.losses)) if reference else 0
    if side is reference or not n:
        return ""
    worst = max(abs(a - b) for a, b in zip(side.losses[:n], reference.losses[:n]))
    return f"max abs loss diff vs torch eager over {n} steps: {worst:.2e}"


def ms_text(value: float) -> str:
    return f"{value:.2f}" if value == value else "n/a"


def first_step(side: Side) -> str:
    return f"{side.times[0]:.2f}" if side.times else "n/a"


def step_table(all_sides: list[Side], case: Case, warmup: int) -> str:
    by_name = {s.name: s for s in all_sides}
    eager_ms = by_name[REFERENCE].step_ms if REFERENCE in by_name else NAN
    peer_ms = by_name[PEER].step_ms if PEER in by_name else NAN
    unit = "images/s" if case.family == "vit" else "tokens/s"
    lines = [f"| side | step (ms, median after {warmup} warm-up) | {unit} | speed vs torch eager | "
             "speed vs torch.compile | first step (s) | peak memory (GiB) | kernels | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in all_sides:
        rate = f"{case.items_per_step / s.step_ms * 1e3:,.0f}" if s.step_ms == s.step_ms else "n/a"
        memory = f"{s.peak_bytes / 2**30:.2f}" if s.peak_bytes is not None else "n/a"
        note = s.error or loss_note(s, by_name.get(REFERENCE))
        lines.append(f"| {s.name} | {ms_text(s.step_ms)} | {rate} | {ratio(eager_ms, s.step_ms)} | "
                     f"{ratio(peer_ms, s.step_ms)} | {first_step(s)} | {memory} | {s.kernels or 'n/a'} | "
                     f"{note.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def breakdown_table(all_sides: list[Side]) -> str:
    lines = ["| side | " + " | ".join(f"{p} (ms/step)" for p in PARTS) + " | note |",
             "|---|" + "---:|" * len(PARTS) + "---|"]
    for s in all_sides:
        if not s.breakdown:
            continue
        error = s.breakdown.get("error", "")
        cells = " | ".join("n/a" if error else ms_text(s.breakdown[p]) for p in PARTS)
        lines.append(f"| {s.name} | {cells} | {str(error).replace('|', chr(92) + '|')} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def case_report(case: Case, params: int, all_sides: list[Side], args: argparse.Namespace) -> str:
    width = max(len(s.name) for s in all_sides)
    lines = [f"### {case.title}, {params / 1e6:.1f}M parameters, AdamW (fused) with clip_grad_norm_(1.0), "
             f"{args.steps} steps", "", "```"]
    lines += [f"losses  {s.name:<{width}}: " + " ".join(f"{v:.5f}" for v in s.losses) for s in all_sides]
    lines += ["```", "", step_table(all_sides, case, args.warmup)]
    breakdown = breakdown_table(all_sides)
    if breakdown:
        where = ("torch: CUDA kernels" if case.device.startswith("cuda")
                 else "torch: outermost CPU operators, Inductor's generated C++ among the gaps")
        lines += ["", f"Where a step's time goes ({where}; tilewise compiled: `tilewise.explain`'s timed program "
                  "steps; gaps: the rest of the step's wall time):", "", breakdown]
    return "\n".join(lines)


def summary(rows: list[tuple[Case, list[Side]]], sides: list[str]) -> str:
    """One line per (model, size): each side's step ms and its speed against torch.compile."""
    lines = ["| model | size | " + " | ".join(f"{name} ms (vs torch.compile)" for name in sides) + " |",
             "|---|---|" + "---:|" * len(sides)]
    for case, all_sides in rows:
        by_name = {s.name: s for s in all_sides}
        peer_ms = by_name[PEER].step_ms if PEER in by_name else NAN
        cells = []
        for name in sides:
            ms = by_name[name].step_ms
            cells.append("failed" if by_name[name].error else f"{ms_text(ms)} ({ratio(peer_ms, ms)})")
        lines.append(f"| {case.model} | {case.size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main

@dataclass
class Run:
    """One case's sides, run, with what their breakdowns need."""

    case: Case
    params: int
    sides: list[Side]
    weights: dict[str, np.ndarray]
    batches: list


def lowering_case(case: Case) -> str:
    weights, params = initial_weights(case)
    return lowering_report(case, params, cuda_lowering(case, weights, sample_batches(case, 1)[0]))


def run_case(case: Case, args: argparse.Namespace) -> Run:
    weights, params = initial_weights(case)
    batches = sample_batches(case, args.steps)
    all_sides = [Side(name, tw if name.startswith("tilewise") else torch, step_builder(name, case, weights))
                 for name in args.sides]
    for side in all_sides:
        run_side(side, case, batches, args.warmup)
        free_memory(side.library, case.device)
        print(f"{case.model} {case.size} {side.name}: {side.step_ms:.2f} ms/step"
              f"{'; ' + side.error if side.error else ''}", flush=True)
    return Run(case, params, all_sides, weights, batches)


def sequence_length(family: str, args: argparse.Namespace) -> int:
    """Tokens a sequence (ViT: the image side)."""
    if args.seq:
        return args.seq
    if family == "vit":
        return TINY["image"] if args.tiny else 224
    return TINY["seq"] if args.tiny else DEFAULT_SEQ


def cases(args: argparse.Namespace) -> list[Case]:
    found = []
    for model in args.models:
        family = model.split("-")[0]
        sizes = ["tiny"] if args.tiny else [s for s in args.sizes if s in FAMILY_SIZES[family]]
        for size in sizes:
            seq = sequence_length(family, args)
            batch = args.batch or (TINY["batch"] if args.tiny else DEFAULT_BATCH[family])
            found.append(Case(model, size, batch, seq, args.dtype, args.device))
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=lambda text: [parse_model(m.strip()) for m in text.split(",") if m.strip()],
                        default=["gpt2", "llama", "vit"], help="gpt2[-nobias][-erf][-untied]..., llama, vit")
    parser.add_argument("--sizes", type=comma_list(SIZE_CLASSES), default=["124M"],
                        help="size classes: 124M (GPT-2 124M, Llama 125M, ViT-B/16), 350M, 774M (GPT-2 only)")
    parser.add_argument("--sides", type=comma_list(SIDES), default=list(SIDES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast, or float32")
    parser.add_argument("--batch", type=int, help="sequences (images) a step; default 8 (ViT: 64)")
    parser.add_argument("--seq", type=int, help="tokens a sequence (ViT: the image side); default 1024 (ViT: 224)")
    parser.add_argument("--tiny", action="store_true", help="2 layers, width 64, sequence 32: seconds on the CPU")
    parser.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                        help="where each side's step time goes (torch.profiler; tilewise.explain)")
    parser.add_argument("--cuda-lowering", action="store_true",
                        help="run nothing: list the kernels and library calls of tilewise's compiled step lowered for "
                             "CUDA (no GPU needed)")
    parser.add_argument("--append", help="append the report to this markdown file")
    if parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(steps=4, warmup=1)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    args.sides = [name for name in SIDES if name in args.sides]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    heading = (f"## Transformer training matrix — `benchmarks/transformer_matrix.py` ({datetime.date.today()}, "
               f"{args.device}, tilewise {tw.__version__}, torch {torch.__version__})")
    sections, rows = [heading], []
    if args.cuda_lowering:
        sections += [lowering_case(case) for case in cases(args)]
    runs = [] if args.cuda_lowering else [run_case(case, args) for case in cases(args)]
    if args.breakdown:
        # every case's tilewise breakdown before any of torch's: on the H200s here, CUPTI's kernel records read
        # about twice as long once torch's profiler has run in the process (the calls' own times do not change)
        for tilewise_side in (True, False):
            for run in runs:
                add_breakdowns(run.sides, run.case, run.weights, run.batches, tilewise_side)
    for run in runs:
        sections.append(case_report(run.case, run.params, run.sides, args))
        rows.append((run.case, run.sides))
    if not args.cuda_lowering:
        sections.append("### Summary: step ms, and speed against torch.compile (default mode)\n\n"
                        + summary(rows, args.sides))
    text = "\n\n".join(sections) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
