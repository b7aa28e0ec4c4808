"""Convolutions: Conv1d and Conv2d over ``F.conv1d``/``F.conv2d``, with torch's initialisation and padding modes."""

from __future__ import annotations

import math

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn import init
from tilewise.nn.modules.module import Module
from tilewise.nn.parameter import Parameter
from tilewise.ops.creation import empty
from tilewise.tensor import Tensor

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _tuple(value, n: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n:
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {value}")
    return value


class _ConvNd(Module):
    _dims: int
    _functional: str

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__()
        n = self._dims
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{type(self).__name__}: in_channels ({in_channels}) and out_channels ({out_channels}) "
                             f"must both be divisible by groups ({groups})")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {_PADDING_MODES}, but got padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride = _tuple(stride, n, "stride")
        self.dilation = _tuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of 'valid', 'same'")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _tuple(padding, n, "padding")
        self.padding_mode = padding_mode
        self.weight = Parameter(empty(out_channels, in_channels // groups, *self.kernel_size, device=device,
                                      dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _explicit_padding(self) -> list[int]:
        """F.pad's (last dim first) amounts for this layer's padding."""
        if self.padding == "valid":
            return [0, 0] * self._dims
        if self.padding == "same":
            amounts = []
            for d, k in zip(reversed(self.dilation), reversed(self.kernel_size)):
                total = d * (k - 1)
                amounts += [total // 2, total - total // 2]
            return amounts
        return [p for p in reversed(self.padding) for _ in range(2)]

    def forward(self, input: Tensor) -> Tensor:
        conv = getattr(F, self._functional)
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._explicit_padding(), mode=self.padding_mode)
            return conv(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._dims:
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class Conv1d(_ConvNd):
    """1-D convolution over ``(N, C, L)`` (or unbatched ``(C, L)``) inputs."""

    _dims = 1
    _functional = "conv1d"


class Conv2d(_ConvNd):
    """2-D convolution over ``(N, C, H, W)`` (or unbatched ``(C, H, W)``) inputs.

    >>> import tilewise as tw
    >>> tw.nn.Conv2d(3, 8, 3, padding=1)(tw.ones(2, 3, 5, 5)).shape
    tilewise.Size([2, 8, 5, 5])
    """

    _dims = 2
    _functional = "conv2d"
