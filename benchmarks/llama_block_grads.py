"""The Llama block (``models/llama.py``) and its pieces compiled against eager, forward and backward, under bf16
autocast and in float32: for each piece the largest relative differences, max |compiled - eager| / max |eager|,
of its output, of its inputs' gradients (``arg0``, ...) and of its parameters' gradients, worst first.

The pieces: RMSNorm, the SwiGLU feed-forward, rotary embeddings, grouped-query ``repeat_interleave`` with causal
``scaled_dot_product_attention``, the attention module, and the whole block (two residual adds around them). A
piece is ``loss = sum(y.float() * r)`` for a fixed random ``r``, its ``backward()`` inside the compiled function. On
CUDA the 125M Llama's block (width 768, 12 heads, 4 key/value heads, SwiGLU 2048) over 4 x 256 tokens; on the
CPU the same block over 32 tokens.

    python benchmarks/llama_block_grads.py [--device cuda|cpu] [--pieces block,attention] [--dtypes bf16,fp32]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tilewise as tw

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from torch_source import module_for  # noqa: E402

L = module_for(HERE / "models" / "llama.py", tw)
PIECES = ("rmsnorm", "ffn", "rope", "repeat+sdpa", "attention", "block")


def config(width: int = 768, heads: int = 12, kv_heads: int = 4, hidden: int = 2048, tokens: int = 256):
    return L.LlamaConfig(vocab_size=512, block_size=tokens, n_layer=1, n_head=heads, n_kv_head=kv_heads,
                         n_embd=width, hidden=hidden)


class Case:
    """One block's weights, rotary tables and inputs on ``device``, and the pieces as (function, inputs)."""

    def __init__(self, cfg, device: str, batch: int, tokens: int) -> None:
        tw.manual_seed(0)
        self.device = device
        self.block = L.Block(cfg).to(device)
        cos, sin = L.rope_cache(cfg)
        cos, sin = cos[:tokens].to(device), sin[:tokens].to(device)
        self.rng = np.random.default_rng(0)
        heads, kv, dim = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        x = self.tensor(batch, tokens, cfg.n_embd)
        q, k, v = self.tensor(batch, tokens, heads, dim), self.tensor(batch, kv, tokens, dim), \
            self.tensor(batch, kv, tokens, dim)
        block, repeats = self.block, heads // kv

        def sdpa(q, k, v):
            return tw.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1),
                is_causal=True)

        self.pieces: dict[str, tuple[Callable, tuple]] = {
            "rmsnorm": (lambda x: block.attention_norm(x), (x,)),
            "ffn": (lambda x: block.feed_forward(x), (x,)),
            "rope": (lambda q: L.apply_rotary(q.transpose(1, 2), cos, sin), (q,)),
            "repeat+sdpa": (sdpa, (q, k, v)),
            "attention": (lambda x: block.attention(x, cos, sin), (x,)),
            "block": (lambda x: block(x, cos, sin), (x,)),
        }
        self.probes: dict[tuple, tw.Tensor] = {}

    def tensor(self, *shape: int) -> tw.Tensor:
        data = self.rng.standard_normal(shape).astype(np.float32)
        return tw.tensor(data, device=self.device, requires_grad=True)

    def probe(self, shape: tuple) -> tw.Tensor:
        if shape not in self.probes:
            data = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
            self.probes[shape] = tw.tensor(data, device=self.device)
        return self.probes[shape]

    def run(self, name: str, compiled: bool, bf16: bool) -> dict[str, np.ndarray]:
        """The piece's output and every gradient, by label, eager or compiled."""
        fn, args = self.pieces[name]
        params = list(self.block.named_parameters())
        for a in args:
            a.grad = None
        for _, p in params:
            p.grad = None

        def step(*a):
            with tw.autocast(self.device, dtype=tw.bfloat16, enabled=bf16):
                y = fn(*a)
            (y.float() * self.probe(tuple(y.shape))).sum().backward()
            return y.float()

        y = (tw.compile(step) if compiled else step)(*args)
        found = {"out": y.detach().cpu().numpy()}
        found.update({f"arg{k}": a.grad.float().cpu().numpy() for k, a in enumerate(args)})
        found.update({n: p.grad.float().cpu().numpy() for n, p in params if p.grad is not None})
        return found

    def differences(self, name: str, bf16: bool) -> list[tuple[float, str]]:
        """(max |compiled - eager| / max |eager|, label) for the output and each gradient, worst first."""
        eager, compiled = self.run(name, False, bf16), self.run(name, True, bf16)
        worst = [(float(np.abs(compiled[k] - e).max() / (np.abs(e).max() + 1e-30)), k) for k, e in eager.items()]
        return sorted(worst, reverse=True)


def default_case(device: str) -> Case:
    return Case(config(), device, *((4, 256) if device == "cuda" else (1, 32)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--pieces", default=",".join(PIECES))
    parser.add_argument("--dtypes", default="bf16,fp32")
    args = parser.parse_args(argv)
    case = default_case(args.device)
    for dtype in args.dtypes.split(","):
        for name in args.pieces.split(","):
            worst = case.differences(name, dtype == "bf16")
            print(f"{dtype} {name:12s}", " ".join(f"{label}={rel:.1e}" for rel, label in worst[:4]), flush=True)


if __name__ == "__main__":
    main()
