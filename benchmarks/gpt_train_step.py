"""Training-step throughput of the demo's GPT: tilewise eager beside torch eager, in one process.

Both sides run the *same model source*, ``tilewise/models/gpt.py``: for torch its four tilewise imports are
swapped for torch's (the rest of the file is unchanged, which is the point of a torch-compatible API).
Both start from the same weights (copied through numpy) and see the same batches; a step is forward,
backward, gradient clipping and AdamW. Reported: median step time after warm-up and tokens/s, plus the
losses of the first steps on both sides, so the comparison is known to be of the same computation.

    python benchmarks/gpt_train_step.py [--device cuda] [--layers 6 --embd 384 --heads 6 --block 256 --batch 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

import tilewise as tw
from tilewise.models import gpt as tw_gpt

_TORCH_IMPORTS = {
    "from tilewise import nn": "from torch import nn",
    "from tilewise.autograd.grad_mode import no_grad": "from torch import no_grad",
    "from tilewise.nn import functional as F": "from torch.nn import functional as F",
    "from tilewise.ops.creation import arange": "from torch import arange",
    "from tilewise.tensor import Tensor, tensor": "from torch import Tensor, tensor",
}


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


def copy_weights(ours, theirs) -> None:
    state = {k: torch.from_numpy(v.detach().cpu().numpy().copy()) for k, v in ours.state_dict().items()}
    theirs.load_state_dict(state)


def step_fn(model, optimizer, clip, sync):
    def step(x, y):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip(model.parameters(), 1.0)
        optimizer.step()
        sync()
        return loss

    return step


def time_steps(step, batches, warmup: int) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for k, (x, y) in enumerate(batches):
        start = time.perf_counter()
        loss = step(x, y)
        elapsed = time.perf_counter() - start
        losses.append(float(loss.item()))
        if k >= warmup:
            times.append(elapsed)
    return losses, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    config = tw_gpt.GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                              n_embd=args.embd)
    tw.manual_seed(0)
    ours = tw_gpt.GPT(config).to(args.device)
    torch_gpt = torch_gpt_module()
    theirs = torch_gpt.GPT(torch_gpt.GPTConfig(**config.to_dict())).to(args.device)
    copy_weights(ours, theirs)

    rng = np.random.default_rng(0)
    data = [rng.integers(0, args.vocab, size=(2, args.batch, args.block)) for _ in range(args.steps)]
    tw_batches = [(tw.tensor(d[0]).to(args.device), tw.tensor(d[1]).to(args.device)) for d in data]
    th_batches = [(torch.tensor(d[0]).to(args.device), torch.tensor(d[1]).to(args.device)) for d in data]

    tw_sync = tw.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    th_sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    tw_step = step_fn(ours, tw.optim.AdamW(ours.parameters(), lr=3e-4), tw.nn.utils.clip_grad_norm_, tw_sync)
    th_step = step_fn(theirs, torch.optim.AdamW(theirs.parameters(), lr=3e-4, foreach=False),
                      torch.nn.utils.clip_grad_norm_, th_sync)

    tw_losses, tw_times = time_steps(tw_step, tw_batches, args.warmup)
    th_losses, th_times = time_steps(th_step, th_batches, args.warmup)
    tokens = args.batch * args.block
    ours_ms, theirs_ms = statistics.median(tw_times) * 1e3, statistics.median(th_times) * 1e3
    params = sum(p.numel() for p in ours.parameters())
    print(f"GPT {args.layers}L {args.heads}H {args.embd}d, {params / 1e6:.1f}M params, batch {args.batch}x{args.block}, "
          f"fp32, {args.device}")
    print("first losses  tilewise:", " ".join(f"{v:.4f}" for v in tw_losses[:4]))
    print("first losses  torch   :", " ".join(f"{v:.4f}" for v in th_losses[:4]))
    print("| case | tilewise | torch eager | unit | speed |")
    print("|---|---:|---:|---|---:|")
    print(f"| train step (median of {len(tw_times)}) | {ours_ms:.2f} | {theirs_ms:.2f} | ms | {theirs_ms / ours_ms:.2f}x |")
    print(f"| throughput | {tokens / ours_ms * 1e3:,.0f} | {tokens / theirs_ms * 1e3:,.0f} | tokens/s | "
          f"{theirs_ms / ours_ms:.2f}x |")


if __name__ == "__main__":
    main()
