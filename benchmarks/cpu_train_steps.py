"""Two small CPU training steps, tilewise beside torch: the demo's nanoGPT and PyTorch's MNIST CNN.

Run in a default environment (no thread variables, no tuning call): what a user gets out of the box. Each
case builds every side from the same initial weights and feeds it the same batches; the sides' steps are
*interleaved* (one step of each side per round) so that load from other processes on a shared machine falls on
all of them alike. Reported per side: the median step time over ``--steps`` rounds after ``--warmup``, the
spread (interquartile range, as a percentage of the median: how noisy the machine was), and the ratio to torch
eager and to torch.compile (above 1: tilewise slower). A side that raises is reported with its error and the
others are still measured.

* nanoGPT: ``tilewise/models/gpt.py`` (2 layers, width 64, 4 heads, block 64, batch 12, AdamW); the torch
  side runs the same source with torch's imports (``gpt_train_step.torch_gpt_module``). Compiled: the whole
  step by one ``tilewise.compile``; torch.compile of the model with eager AdamW. With compilation on, also
  tilewise eager with compiled backward (``tilewise.autograd.compiled_backward()``).
* MNIST CNN: ``examples/train_mnist_cnn.py``'s ``Net`` (batch 64, Adadelta, NLL of log-softmax), and the same
  network written in torch.

    python benchmarks/cpu_train_steps.py [--steps 10] [--warmup 3] [--no-compile] [--case gpt|mnist|all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402
from tilewise.models import gpt as tw_gpt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt_train_step import torch_gpt_module  # noqa: E402
from train_mnist_cnn import Net as TilewiseNet  # noqa: E402

NAN = float("nan")


@dataclass
class Side:
    name: str
    build: Callable[[], Callable[[int], float]]  # -> step(i) returning the loss
    step: Callable[[int], float] | None = None
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    error: str = ""

    def median_ms(self, warmup: int) -> float:
        timed = self.times[warmup:]
        return statistics.median(timed) * 1e3 if timed else NAN

    def spread(self, warmup: int) -> float:
        timed = self.times[warmup:]
        if len(timed) < 4:
            return NAN
        q = statistics.quantiles(timed, n=4)
        return (q[2] - q[0]) / statistics.median(timed) * 100


# ---------------------------------------------------------------------------------------------- nanoGPT

GPT_CONFIG = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=65, dropout=0.0)
GPT_BATCH = 12


def gpt_batches(rounds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    shape = (GPT_BATCH, GPT_CONFIG["block_size"])
    return [(rng.integers(0, GPT_CONFIG["vocab_size"], shape), rng.integers(0, GPT_CONFIG["vocab_size"], shape))
            for _ in range(rounds)]


def with_compiled_backward(step: Callable) -> Callable:
    """``step`` with its ``backward()`` replayed as one compiled program (``tilewise.autograd.compiled_backward``)."""
    def run(*args):
        with tw.autograd.compiled_backward():
            return step(*args)

    return run


def gpt_sides(rounds: int, compiled: bool) -> list[Side]:
    config = tw_gpt.GPTConfig(**GPT_CONFIG)
    tw.manual_seed(0)
    weights = {k: v.numpy().copy() for k, v in tw_gpt.GPT(config).state_dict().items()}
    batches = gpt_batches(rounds)
    torch_gpt = torch_gpt_module()

    def tilewise_step(compile_whole: bool, compiled_backward: bool = False):
        def build():
            model = tw_gpt.GPT(config)
            model.load_state_dict({k: tw.from_numpy(v.copy()) for k, v in weights.items()})
            optimizer = tw.optim.AdamW(model.parameters(), lr=3e-4)

            def step(x, y):
                _, loss = model(x, y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return loss.detach()

            run = tw.compile(step) if compile_whole else with_compiled_backward(step) if compiled_backward else step
            feeds = [(tw.from_numpy(x), tw.from_numpy(y)) for x, y in batches]
            return lambda i: float(run(*feeds[i]).item())
        return build

    def torch_step(compile_model: bool):
        def build():
            model = torch_gpt.GPT(torch_gpt.GPTConfig(**config.to_dict()))
            model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            forward = torch.compile(model) if compile_model else model
            feeds = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]

            def step(i):
                _, loss = forward(*feeds[i])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return float(loss.item())
            return step
        return build

    chosen = [Side("tilewise eager", tilewise_step(False)), Side("torch eager", torch_step(False))]
    if compiled:
        chosen.insert(1, Side("tilewise eager, compiled backward", tilewise_step(False, True)))
        chosen += [Side("tilewise compiled (whole step)", tilewise_step(True)),
                   Side("torch.compile (model)", torch_step(True))]
    return chosen


# ---------------------------------------------------------------------------------------------- MNIST CNN

MNIST_BATCH = 64


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = torch.nn.Dropout(0.25)
        self.dropout2 = torch.nn.Dropout(0.5)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        nnf = torch.nn.functional
        x = nnf.relu(self.conv1(x))
        x = nnf.relu(self.conv2(x))
        x = nnf.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(nnf.relu(self.fc1(x)))
        return nnf.log_softmax(self.fc2(x), dim=1)


def mnist_sides(rounds: int, compiled: bool) -> list[Side]:
    tw.manual_seed(0)
    weights = {k: v.numpy().copy() for k, v in TilewiseNet().state_dict().items()}
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((MNIST_BATCH, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, MNIST_BATCH))
               for _ in range(rounds)]

    def tilewise_step(compile_whole: bool, compiled_backward: bool = False):
        def build():
            model = TilewiseNet()
            model.load_state_dict({k: tw.from_numpy(v.copy()) for k, v in weights.items()})
            optimizer = tw.optim.Adadelta(model.parameters(), lr=1.0)

            def step(x, y):
                optimizer.zero_grad()
                loss = tw.nn.functional.nll_loss(model(x), y)
                loss.backward()
                optimizer.step()
                return loss.detach()

            run = tw.compile(step) if compile_whole else with_compiled_backward(step) if compiled_backward else step
            feeds = [(tw.from_numpy(x), tw.from_numpy(y)) for x, y in batches]
            return lambda i: float(run(*feeds[i]).item())
        return build

    def torch_step(compile_model: bool):
        def build():
            model = TorchNet()
            model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
            optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
            forward = torch.compile(model) if compile_model else model
            feeds = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]

            def step(i):
                optimizer.zero_grad()
                loss = torch.nn.functional.nll_loss(forward(feeds[i][0]), feeds[i][1])
                loss.backward()
                optimizer.step()
                return float(loss.item())
            return step
        return build

    chosen = [Side("tilewise eager", tilewise_step(False)), Side("torch eager", torch_step(False))]
    if compiled:
        chosen.insert(1, Side("tilewise eager, compiled backward", tilewise_step(False, True)))
        chosen += [Side("tilewise compiled (whole step)", tilewise_step(True)),
                   Side("torch.compile (model)", torch_step(True))]
    return chosen


# ---------------------------------------------------------------------------------------------- running

def run_interleaved(sides: list[Side], rounds: int) -> None:
    for side in sides:
        try:
            side.step = side.build()
        except Exception:  # noqa: BLE001 — a side that cannot be built is reported, the others still run
            side.error = traceback.format_exc(limit=2).strip().splitlines()[-1]
    for i in range(rounds):
        for side in sides:
            if side.step is None or side.error:
                continue
            try:
                start = time.perf_counter()
                side.losses.append(side.step(i))
                side.times.append(time.perf_counter() - start)
            except Exception:  # noqa: BLE001
                side.error = traceback.format_exc(limit=2).strip().splitlines()[-1]


def report(case: str, sides: list[Side], warmup: int) -> None:
    by_name = {s.name: s for s in sides}
    eager = by_name["torch eager"].median_ms(warmup)
    compiled = by_name["torch.compile (model)"].median_ms(warmup) if "torch.compile (model)" in by_name else NAN
    print(f"\n{case}")
    print(f"{'side':32s} {'median ms':>10s} {'IQR %':>7s} {'/torch eager':>13s} {'/torch.compile':>15s} "
          f"{'first s':>8s}  losses (first 2)")
    for side in sides:
        if side.error:
            print(f"{side.name:32s} error: {side.error}")
            continue
        ms = side.median_ms(warmup)
        first = side.times[0] if side.times else NAN
        losses = ", ".join(f"{v:.4f}" for v in side.losses[:2])
        print(f"{side.name:32s} {ms:10.2f} {side.spread(warmup):7.1f} {ms / eager:13.2f} {ms / compiled:15.2f} "
              f"{first:8.2f}  {losses}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed rounds after warm-up")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="eager sides only")
    parser.add_argument("--case", choices=("gpt", "mnist", "all"), default="all")
    parser.add_argument("--only", default="", help="comma-separated words: run only the sides whose name has one")
    args = parser.parse_args(argv)
    rounds = args.steps + args.warmup
    thread_vars = {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
    print(f"tilewise {tw.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"tilewise threads {tw.get_num_threads()}, torch threads {torch.get_num_threads()}, "
          f"thread variables {thread_vars or 'none'}")
    cases = {"gpt": ("nanoGPT 2x64, batch 12x64, AdamW", gpt_sides),
             "mnist": (f"MNIST CNN, batch {MNIST_BATCH}, Adadelta", mnist_sides)}
    for key, (title, make) in cases.items():
        if args.case in (key, "all"):
            sides = make(rounds, not args.no_compile)
            if args.only:
                sides = [s for s in sides if s.name == "torch eager" or any(w in s.name for w in args.only.split(","))]
            run_interleaved(sides, rounds)
            report(title, sides, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
