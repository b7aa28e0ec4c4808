"""Eager dispatch overhead: per-op time on a tiny CPU tensor, tilewise beside torch in one process.

On a 4x4 tensor the arithmetic is free, so what is measured is the framework's own path: argument
binding, dtype promotion, the dispatcher's keys, the kernel call and wrapping the result (and, with
``requires_grad``, recording the autograd node). Each figure is the best over several repeats of the mean
CPU time per call in a tight loop: process CPU time rather than wall time, so that other work on a shared
machine does not inflate either side.

    python benchmarks/dispatch_overhead.py [--repeats 7] [--number 2000] [--profile OP]

``--profile OP`` runs tilewise's version of one case under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import time
import timeit
from collections.abc import Callable

import numpy as np
import torch

import tilewise as tw

CASES: dict[str, Callable] = {
    "add": lambda lib, x, y, b: lib.add(x, y),
    "mul": lambda lib, x, y, b: x * y,
    "exp": lambda lib, x, y, b: lib.exp(x),
    "sum": lambda lib, x, y, b: x.sum(),
    "view": lambda lib, x, y, b: x.view(16),
    "transpose": lambda lib, x, y, b: x.t(),
    "matmul 4x4": lambda lib, x, y, b: x @ y,
    "reshape": lambda lib, x, y, b: x.reshape(2, 8),
    "narrow": lambda lib, x, y, b: x.narrow(1, 1, 2),
    "permute": lambda lib, x, y, b: x.permute(1, 0),
    "unsqueeze": lambda lib, x, y, b: x.unsqueeze(0),
    "expand": lambda lib, x, y, b: x.unsqueeze(0).expand(3, 4, 4),
    "split 2": lambda lib, x, y, b: x.split(2),
    "unbind": lambda lib, x, y, b: x.unbind(),
    "linear": lambda lib, x, y, b: lib.nn.functional.linear(x, y, b),
}

# forward and backward of one call, with inputs that require grad: the backward's host work (engine, formulas,
# the gradients' operators) in one figure
STEPS: dict[str, Callable] = {
    "linear fwd+bwd": lambda lib, x, y, b: lib.nn.functional.linear(x, y, b).sum().backward(),
    "split fwd+bwd": lambda lib, x, y, b: sum(p.sum() for p in (x * 1).split(1)).backward(),
}


def inputs(lib, requires_grad: bool):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(shape).astype(np.float32) for shape in ((4, 4), (4, 4), (4,)))
    return tuple(lib.from_numpy(v).requires_grad_(requires_grad) for v in (a, b, c))


def time_per_call(fn: Callable, repeats: int, number: int) -> float:
    """Best over ``repeats`` of the mean CPU seconds per call over ``number`` calls."""
    fn()  # warm caches (compiled kernels, binders)
    return min(timeit.Timer(fn, timer=time.process_time).repeat(repeat=repeats, number=number)) / number


def measure(repeats: int, number: int) -> list[tuple[str, bool, float, float]]:
    rows = []
    for requires_grad in (False, True):
        tw_args, th_args = inputs(tw, requires_grad), inputs(torch, requires_grad)
        for name, case in CASES.items():
            ours = time_per_call(lambda case=case, args=tw_args: case(tw, *args), repeats, number)
            peer = time_per_call(lambda case=case, args=th_args: case(torch, *args), repeats, number)
            rows.append((name, requires_grad, ours, peer))
    tw_args, th_args = inputs(tw, True), inputs(torch, True)
    for name, case in STEPS.items():
        ours = time_per_call(lambda case=case, args=tw_args: case(tw, *args), repeats, number // 4)
        peer = time_per_call(lambda case=case, args=th_args: case(torch, *args), repeats, number // 4)
        rows.append((name, True, ours, peer))
    return rows


def format_table(rows) -> str:
    lines = ["| op | requires_grad | tilewise (µs) | torch (µs) | ratio |", "|---|---|---:|---:|---:|"]
    for name, requires_grad, ours, peer in rows:
        lines.append(f"| {name} | {requires_grad} | {ours * 1e6:.1f} | {peer * 1e6:.1f} | {ours / peer:.1f}× |")
    return "\n".join(lines)


def versions() -> str:
    return (f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
            f"tilewise {tw.__version__}")


def profile(op: str, requires_grad: bool, number: int) -> None:
    args = inputs(tw, requires_grad or op in STEPS)
    case = CASES.get(op) or STEPS[op]
    case(tw, *args)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(number):
        case(tw, *args)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--profile", choices=sorted([*CASES, *STEPS]), help="cProfile tilewise's path for one op")
    parser.add_argument("--requires-grad", action="store_true", help="with --profile: inputs require grad")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.profile:
        profile(args.profile, args.requires_grad, args.number)
        return
    rows = measure(args.repeats, args.number)
    print(versions())
    print(format_table(rows))
    worst = max(ours / peer for _, _, ours, peer in rows)
    print(f"\nworst ratio {worst:.1f}× (target ≤ 3×)")


if __name__ == "__main__":
    main()
