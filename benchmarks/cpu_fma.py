"""Eager CPU operators that round ``a * b + c`` once (add_ with an alpha, lerp_, addcmul_), tilewise beside torch.

Each figure is the best over several repeats of the mean wall time per call; tilewise's and torch's repeats
alternate, so that other work on a shared machine weighs on both alike. torch runs with its default thread
count (printed); ``--torch-threads 1`` compares one core with one core.

    python benchmarks/cpu_fma.py [--sizes 16384 1048576] [--repeats 7] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

import tilewise as tw

CASES: dict[str, Callable] = {
    "add_(alpha=0.1)": lambda x, y, z: x.add_(y, alpha=0.1),
    "lerp_(weight=0.3)": lambda x, y, z: x.lerp_(y, 0.3),
    "addcmul_(value=0.1)": lambda x, y, z: x.addcmul_(y, z, value=0.1),
}


def inputs(lib, dtype: str, n: int):
    rng = np.random.default_rng(n)
    return [lib.from_numpy(rng.standard_normal(n).astype(dtype)) for _ in range(3)]


def seconds_per_call(fn: Callable, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def measure(dtype: str, n: int, repeats: int) -> list[tuple[str, float, float]]:
    number = max(3, int(2e6 // n))
    rows = []
    for name, case in CASES.items():
        ours_args, peer_args = inputs(tw, dtype, n), inputs(torch, dtype, n)
        ours = partial(case, *ours_args)
        peer = partial(case, *peer_args)
        ours(), peer()  # warm caches (compiled kernels, binders)
        ours_times, peer_times = [], []
        for _ in range(repeats):
            ours_times.append(seconds_per_call(ours, number))
            peer_times.append(seconds_per_call(peer, number))
        rows.append((name, min(ours_times), min(peer_times)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 1 << 20])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--torch-threads", type=int, default=None)
    args = parser.parse_args()
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), numpy {np.__version__}")
    print(f"{'operator':<22}{'dtype':<9}{'elements':>10}{'tilewise':>12}{'torch':>12}{'ratio':>8}")
    for dtype in args.dtypes:
        for n in args.sizes:
            for name, ours, peer in measure(dtype, n, args.repeats):
                print(f"{name:<22}{dtype:<9}{n:>10}{ours * 1e3:>9.3f} ms{peer * 1e3:>9.3f} ms{ours / peer:>7.2f}x")


if __name__ == "__main__":
    main()
