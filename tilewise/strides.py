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
# The row-major strides of a tuple shape already asked for, else None: what the eager path reads before calling
# ``contiguous_strides`` (a dict lookup rather than a Python call, per operator call).
cached_contiguous_strides = _CONTIGUOUS.get


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


# [Note: memory formats] torch names three orders of dims in memory: ``contiguous_format`` (row-major),
# ``channels_last`` (a 4-d NCHW tensor laid out as NHWC) and ``channels_last_3d`` (NCDHW as NDHWC). The dims of
# each format from the fastest-moving to the slowest:
FORMAT_ORDERS = {"channels_last": (1, 3, 2, 0), "channels_last_3d": (1, 4, 3, 2, 0)}


def check_format_rank(name: str, ndim: int) -> None:
    order = FORMAT_ORDERS.get(name)
    if order is not None and len(order) != ndim:
        raise RuntimeError(f"required rank {len(order)} tensor to use {name} format")


def format_strides(name: str, shape: Sequence[int]) -> Shape:
    """The strides of a new tensor of ``shape`` in memory format ``name``; as in torch, a channels-last
    format multiplies by every size, zeros included, where the contiguous format counts an empty dim as 1."""
    order = FORMAT_ORDERS.get(name)
    if order is None:
        return contiguous_strides(shape)
    check_format_rank(name, len(shape))
    strides = [0] * len(shape)
    acc = 1
    for d in order:
        strides[d] = acc
        acc *= shape[d]
    return tuple(strides)


def is_contiguous_as(name: str, shape: Sequence[int], strides: Sequence[int]) -> bool:
    """``Tensor.is_contiguous(memory_format=name)``: dense in that format's order, size-1 dims free. Unlike the
    contiguous format, torch calls an empty tensor channels-last only when its strides say so."""
    order = FORMAT_ORDERS.get(name)
    if order is None:
        return is_contiguous(shape, strides)
    if len(order) != len(shape):
        return False
    expected = 1
    for d in order:
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def suggest_memory_format(shape: Sequence[int], strides: Sequence[int]) -> str:
    """The format whose order the strides follow (torch's ``suggest_memory_format``): a channels-last one only
    when a 4-d (5-d) tensor's strides rise strictly along its order; ambiguous tensors count as contiguous."""
    for name, order in FORMAT_ORDERS.items():
        if len(order) == len(shape) and _strides_follow(order, shape, strides):
            return name
    return "contiguous_format"


def _strides_follow(order: Sequence[int], shape: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's ``is_channels_last_strides_2d_s4`` for any order: ties between size-1 dims go to NCHW."""
    if strides[1] == 0:
        return False
    least = 0
    for d in order:
        if shape[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:  # N111, or N11W sliced on W: contiguous by default
            return False
        least = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def preserved_strides(shape: Sequence[int], strides: Sequence[int]) -> Shape:
    """The strides ``clone``, ``empty_like`` and casts give a copy under ``preserve_format`` (and sort, flip and
    the out-of-place indexed writes their result): the same strides for a dense tensor, else dense ones in its
    order (``infer_dense_strides``).

    >>> preserved_strides((6, 4), (2, 12))  # a transposed matrix's every other row
    (1, 6)
    """
    if is_non_overlapping_and_dense(shape, strides):
        return tuple(strides)
    return infer_dense_strides(shape, strides)


def column_major_strides(shape: Sequence[int]) -> Shape:
    """Row-major strides but for the last two dims, a column-major matrix (torch's
    ``batched_matrix_contiguous_strides``): how torch lays out what LAPACK and cuSOLVER return.

    >>> column_major_strides((2, 3, 4))
    (12, 1, 3)
    """
    strides = contiguous_strides(shape)
    if len(shape) < 2:
        return strides
    return (*strides[:-2], 1, max(shape[-2], 1))


# [Note: fft result strides] torch's CPU transforms (MKL's, through ``_exec_fft``) permute their input so that the
# dims they do not transform come first, ordered by the input's strides (largest first), and the transformed dims
# last, in the order they are given (for ``_fft_c2c`` and ``_fft_r2c`` sorted the same way, a one-sided
# transform's last dim kept last); the result is written contiguous in that order and handed back through the
# inverse permutation. The batch dims are split off with ``std::partition``, whose order the sort then keeps
# among dims of equal stride.

def fft_dims_in_order(strides: Sequence[int], dims: Sequence[int], keep_last: bool = False) -> list[int]:
    """torch's ``_sort_dims``: the transformed dims by the input's strides, largest first (the last one kept
    last for a one-sided real-to-complex transform)."""
    head = list(dims[:-1]) if keep_last else list(dims)
    head = sorted(head, key=lambda d: -strides[d])
    return head + [dims[-1]] if keep_last else head


def fft_result_strides(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                       dims: Sequence[int]) -> Shape:
    """The strides torch's CPU transform of a tensor of ``shape`` and ``strides`` over ``dims`` (in the order it
    transforms them: ``fft_dims_in_order``) gives its result of ``out_shape`` (see [Note: fft result strides]).

    >>> fft_result_strides((4, 6), (6, 1), (4, 6), [0])
    (1, 4)
    """
    batch = sorted(_batch_dims(len(shape), set(dims)), key=lambda d: -strides[d])
    signal = contiguous_strides([1] + [out_shape[d] for d in dims])  # (batch, *signal sizes) row-major
    result = [0] * len(shape)
    for k, d in enumerate(dims):
        result[d] = signal[k + 1]
    numel = 1
    for d in reversed(batch):
        result[d] = numel * signal[0]
        numel *= out_shape[d]
    return tuple(result)


def _batch_dims(ndim: int, transformed: set) -> list[int]:
    """The dims not in ``transformed``, in the order ``std::partition`` of 0..ndim-1 leaves them (libstdc++'s
    swaps from both ends)."""
    order = list(range(ndim))
    first, last = 0, ndim
    while True:
        while first != last and order[first] not in transformed:
            first += 1
        if first == last:
            return order[:first]
        last -= 1
        while first != last and order[last] in transformed:
            last -= 1
        if first == last:
            return order[:first]
        order[first], order[last] = order[last], order[first]
        first += 1


def fft_c2r_result_strides(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                           dims: Sequence[int]) -> Shape:
    """``fft_result_strides`` of torch's complex-to-real transform over several dims: a complex transform of all
    but the last, then a one-dimensional complex-to-real one of its result, which lays out the result."""
    if len(dims) > 1:
        strides = fft_result_strides(shape, strides, shape, fft_dims_in_order(strides, dims[:-1]))
    return fft_result_strides(shape, strides, out_shape, [dims[-1]])


def memory_order(shape: Sequence[int], strides: Sequence[int]) -> Shape:
    """The dims from the slowest-moving in memory to the fastest, as ``infer_dense_strides`` orders them: a
    kernel that writes row-major through this permutation of its input writes a result in the input's order.

    >>> memory_order((2, 3, 4, 5), (60, 1, 15, 3))
    (0, 2, 3, 1)
    """
    return tuple(reversed(iteration_order(shape, [(tuple(shape), tuple(strides))])))


def order_by_strides(strides: Sequence[int]) -> list[int]:
    """The dims outermost first by their strides, ties in logical order: the order torch's fused attention kernels
    lay their output out in after the query's (cuDNN's ``alloc_with_matching_layout``).

    >>> order_by_strides((24, 8, 48, 1))
    [2, 0, 1, 3]
    """
    return sorted(range(len(strides)), key=lambda d: -strides[d])


def infer_dense_strides(shape: Sequence[int], strides: Sequence[int]) -> Shape:
    """torch's ``infer_dense_strides``: dense strides with the dims in the order ``strides`` give them
    (TensorIterator's order for one operand); empty and size-1 dims add nothing to the strides after them."""
    if len(shape) < 2:
        return (1,) * len(shape)
    dense = [0] * len(shape)
    acc = 1
    for d in iteration_order(shape, [(tuple(shape), tuple(strides))]):
        dense[d] = acc
        acc *= max(shape[d], 1)
    return tuple(dense)


def dense_order(shape: Sequence[int], strides: Sequence[int]) -> Shape | None:
    """The permutation of the dims that lays a tensor of this geometry out row-major in its memory: () for a
    row-major one, (0, 2, 3, 1) for a channels-last one; None when there is none (gaps, overlaps).

    >>> dense_order((2, 3, 4, 5), (60, 1, 15, 3))
    (0, 2, 3, 1)
    """
    if not is_non_overlapping_and_dense(shape, strides):
        return None
    if is_contiguous(shape, strides):
        return ()
    order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    return order if is_contiguous(permuted(shape, order), permuted(strides, order)) else None


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


WRAPPED_NUMBER = ((), ())  # a Python number where the operator takes a tensor: torch's 0-dim operand
_POINTWISE: dict[tuple, Shape] = {}  # (shape, operand geometries) -> output strides; a program repeats a few


def pointwise_strides(shape: Sequence[int], operands: Sequence[tuple[Shape, Shape]]) -> Shape:
    """Strides of a pointwise result of the broadcast ``shape`` from tensor ``operands`` ((shape, strides) each, in
    argument order; a Python number in a tensor's place is ``WRAPPED_NUMBER``), by torch's TensorIterator: dims
    go in the order of the first operand whose strides tell them apart, so a channels-last input gives a
    channels-last result.

    >>> pointwise_strides((2, 3, 4, 5), [((2, 3, 4, 5), (60, 1, 15, 3)), ((3, 1, 1), (1, 1, 1))])
    (60, 1, 15, 3)
    """
    key = (tuple(shape), tuple(operands))
    found = _POINTWISE.get(key)
    if found is None:
        found = _fast_setup_strides(shape, operands)
        if found is None:
            found = strides_in_order(shape, iteration_order(shape, operands))
        if len(_POINTWISE) < 4096:
            _POINTWISE[key] = found
    return found


def _fast_setup_strides(shape: Sequence[int], operands: Sequence[tuple[Shape, Shape]]) -> Shape | None:
    """TensorIterator's shortcut when every operand has the output's shape: all contiguous, all channels-last,
    or all dense with one set of strides (kept as they are). None when it does not apply."""
    if not operands or any(s != tuple(shape) for s, _ in operands):
        return None
    if all(is_contiguous(s, st) for s, st in operands):
        return contiguous_strides(shape)
    if len(shape) == 4 and all(is_contiguous_as("channels_last", s, st) for s, st in operands):
        return format_strides("channels_last", shape)
    first = operands[-1][1]
    if all(st == first for _, st in operands) and is_non_overlapping_and_dense(shape, first):
        return tuple(first)
    return None


def iteration_order(shape: Sequence[int], operands: Sequence[tuple[Shape, Shape]]) -> list[int]:
    """The dims from the fastest-moving to the slowest (torch's ``reorder_dimensions``): an insertion sort whose
    comparisons ask each operand in turn, skipping broadcast dims; ties stay undecided."""
    ndim = len(shape)
    walks = [_broadcast_walk(shape, s, st) for s, st in operands]

    def should_swap(dim0: int, dim1: int) -> int:
        for walk in walks:
            stride0, stride1 = walk[dim0], walk[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def _broadcast_walk(shape: Sequence[int], own_shape: Sequence[int], strides: Sequence[int]) -> Shape:
    """An operand's strides over the broadcast ``shape``, 0 in every dim it is broadcast along."""
    lead = len(shape) - len(own_shape)
    return (0,) * lead + tuple(0 if size == 1 and shape[lead + k] != 1 else stride
                               for k, (size, stride) in enumerate(zip(own_shape, strides)))


def strides_in_order(shape: Sequence[int], perm: Sequence[int]) -> Shape:
    """Dense strides with dims laid out from ``perm[0]`` (fastest) on; torch counts empty dims as 0 here, except
    that the row-major order gets plain contiguous strides."""
    if list(perm) == list(range(len(shape) - 1, -1, -1)):
        return contiguous_strides(shape)
    strides = [0] * len(shape)
    acc = 1
    for d in perm:
        strides[d] = acc
        acc *= shape[d]
    return tuple(strides)


def normalize_dim(dim: int, ndim: int, op: str = "") -> int:
    bound = max(ndim, 1)
    if not -bound <= dim < bound:  # torch's words alone (``op`` names the caller for a reader of the code)
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {dim})")
    return dim + bound if dim < 0 else dim


def normalize_dim_of_dims(dim: int, ndim: int, op: str = "") -> int:
    """``normalize_dim`` for operators that take no dim of a 0-dim tensor (torch's ``wrap_scalar=false``: roll,
    unbind, cross): there any dim is refused in torch's words."""
    if ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return normalize_dim(dim, ndim, op)


def normalize_dims(dims, ndim: int, op: str = "") -> Shape:
    """An int, a sequence of ints or None (all dims) → a sorted tuple of distinct non-negative dims. A 0-dim
    tensor has none: torch accepts dim 0 and -1 for it and reduces over nothing."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        repeated = next(d for k, d in enumerate(out) if d in out[:k])
        raise RuntimeError(f"dim {repeated} appears multiple times in the list of dims")
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


def index_result_strides(shape: Sequence[int], strides: Sequence[int], dims: Sequence[int],
                         indices: Sequence[tuple[Shape, Shape]]) -> Shape:
    """Strides of ``x[indices]`` (x of ``shape`` and ``strides``, index tensors of (shape, strides) at ``dims``) as
    torch's TensorIterator lays it out: dims ordered by x's strides where they tell them apart, the index block
    (where x walks with stride 0) by the index tensors', row-major where nothing decides, as for a column pick of
    a contiguous matrix.

    >>> index_result_strides((3, 4), (4, 1), [1], [((2,), (1,))])
    (2, 1)
    >>> index_result_strides((2, 3, 4, 5), (60, 1, 15, 3), [2], [((2,), (1,))])
    (30, 1, 3, 6)
    """
    before, joined, after = advanced_index_dims(len(shape), dims, [s for s, _ in indices])
    out_shape = (*(shape[d] for d in before), *joined, *(shape[d] for d in after))
    lead, trail = (0,) * len(before), (0,) * len(after)
    source = (*(strides[d] for d in before), *(0,) * len(joined), *(strides[d] for d in after))
    walks = [lead + expand_strides(s, st, joined) + trail for s, st in indices]
    return strides_in_order(out_shape, iteration_order(out_shape, [(out_shape, source)] + [(out_shape, w)
                                                                                          for w in walks]))


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast") -> Shape:
    """The shape ``shapes`` broadcast to. A mismatch is reported as torch reports it: each shape folded into the
    shapes before it, as its TensorIterator does, the innermost mismatching dimension of the first pair that fails
    (the shapes so far as tensor a), then the operator and every shape. (The fold runs only then: this is on every
    element-wise operator's path.)"""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for k, size in enumerate(shape, start=ndim - len(shape)):
            if size == out[k] or size == 1:
                continue
            if out[k] != 1:
                folded: Shape = ()
                for each in shapes:
                    folded = _broadcast_pair(folded, tuple(each), shapes, op)
            out[k] = size
    return tuple(out)


def _broadcast_pair(a: Shape, b: Shape, shapes: Sequence[Sequence[int]], op: str) -> Shape:
    ndim = max(len(a), len(b))
    out = [1] * ndim
    for i in range(ndim - 1, -1, -1):
        offset = ndim - 1 - i
        size_a = a[len(a) - 1 - offset] if offset < len(a) else 1
        size_b = b[len(b) - 1 - offset] if offset < len(b) else 1
        if size_a != size_b and size_a != 1 and size_b != 1:
            listed = ", ".join(str(list(s)) for s in shapes)
            why = f" ({op}: shapes {listed} cannot be broadcast together; each dimension must be equal or 1)" if op \
                else ""  # torch's words alone
            raise RuntimeError(f"The size of tensor a ({size_a}) must match the size of tensor b ({size_b}) at "
                               f"non-singleton dimension {i}{why}")
        out[i] = size_b if size_a == 1 else size_a
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
                f"The expanded size of the tensor ({want}) must match the existing size ({have}) at non-singleton "
                f"dimension {k}.  Target sizes: {list(target)}.  Tensor sizes: {list(shape)}")
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
    unknown = [k for k, s in enumerate(shape) if s == -1]  # torch's words alone below, as its infer_size's
    for k, s in enumerate(shape):
        if s == -1 and k != unknown[0]:
            raise RuntimeError("only one dimension can be inferred")
        if s < -1:
            raise RuntimeError(f"invalid shape dimension {s} at index {k} of shape {list(shape)}")
    known = prod(s for s in shape if s != -1)
    if unknown:
        if known == 0 or total % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {total}")
        k = unknown[0]
        return shape[:k] + (total // known,) + shape[k + 1:]
    if known != total:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {total}")
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
