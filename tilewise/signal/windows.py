"""``tilewise.signal.windows``: torch.signal.windows, the window functions with SciPy's arguments.

torch writes these in Python over ``linspace`` and pointwise operators, and so does this module, step for step (the
same sample points in the same dtype, the same operations in the same order), so values agree with torch's to the
last bit or two. ``sym=True`` (the default) gives the symmetric window, for filter design; ``sym=False`` the periodic
one, for spectral analysis. torch's factory functions (``tilewise.hann_window``) are in ``ops/windows.py``.

>>> import tilewise as tw
>>> tw.signal.windows.gaussian(5, std=1.0)
tensor([0.1353, 0.6065, 1.0000, 0.6065, 0.1353])
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tilewise.dtypes import as_dtype, float32, float64, get_default_dtype
from tilewise.layouts import strided
from tilewise.ops.creation import arange, empty, linspace, ones
from tilewise.tensor import Tensor, tensor

__all__ = ["bartlett", "blackman", "cosine", "exponential", "gaussian", "general_cosine", "general_hamming",
           "hamming", "hann", "kaiser", "nuttall"]


def _checked(name: str, M: int, dtype, layout):  # noqa: N803 — torch's argument name
    """The dtype to make the window in, after torch's checks of the length, layout and dtype."""
    dtype = get_default_dtype() if dtype is None else as_dtype(dtype)
    if M < 0:
        raise ValueError(f"{name} requires non-negative window length, got M={M}")
    if layout is not strided:
        raise ValueError(f"{name} is implemented for strided tensors only, got: {layout}")
    if dtype not in (float32, float64):
        raise ValueError(f"{name} expects float32 or float64 dtypes, got: tilewise.{dtype.name}")
    return dtype


def _trivial(M: int, dtype, device, requires_grad: bool) -> Tensor | None:  # noqa: N803
    """The windows of no sample and of one (a one), which every window function gives without its formula."""
    if M == 0:
        return empty((0,), dtype=dtype, device=device, requires_grad=requires_grad)
    if M == 1:
        return ones((1,), dtype=dtype, device=device, requires_grad=requires_grad)
    return None


def exponential(M: int, *, center: float | None = None, tau: float = 1.0, sym: bool = True, dtype=None,  # noqa: N803
                layout=strided, device=None, requires_grad: bool = False) -> Tensor:
    """``exp(-|n - center| / tau)``; ``center`` only for a periodic window (it defaults to the middle)."""
    dtype = _checked("exponential", M, dtype, layout)
    if tau <= 0:
        raise ValueError(f"Tau must be positive, got: {tau} instead.")
    if sym and center is not None:
        raise ValueError("Center must be None for symmetric windows")
    if M == 0:
        return empty((0,), dtype=dtype, device=device, requires_grad=requires_grad)
    if center is None:
        center = (M if not sym and M > 1 else M - 1) / 2.0
    constant = 1 / tau
    k = linspace(-center * constant, (-center + (M - 1)) * constant, M, dtype=dtype, device=device,
                 requires_grad=requires_grad)
    return (-k.abs()).exp()


def cosine(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
           requires_grad: bool = False) -> Tensor:
    """The sine window, ``sin(pi (n + 1/2) / M)``."""
    dtype = _checked("cosine", M, dtype, layout)
    if M == 0:
        return empty((0,), dtype=dtype, device=device, requires_grad=requires_grad)
    start = 0.5
    constant = math.pi / (M + 1 if not sym and M > 1 else M)
    k = linspace(start * constant, (start + (M - 1)) * constant, M, dtype=dtype, device=device,
                 requires_grad=requires_grad)
    return k.sin()


def gaussian(M: int, *, std: float = 1.0, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
             requires_grad: bool = False) -> Tensor:
    """``exp(-(n - (M - 1) / 2)^2 / (2 std^2))``."""
    dtype = _checked("gaussian", M, dtype, layout)
    if std <= 0:
        raise ValueError(f"Standard deviation must be positive, got: {std} instead.")
    if M == 0:
        return empty((0,), dtype=dtype, device=device, requires_grad=requires_grad)
    start = -(M if not sym and M > 1 else M - 1) / 2.0
    constant = 1 / (std * math.sqrt(2))
    k = linspace(start * constant, (start + (M - 1)) * constant, M, dtype=dtype, device=device,
                 requires_grad=requires_grad)
    return (-(k**2)).exp()


def kaiser(M: int, *, beta: float = 12.0, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
           requires_grad: bool = False) -> Tensor:
    """``I0(sqrt(beta^2 - k^2)) / I0(beta)`` for ``k`` from ``-beta`` to ``beta``."""
    dtype = _checked("kaiser", M, dtype, layout)
    if beta < 0:
        raise ValueError(f"beta must be non-negative, got: {beta} instead.")
    trivial = _trivial(M, dtype, device, requires_grad)
    if trivial is not None:
        return trivial
    beta = tensor(beta, dtype=dtype, device=device)  # in the window's dtype, so that beta^2 - k^2 is never < 0
    start = -beta
    constant = 2.0 * beta / (M if not sym else M - 1)
    end = beta.minimum(start + (M - 1) * constant)
    k = linspace(start, end, M, dtype=dtype, device=device, requires_grad=requires_grad)
    return (beta * beta - k.pow(2)).sqrt().i0() / beta.i0()


def general_cosine(M: int, *, a: Iterable, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
                   requires_grad: bool = False) -> Tensor:
    """``sum_i (-1)^i a_i cos(2 pi i n / (M - 1))``."""
    dtype = _checked("general_cosine", M, dtype, layout)
    trivial = _trivial(M, dtype, device, requires_grad)
    if trivial is not None:
        return trivial
    if not isinstance(a, Iterable):
        raise TypeError("Coefficients must be a list/tuple")
    if not a:
        raise ValueError("Coefficients cannot be empty")
    constant = 2 * math.pi / (M if not sym else M - 1)
    k = linspace(0, (M - 1) * constant, M, dtype=dtype, device=device, requires_grad=requires_grad)
    a_i = tensor([(-1) ** i * w for i, w in enumerate(a)], device=device, dtype=dtype, requires_grad=requires_grad)
    i = arange(a_i.shape[0], dtype=a_i.dtype, device=a_i.device, requires_grad=a_i.requires_grad)
    return (a_i.unsqueeze(-1) * (i.unsqueeze(-1) * k).cos()).sum(0)


def general_hamming(M: int, *, alpha: float = 0.54, sym: bool = True, dtype=None, layout=strided,  # noqa: N803
                    device=None, requires_grad: bool = False) -> Tensor:
    """``alpha - (1 - alpha) cos(2 pi n / (M - 1))``."""
    return general_cosine(M, a=[alpha, 1.0 - alpha], sym=sym, dtype=dtype, layout=layout, device=device,
                          requires_grad=requires_grad)


def hamming(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
            requires_grad: bool = False) -> Tensor:
    """The general Hamming window with ``alpha = 0.54``."""
    return general_hamming(M, sym=sym, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)


def hann(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
         requires_grad: bool = False) -> Tensor:
    """The general Hamming window with ``alpha = 0.5``."""
    return general_hamming(M, alpha=0.5, sym=sym, dtype=dtype, layout=layout, device=device,
                           requires_grad=requires_grad)


def blackman(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
             requires_grad: bool = False) -> Tensor:
    """The general cosine window with ``a = [0.42, 0.5, 0.08]``."""
    _checked("blackman", M, dtype, layout)
    return general_cosine(M, a=[0.42, 0.5, 0.08], sym=sym, dtype=dtype, layout=layout, device=device,
                          requires_grad=requires_grad)


def bartlett(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
             requires_grad: bool = False) -> Tensor:
    """The triangle ``1 - |k|`` for ``k`` from -1 to 1."""
    dtype = _checked("bartlett", M, dtype, layout)
    trivial = _trivial(M, dtype, device, requires_grad)
    if trivial is not None:
        return trivial
    start = -1
    constant = 2 / (M if not sym else M - 1)
    k = linspace(start, start + (M - 1) * constant, M, dtype=dtype, device=device, requires_grad=requires_grad)
    return 1 - k.abs()


def nuttall(M: int, *, sym: bool = True, dtype=None, layout=strided, device=None,  # noqa: N803
            requires_grad: bool = False) -> Tensor:
    """The minimum 4-term Blackman-Harris window of Nuttall."""
    return general_cosine(M, a=[0.3635819, 0.4891775, 0.1365995, 0.0106411], sym=sym, dtype=dtype, layout=layout,
                          device=device, requires_grad=requires_grad)
