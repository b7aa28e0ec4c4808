"""Comparison of whole tensors, set operations and counting: isclose, allclose, equal, unique,
unique_consecutive, isin, bincount, histc, bucketize; NaN-ignoring and paired reductions (nansum, nanmean,
aminmax); logcumsumexp; msort, argwhere.

unique, unique_consecutive, bincount and histc produce a result whose size depends on the values; they are
primitives with numpy kernels (``backends/cpu/api_kernels.py``). The rest compose existing operators, so
they run on every device and differentiate through their decomposition.
"""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise.dispatch import values_readable
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import dynamic_shape, loop, shift_dims
from tilewise.ops.formulas import HELPERS
from tilewise.ops.reductions import nonempty_reduction
from tilewise.ops.registry import call, declare
from tilewise.ops.scans import refuse_bool
from tilewise.tensor import Tensor


def composite(schema: str, decomposition, **attrs):
    return declare(schema, "composite", decomposition=decomposition, **attrs)


def _as_tensor(value, like: Tensor | None = None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    from tilewise.tensor import tensor

    return tensor(value, device=like.device if like is not None else None)


# ---------------------------------------------------------------- closeness and equality
def _isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    if self.dtype is not other.dtype:
        raise RuntimeError(f"isclose: {self.dtype.name} did not match {other.dtype.name}; both tensors must have "
                           "the same dtype")
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    close = self == other
    if self.dtype is dtypes.bool_:
        return close
    if equal_nan and self.dtype.is_floating_point:
        close = close | (self.isnan() & other.isnan())
    if rtol == 0 and atol == 0:
        return close
    wide = dtypes.get_default_dtype() if not self.dtype.is_floating_point else self.dtype
    a, b = self.to(wide), other.to(wide)
    error = (a - b).abs()
    return close | (error.isfinite() & (error <= atol + rtol * b.abs()))


def _allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return bool(_isclose(self, other, rtol, atol, equal_nan).all().item())


def _equal(self, other) -> bool:
    if self.shape != other.shape:
        return False
    return bool((self == other).all().item())


composite("isclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> Tensor",
          _isclose, differentiable=False, out=False)
composite("allclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> bool",
          _allclose, differentiable=False)
composite("equal(Tensor self, Tensor other) -> bool", _equal, differentiable=False)


# ---------------------------------------------------------------- unique values and membership
declare("unique_dim(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False, "
        "int? dim=None, bool consecutive=False) -> (Tensor, Tensor, Tensor)", "other", differentiable=False,
        public=False, data_dependent=True,
        batch=dynamic_shape)  # how many values are unique: a graph break under compile


def _unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):
    from tilewise.ops.registry import OPS

    values, inverse, counts = OPS["unique_dim"](self, sorted, return_inverse, return_counts, dim, False)
    return _select_outputs(values, inverse, counts, return_inverse, return_counts)


def _unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    from tilewise.ops.registry import OPS

    values, inverse, counts = OPS["unique_dim"](self, True, return_inverse, return_counts, dim, True)
    return _select_outputs(values, inverse, counts, return_inverse, return_counts)


def _select_outputs(values, inverse, counts, return_inverse, return_counts):
    if not (return_inverse or return_counts):
        return values
    return (values, *([inverse] if return_inverse else []), *([counts] if return_counts else []))


composite("unique(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False, int? dim=None)"
          " -> Tensor[]", _unique, differentiable=False, out=False)
composite("unique_consecutive(Tensor self, bool return_inverse=False, bool return_counts=False, int? dim=None)"
          " -> Tensor[]", _unique_consecutive, differentiable=False, out=False)


def _isin(elements, test_elements, assume_unique=False, invert=False):
    if isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):  # one value: a comparison, and no
        found = elements == test_elements  # tensor made from it (a constant the compiler's passes cannot hold)
        return (found.logical_not() if invert else found).contiguous()  # row-major, as torch's
    elements = _as_tensor(elements, test_elements if isinstance(test_elements, Tensor) else None)
    test = _as_tensor(test_elements, elements).reshape(-1)
    common = dtypes.result_type(elements, test)
    elements, test = elements.to(common), test.to(common)
    if test.numel() == 0:
        found = elements.new_zeros(elements.shape, dtype=dtypes.bool_)
    else:
        ordered = test.sort().values
        position = call("searchsorted", ordered, elements).clamp(max=test.numel() - 1)
        found = ordered[position] == elements
    return found.logical_not() if invert else found


composite("isin(Tensor elements, Tensor test_elements, *, bool assume_unique=False, bool invert=False) -> Tensor",
          _isin, differentiable=False, method=False)


def _bucketize(self, boundaries, out_int32=False, right=False):
    self = _as_tensor(self, boundaries)
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return call("searchsorted", boundaries, self, out_int32=out_int32, right=right)


composite("bucketize(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor",
          _bucketize, differentiable=False)


def _bincount_dtype(op, args):
    weights = args[1]
    if weights is None:
        return dtypes.int64, dtypes.int64
    out = weights.dtype if weights.dtype.is_floating_point else dtypes.float64
    return out, out


declare("bincount(Tensor self, Tensor? weights=None, int minlength=0) -> Tensor", "other", dtype=_bincount_dtype,
        differentiable=False, data_dependent=True, batch=loop, out=False)  # its length is the largest value's
declare("histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor", "other", dtype=R.first_input,
        differentiable=False, data_dependent=True, batch=loop)  # min == max: the range is the values' own


# ---------------------------------------------------------------- NaN-ignoring and paired reductions
def _nansum(self, dim=None, keepdim=False, dtype=None):
    if self.dtype.is_floating_point:
        self = self.masked_fill(self.isnan(), 0)
    return self.sum(dim, keepdim, dtype=dtype)


def _nanmean(self, dim=None, keepdim=False, dtype=None):
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"nanmean(): expected input to have floating point or complex dtype but got "
                           f"{self.dtype.name}")
    present = self.isnan().logical_not()
    return call("nansum", self, dim, keepdim, dtype=dtype) / present.sum(dim, keepdim)


def _aminmax(self, dim=None, keepdim=False):
    if dim is None and keepdim:
        return self.amin().reshape((1,) * self.ndim), self.amax().reshape((1,) * self.ndim)
    if dim is None:
        return self.amin(), self.amax()
    return self.amin(dim, keepdim), self.amax(dim, keepdim)


composite("nansum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", _nansum,
          grad={"self": "(expand_reduced(grad, self_shape, dim, keepdim) * isnan(self).logical_not()).to(self.dtype)"},
          fwd="nansum_jvp(self, self_t, dim, keepdim)")
composite("nanmean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
          _nanmean)
def _check_aminmax(op, args: tuple) -> None:
    if args[1] is None and 0 in args[0]._shape:  # torch's words for aminmax over the whole of an empty tensor
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
                           "identity.")
    _nonempty_along_dim(op, args)


_nonempty_along_dim = nonempty_reduction()
composite("aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)", _aminmax,
          check=_check_aminmax)


def logcumsumexp_backward(grad, self, result, dim):
    """torch's formula in log space: the positive and negative parts of ``grad`` each summed from the end by
    logcumsumexp, so that no exp of a large value is ever formed; a complex ``grad`` (its conjugate's log) needs no
    split."""
    if grad.numel() == 0:
        return grad
    dim = dim % max(self.ndim, 1)
    if grad.is_complex():
        log_grad = grad.conj().log()
        if self.ndim == 0:
            return (log_grad - result + self).exp().conj()
        return ((log_grad - result).flip(dim).logcumsumexp(dim).flip(dim) + self).exp().conj()
    minus_inf = grad.new_full((), -math.inf)
    log_pos = call("where", grad > 0, grad.abs().log(), minus_inf)
    log_neg = call("where", grad < 0, grad.abs().log(), minus_inf)

    def from_end(log_part):
        if self.ndim == 0:
            return (log_part - result + self).exp()
        return ((log_part - result).flip(dim).logcumsumexp(dim).flip(dim) + self).exp()

    return from_end(log_pos) - from_end(log_neg)


def logcumsumexp_jvp(self, self_t, result, dim):
    """sum over j <= i of exp(self_j - result_i) * self_t_j, with exps scaled by the slice's largest input so none
    overflows; 0 where the result is -inf (no element yet contributes)."""
    if self.numel() == 0:
        return self_t
    if self.is_complex():  # no maximum to scale by: torch's formula as it is for complex inputs
        exp = self.exp()
        return (exp * self_t).cumsum(dim) / exp.cumsum(dim)
    peak = self.amax(dim, keepdim=True)
    peak = peak.masked_fill(~peak.isfinite(), 0)
    scaled = (self_t * (self - peak).exp()).cumsum(dim)
    return (scaled * (peak - result).exp()).masked_fill(result == -math.inf, 0)


HELPERS.update(logcumsumexp_backward=logcumsumexp_backward, logcumsumexp_jvp=logcumsumexp_jvp)
def _floating_or_complex(op, args) -> None:
    """torch has floating and complex kernels only for logcumsumexp: integers and bools are NotImplementedError,
    its kernel named; a dim out of range is refused first, as torch's."""
    from tilewise import strides as S

    S.normalize_dim(args[1], args[0].ndim)
    dtype = args[0].dtype
    if dtype.category < dtypes.FLOAT:
        kernel = "logcumsumexp_cuda" if args[0].device.type == "cuda" else "logcumsumexp_out_cpu"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{dtypes.c10_name(dtype)}\' (got a {dtype.name} '
                                  "input)")


def _floating_or_complex_dtype(op, args) -> tuple:
    dtype = args[0].dtype
    return dtype, dtypes.compute_dtype(dtype)


declare("logcumsumexp(Tensor self, int dim) -> Tensor", "other", dtype=_floating_or_complex_dtype,
        check=_floating_or_complex,
        grad={"self": "logcumsumexp_backward(grad, self, result, dim)"},
        fwd="logcumsumexp_jvp(self, self_t, result, dim)", batch=shift_dims)


def _argwhere(self):
    return self.nonzero()


composite("argwhere(Tensor self) -> Tensor", _argwhere, differentiable=False, out=False)
composite("msort(Tensor self) -> Tensor", lambda self: self.sort(0).values)


# ---------------------------------------------------------------- quantiles (torch's algorithm: sort, rank, lerp)
_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_checks(self, q, dim, interpolation, op):
    """torch's checks in torch's order (a number q's range, the interpolation, a non-empty input, q's rank, the
    dtypes, the dim, q's values), each worded as torch words it: ``quantile()`` for nanquantile too."""
    if not isinstance(q, Tensor) and not 0 <= q <= 1:  # a number is checked as a number: no tensor values read
        raise RuntimeError(f"{op}() q must be in the range [0, 1] but got {q}")
    if interpolation not in _INTERPOLATIONS:
        raise RuntimeError("quantile() interpolation must be one of linear, lower, higher, midpoint or nearest, "
                           f"but got {interpolation}")
    if self.numel() == 0:
        raise RuntimeError("quantile() input tensor must be non-empty")
    if isinstance(q, Tensor) and q.ndim > 1:
        raise RuntimeError(f"quantile() q must be a scalar or 1D tensor (got {q.ndim} dims)")
    if self.dtype not in (dtypes.float32, dtypes.float64):
        raise RuntimeError(f"quantile() input tensor must be either float or double dtype (got {self.dtype.name})")
    if isinstance(q, Tensor) and q.dtype is not self.dtype:
        raise RuntimeError(f"quantile() q tensor must be same dtype as the input tensor (got {q.dtype.name} and "
                           f"{self.dtype.name})")
    if dim is not None:
        from tilewise import strides as S

        S.normalize_dim(dim, self.ndim)
    if not isinstance(q, Tensor):
        from tilewise.tensor import tensor

        return tensor(q, dtype=self.dtype, device=self.device)
    if q.numel() and values_readable(q) and (bool((q < 0).any()) or bool((q > 1).any())):
        raise RuntimeError("quantile() q values must be in the range [0, 1]")
    return q


def _quantile(self, q, dim=None, keepdim=False, interpolation="linear", ignore_nan=False, op="quantile"):
    q = _quantile_checks(self, q, dim, interpolation, op)
    x = self.reshape(-1) if dim is None else self
    d = 0 if dim is None else dim % max(self.ndim, 1)
    rows = x.sort(d).values.movedim(d, -1) if x.ndim else x.reshape(1)  # NaN sorts last
    n = rows.shape[-1]
    last = n - 1
    if ignore_nan:
        counts = rows.isnan().logical_not().sum(-1, keepdim=True).to(self.dtype)
        ranks = q.reshape(-1) * (counts - 1)
        ranks = ranks.clamp(min=0)
    else:
        ranks = (q.reshape(-1) * last).expand((*rows.shape[:-1], q.numel()))
        ranks = call("where", rows.isnan().any(-1, keepdim=True), ranks.new_full((), float(last)), ranks)
    below = ranks.floor() if interpolation != "nearest" else ranks.round()
    if interpolation == "higher":
        below = ranks.ceil()
    values = rows.gather(-1, below.long().clamp(max=last))
    if interpolation in ("linear", "midpoint"):
        above = rows.gather(-1, ranks.ceil().long().clamp(max=last))
        weights = ranks - below if interpolation == "linear" else (ranks > below).to(self.dtype) * 0.5
        values = values.lerp(above, weights)
    out = values.movedim(-1, 0)  # (len(q), reduced dims...)
    if keepdim and self.ndim:  # a 0-dim input keeps no dim
        out = out.reshape((q.numel(), *((1,) * self.ndim))) if dim is None else out.unsqueeze(d + 1)
    return out[0] if q.ndim == 0 else out


def _nanquantile(self, q, dim=None, keepdim=False, interpolation="linear"):
    return _quantile(self, q, dim, keepdim, interpolation, True, "nanquantile")


composite("quantile(Tensor self, Tensor q, int? dim=None, bool keepdim=False, *, str interpolation='linear') -> "
          "Tensor", lambda self, q, dim=None, keepdim=False, interpolation="linear":
          _quantile(self, q, dim, keepdim, interpolation), autocast={"cpu": "fp32"})
composite("nanquantile(Tensor self, Tensor q, int? dim=None, bool keepdim=False, *, str interpolation='linear') -> "
          "Tensor", _nanquantile, autocast={"cpu": "fp32"})


def _nanmedian_dim(self, dim, keepdim=False):
    """The lower median of each slice's non-NaN values (NaN where a slice holds nothing else), and its position.
    NaN sorts last, so the median of the ``c`` numbers of a slice is its sorted element ``(c - 1) // 2``."""
    from tilewise import strides as S

    refuse_bool(self, "median_out")
    d = S.normalize_dim(dim, self.ndim, "nanmedian")
    if self.ndim == 0:
        return self.clone(), self.new_zeros((), dtype=dtypes.int64)
    order = self.sort(d).indices
    if self.dtype.is_floating_point:
        counts = self.isnan().logical_not().sum(d, keepdim=True)
        k = ((counts - 1).div(2, rounding_mode="floor")).clamp(min=0)
    else:
        k = order.new_full((), (self.shape[d] - 1) // 2).expand(
            tuple(1 if i == d else n for i, n in enumerate(self.shape)))
    indices = order.gather(d, k)
    values = self.gather(d, indices)
    return (values, indices) if keepdim else (values.squeeze(d), indices.squeeze(d))


def _nanmedian(self):
    flat = self.reshape(-1)
    if flat.numel():  # torch answers an empty tensor before its kernel
        refuse_bool(self, "median_cpu")
    if flat.numel() == 0:  # NaN, cast to an integer dtype as torch casts it (int64's minimum, uint8's 0)
        return self.new_full((), float("nan"), dtype=dtypes.float64).to(self.dtype)
    return _nanmedian_dim(flat, 0)[0]


composite("nanmedian(Tensor self) -> Tensor", _nanmedian,
          grad={"self": "evenly_distribute_backward(grad, self, result)"}, fwd="evenly_read_jvp(self_t, self, result)",
          out=False)
composite("nanmedian.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
          _nanmedian_dim, grad={"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"},
          nondiff_outputs=(1,), check=nonempty_reduction(),
          fwd="selected_jvp(self_t, dim, result[1], keepdim)")
