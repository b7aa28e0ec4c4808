"""Distances and norm-based operators of the torch namespace: dist, cdist, renorm, and the older spellings of
matrix norms (frobenius_norm, nuclear_norm).

All are composites of ``linalg.vector_norm`` / ``linalg.matrix_norm`` and pointwise operators, so their
gradients (zero where a distance is zero, as torch's), every backend and the compiler come from those.
``cdist`` computes each distance from the difference of the two rows, torch's exact path; torch switches to a
matrix-product form for p = 2 past 25 rows, which agrees to rounding.
"""

from __future__ import annotations

import warnings

from tilewise import strides as S
from tilewise.dtypes import c10_name
from tilewise.ops.registry import OPS, declare


def _vector_norm(x, p, dims, keepdim=False):
    return OPS["linalg_vector_norm"](x, p, dims, keepdim)


def _dist(self, other, p=2):
    return _vector_norm(self - other, p, None)


declare("dist(Tensor self, Tensor other, Scalar p=2) -> Tensor", "composite", decomposition=_dist,
        autocast={"cuda": "fp32"}, out=False)

_COMPUTE_MODES = (None, "use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                  "donot_use_mm_for_euclid_dist")


def _cdist(x1, x2, p=2.0, compute_mode=None):
    """The p-norm distance between every row of x1 ([..., P, M]) and every row of x2 ([..., R, M]): [..., P, R]."""
    if compute_mode not in _COMPUTE_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    for name, x in (("X1", x1), ("X2", x2)):
        if x.ndim < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {x.ndim}D")
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {c10_name(x.dtype)}")
    if x1.dtype is not x2.dtype:
        raise RuntimeError(f"expected scalar type {c10_name(x1.dtype)} but found {c10_name(x2.dtype)}")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    return _vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, (-1,))


declare("cdist(Tensor x1, Tensor x2, float p=2.0, str? compute_mode=None) -> Tensor", "composite",
        decomposition=_cdist, method=False, autocast="fp32", out=False)


def _renorm(self, p, dim, maxnorm):
    """Each slice along ``dim`` whose p-norm exceeds ``maxnorm`` scaled to norm ``maxnorm`` (torch's 1e-7 guard
    included)."""
    if p <= 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    if self.ndim <= 1:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {self.ndim} dimensions")
    dim = S.normalize_dim(dim, self.ndim, "renorm")
    others = tuple(d for d in range(self.ndim) if d != dim)
    norm = _vector_norm(self, p, others, True)
    factor = OPS["where.self"](norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return (self * factor.to(self.dtype)).contiguous()  # row-major, as torch's


declare("renorm(Tensor self, Scalar p, int dim, Scalar maxnorm) -> Tensor", "composite", decomposition=_renorm,
        inplace=True, autocast={"cuda": "fp32"})


def _frobenius_norm(self, dim, keepdim=False):
    dims = [dim] if isinstance(dim, int) else list(dim)
    if len(dims) > 2:
        raise RuntimeError(f"Expected at most 2 dimensions, but got {len(dims)} dimensions instead.")
    return _vector_norm(self, 2, dims or None, keepdim)


declare("frobenius_norm(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", "composite",
        decomposition=_frobenius_norm, method=False, autocast={"cuda": "fp32"})


def _nuclear_norm(self, dim=(-2, -1), keepdim=False):
    warnings.warn("nuclear_norm is deprecated and it is just left for JIT compatibility. It will be removed in a "
                  "future PyTorch release. Please use `linalg.matrix_norm(A, 'nuc', dim, keepdim)` instead",
                  UserWarning, stacklevel=4)
    return OPS["linalg_matrix_norm"](self, "nuc", list(dim), keepdim)


declare("nuclear_norm(Tensor self, bool keepdim=False) -> Tensor", "composite",
        decomposition=lambda self, keepdim=False: _nuclear_norm(self, (-2, -1), keepdim), method=False,
        autocast={"cuda": "fp32"})
declare("nuclear_norm.dim(Tensor self, int[2] dim, bool keepdim=False) -> Tensor", "composite",
        decomposition=_nuclear_norm, method=False, autocast={"cuda": "fp32"})
