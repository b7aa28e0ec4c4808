"""The strides eager gives an operator's result, so that a traced value answers as eager's does and a compiled
function returns its tensors in eager's memory format.

[Note: eager strides of traced values] Graph values are laid out row-major in their logical shape, but eager lays out
some results otherwise: element-wise operators in the order of their operands (torch's TensorIterator rule,
``strides.pointwise_strides``: a transposed or channels-last operand gives a result in its order), copies under
``preserve_format``, sort, flip and index_put as their source, convolutions (either operand channels-last), batch and
group normalisation, pooling, interpolation and concatenation in a channels-last input's format; a softmax or a layer
norm returns row-major. While a function is traced, each result is given the strides eager would give it: a result eager
lays out in another order becomes a view, with eager's strides, of a value holding it in that memory order (its
``permute``, which the graph drops when nothing reads through it; ``Capture.lay_out``). So ``stride()``,
``storage_offset()``, ``is_contiguous()``, ``suggest_memory_format()``, views (a view's geometry is its rule applied to
those strides), ``view``'s refusals, ``reshape``'s choice between a view and a copy, and ``as_strided`` over the memory
answer as in eager. A composite's result takes the strides its decomposition gave (capture runs it anyway); a
primitive's come from the rules here; an operator they do not know returns row-major, as most do.

A returned tensor that eager lays out densely in another order than row-major (channels-last, a transposed matrix's
element-wise result) leaves the program as the permutation that is its memory order (``permute``, ``clone``; for
channels-last its (N, *S, C) permutation), handed back as the tensor of its logical shape with eager's strides (its
gradient, if it needs one, is the traced value's, taken in the logical order). The CUDA target's channels-last
lowering writes such a value where it lies instead of the transposing copy it made before
(``lowering/channels_last.py``). A returned tensor with no dense layout in eager (a slice of an intermediate) is a
view over the program output that holds the memory it views, as eager's is (see [Note: outputs that alias] in
function.py); where that memory is a result's memory-order value, the output is that result, handed back as above,
so that its autograd history carries on.
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
COPIES = frozenset({"clone", "_to_copy", "to", "type_as"})  # a copy of their source, in its layout unless told
# results laid out as their first tensor argument, as copies under preserve_format are
AS_INPUT = frozenset({"sort", "flip", "index_put"})
# element-wise operators with kernels of their own
ELEMENTWISE = frozenset({"frexp", "gcd", "lcm", "igamma", "igammac"})


def format_of(t: Tensor) -> str:
    """The memory format of ``t``'s strides (a traced value's are eager's: see the note)."""
    return S.suggest_memory_format(t._shape, t._strides) if len(t._shape) in (4, 5) else CONTIGUOUS


_FORMAT_PARAM: dict = {}  # operator -> the position of its ``memory_format`` parameter, or -1 (asked per call)


def _asked_format(op, args: tuple) -> str | None:
    """The format a ``memory_format`` argument asks for; None where there is none or it preserves."""
    k = _FORMAT_PARAM.get(op)
    if k is None:
        k = _FORMAT_PARAM[op] = next((k for k, p in enumerate(op.schema.params) if p.name == "memory_format"), -1)
    if k < 0 or k >= len(args) or args[k] is None:
        return None
    fmt = getattr(args[k], "name", CONTIGUOUS)
    return fmt if fmt != "preserve_format" else None


def _pointwise_strides(op, args: tuple, shape: tuple) -> tuple | None:
    """As the eager kernels lay out an element-wise result: row-major from row-major operands, else by
    ``strides.pointwise_strides`` over the tensor operands (a Python number counting as a 0-dim one)."""
    if op.attrs.get("row_major"):  # torch's own kernel for the operator writes row-major
        return None
    operands, row_major = [], True
    for k in op.tensor_idx:
        a = args[k] if k < len(args) else None
        if type(a) is Tensor:
            operands.append((a._shape, a._strides))
            row_major = row_major and a._strides == S.contiguous_strides(a._shape)
        elif a is not None:
            operands.append(S.WRAPPED_NUMBER)
    return None if row_major else S.pointwise_strides(shape, operands)


def result_strides(op, args: tuple, shape: tuple) -> tuple | None:
    """The strides eager gives ``op``'s result of ``shape`` for ``args`` (whose traced tensors carry eager's strides);
    None where they are row-major."""
    asked = _asked_format(op, args)
    if asked is not None:
        order = S.FORMAT_ORDERS.get(asked)
        return S.format_strides(asked, shape) if order is not None and len(order) == len(shape) else None
    tensors = []
    for a in args:
        if type(a) is Tensor:
            tensors.append(a)
        elif isinstance(a, (list, tuple)):
            tensors += [b for b in a if type(b) is Tensor]
    if not tensors:
        return None
    name = op.name
    if op.kind == "pointwise" or name in ELEMENTWISE:
        return _pointwise_strides(op, args, shape)
    if name in COPIES or name in AS_INPUT:
        source = tensors[0]
        return S.preserved_strides(source._shape, source._strides) if tuple(source._shape) == tuple(shape) else None
    if len(shape) not in (4, 5):
        return None
    fmt = CONTIGUOUS
    if name in CONVOLUTIONS:
        last = _LAST[len(shape)]
        fmt = last if any(format_of(a) == last for a in tensors[:2]) else CONTIGUOUS
    elif name in PRESERVE_FIRST and len(tensors[0]._shape) == len(shape):
        fmt = format_of(tensors[0])
    return S.format_strides(fmt, shape) if fmt != CONTIGUOUS else None
