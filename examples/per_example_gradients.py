"""Per-example gradient norms of a 3-layer MLP with vmap, checked against a Python loop over the examples.

Differential privacy (DP-SGD) clips each example's gradient before averaging, so it needs every example's
gradient, not their sum. ``vmap(grad(loss))`` computes all of them in one batched pass, as torch.func writes
it: ``grad`` differentiates one example's loss, ``vmap`` maps it over the batch, and each operator runs once for
the whole batch.

    python examples/per_example_gradients.py [--batch 1024] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import tilewise
import tilewise.nn.functional as F
from tilewise.func import grad, vmap


def make_params(sizes: list[int], device) -> list:
    generator = tilewise.Generator().manual_seed(0)
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        bound = fan_in ** -0.5
        params.append((tilewise.rand(fan_out, fan_in, generator=generator) * 2 - 1) * bound)
        params.append((tilewise.rand(fan_out, generator=generator) * 2 - 1) * bound)
    return [p.to(device) for p in params]


def mlp(params: list, x):
    w1, b1, w2, b2, w3, b3 = params
    h = F.relu(F.linear(x, w1, b1))
    h = F.relu(F.linear(h, w2, b2))
    return F.linear(h, w3, b3)


def example_loss(params: list, x, y):
    """One example's loss."""
    return F.cross_entropy(mlp(params, x.unsqueeze(0)), y.unsqueeze(0))


def norms(grads) -> object:
    """Each example's gradient norm over all parameters: grads[k] holds parameter k's gradients, batch first."""
    squares = [g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads]
    return tilewise.stack(squares).sum(0).sqrt()


def per_example_norms_vmap(params, xs, ys):
    return norms(vmap(grad(example_loss), in_dims=(None, 0, 0))(params, xs, ys))


def per_example_norms_loop(params, xs, ys):
    grads = [grad(example_loss)(params, xs[i], ys[i]) for i in range(xs.shape[0])]
    return norms([tilewise.stack(parts) for parts in zip(*grads)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    params = make_params([args.features, args.hidden, args.hidden, args.classes], args.device)
    generator = tilewise.Generator().manual_seed(1)
    xs = tilewise.randn(args.batch, args.features, generator=generator).to(args.device)
    ys = tilewise.randint(0, args.classes, (args.batch,), generator=generator).to(args.device)

    start = time.perf_counter()
    batched = per_example_norms_vmap(params, xs, ys)
    vmap_s = time.perf_counter() - start
    start = time.perf_counter()
    looped = per_example_norms_loop(params, xs, ys)
    loop_s = time.perf_counter() - start

    error = ((batched - looped).abs() / looped.abs().clamp(min=1e-12)).max().item()
    print(f"per-example gradient norms of {args.batch} examples: min {batched.min().item():.4f} "
          f"max {batched.max().item():.4f}")
    print(f"vmap {vmap_s * 1e3:.1f} ms, loop {loop_s * 1e3:.1f} ms ({loop_s / vmap_s:.1f}x), "
          f"max relative difference {error:.2e}")
    if error > 1e-5:
        raise SystemExit(f"vmap and the loop disagree: max relative difference {error:.2e} > 1e-5")


if __name__ == "__main__":
    main()
