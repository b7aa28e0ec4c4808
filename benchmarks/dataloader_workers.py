"""DataLoader worker processes: batches/s of a decode-bound dataset with 0, 2 and 4 workers, tilewise beside torch.

Each item costs about ``--item-ms`` of Python and numpy work (a stand-in for decoding an image: a byte loop in
Python, then a few numpy passes over a 64x64x3 image), so one process reads ``1000 / (item_ms * batch_size)``
batches a second and worker processes should multiply that by up to the number of free cores. Both loaders read
the same dataset (it returns numpy arrays, so each collates into its own tensors) in the same process; the
figure is steady-state batches/s after the first batch (worker start-up excluded), best of ``--repeats`` rounds in
which the loaders take turns.

The second table measures the hand-over itself: batches of 64x3x224x224 float32 (38.5 MB) that cost nothing to
make, read with 2 workers. tilewise's workers stack each batch into shared memory and the main process maps it
(no bytes pickled); "pickled" is the same loader with a collate_fn that returns numpy arrays, whose bytes travel
through the socket and are unpickled by the main process. Main-process CPU ms per batch shows who pays.

    python benchmarks/dataloader_workers.py [--batches 40] [--batch-size 32] [--item-ms 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings

import numpy as np
import torch

import tilewise as tw


class DecodeDataset:
    """Items that cost ``rounds`` units of decode-like work each (see ``calibrate``)."""

    def __init__(self, n: int, rounds: int) -> None:
        self.n, self.rounds = n, rounds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return decode(i, self.rounds), i % 10


def decode(i: int, rounds: int) -> np.ndarray:
    raw = np.random.default_rng(i).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    checksum = 0
    for _ in range(rounds):
        for byte in raw[0, :64, 0].tolist():  # entropy decoding is byte-at-a-time Python work
            checksum = (checksum * 31 + byte) & 0xFFFF
        image = raw.astype(np.float32) * (1 / 255)
        image = np.sqrt(image * image + 1e-3) - 0.5
    return np.ascontiguousarray(image.transpose(2, 0, 1) + checksum * 0.0)


def calibrate(item_ms: float) -> int:
    """The number of rounds that makes one item cost about ``item_ms`` milliseconds of CPU time here (CPU time, so
    that other work on a shared machine does not shrink the items)."""
    per_round_ms = float("inf")
    for _ in range(4):  # the first pass warms numpy up
        start = time.process_time()
        for i in range(40):
            decode(i, 10)
        per_round_ms = min(per_round_ms, (time.process_time() - start) * 1000 / 400)
    return max(1, round(item_ms / per_round_ms))


class LargeBatchDataset:
    """Items of 3x224x224 float32 that cost almost nothing to make: the hand-over dominates."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):
        return np.full((3, 224, 224), i % 251, dtype=np.float32)


def numpy_collate(samples):
    return np.stack(samples)


def run_once(make_loader, batches: int) -> tuple[float, float]:
    """Steady-state batches/s of one pass (after its first batch), and the main process's CPU ms per batch."""
    iterator = iter(make_loader())
    next(iterator)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del iterator
    return batches / elapsed, cpu * 1000 / batches


def best_of(loaders: dict, batches: int, repeats: int) -> dict:
    """Best run of each loader over ``repeats`` rounds, the loaders taking turns within a round (so that a burst
    of other work on a shared machine hits them alike)."""
    best = {name: (0.0, 0.0) for name in loaders}
    for _ in range(repeats):
        for name, make in loaders.items():
            best[name] = max(best[name], run_once(make, batches))
    return best


def decode_rows(args, rounds: int) -> list[tuple]:
    n = (args.batches + 2) * args.batch_size
    loaders = {}
    for workers in (0, 2, 4):
        for lib in (tw, torch):
            loaders[workers, lib.__name__] = lambda lib=lib, w=workers: lib.utils.data.DataLoader(
                DecodeDataset(n, rounds), batch_size=args.batch_size, num_workers=w)
    best = best_of(loaders, args.batches, args.repeats)
    return [(w, best[w, "tilewise"][0], best[w, "torch"][0]) for w in (0, 2, 4)]


def handover_rows(args) -> list[tuple]:
    loaders = {
        "tilewise, shared memory": lambda: tw.utils.data.DataLoader(LargeBatchDataset(), batch_size=64,
                                                                    num_workers=2),
        "tilewise, pickled numpy": lambda: tw.utils.data.DataLoader(LargeBatchDataset(), batch_size=64,
                                                                    num_workers=2, collate_fn=numpy_collate),
        "torch": lambda: torch.utils.data.DataLoader(LargeBatchDataset(), batch_size=64, num_workers=2),
    }
    best = best_of(loaders, max(args.batches // 4, 5), args.repeats)
    return [(name, *best[name]) for name in loaders]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--item-ms", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    rounds = calibrate(args.item_ms)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{platform.processor() or platform.machine()}, {cpus} CPUs usable, python {platform.python_version()}, "
          f"torch {torch.__version__}, numpy {np.__version__}, start method "
          f"{__import__('multiprocessing').get_start_method()}")
    print(f"decode-bound dataset: ~{args.item_ms} ms per item ({rounds} rounds), batch {args.batch_size}, "
          f"{args.batches} batches timed\n")
    rows = decode_rows(args, rounds)
    base_ours, base_peer = rows[0][1], rows[0][2]
    print(f"{'workers':>7} | {'tilewise b/s':>12} | {'torch b/s':>9} | {'tilewise/torch':>14} | "
          f"{'tilewise vs 0 workers':>21} | {'torch vs 0 workers':>18}")
    for workers, ours, peer in rows:
        print(f"{workers:>7} | {ours:>12.2f} | {peer:>9.2f} | {ours / peer:>13.2f}x | {ours / base_ours:>20.2f}x | "
              f"{peer / base_peer:>17.2f}x")
    print("\nhand-over of 38.5 MB batches (64x3x224x224 float32), 2 workers")
    print(f"{'loader':>24} | {'batches/s':>9} | {'MB/s':>7} | {'main CPU ms/batch':>17}")
    for name, rate, cpu_ms in handover_rows(args):
        print(f"{name:>24} | {rate:>9.2f} | {rate * 38.5:>7.0f} | {cpu_ms:>17.2f}")


if __name__ == "__main__":
    main()
