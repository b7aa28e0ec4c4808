"""torch.nn.functional's spatial operators: convolution, pooling, resampling and pixel shuffle.

[Note: convolution as im2col] conv1d and conv2d pad the input (one ``view_scatter`` into a constant tensor),
take every window as a strided view (two ``unfold`` views, plus a strided slice for dilation), lay the
windows out as columns (one copy) and multiply them with the weight in one batched GEMM over the groups,
so convolution reuses the matmul path of every backend. Like torch, it saves its input and weight for backward,
not the columns (KH * KW times the input): ``_conv2d_backward`` takes the windows again for the weight gradient
and scatters the columns' gradient back with their geometry (``view_scatter_add``, col2im) for the input's.
conv1d is conv2d over a height of 1. Pooling takes the same window views: max pooling picks in each
flattened window the element torch's rule picks (see [Note: max pooling and NaN]) and reads it back there;
average pooling sums and divides by torch's per-window divisor, and adaptive average pooling is two small
averaging matrices, one per spatial dim. Each carries torch's derivative and saves what torch saves: the
input, and for max pooling the indices it returns, whose positions the gradient is added at (so changing
either in place before backward is the error it is in torch), rather than the windows its decomposition
makes.
Nearest-neighbour interpolation gathers with torch's float32 source-index rule.
"""

from __future__ import annotations

import math

from tilewise import _strides as S
from tilewise.dtypes import float32, iinfo
from tilewise.ops.formulas import HELPERS
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
    """(N, C, H, W) -> the (N, C, OH, OW, KH, KW) view of every (dilated, strided) window."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    windows = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    return windows[..., ::dh, ::dw] if dh > 1 or dw > 1 else windows


# ============================================================================ convolution

def _check_conv(op, input, weight, bias, stride, padding, dilation, groups, spatial: int) -> None:
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input to {op}, but got "
                           f"input of size: {list(input.shape)}")
    if weight.ndim != spatial + 2:
        raise RuntimeError(f"{op}: Expected {spatial + 2}-dimensional weight (out_channels, in_channels / groups, "
                           f"*kernel_size), but got weight of size {list(weight.shape)}")
    if groups <= 0:
        raise RuntimeError(f"{op}: non-positive groups is not supported, got groups={groups}")
    if min(stride) <= 0:
        raise RuntimeError(f"{op}: non-positive stride is not supported, got stride={list(stride)}")
    if min(dilation) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, got dilation={list(dilation)}")
    if not isinstance(padding, str) and min(padding) < 0:
        raise RuntimeError(f"{op}: negative padding is not supported, got padding={list(padding)}")
    channels = input.shape[-spatial - 1]
    out_channels, group_channels = weight.shape[0], weight.shape[1]
    if out_channels % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected weight to be divisible by {groups} at dimension 0 "
                           f"(out_channels), but got weight of size {list(weight.shape)} instead")
    if channels != group_channels * groups:
        raise RuntimeError(f"{op}: Given groups={groups}, weight of size {list(weight.shape)}, expected "
                           f"input{list(input.shape)} to have {group_channels * groups} channels (in_channels = "
                           f"weight.shape[1] * groups = {group_channels} * {groups}), but got {channels} channels "
                           "instead")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise RuntimeError(f"{op}: Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                           f"{out_channels} elements, but got bias of size {list(bias.shape)} instead")
    if input.dtype is not weight.dtype:
        raise RuntimeError(f"{op}: Input type ({input.dtype}) and weight type ({weight.dtype}) should be the same")


def _conv_pads(op, padding, kernel, stride, dilation) -> list[tuple[int, int]]:
    if not isinstance(padding, str):
        return [(p, p) for p in padding]
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding != "same":
        raise ValueError(f"{op}: Invalid padding string {padding!r}, should be one of 'valid', 'same'")
    if max(stride) != 1:
        raise RuntimeError(f"{op}: padding='same' is not supported for strided convolutions, got "
                           f"stride={list(stride)}")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [(t // 2, t - t // 2) for t in totals]  # an odd total pads one more after, as torch does


def _output_size(op, padded_shape, weight, stride, dilation) -> tuple[int, int]:
    height, width = padded_shape[2:]
    kh, kw = weight.shape[2:]
    out_h, out_w = _window_count(height, kh, stride[0], dilation[0]), _window_count(width, kw, stride[1], dilation[1])
    if out_h <= 0 or out_w <= 0:
        raise RuntimeError(f"{op}: Calculated padded input size per channel: ({height} x {width}). Kernel size: "
                           f"({dilation[0] * (kh - 1) + 1} x {dilation[1] * (kw - 1) + 1}). Kernel size can't be "
                           "greater than actual input size")
    return out_h, out_w


def _pad_pairs(pads) -> list[tuple[int, int]]:
    return [(pads[k], pads[k + 1]) for k in range(0, len(pads), 2)]


def _im2col(x, weight_shape, stride, pads, dilation, groups):
    """The padded input's windows as one matrix per group: (groups, N * OH * OW, C / groups * KH * KW)."""
    if any(pads):
        x = _constant_pad(x, _pad_pairs(pads), 0)
    batch = x.shape[0]
    _, group_channels, kh, kw = weight_shape
    windows = _windows(x, (kh, kw), stride, dilation)
    out_h, out_w = windows.shape[2:4]
    return (windows.reshape(batch, groups, group_channels, out_h, out_w, kh, kw).permute(1, 0, 3, 4, 2, 5, 6)
            .reshape(groups, batch * out_h * out_w, group_channels * kh * kw))


def _col2im(columns, input_shape, weight_shape, stride, pads, dilation, groups, out_hw):
    """The adjoint of ``_im2col``: each column entry added back to the input element its window read."""
    batch, channels = input_shape[:2]
    _, group_channels, kh, kw = weight_shape
    out_h, out_w = out_hw
    windows = (columns.reshape(groups, batch, out_h, out_w, group_channels, kh, kw).permute(1, 0, 4, 2, 3, 5, 6)
               .reshape(batch, channels, out_h, out_w, kh, kw))
    return _windows_adjoint(windows, input_shape, _pad_pairs(pads), stride, dilation)


def _windows_adjoint(windows, input_shape, pads, stride, dilation):
    """The adjoint of ``_windows`` of the padded input: each (N, C, OH, OW, KH, KW) window element's gradient
    added to the input element it read (nothing reaches the padding)."""
    batch, channels, height, width = input_shape
    (top, bottom), (left, right) = pads
    padded = (batch, channels, height + top + bottom, width + left + right)
    s_batch, s_channel, s_row, s_col = S.contiguous_strides(padded)
    strides = (s_batch, s_channel, s_row * stride[0], s_col * stride[1], s_row * dilation[0], s_col * dilation[1])
    grad = OPS["view_scatter_add"](windows, padded, tuple(windows.shape), strides, 0)
    return grad[:, :, top:top + height, left:left + width] if top or bottom or left or right else grad


def _grouped(grad, groups: int):
    """(N, OC, OH, OW) -> (groups, N * OH * OW, OC / groups): the GEMM's output layout."""
    batch, out_channels, out_h, out_w = grad.shape
    per_group = out_channels // groups
    return (grad.reshape(batch, groups, per_group, out_h, out_w).permute(1, 0, 3, 4, 2)
            .reshape(groups, batch * out_h * out_w, per_group))


def _conv2d(input, weight, stride, pads, dilation, groups):
    batch, _, height, width = input.shape
    out_channels, group_channels, kh, kw = weight.shape
    out_h = _window_count(height + pads[0] + pads[1], kh, stride[0], dilation[0])
    out_w = _window_count(width + pads[2] + pads[3], kw, stride[1], dilation[1])
    per_group = out_channels // groups
    columns = _im2col(input, weight.shape, stride, pads, dilation, groups)
    out = columns.bmm(weight.reshape(groups, per_group, group_channels * kh * kw).transpose(1, 2))
    out = out.reshape(groups, batch, out_h, out_w, per_group).permute(1, 0, 4, 2, 3)
    return out.reshape(batch, out_channels, out_h, out_w).contiguous()


def _conv2d_backward(grad, input, weight, stride, pads, dilation, groups):
    """Input and weight gradients from the saved input and weight: the windows are taken again rather than
    kept from the forward (torch saves the same two tensors; the windows are KH * KW times the input)."""
    out_channels, group_channels, kh, kw = weight.shape
    g = _grouped(grad, groups)
    w = weight.reshape(groups, out_channels // groups, group_channels * kh * kw)
    grad_weight = g.transpose(1, 2).bmm(_im2col(input, weight.shape, stride, pads, dilation, groups))
    grad_input = _col2im(g.bmm(w), tuple(input.shape), tuple(weight.shape), stride, pads, dilation, groups,
                         tuple(grad.shape[2:]))
    return grad_input, grad_weight.reshape(weight.shape)


private("_conv2d(Tensor input, Tensor weight, int[2] stride, int[4] pads, int[2] dilation, int groups) -> Tensor",
        _conv2d, {"input, weight": "OPS['_conv2d_backward'](grad, input, weight, stride, pads, dilation, groups)"})
private("_conv2d_backward(Tensor grad, Tensor input, Tensor weight, int[2] stride, int[4] pads, int[2] dilation, "
        "int groups) -> (Tensor, Tensor)", _conv2d_backward)


def _convolution(op: str, spatial: int):
    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride, dilation = int_tuple(stride, spatial, "stride", op), int_tuple(dilation, spatial, "dilation", op)
        if not isinstance(padding, str):
            padding = int_tuple(padding, spatial, "padding", op)
        _check_conv(op, input, weight, bias, stride, padding, dilation, groups, spatial)
        pads = _conv_pads(op, padding, weight.shape[2:], stride, dilation)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        w = weight
        if spatial == 1:
            x, w = x.unsqueeze(2), w.unsqueeze(2)
            stride, dilation, pads = (1, *stride), (1, *dilation), [(0, 0), *pads]
        padded_shape = (*x.shape[:2], *(n + before + after for n, (before, after) in zip(x.shape[2:], pads)))
        _output_size(op, padded_shape, w, stride, dilation)
        if any(before != after for before, after in pads):  # 'same' with an even span: torch pads a copy first
            x = _constant_pad(x, [(0, after - before) for before, after in pads], 0)
            pads = [(before, before) for before, _ in pads]
        out = OPS["_conv2d"](x, w, stride, [p for pair in pads for p in pair], dilation, groups)
        if spatial == 1:
            out = out.squeeze(2)
        if bias is not None:
            out = out + bias.reshape((-1,) + (1,) * spatial)
        return out.squeeze(0) if unbatched else out

    return conv


for _spatial in (1, 2):
    _name = f"conv{_spatial}d"
    _conv = _convolution(_name, _spatial)
    functional(f"{_name}(Tensor input, Tensor weight, Tensor? bias=None, int[{_spatial}] stride=1, "
               f"int[{_spatial}] padding=0, int[{_spatial}] dilation=1, int groups=1) -> Tensor", _conv,
               autocast="lower")
    functional(f"{_name}.padding(Tensor input, Tensor weight, Tensor? bias=None, int[{_spatial}] stride=1, "
               f"str padding='valid', int[{_spatial}] dilation=1, int groups=1) -> Tensor", _conv, autocast="lower")


# ============================================================================ pooling

def _pool_args(op, input, kernel_size, stride, padding, dilation):
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: Expected 3D (unbatched) or 4D (batched) input, but got input of size: "
                           f"{list(input.shape)}")
    kernel = int_tuple(kernel_size, 2, "kernel_size", op)
    stride = kernel if not stride else int_tuple(stride, 2, "stride", op)
    padding, dilation = int_tuple(padding, 2, "padding", op), int_tuple(dilation, 2, "dilation", op)
    if min(kernel) <= 0 or min(stride) <= 0 or min(dilation) <= 0:
        raise RuntimeError(f"{op}: kernel_size, stride and dilation must be greater than zero, got "
                           f"kernel_size={list(kernel)}, stride={list(stride)}, dilation={list(dilation)}")
    for k, p, d in zip(kernel, padding, dilation):
        if p < 0 or p > (d * (k - 1) + 1) // 2:
            raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but got pad={p}, "
                               f"kernel_size={k} and dilation={d}")
    return kernel, stride, padding, dilation


def _pooled_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    span = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _pooling_geometry(op, shape, kernel, stride, padding, dilation, ceil_mode):
    """(output sizes, (before, after) padding per spatial dim) of pooling a (..., C, H, W) input: the padding
    after reaches as far as the last window does (past the input with ceil_mode)."""
    sizes = tuple(_pooled_size(n, k, s, p, d, ceil_mode)
                  for n, k, s, p, d in zip(shape[-2:], kernel, stride, padding, dilation))
    if min(sizes) < 1:
        channels, height, width = shape[-3:]
        raise RuntimeError(f"{op}: Given input size: ({channels}x{height}x{width}). Calculated output size: "
                           f"({channels}x{sizes[0]}x{sizes[1]}). Output size is too small")
    pads = [(p, max((o - 1) * s + d * (k - 1) + 1 - n - p, 0))
            for n, o, k, s, p, d in zip(shape[-2:], sizes, kernel, stride, padding, dilation)]
    return sizes, pads


def _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, fill):
    """The (N, C, OH, OW, KH, KW) windows of x padded with fill (on the right as far as ceil_mode reaches)."""
    sizes, pads = _pooling_geometry(op, x.shape, kernel, stride, padding, dilation, ceil_mode)
    padded = _constant_pad(x, pads, fill) if any(before or after for before, after in pads) else x
    return _windows(padded, kernel, stride, dilation)[:, :, :sizes[0], :sizes[1]]


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else iinfo(dtype).min


def _window_argmax_to_input_index(position, kernel, stride, padding, dilation, width: int):
    """Flat index (h * W + w) into the unpadded input plane of each window's maximum, as torch returns."""
    from tilewise.ops.creation import arange

    out_h, out_w = position.shape[-2:]
    rows = (arange(out_h, device=position.device) * stride[0] - padding[0]).unsqueeze(1)
    cols = arange(out_w, device=position.device) * stride[1] - padding[1]
    h = rows + (position // kernel[1]) * dilation[0]
    w = cols + (position % kernel[1]) * dilation[1]
    return h * width + w


def _first_inside(windows: int, stride: int, pad: int, dilation: int, device):
    """Along one dim: the window offset (in kernel steps) of each window's first element inside the input."""
    from tilewise.ops.creation import arange

    before = (pad - arange(windows, device=device) * stride).clamp(min=0)
    return (before + dilation - 1) // dilation


def _window_maximum_position(flat, kernel, stride, padding, dilation, padded: bool):
    """Position in each flattened window (N, C, OH, OW, K) of the element torch's max pooling picks.

    [Note: max pooling and NaN] torch walks a window in row-major order and takes an element when it is greater
    than the maximum so far *or NaN*, starting from -inf at the window's first element inside the input: the
    first maximum wins a tie, the *last* NaN wins over everything, and a window whose elements are all the
    lowest value reports its first element inside the input (never a padded one). ``argmax`` gives the first
    NaN or the first maximum of each window on its own, ``argmax`` of the reversed window the last NaN; the
    element found tells which rule applies, so every window follows the rule whatever its neighbours hold."""
    position = flat.argmax(-1)
    found = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
    if flat.dtype.is_floating_point:
        last_nan = (flat.shape[-1] - 1) - flat.flip([-1]).argmax(-1)
        position = position.where(found == found, last_nan)
    if padded:
        out_h, out_w = flat.shape[2:4]
        first = (_first_inside(out_h, stride[0], padding[0], dilation[0], flat.device).unsqueeze(1) * kernel[1]
                 + _first_inside(out_w, stride[1], padding[1], dilation[1], flat.device))
        position = position.where(found != _lowest(flat.dtype), first)
    return position


def _max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    op = "max_pool2d"
    kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, dilation)
    x = input.unsqueeze(0) if input.ndim == 3 else input
    windows = _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, _lowest(x.dtype))
    flat = windows.reshape(*windows.shape[:4], kernel[0] * kernel[1])
    padded = max(padding) > 0 or ceil_mode  # windows may then reach past the input
    position = _window_maximum_position(flat, kernel, stride, padding, dilation, padded)
    values = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
    indices = _window_argmax_to_input_index(position, kernel, stride, padding, dilation, x.shape[-1])
    return (values.squeeze(0), indices.squeeze(0)) if input.ndim == 3 else (values, indices)


def max_pool2d_backward(grad, input, indices):
    """torch's max_pool2d_with_indices_backward: each window's gradient added at the input element its returned
    index names (where windows overlap, their gradients add up). It reads the input for its shape only, but
    torch saves the input and the indices, so changing either in place before backward is an error in both."""
    from tilewise.ops.creation import zeros

    plane = (*input.shape[:-2], input.shape[-2] * input.shape[-1])
    flat_indices = indices.reshape(*indices.shape[:-2], -1)
    flat_grad = grad.reshape(*grad.shape[:-2], -1)
    grad_input = zeros(plane, dtype=grad.dtype, device=grad.device).scatter_add(-1, flat_indices, flat_grad)
    return grad_input.reshape(input.shape)


def _max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    values, indices = OPS["max_pool2d_with_indices"](input, kernel_size, stride, padding, dilation, ceil_mode)
    return (values, indices) if return_indices else values


def _average_divisor(size, out, kernel, stride, pad, count_include_pad, device):
    """torch's per-window element count along one dim: windows are clipped to the padded input, and with
    count_include_pad=False also to the input itself."""
    from tilewise.ops.creation import arange

    start = arange(out, device=device) * stride - pad
    end = (start + kernel).clamp(max=size + pad)
    if count_include_pad:
        return end - start
    return end.clamp(max=size) - start.clamp(min=0)


def _window_divisors(pooled, input_hw, kernel, stride, padding, count_include_pad, divisor_override):
    """What each average-pooling window's sum is divided by: the override, or an (OH, OW) tensor of counts in
    the dtype of ``pooled`` (the window sums, or their gradient)."""
    if divisor_override is not None:
        return divisor_override
    rows, cols = (_average_divisor(n, o, k, s, p, count_include_pad, pooled.device)
                  for n, o, k, s, p in zip(input_hw, pooled.shape[-2:], kernel, stride, padding))
    return (rows.unsqueeze(1) * cols).to(pooled.dtype)


def _avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    op = "avg_pool2d"
    kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, 1)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError(f"{op}: divisor must be not zero")
    x = input.unsqueeze(0) if input.ndim == 3 else input
    total = _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, 0).sum((-2, -1))
    out = total / _window_divisors(total, x.shape[-2:], kernel, stride, padding, count_include_pad, divisor_override)
    return out.squeeze(0) if input.ndim == 3 else out


def avg_pool2d_backward(grad, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """torch's avg_pool2d_backward: each window's gradient, divided as its sum was, spread over the input
    elements it covers. Like torch's, it saves the input (read for its shape) and not the output."""
    op = "avg_pool2d"
    kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, 1)
    unbatched = input.ndim == 3
    shape = (1, *input.shape) if unbatched else tuple(input.shape)
    g = grad.unsqueeze(0) if unbatched else grad
    _, pads = _pooling_geometry(op, shape, kernel, stride, padding, dilation, ceil_mode)
    per_element = g / _window_divisors(g, shape[-2:], kernel, stride, padding, count_include_pad, divisor_override)
    windows = per_element.unsqueeze(-1).unsqueeze(-1).expand(*g.shape, *kernel)
    grad_input = _windows_adjoint(windows, shape, pads, stride, dilation)
    return grad_input.squeeze(0) if unbatched else grad_input


def _adaptive_average_matrix(size: int, out: int, like):
    """(out, size) matrix whose row i averages input positions floor(i*size/out) .. ceil((i+1)*size/out) - 1."""
    from tilewise.ops.creation import arange

    i = arange(out, device=like.device).unsqueeze(1)
    j = arange(size, device=like.device)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    return ((j >= start) & (j < end)).to(like.dtype) / (end - start).to(like.dtype)


def _adaptive_avg_pool2d(input, output_size):
    """torch's: a mean over H and W for a 1x1 output (which saves nothing for backward), else the pooling op
    proper, which saves its input."""
    op = "adaptive_avg_pool2d"
    if input.ndim not in (3, 4) or 0 in input.shape[-2:]:
        raise RuntimeError(f"{op}: Expected 3D or 4D input with non-zero spatial sizes, but got {list(input.shape)}")
    output_size = int_tuple(output_size, 2, "output_size", op)
    if output_size == (1, 1):
        return input.mean((-1, -2), keepdim=True)
    return OPS["_adaptive_avg_pool2d"](input, output_size)


def _adaptive_average_matrices(input_hw, output_hw, like):
    return tuple(_adaptive_average_matrix(n, o, like) for n, o in zip(input_hw, output_hw))


def _adaptive_avg_pool2d_by_matrices(self, output_size):
    rows, cols = _adaptive_average_matrices(self.shape[-2:], output_size, self)
    return rows.matmul(self.matmul(cols.t())).contiguous()


def adaptive_avg_pool2d_backward(grad, self):
    """The forward's two averaging matrices, transposed. Like torch's, it saves the input (read for its shape)."""
    rows, cols = _adaptive_average_matrices(self.shape[-2:], grad.shape[-2:], grad)
    return rows.t().matmul(grad.matmul(cols))


HELPERS.update(max_pool2d_backward=max_pool2d_backward, avg_pool2d_backward=avg_pool2d_backward,
               adaptive_avg_pool2d_backward=adaptive_avg_pool2d_backward)

functional("max_pool2d_with_indices(Tensor input, int[2] kernel_size, int[2]? stride=None, int[2] padding=0, "
           "int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)", _max_pool2d_with_indices,
           {"input": "max_pool2d_backward(grad, input, result[1])"}, function=False, nondiff_outputs=(1,))
functional("max_pool2d(Tensor input, int[2] kernel_size, int[2]? stride=None, int[2] padding=0, int[2] dilation=1, "
           "bool ceil_mode=False, bool return_indices=False) -> Tensor", _max_pool2d)
functional("avg_pool2d(Tensor input, int[2] kernel_size, int[2]? stride=None, int[2] padding=0, "
           "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor", _avg_pool2d,
           {"input": "avg_pool2d_backward(grad, input, kernel_size, stride, padding, ceil_mode, count_include_pad, "
                     "divisor_override)"}, function=False)
functional("adaptive_avg_pool2d(Tensor input, int[2] output_size) -> Tensor", _adaptive_avg_pool2d, function=False)
private("_adaptive_avg_pool2d(Tensor self, int[2] output_size) -> Tensor", _adaptive_avg_pool2d_by_matrices,
        {"self": "adaptive_avg_pool2d_backward(grad, self)"})


# ============================================================================ resampling

def _nearest_source_index(size: int, out: int, scale, device):
    """torch's nearest rule: src = min(floor(dst * s), size - 1), s = 1/scale_factor or size/out in float32."""
    from tilewise.ops.creation import arange, full

    dst = arange(out, device=device)
    if out == size:
        return dst
    if out == 2 * size:
        return dst // 2
    if scale is not None and scale > 0:
        step = full((), 1.0 / scale, dtype=float32, device=device)
    else:
        step = full((), float(size), dtype=float32, device=device) / out
    return (dst.to(float32) * step).floor().long().clamp(max=size - 1)


def _interpolate_sizes(op, input, size, scale_factor, recompute_scale_factor):
    spatial = input.ndim - 2
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: exactly one of size or scale_factor should be defined, got size={size} and "
                         f"scale_factor={scale_factor}")
    if size is not None:
        return int_tuple(size, spatial, "size", op), (None,) * spatial
    factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * spatial
    if len(factors) != spatial:
        raise ValueError(f"{op}: scale_factor shape must match input shape: input is {spatial}D spatially, "
                         f"scale_factor has {len(factors)} entries")
    sizes = tuple(math.floor(float(n) * float(f)) for n, f in zip(input.shape[2:], factors))
    return sizes, (None,) * spatial if recompute_scale_factor else tuple(float(f) for f in factors)


def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    op = "interpolate"
    if mode != "nearest":
        raise NotImplementedError(f"{op}: mode={mode!r} is not implemented; tilewise supports mode='nearest'")
    if align_corners is not None:
        raise ValueError(f"{op}: align_corners option can only be set with the interpolating modes: linear | bilinear "
                         "| bicubic | trilinear")
    if antialias:
        raise ValueError(f"{op}: Anti-alias option is restricted to bilinear and bicubic modes")
    if input.ndim not in (3, 4, 5):
        raise ValueError(f"{op}: expected a 3D, 4D or 5D input (N, C, *spatial), got {list(input.shape)}")
    sizes, scales = _interpolate_sizes(op, input, size, scale_factor, recompute_scale_factor)
    if min(sizes, default=1) <= 0 or min(input.shape[2:], default=1) <= 0:
        names = "DHW"[-len(sizes):]
        given = ", ".join(f"{a}: {n}" for a, n in zip(names, input.shape[2:]))
        made = ", ".join(f"{a}: {n}" for a, n in zip(names, sizes))
        asked = f"size={size}" if size is not None else f"scale_factor={scale_factor}"
        raise RuntimeError(f"{op}: Input and output sizes should be greater than 0, but got input ({given}) and "
                           f"output ({made}) from {asked}")
    out = input
    for k, (n, o, s) in enumerate(zip(input.shape[2:], sizes, scales)):
        index = _nearest_source_index(n, o, s, input.device)
        out = OPS["index.Tensor"](out, (None,) * (2 + k) + (index,))
    return out


functional("interpolate(Tensor input, int[]? size=None, float[]? scale_factor=None, str mode='nearest', "
           "bool? align_corners=None, bool? recompute_scale_factor=None, bool antialias=False) -> Tensor",
           _interpolate, function=False, autocast="fp32")


def _pixel_shuffle(input, upscale_factor):
    r = upscale_factor
    if input.ndim < 3 or input.shape[-3] % (r * r):
        raise RuntimeError(f"pixel_shuffle expects an input of shape (*, C * r^2, H, W) with C * r^2 divisible by "
                           f"upscale_factor^2 = {r * r}, got input of shape {list(input.shape)}")
    *lead, channels, height, width = input.shape
    n = len(lead)
    x = input.reshape(*lead, channels // (r * r), r, r, height, width)
    return x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2).reshape(*lead, channels // (r * r), height * r,
                                                                       width * r)


def _pixel_unshuffle(input, downscale_factor):
    r = downscale_factor
    if input.ndim < 3 or input.shape[-2] % r or input.shape[-1] % r:
        raise RuntimeError(f"pixel_unshuffle expects an input of shape (*, C, H, W) with H and W divisible by "
                           f"downscale_factor = {r}, got input of shape {list(input.shape)}")
    *lead, channels, height, width = input.shape
    n = len(lead)
    x = input.reshape(*lead, channels, height // r, r, width // r, r)
    return x.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3).reshape(*lead, channels * r * r, height // r,
                                                                       width // r)


functional("pixel_shuffle(Tensor input, int upscale_factor) -> Tensor", _pixel_shuffle)
functional("pixel_unshuffle(Tensor input, int downscale_factor) -> Tensor", _pixel_unshuffle)
