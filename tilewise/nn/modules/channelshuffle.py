"""ChannelShuffle: interleave the channels of ``groups`` groups (ShuffleNet)."""

from __future__ import annotations

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.tensor import Tensor


class ChannelShuffle(Module):
    """Channels ``(g, c)`` become ``(c, g)``: with 2 groups of [0, 1, 2 | 3, 4, 5], the order 0, 3, 1, 4, 2, 5.

    >>> import tilewise as tw
    >>> tw.nn.ChannelShuffle(2)(tw.arange(4.0).reshape(1, 4, 1)).flatten().tolist()
    [0.0, 2.0, 1.0, 3.0]
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, input: Tensor) -> Tensor:
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"
