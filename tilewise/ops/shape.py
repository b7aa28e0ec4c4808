"""Shape composites: everything that reshapes or splits by composing the view primitives (and a copy
when strides forbid a view, as torch's reshape does)."""

from __future__ import annotations

import operator

from tilewise import dispatch
from tilewise import strides as S
from tilewise.layouts import contiguous_format, preserve_format
from tilewise.ops.inplace import MULTIPLE, REGENERATE
from tilewise.ops.registry import OPS, declare
from tilewise.ops.views import GEOMETRY_LIMIT, make_view


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    """Shape composites are views and copies put together: without a derivative of their own they are inline
    (see [Note: inline composites] in dispatch.py)."""
    attrs.setdefault("inline", not grad)
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


_RESHAPES: dict[tuple, tuple] = {}  # (shape, strides, requested shape) -> (its -1 inferred, whether a view gives it)


def _reshape(self, shape):
    key = (self._shape, self._strides, shape)
    try:
        plan = _RESHAPES.get(key)
    except TypeError:  # a list from a caller of the decomposition itself
        key = (self._shape, self._strides, tuple(shape))
        plan = _RESHAPES.get(key)
    if plan is None:
        plan = _reshape_plan(self, shape, key)
    shape, viewable = plan
    if viewable:  # one view, as cheap as ``view`` itself: its geometry is cached too
        return dispatch.call(_VIEW, (self, shape))
    out = self.clone(memory_format=contiguous_format).view(shape)
    out._base = None  # the copy is private: like torch's _unsafe_view, the result is no view of anything
    return out


def _reshape_plan(self, shape, key: tuple) -> tuple:
    """Reshape's answer for this geometry, kept as view rules' answers are (see [Note: view geometry cache])."""
    shape = S.infer_size(shape, S.numel(self._shape), "reshape")
    plan = (shape, S.view_strides(self._shape, self._strides, shape) is not None)
    if len(_RESHAPES) >= GEOMETRY_LIMIT:
        _RESHAPES.clear()
    _RESHAPES[key] = plan
    return plan


def _contiguous(self, memory_format=None):
    if memory_format is None or memory_format is contiguous_format:
        return self if self.is_contiguous() else self.clone(memory_format=contiguous_format)
    if self.is_contiguous(memory_format):
        return self
    if memory_format is preserve_format:
        raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
    return self.clone(memory_format=memory_format)


def _flatten(self, start_dim=0, end_dim=-1):
    s, e = S.normalize_dim(start_dim, self.ndim, "flatten"), S.normalize_dim(end_dim, self.ndim, "flatten")
    if self.ndim == 0:  # torch wraps the dims first: a 0-dim tensor takes 0 and -1 only
        return self.reshape(1)
    if s > e:
        raise RuntimeError(f"flatten() has invalid args: start_dim cannot come after end_dim (got start_dim "
                           f"{start_dim} and end_dim {end_dim})")
    if s == e:
        return self
    shape = self.shape
    return self.reshape(shape[:s] + (S.numel(shape[s:e + 1]),) + shape[e + 1:])


def _unflatten(self, dim, sizes):
    d = S.normalize_dim(dim, self.ndim, "unflatten")
    sizes = S.infer_size(sizes, self.shape[d], "unflatten")
    return self.view(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])


def _movedim(self, source, destination):
    src = [S.normalize_dim(d, self.ndim, "movedim") for d in source]
    dst = [S.normalize_dim(d, self.ndim, "movedim") for d in destination]
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(source)} dims) should "
                           f"contain the same number of dims as destination ({list(destination)} dims)")
    if self.ndim == 0:  # dims 0 and -1 name the one place a 0-dim tensor has
        return self.permute(())
    order = [None] * self.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(k for k in range(self.ndim) if k not in src)
    return self.permute([o if o is not None else next(rest) for o in order])


# ---------------------------------------------------------------- view groups

# [Note: view groups] split, split_with_sizes, chunk, unbind and tensor_split return several views of their input
# along one dim. Each is one operator with one autograd node for the whole group, as torch's SplitBackward0 and
# UnbindBackward0: its backward concatenates (stacks, for unbind) the outputs' gradients, zeros for the outputs no
# gradient reached, in one kernel, where a node per output would add one scattered zero tensor per output. The
# views themselves are made straight from the geometry, without a dispatch per output, except where a key below
# must see each view (a traced function, a batched tensor of vmap). Autograd watches the outputs (``view_group``;
# see [Note: watched views] in ops/inplace.py): an output of split or unbind may not be written in place, and none
# may be used after its memory was written since, as in torch; an output of tensor_split, a slice in torch, may be
# written, and becomes a fresh view of its base when its memory was written since it was made.

def _direct(self) -> bool:
    """Whether the group's views may be made without dispatching each (see [Note: view groups])."""
    return self._trace is None and self._vmap is None and not dispatch.STATE.trace_depth


def _slices(self, d: int, starts, ends) -> tuple:
    """Views ``self[..., start:end, ...]`` along dim ``d``, for bounds already within the dim (start <= end)."""
    if not _direct(self):
        return tuple(dispatch.call(_SLICE, (self, d, start, end, 1)) for start, end in zip(starts, ends))
    shape, strides, offset, dtype = self._shape, self._strides, self._offset, self._dtype
    before, after, step = shape[:d], shape[d + 1:], strides[d]
    return tuple(make_view(self, (*before, end - start, *after), strides, offset + start * step, dtype)
                 for start, end in zip(starts, ends))


def _selections(self, d: int) -> tuple:
    """Views ``self.select(d, i)`` for every i."""
    if not _direct(self):
        return tuple(dispatch.call(_SELECT, (self, d, i)) for i in range(self._shape[d]))
    shape, strides, offset, dtype = self._shape, self._strides, self._offset, self._dtype
    kept_shape, kept_strides, step = shape[:d] + shape[d + 1:], strides[:d] + strides[d + 1:], strides[d]
    return tuple(make_view(self, kept_shape, kept_strides, offset + i * step, dtype) for i in range(shape[d]))


def _sized_slices(self, d: int, sizes) -> tuple:
    starts, ends, start = [], [], 0
    for size in sizes:
        starts.append(start)
        start += size
        ends.append(start)
    return _slices(self, d, starts, ends)


def _split_sizes(n: int, step: int) -> list[int]:
    if step < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got split_size={step}")
    if step == 0 and n:
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
    return [min(step, n - start) for start in range(0, n, step)] if n else [0]


def _at_least_1d(self, what: str) -> None:
    if self.ndim == 0:
        raise RuntimeError(f"{what} expects at least a 1-dimensional tensor")


def _split_size(self, split_size, dim=0):
    _at_least_1d(self, "split")
    d = S.normalize_dim(dim, self.ndim, "split")
    return _sized_slices(self, d, _split_sizes(self._shape[d], split_size))


def _split(self, split_size_or_sections, dim=0):
    """An int splits into pieces of that size; a list (even of one size) gives the sizes, which must add up to
    the dim's size, as torch's split_with_sizes."""
    if isinstance(split_size_or_sections, (list, tuple)):
        return dispatch.call(_SPLIT_WITH_SIZES, (self, tuple(split_size_or_sections), dim))
    size = split_size_or_sections if type(split_size_or_sections) is int else operator.index(split_size_or_sections)
    return dispatch.call(_SPLIT_SIZE, (self, size, dim))


def _split_with_sizes(self, split_sizes, dim=0):
    _at_least_1d(self, "split")
    d = S.normalize_dim(dim, self.ndim, "split_with_sizes")
    sizes, n = list(split_sizes), self._shape[d]
    if any(size < 0 for size in sizes):
        raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative entries, but got "
                           f"split_sizes={sizes}")
    if sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                           f"dimension {d}), but got split_sizes={sizes}")
    return _sized_slices(self, d, sizes)


def _chunk(self, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    _at_least_1d(self, "chunk")
    n = self.shape[S.normalize_dim(dim, self.ndim, "chunk")]
    return dispatch.call(_SPLIT_SIZE, (self, max(-(-n // chunks), 1), dim))  # torch's chunk is this split


def _unbind(self, dim=0):
    d = S.normalize_dim(dim, self.ndim, "unbind")
    S.normalize_dim_of_dims(dim, self.ndim)  # a 0-dim tensor: torch's words for its dim 0 and -1
    return _selections(self, d)


def _tensor_split(self, starts, ends, dim):
    return _slices(self, dim, starts, ends)


def tensor_split_at(self, d: int, bounds) -> tuple:
    """tensor_split's outputs: the slices between consecutive ``bounds`` along dim ``d`` (Python's slice rules:
    negative bounds count from the end, bounds past the ends are clamped, a slice that ends before it starts is
    empty), made by one operator with one autograd node."""
    n = self._shape[d]
    starts, ends = [], []
    for start, end in zip(bounds[:-1], bounds[1:]):
        start = min(max(start + n if start < 0 else start, 0), n)
        end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
        starts.append(start)
        ends.append(max(end, start))
    return dispatch.call(_TENSOR_SPLIT, (self, tuple(starts), tuple(ends), d))


def _narrow(self, dim, start, length):
    if self.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    d = S.normalize_dim(dim, self.ndim, "narrow")
    n = self.shape[d]
    start = start + n if start < 0 else start
    if start < 0 or length < 0 or start + length > n:
        raise IndexError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({n}) of dim {d}")
    return dispatch.call(_SLICE, (self, d, start, start + length, 1))  # bound already: one dispatch, no binder


def _squeeze_dims(self, dim):
    return self.squeeze(dim)


composite("reshape(Tensor(a) self, int[] shape) -> Tensor(a)", _reshape)
_VIEW, _SLICE, _SELECT = OPS["view"], OPS["slice"], OPS["select"]
composite("contiguous(Tensor(a) self, *, MemoryFormat? memory_format=None) -> Tensor(a)", _contiguous)
composite("flatten(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)", _flatten)
composite("unflatten(Tensor(a) self, int dim, int[] sizes) -> Tensor(a)", _unflatten)
composite("movedim(Tensor(a) self, int[] source, int[] destination) -> Tensor(a)", _movedim, aliases=("moveaxis",))
composite("split(Tensor(a) self, Any split_size_or_sections, int dim=0) -> Tensor[]", _split, out=False)
composite("chunk(Tensor(a) self, int chunks, int dim=0) -> Tensor[]", _chunk, out=False)
composite("narrow(Tensor(a) self, int dim, int start, int length) -> Tensor(a)", _narrow)
# the view groups (see [Note: view groups]): one node each, named as torch's (``_split`` is SplitBackward0)
composite("_split(Tensor(a) self, int split_size, int dim=0) -> Tensor[]", _split_size, public=False,
          grad={"self": "cat(grads, dim)"}, fwd="auto_linear", view_group=MULTIPLE)
composite("split_with_sizes(Tensor(a) self, int[] split_sizes, int dim=0) -> Tensor[]", _split_with_sizes,
          grad={"self": "cat(grads, dim)"}, fwd="auto_linear", view_group=MULTIPLE, out=False)
composite("unbind(Tensor(a) self, int dim=0) -> Tensor[]", _unbind, grad={"self": "stack(grads, dim)"},
          fwd="auto_linear", view_group=MULTIPLE, out=False)
composite("_tensor_split(Tensor(a) self, int[] starts, int[] ends, int dim) -> Tensor[]", _tensor_split, public=False,
          grad={"self": "slices_backward(grads, self_shape, dim, starts, ends)"}, fwd="auto_linear",
          view_group=REGENERATE)
_SPLIT_SIZE, _SPLIT_WITH_SIZES, _TENSOR_SPLIT = OPS["_split"], OPS["split_with_sizes"], OPS["_tensor_split"]
composite("view_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.view(other.shape),
          function=False)
composite("reshape_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.reshape(other.shape),
          function=False)
composite("expand_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.expand(other.shape),
          function=False)
composite("broadcast_to(Tensor(a) self, int[] size) -> Tensor(a)", lambda self, size: self.expand(size))
composite("ravel(Tensor(a) self) -> Tensor(a)", lambda self: self.reshape(-1))


def _sum_to_size(self, size):
    size = tuple(size)
    if self._shape == size:
        return self
    if len(size) > self.ndim:
        raise RuntimeError(f"sum_to_size: size {list(size)} is not expandable to size {list(self._shape)} (the "
                           "size has more dims than the tensor)")
    leading, kept = S.sum_to_dims(self._shape, size)
    out = self
    if kept:
        out = out.sum(kept, keepdim=True)
    if leading:
        out = out.sum(leading)
    if out._shape != size:
        raise RuntimeError(f"sum_to_size: size {list(size)} is not expandable to size {list(self._shape)}")
    return out


composite("sum_to_size(Tensor self, int[] size) -> Tensor", _sum_to_size, function=False)
