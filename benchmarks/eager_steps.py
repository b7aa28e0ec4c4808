"""Eager training steps, phase by phase: where the host's time goes beside torch eager's, in one process.

An eager step on a GPU is host-bound wherever the Python between launches takes longer than the kernels it
launches. Each side runs the same model from the same weights on the same batches (a new tensor on the device each
step, as a loop over a dataset already on the device has it), and each step is timed between synchronisations;
inside it, the host's time to issue the forward (and the loss), ``loss.backward()``, the optimizer's step with
``zero_grad(set_to_none=True)``, and the wait for the device at the end. A side whose host time exceeds the device's
work waits for nothing at the end.

The models are the transformer matrix's (``transformer_matrix.py``: GPT-2 124M and its variants, Llama 125M,
ViT-B/16, bf16 autocast, fused AdamW) and ``vision_train_step.py``'s ResNet-50 (batch 64, bf16 autocast, SGD with
momentum; ``resnet50`` in channels-last memory, ``resnet50-contiguous``). The sides:

* ``torch-eager``: the peer;
* ``tilewise-eager``: the engine runs the backward operator by operator;
* ``tilewise-eager-cb``: ``tilewise.autograd.compiled_backward()``: from the second step the backward is one
  compiled program (see [Note: compiled backward]), on CUDA one graph launch once a step's memory lies where an
  earlier one's did ([Note: graphs in place]); the row says how many backward calls replayed a graph.

Reported per (model, side): the median step after ``--warmup`` steps, the speed against torch eager, the median host
milliseconds of each phase, the first steps' seconds, peak device memory, and the largest difference of the losses
from torch eager's. ``--tiny`` is every model at 2 layers and width 64 (ResNet: width 8, one block a stage, 48x48
images), a run on the CPU in seconds. Nothing is written to RESULTS.md; ``--append FILE`` adds the report.

    python benchmarks/eager_steps.py [--models gpt2,llama,vit,resnet50,resnet50-contiguous]
        [--sides torch-eager,tilewise-eager,tilewise-eager-cb] [--steps 9] [--warmup 4] [--device cuda|cpu]
        [--tiny] [--append FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import statistics
import time
from dataclasses import dataclass, field

import torch
import transformer_matrix as tm
import vision_train_step as vs

import tilewise as tw
from tilewise.compiler import backward as compiled_backward

SIDES = ("torch-eager", "tilewise-eager", "tilewise-eager-cb")
MODELS = ("gpt2", "llama", "vit", "resnet50", "resnet50-contiguous")
PHASES = ("forward", "backward", "optimizer", "wait")
NAN = float("nan")


@dataclass
class Row:
    side: str
    step_ms: float = NAN
    phases: list[float] = field(default_factory=list)  # median host ms of each phase
    first: list[float] = field(default_factory=list)  # seconds of the warm-up steps
    peak_gib: float | None = None
    losses: list[float] = field(default_factory=list)
    graphs: str = ""
    error: str = ""


@dataclass
class Model:
    """How to build a model's side and its batches, for one of the benchmark's model names."""

    name: str
    title: str
    build: object  # (library) -> (model, optimizer, forward-and-loss)
    batches: object  # (library) -> list of (x, y) on the device


def transformer(name: str, args: argparse.Namespace) -> Model:
    family = tm.parse_model(name).split("-")[0]
    size = "tiny" if args.tiny else "124M"
    batch = (2 if args.tiny else 64 if family == "vit" else 8)
    seq = tm.sequence_length(family, argparse.Namespace(seq=None, tiny=args.tiny))
    case = tm.Case(name, size, batch, seq, "bf16", args.device)
    weights, _ = tm.initial_weights(case)
    raw = tm.sample_batches(case, args.steps)

    def build(library):
        model = tm.loaded_model(library, case, weights)
        autocast = tm.autocast_for(library, case)

        def forward(m, x, y):
            with autocast():
                return m(x, y)

        return model, tm.adamw(library, model), forward

    return Model(name, case.title, build, lambda library: [tm.on_device(library, case, b) for b in raw])


def resnet(name: str, args: argparse.Namespace) -> Model:
    fmt = "contiguous" if name.endswith("contiguous") else "channels_last"
    sizes = (vs.QUICK_SIZES if args.tiny else vs.SIZES)["resnet50"]
    extra = {"resnet_width": vs.QUICK["resnet_width"], "resnet_layers": vs.QUICK["resnet_layers"]} if args.tiny else {}
    case = vs.Case("resnet50", sizes["batch"], sizes["image"], sizes["classes"], fmt, "bf16", args.device, 0.01,
                   **extra)
    weights = vs.initial_weights(case)
    raw = vs.sample_batches(case, args.steps)

    def build(library):
        model = vs.loaded_model(library, case, weights)
        autocast = vs.autocast_for(library, "bf16", args.device)

        def forward(m, x, y):
            with autocast():
                return library.nn.functional.cross_entropy(m(x), y)

        return model, vs.sgd(library, model, 0.01), forward

    return Model(name, vs.case_title(case, args.steps).removeprefix("### "), build,
                 lambda library: [vs.on_device(library, case, x, y) for x, y in raw])


def synchronizer(library, device: str):
    return library.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def replays_text() -> str:
    """How many compiled backward calls replayed a CUDA graph, of all its calls."""
    runtimes = [p.runtime for entry in compiled_backward._seen.values() if entry[1] for p in entry[1][0].programs()]
    calls = sum(getattr(r, "calls", 0) for r in runtimes)
    replays = sum(getattr(r, "replays", 0) for r in runtimes)
    return f"{replays} of {calls} compiled calls replayed a graph" if calls else ""


def run_side(side: str, model: Model, args: argparse.Namespace) -> Row:
    row = Row(side)
    library = torch if side.startswith("torch") else tw
    sync = synchronizer(library, args.device)
    on_cuda = args.device.startswith("cuda")
    compiled_backward._seen.clear()
    try:
        if on_cuda:
            library.cuda.reset_peak_memory_stats()
        net, optimizer, forward = model.build(library)
        switch = tw.autograd.compiled_backward(side == "tilewise-eager-cb") if library is tw else \
            contextlib.nullcontext()
        times, phases = [], []
        with switch:
            for x, y in model.batches(library):
                sync()
                t0 = time.perf_counter()
                loss = forward(net, x, y)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                t3 = time.perf_counter()
                sync()
                t4 = time.perf_counter()
                times.append(t4 - t0)
                phases.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
                row.losses.append(float(loss.detach().float().item()))
        row.step_ms = statistics.median(times[args.warmup:]) * 1e3
        row.phases = [statistics.median(p[k] for p in phases[args.warmup:]) * 1e3 for k in range(len(PHASES))]
        row.first = times[:args.warmup]
        if on_cuda:
            row.peak_gib = library.cuda.max_memory_allocated() / 2**30
        if side == "tilewise-eager-cb" and on_cuda:
            row.graphs = replays_text()
        del net, optimizer
    except Exception as exc:  # noqa: BLE001 — report what a side cannot do, measure the others
        row.error = tm.report_error(exc)
    gc.collect()
    vs.free_memory(library, args.device)
    return row


def table(model: Model, rows: list[Row]) -> str:
    reference = next((r for r in rows if r.side == "torch-eager" and not r.error), None)
    lines = [f"### {model.title}: eager steps", "",
             "| side | step ms | vs torch eager | host ms: forward / backward / optimizer / wait | first steps (s) | "
             "peak GiB | losses vs torch eager | note |", "|---|---:|---:|---|---|---:|---:|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.side} | — | — | — | — | — | — | {r.error} |")
            continue
        speed = f"{reference.step_ms / r.step_ms:.2f}x" if reference is not None else "—"
        diff = (f"{max(abs(a - b) for a, b in zip(r.losses, reference.losses)):.2e}"
                if reference is not None and r is not reference else "—")
        peak = f"{r.peak_gib:.2f}" if r.peak_gib is not None else "—"
        lines.append(f"| {r.side} | {r.step_ms:.2f} | {speed} | {' / '.join(f'{p:.1f}' for p in r.phases)} | "
                     f"{', '.join(f'{t:.2f}' for t in r.first)} | {peak} | {diff} | {r.graphs} |")
    return "\n".join(lines)


def parse_model(name: str) -> str:
    """``name`` if this benchmark runs it (a ResNet-50 or a transformer matrix model), else an argparse error."""
    if name in ("resnet50", "resnet50-contiguous"):
        return name
    try:
        return tm.parse_model(name)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, resnet50 or resnet50-contiguous") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=lambda text: [parse_model(m.strip()) for m in text.split(",") if m.strip()],
                        default=list(MODELS), help="gpt2 (and its variants, gpt2-nobias-erf-tied), llama, vit, "
                        "resnet50 (channels-last), resnet50-contiguous")
    parser.add_argument("--sides", type=vs.comma_list(SIDES), default=list(SIDES))
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="2 layers, width 64 (ResNet: width 8): seconds on the CPU")
    parser.add_argument("--append", help="append the report to this markdown file")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    header = (f"## Eager steps — `benchmarks/eager_steps.py` ({datetime.date.today()}, {device}, torch "
              f"{torch.__version__}, tilewise {tw.__version__})")
    sections = [header]
    for name in args.models:
        model = resnet(name, args) if name.startswith("resnet") else transformer(name, args)
        rows = []
        for side in args.sides:
            rows.append(run_side(side, model, args))
            r = rows[-1]
            print(f"{name} {side}: {r.step_ms:.2f} ms/step{'; ' + r.error if r.error else ''}", flush=True)
        sections.append(table(model, rows))
        print(sections[-1], flush=True)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + "\n\n".join(sections) + "\n")


if __name__ == "__main__":
    main()
