"""Scans and sorting: cumulative sums and products, running extrema, sort and what is built on it.

[Note: scans and sorting] Four scans (cumsum, cumprod, cummax, cummin), ``sort`` and ``searchsorted`` are
primitives with a kernel per backend, and so is ``topk`` (selecting k of n elements is O(n), sorting them all
is not); argsort, kthvalue and median compose ``sort``. Every value the sorting ops and cummax/cummin output is
an input element, so one derivative serves them all: each gradient is added back at the position the
``indices`` output names. Backward reads those returned indices, as torch's does, so changing them in place
before backward is the error it is in torch (cummax and cummin save their input too, as torch does). The
cumulative product's derivative never divides by zero: it divides only before the first zero of a slice and
uses a product that skips that zero at its position (the idea of ``prod_backward``); under ``create_graph`` it
forms every product explicitly, so second derivatives at zeros are exact too.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise.layouts import contiguous_format
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import shift_dims
from tilewise.ops.batching_rules import searchsorted_rule
from tilewise.ops.formulas import HELPERS
from tilewise.ops.reductions import nonempty_reduction
from tilewise.ops.registry import OPS, declare

# ---------------------------------------------------------------- derivative helpers


def reverse_cumsum(x, dim: int):
    """``out[i] = sum(x[j] for j >= i)`` along ``dim``."""
    return x.flip([dim]).cumsum(dim).flip([dim])


def picked_backward(grad, self_shape, dim: int, indices):
    """Gradient of an op whose outputs are input elements picked along ``dim`` (sort, cummax): each gradient
    is added back at the position ``indices`` names."""
    from tilewise.ops.creation import zeros

    if len(self_shape) == 0:
        return grad
    return zeros(self_shape, dtype=grad.dtype, device=grad.device).scatter_add(dim, indices, grad)


def cummaxmin_backward(grad, self, indices, dim: int):
    """cummax/cummin: torch's, which reads the input for its shape; torch saves the input and the returned
    indices, so changing either in place before backward is an error in both."""
    return picked_backward(grad, self.shape, dim, indices)


def cumprod_backward(grad, self, result, dim: int):
    """d out_i / d x_k = prod(x_j for j <= i, j != k) for i >= k, summed against ``grad``.

    Without grad mode (a plain backward) this is O(n) and divides only where it is exact: before the first zero
    of a slice, ``result_i / x_k``; at the first zero, a cumprod that skips it; after it, every product holds
    the zero. Under grad mode (``create_graph=True``) the gradient must stay a polynomial in ``self`` so its own
    derivative is right at zeros too, so every product is formed explicitly, in O(n^2), as torch does. Complex
    inputs take the conjugate of the derivative, as every holomorphic function's gradient does.
    """
    from tilewise.dispatch import STATE

    if self.ndim == 0 or self.numel() == 0:
        return grad
    if self.is_complex():
        self, result = self.conj(), result.conj()
    if STATE.grad_enabled:
        return _cumprod_backward_by_products(grad, self, dim)
    is_zero = self == 0
    zeros_so_far = is_zero.cumsum(dim)
    before_zero = zeros_so_far == 0
    first_zero = is_zero & (zeros_so_far == 1)
    before = reverse_cumsum(grad * result, dim) / self.where(before_zero, 1)
    skipping = self.where(~first_zero, 1).cumprod(dim)
    at_zero = reverse_cumsum((grad * skipping).where(~before_zero, 0), dim)
    return before.where(before_zero, at_zero.where(first_zero, 0))


def _cumprod_backward_by_products(grad, self, dim: int):
    from tilewise.dtypes import bool_
    from tilewise.ops.creation import arange, eye

    x, g = self.movedim(dim, -1), grad.movedim(dim, -1)
    n = x.shape[-1]
    diagonal = eye(n, dtype=bool_, device=x.device)
    rows = x.unsqueeze(-2).expand(*x.shape[:-1], n, n).where(~diagonal, 1)  # rows[..., k, j]: x_j, 1 at j == k
    products = rows.cumprod(-1)  # products[..., k, i] = prod(x_j for j <= i, j != k)
    later = arange(n, device=x.device).unsqueeze(1) <= arange(n, device=x.device)  # i >= k
    return (products * g.unsqueeze(-2)).where(later, 0).sum(-1).movedim(-1, dim)


HELPERS.update(reverse_cumsum=reverse_cumsum, picked_backward=picked_backward, cummaxmin_backward=cummaxmin_backward,
               cumprod_backward=cumprod_backward)

# ---------------------------------------------------------------- primitives

declare("cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", "scan", dtype=R.reduction_sum,
        grad={"self": "reverse_cumsum(grad, dim)"}, fwd="auto_linear", inplace=True, autocast={"cuda": "fp32"},
        doc="Cumulative sum along ``dim``; integer and bool inputs accumulate in int64.\n\n"
            ">>> tw.tensor([1, 2, 3]).cumsum(0)\ntensor([1, 3, 6])")
declare("cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor", "scan", dtype=R.reduction_sum,
        grad={"self": "cumprod_backward(grad, self, result, dim)"}, inplace=True, autocast={"cuda": "fp32"},
        doc="Cumulative product along ``dim``.\n\n>>> tw.tensor([1., 2., 3.]).cumprod(0)\ntensor([1., 2., 6.])",
        fwd="cumprod_jvp(self, self_t, result, dim)")
declare("cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)", "scan", dtype=R.first_input,
        grad={"self": "cummaxmin_backward(grad, self, result[1], dim)"}, nondiff_outputs=(1,),
        doc="Running maximum along ``dim`` and where it was attained (the latest position among ties).",
        fwd="picked_jvp(self_t, dim, result[1])")
declare("cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)", "scan", dtype=R.first_input,
        grad={"self": "cummaxmin_backward(grad, self, result[1], dim)"}, nondiff_outputs=(1,),
        doc="Running minimum along ``dim`` and where it was attained (the latest position among ties).",
        fwd="picked_jvp(self_t, dim, result[1])")
declare("sort(Tensor self, int dim=-1, bool descending=False, *, bool? stable=False) -> "
        "(Tensor values, Tensor indices)", "sort", dtype=R.first_input,
        grad={"self": "picked_backward(grad, self_shape, dim, result[1])"}, nondiff_outputs=(1,),
        doc="Sorted values along ``dim`` and their original positions. Always stable: equal elements keep their "
            "order, also when descending. NaN sorts above every number.\n\n"
            ">>> tw.tensor([3., 1., 2.]).sort()[1]\ntensor([1, 2, 0])", batch=shift_dims,
        fwd="picked_jvp(self_t, dim, result[1])")
declare("topk(Tensor self, int k, int dim=-1, bool largest=True, bool sorted=True) -> "
        "(Tensor values, Tensor indices)", "sort", dtype=R.first_input,
        grad={"self": "picked_backward(grad, self_shape, dim, result[1])"}, nondiff_outputs=(1,),
        doc="The ``k`` largest (or smallest) elements along ``dim``, always in sorted order. A primitive rather than "
            "a slice of ``sort``: selecting k of n elements costs O(n), not O(n log n).\n\n"
            ">>> tw.tensor([1., 5., 3.]).topk(2)[0]\ntensor([5., 3.])", batch=shift_dims,
        fwd="picked_jvp(self_t, dim, result[1])")
declare("searchsorted(Tensor sorted_sequence, Tensor self, *, bool out_int32=False, bool right=False, "
        "str? side=None, Tensor? sorter=None) -> Tensor", "sort", differentiable=False, method=False,
        doc="Insertion positions of ``self``'s values in the innermost dim of ``sorted_sequence``.\n\n"
            ">>> tw.searchsorted(tw.tensor([1, 3, 5]), tw.tensor([3, 6]))\ntensor([1, 3])", batch=searchsorted_rule)


def check_searchsorted(sorted_sequence, self, out_int32: bool, right: bool, side, sorter):
    """(whether to search from the right, the dtype both sides are compared in), after checking the arguments
    (shared by every backend's searchsorted kernel).

    [Note: searchsorted] Both sides are converted to their promoted dtype and compared there, and the search is
    torch's binary search exactly: ``lo, hi = 0, n``; ``mid = lo + (hi - lo) // 2``; go right while
    ``not (seq[mid] >= v)`` (``>`` for ``right``). Every comparison with NaN is false, so a NaN value lands at
    ``n``, and a NaN inside the sequence is passed over as if it were smaller than every value: the answers
    are torch's, not numpy's (which sorts NaN last), even for an unsorted sequence. ``sorter[..., mid]`` names
    the element looked at when a sorter is given; an entry outside ``[0, n)`` is an index error.
    """
    from tilewise import dtypes
    from tilewise.tensor import Tensor

    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left while "
                           "right was True")
    shape = tuple(sorted_sequence.shape)
    if not shape:
        raise RuntimeError("searchsorted(): sorted_sequence must have at least one dimension, got a 0-dim tensor")
    scalar = not isinstance(self, Tensor) or self.ndim == 0
    if len(shape) > 1 and scalar:
        raise RuntimeError(f"torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension "
                           f"is 1, but we got boundaries tensor dim({len(shape)}) and input value's dim(0) numel(1)")
    if len(shape) > 1 and tuple(self.shape[:-1]) != shape[:-1]:
        raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions "
                           f"of boundaries tensor and input value tensor must match, but we got boundaries tensor "
                           f"{list(shape)} and input value tensor {list(self.shape)}")
    if sorter is not None:
        if sorter.dtype is not dtypes.int64:
            raise RuntimeError(f"searchsorted(): sorter must be an int64 tensor, got dtype {sorter.dtype.name}")
        if tuple(sorter.shape) != shape:
            raise RuntimeError(f"searchsorted(): sorter shape {list(sorter.shape)} must equal sorted_sequence shape "
                               f"{list(shape)}")
    if out_int32 and shape[-1] >= 2**31 - 1:
        raise RuntimeError(f"searchsorted(): out_int32=True holds positions up to 2**31 - 2, but the last dim of "
                           f"sorted_sequence has {shape[-1]} elements; use out_int32=False")
    return right or side == "right", dtypes.result_type(sorted_sequence, self)


# ---------------------------------------------------------------- composites over sort

def _argsort(self, dim=-1, descending=False, stable=False):
    return self.sort(dim=dim, descending=descending, stable=stable)[1]


def refuse_bool(self, kernel: str) -> None:
    """torch's CPU selection kernels (kthvalue, median, nanmedian) have no bool instance."""
    if self.dtype is dtypes.bool_:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def check_topk(self, k: int, dim: int) -> int:
    """The normalised dim, after checking ``k`` fits it (shared by every backend's topk kernel)."""
    d = S.normalize_dim(dim, self.ndim, "topk")
    n = self.shape[d] if self.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"selected index k out of range (topk(): k ({k}) is out of range for dimension {d} of size "
                           f"{n}, input shape {list(self.shape)}; k must be in [0, {n}])")
    if self.dtype is dtypes.bool_ and self.device.type == "cpu":
        raise RuntimeError("topk does not support bool dtypes on CPU")
    return d


def _kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim:  # torch answers a 0-dim tensor before its kernel
        refuse_bool(self, "kthvalue_cpu")
    d = S.normalize_dim(dim, self.ndim, "kthvalue")
    n = self.shape[d] if self.ndim else 1
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d} (k is {k}, the dimension's "
                           f"size {n}, input shape {list(self.shape)}; k must be in [1, {n}])")
    values, indices = self.sort(dim=d, stable=True)
    if self.ndim == 0:
        return values, indices
    # fresh and row-major, as torch's (a slice of the sorted values would be a view of them)
    values, indices = (t.select(d, k - 1).clone(memory_format=contiguous_format) for t in (values, indices))
    if keepdim:
        return values.unsqueeze(d), indices.unsqueeze(d)
    return values, indices


def _median_dim(self, dim, keepdim=False):
    """The lower median; a slice holding NaN has median NaN, found at its first NaN (torch's rule). The value is
    read back at the index, where the derivative sends the gradient, NaN or not."""
    refuse_bool(self, "median_out")
    d = S.normalize_dim(dim, self.ndim, "median")
    n = self.shape[d] if self.ndim else 1
    k = (n - 1) // 2 + 1
    if not self.dtype.is_floating_point or self.ndim == 0:
        return _kthvalue(self, k, d, keepdim)
    indices = _kthvalue(self, k, d, keepdim=True)[1]
    nan = self.isnan()
    indices = indices.where(~nan.any(d, keepdim=True), nan.to(self.dtype).argmax(d, keepdim=True))
    values = self.gather(d, indices)
    return (values, indices) if keepdim else (values.squeeze(d), indices.squeeze(d))


def _median(self):
    flat = self.reshape(-1)
    if flat.numel():  # torch answers an empty tensor before its kernel
        refuse_bool(self, "median_cpu")
    if flat.numel() == 0:
        return OPS["full"]((), float("nan"), dtype=self.dtype, device=self.device)
    return _median_dim(flat, 0)[0]


# kthvalue and median.dim route each gradient to the index they return (torch's
# value_selecting_reduction_backward): they save those indices, not their input, as torch does.
_PICKED_ALONG_DIM = "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"

declare("argsort(Tensor self, int dim=-1, bool descending=False, *, bool stable=False) -> Tensor", "composite",
        decomposition=_argsort, differentiable=False, out_needs="stable")
declare("kthvalue(Tensor self, int k, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)",
        "composite", decomposition=_kthvalue, grad={"self": _PICKED_ALONG_DIM}, nondiff_outputs=(1,),
        check=nonempty_reduction(dim_position=2),
        doc="The ``k``-th smallest element along ``dim`` (1-based) and its position.",
        fwd="selected_jvp(self_t, dim, result[1], keepdim)")
declare("median(Tensor self) -> Tensor", "composite", decomposition=_median,
        grad={"self": "evenly_distribute_backward(grad, self, result)"}, fwd="evenly_read_jvp(self_t, self, result)",
        doc="The lower median of all elements; its gradient is shared evenly among the elements equal to it (among "
            "the NaNs when it is NaN).", out=False)
declare("median.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", "composite",
        decomposition=_median_dim, grad={"self": _PICKED_ALONG_DIM}, nondiff_outputs=(1,), check=nonempty_reduction(),
        doc="The lower median along ``dim`` and its position.",
        fwd="selected_jvp(self_t, dim, result[1], keepdim)")
