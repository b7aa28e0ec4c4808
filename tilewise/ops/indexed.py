"""Reductions into indexed positions: scatter_reduce (sum, prod, mean, amax, amin; with or without ``self``'s
own values), index_reduce, put; and the fused matrix-vector products addmv, addr, addbmm.

scatter_reduce is a primitive (a numpy kernel; CUDA runs it on the host): several sources may land on one
position, so the result is an unordered reduction per position. Its derivative follows torch's: a sum
passes the gradient through, a mean divides it by each position's count, amax/amin share it evenly among
the values equal to the result, and prod divides the result by each factor (refused where a factor is 0).
index_reduce and put compose scatter_reduce and index_put.
"""

from __future__ import annotations

import warnings

from tilewise import dtypes
from tilewise import strides as S
from tilewise.dtypes import c10_name
from tilewise.layouts import in_order_of
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import shift_dims
from tilewise.ops.formulas import HELPERS
from tilewise.ops.indexing import check_scatter_src, nonempty_shape
from tilewise.ops.movement import _index_errors_named, check_flat_range, check_index_dtype, check_index_range
from tilewise.ops.registry import call, declare
from tilewise.tensor import Tensor

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


_LEGACY_SPELLINGS = {"max": "amax", "min": "amin"}  # torch still accepts these


def canonical_reduction(reduce: str, op: str) -> str:
    reduce = _LEGACY_SPELLINGS.get(reduce, reduce)
    if reduce not in SCATTER_REDUCTIONS:
        raise RuntimeError(f"{op}(): reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return reduce


def _counts(self, dim, index, include_self):
    """How many values each position of the result reduces (at least 1, as torch divides by)."""
    ones = index.new_ones(index.shape, dtype=self.dtype)
    start = self.new_ones(self.shape) if include_self else self.new_zeros(self.shape)
    return start.scatter_add(dim, index, ones).clamp(min=1)


def scatter_reduce_backward(grad, self, dim, index, src, reduce, include_self, result):
    """(gradient of self, gradient of src) of scatter_reduce."""
    reduce = canonical_reduction(reduce, "scatter_reduce")
    written = self.new_zeros(self.shape, dtype=grad.dtype).scatter(dim, index, 1.0) > 0
    keep_self = grad if include_self else call("where", written, grad.new_zeros(()), grad)
    if reduce == "sum":
        return keep_self, grad.gather(dim, index)
    if reduce == "mean":
        share = grad / _counts(self, dim, index, include_self)
        return (share if include_self else call("where", written, share.new_zeros(()), share)), share.gather(dim, index)
    if reduce in ("amax", "amin"):
        picked = result.gather(dim, index)
        src_hit = (src == picked).to(grad.dtype)
        self_hit = (self == result).to(grad.dtype)  # counted among the ties even without include_self, as torch
        ties = self_hit.scatter_add(dim, index, src_hit)
        share = grad / ties.clamp(min=1)
        grad_self = self_hit * share
        if not include_self:
            grad_self = call("where", written, grad_self.new_zeros(()), grad_self)
        return grad_self, src_hit * share.gather(dim, index)
    return _prod_backward(grad, self, dim, index, src, include_self, result, written)


def _prod_backward(grad, self, dim, index, src, include_self, result, written):
    """torch's formula: each factor's gradient is the product of the others, formed without dividing by a zero
    (a zero factor's own gradient is the product of the rest; with two zeros at one position every gradient
    there is 0)."""
    zero = grad.new_zeros(())
    if include_self:
        self_zero = self == 0
        masked_self = call("where", self_zero, grad.new_ones(()), self)
        others = masked_self.scatter_reduce(dim, index, src, "prod", include_self=True)
        grad_self = grad * others / masked_self
    else:
        grad_self = call("where", written, zero, grad)
    src_zero = src == 0
    zeros_there = self.new_zeros(self.shape, dtype=grad.dtype).scatter_add(dim, index, src_zero.to(grad.dtype))
    single_zero = src_zero & (zeros_there.gather(dim, index) == 1)
    masked_src = call("where", single_zero, src.new_ones(()), src)
    without_it = self.scatter_reduce(dim, index, masked_src, "prod", include_self=include_self)
    by_division = (grad * result).gather(dim, index) / call("where", src_zero, src.new_ones(()), src)
    return grad_self, call("where", single_zero, (grad * without_it).gather(dim, index), by_division)


HELPERS.update(scatter_reduce_backward=scatter_reduce_backward)
declare("scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True)"
        " -> Tensor", "index", dtype=R.first_input, inplace=True, check=check_scatter_src,
        grad={"self, src": "scatter_reduce_backward(grad, self, dim, index, src, reduce, include_self, result)",
              "index": None}, batch=shift_dims,
        fwd="scatter_reduce_jvp(self_t, src_t, dim, index, self, src, reduce, include_self, result)")


_LEGACY_SCATTER = {"add": "sum", "multiply": "prod"}


def _legacy_reduction(reduce: str) -> str:
    found = _LEGACY_SCATTER.get(reduce)
    if found is None:
        raise RuntimeError("reduce argument must be either add or multiply.")
    return found


def _scatter_reduce_legacy(self, dim, index, src, reduce):
    """``scatter(dim, index, src, reduce="add" | "multiply")``: torch's older spelling of ``scatter_reduce`` with
    ``self``'s values included ("sum", "prod"), deprecated in torch for tensor sources."""
    if not isinstance(src, Tensor):  # a number reaches this overload first: scatter.value_reduce's meaning
        return _scatter_value_reduce(self, dim, index, src, reduce)
    reduction = _legacy_reduction(reduce)
    warnings.warn("The reduce argument of torch.scatter with Tensor src is deprecated and will be removed in a "
                  "future PyTorch release. Use torch.scatter_reduce instead for more reduction options.",
                  UserWarning, stacklevel=4)
    return call("scatter_reduce", self, dim, index, src, reduction, include_self=True)


def _scatter_value_reduce(self, dim, index, value, reduce):
    """``scatter(dim, index, value, reduce=...)``: each indexed position reduced with the number."""
    reduction = _legacy_reduction(reduce)
    return call("scatter_reduce", self, dim, index, self.new_full(index.shape, value), reduction, include_self=True)


declare("scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor", "composite",
        decomposition=_scatter_reduce_legacy, inplace=True)
declare("scatter.value_reduce(Tensor self, int dim, Tensor index, Scalar value, *, str reduce) -> Tensor",
        "composite", decomposition=_scatter_value_reduce, inplace=True)


def _index_reduce(self, dim, index, source, reduce, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    if index.ndim > 1:
        raise IndexError(f"index_reduce_(): Index is supposed to be a vector, got {index.ndim} dimensions")
    check_index_dtype(index, "index_reduce")
    d = S.normalize_dim(dim, self.ndim, "index_reduce")
    if source.ndim != self.ndim:
        raise RuntimeError(f"index_reduce(): source tensor shape must match self tensor shape, excluding the specified "
                           f"dimension. Got self.shape = {list(self.shape)} source.shape = {list(source.shape)} "
                           "(both need the same number of dims)")
    check_index_range(index, nonempty_shape(self.shape)[d], d, "index_reduce")
    shape = [1] * source.ndim
    if source.ndim:
        shape[d] = -1
    spread = index.reshape(shape).expand(source.shape) if source.ndim else index.reshape(())
    return call("scatter_reduce", self, d, spread, source, reduce, include_self=include_self)


def _put(self, index, source, accumulate=False):
    check_index_dtype(index, "put")
    check_flat_range(index, self.numel(), "put")
    flat = self.reshape(-1)
    with _index_errors_named("put"):
        out = flat.index_put((index.reshape(-1),), source.reshape(-1).to(self.dtype), accumulate)
    return in_order_of(out.reshape(self.shape), self)  # torch puts into a clone of self under preserve_format


declare("index_reduce(Tensor self, int dim, Tensor index, Tensor source, str reduce, *, bool include_self=True)"
        " -> Tensor", "composite", decomposition=_index_reduce, inplace=True)
declare("put(Tensor self, Tensor index, Tensor source, bool accumulate=False) -> Tensor", "composite",
        decomposition=_put, inplace=True, out=False)


# ---------------------------------------------------------------- products with an added term
def _scaled_sum(self, product, beta, alpha, row_major: bool = False):
    """beta * self + alpha * product; with beta == 0, ``self`` is ignored (its NaN too), as torch does. The sum is
    laid out in self's order (torch's addr), or with ``row_major`` in the product's (torch's addbmm)."""
    scaled = product if alpha == 1 else product * alpha
    if beta == 0:  # a zero that still connects self to the graph (torch gives it a zero gradient)
        return scaled + call("where", self.new_ones((), dtype=dtypes.bool_), self.new_zeros(()), self)
    term = self if beta == 1 else self * beta
    return scaled + term if row_major else term + scaled


def _addmv(self, mat, vec, beta=1, alpha=1):
    """torch's checks in its order: the dims, the sizes (``self`` of one element or ``mat``'s rows), one dtype."""
    if mat.ndim != 2 or vec.ndim != 1 or self.ndim > 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {self.ndim}, {mat.ndim}, {vec.ndim}")
    if self.ndim == 0 and mat.shape[1] != vec.shape[0]:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    if mat.shape[1] != vec.shape[0] or (self.ndim == 1 and self.shape[0] not in (1, mat.shape[0])):
        rows = self.shape[0] if self.ndim else 1
        raise RuntimeError(f"size mismatch, got input ({rows}), mat ({mat.shape[0]}x{mat.shape[1]}), "
                           f"vec ({vec.shape[0]})")
    if not (self.dtype is mat.dtype and mat.dtype is vec.dtype):
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {c10_name(self.dtype)}, "
                           f"{c10_name(mat.dtype)}, and {c10_name(vec.dtype)}")
    return _scaled_sum(self, mat.matmul(vec), beta, alpha)


def _addr(self, vec1, vec2, beta=1, alpha=1):
    if vec1.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"addr: Expected 1-D argument vec1, but got {vec1.ndim}-D" if vec1.ndim != 1 else
                           f"addr: Expected 1-D argument vec2, but got {vec2.ndim}-D")
    return _scaled_sum(self, vec1.outer(vec2), beta, alpha)


def _addbmm(self, batch1, batch2, beta=1, alpha=1):
    if batch1.ndim != 3 or batch2.ndim != 3:
        raise RuntimeError(f"batch1 must be a 3D tensor (got {batch1.ndim}-D and {batch2.ndim}-D)")
    return _scaled_sum(self, batch1.bmm(batch2).sum(0), beta, alpha, row_major=True)


declare("addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor", "composite",
        decomposition=_addmv, inplace=True, autocast={"cuda": "lower"})
declare("addr(Tensor self, Tensor vec1, Tensor vec2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", "composite",
        decomposition=_addr, inplace=True, autocast={"cuda": "lower"})
declare("addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        "composite", decomposition=_addbmm, inplace=True, autocast="lower")
