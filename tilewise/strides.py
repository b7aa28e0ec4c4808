"""Stride and broadcast arithmetic, pure functions over tuples of ints.

[Note: strides] A tensor is a view ``(shape, strides, offset)`` on a flat storage; element ``i`` (a
multi-index) lives at ``offset + sum(i[k] * strides[k])``. Every view operator, every backend and the
compiler's index expressions use the functions here, so layout rules exist in exactly one place.
Strides are counted in elements, never bytes, and are never negative (flip copies, as in torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

Shape = tuple[int, ...]


def numel(shape: Sequence[int]) -> int:
    return prod(shape)


_CONTIGUOUS: dict[Shape, Shape] = {}  # every eager result asks; a few hundred shapes cover a program


def contiguous_strides(shape: Sequence[int]) -> Shape:
    key = shape if type(shape) is tuple else tuple(shape)
    found = _CONTIGUOUS.get(key)
    if found is not None:
        return found
    strides = [1] * len(shape)
    acc = 1
    for k in range(len(shape) - 1, -1, -1):
        strides[k] = acc
        acc *= max(shape[k], 1)
    if len(_CONTIGUOUS) < 4096:
        _CONTIGUOUS[key] = tuple(strides)
    return tuple(strides)


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major dense; size-1 dimensions may carry any stride, and empty tensors are contiguous (torch's rule)."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def is_non_overlapping_and_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Some permutation of the dimensions is contiguous: the tensor covers a dense block of memory once."""
    if 0 in shape:
        return True
    dims = sorted((stride, size) for size, stride in zip(shape, strides) if size != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def is_non_overlapping(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """No two elements of the view share a storage position (dims sorted by stride must nest)."""
    extent = 0
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides) if sz != 1):
        if size == 0:
            return True
        if stride <= extent:
            return False
        extent += (size - 1) * stride
    return True


def normalize_dim(dim: int, ndim: int, op: str = "") -> int:
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        where = f"{op}: " if op else ""
        raise IndexError(
            f"{where}Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {dim})")
    return dim + bound if dim < 0 else dim


def normalize_dims(dims, ndim: int, op: str = "") -> Shape:
    """An int, a sequence of ints or None (all dims) → a sorted tuple of distinct non-negative dims. A 0-dim
    tensor has none: torch accepts dim 0 and -1 for it and reduces over nothing."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{op}: dim {tuple(dims)} appears multiple times in the list of dims")
    return tuple(sorted(out)) if ndim else ()


def advanced_index_dims(ndim: int, dims: Sequence[int], index_shapes: Sequence[Sequence[int]],
                        op: str = "index") -> tuple[list[int], Shape, list[int]]:
    """numpy's (and torch's) advanced indexing of an ``ndim``-dim tensor by index tensors at ``dims``: (the dims
    kept before the index block, the broadcast index shape, the dims kept after). The index block stands where
    the indexed dims were when they are adjacent, else in front."""
    joined = broadcast_shapes(*index_shapes, op=op)
    adjacent = list(dims) == list(range(dims[0], dims[-1] + 1))
    rest = [d for d in range(ndim) if d not in dims]
    before = [d for d in rest if d < dims[0]] if adjacent else []
    return before, joined, [d for d in rest if d not in before]


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast") -> Shape:
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for k, size in enumerate(shape, start=ndim - len(shape)):
            if size == out[k] or size == 1:
                continue
            if out[k] == 1:
                out[k] = size
                continue
            listed = ", ".join(str(list(s)) for s in shapes)
            raise RuntimeError(
                f"{op}: shapes {listed} cannot be broadcast together: size {size} does not match size {out[k]} "
                f"at non-singleton dimension {k - ndim}; each dimension must be equal or 1")
    return tuple(out)


def expand_strides(shape: Sequence[int], strides: Sequence[int], target: Sequence[int], op: str = "expand") -> Shape:
    """Strides that present a (shape, strides) view as the larger ``target`` shape (stride 0 where broadcast)."""
    if len(target) < len(shape):
        raise RuntimeError(
            f"{op}: the number of sizes provided ({len(target)}) must be greater or equal to the number of "
            f"dimensions in the tensor ({len(shape)})")
    lead = len(target) - len(shape)
    out = [0] * len(target)
    for k, want in enumerate(target):
        if k < lead:
            if want < 0:
                raise RuntimeError(f"{op}: the expanded size {want} is not allowed in a leading, "
                                   "non-existing dimension")
            continue
        have, stride = shape[k - lead], strides[k - lead]
        if want == -1 or want == have:
            out[k] = stride
        elif have == 1:
            out[k] = 0
        else:
            raise RuntimeError(
                f"{op}: the expanded size of the tensor ({want}) must match the existing size ({have}) at "
                f"non-singleton dimension {k}. Target sizes: {list(target)}. Tensor sizes: {list(shape)}")
    sizes = expanded_shape(shape, target)
    for k in range(lead - 1, -1, -1):  # a new size-1 dim gets the stride it would have if contiguous, as in torch
        out[k] = sizes[k + 1] * out[k + 1] if sizes[k] == 1 and k + 1 < len(target) else 0
    return tuple(out)


def expanded_shape(shape: Sequence[int], target: Sequence[int]) -> Shape:
    lead = len(target) - len(shape)
    return tuple(shape[k - lead] if (w == -1 and k >= lead) else w for k, w in enumerate(target))


def infer_size(shape: Sequence[int], total: int, op: str = "view") -> Shape:
    """Resolve a single -1 in a requested shape."""
    shape = tuple(int(s) for s in shape)
    if -1 not in shape and prod(shape) == total and (not shape or min(shape) >= 0):
        return shape
    unknown = [k for k, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise RuntimeError(f"{op}: only one dimension can be inferred, got shape {list(shape)}")
    if any(s < -1 for s in shape):
        raise RuntimeError(f"{op}: invalid shape dimension in {list(shape)}")
    known = prod(s for s in shape if s != -1)
    if unknown:
        if known == 0 or total % known:
            raise RuntimeError(f"{op}: shape '{list(shape)}' is invalid for input of size {total}")
        k = unknown[0]
        return shape[:k] + (total // known,) + shape[k + 1:]
    if known != total:
        raise RuntimeError(f"{op}: shape '{list(shape)}' is invalid for input of size {total}")
    return shape


def view_strides(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> Shape | None:
    """Strides for viewing (shape, strides) as new_shape without a copy, or None when impossible.

    Same algorithm as torch's computeStride: split the old dims into contiguous chunks and require every
    chunk of the new shape to fall inside one old chunk.
    """
    if numel(shape) == 0 and tuple(shape) == tuple(new_shape):
        return tuple(strides)  # torch keeps an empty tensor's strides when the shape does not change
    if numel(shape) == 0 or not shape:  # empty, or 0-dim: any view of it is contiguous
        return contiguous_strides(new_shape)
    if tuple(strides) == contiguous_strides(shape):  # the common case: the chunks below are one chunk
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1] if strides else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def storage_span(shape: Sequence[int], strides: Sequence[int], offset: int) -> int:
    """One past the largest storage index the view touches (0 for an empty view)."""
    if numel(shape) == 0:
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def index_to_offset(index: Sequence[int], strides: Sequence[int], offset: int = 0) -> int:
    return offset + sum(i * s for i, s in zip(index, strides))


def permuted(seq: Sequence, dims: Sequence[int]) -> tuple:
    return tuple(seq[d] for d in dims)


def check_permutation(dims: Sequence[int], ndim: int, op: str = "permute") -> Shape:
    if len(dims) != ndim:
        raise RuntimeError(f"{op}: number of dims don't match in permute: got {len(dims)} dims for a {ndim}-d tensor")
    out = tuple(normalize_dim(d, ndim, op) for d in dims)
    if len(set(out)) != ndim:
        raise RuntimeError(f"{op}: repeated dim in permutation {list(dims)}")
    return out


def reduced_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if k in dims else s for k, s in enumerate(shape))
    return tuple(s for k, s in enumerate(shape) if k not in dims)


def sum_to_dims(shape: Sequence[int], target: Sequence[int]) -> tuple[Shape, Shape]:
    """For reducing a broadcast result back to ``target``: (leading dims to drop, dims to sum with keepdim)."""
    lead = len(shape) - len(target)
    leading = tuple(range(lead))
    kept = tuple(k + lead for k, t in enumerate(target) if t == 1 and shape[k + lead] != 1)
    return leading, kept


def coalesce(shape: Sequence[int], *strides: Sequence[int]) -> tuple[Shape, tuple[Shape, ...]]:
    """Merge adjacent dims that every operand walks as one (``stride[k] == stride[k+1] * shape[k+1]``) and drop
    size-1 dims, so a kernel indexes the fewest dims; a fully contiguous view becomes one dim.

    >>> coalesce((2, 3, 4), (12, 4, 1), (0, 4, 1))
    ((2, 12), ((12, 1), (0, 1)))
    """
    dims = [k for k, n in enumerate(shape) if n != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for k in dims:
        if out_shape and all(st[-1] == s[k] * shape[k] for st, s in zip(out_strides, strides)):
            out_shape[-1] *= shape[k]
            for st, s in zip(out_strides, strides):
                st[-1] = s[k]
            continue
        out_shape.append(shape[k])
        for st, s in zip(out_strides, strides):
            st.append(s[k])
    return tuple(out_shape), tuple(tuple(st) for st in out_strides)
