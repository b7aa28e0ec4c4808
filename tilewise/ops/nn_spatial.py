"""torch.nn.functional's convolutions, and the window views that convolution and pooling share.

[Note: convolution as im2col] conv1d, conv2d and conv3d pad the input (one ``view_scatter`` into a constant
tensor), take every window as a strided view (one ``unfold`` view per spatial dim, plus a strided slice for
dilation), lay the windows out as columns (one copy) and multiply them with the weight in one batched GEMM over
the groups, so convolution reuses the matmul path of every backend. Like torch, it saves its input and weight for
backward, not the columns (prod(kernel) times the input): ``_conv_weight_grad`` takes the windows again for the
weight gradient, and ``_conv_input_grad`` scatters the columns' gradient back with their geometry
(``view_scatter_add``, col2im) for the input's. conv1d is conv2d over a height of 1.
A transposed convolution is the adjoint of a convolution: its output is col2im of the input times the weight
(the input gradient of the convolution it transposes), and its own gradients are that convolution's forward
(for its input) and weight gradient, so it saves the same two tensors as a convolution.
Pooling (``nn_pooling``) takes the same window views.
"""

from __future__ import annotations

import math
import warnings

from tilewise import strides as S
from tilewise.layouts import channels_last, channels_last_3d, contiguous_format
from tilewise.ops.batching_rules import convolution_rule
from tilewise.ops.nn_functional import functional, int_tuple, private
from tilewise.ops.registry import OPS


def _constant_pad(x, pads, value):
    """x with its last len(pads) dims padded by (before, after) each with a constant."""
    from tilewise.ops.creation import full

    lead = x.ndim - len(pads)
    shape = tuple(x.shape[:lead]) + tuple(n + before + after for n, (before, after) in zip(x.shape[lead:], pads))
    strides = S.contiguous_strides(shape)
    offset = sum(before * strides[lead + k] for k, (before, _) in enumerate(pads))
    base = full(shape, value, dtype=x.dtype, device=x.device)
    return OPS["view_scatter"](base, x, tuple(x.shape), strides, offset)


def _window_count(size: int, kernel: int, stride: int, dilation: int) -> int:
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def _windows(x, kernel, stride, dilation):
    """(..., *S) -> the (..., *O, *K) view of every (dilated, strided) window over the last len(kernel) dims."""
    lead = x.ndim - len(kernel)
    for k, (size, step, d) in enumerate(zip(kernel, stride, dilation)):
        x = x.unfold(lead + k, d * (size - 1) + 1, step)
    if max(dilation) > 1:
        x = x[(Ellipsis, *(slice(None, None, d) for d in dilation))]
    return x


def _windows_adjoint(windows, input_shape, pads, stride, dilation):
    """The adjoint of ``_windows`` of the padded input: each (N, C, *O, *K) window element's gradient added to the
    input element it read (nothing reaches the padding)."""
    spatial = len(pads)
    lead = len(input_shape) - spatial
    padded = (*input_shape[:lead], *(n + before + after for n, (before, after) in zip(input_shape[lead:], pads)))
    strides = S.contiguous_strides(padded)
    inner = strides[lead:]
    window_strides = (*strides[:lead], *(s * step for s, step in zip(inner, stride)),
                      *(s * d for s, d in zip(inner, dilation)))
    grad = OPS["view_scatter_add"](windows, padded, tuple(windows.shape), window_strides, 0)
    if not any(before or after for before, after in pads):
        return grad
    return grad[(Ellipsis, *(slice(before, before + n) for n, (before, _) in zip(input_shape[lead:], pads)))]


# ============================================================================ convolution

def _check_window_args(op, groups, stride, dilation, padding) -> None:
    """The checks convolution and its transpose share, with torch's messages."""
    if groups <= 0:
        raise RuntimeError(f"{op}: non-positive groups is not supported, got groups={groups}")
    if min(stride) <= 0:
        raise RuntimeError(f"{op}: non-positive stride is not supported, got stride={list(stride)}")
    if min(dilation) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, got dilation={list(dilation)}")
    if not isinstance(padding, str) and min(padding) < 0:
        raise RuntimeError(f"{op}: negative padding is not supported, got padding={list(padding)}")


def _batched_shape(input, spatial: int) -> list[int]:
    """The input's shape as torch names it in errors: an unbatched input as the batch of one it becomes."""
    return list(input.shape) if input.ndim == spatial + 2 else [1, *input.shape]


def _check_conv(op, input, weight, bias, stride, padding, dilation, groups, spatial: int) -> None:
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input to {op}, but got "
                           f"input of size: {list(input.shape)}")
    if weight.ndim != spatial + 2:
        raise RuntimeError(f"{op}: Expected {spatial + 2}-dimensional weight (out_channels, in_channels / groups, "
                           f"*kernel_size), but got weight of size {list(weight.shape)}")
    _check_window_args(op, groups, stride, dilation, padding)
    channels = input.shape[-spatial - 1]
    out_channels, group_channels = weight.shape[0], weight.shape[1]
    if out_channels < groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but "
                           f"got weight of size {list(weight.shape)} instead")
    if out_channels % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                           f"got weight of size [{list(weight.shape)}] instead")  # torch's doubled brackets
    if channels != group_channels * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected "
                           f"input{_batched_shape(input, spatial)} to have {group_channels * groups} channels, but got "
                           f"{channels} channels instead")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                           f"{out_channels} elements, but got bias of size {list(bias.shape)} instead")
    _check_same_dtypes(op, input, weight, bias)


def _check_same_dtypes(op, input, weight, bias) -> None:
    """torch computes in the input's dtype and refuses to promote a weight or bias of another."""
    if input.dtype is not weight.dtype:
        raise RuntimeError(f"{op}: Input type ({input.dtype}) and weight type ({weight.dtype}) should be the same")
    if bias is not None and bias.dtype is not input.dtype:
        raise RuntimeError(f"{op}: Input type ({input.dtype}) and bias type ({bias.dtype}) should be the same")


def _conv_pads(op, padding, kernel, stride, dilation) -> list[tuple[int, int]]:
    if not isinstance(padding, str):
        return [(p, p) for p in padding]
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding != "same":
        raise RuntimeError(f"{op}: Invalid padding string: {padding!r}, should be one of 'valid', 'same'")
    if max(stride) != 1:
        raise RuntimeError(f"{op}: padding='same' is not supported for strided convolutions, got "
                           f"stride={list(stride)}")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [(t // 2, t - t // 2) for t in totals]  # an odd total pads one more after, as torch does


def _check_output_size(op, padded_shape, weight, stride, dilation) -> None:
    sizes = padded_shape[2:]
    spans = [d * (k - 1) + 1 for k, d in zip(weight.shape[2:], dilation)]
    if any(_window_count(n, k, s, d) <= 0 for n, k, s, d in zip(sizes, weight.shape[2:], stride, dilation)):
        raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, sizes))}). Kernel "
                           f"size: ({' x '.join(map(str, spans))}). Kernel size can't be greater than actual input "
                           "size")


def _pad_pairs(pads) -> list[tuple[int, int]]:
    return [(pads[k], pads[k + 1]) for k in range(0, len(pads), 2)]


def _columns(windows, groups: int):
    """(N, C, *O, *K) windows -> (groups, N * prod(O), C / groups * prod(K)): one matrix per group."""
    spatial = (windows.ndim - 2) // 2
    batch, channels = windows.shape[:2]
    out, kernel = windows.shape[2:2 + spatial], windows.shape[2 + spatial:]
    grouped = windows.reshape(batch, groups, channels // groups, *out, *kernel)
    order = (1, 0, *range(3, 3 + spatial), 2, *range(3 + spatial, 3 + 2 * spatial))
    return grouped.permute(*order).reshape(groups, batch * math.prod(out), channels // groups * math.prod(kernel))


def _im2col(x, weight_shape, stride, pads, dilation, groups, out_sizes=None):
    """The padded input's windows as one matrix per group: (groups, N * prod(O), C / groups * prod(K)); with
    ``out_sizes``, only the first windows along each dim."""
    if any(pads):
        x = _constant_pad(x, _pad_pairs(pads), 0)
    windows = _windows(x, tuple(weight_shape[2:]), stride, dilation)
    if out_sizes is not None:
        windows = _leading(windows, 2, out_sizes)
    return _columns(windows, groups)


def _leading(x, first_dim: int, sizes):
    """x cut to its first ``sizes`` entries along the dims from ``first_dim`` on (a view; x itself where it fits)."""
    if tuple(x.shape[first_dim:first_dim + len(sizes)]) == tuple(sizes):
        return x
    return x[(*(slice(None),) * first_dim, *(slice(0, n) for n in sizes))]


def _col2im(columns, input_shape, weight_shape, stride, pads, dilation, groups, out_sizes):
    """The adjoint of ``_im2col``: each column entry added back to the input element its window read."""
    batch, channels = input_shape[:2]
    group_channels, kernel = weight_shape[1], tuple(weight_shape[2:])
    spatial = len(kernel)
    windows = columns.reshape(groups, batch, *out_sizes, group_channels, *kernel)
    order = (1, 0, 2 + spatial, *range(2, 2 + spatial), *range(3 + spatial, 3 + 2 * spatial))
    windows = windows.permute(*order).reshape(batch, channels, *out_sizes, *kernel)
    return _windows_adjoint(windows, input_shape, _pad_pairs(pads), stride, dilation)


def _grouped(grad, groups: int):
    """(N, OC, *O) -> (groups, N * prod(O), OC / groups): the GEMM's output layout."""
    batch, out_channels, *out = grad.shape
    per_group = out_channels // groups
    spatial = len(out)
    return (grad.reshape(batch, groups, per_group, *out).permute(1, 0, *range(3, 3 + spatial), 2)
            .reshape(groups, batch * math.prod(out), per_group))


def _ungrouped(out, batch: int, out_sizes, memory_format):
    """The inverse of ``_grouped``: (groups, N * prod(O), OC / groups) -> (N, OC, *O) in ``memory_format``; with
    one group the GEMM's output already lies channels-last, so that format costs no copy."""
    groups, _, per_group = out.shape
    spatial = len(out_sizes)
    out = out.reshape(groups, batch, *out_sizes, per_group).permute(1, 0, 2 + spatial, *range(2, 2 + spatial))
    return out.reshape(batch, groups * per_group, *out_sizes).contiguous(memory_format=memory_format)


def _conv_memory_format(input, weight):
    """torch's rule for a convolution's result (and its input's gradient): channels-last when the input or the
    weight suggests it, else contiguous."""
    for name in ("channels_last", "channels_last_3d"):
        if name in (S.suggest_memory_format(input._shape, input._strides),
                    S.suggest_memory_format(weight._shape, weight._strides)):
            return _FORMATS[name]
    return contiguous_format


_FORMATS = {"channels_last": channels_last, "channels_last_3d": channels_last_3d}


def _flat_weight(weight, groups: int):
    """(OC, C / groups, *K) -> (groups, OC / groups, C / groups * prod(K))."""
    return weight.reshape(groups, weight.shape[0] // groups, -1)


def _convolution_forward(input, weight, stride, pads, dilation, groups):
    out_sizes = [_window_count(n + before + after, k, s, d) for n, (before, after), k, s, d
                 in zip(input.shape[2:], _pad_pairs(pads), weight.shape[2:], stride, dilation)]
    columns = _im2col(input, weight.shape, stride, pads, dilation, groups)
    return _ungrouped(columns.bmm(_flat_weight(weight, groups).transpose(1, 2)), input.shape[0], out_sizes,
                      _conv_memory_format(input, weight))


def _conv_input_grad(grad, input, weight, stride, pads, dilation, groups):
    """The input's gradient: the output gradient's columns scattered back to the windows they came from, in the
    memory format torch gives it."""
    columns = _grouped(grad, groups).bmm(_flat_weight(weight, groups))
    grad_input = _col2im(columns, tuple(input.shape), tuple(weight.shape), stride, pads, dilation, groups,
                         tuple(grad.shape[2:]))
    return grad_input.contiguous(memory_format=_conv_memory_format(input, weight))


def _conv_weight_grad(grad, input, weight, stride, pads, dilation, groups):
    """The weight's gradient from the saved input: the windows are taken again rather than kept from the forward
    (torch saves the same two tensors; the windows are prod(kernel) times the input)."""
    grad_weight = _grouped(grad, groups).transpose(1, 2).bmm(_im2col(input, weight.shape, stride, pads, dilation,
                                                                      groups))
    return grad_weight.reshape(weight.shape)


def _transposed_output_sizes(input_sizes, kernel, stride, pads, dilation, output_padding):
    return [(n - 1) * s - before - after + d * (k - 1) + extra + 1 for n, k, s, (before, after), d, extra
            in zip(input_sizes, kernel, stride, _pad_pairs(pads), dilation, output_padding)]


def _conv_transpose_forward(input, weight, stride, pads, dilation, groups, output_padding):
    """col2im of the input times the weight: the input gradient of the convolution this one transposes."""
    batch, in_channels, *sizes = input.shape
    out_channels = weight.shape[1] * groups
    out_sizes = _transposed_output_sizes(sizes, weight.shape[2:], stride, pads, dilation, output_padding)
    columns = _grouped(input, groups).bmm(_flat_weight(weight, groups))
    out = _col2im(columns, (batch, out_channels, *out_sizes), tuple(weight.shape), stride, pads, dilation, groups,
                  tuple(sizes))
    return out.contiguous(memory_format=_conv_memory_format(input, weight))


def _conv_transpose_input_grad(grad, input, weight, stride, pads, dilation, groups):
    """The input's gradient of a transposed convolution is the forward of the convolution it transposes. An output
    padding below the dilation (not the stride) can give that convolution more windows than the input has
    positions: the extra windows read only output positions no input reached, so they are dropped."""
    sizes = tuple(input.shape[2:])
    grad_input = _leading(_convolution_forward(grad, weight, stride, pads, dilation, groups), 2, sizes)
    return grad_input.contiguous(memory_format=_conv_memory_format(input, weight))


def _conv_transpose_weight_grad(grad, input, weight, stride, pads, dilation, groups):
    """That convolution's weight gradient with the roles of input and output gradient swapped."""
    sizes = tuple(input.shape[2:])
    grad_weight = _grouped(input, groups).transpose(1, 2).bmm(_im2col(grad, weight.shape, stride, pads, dilation,
                                                                       groups, sizes))
    return grad_weight.reshape(weight.shape)


# [Note: convolution backward] Each input's gradient is its own operator, as torch's convolution_backward
# computes only the gradients its output_mask asks for: autograd evaluates a formula only for an input that
# needs a gradient, so the first layer of a network, whose input is data, never computes an input gradient.
_CONV_ARGS = "stride, pads, dilation, groups"
for _n in (2, 3):
    _params = f"int[{_n}] stride, int[{2 * _n}] pads, int[{_n}] dilation, int groups"
    for _name, _forward, _input_grad, _weight_grad, _extra, _extra_args in (
            (f"_conv{_n}d", _convolution_forward, _conv_input_grad, _conv_weight_grad, "", ""),
            (f"_conv_transpose{_n}d", _conv_transpose_forward, _conv_transpose_input_grad,
             _conv_transpose_weight_grad, f", int[{_n}] output_padding", ", output_padding")):
        private(f"{_name}(Tensor input, Tensor weight, {_params}{_extra}) -> Tensor", _forward,
                {"input": f"OPS['{_name}_backward_input'](grad, input, weight, {_CONV_ARGS})",
                 "weight": f"OPS['{_name}_backward_weight'](grad, input, weight, {_CONV_ARGS})"},
                fwd=f"OPS['{_name}'](input_t, weight, {_CONV_ARGS}{_extra_args}) + "
                    f"OPS['{_name}'](input, weight_t, {_CONV_ARGS}{_extra_args})")  # bilinear
        private(f"{_name}_backward_input(Tensor grad, Tensor input, Tensor weight, {_params}) -> Tensor",
                _input_grad)
        private(f"{_name}_backward_weight(Tensor grad, Tensor input, Tensor weight, {_params}) -> Tensor",
                _weight_grad)


# [Note: channels-last convolutions] The CUDA target keeps convolutions and the element-wise work around them
# in channels-last memory (``compiler/lowering/channels_last.py``): there each convolution operator becomes its
# ``_channels_last`` variant, whose result is the channels-last permutation of the operator's — (N, *S, C) laid
# out row-major — which cuDNN writes directly. Anywhere else the variant is the operator and a transposing copy.
def _channels_last_variant(name: str):
    base = OPS[name]

    def variant(*args):
        out = base(*args)
        return out.permute(0, *range(2, out.ndim), 1).contiguous()

    private(base.schema.text.replace(f"{name}(", f"{name}_channels_last(", 1), variant, differentiable=False)


for _n in (2, 3):
    for _name in (f"_conv{_n}d", f"_conv_transpose{_n}d"):
        for _suffix in ("", "_backward_input", "_backward_weight"):
            _channels_last_variant(_name + _suffix)


def _as_2d(x, w, stride, dilation, pads):
    """A 1-D convolution's arguments as a 2-D convolution's over a height of 1."""
    return x.unsqueeze(2), w.unsqueeze(2), (1, *stride), (1, *dilation), [(0, 0), *pads]


def _convolution(op: str, spatial: int):
    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride, dilation = int_tuple(stride, spatial, "stride", op), int_tuple(dilation, spatial, "dilation", op)
        if not isinstance(padding, str):
            padding = int_tuple(padding, spatial, "padding", op)
        _check_conv(op, input, weight, bias, stride, padding, dilation, groups, spatial)
        pads = _conv_pads(op, padding, weight.shape[2:], stride, dilation)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        padded_shape = (*x.shape[:2], *(n + before + after for n, (before, after) in zip(x.shape[2:], pads)))
        _check_output_size(op, padded_shape, weight, stride, dilation)
        w = weight
        if spatial == 1:
            x, w, stride, dilation, pads = _as_2d(x, w, stride, dilation, pads)
        if any(before != after for before, after in pads):  # 'same' with an even span: torch pads a copy first
            warnings.warn("Using padding='same' with even kernel lengths and odd dilation may require a zero-padded "
                          "copy of the input be created", UserWarning, stacklevel=3)
            x = _constant_pad(x, [(0, after - before) for before, after in pads], 0)
            pads = [(before, before) for before, _ in pads]
        out = OPS[f"_conv{max(spatial, 2)}d"](x, w, stride, [p for pair in pads for p in pair], dilation, groups)
        if spatial == 1:
            out = out.squeeze(2)
        if bias is not None:
            out = out + bias.reshape((-1,) + (1,) * spatial)
        return out.squeeze(0) if unbatched else out

    return conv


for _spatial in (1, 2, 3):
    _name = f"conv{_spatial}d"
    _conv = _convolution(_name, _spatial)
    functional(f"{_name}(Tensor input, Tensor weight, Tensor? bias=None, int[{_spatial}] stride=1, "
               f"int[{_spatial}] padding=0, int[{_spatial}] dilation=1, int groups=1) -> Tensor", _conv,
               autocast="lower", batch=convolution_rule)
    functional(f"{_name}.padding(Tensor input, Tensor weight, Tensor? bias=None, int[{_spatial}] stride=1, "
               f"str padding='valid', int[{_spatial}] dilation=1, int groups=1) -> Tensor", _conv, autocast="lower",
               batch=convolution_rule)


# ============================================================================ transposed convolution

def _check_conv_transpose(op, input, weight, bias, stride, padding, output_padding, dilation, groups, spatial):
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input to {op}, but got "
                           f"input of size: {list(input.shape)}")
    if weight.ndim != spatial + 2:
        raise RuntimeError(f"{op}: Expected {spatial + 2}-dimensional weight (in_channels, out_channels / groups, "
                           f"*kernel_size), but got weight of size {list(weight.shape)}")
    _check_window_args(op, groups, stride, dilation, padding)
    if any(extra >= s and extra >= d for extra, s, d in zip(output_padding, stride, dilation)) \
            or min(output_padding) < 0:
        raise RuntimeError(f"{op}: output padding must be smaller than either stride or dilation, but got "
                           f"output_padding={list(output_padding)}, stride={list(stride)}, "
                           f"dilation={list(dilation)}")
    channels = input.shape[-spatial - 1]
    if channels != weight.shape[0]:
        raise RuntimeError(f"{op}: Given transposed=1, weight of size {list(weight.shape)}, expected "
                           f"input{_batched_shape(input, spatial)} to have {weight.shape[0]} channels, but got "
                           f"{channels} channels instead")
    if weight.shape[0] % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected weight to be divisible by {groups} at dimension 0 "
                           f"(in_channels), but got weight of size {list(weight.shape)} instead")
    out_channels = weight.shape[1] * groups
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise RuntimeError(f"{op}: Given transposed=1, weight of size {list(weight.shape)}, expected bias to be "
                           f"1-dimensional with {out_channels} elements, but got bias of size {list(bias.shape)} "
                           "instead")
    _check_same_dtypes(op, input, weight, bias)


def _transposed_convolution(op: str, spatial: int):
    def conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        stride, dilation = int_tuple(stride, spatial, "stride", op), int_tuple(dilation, spatial, "dilation", op)
        padding = int_tuple(padding, spatial, "padding", op)
        output_padding = int_tuple(output_padding, spatial, "output_padding", op)
        _check_conv_transpose(op, input, weight, bias, stride, padding, output_padding, dilation, groups, spatial)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        w, pads = weight, [(p, p) for p in padding]
        if spatial == 1:
            x, w, stride, dilation, pads = _as_2d(x, w, stride, dilation, pads)
            output_padding = (0, *output_padding)
        flat_pads = [p for pair in pads for p in pair]
        sizes = _transposed_output_sizes(x.shape[2:], w.shape[2:], stride, flat_pads, dilation, output_padding)
        if min(sizes) <= 0:
            raise RuntimeError(f"{op}: Given input size per channel: ({' x '.join(map(str, x.shape[2:]))}). "
                               f"Calculated output size per channel: ({' x '.join(map(str, sizes))}). Output size "
                               "is too small")
        out = OPS[f"_conv_transpose{max(spatial, 2)}d"](x, w, stride, flat_pads, dilation, groups, output_padding)
        if spatial == 1:
            out = out.squeeze(2)
        if bias is not None:
            out = out + bias.reshape((-1,) + (1,) * spatial)
        return out.squeeze(0) if unbatched else out

    return conv_transpose


for _spatial in (1, 2, 3):
    _name = f"conv_transpose{_spatial}d"
    functional(f"{_name}(Tensor input, Tensor weight, Tensor? bias=None, int[{_spatial}] stride=1, "
               f"int[{_spatial}] padding=0, int[{_spatial}] output_padding=0, int groups=1, "
               f"int[{_spatial}] dilation=1) -> Tensor", _transposed_convolution(_name, _spatial), autocast="lower",
               batch=convolution_rule)


def _conv_tbc(input, weight, bias, pad=0):
    """A 1-D convolution over (time, batch, channels) with a (kernel, in, out) weight."""
    if input.ndim != 3 or weight.ndim != 3 or bias.ndim != 1:
        raise RuntimeError(f"conv_tbc: Input must have 3 dims (time, batch, in_channel), weight 3 dims and bias 1 "
                           f"dim, got input {list(input.shape)}, weight {list(weight.shape)}, bias "
                           f"{list(bias.shape)}")
    if input.shape[2] != weight.shape[1]:
        raise RuntimeError(f"conv_tbc: Input dim 2 (input channels) is not == dim 1 in the weight: input "
                           f"{list(input.shape)}, weight {list(weight.shape)}")
    if bias.shape[0] != weight.shape[2]:
        raise RuntimeError(f"conv_tbc: Bias has wrong size: should match weight's output channels {weight.shape[2]}, "
                           f"got {bias.shape[0]}")
    out = OPS["conv1d"](input.permute(1, 2, 0), weight.permute(2, 1, 0), bias, 1, pad)
    return out.permute(2, 0, 1)


functional("conv_tbc(Tensor input, Tensor weight, Tensor bias, int pad=0) -> Tensor", _conv_tbc,
           autocast="lower")
