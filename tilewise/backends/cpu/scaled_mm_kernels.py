"""The CPU kernel of ``_scaled_mm`` (see [Note: scaled matrix products] in ``ops/scaled_mm.py``): torch's CPU
emulation, operand by operand. Each float8 operand is widened to float32 and multiplied by its scale (one value,
or one per row of ``a`` / column of ``b``), the product runs in float32 (OpenBLAS through numpy), the bias is
added, a float8 result is divided by ``scale_result``, and the cast to ``out_dtype`` saturates as torch's does.
"""

from __future__ import annotations

import numpy as np

from tilewise.backends.cpu.registry import kernel
from tilewise.ops.scaled_mm import check_scaled_mm
from tilewise.tensor import from_array


def _scaled(t, scale) -> np.ndarray:
    return t._np().astype(np.float32) * scale._np().astype(np.float32).reshape(scale.shape if scale.ndim == 2 else ())


@kernel("_scaled_mm")
def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    check_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result)
    out_dtype = out_dtype or self.dtype
    out = np.matmul(_scaled(self, scale_a), _scaled(mat2, scale_b))
    if bias is not None:
        out = out + bias._np().astype(np.float32).reshape(-1)
    if out_dtype.is_float8 and scale_result is not None:
        out = out * (np.float32(1) / scale_result._np().astype(np.float32).reshape(()))
    return from_array(np.ascontiguousarray(out), out_dtype)
