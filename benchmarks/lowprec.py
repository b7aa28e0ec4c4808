"""Low-precision training on CUDA: FP8 GEMMs and FP8 training steps of tilewise, beside torch in the same process.

Sections (all but **lowering** by default; ``--only gemm|step|lowering|curve`` picks one):

* **gemm**: ``_scaled_mm`` (e4m3 x e4m3, tensorwise scales, bf16 result) and a bf16 ``mm`` at 8192^3 and at
  GPT-2 124M / Llama-7B layer shapes (8192 tokens), tilewise beside ``torch._scaled_mm`` and torch's bf16 mm.
  Each side's median device time per call over ``--repeats`` rounds, the sides alternating round by round, each
  round ten calls queued behind a spin kernel and timed with that side's own CUDA events (the GEMMs' time, not
  the host's pace of issuing them), in TFLOP/s, and the ratios (FP8 over our bf16, ours over torch's FP8).
* **step**: a GPT-2 (124M, 350M: ``--models``; ``benchmarks/models/gpt2.py``, one source run by both libraries)
  training step, the whole step (forward, backward, AdamW) compiled
  by ``tw.compile``, parameters in bf16, its ``nn.Linear`` layers (all but the tied LM head) swapped by
  ``tilewise.float8.convert_to_float8_training`` (current scaling) against the same step in bf16; torchao's
  float8 training beside them when torchao is importable (the table says when it is not). Median step time
  after ``--warmup`` steps, tokens/s, ratio, and each side's first and last loss.
* **lowering**: the same compiled steps (bf16, FP8 with current and with delayed scaling, ``--models``) lowered for
  the CUDA target on any machine, a GPU or not (generated, neither built nor run): each side's generated kernels and
  library calls, the bytes each moves (every buffer it reads once, every one it writes once), the kernels grouped by
  the operators they fuse, and what FP8 adds (casts, reductions to a scale, the rest) per layer. ``--layers N``
  lowers N layers of each model instead of all (the figures per layer hold; the LM head's and embedding's stay
  once). Where the cuDNN frontend does not import, attention is lowered as its decomposition (two batched GEMMs and
  a softmax), on both sides alike; ``--cudnn-attention`` keeps it whole as a GPU host does (one cuDNN call each
  way).
* **curve**: ``--curve N`` trains the demo's char-GPT (``--curve-size``, on the shipped text) N steps in FP8 and
  in bf16 from the same weights on the same batches and writes both loss curves (``lowprec_curve.json`` and a
  PNG beside it, ``--out``), with the final losses (mean of the last 10%) and their relative difference.

If ``benchmarks/lowprec_quant.py`` exists, its ``main_section()`` (quantization figures) runs after these.

    python benchmarks/lowprec.py [--only gemm|step|lowering|curve] [--repeats 20] [--models 124M,350M]
        [--steps 20] [--warmup 5] [--batch 8] [--layers N] [--cudnn-attention] [--curve 300] [--curve-size medium]
        [--out DIR]
    python benchmarks/lowprec.py --only lowering --models 124M   # the kernels of both steps, no GPU needed
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))

import numpy as np  # noqa: E402

import tilewise as tw  # noqa: E402
from tilewise.float8 import (  # noqa: E402
    Float8LinearConfig,
    convert_to_float8_training,
    sync_float8_amax_and_scale_history,
)
from tilewise.models.gpt import GPT, GPTConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_source import module_for  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKENS = 8192
GEMM_SHAPES = {  # name: (M, K, N) of x[M, K] @ W[N, K]^T
    "8192^3": (8192, 8192, 8192),
    "gpt2 qkv": (TOKENS, 768, 2304), "gpt2 attn proj": (TOKENS, 768, 768),
    "gpt2 mlp fc": (TOKENS, 768, 3072), "gpt2 mlp proj": (TOKENS, 3072, 768),
    "llama qkv": (TOKENS, 4096, 12288), "llama o": (TOKENS, 4096, 4096),
    "llama gate+up": (TOKENS, 4096, 22016), "llama down": (TOKENS, 11008, 4096),
}
VOCAB = 50304  # GPT-2's 50257, padded to a multiple of 64


def not_head(module, fqn: str) -> bool:
    """FP8 for every Linear but the char-GPT's vocabulary head (its size is not a multiple of 16)."""
    return fqn != "head"


# ---------------------------------------------------------------------------------------------- timing

CALLS_PER_ROUND = 10
SLEEP_CYCLES = 4_000_000  # about 2 ms of an H100/H200's clock: longer than the host takes to queue a round


def interleaved_device_ms(runs: dict, repeats: int) -> dict:
    """Each side's median device time of one call, in ms: ``runs`` maps a side to ``(run, lib)``. In every round
    each side in turn queues a spin kernel (``lib.cuda._sleep``), then ``CALLS_PER_ROUND`` calls between two
    CUDA events of its own library: the calls are queued while the GPU spins, so the events time the GEMMs back
    to back, not the host's pace of issuing them, and alternating the sides each round spreads clock and
    temperature drift over both. A side that raises is reported as the error."""
    times: dict = {side: [] for side in runs}
    for side, (run, lib) in runs.items():
        try:
            for _ in range(3):
                run()
            lib.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 — a side that fails is reported, the others still measured
            times[side] = f"error: {type(exc).__name__}: {str(exc)[:80]}"
    for _ in range(repeats):
        for side, (run, lib) in runs.items():
            if isinstance(times[side], str):
                continue
            start, end = lib.cuda.Event(enable_timing=True), lib.cuda.Event(enable_timing=True)
            lib.cuda._sleep(SLEEP_CYCLES)
            start.record()
            for _ in range(CALLS_PER_ROUND):
                run()
            end.record()
            end.synchronize()
            times[side].append(start.elapsed_time(end) / CALLS_PER_ROUND)
    return {side: t if isinstance(t, str) else statistics.median(t) for side, t in times.items()}


# ---------------------------------------------------------------------------------------------- GEMMs

def gemm_section(repeats: int) -> list[dict]:
    import torch

    rows = []
    print("\n## FP8 and bf16 GEMMs (TFLOP/s of device time, calls queued back to back, sides interleaved; result bf16)")
    print(f"device: {tw.cuda.get_device_name()}")
    header = ("shape", "M x K x N", "tw fp8", "torch fp8", "tw bf16", "torch bf16", "fp8/bf16 (tw)",
              "tw/torch fp8")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, (m, k, n) in GEMM_SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        xa = torch.randn(m, k, device="cuda", generator=g)
        wa = torch.randn(n, k, device="cuda", generator=g)
        x8, w8 = xa.to(torch.float8_e4m3fn), wa.to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        xb, wb = xa.bfloat16(), wa.bfloat16()
        ours = {k_: tw.from_dlpack(v) for k_, v in (("x8", x8), ("w8", w8), ("one", one), ("xb", xb), ("wb", wb))}
        flops = 2 * m * n * k

        def tflops(ms, flops=flops):
            return flops / (ms * 1e-3) / 1e12

        row = {"shape": name, "mkn": (m, k, n)}
        runs = {
            "tw fp8": (lambda ours=ours: tw._scaled_mm(ours["x8"], ours["w8"].t(), ours["one"], ours["one"],
                                                       out_dtype=tw.bfloat16), tw),
            "torch fp8": (lambda x8=x8, w8=w8, one=one: torch._scaled_mm(x8, w8.t(), one, one,
                                                                          out_dtype=torch.bfloat16), torch),
            "tw bf16": (lambda ours=ours: ours["xb"].mm(ours["wb"].t()), tw),
            "torch bf16": (lambda xb=xb, wb=wb: xb.mm(wb.t()), torch),
        }
        for side, ms in interleaved_device_ms(runs, repeats).items():
            row[side] = ms if isinstance(ms, str) else tflops(ms)
        check = tw._scaled_mm(ours["x8"], ours["w8"].t(), ours["one"], ours["one"], out_dtype=tw.float32)
        ref = torch._scaled_mm(x8, w8.t(), one, one, out_dtype=torch.float32)
        row["max rel diff vs torch"] = float((torch.from_dlpack(check) - ref).abs().max() / ref.abs().max())
        rows.append(row)

        def ratio(a, b, row=row):
            return f"{row[a] / row[b]:.2f}x" if all(isinstance(row[s], float) for s in (a, b)) else "-"

        cells = [name, f"{m}x{k}x{n}"] + [f"{row[s]:.0f}" if isinstance(row[s], float) else row[s]
                                           for s in ("tw fp8", "torch fp8", "tw bf16", "torch bf16")]
        print("| " + " | ".join(cells + [ratio("tw fp8", "tw bf16"), ratio("tw fp8", "torch fp8")]) + " |")
    print("(max |ours - torch| / max |torch| of the FP8 products, float32 results: "
          + ", ".join(f"{r['shape']} {r['max rel diff vs torch']:.1e}" for r in rows) + ")")
    return rows


# ---------------------------------------------------------------------------------------------- training steps

def gpt2(lib, size: str, device: str = "cuda", layers: int | None = None):
    """``benchmarks/models/gpt2.py`` (one source for both libraries) as a model of ``lib``, in bf16 on ``device``
    (``layers``: that many blocks instead of the size's)."""
    module = module_for(HERE / "models" / "gpt2.py", lib)
    size_layers, heads, width = module.SIZES[size]
    lib.manual_seed(0)
    model = module.GPT(module.GPTConfig(vocab_size=VOCAB, block_size=1024, n_layer=layers or size_layers,
                                        n_head=heads, n_embd=width))
    return model.to(device=device, dtype=lib.bfloat16)


def not_lm_head(module, fqn: str) -> bool:
    return "lm_head" not in fqn  # tied to the token embedding; torchao's recipes keep the output layer too


def compiled_step(model, lr: float = 3e-4, loss_of=None, delayed: bool = False):
    """The whole step (forward, backward, AdamW) as one ``tw.compile``; ``loss_of(model, x, y)`` gives the loss
    (default: the model's own, ``model(x, y)``); ``delayed``: the delayed-scaling histories and scales are
    updated after the backward, inside the step."""
    opt = tw.optim.AdamW(model.parameters(), lr=lr)
    loss_of = loss_of or (lambda m, x, y: m(x, y))

    def step(x, y):
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if delayed:
            sync_float8_amax_and_scale_history(model)
        opt.step()
        return loss

    return tw.compile(step)


def time_steps(step, batches, warmup: int, sync) -> tuple[float, list[float]]:
    losses, times = [], []
    for k, (x, y) in enumerate(batches):
        started = time.perf_counter()
        loss = step(x, y)
        sync()
        if k >= warmup:
            times.append(time.perf_counter() - started)
        losses.append(float(loss.float().item()))
    return statistics.median(times) * 1e3, losses


def tilewise_side(size: str, recipe: str | None, batches, warmup: int) -> tuple[float, list[float]]:
    """Our compiled step in bf16 (``recipe`` None) or with FP8 Linear layers of a recipe ("tensorwise": current
    scaling, "delayed": delayed scaling)."""
    model = gpt2(tw, size)
    if recipe is not None:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=not_lm_head)
    return time_steps(compiled_step(model, delayed=recipe == "delayed"), batches, warmup, tw.cuda.synchronize)


def torchao_side(size: str, batches, warmup: int):
    """torchao's float8 training of the same model in torch (torch.compile'd model, fused AdamW), or the reason
    it cannot run."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed: no torch FP8 training peer in this run"
    import torch
    from torchao.float8 import convert_to_float8_training as ao_convert

    model = gpt2(torch, size)
    ao_convert(model, module_filter_fn=not_lm_head)
    model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    torch_batches = [(torch.from_dlpack(x), torch.from_dlpack(y)) for x, y in batches]
    return time_steps(step, torch_batches, warmup, torch.cuda.synchronize)


def step_section(sizes: list[str], steps: int, warmup: int, batch: int) -> list[dict]:
    print(f"\n## GPT-2 compiled training steps, bf16 parameters, batch {batch}x1024, AdamW "
          f"(median of {steps - warmup} steps after {warmup})")
    print("| model | side | ms/step | tokens/s | vs tw bf16 | first loss | last loss |\n|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        gen = tw.Generator(device="cuda").manual_seed(1)
        batches = []
        for _ in range(steps):
            x = tw.randint(0, VOCAB, (batch, 1024), device="cuda", generator=gen)
            batches.append((x, x.roll(-1, 1)))
        results = {}
        for side, run in (("tw bf16", functools.partial(tilewise_side, size, None, batches, warmup)),
                          ("tw fp8", functools.partial(tilewise_side, size, "tensorwise", batches, warmup)),
                          ("tw fp8 delayed", functools.partial(tilewise_side, size, "delayed", batches, warmup)),
                          ("torchao fp8", functools.partial(torchao_side, size, batches, warmup))):
            try:
                results[side] = run()
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc(limit=3)
                results[side] = f"error: {type(exc).__name__}: {str(exc)[:100]}"
        base = results["tw bf16"][0] if isinstance(results["tw bf16"], tuple) else None
        for side, res in results.items():
            if isinstance(res, str):
                print(f"| {size} | {side} | {res} | | | | |")
                continue
            ms, losses = res
            speed = f"{base / ms:.2f}x" if base else "-"
            print(f"| {size} | {side} | {ms:.1f} | {batch * 1024 / ms * 1e3:,.0f} | {speed} | {losses[0]:.4f} | "
                  f"{losses[-1]:.4f} |")
            rows.append({"model": size, "side": side, "ms": ms, "losses": losses})
    return rows


# ---------------------------------------------------------------------------------------------- lowering

@dataclass
class LoweredStep:
    """One side's compiled step lowered for CUDA: per generated kernel its name (the operators it fuses, without
    its index), bytes moved and whether it writes float8; per library call its operator and bytes."""

    kernels: list[tuple[str, int, bool]] = field(default_factory=list)
    calls: list[tuple[str, int]] = field(default_factory=list)

    def kernel_bytes(self) -> int:
        return sum(b for _, b, _ in self.kernels)


def _call_bytes(node) -> int:
    outputs = node.type if node.is_tuple else (node.type,)
    return sum(s.type.nbytes for s in node.srcs if not s.is_tuple) + sum(t.nbytes for t in outputs if t is not None)


def lowered_step(size: str, recipe: str | None, batch: int, layers: int | None) -> LoweredStep:
    """The compiled step of ``tilewise_side`` (``recipe`` None: bf16) lowered for the CUDA target from CPU tensors
    (see the module note); a delayed recipe's step as every step after the first sync runs (its casts take the
    synced scales)."""
    from tilewise.compiler.lowering.memory import steps_of
    from tilewise.compiler.targets import get_target
    from tilewise.profiler.roofline import kernel_bytes

    model = gpt2(tw, size, device="cpu", layers=layers)
    if recipe is not None:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=not_lm_head)
    if recipe == "delayed":
        sync_float8_amax_and_scale_history(model)  # (the scales' values do not change the kernels)
    x = tw.randint(0, VOCAB, (batch, 1024), generator=tw.Generator().manual_seed(1))
    _, programs, _ = compiled_step(model, delayed=recipe == "delayed").lowered(get_target("cuda"), x, x.roll(-1, 1))
    out = LoweredStep()
    for low in programs:
        for node in steps_of(low.fused):
            kernel = low.kernels.get(node)
            if kernel is None:
                out.calls.append((node.op, _call_bytes(node)))
                continue
            writes_fp8 = any(p.written and p.dtype.is_float8 for p in kernel.params)
            out.kernels.append((re.sub(r"^k\d+_", "", kernel.name), kernel_bytes(kernel), writes_fp8))
    return out


LOWERED_SIDES = {"bf16": None, "fp8": "tensorwise", "fp8 delayed": "delayed"}  # side: its FP8 recipe


def _fp8_role(name: str, writes_fp8: bool) -> str:
    if writes_fp8:
        return "kernels that write float8 (casts, alone or in the kernel making the tensor, and transposed copies)"
    if name.startswith("amax_") or "_amax_" in name and "clamp_rdiv" in name:
        return "amax reductions that end in a scale"
    return ""


@contextlib.contextmanager
def cudnn_assumed(assume: bool):
    """Lowering as on a GPU host, where the cuDNN frontend imports: attention is kept whole (nothing is built)."""
    from tilewise.backends.cuda import cudnn

    saved = cudnn.unavailable
    if assume:
        cudnn.unavailable = lambda: None
    try:
        yield
    finally:
        cudnn.unavailable = saved


def lowering_section(sizes: list[str], batch: int, layers: int | None, cudnn_attention: bool = False) -> list[dict]:
    from tilewise.backends.cuda import cudnn

    gb = 1e-9
    attention = "cuDNN" if cudnn_attention or cudnn.unavailable() is None else "decomposed"
    print(f"\n## GPT-2 compiled training steps lowered for CUDA (generated, not run), batch {batch}x1024, attention "
          f"{attention}" + (f", {layers} layer(s) of each model" if layers else ""))
    print("| model | side | generated kernels | library calls | GB moved by kernels | GB read and written by "
          "library calls |\n|---|---|---|---|---|---|")
    rows, sides = [], {}
    for size in sizes:
        for side, recipe in LOWERED_SIDES.items():
            with cudnn_assumed(cudnn_attention):
                low = sides[size, side] = lowered_step(size, recipe, batch, layers)
            calls = Counter(op for op, _ in low.calls)
            print(f"| {size} | {side} | {len(low.kernels)} | {len(low.calls)} ("
                  + ", ".join(f"{op} x{n}" for op, n in calls.most_common()) + f") | {low.kernel_bytes() * gb:.2f} | "
                  f"{sum(b for _, b in low.calls) * gb:.2f} |")
            rows.append({"model": size, "side": side, "kernels": len(low.kernels), "calls": dict(calls),
                         "kernel_bytes": low.kernel_bytes(), "call_bytes": sum(b for _, b in low.calls)})
    for size in sizes:
        bf16 = sides[size, "bf16"]
        n_layers = layers or module_for(HERE / "models" / "gpt2.py", tw).SIZES[size][0]
        for side in list(LOWERED_SIDES)[1:]:
            fp8 = sides[size, side]
            extra_k, extra_b = len(fp8.kernels) - len(bf16.kernels), fp8.kernel_bytes() - bf16.kernel_bytes()
            print(f"\n{size}, {side}: FP8 adds {extra_k} generated kernels ({extra_k / n_layers:.1f} a layer) moving "
                  f"{extra_b * gb:+.2f} GB ({extra_b * gb / n_layers:+.3f} GB a layer); among its kernels:")
            roles: dict[str, list[int]] = {}
            for name, nbytes, writes_fp8 in fp8.kernels:
                role = _fp8_role(name, writes_fp8)
                if role:
                    roles.setdefault(role, []).append(nbytes)
            for role, sizes_ in roles.items():
                print(f"- {role}: {len(sizes_)} kernels, {sum(sizes_) * gb:.2f} GB")
        print(f"\n| kernel of {size} (the operators it fuses) | " + " | ".join(
            f"{side} count | {side} GB" for side in LOWERED_SIDES) + " |\n|---|" + "---:|---:|" * len(LOWERED_SIDES))
        table: dict[str, list] = {}
        for k, side in enumerate(LOWERED_SIDES):
            for name, nbytes, _ in sides[size, side].kernels:
                entry = table.setdefault(name, [0, 0] * len(LOWERED_SIDES))
                entry[2 * k] += 1
                entry[2 * k + 1] += nbytes
        for name, entry in sorted(table.items(), key=lambda item: -max(item[1][1::2])):
            cells = [f"{n} | {b * gb:.3f}" if n else " | " for n, b in zip(entry[::2], entry[1::2])]
            print(f"| {name} | " + " | ".join(cells) + " |")
    return rows


# ---------------------------------------------------------------------------------------------- loss curves

def float32_loss(model, x, y):
    """The char-GPT's cross entropy taken in float32 on its bf16 logits (a bf16 loss moves in steps of 0.4%)."""
    logits, _ = model(x)
    return tw.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def curve_section(steps: int, size: str, out: Path, device: str) -> dict:
    from tilewise.data import load_text
    from tilewise.models.demo import MODEL_SIZES, Batches
    from tilewise.models.gpt import CharTokenizer

    text = load_text("kjv")
    tokenizer = CharTokenizer(text)
    ids = tw.from_numpy(np.asarray(tokenizer.encode(text), dtype=np.int64)).to(device)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **MODEL_SIZES[size])
    batch = 32
    tw.manual_seed(0)
    base = GPT(config).to(device, tw.bfloat16)
    curves = {}
    for side in ("bf16", "fp8"):
        model = copy.deepcopy(base)
        if side == "fp8":
            convert_to_float8_training(model, module_filter_fn=not_head)
        step = compiled_step(model, lr=1e-3, loss_of=float32_loss)
        batches = Batches(ids, config.block_size, batch, tw.Generator(device=device).manual_seed(2))
        curves[side] = [float(step(*batches.next()).float().item()) for _ in range(steps)]
    tail = max(1, steps // 10)
    final = {side: float(np.mean(c[-tail:])) for side, c in curves.items()}
    diff = (final["fp8"] - final["bf16"]) / final["bf16"]
    print(f"\n## Loss curves, char-GPT '{size}' on the demo text, {steps} steps, batch {batch}x{config.block_size}, "
          f"bf16 parameters, AdamW 1e-3 ({device})")
    print(f"final loss (mean of the last {tail} steps): bf16 {final['bf16']:.4f}, fp8 {final['fp8']:.4f}, "
          f"fp8 relative to bf16 {diff:+.2%}")
    out.mkdir(parents=True, exist_ok=True)
    record = {"steps": steps, "size": size, "device": device, "losses": curves, "final": final}
    (out / "lowprec_curve.json").write_text(json.dumps(record))
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        for side, color in (("bf16", "#1f5f99"), ("fp8", "#d1495b")):
            ax.plot(np.arange(1, steps + 1), curves[side], color=color, linewidth=1.0, label=side)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats / character)")
        ax.set_title(f"FP8 vs bf16 training, char-GPT '{size}' ({device})")
        ax.legend(frameon=False)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "lowprec_curve.png")
        plt.close(fig)
        print(f"wrote {out / 'lowprec_curve.json'} and {out / 'lowprec_curve.png'}")
    except ImportError:
        print(f"wrote {out / 'lowprec_curve.json'} (matplotlib is not installed: no PNG)")
    return record


def quant_section() -> None:
    path = HERE / "lowprec_quant.py"
    if not path.exists():
        return
    spec = importlib.util.spec_from_file_location("lowprec_quant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main_section()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("gemm", "step", "lowering", "curve"))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--models", default="124M,350M")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, help="lowering: this many layers of each model instead of all")
    p.add_argument("--cudnn-attention", action="store_true",
                   help="lowering: keep attention whole, as where the cuDNN frontend imports")
    p.add_argument("--curve", type=int, default=300)
    p.add_argument("--curve-size", default="medium")
    p.add_argument("--device", default="cuda", help="the curve's device (the other sections need CUDA)")
    p.add_argument("--out", type=Path, default=Path("lowprec_out"))
    args = p.parse_args(argv)
    if args.only in (None, "gemm"):
        gemm_section(args.repeats)
    if args.only in (None, "step"):
        step_section(args.models.split(","), args.steps, args.warmup, args.batch)
    if args.only == "lowering":
        lowering_section(args.models.split(","), args.batch, args.layers, args.cudnn_attention)
    if args.only in (None, "curve") and args.curve > 0:
        curve_section(args.curve, args.curve_size, args.out, args.device)
    if args.only is None:
        quant_section()


if __name__ == "__main__":
    main()
