"""Helpers that derivative formulas call, besides the public operators themselves.

Each helper is written in terms of tilewise operators, so gradients stay differentiable and traceable.
"""

from __future__ import annotations

from math import prod

from tilewise import strides as S
from tilewise.ops.creation import ones_like, zeros
from tilewise.ops.linalg import rows_times_matrix
from tilewise.ops.registry import OPS


def inverse_permutation(dims) -> tuple[int, ...]:
    dims = [d % len(dims) for d in dims]
    inv = [0] * len(dims)
    for k, d in enumerate(dims):
        inv[d] = k
    return tuple(inv)


def grad_expanded(grad, input_shape, dim, keepdim):
    """A reduction's gradient (or result) broadcast back to the input's shape."""
    dims = S.normalize_dims(dim if dim not in ((), []) else None, len(input_shape))
    if not keepdim:
        for d in dims:
            grad = grad.unsqueeze(d)
    return grad.expand(input_shape)


def expand_reduced(grad, input_shape, dim, keepdim):
    return grad_expanded(grad, input_shape, dim, keepdim)


def minmax_backward(grad, self, result, dim, keepdim):
    """amax/amin: the gradient is shared evenly among the elements that attain the extremum. A slice whose
    result is NaN has no such element, so its gradient is NaN throughout (0 / 0), as torch's is."""
    mask = (self == grad_expanded(result, self.shape, dim, keepdim)).to(grad.dtype)
    count = mask.sum(dim if dim not in ((), []) else None, keepdim=True)
    return grad_expanded(grad, self.shape, dim, keepdim) * mask / count


def evenly_distribute_backward(grad, self, result):
    """max()/min()/median() of every element: the gradient is shared evenly among the elements equal to the
    result, or among the NaNs when the result is NaN (torch's rule; the other elements get exactly 0)."""
    mask = (self == result) | (self.isnan() & result.isnan())
    return (grad / mask.sum()).expand(self.shape).where(mask, 0)


def extremum_pair_backward(grad, self, other, loses):
    """maximum/minimum: the whole gradient to the operand that wins (``loses`` is where ``self`` does not),
    half to each at a tie, and the whole gradient to both where either is NaN (no comparison holds), as torch."""
    return grad.where(~loses, 0).where(self != other, grad * 0.5)


def extremum_pair_jvp(self_t, other_t, self, other, result):
    """maximum/minimum, forward (torch's): the winner's tangent, the mean of both at a tie, and the other's where
    ``self`` is not the result (a NaN in either)."""
    return ((self_t + other_t) / 2).where(self == other, self_t.where(self == result, other_t))


def norm_backward(grad, self, result, p, dim, keepdim):
    """torch's norm_backward: finite (zero) gradient where the norm is zero, for every p; none at all (undefined,
    as torch's: ``x.grad`` stays None) for p = 0, whose value does not change with ``self``'s."""
    if p == 0:
        return None
    if p == "nuc":
        return nuclear_norm_backward(grad, self, dim, keepdim)
    g = grad_expanded(grad, self.shape, dim, keepdim)
    n = grad_expanded(result, self.shape, dim, keepdim)
    zero = n == 0
    if p is None or p == 2 or p == "fro":
        return g * self / n.masked_fill(zero, 1.0) * ~zero
    if p == 1:
        return g * self.sgn()
    if p in (float("inf"), float("-inf")):
        return minmax_backward(grad, self.abs(), result, dim, keepdim) * self.sgn()
    if p < 1:  # |x|^(p-1) is infinite at a zero entry, whose gradient torch sets to zero
        scaled = self.sgn() * (self.abs() ** (p - 1)).masked_fill(self == 0, 0.0)
        return g * scaled * n ** (1 - p)
    scaled = self.sgn() * self.abs() ** (p - 1) if p < 2 else self * self.abs() ** (p - 2)
    return g * scaled / n.masked_fill(zero, 1.0) ** (p - 1) * ~zero


def nuclear_norm_backward(grad, self, dim, keepdim):
    """d ||A||_* / dA = U V^H (the SVD's gradient with only the singular values' gradient, as torch's)."""

    d0, d1 = S.normalize_dims((-2, -1) if dim is None else dim, self.ndim)
    rest = [d for d in range(self.ndim) if d not in (d0, d1)]
    order = rest + [d0, d1]
    u, _, vh = OPS["_linalg_svd"](self.permute(order), False, True)
    g = grad
    if keepdim:
        g = g.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    moved = u.matmul(vh) * g.unsqueeze(-1).unsqueeze(-1)
    return moved.permute(inverse_permutation(order))


def prod_backward(grad, self, result, dim, keepdim):
    """d prod / d x_i = product of the other elements; computed without dividing, so zeros are handled. Complex
    inputs take the conjugate of the derivative, as every holomorphic function's gradient does."""
    if self.is_complex():
        self = self.conj()
    if dim in (None, (), []):
        flat = self.reshape(-1)
        others = _exclusive_products(flat, 0).reshape(self.shape)
        return grad_expanded(grad, self.shape, None, keepdim) * others
    (d,) = S.normalize_dims(dim, self.ndim)
    return grad_expanded(grad, self.shape, dim, keepdim) * _exclusive_products(self, d)


def _exclusive_products(x, dim):
    n = x.shape[dim]
    if n == 0:
        return x
    one = ones_like(x.narrow(dim, 0, 1))
    before = OPS["cat"]([one, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    flipped = x.flip([dim])
    after = OPS["cat"]([one, flipped.narrow(dim, 0, n - 1)], dim).cumprod(dim).flip([dim])
    return before * after


def select_backward_indices(grad, input_shape, dim, indices, keepdim):
    """max.dim/min.dim/sort-like ops: route each gradient to the index it came from (a 0-dim input's one element
    takes it whole)."""

    if len(input_shape) == 0:
        return grad
    d = S.normalize_dim(dim, len(input_shape))
    if not keepdim:
        grad, indices = grad.unsqueeze(d), indices.unsqueeze(d)
    return zeros(input_shape, dtype=grad.dtype, device=grad.device).scatter(d, indices, grad)


def take_backward(grad, self, index):
    """torch's: the gradient added at the flattened input's positions ``index`` names (negative ones from the
    end). It reads the input for its shape; torch saves the input and the index."""

    flat = zeros(self.numel(), dtype=grad.dtype, device=grad.device)
    return OPS["index_put"](flat, (index,), grad, True).reshape(self.shape)


def index_source_backward(grad, dim, index, source, alpha=1):
    """index_add/index_copy's source gradient: the slices of ``grad`` that ``index`` names (times ``alpha``).
    It reads the source for its shape; torch saves the source and the index."""
    picked = grad.index_select(dim, index).reshape(source.shape)
    return picked if alpha == 1 else picked * alpha


def view_backward(grad, op_name: str, input_shape, *args):
    shape = tuple(input_shape)  # the view's geometry on a contiguous tensor of the input's shape
    shape, strides, offset = OPS[op_name].view(shape, S.contiguous_strides(shape), 0, *args)
    return OPS["view_scatter_add"](grad, tuple(input_shape), tuple(shape), tuple(strides), offset)


def as_strided_backward(grad, input_geometry, size, stride, storage_offset=None):
    """torch's: as_strided's geometry counts from the start of the storage, whatever the input's own geometry. The
    gradient is added into a zero storage as the result reads it, then read back as the input reads that storage
    (each element divided by the number of the input's elements that share it, where the input overlaps itself)."""
    shape, strides, offset = input_geometry
    storage_offset = offset if storage_offset is None else storage_offset
    if offset == 0 and tuple(strides) == S.contiguous_strides(shape):  # the usual input: the view's own backward
        return OPS["view_scatter_add"](grad, tuple(shape), tuple(size), tuple(stride), storage_offset)
    start = min(offset, storage_offset)
    extent = max(_storage_extent(shape, strides, offset - start), _storage_extent(size, stride, storage_offset - start))
    storage = OPS["view_scatter_add"](grad, (extent,), tuple(size), tuple(stride), storage_offset - start)
    if _overlaps(shape, strides):
        ones = zeros(tuple(shape), dtype=grad.dtype, device=grad.device) + 1
        count = OPS["view_scatter_add"](ones, (extent,), tuple(shape), tuple(strides), offset - start)
        storage = storage / count  # nan where the input reads nothing: never read back
    return storage.as_strided(tuple(shape), tuple(strides), offset - start)


def _storage_extent(shape, strides, offset: int) -> int:
    """The elements of storage a geometry reaches, from the start: torch's ``_min_storage_size``."""
    if S.numel(shape) == 0:
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def _overlaps(shape, strides) -> bool:
    """Whether two elements of a geometry share memory (dims of one element aside)."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # how far the dims with smaller strides reach
    for s, n in dims:
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def slices_backward(grads, input_shape, dim: int, starts, ends):
    """The gradient of the slices ``input[..., start:end, ...]`` along ``dim`` (tensor_split's outputs) from theirs:
    those in a row when the slices tile the dim, as split's backward, else each added at its place."""
    tiles = starts[0] == 0 and ends[-1] == input_shape[dim] and all(s == e for s, e in zip(starts[1:], ends[:-1]))
    if tiles:
        return OPS["cat"](grads, dim)
    total = zeros(tuple(input_shape), dtype=grads[0].dtype, device=grads[0].device)
    for grad, start, end in zip(grads, starts, ends):
        if end > start:
            total = total + view_backward(grad, "slice", input_shape, dim, start, end, 1)
    return total


def indices_tuple(indices):
    """index_put's list of optional index tensors as a getitem key."""
    return tuple(slice(None) if i is None else i for i in indices)


def clamp_mask(self, lo, hi):
    mask = None
    if lo is not None:
        mask = self >= lo
    if hi is not None:
        upper = self <= hi
        mask = upper if mask is None else mask & upper
    return mask


def _selected(mask, grad):
    """``grad`` where ``mask`` holds, else 0 (see [Note: masked gradients select] in ops/pointwise.py)."""
    return grad.where(mask, grad.new_zeros(()))


def clamp_backward(grad, self, lo, hi):
    """torch's clamp gradient for the input: ``grad`` where ``lo <= self <= hi`` (a NaN input gets none)."""
    return _selected(clamp_mask(self, lo, hi), grad)


def clamp_min_backward(grad, self, lo, hi):
    """The lower bound's gradient, torch's: where the input is below it and it is below the upper bound (where the
    bounds cross, the upper one gives the result)."""
    mask = self < lo
    return _selected(mask if hi is None else mask & (lo < hi), grad)


def clamp_max_backward(grad, self, lo, hi):
    """The upper bound's gradient, torch's: where the input is above it, or it is below the lower bound."""
    mask = self > hi
    return _selected(mask if lo is None else mask | (hi < lo), grad)


def conj_if_complex(x):
    """The conjugate of a complex tensor, anything else as it is: formulas for operators that take complex operands
    multiply by conjugates, as torch's derivatives.yaml does (see [Note: complex tensors] in ops/complex.py); a
    complex number operand (``x * 1j``) is conjugated as a tensor of it would be."""
    if isinstance(x, complex):
        return x.conjugate()
    return x.conj() if getattr(x, "dtype", None) is not None and x.dtype.is_complex else x


def pow_backward_exponent(grad, self, exponent, result):
    """torch's: ``grad * conj(result * log(self))``, 0 where ``self`` is 0 and the exponent a real number >= 0 (a
    complex exponent's imaginary part 0)."""
    if getattr(exponent, "dtype", None) is not None and exponent.dtype.is_complex:
        nonnegative = (exponent.imag == 0) & (exponent.real >= 0)
    else:
        nonnegative = exponent >= 0
    base = self if hasattr(self, "log") else ones_like(result) * self  # pow(number, tensor): the number as a tensor
    return grad * conj_if_complex((result * base.log()).masked_fill((base == 0) & nonnegative, 0))


def sgn_backward(grad, self, result):
    """torch's sgn_backward, ``(grad - sgn^2 conj(grad)) / (2 |x|)``: for real tensors zero, but computed from the
    input and the result it saves (so changing either in place before backward is the error it is in torch); NaN
    where the gradient is."""
    magnitude = self.abs()
    return ((grad - result * result * conj_if_complex(grad)) / (2 * magnitude)).masked_fill(magnitude == 0, 0.0)


def cross_entropy_input_grad(grad, output_grads, logp, target, weight, reduction, ignore_index, label_smoothing):
    """The input's gradient: the loss's, plus, when the saved log-probabilities are differentiated themselves (a
    double backward reaches them as output 1), log_softmax's backward of theirs."""

    grad_input = OPS["_cross_entropy_backward"](grad, logp, target, weight, reduction, ignore_index, label_smoothing)
    if output_grads[1] is not None:
        grad_input = grad_input + OPS["_log_softmax_backward_data"](output_grads[1], logp, 1, logp.dtype)
    return grad_input


def gelu_second_derivative(x, approximate: str):
    import math

    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = k * (x + 0.044715 * x * x * x)
        t = inner.tanh()
        d_inner = k * (1 + 3 * 0.044715 * x * x)
        sech2 = 1 - t * t
        return sech2 * d_inner + 0.5 * x * (-2 * t * sech2 * d_inner * d_inner + sech2 * k * 6 * 0.044715 * x)
    pdf = (-0.5 * x * x).exp() / math.sqrt(2.0 * math.pi)
    return pdf * (2 - x * x)


def linear_input_grad(grad, weight):
    """``linear``'s gradient for its input: ``grad @ weight`` (a 1-D weight made the output one dim shorter), of
    the weight's conjugate where complex."""
    weight = conj_if_complex(weight)
    if weight.ndim == 1:
        return grad.unsqueeze(-1) * weight
    return grad.mm(weight) if grad.ndim == 2 else rows_times_matrix(grad, weight)


def linear_weight_grad(grad, input, weight_shape):
    """``linear``'s gradient for its weight: ``grad^T @ input`` over every leading dim of input, one GEMM. It reads
    the weight's shape only, so the weight is not saved for it (as torch saves none: the weight may be an
    inference tensor, which cannot be saved); of the input's conjugate where complex."""
    input = conj_if_complex(input)  # noqa: A001 — torch's name for it
    if len(weight_shape) == 1:
        return _rows(grad.unsqueeze(-1) * input).sum(0)
    return _rows(grad).t().mm(_rows(input))


def _rows(t):
    """t as a matrix of its last dim's rows (a reshape to (-1, n) is ambiguous where n is 0)."""
    return t.reshape(prod(t.shape[:-1]), t.shape[-1])


def derivative_not_implemented(what: str):
    """A derivative torch does not have, as torch refuses it at backward (``what``: "igamma: input")."""
    raise NotImplementedError(f"the derivative for '{what}' is not implemented.")


def aten_derivative_not_implemented(name: str):
    """The backward of an operator torch records with a NotImplemented node (binomial)."""
    raise RuntimeError(f"derivative for aten::{name} is not implemented")


def forward_not_implemented(name: str):
    """A tangent rule torch does not have."""
    raise NotImplementedError(f"Trying to use forward AD with {name} that does not support it.")


class _Helpers(dict):
    """The names derivative formulas may call: each bound once. Modules add theirs with ``update``; a name another
    module already gave a different function is refused (formulas are strings, so a silent rebinding would change
    which function every formula of that name calls)."""

    def update(self, other=(), **more):
        for name, obj in dict(other, **more).items():
            present = self.get(name)
            if present is not None and present is not obj:
                raise RuntimeError(f"the formula helper {name!r} is declared twice: in "
                                   f"{getattr(present, '__module__', '?')} and {getattr(obj, '__module__', '?')}")
            self[name] = obj


HELPERS = _Helpers({name: obj for name, obj in globals().items() if callable(obj) and not name.startswith("_")
                    and getattr(obj, "__module__", "") == __name__})
