"""Neural-network composites (tilewise.nn.functional): decompositions into primitives, with explicit
derivatives where the composed backward would be slower or less stable."""

from __future__ import annotations

from tilewise import _strides as S
from tilewise.dtypes import compute_dtype
from tilewise.ops.registry import declare


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


def _softmax(self, dim, dtype=None):
    x = self.to(dtype) if dtype is not None else self
    work = x.to(compute_dtype(x.dtype)) if x.dtype.is_floating_point else x.float()
    S.normalize_dim(dim, max(self.ndim, 1), "softmax")
    shifted = work - work.amax(dim, keepdim=True)
    e = shifted.exp()
    out = e / e.sum(dim, keepdim=True)
    return out.to(x.dtype) if x.dtype.is_floating_point else out


def _log_softmax(self, dim, dtype=None):
    x = self.to(dtype) if dtype is not None else self
    work = x.to(compute_dtype(x.dtype)) if x.dtype.is_floating_point else x.float()
    S.normalize_dim(dim, max(self.ndim, 1), "log_softmax")
    shifted = work - work.amax(dim, keepdim=True)
    out = shifted - shifted.exp().sum(dim, keepdim=True).log()
    return out.to(x.dtype) if x.dtype.is_floating_point else out


composite("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", _softmax,
          {"self": "result * (grad - (grad * result).sum(dim, keepdim=True))"}, autocast="fp32")
composite("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", _log_softmax,
          {"self": "grad - exp(result) * grad.sum(dim, keepdim=True)"}, autocast="fp32")
