"""Window functions for spectral analysis (torch.hann_window, hamming, blackman, bartlett, kaiser).

Each is a factory over ``arange`` and pointwise operators, written as torch's kernels write it (the same
operations in the same order and dtype), so values agree with torch to the last bit or two and every device
computes them. ``periodic=True`` gives the window of length ``N + 1`` without its last point (for spectral
analysis: it tiles); ``periodic=False`` the symmetric window (for filter design).
"""

from __future__ import annotations

import math

from tilewise.dtypes import as_dtype, get_default_dtype
from tilewise.ops.creation import _finish, arange, full, ones
from tilewise.tensor import Tensor


def _check(name: str, window_length, dtype) -> None:
    if not isinstance(window_length, int) or isinstance(window_length, bool):
        raise TypeError(f"{name}(): argument 'window_length' (position 1) must be int, not "
                        f"{type(window_length).__name__}")
    if window_length < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={window_length}")
    if not dtype.is_floating_point:
        raise RuntimeError(f"{name} expects floating point dtypes, got: tilewise.{dtype.name}")


def _window(name: str, window_length: int, periodic: bool, dtype, device, requires_grad: bool, body) -> Tensor:
    """``body(n, length)`` over ``n = arange(length)``, length one more than asked when periodic, then trimmed."""
    dtype = as_dtype(dtype) if dtype is not None else get_default_dtype()
    _check(name, window_length, dtype)
    if window_length <= 1:
        return _finish(ones(window_length, dtype=dtype, device=device), requires_grad)
    length = window_length + 1 if periodic else window_length
    window = body(arange(length, dtype=dtype, device=device), length)
    return _finish(window[:window_length] if periodic else window, requires_grad)


def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    """``alpha - beta * cos(2 pi n / (N - 1))``.

    >>> import tilewise as tw
    >>> tw.hamming_window(5, periodic=False)
    tensor([0.0800, 0.5400, 1.0000, 0.5400, 0.0800])
    """
    def body(n, length):
        return (n * (math.pi * 2.0 / (length - 1))).cos() * -beta + alpha

    return _window("hamming_window", window_length, periodic, dtype, device, requires_grad, body)


def hann_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                requires_grad: bool = False) -> Tensor:
    """``0.5 - 0.5 cos(2 pi n / (N - 1))``: the Hamming window with alpha = beta = 0.5, as torch computes it."""
    dtype = as_dtype(dtype) if dtype is not None else get_default_dtype()
    _check("hann_window", window_length, dtype)
    return hamming_window(window_length, periodic, 0.5, 0.5, dtype=dtype, device=device, requires_grad=requires_grad)


def blackman_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                    requires_grad: bool = False) -> Tensor:
    """``0.42 - 0.5 cos(2 pi n / (N - 1)) + 0.08 cos(4 pi n / (N - 1))``."""
    def body(n, length):
        x = n * (math.pi / (length - 1))
        return (x * 4).cos() * 0.08 - (x * 2).cos() * 0.5 + 0.42

    return _window("blackman_window", window_length, periodic, dtype, device, requires_grad, body)


def bartlett_window(window_length: int, periodic: bool = True, *, dtype=None, layout=None, device=None,
                    requires_grad: bool = False) -> Tensor:
    """The triangle ``1 - |2 n / (N - 1) - 1|``: rising ``2 n / (N - 1)``, then falling ``2 - 2 n / (N - 1)``."""
    def body(n, length):
        rising = n * (2.0 / (length - 1))
        first_half = ((length - 1) >> 1) + 1
        return rising.where(n < first_half, 2 - rising)

    return _window("bartlett_window", window_length, periodic, dtype, device, requires_grad, body)


_KAISER_SIGNATURES = (
    "kaiser_window() received an invalid combination of arguments - got ({given}), but expected one of:\n"
    " * (int window_length, *, dtype dtype = None, layout layout = None, Device device = None, "
    "bool requires_grad = False)\n"
    " * (int window_length, bool periodic, *, dtype dtype = None, layout layout = None, Device device = None, "
    "bool requires_grad = False)\n"
    " * (int window_length, bool periodic, float beta, *, dtype dtype = None, layout layout = None, "
    "Device device = None, bool requires_grad = False)\n")


def kaiser_window(window_length: int, periodic: bool | None = None, beta: float | None = None, *, dtype=None,
                  layout=None, device=None, requires_grad: bool = False) -> Tensor:
    """``I0(beta sqrt(1 - ((n - alpha) / alpha)^2)) / I0(beta)`` with ``alpha = (N - 1) / 2``; ``periodic`` defaults
    to True and ``beta`` to 12, and, as torch's overloads have it, ``beta`` is given only after ``periodic``."""
    if periodic is None and beta is not None:
        given = f"{type(window_length).__name__}, beta={type(beta).__name__}"
        raise TypeError(_KAISER_SIGNATURES.format(given=given))
    periodic = True if periodic is None else periodic
    beta = 12.0 if beta is None else beta
    def body(n, length):
        alpha = (length - 1) / 2.0
        ratio = (n - alpha) / alpha
        return ((1 - ratio * ratio).abs().sqrt() * beta).i0() / full((), beta, dtype=n.dtype, device=n.device).i0()

    return _window("kaiser_window", window_length, periodic, dtype, device, requires_grad, body)
