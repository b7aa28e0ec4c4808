"""Dropout: zero each element with probability ``p`` while training, scaling the rest by ``1 / (1 - p)``."""

from __future__ import annotations

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.tensor import Tensor


class Dropout(Module):
    _functional = "dropout"

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._functional)(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """Zero whole channels of ``(N, C, L)`` inputs."""

    _functional = "dropout1d"


class Dropout2d(Dropout):
    """Zero whole channels of ``(N, C, H, W)`` inputs."""

    _functional = "dropout2d"


class Dropout3d(Dropout):
    """Zero whole channels of ``(N, C, D, H, W)`` inputs."""

    _functional = "dropout3d"


class AlphaDropout(Dropout):
    """Dropout that keeps SELU's self-normalisation: dropped elements take SELU's negative saturation value and an
    affine map restores zero mean and unit variance."""

    _functional = "alpha_dropout"


class FeatureAlphaDropout(Dropout):
    """Alpha dropout of whole channels (dim 1)."""

    _functional = "feature_alpha_dropout"
