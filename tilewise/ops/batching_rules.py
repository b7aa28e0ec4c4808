"""Batching rules written out for operators whose kind does not imply one (see [Note: batched tensors] in
``ops/batching.py``, which holds the rules derived from kinds and the helpers used here). Each is named in its
operator's declaration (``batch=...``)."""

from __future__ import annotations

import math

from tilewise import strides as S
from tilewise.dtypes import int64, result_type
from tilewise.ops.batching import (
    Decompose,
    batched_everywhere,
    call,
    logical_rank,
    pad_to_rank,
    shift_dims,
    shifted_dim,
)
from tilewise.tensor import Tensor


def matrix_product(op, args, batched, size):
    """mm and bmm: an operand batched on one side only is folded into the rows of a single product when it is
    the left one (one GEMM for the whole batch, the common case of a per-example input times a weight);
    otherwise both get the batch and the product is a bmm over batch times the op's own batch, or, when the
    contracted dim has size 1 (outer products), a broadcast multiply, which a batched GEMM runs far slower."""
    a, b = args[0], args[1]
    from tilewise.ops.registry import OPS

    if batched[0] and not batched[1]:
        out = call(op, [a.reshape(-1, a._shape[-1]), b] if op.name == "mm" else
                   [a.reshape(-1, *a._shape[-2:]), b.unsqueeze(0).expand((size, *b._shape)).reshape(-1, *b._shape[1:])])
        return out.reshape((size, *a._shape[1:-1], out._shape[-1]))
    a, b = batched_everywhere(a, batched[0], size), batched_everywhere(b, batched[1], size)
    if a._shape[-1] == 1 and a._dtype is b._dtype:
        return a * b  # outer products (per-example weight gradients): one product per element, no sum to run
    if op.name == "mm":
        return OPS["bmm"](a, b)
    out = OPS["bmm"](a.reshape(-1, *a._shape[-2:]), b.reshape(-1, *b._shape[-2:]))
    return out.reshape((size, a._shape[1], *out._shape[1:]))


INPLACE_ERROR = ("vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a Tensor `other` "
                 "in extra_args that has more elements than `self`. This happened due to `other` being vmapped over "
                 "but `self` not being vmapped over in a vmap. Please try to use out-of-place operators instead of "
                 "inplace arithmetic. If said operator is being called inside the PyTorch framework, please file a "
                 "bug report instead.")


def write_into(op, args, batched, size):
    """_write_, the one write every in-place op ends in: a batched target takes each example's value; an
    unbatched one cannot hold several (torch's error)."""
    if not batched[0]:
        raise RuntimeError(INPLACE_ERROR)
    self, src = args
    return call(op, [self, src if batched[1] else src.unsqueeze(0).expand(self._shape)])


def _batch_index(size: int, rank: int, like: Tensor) -> Tensor:
    from tilewise.ops.registry import call as registry_call

    index = registry_call("arange", 0, size, dtype=int64, device=like.device)
    return index.reshape((size,) + (1,) * rank)


def _index_layout(indices) -> tuple[int, bool]:
    """(position of the first index tensor, whether the index tensors are adjacent): torch places the indexed
    dims where the first index is when they are adjacent, else in front."""
    where = [k for k, i in enumerate(indices) if i is not None]
    return where[0], where == list(range(where[0], where[-1] + 1))


def _expanded_masks(indices: list, batched: list) -> tuple[list, list]:
    """Boolean masks as the index tensors of their true elements (an unbatched mask has fixed positions)."""
    out, flags = [], []
    for i, b in zip(indices, batched):
        if i is not None and i._dtype.name in ("bool", "uint8"):
            if b:
                raise RuntimeError("vmap: We do not support batching operators that can output dynamic shape. "
                                   "Attempted to vmap over aten::index with a batched boolean mask. Please file an "
                                   "issue at https://github.com/pytorch/pytorch/issues if you need this feature.")
            parts = i.nonzero().unbind(1)
            out.extend(parts)
            flags.extend([False] * len(parts))
        else:
            out.append(i)
            flags.append(b)
    return out, flags


def _physical_indices(indices, flags, size, like):
    """The logical index tensors with the batch index in front; every index broadcasts to (batch, *shape)."""
    rank = max((i.ndim - (1 if b else 0) for i, b in zip(indices, flags) if i is not None), default=0)
    phys = [_batch_index(size, rank, like)]
    for i, b in zip(indices, flags):
        phys.append(pad_to_rank(i, rank) if (i is not None and b) else i)
    return phys, rank


def _index_permutation(first: int, adjacent: bool, rank: int, total: int) -> list | None:
    """Physical indexing puts (batch, *index dims) in front; the logical result puts the index dims at
    ``first`` when they are adjacent: the permutation from one to the other, or None when it is the identity."""
    if not adjacent or first == 0:
        return None
    rest = list(range(1 + rank, total))
    return [0, *rest[:first], *range(1, 1 + rank), *rest[first:]]


def index_rule(op, args, batched, size):
    """Advanced indexing ``x[i, j]`` per example: the batch becomes one more index (``arange(batch)``) in front,
    so one gather serves the whole batch; the index dims are then moved where torch puts them."""
    x = batched_everywhere(args[0], batched[0], size)
    indices, flags = _expanded_masks(list(args[1]), list(batched[1]))
    first, adjacent = _index_layout(indices)
    phys, rank = _physical_indices(indices, flags, size, x)
    out = call(op, [x, phys])
    order = _index_permutation(first, adjacent, rank, out.ndim)
    return out if order is None else out.permute(order)


def index_put_rule(op, args, batched, size):
    """``x[i, j] = v`` per example, the same way: the values are laid out as the physical indexing reads."""
    x, values = batched_everywhere(args[0], batched[0], size), args[2]
    if not batched[0] and any(batched[1]) or not batched[0] and batched[2]:
        x = x.clone()  # the expanded target must become a tensor of its own before the batch writes into it
    indices, flags = _expanded_masks(list(args[1]), list(batched[1]))
    first, adjacent = _index_layout(indices)
    phys, rank = _physical_indices(indices, flags, size, x)
    indexed = _indexed_shape(x._shape[1:], indices, flags, first, adjacent)
    if type(values) is not Tensor:
        return call(op, [x, phys, values, *args[3:]])
    v = pad_to_rank(values, len(indexed)) if batched[2] else values
    v = v.expand((size, *indexed)) if batched[2] else v.expand(indexed).unsqueeze(0).expand((size, *indexed))
    order = _index_permutation(first, adjacent, rank, 1 + len(indexed))
    if order is not None:
        inverse = [order.index(k) for k in range(len(order))]
        v = v.permute(inverse)
    return call(op, [x, phys, v, *args[3:]])


def _indexed_shape(shape, indices, flags, first: int, adjacent: bool) -> tuple:
    index_shape = S.broadcast_shapes(*[i._shape[1:] if b else i._shape for i, b in zip(indices, flags)
                                       if i is not None])
    rest = [shape[k] for k in range(len(shape)) if k >= len(indices) or indices[k] is None]
    if adjacent:
        return (*rest[:first], *index_shape, *rest[first:])
    return (*index_shape, *rest)


def view_scatter_add_rule(op, args, batched, size):
    """The backward of a strided view: the view's geometry on a contiguous input of one example, repeated at
    one example's numel apart."""
    grad, input_shape, view_shape, view_strides, offset = args
    n = math.prod(input_shape)
    return call(op, [grad, (size, *input_shape), (size, *view_shape), (n, *view_strides), offset])


def view_scatter_rule(op, args, batched, size):
    self, src, view_shape, view_strides, offset = args
    self = batched_everywhere(self, batched[0], size).contiguous()
    src = batched_everywhere(src, batched[1], size)
    n = math.prod(self._shape[1:])
    return call(op, [self, src, (size, *view_shape), (n, *view_strides), offset])


def searchsorted_rule(op, args, batched, size):
    """searchsorted: a 1-dim sorted sequence per example searches all of that example's values, so the values
    are flattened per example; a sequence with leading dims pairs them with the values' as it would."""
    if type(args[1]) is not Tensor:  # a number searched in every example's sequence: one value per example
        from tilewise.tensor import tensor

        seq = batched_everywhere(args[0], batched[0], size)
        values = tensor(args[1], device=seq.device).expand((size, *(1,) * max(seq.ndim - 1, 1)))
        return searchsorted_rule(op, [seq, values, *args[2:]], (True, True, *batched[2:]), size).reshape(size)
    seq, values = batched_everywhere(args[0], batched[0], size), batched_everywhere(args[1], batched[1], size)
    rest = list(args[2:])
    sorter_k = op.param_names().index("sorter")
    if type(rest[sorter_k - 2]) is Tensor:
        rest[sorter_k - 2] = batched_everywhere(rest[sorter_k - 2], batched[sorter_k], size)
    if seq.ndim == 2 and values.ndim != 2:
        out = call(op, [seq, values.reshape(size, -1), *rest])
        return out.reshape(values._shape)
    return call(op, [seq, values, *rest])


def leading_batch_first_only(op, args, batched, size):
    """Operators that treat the leading dims of their first tensor as a batch while their other tensors (a
    weight, a bias) apply to every element: direct when only the first is batched, else the decomposition."""
    if any(batched[k] for k in op.tensor_idx[1:]) or any(any(batched[k]) for k in op.list_idx):
        return Decompose
    return call(op, args)


def attention_rule(op, args, batched, size):
    """scaled_dot_product_attention over (..., L, E): query, key and value all get the batch in front and
    size-1 dims up to one rank, then their leading dims are expanded alike; a batched mask is given the same
    size-1 dims, an unbatched one broadcasts against the scores from the right as it would per example."""
    rank = max(logical_rank(args[k], batched[k]) for k in range(3))
    args = list(args)
    qkv = [pad_to_rank(batched_everywhere(args[k], batched[k], size), rank) for k in range(3)]
    # with enable_gqa, key and value have fewer heads (dim -3) than the query: only the dims before them broadcast
    kept = 3 if args[op.param_names().index("enable_gqa")] and rank >= 3 else 2
    lead = S.broadcast_shapes(*(t._shape[:-kept] for t in qkv))
    args[:3] = [t.expand((*lead, *t._shape[-kept:])) for t in qkv]
    m = op.param_names().index("attn_mask")
    if type(args[m]) is Tensor and batched[m]:
        args[m] = pad_to_rank(args[m], rank)
    return call(op, args)


def cat_rule(op, args, batched, size):
    """cat: torch skips 1-dim empty tensors beside tensors of another rank (the legacy empty tensor); batched, such a
    tensor would have two dims, so it is left out here (its dtype still promotes), and the dim shifts as for any
    operator along a dim."""
    tensors, flags = args[0], batched[0]
    shapes = [tuple(t._shape[1:]) if b else tuple(t._shape) for t, b in zip(tensors, flags)]
    keep = [k for k, s in enumerate(shapes) if s != (0,)]
    if len(keep) == len(tensors) or not keep or all(len(shapes[k]) == 1 for k in keep):
        return shift_dims(op, args, batched, size)
    dtype = result_type(*tensors)
    out = shift_dims(op, [[tensors[k] for k in keep], *args[1:]], (tuple(flags[k] for k in keep), *batched[1:]),
                     size)
    return out if out._dtype is dtype else out.to(dtype)


def stack_rule(op, args, batched, size):
    """stack: every tensor gets the batch; the new dim is counted among one example's dims plus one."""
    tensors = args[0]
    rank = logical_rank(tensors[0], batched[0][0])
    tensors = [batched_everywhere(t, b, size) for t, b in zip(tensors, batched[0])]
    return call(op, [tensors, S.normalize_dim(args[1], rank + 1, op.name) + 1])


def index_select_rule(op, args, batched, size):
    """index_select with one index for every example: the batched input is selected from along the shifted dim;
    a batched index runs the decomposition (advanced indexing, which batches)."""
    x = args[0]
    if batched[2] or x.ndim == 1:  # a batched index, or 0-dim examples (no dim to shift to)
        return Decompose
    return call(op, [x, shifted_dim(args[1], max(x.ndim - 1, 1), op.name), args[2]])


BATCH_NORM_ERROR = ("Batch norm got a batched tensor as input while the running_mean or running_var, which will be "
                    "updated in place, were not batched.\nIf you are using a module and do not need eval mode, please "
                    "set `track_running_stats` to be False.If you are using a prebuilt module and do not need eval "
                    "mode, please see the functorch website for resources on how to patch your module to work with "
                    "vmap")


def batch_norm_rule(op, args, batched, size):
    """Batch norm normalises each example over its own batch (the decomposition, on the batched tensors); in
    training it would also write every example's statistics into one unbatched running mean: torch refuses."""
    names = op.param_names()
    stats = (names.index("running_mean"), names.index("running_var"))
    if args[names.index("training")] and batched[0] and any(type(args[k]) is Tensor and not batched[k]
                                                             for k in stats):
        raise RuntimeError(BATCH_NORM_ERROR)
    return Decompose


def convolution_rule(op, args, batched, size):
    """Convolutions with one weight for every example: the batch joins the images' own batch dim (one call over
    batch x N images); an example without a batch dim of its own (C, *spatial) is one image of the batch."""
    if any(batched[k] for k in op.tensor_idx[1:]):
        return Decompose
    x = args[0]
    spatial = int(op.name.rstrip("d")[-1])
    if x.ndim - 1 == spatial + 1:
        return call(op, args)
    out = call(op, [x.reshape(-1, *x._shape[2:]), *args[1:]])
    return out.reshape((size, x._shape[1], *out._shape[1:]))
