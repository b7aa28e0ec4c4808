"""``tilewise.fft``: discrete Fourier transforms with torch.fft's names, arguments and results.

The transforms are operators declared in ``ops/fft.py`` (see [Note: fft primitives] there); this module gives
them their public names and adds the sample-frequency helpers.

>>> import tilewise as tw
>>> tw.fft.rfft(tw.tensor([1.0, 2.0, 3.0, 4.0]))
tensor([10.+0.j, -2.+2.j, -2.+0.j])
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.ops.creation import factory_out
from tilewise.ops.fft import TRANSFORMS
from tilewise.ops.registry import public_function


def _transform(name: str):
    fn = public_function(f"fft_{name}")
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    return fn


fft, ifft, rfft, irfft, hfft, ihfft = (_transform(n) for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"))
fft2, ifft2, rfft2, irfft2, hfft2, ihfft2 = (_transform(n) for n in ("fft2", "ifft2", "rfft2", "irfft2", "hfft2",
                                                                      "ihfft2"))
fftn, ifftn, rfftn, irfftn, hfftn, ihfftn = (_transform(n) for n in ("fftn", "ifftn", "rfftn", "irfftn", "hfftn",
                                                                      "ihfftn"))
fftshift, ifftshift = _transform("fftshift"), _transform("ifftshift")


def _frequencies(op: str, n: int, d: float, dtype, device, requires_grad: bool, onesided: bool):
    from tilewise.ops.creation import arange
    from tilewise.ops.registry import OPS

    dtype = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    if not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"{op} requires a floating point or complex dtype, got {dtype.name}")
    if dtype.is_complex:  # torch's check admits complex, but its arange has no complex kernel
        raise NotImplementedError(f'{op}: "arange" is not implemented for {dtype.name}; ask for the real dtype and '
                                  "convert the result with .to()")
    if n < 0:
        raise RuntimeError(f"{op}: n must be non-negative, got {n}")
    if onesided:
        values = arange(n // 2 + 1, dtype=dtype, device=device)
    else:
        values = OPS["cat"]([arange((n + 1) // 2, dtype=dtype, device=device),
                             arange(-(n // 2), 0, dtype=dtype, device=device)])
    out = values * (1.0 / (n * d))
    return out.requires_grad_(True) if requires_grad else out


@factory_out("fftfreq")
def fftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, requires_grad: bool = False):
    """The sample frequencies of an ``n``-point transform with sample spacing ``d``, as torch.fft.fftfreq.

    >>> tw.fft.fftfreq(4)
    tensor([0.0000, 0.2500, -0.5000, -0.2500])
    """
    return _frequencies("fftfreq", n, d, dtype, device, requires_grad, onesided=False)


@factory_out("rfftfreq")
def rfftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, requires_grad: bool = False):
    """The sample frequencies of ``rfft``'s output for an ``n``-point signal, as torch.fft.rfftfreq."""
    return _frequencies("rfftfreq", n, d, dtype, device, requires_grad, onesided=True)


__all__ = [*TRANSFORMS, "fftfreq", "rfftfreq"]
