"""numpy (pocketfft) kernels of the three fft primitives (see [Note: fft primitives] in ops/fft.py).

numpy names a scale by the direction it leaves unscaled ("backward": the inverse divides by n); the primitives
name the scale itself, so the mapping depends on the direction. numpy computes float32 data in single
precision, as torch's CPU does. Results are laid out as torch's CPU transforms lay theirs out (see
[Note: fft result strides] in ``strides.py``).
"""

from __future__ import annotations

import numpy as np

from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.tensor import from_array_strided

_FORWARD_NORM = ("backward", "ortho", "forward")  # by normalization code: none, 1/sqrt(n), 1/n
_INVERSE_NORM = ("forward", "ortho", "backward")


def _out(values: np.ndarray, like: np.dtype, strides: tuple):
    from tilewise.dtypes import from_numpy

    return from_array_strided(np.asarray(values, dtype=like), strides, from_numpy(like))


@kernel("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    a = self._np()
    if not dim:  # torch's: a clone
        return _out(a.copy(), a.dtype, S.preserved_strides(self._shape, self._strides))
    strides = S.fft_result_strides(self._shape, self._strides, self._shape, S.fft_dims_in_order(self._strides, dim))
    if a.size == 0:
        return _out(a.copy(), a.dtype, strides)
    transform = np.fft.fftn if forward else np.fft.ifftn
    norm = (_FORWARD_NORM if forward else _INVERSE_NORM)[normalization]
    return _out(transform(a, axes=tuple(dim), norm=norm), a.dtype, strides)


@kernel("_fft_r2c")
def fft_r2c(self, dim, normalization, onesided):
    a = self._np()
    complex_dtype = np.result_type(a.dtype, np.complex64)
    shape = list(a.shape)
    if onesided:
        shape[dim[-1]] = shape[dim[-1]] // 2 + 1
    strides = S.fft_result_strides(self._shape, self._strides, shape, S.fft_dims_in_order(self._strides, dim, True))
    if a.size == 0:
        return _out(np.zeros(shape, complex_dtype), complex_dtype, strides)
    transform = np.fft.rfftn if onesided else np.fft.fftn
    return _out(transform(a, axes=tuple(dim), norm=_FORWARD_NORM[normalization]), complex_dtype, strides)


@kernel("_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    a = self._np()
    real_dtype = a.real.dtype
    sizes = [a.shape[d] for d in dim[:-1]] + [last_dim_size]
    shape = list(a.shape)
    shape[dim[-1]] = last_dim_size
    strides = S.fft_c2r_result_strides(self._shape, self._strides, shape, dim)
    if a.size == 0:
        return _out(np.zeros(shape, real_dtype), real_dtype, strides)
    return _out(np.fft.irfftn(a, s=sizes, axes=tuple(dim), norm=_INVERSE_NORM[normalization]), real_dtype, strides)
