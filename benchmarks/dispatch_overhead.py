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
    "add": lambda lib, x, y: lib.add(x, y),
    "mul": lambda lib, x, y: x * y,
    "exp": lambda lib, x, y: lib.exp(x),
    "sum": lambda lib, x, y: x.sum(),
    "view": lambda lib, x, y: x.view(16),
    "transpose": lambda lib, x, y: x.t(),
    "matmul 4x4": lambda lib, x, y: x @ y,
}


def inputs(lib, requires_grad: bool):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    x, y = lib.from_numpy(a), lib.from_numpy(b)
    return x.requires_grad_(requires_grad), y.requires_grad_(requires_grad)


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
    x, y = inputs(tw, requires_grad)
    case = CASES[op]
    case(tw, x, y)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(number):
        case(tw, x, y)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--profile", choices=sorted(CASES), help="cProfile tilewise's path for one op")
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
