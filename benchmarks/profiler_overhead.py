"""What profiling costs: a compiled GPT-2-style training step timed bare and inside the profiler, tilewise beside torch.

Each side trains the demo's GPT (``tilewise/models/gpt.py``, run by torch with its imports swapped, as in
``gpt_train_step.py``) from the same weights on the same batches: tilewise with the whole step compiled by one
``tw.compile``, torch with the model under ``torch.compile`` and fused AdamW. After ``--warmup`` steps, rounds
alternate a block of ``--steps`` bare steps and a block of as many steps inside
``profile(activities=[CPU, CUDA])`` (tilewise.profiler; torch.profiler for torch), so drift of the machine
falls on both alike. A step's time is its host wall time, synchronised at its end; reported per side are the
median bare and profiled step, the overhead (profiled / bare - 1), the seconds the profiler's stop takes
(flushing and reading the device records; outside the steps), how tilewise timed the device (``CUPTI`` or
``CUDA events``, the fallback without cupti-python) and the ratio of the two overheads. The target is an
overhead of at most 3% on the GPT-2 preset.

    python benchmarks/profiler_overhead.py [--device cuda] [--preset gpt2] [--quick] [--rounds 3 --steps 5]
        [--layers 6 --embd 384 --heads 6 --block 256 --batch 16] [--append FILE]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.profiler as torch_profiler  # noqa: E402

import tilewise as tw  # noqa: E402
import tilewise.profiler as tw_profiler  # noqa: E402
from benchmarks.gpt_train_step import (  # noqa: E402
    autocast_for,
    make_step,
    tilewise_model,
    torch_gpt_module,
    torch_model,
    whole_step_compiled,
)
from tilewise.models import gpt as tw_gpt  # noqa: E402

QUICK = {"layers": 1, "heads": 2, "embd": 32, "block": 16, "batch": 2, "vocab": 64, "rounds": 2, "steps": 2,
         "warmup": 2}
GPT2 = {"layers": 12, "heads": 12, "embd": 768, "block": 1024, "batch": 8, "vocab": 50304, "autocast": "bfloat16",
        "rounds": 3, "steps": 5, "warmup": 3}


@dataclass
class Side:
    name: str
    library: object
    profile: Callable  # () -> a profiler context
    bare: list[float] = field(default_factory=list)
    profiled: list[float] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    device_timing: str = ""

    @property
    def overhead(self) -> float:
        return statistics.median(self.profiled) / statistics.median(self.bare) - 1


def tilewise_step(args: argparse.Namespace, config: tw_gpt.GPTConfig, weights: dict) -> Callable:
    model = tilewise_model(config, weights, args.device)
    step = make_step(model, tw.optim.AdamW(model.parameters(), lr=3e-4), tw.nn.utils.clip_grad_norm_,
                     autocast_for(tw, args))
    return whole_step_compiled(step, "default")[0]


def torch_step(args: argparse.Namespace, config: tw_gpt.GPTConfig, weights: dict) -> Callable:
    model = torch_model(torch_gpt_module(), config, weights, args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=args.device.startswith("cuda"))
    return make_step(torch.compile(model), optimizer, torch.nn.utils.clip_grad_norm_, autocast_for(torch, args))


def timed_steps(side: Side, step: Callable, batches: list, sync: Callable) -> list[float]:
    times = []
    for x, y in batches:
        sync()
        start = time.perf_counter()
        loss = step(x, y)
        sync()
        times.append(time.perf_counter() - start)
        side.losses.append(float(loss.item()))
    return times


def run_side(side: Side, step: Callable, batches: list, args: argparse.Namespace) -> None:
    on_cuda = args.device.startswith("cuda")
    sync = side.library.cuda.synchronize if on_cuda else (lambda: None)
    timed_steps(side, step, batches[:args.warmup], sync)
    for _ in range(args.rounds):
        side.bare += timed_steps(side, step, batches[:args.steps], sync)
        profiler = side.profile()
        profiler.__enter__()
        side.profiled += timed_steps(side, step, batches[:args.steps], sync)
        start = time.perf_counter()
        profiler.__exit__(None, None, None)
        side.stops.append(time.perf_counter() - start)
        if not on_cuda:
            side.device_timing = "none (CPU)"
        elif side.library is tw:
            side.device_timing = profiler.profiler.device_timing
        else:
            side.device_timing = "CUPTI (Kineto)"


def profilers(on_cuda: bool) -> tuple[Callable, Callable]:
    tw_activities = [tw_profiler.ProfilerActivity.CPU] + ([tw_profiler.ProfilerActivity.CUDA] if on_cuda else [])
    torch_activities = [torch_profiler.ProfilerActivity.CPU] + (
        [torch_profiler.ProfilerActivity.CUDA] if on_cuda else [])
    return (lambda: tw_profiler.profile(activities=tw_activities),
            lambda: torch_profiler.profile(activities=torch_activities))


def report(sides: list[Side], args: argparse.Namespace, params: int) -> str:
    lines = [f"## Profiler overhead — `benchmarks/profiler_overhead.py` ({datetime.date.today()}, {args.device}, "
             f"tilewise {tw.__version__}, torch {torch.__version__})", "",
             f"GPT {args.layers}L {args.heads}H {args.embd}d, {params / 1e6:.2f}M params, batch "
             f"{args.batch}x{args.block}, {args.autocast}, AdamW; {args.rounds} rounds of {args.steps} bare and "
             f"{args.steps} profiled steps after {args.warmup} warm-up steps", "",
             "| side | bare step (ms) | profiled step (ms) | overhead | profiler stop (s) | device timing |",
             "|---|---|---|---|---|---|"]
    for s in sides:
        lines.append(f"| {s.name} | {statistics.median(s.bare) * 1e3:.2f} | {statistics.median(s.profiled) * 1e3:.2f} "
                     f"| {s.overhead:+.1%} | {statistics.median(s.stops):.3f} | {s.device_timing} |")
    ours, theirs = sides[0].overhead, sides[1].overhead
    ratio = f"{ours / theirs:.2f}x" if theirs > 0 else "n/a (torch's overhead is not positive)"
    lines += ["", f"tilewise's overhead {ours:+.1%}, torch's {theirs:+.1%}: ratio {ratio}",
              "losses " + "; ".join(f"{s.name}: " + " ".join(f"{v:.4f}" for v in s.losses[:3]) for s in sides)]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=["gpt2"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    for name, default in (("layers", 6), ("heads", 6), ("embd", 384), ("block", 256), ("batch", 16), ("vocab", 8192),
                          ("rounds", 3), ("steps", 5), ("warmup", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--autocast", choices=["fp32", "bfloat16", "float16"], default="fp32")
    parser.add_argument("--append", help="append the report to this file")
    args = parser.parse_args()
    for preset in ([QUICK] if args.quick else []) + ([GPT2] if args.preset == "gpt2" else []):
        vars(args).update(preset)
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
    data = [rng.integers(0, args.vocab, size=(2, args.batch, args.block))
            for _ in range(max(args.warmup, args.steps))]
    tw_profile, torch_profile = profilers(args.device.startswith("cuda"))
    sides = [Side("tilewise compiled (whole step)", tw, tw_profile),
             Side("torch.compile (model)", torch, torch_profile)]
    steps = {tw: tilewise_step(args, config, weights), torch: torch_step(args, config, weights)}
    for side in sides:
        lib = side.library
        batches = [(lib.tensor(d[0]).to(args.device), lib.tensor(d[1]).to(args.device)) for d in data]
        run_side(side, steps[lib], batches, args)
        print(f"{side.name}: bare {statistics.median(side.bare) * 1e3:.2f} ms, profiled "
              f"{statistics.median(side.profiled) * 1e3:.2f} ms", flush=True)
    text = report(sides, args, params)
    print(text)
    if args.append:
        with open(args.append, "a") as file:
            file.write("\n" + text)


if __name__ == "__main__":
    main()
