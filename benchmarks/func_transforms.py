"""Per-example gradients of a 3-layer MLP: tilewise vmap over autograd.grad, ``tilewise.compile`` of
``vmap(grad(loss))`` and a Python loop, beside torch.func.vmap(grad), ``torch.compile`` of it and torch's loop, in
one process.

Each repeat runs the four cases in turn (interleaved, so that load from other processes on a shared machine
falls on all of them alike); the figure is the median wall time over the repeats, with the spread (min..max)
beside it. The loops run over ``--loop-examples`` examples and are scaled to the batch, so that a large batch
stays quick to measure. The compiled cases are warmed (compiled) before timing; where ``torch.compile`` fails on
the machine, its row says why and the others stand.

    python benchmarks/func_transforms.py [--batch 1024] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as TF

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.func import grad, vmap


def weights(sizes: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        bound = fan_in ** -0.5
        out += [rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                rng.uniform(-bound, bound, fan_out).astype(np.float32)]
    return out


def mlp(functional, params, x):
    w1, b1, w2, b2, w3, b3 = params
    h = functional.relu(functional.linear(x, w1, b1))
    h = functional.relu(functional.linear(h, w2, b2))
    return functional.linear(h, w3, b3)


def tilewise_cases(arrays, xs, ys, device):
    params = [tw.from_numpy(a).to(device).requires_grad_() for a in arrays]
    x, y = tw.from_numpy(xs).to(device), tw.from_numpy(ys).to(device)

    def grads(xi, yi):
        loss = F.cross_entropy(mlp(F, params, xi.unsqueeze(0)), yi.unsqueeze(0))
        return tw.autograd.grad(loss, params)

    def batched():
        out = vmap(grads)(x, y)
        tw.cuda.synchronize() if device == "cuda" else None
        return out

    def loop(n):
        out = [grads(x[i], y[i]) for i in range(n)]
        tw.cuda.synchronize() if device == "cuda" else None
        return out

    def loss(ps, xi, yi):
        return F.cross_entropy(mlp(F, ps, xi.unsqueeze(0)), yi.unsqueeze(0))

    program = tw.compile(vmap(grad(loss), in_dims=(None, 0, 0)))
    detached = [p.detach() for p in params]

    def compiled():
        out = program(detached, x, y)
        tw.cuda.synchronize() if device == "cuda" else None
        return out

    return batched, loop, compiled


def torch_cases(arrays, xs, ys, device):
    params = {str(k): torch.from_numpy(a).to(device) for k, a in enumerate(arrays)}
    x, y = torch.from_numpy(xs).to(device), torch.from_numpy(ys).to(device)

    def loss(ps, xi, yi):
        return TF.cross_entropy(mlp(TF, [ps[str(k)] for k in range(6)], xi.unsqueeze(0)), yi.unsqueeze(0))

    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    leaves = [p.clone().requires_grad_() for p in params.values()]

    def batched():
        out = per_example(params, x, y)
        torch.cuda.synchronize() if device == "cuda" else None
        return out

    def loop(n):
        out = []
        for i in range(n):
            value = TF.cross_entropy(mlp(TF, leaves, x[i].unsqueeze(0)), y[i].unsqueeze(0))
            out.append(torch.autograd.grad(value, leaves))
        torch.cuda.synchronize() if device == "cuda" else None
        return out

    program = torch.compile(per_example)

    def compiled():
        out = program(params, x, y)
        torch.cuda.synchronize() if device == "cuda" else None
        return out

    return batched, loop, compiled


def check_compiled_gradients(ours, theirs) -> None:
    """The compiled program's per-example gradients are torch's (float32 tolerance), before anything is timed."""
    theirs = list(theirs.values()) if isinstance(theirs, dict) else list(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.cpu().numpy(), b.cpu().numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=f"compiled per-example gradient {k}")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-examples", type=int, default=128, help="examples the loops time, scaled to --batch")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    arrays = weights([args.features, args.hidden, args.hidden, args.classes])
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((args.batch, args.features)).astype(np.float32)
    ys = rng.integers(0, args.classes, args.batch)
    n = min(args.loop_examples, args.batch)
    scale = args.batch / n
    tw_vmap, tw_loop, tw_compiled = tilewise_cases(arrays, xs, ys, args.device)
    th_vmap, th_loop, th_compiled = torch_cases(arrays, xs, ys, args.device)
    cases = {"tilewise vmap": tw_vmap, "tilewise compiled": tw_compiled, "tilewise loop": lambda: tw_loop(n),
             "torch vmap(grad)": th_vmap, "torch compiled": th_compiled, "torch loop": lambda: th_loop(n)}
    check_compiled_gradients(tw_compiled(), th_vmap())
    failed = {}
    for name, fn in list(cases.items()):  # warm: kernel caches, binders, first allocations, compilation
        try:
            fn()
            fn()
        except Exception as exc:  # noqa: BLE001 — torch.compile may lack a working toolchain on the machine
            if name != "torch compiled":
                raise
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            del cases[name]
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn) * (scale if "loop" in name else 1.0))

    print(f"per-example gradients, 3-layer MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}, "
          f"batch {args.batch}, {args.device}, median of {args.repeats} (loops timed on {n} examples, scaled)")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"  {name:18s} {medians[name] * 1e3:9.1f} ms   (min {min(ts) * 1e3:.1f} .. max {max(ts) * 1e3:.1f})")
    for name, reason in failed.items():
        print(f"  {name:18s} failed: {reason}")
    print(f"  tilewise vmap / torch vmap(grad): {medians['tilewise vmap'] / medians['torch vmap(grad)']:.2f}x time")
    print(f"  torch vmap(grad) / tilewise compiled: "
          f"{medians['torch vmap(grad)'] / medians['tilewise compiled']:.2f}x "
          "(above 1: the compiled program is faster)")
    if "torch compiled" in medians:
        print(f"  torch compiled / tilewise compiled:   "
              f"{medians['torch compiled'] / medians['tilewise compiled']:.2f}x (above 1: tilewise is faster)")
    print(f"  tilewise loop / torch loop:       {medians['tilewise loop'] / medians['torch loop']:.2f}x time")
    print(f"  speed-up of vmap over the loop:   tilewise {medians['tilewise loop'] / medians['tilewise vmap']:.1f}x, "
          f"torch {medians['torch loop'] / medians['torch vmap(grad)']:.1f}x")


if __name__ == "__main__":
    main()
