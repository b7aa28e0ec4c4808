"""Parameter initialisation (torch.nn.init): fill a tensor in place, without recording autograd history.

Every function draws from tilewise's Philox generator (or the ``generator`` given) and writes the values
with ``copy_`` under ``no_grad``, so it works on parameters that require grad and keeps their identity.
The fan and gain rules are torch's, so a layer initialised here has the same distribution as in torch.
"""

from __future__ import annotations

import math
import threading

from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.creation import full, rand, randn
from tilewise.tensor import Tensor

_LINEAR_GAINS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch's table).

    >>> import tilewise as tw
    >>> round(tw.nn.init.calculate_gain("relu"), 4)
    1.4142
    """
    if nonlinearity in _LINEAR_GAINS:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"calculate_gain: negative_slope {slope!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}; valid: {', '.join(_LINEAR_GAINS)}, "
                     "tanh, relu, leaky_relu, selu")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.dim() < 2:
        raise ValueError(f"Fan in and fan out can not be computed for tensor with fewer than 2 dimensions (got shape "
                         f"{list(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


class _Skipping(threading.local):
    """``nn.utils.skip_init`` sets ``on`` while it builds a module: initialisers then leave tensors as they are and
    draw no random numbers (per thread, so other threads initialise as usual)."""

    on = False


SKIPPING = _Skipping()


def _fill(tensor: Tensor, values: Tensor) -> Tensor:
    if SKIPPING.on:
        return tensor
    with no_grad():
        tensor.copy_(values)
    return tensor


def _uniform(tensor: Tensor, generator) -> Tensor:
    if SKIPPING.on:
        return tensor.detach()
    return rand(tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device)


def _normal(tensor: Tensor, generator) -> Tensor:
    if SKIPPING.on:
        return tensor.detach()
    return randn(tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    return _fill(tensor, _uniform(tensor, generator) * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    return _fill(tensor, _normal(tensor, generator) * std + mean)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None) -> Tensor:
    """Normal(mean, std) restricted to [a, b], by inverting the normal CDF on a uniform draw (torch's method)."""
    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    low, high = 2 * cdf((a - mean) / std) - 1, 2 * cdf((b - mean) / std) - 1
    u = _uniform(tensor, generator) * (high - low) + low
    values = u.erfinv() * (std * math.sqrt(2.0)) + mean
    return _fill(tensor, values.clamp(a, b))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _fill(tensor, full(tensor.shape, val, dtype=tensor.dtype, device=tensor.device))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError(f"eye_: only 2-dimensional tensors are supported, got shape {list(tensor.shape)}")
    from tilewise.ops.creation import eye

    return _fill(tensor, eye(*tensor.shape, dtype=tensor.dtype, device=tensor.device))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None) -> Tensor:
    if 0 in tensor.shape:
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None) -> Tensor:
    if 0 in tensor.shape:
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)
