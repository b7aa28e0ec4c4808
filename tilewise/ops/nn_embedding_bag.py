"""torch.nn.functional.embedding_bag: sums, means or maxima of bags of embedding rows, as a composite.

Rows are looked up through ``embedding`` (so ``padding_idx`` and ``scale_grad_by_freq`` shape the weight's
gradient as they do there), then reduced per bag. A 2-D input is a batch of equal bags and reduces over its
second dim. A 1-D input with offsets gives each element the number of its bag, by marking where bags start
and a cumulative sum (empty bags, repeated offsets, are skipped by marks of 2 or more); sums and means are
then one accumulating ``index_put`` per bag. Maxima need every row of a bag side by side: the bags are laid
out as a (bags, longest bag) matrix of positions, the longest bag read from the offsets where they can be read
and bounded by the input's length inside a trace.
"""

from __future__ import annotations

from tilewise._grad_mode import no_grad
from tilewise.dispatch import values_readable
from tilewise.dtypes import promote_types
from tilewise.ops.nn_functional import _renorm_rows_, call_public, concrete_cpu, functional, where

_MODES = ("sum", "mean", "max")


def _check_embedding_bag(input, weight, offsets, mode, scale_grad_by_freq, sparse, per_sample_weights) -> None:
    if per_sample_weights is not None and tuple(input.shape) != tuple(per_sample_weights.shape):
        raise ValueError(f"embedding_bag: If per_sample_weights ({list(per_sample_weights.shape)}) is not None, then "
                         f"it must have the same shape as the input ({list(input.shape)})")
    if weight.ndim != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.ndim}")
    if input.ndim == 2 and offsets is not None:
        raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of fixed "
                         "length sequences. However, found offsets of type Tensor")
    if input.ndim == 1 and offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    if input.ndim == 1 and offsets.ndim != 1:
        raise ValueError("offsets has to be a 1D Tensor")
    if input.ndim not in (1, 2):
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
    if mode not in _MODES:
        raise ValueError("mode has to be one of sum, mean or max")
    if mode == "max" and scale_grad_by_freq:
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    if sparse:
        raise NotImplementedError("embedding_bag: sparse=True needs sparse gradients, which tilewise does not have; "
                                  "use sparse=False")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
                                  "GitHub.")
    # torch promotes the indices with the offsets (bool or uint8 indices next to int64 offsets are int64), then
    # takes int64 or int32 indices only
    index_dtype = input.dtype if offsets is None else promote_types(input.dtype, offsets.dtype)
    if index_dtype.name not in ("int64", "int32"):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {index_dtype} instead (while checking arguments for embedding_bag)")
    if per_sample_weights is not None and per_sample_weights.dtype is not weight.dtype:
        raise RuntimeError(f"Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                           f"'per_sample_weights'; but type {weight.dtype} does not equal {per_sample_weights.dtype} "
                           "(while checking arguments for embedding_bag)")


def _check_offsets(offsets, length: int, include_last_offset: bool) -> None:
    if include_last_offset and offsets.shape[0] < 1:
        raise RuntimeError("include_last_offset: number of offset should be at least 1")
    if not concrete_cpu(offsets) or offsets.numel() == 0:
        return
    values = [int(v) for v in offsets.tolist()]
    if values[0] != 0:
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                           f"position 0. However, got {values[0]}")
    if values[-1] > length:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of "
                           f"{values[-1]}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise RuntimeError(f"embedding_bag: offsets must be non-decreasing, got {values}")


def _check_index_range(input, rows: int) -> None:
    """An index outside the table is torch's RuntimeError (not embedding's IndexError), read where it can be."""
    if not concrete_cpu(input) or input.numel() == 0:
        return
    low, high = int(input.amin()), int(input.amax())
    if low < 0 or high >= rows:
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be "
                           f"{low if low < 0 else high} (valid indices are 0..{rows - 1})")


def _padding_index(padding_idx, rows: int):
    if padding_idx is None:
        return None
    if not -rows <= padding_idx < rows:
        raise RuntimeError(f"padding_idx must be within the number of embeddings, {-rows} through {rows - 1}, but got "
                           f"{padding_idx}")
    return padding_idx % rows


def _bag_bounds(offsets, length: int, include_last_offset: bool):
    """(start, end) of each bag, as tensors. With ``include_last_offset``, torch's CPU kernels run the last bag to
    the input's end, not to the last offset, where the input goes past it (max and float64 sum and mean; torch's
    float32 sum and mean, by another kernel, stop their sum at the last offset but count to the end)."""
    from tilewise.ops.creation import full
    from tilewise.ops.registry import call

    offsets = offsets.long()
    end = full((1,), length, dtype=offsets.dtype, device=offsets.device)
    if include_last_offset:
        return offsets[:-1], call("cat", [offsets[1:-1], end])
    return offsets, call("cat", [offsets[1:], end])


def _bag_of_each_element(starts, length: int):
    """The bag of each input position (the last bag runs to the input's end, see ``_bag_bounds``)."""
    from tilewise.ops.creation import ones, zeros

    bags = starts.shape[0]
    marks = zeros((length + 1,), dtype=starts.dtype, device=starts.device)
    marks = marks.index_put((starts,), ones((bags,), dtype=starts.dtype, device=starts.device), True)
    return (marks[:length].cumsum(0) - 1).clamp(0, max(bags - 1, 0))


def _reduce_dense(rows, counted, mode):
    """Reduce (bags, length, dim) rows over length, where ``counted`` (bags, length) marks the rows that count."""
    if mode == "max":
        masked = where(counted.unsqueeze(2), rows, float("-inf"))
        peak = masked.amax(1) if rows.shape[1] else rows.sum(1)
        return where(counted.any(1).unsqueeze(1), peak, 0.0)
    total = where(counted.unsqueeze(2), rows, 0.0).sum(1)
    if mode == "sum":
        return total
    return total / counted.sum(1).clamp(min=1).unsqueeze(1).to(total.dtype)


def _longest_bag(starts, ends, length: int) -> int:
    if values_readable(starts) and values_readable(ends):
        return max((int(e) - int(s) for s, e in zip(starts.tolist(), ends.tolist())), default=0)
    return length


def _bags_of_offsets(rows, counted, starts, ends, mode):
    """Reduce the rows of a 1-D input per bag given by (start, end)."""
    from tilewise.ops.creation import arange, zeros

    length, dim = rows.shape
    bags = starts.shape[0]
    if bags == 0:
        return zeros((0, dim), dtype=rows.dtype, device=rows.device)
    if mode == "max":
        longest = _longest_bag(starts, ends, length)
        positions = starts.unsqueeze(1) + arange(longest, device=rows.device)
        in_bag = positions < ends.unsqueeze(1)
        safe = positions.clamp(0, max(length - 1, 0))
        dense = rows[safe] if length else zeros((bags, longest, dim), dtype=rows.dtype, device=rows.device)
        listed = counted[safe] if length else in_bag
        return _reduce_dense(dense, in_bag & listed, mode)
    bag = _bag_of_each_element(starts, length)
    total = zeros((bags, dim), dtype=rows.dtype, device=rows.device)
    total = total.index_put((bag,), where(counted.unsqueeze(1), rows, 0.0), True)
    if mode == "sum":
        return total
    counts = zeros((bags,), dtype=rows.dtype, device=rows.device).index_put((bag,), counted.to(rows.dtype), True)
    return total / counts.clamp(min=1).unsqueeze(1)


def _embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, mode="mean",
                   sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    _check_embedding_bag(input, weight, offsets, mode, scale_grad_by_freq, sparse, per_sample_weights)
    padding_idx = _padding_index(padding_idx, weight.shape[0])
    if input.ndim == 1:
        _check_offsets(offsets, input.shape[0], include_last_offset)
    _check_index_range(input, weight.shape[0])
    if offsets is not None and input.dtype is not offsets.dtype:
        input = input.to(promote_types(input.dtype, offsets.dtype))
    if max_norm is not None:
        _renorm_rows_(weight, input, max_norm, norm_type)
    rows = call_public("embedding", input, weight, padding_idx, None, 2.0, scale_grad_by_freq)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(-1)
    counted = input != (padding_idx if padding_idx is not None else -1)  # indices are >= 0: every row counts
    if input.ndim == 2:
        return _reduce_dense(rows, counted, mode)
    starts, ends = _bag_bounds(offsets, input.shape[0], include_last_offset)
    return _bags_of_offsets(rows, counted, starts, ends, mode)


functional("embedding_bag(Tensor input, Tensor weight, Tensor? offsets=None, float? max_norm=None, "
           "float norm_type=2.0, bool scale_grad_by_freq=False, str mode='mean', bool sparse=False, "
           "Tensor? per_sample_weights=None, bool include_last_offset=False, int? padding_idx=None) -> Tensor",
           _embedding_bag, function=False)


# ---------------------------------------------------------------- torch.embedding_bag (ATen's signature)
def _max_indices(weight, indices, counted, starts, ends, sizes):
    """For each bag and column, the index (from ``indices``) of the first counted row holding the bag's maximum;
    0 for a bag with no counted row."""
    from tilewise.ops.creation import arange, zeros

    length, dim, bags = indices.shape[0], weight.shape[1], starts.shape[0]
    if length == 0 or bags == 0:
        return zeros((bags, dim), dtype=indices.dtype, device=indices.device)
    longest = _longest_bag(starts, ends, length)
    positions = starts.unsqueeze(1) + arange(longest, device=indices.device)
    safe = positions.clamp(0, length - 1)
    listed = (positions < ends.unsqueeze(1)) & counted[safe]
    rows = where(listed.unsqueeze(2), weight[indices][safe], float("-inf"))
    first = rows.argmax(1) if longest else zeros((bags, dim), dtype=indices.dtype, device=indices.device)
    found = indices[safe.gather(1, first)]
    return where((sizes > 0).unsqueeze(1), found, 0).to(indices.dtype)


def _summed_directly(weight, padding) -> bool:
    """Where torch's CPU kernel sums rows straight into the output and leaves ``offset2bag`` empty: no padding
    index and a float32, float16 or bfloat16 table (torch also asks for dense rows; the layout is not read here)."""
    return padding is None and weight.dtype.name in ("float32", "float16", "bfloat16")


def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=None):
    """torch.embedding_bag: ``(output, offset2bag, bag_size, max_indices)``, with ``mode`` an int (0 sum, 1 mean,
    2 max). ``output`` is nn.functional.embedding_bag's (one declaration: its gradient too); the other three are what
    torch's CPU kernel returns for its backward: each index's bag (empty for sums it adds up directly), each bag's
    count of indices that are not ``padding_idx`` (zeros for sums), and for max each bag's and column's chosen index
    (for means the counts again, for sums zeros), all in the indices' and offsets' promoted integer dtype."""
    from tilewise.ops.creation import empty, zeros

    if type(mode) is not int:
        raise TypeError(f"embedding_bag(): argument 'mode' (position 5) must be int, not {type(mode).__name__}")
    if not 0 <= mode < len(_MODES):
        raise RuntimeError("`mode` must be sum, mean, or max.")
    name = _MODES[mode]
    if per_sample_weights is not None and name != "sum":
        raise RuntimeError("embedding_bag: per_sample_weights only supported with mode='sum'")
    if offsets is None:
        raise TypeError("embedding_bag(): argument 'offsets' (position 3) must be Tensor, not NoneType")
    if indices.ndim != 1:
        raise RuntimeError(f"embedding_bag: expected 1-D indices with offsets (a batch of equal bags goes through "
                           f"nn.functional.embedding_bag), got indices of shape {list(indices.shape)}")
    output = call_public("embedding_bag", indices, weight, offsets, None, 2.0, scale_grad_by_freq, name, sparse,
                         per_sample_weights, include_last_offset, padding_idx)
    padding = _padding_index(padding_idx, weight.shape[0])
    with no_grad():
        index_dtype = promote_types(indices.dtype, offsets.dtype)
        indices = indices.to(index_dtype)
        length = indices.shape[0]
        starts, ends = _bag_bounds(offsets, length, include_last_offset)
        bags = starts.shape[0]
        counted = indices != (padding if padding is not None else -1)
        bag = _bag_of_each_element(starts, length).to(index_dtype)
        no_bags = zeros((bags,), dtype=index_dtype, device=indices.device)
        if name == "sum":
            direct = _summed_directly(weight, padding)
            offset2bag = empty((0,), dtype=index_dtype, device=indices.device) if direct else bag
            return output, offset2bag, no_bags, no_bags.clone()
        sizes = no_bags.index_put((bag,), counted.to(index_dtype), True) if length else no_bags
        if name == "mean":
            return output, bag, sizes, sizes.clone()
        return output, bag, sizes, _max_indices(weight.detach(), indices, counted, starts, ends, sizes)
