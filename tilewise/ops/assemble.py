"""Assembling and taking apart: atleast_Nd, dstack/column_stack/row_stack, hsplit/vsplit/dsplit, rot90, diff,
cartesian_prod, combinations, tril/triu_indices, kron, block_diag, vander, trapezoid, gradient, diagflat, and the
scatters of a view (select/slice/diagonal/as_strided_scatter).

All are composites of views, cat, pad, cumsum and the pointwise operators: they run on every device and
differentiate through their decomposition. Sizes come from shapes only, never from values.
"""

from __future__ import annotations

import itertools

from tilewise import dtypes
from tilewise import strides as S
from tilewise.layouts import contiguous_format
from tilewise.ops.batching import batched_then_decompose
from tilewise.ops.registry import call, declare
from tilewise.tensor import Tensor


def composite(schema: str, decomposition, **attrs):
    return declare(schema, "composite", decomposition=decomposition, **attrs)


# ---------------------------------------------------------------- at least N dims, stacking
def _at_least(t, n: int):
    """``t`` viewed with at least ``n`` dims as torch's atleast_nd views it (a 0-dim tensor reshaped; otherwise
    ``unsqueeze``, whose strides for the new size-1 dims are torch's)."""
    if t.ndim >= n:
        return t
    if t.ndim == 0:
        return t.reshape((1,) * n)
    if n == 3 and t.ndim == 1:
        return t.unsqueeze(0).unsqueeze(-1)
    return t.unsqueeze(-1) if n == 3 else t.unsqueeze(0)


def _atleast(n: int):
    def one(self):
        return _at_least(self, n)

    def many(tensors):
        return tuple(one(t) for t in tensors)

    return one, many


for _n in (1, 2, 3):
    _one, _many = _atleast(_n)
    composite(f"atleast_{_n}d(Tensor self) -> Tensor", _one, method=False, out=False)
    composite(f"atleast_{_n}d.Sequence(Tensor[] tensors) -> Tensor[]", _many, method=False, varargs=True, out=False)


def _dstack(tensors):
    _check_nonempty(tensors, "dstack")
    return call("cat", [_ATLEAST_3D(t) for t in tensors], 2)


def _column_stack(tensors):
    _check_nonempty(tensors, "column_stack")
    return call("cat", [t.reshape(t.numel(), 1) if t.ndim <= 1 else t for t in tensors], 1)


def _check_nonempty(tensors, op: str) -> None:
    if not tensors:
        raise RuntimeError(f"{op} expects a non-empty TensorList")


def _ATLEAST_3D(t):  # noqa: N802 — the atleast_3d of one tensor
    return _at_least(t, 3)


composite("dstack(Tensor[] tensors) -> Tensor", _dstack, method=False)
composite("column_stack(Tensor[] tensors) -> Tensor", _column_stack, method=False)
composite("row_stack(Tensor[] tensors) -> Tensor", lambda tensors: call("vstack", tensors), method=False)


# ---------------------------------------------------------------- splitting by sections or indices
def _directional_split(name: str, dim_of, min_ndim: int):
    def check(self) -> int:
        if self.ndim < min_ndim:
            raise RuntimeError(f"torch.{name} requires a tensor with at least {min_ndim} dimension, but got a tensor "
                               f"with {self.ndim} dimensions!")
        return dim_of(self)

    def by_sections(self, sections):
        d = check(self)
        if sections <= 0 or self.shape[d] % sections:
            raise RuntimeError(f"torch.{name} attempted to split along dimension {d}, but the size of the dimension "
                               f"{self.shape[d]} is not divisible by the split_size {sections}!")
        return call("tensor_split", self, sections, d)

    def by_indices(self, indices):
        return call("tensor_split", self, list(indices), check(self))

    composite(f"{name}.int(Tensor(a) self, int sections) -> Tensor[]", by_sections, out=False)
    composite(f"{name}.array(Tensor(a) self, int[] indices) -> Tensor[]", by_indices, out=False)


_directional_split("hsplit", lambda t: 0 if t.ndim == 1 else 1, 1)
_directional_split("vsplit", lambda t: 0, 2)
_directional_split("dsplit", lambda t: 2, 3)


# ---------------------------------------------------------------- rotation, differences
def _rot90(self, k=1, dims=(0, 1)):
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if self.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {self.ndim}")
    d0, d1 = (S.normalize_dim(d, self.ndim, "rot90") for d in dims)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k %= 4
    if k == 1:
        return self.flip([d1]).transpose(d0, d1)
    if k == 2:
        return self.flip([d0, d1])
    if k == 3:
        return self.flip([d0]).transpose(d0, d1)
    return self.clone(memory_format=contiguous_format)  # torch's rot90 by 0 is a row-major copy


def _diff(self, n=1, dim=-1, prepend=None, append=None):
    if self.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    d = S.normalize_dim(dim, self.ndim, "diff")
    parts = [p for p in (prepend, self, append) if p is not None]
    x = call("cat", [_along(p, self, d) for p in parts], d) if len(parts) > 1 else self
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        later, earlier = x.narrow(d, 1, length - 1), x.narrow(d, 0, length - 1)
        x = later.logical_xor(earlier) if x.dtype is dtypes.bool_ else later - earlier
    return x


def _along(part, like, dim):
    """diff's prepend/append: a number or a 0-dim tensor is broadcast to one slice of ``like`` along ``dim``."""
    if not isinstance(part, Tensor):
        from tilewise.tensor import tensor

        part = tensor(part, dtype=like.dtype, device=like.device)
    if part.ndim == 0:
        shape = list(like.shape)
        shape[dim] = 1
        return part.expand(shape)
    return part


composite("rot90(Tensor self, int k=1, int[] dims=[0,1]) -> Tensor", _rot90, out=False)
composite("diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor", _diff)


# ---------------------------------------------------------------- products and index enumerations
def _cartesian_prod(tensors):
    for t in tensors:
        if t.ndim != 1:
            raise RuntimeError(f"Expect a 1D vector, but got shape {list(t.shape)}")
    if len(tensors) == 1:
        return tensors[0]
    grids = call("meshgrid", list(tensors), indexing="ij")
    return call("stack", [g.reshape(-1) for g in grids], 1)


def _combinations(self, r=2, with_replacement=False):
    if self.ndim != 1:
        raise RuntimeError(f"Expect a 1D vector, but got shape {list(self.shape)}")
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return self.new_empty((0,))
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    picks = list(choose(range(self.shape[0]), r))
    from tilewise.tensor import tensor

    index = tensor(picks, dtype=dtypes.int64, device=self.device).reshape(len(picks), r)
    return self[index]


def _triangle_indices(lower: bool):
    name = "tril_indices" if lower else "triu_indices"

    def indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
        if dtype is not None and dtype not in (dtypes.int32, dtypes.int64):
            raise NotImplementedError(f"\"{name}\" not implemented for '{dtypes.c10_name(dtype)}'")
        if row < 0 or col < 0:
            raise RuntimeError(f"row must be non-negative, got {row}" if row < 0 else
                               f"col must be non-negative, got {col}")
        keep = (lambda i, j: j - i <= offset) if lower else (lambda i, j: j - i >= offset)
        pairs = [(i, j) for i in range(row) for j in range(col) if keep(i, j)]
        from tilewise.tensor import tensor

        out = tensor([[p[0] for p in pairs], [p[1] for p in pairs]], dtype=dtype or dtypes.int64, device=device)
        return out.reshape(2, len(pairs))

    return indices


composite("cartesian_prod(Tensor[] tensors) -> Tensor", _cartesian_prod, method=False, varargs=True, out=False)
composite("combinations(Tensor self, int r=2, bool with_replacement=False) -> Tensor", _combinations, method=False,
          out=False)
composite("tril_indices(int row, int col, int offset=0, *, ScalarType? dtype=None, Layout? layout=None, "
          "Device? device=None, bool? pin_memory=None) -> Tensor", _triangle_indices(True), method=False,
          differentiable=False, out=False)
composite("triu_indices(int row, int col, int offset=0, *, ScalarType? dtype=None, Layout? layout=None, "
          "Device? device=None, bool? pin_memory=None) -> Tensor", _triangle_indices(False), method=False,
          differentiable=False, out=False)


def _kron(self, other):
    ndim = max(self.ndim, other.ndim)
    a = self.reshape((1,) * (ndim - self.ndim) + tuple(self.shape))
    b = other.reshape((1,) * (ndim - other.ndim) + tuple(other.shape))
    interleaved_a = [n for s in a.shape for n in (s, 1)]
    interleaved_b = [n for s in b.shape for n in (1, s)]
    product = a.reshape(interleaved_a) * b.reshape(interleaved_b)
    return product.reshape([sa * sb for sa, sb in zip(a.shape, b.shape)])


def _block_diag(tensors):
    blocks = []
    for k, t in enumerate(tensors):
        if t.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {k} has "
                               f"{t.ndim} dimensions")
        blocks.append(t.reshape(1, -1) if t.ndim < 2 else t)
    if not blocks:
        from tilewise.ops.creation import empty

        return empty((1, 0))
    common = dtypes.result_type(*blocks)
    width = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        rows.append(call("pad", b.to(common), [left, width - left - b.shape[1]]))
        left += b.shape[1]
    return call("cat", rows, 0)


def _vander(x, N=None, increasing=False):  # noqa: N803 — torch's keyword
    if x.ndim != 1:
        raise RuntimeError("x must be a one-dimensional tensor.")
    n = x.shape[0] if N is None else N
    if n < 0:
        raise RuntimeError("N must be non-negative.")
    out_dtype = dtypes.promote_types(x.dtype, dtypes.int64)
    columns = [x.new_ones((x.shape[0], min(n, 1)), dtype=out_dtype)]
    if n > 1:
        columns.append(x.to(out_dtype).unsqueeze(1).expand(x.shape[0], n - 1))
    powers = call("cat", columns, 1).cumprod(1)
    return powers if increasing else powers.flip([1])


composite("kron(Tensor self, Tensor other) -> Tensor", _kron)
composite("block_diag(Tensor[] tensors) -> Tensor", _block_diag, method=False, varargs=True, out=False)
composite("vander(Tensor x, int? N=None, bool increasing=False) -> Tensor", _vander, method=False, out=False)
def _adjoint(self):
    if self.ndim < 2:
        if self.ndim == 0:
            import warnings

            warnings.warn("adjoint() is deprecated on 0-D tensors. Consider using x.conj().", UserWarning, stacklevel=3)
            return self.conj()
        raise RuntimeError(f"tensor.adjoint() is only supported on matrices or batches of matrices. Got "
                           f"{self.ndim}-D tensor.")
    return self.transpose(-2, -1).conj()


composite("adjoint(Tensor(a) self) -> Tensor(a)", _adjoint)
composite("diagflat(Tensor self, int offset=0) -> Tensor", lambda self, offset=0: self.reshape(-1).diag(offset),
          out=False)


# ---------------------------------------------------------------- integration by the trapezoidal rule
def _float_y(y):
    return y if y.dtype.is_floating_point else y.to(dtypes.get_default_dtype())


def _spacing(y, x, d):
    if x.ndim == 1:
        shape = [1] * y.ndim
        shape[d] = -1
        return _diff(x).reshape(shape)
    return _diff(x, dim=d)


def _check_trapezoid_x(y, x, d):
    if x.ndim == 1 and x.shape[0] != y.shape[d]:
        raise RuntimeError(f"trapezoid: There must be one `x` value for each sample point (got {x.shape[0]} for "
                           f"{y.shape[d]} samples along dim {d})")


def _trapezoid_dim(y, dim) -> int:
    """The dim of a trapezoid, and torch's refusal of bool samples (an empty dim gives zeros of any dtype first)."""
    d = S.normalize_dim_of_dims(dim, y.ndim, "trapezoid")
    if y.dtype is dtypes.bool_ and y.shape[d]:
        raise RuntimeError("trapezoid: received a bool input for `y`, but bool is not supported")
    return d


def _no_samples(y, d):
    """torch's integral over an empty dim: zeros of ``y``'s own dtype."""
    return y.new_zeros(y.shape[:d] + y.shape[d + 1:])


def _cumulative_trapezoid_dim(y, dim, operands: str) -> int:
    if y.dtype is dtypes.bool_:
        raise RuntimeError(f"cumulative_trapezoid: received a bool input for {operands}, but bool is not supported")
    if y.ndim == 0:
        raise IndexError("slice() cannot be applied to a 0-dim tensor.")
    return S.normalize_dim(dim, y.ndim, "cumulative_trapezoid")


def _adjacent_sums(y, d):
    """``y[k] + y[k + 1]`` along ``d`` (nothing for fewer than two samples), as floats."""
    n = y.shape[d]
    return _float_y(y.narrow(d, min(n, 1), max(n - 1, 0)) + y.narrow(d, 0, max(n - 1, 0)))


def _trapezoid_x(y, x, dim=-1):
    d = _trapezoid_dim(y, dim)
    _check_trapezoid_x(y, x, d)
    n = y.shape[d]
    if n == 0:
        return _no_samples(y, d)
    pairs = y.narrow(d, 1, n - 1) + y.narrow(d, 0, n - 1)
    return (_float_y(pairs) * _spacing(y, x, d)).sum(d) / 2


def _trapezoid_dx(y, dx=1, dim=-1):
    d = _trapezoid_dim(y, dim)
    n = y.shape[d]
    if n == 0:
        return _no_samples(y, d)
    y = _float_y(y)
    return (y.sum(d) - (y.select(d, 0) + y.select(d, n - 1)) * 0.5) * dx


def _cumulative_trapezoid_x(y, x, dim=-1):
    d = _cumulative_trapezoid_dim(y, dim, "`x` or `y`")
    _check_trapezoid_x(y, x, d)
    return (_adjacent_sums(y, d) * _spacing(y, x, d) / 2).cumsum(d)


def _cumulative_trapezoid_dx(y, dx=1, dim=-1):
    d = _cumulative_trapezoid_dim(y, dim, "`y`")
    return (_adjacent_sums(y, d) * (dx / 2)).cumsum(d)


for _name in ("trapezoid", "trapz"):
    composite(f"{_name}.x(Tensor y, Tensor x, *, int dim=-1) -> Tensor", _trapezoid_x, method=False, out=False)
    composite(f"{_name}.dx(Tensor y, *, Scalar dx=1, int dim=-1) -> Tensor", _trapezoid_dx, method=False, out=False)
composite("cumulative_trapezoid.x(Tensor y, Tensor x, *, int dim=-1) -> Tensor", _cumulative_trapezoid_x,
          method=False, out=False)
composite("cumulative_trapezoid.dx(Tensor y, *, Scalar dx=1, int dim=-1) -> Tensor", _cumulative_trapezoid_dx,
          method=False, out=False)


# ---------------------------------------------------------------- a tensor with one view replaced
def _replacing_view(view_of):
    """``self`` with the view ``view_of(self, ...)`` replaced by ``src``: the clone's view written by copy_, which
    autograd differentiates into the source's gradient and ``self``'s with that view zeroed."""
    def scatter(self, src, *args):
        out = self.clone()
        target = view_of(out, *args)
        if tuple(target.shape) != tuple(src.shape):
            raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                               f"{list(src.shape)}, slice size = {list(target.shape)}")
        target.copy_(src)
        return out

    return scatter


def _slice_view(t, dim=0, start=None, end=None, step=1):
    d = S.normalize_dim(dim, t.ndim, "slice_scatter")
    index = [slice(None)] * t.ndim
    index[d] = slice(start, end, step)
    return t[tuple(index)]


composite("select_scatter(Tensor self, Tensor src, int dim, int index) -> Tensor",
          _replacing_view(lambda t, dim, index: t.select(dim, index)), batch=batched_then_decompose, out=False)
composite("slice_scatter(Tensor self, Tensor src, int dim=0, int? start=None, int? end=None, int step=1) -> Tensor",
          _replacing_view(_slice_view), batch=batched_then_decompose)
composite("diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor",
          _replacing_view(lambda t, offset, dim1, dim2: t.diagonal(offset, dim1, dim2)), batch=batched_then_decompose,
          out=False)
composite("as_strided_scatter(Tensor self, Tensor src, int[] size, int[] stride, int? storage_offset=None) -> Tensor",
          _replacing_view(lambda t, size, stride, storage_offset=None: t.as_strided(size, stride, storage_offset)),
          batch=batched_then_decompose, out=False)
composite("narrow_copy(Tensor self, int dim, int start, int length) -> Tensor",
          lambda self, dim, start, length: self.narrow(dim, start, length).clone(memory_format=contiguous_format))


# ---------------------------------------------------------------- broadcasting, index arithmetic, log-spaced values
def _broadcast_tensors(tensors):
    shape = S.broadcast_shapes(*(tuple(t.shape) for t in tensors), op="broadcast_tensors")
    return tuple(t.expand(shape) for t in tensors)


def _unravel_index(indices, shape):
    if indices.dtype.is_floating_point or indices.dtype is dtypes.bool_:
        raise TypeError(f"expected 'indices' to be integer dtype, but got {indices.dtype.name}")
    total = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"'shape' cannot have negative values, but got {tuple(shape)}")
        total *= n
    if indices.numel() and (bool((indices < -total).any()) or bool((indices >= total).any())):
        raise ValueError(f"'indices' must be in range [{-total}, {total - 1}] for shape {tuple(shape)}")
    flat = indices % total if total else indices
    coords = []
    for n in reversed(shape):
        coords.append(flat % n)
        flat = flat.div(n, rounding_mode="floor")
    if not coords:
        return ()
    # torch's coordinates are views of one (*indices.shape, len(shape)) tensor, its last dim innermost and the others
    # in the indices' order: stacked here through the permutation that lays the indices out row-major
    order = S.memory_order(tuple(indices.shape), indices.stride())
    stacked = call("stack", [c.permute(order) for c in reversed(coords)], -1)
    return stacked.permute(*sorted(range(len(order)), key=order.__getitem__), len(order)).unbind(-1)


def _logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None,
              requires_grad=False):
    from tilewise.ops.creation import linspace

    exponents = linspace(start, end, steps, dtype=dtypes.float64, device=device)
    out = (base ** exponents).to(dtype or dtypes.get_default_dtype())
    return out.requires_grad_(requires_grad) if requires_grad else out


composite("broadcast_tensors(Tensor[] tensors) -> Tensor[]", _broadcast_tensors, method=False, varargs=True, out=False)
composite("unravel_index(Tensor indices, int[] shape) -> Tensor[]", _unravel_index, method=False,
          differentiable=False, out=False)
composite("logspace(Scalar start, Scalar end, int steps, float base=10.0, *, ScalarType? dtype=None, "
          "Layout? layout=None, Device? device=None, bool? pin_memory=None, bool requires_grad=False) -> Tensor",
          _logspace, method=False, differentiable=False)


# ---------------------------------------------------------------- numerical gradient
def _gradient_spacings(self, spacing, dims):
    """One spacing per differentiated dim: a number, or a tensor of coordinates along that dim."""
    if isinstance(spacing, (list, tuple)):
        if len(spacing) != len(dims):
            given = "since dim argument was not given" if len(dims) == self.ndim else f"dim = {list(dims)}"
            raise RuntimeError(f"torch.gradient expected spacing to be unspecified, a scalar, or a list of length "
                               f"equal to 'self.dim() = {self.ndim}', {given}, but got a list of length "
                               f"{len(spacing)}")
        return list(spacing)
    return [spacing] * len(dims)


def _edge_one(self, d):
    return self.narrow(d, 1, 1) - self.narrow(d, 0, 1), self.narrow(d, -1, 1) - self.narrow(d, -2, 1)


def _uniform_gradient(self, d, h, edge_order):
    """torch's gradient over evenly spaced samples: central differences inside, one-sided at the ends."""
    n = self.shape[d]
    center = (self.narrow(d, 2, n - 2) - self.narrow(d, 0, n - 2)) / h / 2
    if edge_order == 1:
        first, last = (e / h for e in _edge_one(self, d))
    else:
        first = (self.narrow(d, 0, 1) * -1.5 + self.narrow(d, 1, 1) * 2 - self.narrow(d, 2, 1) * 0.5) / h
        last = (self.narrow(d, -3, 1) * 0.5 - self.narrow(d, -2, 1) * 2 + self.narrow(d, -1, 1) * 1.5) / h
    return call("cat", [first, center, last], d)


def _coordinate_gradient(self, d, coordinates, edge_order):
    """torch's gradient over samples at the given coordinates (second-order accurate inside)."""
    n = self.shape[d]
    shape = [1] * self.ndim
    shape[d] = -1
    dx = coordinates.diff()
    dx1, dx2 = dx[:-1], dx[1:]
    a = (-dx2 / (dx1 * (dx1 + dx2))).reshape(shape)
    b = ((dx2 - dx1) / (dx1 * dx2)).reshape(shape)
    c = (dx1 / (dx2 * (dx1 + dx2))).reshape(shape)
    center = a * self.narrow(d, 0, n - 2) + b * self.narrow(d, 1, n - 2) + c * self.narrow(d, 2, n - 2)
    if edge_order == 1:
        rise_first, rise_last = _edge_one(self, d)
        first, last = rise_first / dx[0], rise_last / dx[-1]
    else:
        h0, h1, hl, hp = dx[0], dx[1], dx[-1], dx[-2]
        first = (self.narrow(d, 0, 1) * (-(2.0 * h0 + h1) / (h0 * (h0 + h1))) +
                 self.narrow(d, 1, 1) * ((h0 + h1) / (h0 * h1)) + self.narrow(d, 2, 1) * (-h0 / (h1 * (h0 + h1))))
        last = (self.narrow(d, -3, 1) * (hl / (hp * (hl + hp))) + self.narrow(d, -2, 1) * (-(hl + hp) / (hl * hp)) +
                self.narrow(d, -1, 1) * ((2 * hl + hp) / (hl * (hl + hp))))
    return call("cat", [first, center, last], d)


def _gradient(self, spacing=1, dim=None, edge_order=1):
    """torch.gradient: the derivative estimated along each of ``dim`` (every dim by default) by finite differences,
    with ``edge_order``-accurate one-sided differences at the ends."""
    if edge_order not in (1, 2):
        raise RuntimeError("torch.gradient only supports edge_order=1 and edge_order=2.")
    if self.ndim == 0:
        return ()
    dims = list(range(self.ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    dims = [S.normalize_dim(d, self.ndim, "gradient") for d in dims]
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"dim {next(d for d in dims if dims.count(d) > 1)} appears multiple times in the list of "
                           "dims")
    spacings = _gradient_spacings(self, spacing, dims)
    if any(self.shape[d] < edge_order + 1 for d in dims):
        raise RuntimeError("torch.gradient expected each dimension size to be at least edge_order+1")
    return tuple(_coordinate_gradient(self, d, h, edge_order) if isinstance(h, Tensor) else
                 _uniform_gradient(self, d, h, edge_order) for d, h in zip(dims, spacings))


composite("gradient(Tensor self, *, Any spacing=1, Any dim=None, int edge_order=1) -> Tensor[]", _gradient,
          method=False, out=False)
