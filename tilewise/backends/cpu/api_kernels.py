"""numpy kernels for the primitives of ``ops/special.py`` and ``ops/sets.py`` that are not expressions:
integer loops (gcd, lcm), bit fields (frexp), and the data-dependent ones whose result size depends on the
values (unique, bincount, histc, ...). On CUDA they run here on host copies (``kernels/fallback.py``).
"""

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise.backends.cpu import kernel
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor, from_array


def _array(value, dtype) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._np().astype(dtype.np, copy=False)
    return np.asarray(value, dtype=dtype.np)


def _integer_pair(name: str, fn):
    def run(self, other):
        out, _ = OPS[name].dtype_rule(OPS[name], (self, other))
        return from_array(np.asarray(fn(_array(self, out), _array(other, out))).astype(out.np), out)

    return run


kernel("gcd")(_integer_pair("gcd", np.gcd))
kernel("lcm")(_integer_pair("lcm", lambda a, b: np.abs(np.lcm(a, b))))


@kernel("frexp.Tensor")
def frexp(self):
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"torch.frexp() only supports floating-point dtypes (got {self.dtype.name})")
    mantissa, exponent = np.frexp(self._np().astype(np.float32 if self.dtype.itemsize < 4 else self.dtype.np))
    return from_array(mantissa.astype(self.dtype.np), self.dtype), from_array(exponent.astype(np.int32),
                                                                              dtypes.int32)
