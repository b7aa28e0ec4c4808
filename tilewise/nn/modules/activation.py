"""Activation modules: thin wrappers that hold an activation's options and call ``tilewise.nn.functional``."""

from __future__ import annotations

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.nn.parameter import Parameter
from tilewise.ops.creation import full
from tilewise.tensor import Tensor


class _Elementwise(Module):
    """An activation with no options: ``forward`` is ``F.<fn>(input)``."""

    fn: str

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        if self.inplace:
            return getattr(F, self.fn)(input, inplace=True)
        return getattr(F, self.fn)(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Elementwise):
    fn = "relu"


class ReLU6(_Elementwise):
    fn = "relu6"


class SiLU(_Elementwise):
    fn = "silu"


class Mish(_Elementwise):
    fn = "mish"


class Hardswish(_Elementwise):
    fn = "hardswish"

    def extra_repr(self) -> str:  # torch's prints no options for these two
        return ""


class Hardsigmoid(_Elementwise):
    fn = "hardsigmoid"

    def extra_repr(self) -> str:
        return ""


class SELU(_Elementwise):
    fn = "selu"


class Sigmoid(_Elementwise):
    fn = "sigmoid"


class Tanh(_Elementwise):
    fn = "tanh"


class Softsign(_Elementwise):
    fn = "softsign"


class LogSigmoid(_Elementwise):
    fn = "logsigmoid"


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    def forward(self, input: Tensor) -> Tensor:
        return F.celu(input, self.alpha, self.inplace)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace
        assert self.max_val > self.min_val, f"max_val ({max_val}) must be greater than min_val ({min_val})"

    def forward(self, input: Tensor) -> Tensor:
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class PReLU(Module):
    """``max(0, x) + weight * min(0, x)``, with one learnable slope or one per channel (dim 1)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(full((num_parameters,), init, device=device, dtype=dtype))

    def forward(self, input: Tensor) -> Tensor:
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Tanhshrink(Module):
    def forward(self, input: Tensor) -> Tensor:
        return F.tanhshrink(input)


class Hardshrink(Module):
    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:
        return F.hardshrink(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    def forward(self, input: Tensor) -> Tensor:
        return F.softshrink(input, self.lambd)


class GLU(Module):
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second half."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _WithDim(Module):
    fn: str

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self.fn)(input, self.dim)  # without a dim, the functional picks one and warns

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_WithDim):
    fn = "softmax"


class LogSoftmax(_WithDim):
    fn = "log_softmax"


class Softmin(_WithDim):
    fn = "softmin"


class Softmax2d(Module):
    """Softmax over the channels of a ``(N, C, H, W)`` or ``(C, H, W)`` input."""

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() not in (3, 4):
            raise ValueError(f"Softmax2d: expected input of 3 or 4 dimensions, got shape {list(input.shape)}")
        return F.softmax(input, -3)


class RReLU(Module):
    """Leaky ReLU with a random negative slope from U(lower, upper) per element while training, and the mean
    slope ``(lower + upper) / 2`` in evaluation."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False) -> None:
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")
