"""Block-scaled MXFP8 / NVFP4 quantization: kernel bandwidth, quantization error, memory, perplexity.

    python benchmarks/lowprec_quant.py [--steps 200] [--no-gpu]

Sections (``main_section`` prints them all; each figure is measured in this process):
1. Quantize/dequantize kernel bandwidth (GPU only): bytes each kernel must move over its median time, beside
   the copy bandwidth of a same-sized bf16 tensor (ours and torch's ``clone``); the target is >= 85% of copy.
2. Quantization error (RMS, max) and bytes of GPT-2-shaped weights (768 / 3072 features, values drawn as
   GPT-2 initialises them, N(0, 0.02)), against bf16 bytes, beside torch's per-tensor float8_e4m3fn cast (the
   scaling torch itself ships) as the peer.
3. Perplexity on the validation text of a small character GPT trained here on the demo text (CPU), with float
   weights and after ``tilewise.quant.quantize_`` in each format (weight-only).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402
import tilewise.quant  # noqa: E402,F401
from tilewise.data import load_text  # noqa: E402
from tilewise.models.gpt import GPT, CharTokenizer, GPTConfig  # noqa: E402

FORMATS = ("mxfp8", "nvfp4")
GPT2_WEIGHTS = {"attn.c_attn": (2304, 768), "attn.c_proj": (768, 768), "mlp.c_fc": (3072, 768),
                "mlp.c_proj": (768, 3072)}  # (out_features, in_features)


# ---------------------------------------------------------------- 1. bandwidth (GPU)

def _moved_bytes(fmt: str, numel: int, direction: str) -> int:
    """Bytes a kernel must read and write, once each, for ``numel`` bf16 values."""
    block = 32 if fmt == "mxfp8" else 16
    packed = numel if fmt == "mxfp8" else numel // 2
    scales = numel // block
    low = packed + scales + (4 if fmt == "nvfp4" else 0)
    return 2 * numel + low  # quantize reads bf16 and writes the rest; dequantize the other way round


def bandwidth_section(numel: int = 1 << 27) -> list[str]:
    from cuda_eager import torch_ms, tw_ms

    x = tw.randn(numel // 4096, 4096, device="cuda", dtype=tw.bfloat16)
    theirs = torch.randn(numel // 4096, 4096, device="cuda", dtype=torch.bfloat16)
    copy_ours = 4 * numel / tw_ms(lambda: x.clone()) / 1e6
    copy_torch = 4 * numel / torch_ms(lambda: theirs.clone()) / 1e6
    lines = [f"## Quantize / dequantize bandwidth ({numel / 1e6:.0f}M bf16 values, {tw.cuda.get_device_name()})",
             f"copy (clone, bf16): ours {copy_ours:.0f} GB/s, torch {copy_torch:.0f} GB/s",
             "| kernel | GB/s | of our copy | of torch's copy |", "|---|---|---|---|"]
    for fmt in FORMATS:
        q = tw.quantize(x, fmt)
        for direction, fn in (("quantize", lambda fmt=fmt: tw.quantize(x, fmt)),
                              ("dequantize", lambda q=q: tw.dequantize(q, tw.bfloat16))):
            gbs = _moved_bytes(fmt, numel, direction) / tw_ms(fn) / 1e6
            lines.append(f"| {fmt} {direction} | {gbs:.0f} | {gbs / copy_ours:.0%} | {gbs / copy_torch:.0%} |")
    lines.append("nvfp4 quantize includes its amax pass over the input (a second read), counted as time only")
    return lines


# ---------------------------------------------------------------- 2. error and bytes

def _torch_per_tensor_e4m3(w: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(w)
    scale = 448.0 / t.abs().max()
    return ((t * scale).to(torch.float8_e4m3fn).float() / scale).numpy()


def error_section(seed: int = 0, weights: dict | None = None) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = ["## Quantization error of GPT-2-shaped weights (N(0, 0.02)); bytes against bf16",
             "| weight [out, in] | format | RMS error | max error | RMS / RMS(w) | bytes vs bf16 |",
             "|---|---|---|---|---|---|"]
    for name, shape in (weights or GPT2_WEIGHTS).items():
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        rms_w = float(np.sqrt((w**2).mean()))
        rows = [(fmt, tw.quantize(tw.from_numpy(w), fmt)) for fmt in FORMATS]
        for fmt, q in rows:
            err = tw.dequantize(q).numpy() - w
            rms = float(np.sqrt((err**2).mean()))
            lines.append(f"| {name} {list(shape)} | {fmt} | {rms:.3e} | {float(np.abs(err).max()):.3e} | "
                         f"{rms / rms_w:.2%} | {q.nbytes / (w.size * 2):.3f}x |")
        err = _torch_per_tensor_e4m3(w) - w
        lines.append(f"| {name} {list(shape)} | torch e4m3 per-tensor | {float(np.sqrt((err**2).mean())):.3e} | "
                     f"{float(np.abs(err).max()):.3e} | {float(np.sqrt((err**2).mean())) / rms_w:.2%} | 0.500x |")
    return lines


# ---------------------------------------------------------------- 3. perplexity

def _batches(ids: np.ndarray, block: int, batch: int, rng: np.random.Generator):
    starts = rng.integers(0, len(ids) - block - 1, batch)
    x = np.stack([ids[s:s + block] for s in starts])
    y = np.stack([ids[s + 1:s + block + 1] for s in starts])
    return tw.from_numpy(x), tw.from_numpy(y)


@tw.no_grad()
def _val_loss(model: GPT, batches: list) -> float:
    model.eval()
    return float(np.mean([model(x, y)[1].item() for x, y in batches]))


def perplexity_section(steps: int = 200, seed: int = 1337) -> list[str]:
    tw.manual_seed(seed)
    text = load_text("kjv")
    tokenizer = CharTokenizer(text)
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    split = int(0.9 * len(ids))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, n_embd=64, block_size=64)
    model = GPT(config)
    optimizer = tw.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    for _ in range(steps):
        x, y = _batches(ids[:split], config.block_size, 32, rng)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - started
    val_rng = np.random.default_rng(seed + 1)
    val = [_batches(ids[split:], config.block_size, 32, val_rng) for _ in range(16)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    lines = [f"## Perplexity of a char GPT ({model.num_parameters() / 1e3:.0f}k parameters, {steps} CPU steps in "
             f"{seconds:.0f} s) on the validation text, weight-only quantization of every Linear",
             "| weights | val loss (nats/char) | perplexity | Linear weight bytes |", "|---|---|---|---|"]
    linear_bytes = sum(m.weight.numel() * 2 for m in model.modules() if isinstance(m, tw.nn.Linear))
    loss = _val_loss(model, val)
    lines.append(f"| float32 (bytes as bf16) | {loss:.4f} | {math.exp(loss):.3f} | {linear_bytes} |")
    for fmt in FORMATS:
        quantized = GPT(config)
        quantized.load_state_dict(state)
        tw.quant.quantize_(quantized, fmt)
        loss = _val_loss(quantized, val)
        nbytes = sum(m.weight_nbytes for m in quantized.modules() if isinstance(m, tw.quant.QuantizedLinear))
        lines.append(f"| {fmt} | {loss:.4f} | {math.exp(loss):.3f} | {nbytes} |")
    lines.append("torch peer: torch 2.13 ships no MXFP8/NVFP4 weight-only Linear (torchao is not a dependency)")
    return lines


def main_section(steps: int = 200, gpu: bool | None = None) -> str:
    gpu = tw.cuda.is_available() and torch.cuda.is_available() if gpu is None else gpu
    sections = [bandwidth_section()] if gpu else [["## Quantize / dequantize bandwidth: no GPU here, not measured"]]
    sections += [error_section(), perplexity_section(steps)]
    return "\n\n".join("\n".join(lines) for lines in sections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="CPU training steps of the perplexity model")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU bandwidth section")
    args = parser.parse_args()
    print(main_section(args.steps, False if args.no_gpu else None))


if __name__ == "__main__":
    main()
