"""Reductions: primitives declared by their combiner, composites (mean, var, logsumexp, ...) by decomposition."""

from __future__ import annotations

from math import prod

from tilewise import _strides as S
from tilewise.ops import dtype_rules as R
from tilewise.ops.registry import declare


def reduction(schema: str, reduce: str | None, grad: dict | None, dtype=R.promote, **attrs):
    return declare(schema, "reduction", reduce=reduce, grad=grad, dtype=dtype, **attrs)


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


def reduced_count(shape, dim) -> int:
    dims = S.normalize_dims(dim if dim not in ((), []) else None, len(shape))
    return prod(shape[d] for d in dims)


# ---------------------------------------------------------------- primitives
reduction("sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", "add",
          {"self": "expand_reduced(grad, self_shape, dim, keepdim)"}, R.reduction_sum, autocast="fp32")
reduction("prod(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", "mul",
          {"self": "prod_backward(grad, self, result, dim, keepdim)"}, R.reduction_sum, autocast="fp32")
reduction("amax(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "max",
          {"self": "minmax_backward(grad, self, result, dim, keepdim)"})
reduction("amin(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "min",
          {"self": "minmax_backward(grad, self, result, dim, keepdim)"})
reduction("any(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "or", None, R.logical,
          differentiable=False)
reduction("all(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "and", None, R.logical,
          differentiable=False)
reduction("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", None, None, differentiable=False)
reduction("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", None, None, differentiable=False)
reduction("max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", None,
          {"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"}, nondiff_outputs=(1,))
reduction("min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", None,
          {"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"}, nondiff_outputs=(1,))


# ---------------------------------------------------------------- composites
def _max_all(self):
    return self.amax()


def _min_all(self):
    return self.amin()


composite("max(Tensor self) -> Tensor", _max_all)
composite("max.other(Tensor self, Tensor other) -> Tensor", lambda self, other: self.maximum(other))
composite("min(Tensor self) -> Tensor", _min_all)
composite("min.other(Tensor self, Tensor other) -> Tensor", lambda self, other: self.minimum(other))


def _mean(self, dim=None, keepdim=False, dtype=None):
    out_dtype, compute = R.reduction_float(_MEAN, (self, dim, keepdim, dtype))
    total = self.sum(dim, keepdim, dtype=compute)
    return (total / reduced_count(self.shape, dim)).to(out_dtype)


_MEAN = composite("mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
                  _mean)


def _var_correction(unbiased, correction) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def _var(self, dim=None, unbiased=None, keepdim=False, correction=None):
    R.reduction_float(_VAR, (self,))
    n = reduced_count(self.shape, dim)
    centered = self - self.mean(dim, keepdim=True)
    return (centered * centered).sum(dim, keepdim) / max(n - _var_correction(unbiased, correction), 0)


_VAR = composite("var(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
                 "Scalar? correction=None) -> Tensor", _var)
composite("std(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, Scalar? correction=None)"
          " -> Tensor", lambda self, dim=None, unbiased=None, keepdim=False, correction=None:
          self.var(dim, unbiased, keepdim, correction=correction).sqrt())
composite("var_mean(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
          "Scalar? correction=None) -> (Tensor, Tensor)",
          lambda self, dim=None, unbiased=None, keepdim=False, correction=None:
          (self.var(dim, unbiased, keepdim, correction=correction), self.mean(dim, keepdim)))
composite("std_mean(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
          "Scalar? correction=None) -> (Tensor, Tensor)",
          lambda self, dim=None, unbiased=None, keepdim=False, correction=None:
          (self.std(dim, unbiased, keepdim, correction=correction), self.mean(dim, keepdim)))


def _logsumexp(self, dim, keepdim=False):
    from tilewise.autograd.grad_mode import no_grad

    if not self.dtype.is_floating_point:
        self = self.float()
    with no_grad():
        m = self.amax(dim, keepdim=True)
        m = m.masked_fill(m.isinf(), 0.0)
    out = (self - m).exp().sum(dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(dim)


composite("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", _logsumexp,
          {"self": "grad_expanded(grad, self_shape, dim, keepdim) * exp(self - "
                   "grad_expanded(result, self_shape, dim, keepdim))"}, autocast="fp32")


def _norm(self, p=2, dim=None, keepdim=False, dtype=None):
    x = self if dtype is None else self.to(dtype)
    if p is None or p == 2 or p == "fro":
        return (x * x).sum(dim, keepdim).sqrt()
    if p == 1:
        return x.abs().sum(dim, keepdim)
    if p == float("inf"):
        return x.abs().amax(dim, keepdim)
    if p == float("-inf"):
        return x.abs().amin(dim, keepdim)
    if p == 0:
        return (x != 0).to(x.dtype).sum(dim, keepdim)
    return (x.abs() ** p).sum(dim, keepdim) ** (1.0 / p)


composite("norm(Tensor self, Scalar? p=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
          _norm, {"self": "norm_backward(grad, self, result, p, dim, keepdim)"}, autocast="fp32")
composite("count_nonzero(Tensor self, int[1]? dim=None) -> Tensor", lambda self, dim=None: (self != 0).sum(dim),
          differentiable=False)
