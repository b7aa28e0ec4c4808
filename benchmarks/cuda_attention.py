"""Fused attention on CUDA: ``scaled_dot_product_attention`` forward and forward+backward, tilewise (eager and
``tw.compile``) beside torch eager and torch.compile, in one process on the same values.

Each figure is the median over 7 runs of CUDA-event time per call, a run being 20 calls back to back after
warm-up (so a call whose host work outlasts its kernels shows it). "speed" is the peer's time over ours:
above 1 means tilewise is faster. The case of ../shared's targets is B8 H12 T1024 D64 causal bf16
(target >= 1.0x torch eager, forward and forward+backward).

    python benchmarks/cuda_attention.py [--cases small|all]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import tilewise as tw
import tilewise.nn.functional as F

CASES = [((8, 12, 1024, 64), True), ((8, 12, 1024, 64), False), ((4, 16, 4096, 128), True),
         ((16, 12, 512, 64), True)]


def timed(fn, start, stop, sync, calls: int = 20, runs: int = 7) -> float:
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        sync()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


def ours_timed(fn) -> float:
    return timed(fn, tw.cuda.Event(enable_timing=True), tw.cuda.Event(enable_timing=True), tw.cuda.synchronize)


def torch_timed(fn) -> float:
    return timed(fn, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                 torch.cuda.synchronize)


def flops(shape, causal: bool, backward: bool) -> float:
    batch, heads, length, dim = shape
    f = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
    return f * (3.5 if backward else 1.0)  # backward: five products to the forward's two


def case(shape, causal: bool) -> list[str]:
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    tq, tk, tv, tg = (torch.from_numpy(a).cuda().bfloat16() for a in host)
    wq, wk, wv, wg = (tw.from_numpy(a).cuda().bfloat16() for a in host)

    def torch_fwd(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours_fwd(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    torch_compiled = torch.compile(torch_fwd)
    ours_compiled = tw.compile(ours_fwd)
    rows = []
    for backward in (False, True):
        tqs, tks, tvs = (t.detach().requires_grad_(backward) for t in (tq, tk, tv))
        wqs, wks, wvs = (t.detach().requires_grad_(backward) for t in (wq, wk, wv))

        def run(f, q, k, v, g, backward=backward):
            out = f(q, k, v)
            if backward:
                out.backward(g)

        ours, theirs = (wqs, wks, wvs, wg), (tqs, tks, tvs, tg)
        figures = {
            "tilewise": ours_timed(lambda: run(ours_fwd, *ours)),  # noqa: B023 — called within the iteration
            "tw.compile": ours_timed(lambda: run(ours_compiled, *ours)),  # noqa: B023
            "torch": torch_timed(lambda: run(torch_fwd, *theirs)),  # noqa: B023
            "torch.compile": torch_timed(lambda: run(torch_compiled, *theirs)),  # noqa: B023
        }
        what = "fwd+bwd" if backward else "fwd"
        tflops = flops(shape, causal, backward) / (figures["tilewise"] * 1e-3) / 1e12
        name = f"B{shape[0]} H{shape[1]} T{shape[2]} D{shape[3]} {'causal' if causal else 'full'} bf16 {what}"
        rows.append(f"| {name} | {figures['tilewise']:.3f} ({tflops:.0f} TFLOP/s) | {figures['tw.compile']:.3f} | "
                    f"{figures['torch']:.3f} | {figures['torch.compile']:.3f} | "
                    f"{figures['torch'] / figures['tilewise']:.2f}x | "
                    f"{figures['torch.compile'] / figures['tilewise']:.2f}x |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", choices=("small", "all"), default="all")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, tilewise {tw.__version__}")
    print("| case | tilewise ms | tw.compile ms | torch ms | torch.compile ms | vs torch | vs torch.compile |")
    print("|---|---|---|---|---|---|---|")
    for shape, causal in CASES[:1] if args.cases == "small" else CASES:
        case(shape, causal)


if __name__ == "__main__":
    main()
