"""Parameter initialisation (torch.nn.init): fill a tensor in place, without recording autograd history.

Every function draws from tilewise's Philox generator (or the ``generator`` given) and writes the values
with ``copy_`` under ``no_grad``, so it works on parameters that require grad and keeps their identity.
The fan and gain rules are torch's, so a layer initialised here has the same distribution as in torch.
"""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np

from tilewise import dtypes
from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.creation import check_uniform_range, full, rand, randn, randperm
from tilewise.tensor import Tensor, from_numpy

_LINEAR_GAINS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch's table).

    >>> import tilewise as tw
    >>> round(tw.nn.init.calculate_gain("relu"), 4)
    1.4142
    """
    if nonlinearity in _LINEAR_GAINS:
        return 1
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
    check_uniform_range(a, b)
    return _fill(tensor, _uniform(tensor, generator) * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    return _fill(tensor, _normal(tensor, generator) * std + mean)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None) -> Tensor:
    """Normal(mean, std) restricted to [a, b], by inverting the normal CDF on a uniform draw. Bounds out of order
    are refused, and a mean far outside them warned of, as torch does."""
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The distribution of values may "
                      "be incorrect.", stacklevel=2)
    check_uniform_range(a, b)
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
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)  # as torch
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None) -> Tensor:
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)  # as torch
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """The identity of a convolution: in each group, output channel ``d`` reads input channel ``d`` at the
    kernel's centre (as many channels as both sides have)."""
    if tensor.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per_group = sizes[0] // groups
    values = np.zeros(sizes, np.float32)
    centre = tuple(size // 2 for size in sizes[2:])
    for g in range(groups):
        for d in range(min(out_per_group, sizes[1])):
            values[(g * out_per_group + d, d, *centre)] = 1
    return _fill(tensor, from_numpy(values).to(device=tensor.device, dtype=tensor.dtype))


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """A (semi-)orthogonal matrix of the tensor flattened to ``(rows, rest)``, times ``gain``: the Q of a QR
    factorisation of a normal draw, its columns' signs fixed by R's diagonal so that Q is uniformly
    distributed (torch's method; the factorisation runs on the host, in float32 or float64)."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    dtype = dtypes.float64 if tensor.dtype is dtypes.float64 else dtypes.float32
    flattened = randn((rows, cols), generator=generator, dtype=dtype, device=tensor.device).cpu().numpy()
    if rows < cols:
        flattened = flattened.T
    q, r = np.linalg.qr(flattened)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    values = from_numpy(np.ascontiguousarray(q)).to(device=tensor.device, dtype=tensor.dtype)
    return _fill(tensor, values.view(tensor.shape) * gain)


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator=None) -> Tensor:
    """A normal(0, std) matrix with ``ceil(sparsity * rows)`` entries of each column set to zero, at rows drawn
    by a random permutation per column."""
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    num_zeros = math.ceil(sparsity * rows)
    keep = np.ones((rows, cols), np.bool_)
    for col in range(cols):
        keep[randperm(rows).numpy()[:num_zeros], col] = False
    dropped = from_numpy(~keep).to(device=tensor.device)
    return _fill(tensor, (_normal(tensor, generator) * std).masked_fill(dropped, 0.0))


def _make_deprecate(method):
    """The name without the trailing underscore, as torch keeps it: a FutureWarning, then ``method``."""
    new_name = method.__name__
    old_name = new_name[:-1]

    def deprecated_init(*args, **kwargs):
        warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new_name}`.", FutureWarning,
                      stacklevel=2)
        return method(*args, **kwargs)

    deprecated_init.__name__ = old_name
    deprecated_init.__doc__ = f"{old_name}(...): deprecated in favor of ``tilewise.nn.init.{new_name}``."
    return deprecated_init


uniform = _make_deprecate(uniform_)
normal = _make_deprecate(normal_)
constant = _make_deprecate(constant_)
eye = _make_deprecate(eye_)
dirac = _make_deprecate(dirac_)
xavier_uniform = _make_deprecate(xavier_uniform_)
xavier_normal = _make_deprecate(xavier_normal_)
kaiming_uniform = _make_deprecate(kaiming_uniform_)
kaiming_normal = _make_deprecate(kaiming_normal_)
orthogonal = _make_deprecate(orthogonal_)
sparse = _make_deprecate(sparse_)
