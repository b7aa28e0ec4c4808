"""ViT-B/16 as people write it for PyTorch: a 16x16 stride-16 convolution as the patch embedding, a class token and
a learned position embedding, pre-norm encoder blocks of ``nn.MultiheadAttention`` and a GELU MLP, a final
LayerNorm and a linear head on the class token.

One source for both libraries: it imports ``tilewise as torch``; with ``torch`` in its import lines
(``benchmarks/torch_source.py``) it is a PyTorch program, so both sides run the same code from the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import tilewise as torch
import tilewise.nn as nn
import tilewise.nn.functional as F


@dataclass
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    num_classes: int = 1000
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_dim: int = 3072


SIZES = {"B/16": (12, 12, 768, 3072), "L/16": (24, 16, 1024, 4096)}  # layers, heads, width, MLP width


class EncoderBlock(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(config.n_embd, config.n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, config.mlp_dim), nn.GELU(),
                                 nn.Linear(config.mlp_dim, config.n_embd))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.conv_proj = nn.Conv2d(3, config.n_embd, kernel_size=config.patch_size, stride=config.patch_size)
        patches = (config.image_size // config.patch_size) ** 2
        self.class_token = nn.Parameter(torch.zeros(1, 1, config.n_embd))
        self.pos_embedding = nn.Parameter(torch.empty(1, patches + 1, config.n_embd).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(config) for _ in range(config.n_layer)])
        self.ln = nn.LayerNorm(config.n_embd, eps=1e-6)
        self.head = nn.Linear(config.n_embd, config.num_classes)

    def forward(self, images, labels):
        x = self.conv_proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return F.cross_entropy(self.head(x[:, 0]), labels)
