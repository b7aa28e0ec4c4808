"""Convolutions: Conv1d/2d/3d and ConvTranspose1d/2d/3d over the convolution functionals, with torch's parameter
shapes, initialisation, padding modes and ``output_size`` argument (so a torch state dict loads unchanged)."""

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

    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None,
                 output_padding=0) -> None:
        super().__init__()
        n = self._dims
        if groups <= 0:
            raise ValueError(f"groups must be a positive integer, got groups={groups}")
        if in_channels % groups:
            raise ValueError(f"in_channels must be divisible by groups, got in_channels={in_channels} and "
                             f"groups={groups}")
        if out_channels % groups:
            raise ValueError(f"out_channels must be divisible by groups, got out_channels={out_channels} and "
                             f"groups={groups}")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {{{', '.join(map(repr, _PADDING_MODES))}}}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride = _tuple(stride, n, "stride")
        self.dilation = _tuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'same', 'valid'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _tuple(padding, n, "padding")
        self.transposed = self._transposed
        self.output_padding = _tuple(output_padding, n, "output_padding")
        self.padding_mode = padding_mode
        self._reversed_padding_repeated_twice = self._explicit_padding()
        shape = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        self.weight = Parameter(empty(*shape, *self.kernel_size, device=device, dtype=dtype))
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

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """The convolution with the given weight and bias (torch's hook for layers that transform the weight)."""
        conv = getattr(F, self._functional)
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._dims:
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self._dims:
            text += f", output_padding={self.output_padding}"
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


class Conv3d(_ConvNd):
    """3-D convolution over ``(N, C, D, H, W)`` (or unbatched ``(C, D, H, W)``) inputs."""

    _dims = 3
    _functional = "conv3d"


class _ConvTransposeNd(_ConvNd):
    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype, output_padding)

    def _output_padding(self, input: Tensor, output_size, stride, padding, kernel_size, num_spatial_dims: int,
                        dilation=None) -> tuple[int, ...]:
        """The output padding that gives ``output_size`` (torch's rule and signature), or the layer's own."""
        if output_size is None:
            return self.output_padding
        n = num_spatial_dims
        lead = 2 if input.dim() == n + 2 else 1
        sizes = list(output_size)
        if len(sizes) == lead + n:
            sizes = sizes[lead:]
        if len(sizes) != n:
            raise ValueError(f"ConvTranspose{n}D: for {input.dim()}D input, output_size must have {n} or {lead + n} "
                             f"elements (got {len(output_size)})")
        dilation = dilation if dilation is not None else (1,) * n
        smallest = [(input.shape[lead + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel_size[d] - 1) + 1
                    for d in range(n)]
        largest = [low + s - 1 for low, s in zip(smallest, stride)]
        for size, low, high in zip(sizes, smallest, largest):
            if size < low or size > high:
                raise ValueError(f"requested an output size of {sizes}, but valid sizes range from {smallest} to "
                                 f"{largest} (for an input of {list(input.shape[lead:])})")
        return tuple(size - low for size, low in zip(sizes, smallest))

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        conv = getattr(F, self._functional)
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._dims, self.dilation)
        return conv(input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                    self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """The transpose (gradient) of a 1-D convolution, mapping ``(N, C_in, L)`` to ``(N, C_out, L_out)``."""

    _dims = 1
    _functional = "conv_transpose1d"


class ConvTranspose2d(_ConvTransposeNd):
    """The transpose (gradient) of a 2-D convolution.

    >>> import tilewise as tw
    >>> tw.nn.ConvTranspose2d(4, 2, 3, stride=2)(tw.ones(1, 4, 5, 5)).shape
    tilewise.Size([1, 2, 11, 11])
    """

    _dims = 2
    _functional = "conv_transpose2d"


class ConvTranspose3d(_ConvTransposeNd):
    _dims = 3
    _functional = "conv_transpose3d"
