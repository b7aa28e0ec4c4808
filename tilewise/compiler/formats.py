"""The memory format eager gives an operator's result, so that a compiled function returns its tensors in it.

[Note: returned memory formats] Graph values are laid out row-major in their logical shape, but eager keeps a
channels-last input's format through element-wise operators (after the first operand of the result's shape, as torch's
TensorIterator does), convolutions (either operand channels-last), batch and group normalisation, pooling,
interpolation and concatenation; a softmax or a layer norm returns row-major. While a function is traced, each 4-d or
5-d result records the format eager would give it (``Tensor._tw_format``), and a returned tensor whose format is
channels-last leaves the program as its (N, *S, C) permutation (``permute``, ``clone``), handed back as the (N, C, *S)
tensor with channels-last strides (its gradient, if it needs one, is the traced value's, taken in the logical order).
The CUDA target's channels-last lowering writes such a value where it lies instead of the transposing copy it made
before (``lowering/channels_last.py``). Values the function only uses inside are untouched. An operator this table
does not know returns row-major, as most do; the values are the same either way.
"""

from __future__ import annotations

from tilewise import strides as S
from tilewise.tensor import Tensor

CONTIGUOUS = "contiguous_format"


def to_channels_last(rank: int) -> tuple[int, ...]:
    """The permutation (N, C, *S) -> (N, *S, C)."""
    return (0, *range(2, rank), 1)


def from_channels_last(rank: int) -> tuple[int, ...]:
    """The permutation (N, *S, C) -> (N, C, *S)."""
    return (0, rank - 1, *range(1, rank - 1))


_LAST = {4: "channels_last", 5: "channels_last_3d"}

CONVOLUTIONS = frozenset({"conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d", "convolution",
                          "_conv2d", "_conv3d", "_conv_transpose2d", "_conv_transpose3d"})
# results in the format of the first tensor argument (the input; for cat the first tensor joined)
PRESERVE_FIRST = frozenset({
    "batch_norm", "native_batch_norm", "_batch_norm_backward", "group_norm", "native_group_norm", "instance_norm",
    "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d", "interpolate",
    "upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest3d", "upsample_trilinear3d", "cat",
    "dropout", "alpha_dropout", "feature_alpha_dropout",
})
ELEMENTWISE = frozenset({"clone", "_to_copy", "to", "type_as"})


def format_of(t: Tensor) -> str:
    """The memory format of ``t``: from its strides for a real tensor, as recorded for a traced result."""
    if t._trace is None:
        return S.suggest_memory_format(t._shape, t._strides) if len(t._shape) in (4, 5) else CONTIGUOUS
    return t.__dict__.get("_tw_format", CONTIGUOUS)


def result_format(op, args: tuple, shape: tuple) -> str:
    """The memory format eager gives ``op``'s result of ``shape`` for ``args``."""
    if len(shape) not in (4, 5):
        return CONTIGUOUS
    name = op.name
    params = op.schema.params
    for k, p in enumerate(params):
        if p.name == "memory_format" and k < len(args) and args[k] is not None:
            fmt = getattr(args[k], "name", CONTIGUOUS)
            if fmt != "preserve_format":
                return fmt
    tensors = []
    for a in args:
        if type(a) is Tensor:
            tensors.append(a)
        elif isinstance(a, (list, tuple)):
            tensors += [b for b in a if type(b) is Tensor]
    if not tensors:
        return CONTIGUOUS
    if op.kind == "pointwise" or name in ELEMENTWISE:
        for a in tensors:
            if tuple(a._shape) == tuple(shape):
                return format_of(a)
        return CONTIGUOUS
    if name in CONVOLUTIONS:
        last = _LAST[len(shape)]
        return last if any(format_of(a) == last for a in tensors[:2]) else CONTIGUOUS
    if name in PRESERVE_FIRST and len(tensors[0]._shape) == len(shape):
        return format_of(tensors[0])
    return CONTIGUOUS


def mark_result(op, args: tuple, out) -> None:
    """Record on a traced result (or each of a tuple's) the memory format eager would give it."""
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if type(t) is Tensor and len(t._shape) in (4, 5):
            fmt = result_format(op, args, tuple(t._shape))
            if fmt != CONTIGUOUS:
                t.__dict__["_tw_format"] = fmt
            # a tuple's later results (a batch norm's statistics) are of other ranks: the check above skips them
