"""Local response normalization across channels: LocalResponseNorm, and the legacy CrossMapLRN2d."""

from __future__ import annotations

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor


class LocalResponseNorm(Module):
    """``x / (k + alpha / size * sum of x^2 over the size neighbouring channels) ** beta``.

    >>> import tilewise as tw
    >>> tw.nn.LocalResponseNorm(2)(tw.ones(1, 3, 2)).shape
    tilewise.Size([1, 3, 2])
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input: Tensor) -> Tensor:
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class CrossMapLRN2d(LocalResponseNorm):
    """torch's legacy cross-channel LRN of (N, C, H, W) inputs, with its own window (see ``_cross_map_lrn2d``)."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1) -> None:
        super().__init__(size, alpha, beta, k)

    def forward(self, input: Tensor) -> Tensor:
        return OPS["_cross_map_lrn2d"](input, self.size, self.alpha, self.beta, self.k)
