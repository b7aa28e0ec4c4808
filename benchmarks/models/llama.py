"""A Llama-style decoder as people write it for PyTorch: RMSNorm written out (``x * rsqrt(mean(x^2) + eps) * w``),
rotary position embeddings applied to queries and keys in the complex-free cos/sin form (``rotate_half``),
grouped-query attention (fewer key/value heads than query heads, repeated with ``repeat_interleave``), causal
``F.scaled_dot_product_attention``, a SwiGLU MLP (``w2(silu(w1 x) * w3 x)``) and no biases anywhere; an untied LM
head and cross entropy on the logits.

One source for both libraries: it imports ``tilewise as torch``; with ``torch`` in its import lines
(``benchmarks/torch_source.py``) it is a PyTorch program, so both sides run the same code from the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import tilewise as torch
import tilewise.nn as nn
import tilewise.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 4
    n_embd: int = 768
    hidden: int = 2048  # SwiGLU width: about 8/3 of n_embd, rounded as Llama rounds it
    rope_theta: float = 10000.0
    eps: float = 1e-5


# layers, heads, key/value heads, width, SwiGLU width: 125M and 340M parameters with a 32000-token vocabulary
SIZES = {"125M": (12, 12, 4, 768, 2048), "340M": (24, 16, 4, 1024, 2816)}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cache(config: LlamaConfig):
    head_dim = config.n_embd // config.n_head
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(config.block_size).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.wq = nn.Linear(config.n_embd, config.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(config.n_embd, config.n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(config.n_embd, config.n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_head * self.head_dim, config.n_embd, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q = self.wq(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeats = self.n_head // self.n_kv_head
        k = k.repeat_interleave(repeats, dim=1)
        v = v.repeat_interleave(repeats, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).contiguous().view(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.n_embd, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.n_embd, bias=False)
        self.w3 = nn.Linear(config.n_embd, config.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.n_embd, config.eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.n_embd, config.eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.norm = RMSNorm(config.n_embd, config.eps)
        self.output = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = rope_cache(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
