"""A small GPT (decoder-only Transformer) written with tilewise.nn, and a character-level tokenizer.

The architecture is GPT-2's at toy scale: token and position embeddings, pre-norm blocks of causal
multi-head self-attention and a GELU MLP with residual connections, a final LayerNorm, and an output
head tied to the token embedding. Initialisation follows GPT-2 (N(0, 0.02), residual projections scaled
by 1/sqrt(2 * n_layer)), which matters more than usual at this size: it is what lets a few hundred steps
on a CPU get well below a unigram model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tilewise import nn
from tilewise.autograd.grad_mode import no_grad
from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.ops.creation import arange
from tilewise.ops.functions import cat
from tilewise.tensor import Tensor, tensor


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")
        self.n_head, self.dropout = config.n_head, config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        heads = self.qkv(x).view(batch, length, 3, self.n_head, width // self.n_head).permute(2, 0, 3, 1, 4)
        q, k, v = heads[0], heads[1], heads[2]
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """``GPT(config)(idx, targets)`` returns ``(logits, loss)``; ``loss`` is None without targets.

    >>> import tilewise as tw
    >>> from tilewise.models import GPT, GPTConfig
    >>> model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16))
    >>> logits, loss = model(tw.zeros(2, 8, dtype=tw.int64), tw.zeros(2, 8, dtype=tw.int64))
    >>> logits.shape, loss.shape
    (tilewise.Size([2, 8, 10]), tilewise.Size([]))
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        length = idx.shape[1]
        if length > self.config.block_size:
            raise ValueError(f"sequence of length {length} is longer than block_size {self.config.block_size}")
        positions = arange(length, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator=None) -> Tensor:
        """Extend ``idx`` (batch, length) by sampling ``max_new_tokens`` tokens, one at a time."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits, _ = self(context)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1)[0][:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, -1)
            idx = cat([idx, probs.multinomial(1, generator=generator)], 1)
        return idx


class CharTokenizer:
    """Characters to integer ids and back, over the sorted set of characters in a text.

    >>> tok = CharTokenizer("hello")
    >>> tok.encode("hole"), tok.decode(tok.encode("hole"))
    ([1, 3, 2, 0], 'hole')
    """

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self._ids = {c: k for k, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        missing = sorted(set(text) - self._ids.keys())
        if missing:
            raise ValueError(f"characters not in the vocabulary: {missing!r}")
        return [self._ids[c] for c in text]

    def encode_tensor(self, text: str, device=None) -> Tensor:
        from tilewise import dtypes

        return tensor(self.encode(text), dtype=dtypes.int64, device=device)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(k)] for k in ids)
