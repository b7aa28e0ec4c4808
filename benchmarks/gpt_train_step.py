"""Training-step throughput of the demo's GPT: tilewise beside torch, eager and (``--compile``) compiled.

Both frameworks run the *same model source*, ``tilewise/models/gpt.py``: for torch its tilewise imports are
swapped for torch's (the rest of the file is unchanged, which is the point of a torch-compatible API).
Every side builds a fresh model from the same initial weights (copied through numpy) and sees the same
batches; a step is forward (under ``autocast`` with ``--autocast``), ``loss.backward()``, gradient clipping, the
optimizer step and ``zero_grad``. ``--preset gpt2`` is the case of ../shared's targets: GPT-2 124M, batch 8×1024,
bf16 autocast, AdamW.

* tilewise eager and torch eager, each with its optimizer's and ``clip_grad_norm_``'s defaults (on CUDA torch's
  multi-tensor ``foreach`` implementation, and tilewise's compiled group update; one parameter at a time on
  the CPU);
* with ``--compile``, tilewise with the *whole step* compiled by one ``tw.compile`` (forward, backward,
  ``clip_grad_norm_``, ``optimizer.step()`` and ``zero_grad`` in one function), and torch the usual way:
  the model compiled by ``torch.compile``, the optimizer eager (fused AdamW on CUDA; SGD with torch's
  default implementation).

Reported per side: the median step time after ``--warmup`` steps (host wall time of the step, synchronised at
its end), tokens/s, speed relative to torch eager and torch.compile, the seconds of the first and second steps
(compilation lands there, from empty caches: ``TILEWISE_CACHE_DIR`` and torch's Inductor and Triton cache
directories are fresh unless set; with SGD's momentum, whose state starts as the first gradient, a whole step
compiles again on its second call), peak device memory on CUDA, tilewise's kernel count per compiled program,
and each side's first losses with their largest difference from torch eager's, so the comparison is known to be
of the same computation. A side that raises (or a step that ``tilewise.compile`` gave up on and ran eagerly)
gets its error text in the table and the other sides are still measured.

    python benchmarks/gpt_train_step.py [--device cuda] [--compile] [--optimizer adamw|sgd] [--quick]
        [--layers 6 --embd 384 --heads 6 --block 256 --batch 32] [--autocast fp32|bfloat16|float16]
        [--preset gpt2] [--no-torch-compile] [--append FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-bench-cache-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402
from tilewise.models import gpt as tw_gpt  # noqa: E402

_TORCH_IMPORTS = {
    "from tilewise import nn": "from torch import nn",
    "from tilewise.autograd.grad_mode import no_grad": "from torch import no_grad",
    "from tilewise.nn import functional as F": "from torch.nn import functional as F",
    "from tilewise.ops.creation import arange": "from torch import arange",
    "from tilewise.tensor import Tensor, tensor": "from torch import Tensor, tensor",
}
MODES = ("default", "reduce-overhead", "max-autotune")
QUICK = {"layers": 1, "heads": 2, "embd": 32, "block": 16, "batch": 4, "vocab": 20, "steps": 6, "warmup": 2}
GPT2 = {"layers": 12, "heads": 12, "embd": 768, "block": 1024, "batch": 8, "vocab": 50304, "autocast": "bfloat16",
        "steps": 10, "warmup": 3}
NAN = float("nan")


def torch_gpt_module() -> types.ModuleType:
    source = Path(tw_gpt.__file__).read_text()
    for ours, theirs in _TORCH_IMPORTS.items():
        if ours not in source:
            raise RuntimeError(f"gpt.py no longer has the import {ours!r}; update the swap table")
        source = source.replace(ours, theirs)
    module = types.ModuleType("gpt_on_torch")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, "gpt.py (torch imports)", "exec"), module.__dict__)
    return module


def make_step(model, optimizer, clip: Callable, autocast: Callable = contextlib.nullcontext) -> Callable:
    def step(x, y):
        with autocast():  # the forward only, as torch's mixed-precision recipe has it
            _, loss = model(x, y)
        loss.backward()
        clip(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


# ---------------------------------------------------------------------------------------------- sides

@dataclass
class Side:
    name: str
    library: Any  # tilewise or torch: its cuda namespace gives the synchronisation and memory figures
    build: Callable[[], tuple[Callable, Callable[[], str]]]  # -> (step, kernel count text)
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds of every step, warm-up included
    step_ms: float = NAN  # median after warm-up
    peak_bytes: int | None = None
    kernels: str = ""
    error: str = ""


def tilewise_model(config: tw_gpt.GPTConfig, weights: dict[str, np.ndarray], device: str):
    model = tw_gpt.GPT(config)
    model.load_state_dict({k: tw.from_numpy(v.copy()) for k, v in weights.items()})
    return model.to(device)


def torch_model(torch_gpt: types.ModuleType, config: tw_gpt.GPTConfig, weights: dict[str, np.ndarray], device: str):
    model = torch_gpt.GPT(torch_gpt.GPTConfig(**config.to_dict()))
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
    return model.to(device)


def tilewise_optimizer(params, name: str):
    return tw.optim.AdamW(params, lr=3e-4) if name == "adamw" else tw.optim.SGD(params, lr=1e-2, momentum=0.9)


def torch_optimizer(params, name: str, compiled: bool, on_cuda: bool):
    """torch's optimizer with its defaults, or (``compiled``) as a torch.compile user runs it (fused AdamW)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=3e-4, **({"fused": on_cuda} if compiled else {}))
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9)


def no_kernels() -> str:
    return ""


def whole_step_compiled(step: Callable, mode: str) -> tuple[Callable, Callable[[], str]]:
    compiled = tw.compile(step, mode=mode)

    def checked(x, y):
        loss = compiled(x, y)
        if compiled.eager_reason:
            raise RuntimeError(f"tilewise.compile ran the step eagerly: {compiled.eager_reason}")
        return loss

    def kernels() -> str:
        return "+".join(str(getattr(p, "kernel_count", "?")) for p in compiled.programs())

    return checked, kernels


def autocast_for(library, args: argparse.Namespace) -> Callable:
    """``library.autocast`` to ``--autocast``'s dtype on the benchmark's device type (nothing for fp32)."""
    if args.autocast == "fp32":
        return contextlib.nullcontext
    return functools.partial(library.autocast, device_type=args.device.split(":")[0],
                             dtype=getattr(library, args.autocast))


def sides(args: argparse.Namespace, config: tw_gpt.GPTConfig, weights: dict[str, np.ndarray]) -> list[Side]:
    torch_gpt, on_cuda = torch_gpt_module(), args.device.startswith("cuda")
    tw_cast, torch_cast = autocast_for(tw, args), autocast_for(torch, args)

    def tilewise_eager():
        model = tilewise_model(config, weights, args.device)
        return make_step(model, tilewise_optimizer(model.parameters(), args.optimizer),
                         tw.nn.utils.clip_grad_norm_, tw_cast), no_kernels

    def tilewise_compiled():
        model = tilewise_model(config, weights, args.device)
        step = make_step(model, tilewise_optimizer(model.parameters(), args.optimizer), tw.nn.utils.clip_grad_norm_,
                         tw_cast)
        return whole_step_compiled(step, args.mode)

    def torch_eager():
        model = torch_model(torch_gpt, config, weights, args.device)
        return make_step(model, torch_optimizer(model.parameters(), args.optimizer, False, on_cuda),
                         torch.nn.utils.clip_grad_norm_, torch_cast), no_kernels

    def torch_compiled():
        model = torch_model(torch_gpt, config, weights, args.device)
        step = make_step(torch.compile(model, mode=args.mode),
                         torch_optimizer(model.parameters(), args.optimizer, True, on_cuda),
                         torch.nn.utils.clip_grad_norm_, torch_cast)
        return step, no_kernels

    chosen = [Side("tilewise eager", tw, tilewise_eager), Side("torch eager", torch, torch_eager)]
    if args.compile:
        chosen.insert(1, Side("tilewise compiled (whole step)", tw, tilewise_compiled))
        if not args.no_torch_compile:
            chosen.append(Side("torch.compile (model)", torch, torch_compiled))
    return chosen


def report_error(exc: BaseException) -> str:
    """Print the traceback to stderr; return a table-sized account of the exception."""
    traceback.print_exc()
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = " ".join(lines[:3])
    return (text[:297] + "...") if len(text) > 300 else text


def run_side(side: Side, batches: list, warmup: int, device: str) -> None:
    on_cuda = device.startswith("cuda")
    sync = side.library.cuda.synchronize if on_cuda else (lambda: None)
    try:
        step, kernels = side.build()
        if on_cuda:
            side.library.cuda.reset_peak_memory_stats()
        for x, y in batches:
            sync()
            start = time.perf_counter()
            loss = step(x, y)
            sync()
            side.times.append(time.perf_counter() - start)
            side.losses.append(float(loss.item()))
        side.step_ms = statistics.median(side.times[warmup:]) * 1e3
        if on_cuda:
            side.peak_bytes = side.library.cuda.max_memory_allocated()
        side.kernels = kernels()
    except Exception as exc:  # noqa: BLE001 — report what a side cannot do, measure the others
        side.error = report_error(exc)


# ---------------------------------------------------------------------------------------------- report

def ratio(theirs: float, ours: float) -> str:
    return f"{theirs / ours:.2f}x" if theirs == theirs and ours == ours else "n/a"


def seconds(side: Side, k: int) -> str:
    return f"{side.times[k]:.2f}" if len(side.times) > k else "n/a"


def loss_note(side: Side, reference: Side) -> str:
    n = min(len(side.losses), len(reference.losses), 4)
    if side is reference or not n:
        return ""
    worst = max(abs(a - b) for a, b in zip(side.losses[:n], reference.losses[:n]))
    return f"max abs loss diff vs torch eager over {n} steps: {worst:.2e}"


def table(all_sides: list[Side], warmup: int, tokens: int) -> str:
    by_name = {s.name: s for s in all_sides}
    eager = by_name["torch eager"]
    compiled = by_name.get("torch.compile (model)")
    eager_ms, compiled_ms = eager.step_ms, compiled.step_ms if compiled else NAN
    lines = [f"| side | step (ms, median after {warmup} warm-up) | tokens/s | speed vs torch eager | "
             "speed vs torch.compile | first / second step (s) | peak memory (GiB) | kernels | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in all_sides:
        ms = s.step_ms
        rate = f"{tokens / ms * 1e3:,.0f}" if ms == ms else "n/a"
        step = f"{ms:.2f}" if ms == ms else "n/a"
        memory = f"{s.peak_bytes / 2**30:.2f}" if s.peak_bytes is not None else "n/a"
        note = s.error or loss_note(s, eager)
        lines.append(f"| {s.name} | {step} | {rate} | {ratio(eager_ms, ms)} | {ratio(compiled_ms, ms)} | "
                     f"{seconds(s, 0)} / {seconds(s, 1)} | {memory} | {s.kernels or 'n/a'} | "
                     f"{note.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny model and few steps (the size flags still apply)")
    parser.add_argument("--compile", action="store_true", help="also tilewise's compiled whole step and torch.compile")
    parser.add_argument("--no-torch-compile", action="store_true", help="with --compile, skip the torch.compile side")
    parser.add_argument("--mode", choices=MODES, default="default", help="tw.compile and torch.compile mode")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                        help="AdamW (lr 3e-4) or SGD (lr 1e-2, momentum 0.9), gradients clipped to norm 1")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--autocast", choices=("fp32", "bfloat16", "float16"), default="fp32",
                        help="run the forward under autocast to this dtype (fp32: no autocast)")
    parser.add_argument("--preset", choices=("gpt2",), help="gpt2: GPT-2 124M, batch 8x1024, bf16 autocast")
    parser.add_argument("--append", help="append the result table to this markdown file")
    known = parser.parse_known_args()[0]
    if known.quick:
        parser.set_defaults(**QUICK)
    if known.preset == "gpt2":
        parser.set_defaults(**GPT2)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    return args


def main() -> None:
    args = parse_args()
    config = tw_gpt.GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                              n_embd=args.embd)
    tw.manual_seed(0)
    reference = tw_gpt.GPT(config)
    weights = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items()}
    params = reference.num_parameters()
    del reference

    rng = np.random.default_rng(0)
    data = [rng.integers(0, args.vocab, size=(2, args.batch, args.block)) for _ in range(args.steps)]
    batches = {tw: [(tw.tensor(d[0]).to(args.device), tw.tensor(d[1]).to(args.device)) for d in data],
               torch: [(torch.tensor(d[0]).to(args.device), torch.tensor(d[1]).to(args.device)) for d in data]}

    all_sides = sides(args, config, weights)
    for side in all_sides:
        run_side(side, batches[side.library], args.warmup, args.device)
        gc.collect()
        if args.device.startswith("cuda"):
            side.library.cuda.empty_cache()
        print(f"{side.name}: {side.step_ms:.2f} ms/step{'; ' + side.error if side.error else ''}", flush=True)

    heading = (f"## GPT training step — `benchmarks/gpt_train_step.py` ({datetime.date.today()}, {args.device}, "
               f"tilewise {tw.__version__}, torch {torch.__version__})")
    lines = [heading, "",
             f"GPT {args.layers}L {args.heads}H {args.embd}d, {params / 1e6:.2f}M params, batch "
             f"{args.batch}x{args.block}, {args.autocast if args.autocast == 'fp32' else args.autocast + ' autocast'}, "
             f"{args.optimizer} with clip_grad_norm_(1.0), {args.steps} steps, "
             f"compile mode {args.mode!r}", "", "```"]
    width = max(len(s.name) for s in all_sides)
    lines += [f"first losses  {s.name:<{width}}: " + " ".join(f"{v:.4f}" for v in s.losses[:4]) for s in all_sides]
    lines += ["```", "", table(all_sides, args.warmup, args.batch * args.block)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
