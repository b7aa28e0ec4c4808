"""Reductions: primitives declared by their combiner, composites (mean, var, logsumexp, ...) by decomposition."""

from __future__ import annotations

import warnings
from math import prod

from tilewise import dtypes
from tilewise import strides as S
from tilewise.ops import dtype_rules as R
from tilewise.ops.formulas import HELPERS, grad_expanded
from tilewise.ops.registry import declare


def reduction(schema: str, reduce: str | None, grad: dict | None, dtype=R.promote, **attrs):
    return declare(schema, "reduction", reduce=reduce, grad=grad, dtype=dtype, **attrs)


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


def reduced_count(shape, dim) -> int:
    dims = S.normalize_dims(dim if dim not in ((), []) else None, len(shape))
    return prod(shape[d] for d in dims)


# ---------------------------------------------------------------- reductions without an identity
# [Note: empty reductions] max, argmax, kthvalue, median, mode and the like have no value for an empty slice:
# torch refuses a reduction over the whole of an empty tensor (a RuntimeError, an IndexError for argmax/argmin)
# and one along a dim of size 0 (an IndexError), but reduces an empty tensor along a dim of non-zero size to an
# empty result. One check, run by the dispatcher on every call (``check=``), gives every backend these rules.
def reduced_dims_given(dim) -> tuple | None:
    """The dims a reduction's ``dim`` argument names as given (negative ones kept, for torch's messages), or None
    for the whole tensor."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)


def check_nonempty_reduction(name: str, shape: tuple, dim, whole_error: type = RuntimeError) -> None:
    dims = reduced_dims_given(dim)
    if dims is None:
        if prod(shape) == 0:
            raise whole_error(f"{name}(): Expected reduction dim to be specified for input.numel() == 0 (the input "
                              f"has shape {list(shape)}). Specify the reduction dim with the 'dim' argument: there is "
                              "no identity to give an empty reduction.")
        return
    for d in dims:
        if shape and shape[S.normalize_dim(d, len(shape), name)] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size (the input has shape "
                             f"{list(shape)}); reduce along a dim of non-zero size.")


def nonempty_reduction(dim_position: int | None = 1, whole_error: type = RuntimeError):
    """The ``check=`` of a reduction without an identity whose dim is argument ``dim_position`` (None: no dim)."""
    def check(op, args: tuple) -> None:
        shape = args[0]._shape
        if 0 not in shape:  # every call but those on empty tensors: nothing to refuse
            return
        dim = args[dim_position] if dim_position is not None and len(args) > dim_position else None
        check_nonempty_reduction(op.name, tuple(shape), dim, whole_error)
    return check


_NONEMPTY = nonempty_reduction()
_NONEMPTY_INDEX = nonempty_reduction(whole_error=IndexError)


def _check_arg_reduction(op, args: tuple) -> None:
    """argmax/argmin: torch refuses bool input (before looking at its size), then applies [Note: empty reductions]."""
    if args[0].dtype.category == dtypes.BOOL:
        raise RuntimeError(f"{op.name}(): does not support bool input (convert it first, e.g. x.to(tilewise.uint8))")
    _NONEMPTY_INDEX(op, args)


# ---------------------------------------------------------------- primitives
reduction("sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", "add",
          {"self": "expand_reduced(grad, self_shape, dim, keepdim)"}, R.reduction_sum, autocast={"cuda": "fp32"},
          fwd="auto_linear", out_needs="dim")
reduction("prod(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", "mul",
          {"self": "prod_backward(grad, self, result, dim, keepdim)"}, R.reduction_sum, autocast="fp32",
          fwd="prod_jvp(self, self_t, result, dim, keepdim)", out_needs="dim")
reduction("amax(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "max",
          {"self": "minmax_backward(grad, self, result, dim, keepdim)"},
          fwd="amaxamin_jvp(self, self_t, result, dim, keepdim)", check=_NONEMPTY)
reduction("amin(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "min",
          {"self": "minmax_backward(grad, self, result, dim, keepdim)"},
          fwd="amaxamin_jvp(self, self_t, result, dim, keepdim)", check=_NONEMPTY)
reduction("any(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "or", None, R.logical,
          differentiable=False)
reduction("all(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor", "and", None, R.logical,
          differentiable=False)
reduction("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", None, None, differentiable=False,
          check=_check_arg_reduction)
reduction("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", None, None, differentiable=False,
          check=_check_arg_reduction)
reduction("max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", None,
          {"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"}, nondiff_outputs=(1,),
          fwd="selected_jvp(self_t, dim, result[1], keepdim)", check=_NONEMPTY)
reduction("min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", None,
          {"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"}, nondiff_outputs=(1,),
          fwd="selected_jvp(self_t, dim, result[1], keepdim)", check=_NONEMPTY)


# ---------------------------------------------------------------- composites
def _max_all(self):
    return self.amax()


def _min_all(self):
    return self.amin()


composite("max(Tensor self) -> Tensor", _max_all, {"self": "evenly_distribute_backward(grad, self, result)"},
          fwd="evenly_read_jvp(self_t, self, result)", check=_NONEMPTY)
composite("max.other(Tensor self, Tensor other) -> Tensor", lambda self, other: self.maximum(other))
composite("min(Tensor self) -> Tensor", _min_all, {"self": "evenly_distribute_backward(grad, self, result)"},
          fwd="evenly_read_jvp(self_t, self, result)", check=_NONEMPTY)
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


def _reduced_dims(shape, dim) -> tuple[int, ...]:
    return S.normalize_dims(dim if dim not in ((), []) else None, len(shape))


def _moments(op, self, dim, unbiased, correction) -> tuple:
    """(variance, mean) over ``dim`` with kept dims, in float64 for float32 and narrower inputs.

    [Note: variance in float64] The deviations from the mean are squared and summed in float64 (torch's CPU
    kernel accumulates float32 in double too, by Welford's method): squares of float32 deviations cannot
    overflow there (1e20 squared is 1e40, past float32's 3.4e38) and a float64 sum loses nothing a float32
    result would show, so the two passes (mean, then squared deviations) give torch's answer rounded once.
    ``std`` takes the square root before rounding back, so a standard deviation of 2e20 stays finite although
    its variance does not fit a float32. Fused, the widening costs no memory traffic: it happens in registers.
    """
    from tilewise.dtypes import complex128, float64

    if not (self.dtype.is_complex or self.dtype.is_floating_point):
        which = "std and var" if op.name in ("std", "var") else op.name
        raise RuntimeError(f"{which} only support floating point and complex dtypes ({op.name}(): got {self.dtype}; "
                           "convert with .float())")
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op.name}() received an invalid combination of arguments ({op.name}() takes unbiased or "
                        "correction, not both: correction=1 is unbiased=True, correction=0 is unbiased=False)")
    wide = complex128 if self.dtype.is_complex else float64  # a complex variance: the mean squared modulus
    x = self if self.dtype.itemsize >= wide.itemsize else self.to(wide)
    dims = _reduced_dims(self.shape, dim)
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    dof = reduced_count(self.shape, dim) - _var_correction(unbiased, correction)
    if dof <= 0:
        warnings.warn(f"{op.name}(): degrees of freedom is <= 0. Correction should be strictly less than the "
                      "reduction factor (input numel divided by output numel).", UserWarning, stacklevel=2)
    squares = centered.real.square() + centered.imag.square() if centered.dtype.is_complex else centered.square()
    return squares.sum(dims, keepdim=True) / max(dof, 0), mean


def _narrowed(value, like, dim, keepdim):
    """A kept-dims reduction result in ``like``'s dtype, its reduced dims dropped unless ``keepdim``."""
    shape = S.reduced_shape(tuple(like.shape), _reduced_dims(like.shape, dim), keepdim)
    dtype = like.dtype.to_real() if like.dtype.is_complex and not value.dtype.is_complex else like.dtype
    return value.to(dtype).reshape(shape)


def _var(self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _narrowed(_moments(_VAR, self, dim, unbiased, correction)[0], self, dim, keepdim)


def _std(self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _narrowed(_moments(_STD, self, dim, unbiased, correction)[0].sqrt(), self, dim, keepdim)


def _var_mean(self, dim=None, unbiased=None, keepdim=False, correction=None):
    var, mean = _moments(_VAR_MEAN, self, dim, unbiased, correction)
    return _narrowed(var, self, dim, keepdim), _narrowed(mean, self, dim, keepdim)


def _std_mean(self, dim=None, unbiased=None, keepdim=False, correction=None):
    var, mean = _moments(_STD_MEAN, self, dim, unbiased, correction)
    return _narrowed(var.sqrt(), self, dim, keepdim), _narrowed(mean, self, dim, keepdim)


# ---------------------------------------------------------------- derivative helpers of var and std

def var_backward(grad, self, dim, unbiased, correction, keepdim):
    """torch's: ``2 / (n - correction) * grad * (self - mean)``; the scale is +inf when ``n == correction``
    (NaN where the input is constant, as in torch)."""
    dof = reduced_count(self.shape, dim) - _var_correction(unbiased, correction)
    scale = 2.0 / dof if dof else float("inf")
    centered = self - self.mean(_reduced_dims(self.shape, dim), keepdim=True)
    return scale * grad_expanded(grad, self.shape, dim, keepdim) * centered


def std_backward(grad, self, result, dim, unbiased, correction, keepdim):
    """torch's: the variance's gradient scaled by ``1 / (2 std)``, and 0 where the standard deviation is 0 (a
    constant slice), where ``d sqrt`` would be infinite."""
    grad_var = (grad / (result * 2)).masked_fill(result == 0, 0)
    return var_backward(grad_var, self, dim, unbiased, correction, keepdim)


def moments_backward(grads, self, std, dim, unbiased, correction, keepdim):
    """var_mean/std_mean: the spread's gradient plus the mean's (``grads`` holds zeros for an unused output).
    ``std`` is std_mean's first output (None for var_mean): torch saves it and the input, never the mean, so only
    changing those in place before backward is an error."""
    spread, mean_grad = grads
    from_spread = (std_backward(spread, self, std, dim, unbiased, correction, keepdim) if std is not None
                   else var_backward(spread, self, dim, unbiased, correction, keepdim))
    return from_spread + grad_expanded(mean_grad, self.shape, dim, keepdim) / reduced_count(self.shape, dim)


def var_jvp(self, self_t, dim, unbiased, correction, keepdim):
    """d var = 2 / (n - correction) * sum((self - mean) * self_t) over the reduced dims."""
    dims = _reduced_dims(self.shape, dim)
    dof = reduced_count(self.shape, dim) - _var_correction(unbiased, correction)
    scale = 2.0 / dof if dof else float("inf")
    centered = self - self.mean(dims, keepdim=True)
    return (scale * centered * self_t).sum(dims, keepdim=keepdim)


def std_jvp(self, self_t, result, dim, unbiased, correction, keepdim):
    """d std = d var / (2 std), and 0 where the standard deviation is 0 (torch's, as its backward)."""
    return (var_jvp(self, self_t, dim, unbiased, correction, keepdim) / (result * 2)).masked_fill(result == 0, 0)


def moments_jvp(self, self_t, std, dim, unbiased, correction, keepdim):
    """var_mean/std_mean: the spread's tangent and the mean's."""
    spread = (std_jvp(self, self_t, std, dim, unbiased, correction, keepdim) if std is not None
              else var_jvp(self, self_t, dim, unbiased, correction, keepdim))
    return spread, self_t.mean(_reduced_dims(self.shape, dim), keepdim=keepdim)


def evenly_read_jvp(self_t, self, result):
    """max()/min()/median() of every element, forward (torch's): the mean tangent of the elements equal to the
    result; NaN where none is (a NaN result)."""
    attains = self == result
    return self_t.where(attains, 0).sum() / attains.sum()


HELPERS.update(var_backward=var_backward, std_backward=std_backward, moments_backward=moments_backward,
               var_jvp=var_jvp, std_jvp=std_jvp, moments_jvp=moments_jvp, evenly_read_jvp=evenly_read_jvp)

_MOMENT_ARGS = "dim, unbiased, correction, keepdim"
_VAR = composite("var(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
                 "Scalar? correction=None) -> Tensor", _var,
                 {"self": f"var_backward(grad, self, {_MOMENT_ARGS})"},
                 fwd=f"var_jvp(self, self_t, {_MOMENT_ARGS})")
_STD = composite("std(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
                 "Scalar? correction=None) -> Tensor", _std,
                 {"self": f"std_backward(grad, self, result, {_MOMENT_ARGS})"},
                 fwd=f"std_jvp(self, self_t, result, {_MOMENT_ARGS})")
_VAR_MEAN = composite("var_mean(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
                      "Scalar? correction=None) -> (Tensor, Tensor)", _var_mean,
                      {"self": f"moments_backward(grads, self, None, {_MOMENT_ARGS})"},
                      fwd=f"moments_jvp(self, self_t, None, {_MOMENT_ARGS})", out=False)
_STD_MEAN = composite("std_mean(Tensor self, int[1]? dim=None, bool? unbiased=None, bool keepdim=False, *, "
                      "Scalar? correction=None) -> (Tensor, Tensor)", _std_mean,
                      {"self": f"moments_backward(grads, self, result[0], {_MOMENT_ARGS})"},
                      fwd=f"moments_jvp(self, self_t, result[0], {_MOMENT_ARGS})", out=False)


def _logsumexp(self, dim, keepdim=False):
    from tilewise._grad_mode import no_grad

    if not self.dtype.is_floating_point:
        self = self.float()
    if self.numel() == 0:  # torch: an empty sum's log, -inf (amax, below, has no identity)
        return self.exp().sum(dim, keepdim).log()
    with no_grad():
        m = self.amax(dim, keepdim=True)
        m = m.masked_fill(m.isinf(), 0.0)
    out = (self - m).exp().sum(dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(dim)


composite("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", _logsumexp,
          {"self": "grad_expanded(grad, self_shape, dim, keepdim) * exp(self - "
                   "grad_expanded(result, self_shape, dim, keepdim))"}, autocast={"cuda": "fp32"},
          fwd="logsumexp_jvp(self, self_t, result, dim, keepdim)")


def _norm(self, p=2, dim=None, keepdim=False, dtype=None):
    if not (self.is_floating_point() or self.is_complex()):
        op = "linalg.matrix_norm" if p == "nuc" else "linalg.vector_norm"
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. "
                           f"Got {dtypes.c10_name(self.dtype)}")
    x = self if dtype is None else self.to(dtype)
    if x.is_complex():  # a complex vector's norm is that of its moduli, a real number (torch's, and its dtype)
        return _norm(x.abs(), p, dim, keepdim)
    if x.dtype.itemsize == 2 and x.is_floating_point() and p != "nuc":  # torch accumulates halves in float32:
        return _norm(x.float(), p, dim, keepdim).to(x.dtype)  # squares of 300 or of 1e-4 stay finite and nonzero
    _check_norm_identity(x, p, dim)
    if p == "nuc":  # torch.norm's matrix order: the nuclear norm over two dims (the last two by default)
        from tilewise.ops.registry import OPS

        return OPS["linalg_matrix_norm"](x, "nuc", (-2, -1) if dim is None else dim, keepdim)
    if isinstance(p, str) and p != "fro":
        raise RuntimeError(f"norm: p={p!r} is not a supported order; use a number, 'fro' or 'nuc'")
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


def _check_norm_identity(x, p, dim) -> None:
    """torch's vector_norm refuses an empty reduction for the orders without an identity (inf, -inf, p < 0)."""
    if isinstance(p, str) or p is None or p >= 0 and p != float("inf"):
        return
    dims = reduced_dims_given(dim)
    if dims is None and x.numel() == 0:
        raise RuntimeError(f"linalg.vector_norm cannot compute the {p} norm on an empty tensor because the operation "
                           f"does not have an identity (input shape {list(x.shape)})")
    for d in dims or ():
        if x.ndim and x.shape[S.normalize_dim(d, x.ndim, "norm")] == 0:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {p} norm on the dimension {d} because this "
                               f"dimension is empty and the operation does not have an identity (input shape "
                               f"{list(x.shape)})")


composite("norm(Tensor self, Any? p=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
          _norm, {"self": "norm_backward(grad, self, result, p, dim, keepdim)"}, autocast={"cuda": "fp32"},
          fwd="norm_jvp(self, self_t, result, p, dim, keepdim)")
composite("count_nonzero(Tensor self, int[1]? dim=None) -> Tensor", lambda self, dim=None: (self != 0).sum(dim),
          differentiable=False, out=False)
