"""Padding layers over ``F.pad``."""

from __future__ import annotations

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.tensor import Tensor


class ZeroPad2d(Module):
    """Pad the last two dims with zeros: ``padding`` is an int or ``(left, right, top, bottom)``."""

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = (padding,) * 4 if isinstance(padding, int) else tuple(padding)

    def forward(self, input: Tensor) -> Tensor:
        return F.pad(input, self.padding)

    def extra_repr(self) -> str:
        return f"{self.padding}"
