"""Training step of an LSTM language model: tilewise (eager and compiled) beside torch (eager, cuDNN on CUDA, and
torch.compile), measured in one process.

The model, the same source for both libraries: Embedding(vocab, embed) -> LSTM(embed, hidden, layers,
batch_first) -> Linear(hidden, vocab), cross entropy over every position, AdamW. A step is forward (under bf16
autocast on CUDA), ``loss.backward()``, ``optimizer.step()`` and ``zero_grad``. The default is the target case:
vocab 8192, embed = hidden = 1024, 2 layers, sequence 256, batch 64. ``--device cpu --small`` runs tiny sizes in
float32 (a quick check that every side runs and agrees).

Every side starts from the same weights (torch's initialisation, copied through numpy) and sees the same batches:
* tilewise eager: each layer's time loop is one operator (``_lstm_layer``, ops/nn_recurrent.py) whose CUDA kernel
  runs below the dispatcher: per time step one GEMM and one generated cell kernel each way
  (backends/cuda/recurrent.py);
* tilewise compiled: the whole step (forward, backward, AdamW) in one ``tilewise.compile``;
* torch eager: ``nn.LSTM`` (cuDNN on CUDA), AdamW with its defaults;
* torch.compile: the model compiled (the LSTM stays cuDNN's), fused AdamW on CUDA.

Printed per side: the median step time after ``--warmup`` steps (host wall time, synchronised at the end of the
step), tokens/s, speed relative to torch eager and to torch.compile, seconds of the first step (compilation
lands there), and the largest difference of its first losses from torch eager's (the same computation is being
timed). A side that raises gets its error in the table and the others are still measured.

    python benchmarks/lstm_lm.py [--device cuda|cpu] [--small] [--steps 10] [--warmup 3]
        [--vocab 8192 --embed 1024 --hidden 1024 --layers 2 --seq 256 --batch 64] [--no-compile]
        [--no-torch-compile]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402

TARGET = {"vocab": 8192, "embed": 1024, "hidden": 1024, "layers": 2, "seq": 256, "batch": 64}
SMALL = {"vocab": 64, "embed": 32, "hidden": 32, "layers": 2, "seq": 16, "batch": 4}
NAN = float("nan")


def language_model(nn, vocab: int, embed: int, hidden: int, layers: int):
    class LSTMLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, embed)
            self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, tokens):
            out, _ = self.lstm(self.embed(tokens))
            return self.head(out)

    return LSTMLanguageModel()


def make_step(model, optimizer, functional, autocast: Callable) -> Callable:
    def step(x, y):
        with autocast():
            logits = model(x)
            loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


@dataclass
class Side:
    name: str
    sync: Callable[[], None]
    build: Callable[[], Callable]  # -> step(x, y)
    to_device: Callable  # numpy batch -> the side's tensor
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    error: str = ""

    def median_ms(self, warmup: int) -> float:
        timed = self.times[warmup:]
        return statistics.median(timed) * 1e3 if timed else NAN


def measure(side: Side, batches: list, warmup: int) -> None:
    try:
        step = side.build()
        for x, y in batches:
            xs, ys = side.to_device(x), side.to_device(y)
            side.sync()
            start = time.perf_counter()
            loss = step(xs, ys)
            side.sync()
            side.times.append(time.perf_counter() - start)
            side.losses.append(float(loss.float().item()))
    except Exception as e:  # noqa: BLE001 — a failing side is reported in the table, the others still run
        side.error = f"{type(e).__name__}: {e}".splitlines()[0][:150]
        traceback.print_exc()


def sides(args, weights: dict, sizes: dict) -> list[Side]:
    device = args.device
    on_cuda = device == "cuda"

    def torch_sync():
        if on_cuda:
            torch.cuda.synchronize()

    def tw_sync():
        if on_cuda:
            tw.cuda.synchronize()

    def torch_autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()

    def tw_autocast():
        return tw.autocast(device_type="cuda", dtype=tw.bfloat16) if on_cuda else contextlib.nullcontext()

    def torch_model():
        model = language_model(torch.nn, **_model_sizes(sizes))
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
        return model.to(device)

    def tw_model():
        model = language_model(tw.nn, **_model_sizes(sizes))
        model.load_state_dict({k: tw.from_numpy(v.copy()) for k, v in weights.items()})
        return model.to(device)

    def torch_eager():
        model = torch_model()
        return make_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.nn.functional, torch_autocast)

    def torch_compiled():
        model = torch_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if on_cuda else {}))
        return make_step(torch.compile(model), optimizer, torch.nn.functional, torch_autocast)

    def tw_eager():
        model = tw_model()
        return make_step(model, tw.optim.AdamW(model.parameters(), lr=1e-3), tw.nn.functional, tw_autocast)

    def tw_compiled():
        model = tw_model()
        compiled = tw.compile(make_step(model, tw.optim.AdamW(model.parameters(), lr=1e-3), tw.nn.functional,
                                        tw_autocast))

        def checked(x, y):
            loss = compiled(x, y)
            if compiled.eager_reason:
                raise RuntimeError(f"tilewise.compile ran the step eagerly: {compiled.eager_reason}")
            return loss

        return checked

    def to_torch(a):
        return torch.from_numpy(a).to(device)

    def to_tw(a):
        return tw.from_numpy(a).to(device)

    out = [Side("torch eager" + (" (cuDNN)" if on_cuda else ""), torch_sync, torch_eager, to_torch)]
    if not args.no_torch_compile:
        out.append(Side("torch.compile", torch_sync, torch_compiled, to_torch))
    out.append(Side("tilewise eager", tw_sync, tw_eager, to_tw))
    if not args.no_compile:
        out.append(Side("tilewise compiled", tw_sync, tw_compiled, to_tw))
    return out


def _model_sizes(sizes: dict) -> dict:
    return {k: sizes[k] for k in ("vocab", "embed", "hidden", "layers")}


def initial_weights(sizes: dict) -> dict:
    torch.manual_seed(0)
    model = language_model(torch.nn, **_model_sizes(sizes))
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def report(all_sides: list[Side], sizes: dict, warmup: int) -> None:
    tokens = sizes["seq"] * sizes["batch"]
    reference = {s.name: s for s in all_sides}
    eager = next((s for s in all_sides if s.name.startswith("torch eager")), None)
    compiled = reference.get("torch.compile")
    print(f"\n{'side':<22} {'step ms':>9} {'tokens/s':>11} {'vs torch eager':>15} {'vs torch.compile':>17} "
          f"{'first s':>8} {'loss diff':>10}")
    for side in all_sides:
        if side.error:
            print(f"{side.name:<22} error: {side.error}")
            continue
        ms = side.median_ms(warmup)
        ratio_eager = _ratio(eager, ms, warmup)
        ratio_compiled = _ratio(compiled, ms, warmup)
        n = min(len(side.losses), len(eager.losses)) if eager and not eager.error else 0
        diff = max((abs(a - b) for a, b in zip(side.losses[:n], eager.losses[:n])), default=NAN)
        print(f"{side.name:<22} {ms:>9.2f} {tokens / ms * 1e3:>11.0f} {ratio_eager:>14.2f}x {ratio_compiled:>16.2f}x "
              f"{side.times[0] if side.times else NAN:>8.2f} {diff:>10.2e}")
    print("(ratios: the other side's step time / this side's; > 1 means this side is faster)")


def _ratio(peer: Side | None, ms: float, warmup: int) -> float:
    if peer is None or peer.error:
        return NAN
    return peer.median_ms(warmup) / ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a quick run, on the CPU too)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="leave out tilewise compiled")
    parser.add_argument("--no-torch-compile", action="store_true", help="leave out torch.compile")
    for name in TARGET:
        parser.add_argument(f"--{name}", type=int, default=None)
    args = parser.parse_args()
    sizes = dict(SMALL if args.small else TARGET)
    sizes.update({k: getattr(args, k) for k in TARGET if getattr(args, k) is not None})
    precision = "bf16 autocast" if args.device == "cuda" else "float32"
    print(f"LSTM language model step on {args.device}: {sizes}, {precision}, AdamW; "
          f"{args.steps} steps, median of the last {args.steps - args.warmup}")
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, sizes["vocab"], (sizes["batch"], sizes["seq"])),
                rng.integers(0, sizes["vocab"], (sizes["batch"], sizes["seq"]))) for _ in range(args.steps)]
    weights = initial_weights(sizes)
    all_sides = sides(args, weights, sizes)
    for side in all_sides:
        measure(side, batches, args.warmup)
        print(f"  {side.name}: {'error' if side.error else 'done'} "
              f"({', '.join(f'{t * 1e3:.1f}' for t in side.times)} ms)", flush=True)
    report(all_sides, sizes, args.warmup)


if __name__ == "__main__":
    main()
