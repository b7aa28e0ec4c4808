"""numpy (pocketfft) kernels of the three fft primitives (see [Note: fft primitives] in ops/fft.py).

numpy names a scale by the direction it leaves unscaled ("backward": the inverse divides by n); the primitives
name the scale itself, so the mapping depends on the direction. numpy computes float32 data in single
precision, as torch's CPU does.
"""

from __future__ import annotations

import numpy as np

from tilewise.backends.cpu.registry import kernel
from tilewise.tensor import from_array

_FORWARD_NORM = ("backward", "ortho", "forward")  # by normalization code: none, 1/sqrt(n), 1/n
_INVERSE_NORM = ("forward", "ortho", "backward")


def _out(values: np.ndarray, like: np.dtype):
    from tilewise.dtypes import from_numpy

    values = np.ascontiguousarray(values, dtype=like)
    return from_array(values, from_numpy(like))


@kernel("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    a = self._np()
    if not dim or a.size == 0:
        return _out(a.copy(), a.dtype)
    transform = np.fft.fftn if forward else np.fft.ifftn
    norm = (_FORWARD_NORM if forward else _INVERSE_NORM)[normalization]
    return _out(transform(a, axes=tuple(dim), norm=norm), a.dtype)


@kernel("_fft_r2c")
def fft_r2c(self, dim, normalization, onesided):
    a = self._np()
    complex_dtype = np.result_type(a.dtype, np.complex64)
    if a.size == 0:
        shape = list(a.shape)
        if onesided:
            shape[dim[-1]] = shape[dim[-1]] // 2 + 1
        return _out(np.zeros(shape, complex_dtype), complex_dtype)
    transform = np.fft.rfftn if onesided else np.fft.fftn
    return _out(transform(a, axes=tuple(dim), norm=_FORWARD_NORM[normalization]), complex_dtype)


@kernel("_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    a = self._np()
    real_dtype = a.real.dtype
    sizes = [a.shape[d] for d in dim[:-1]] + [last_dim_size]
    if a.size == 0:
        shape = list(a.shape)
        shape[dim[-1]] = last_dim_size
        return _out(np.zeros(shape, real_dtype), real_dtype)
    return _out(np.fft.irfftn(a, s=sizes, axes=tuple(dim), norm=_INVERSE_NORM[normalization]), real_dtype)
