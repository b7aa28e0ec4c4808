"""torch.nn.functional's pooling: max, average, adaptive, power-average (LP), fractional max and max unpooling, over
one, two or three spatial dims.

[Note: pooling as windows] Pooling takes the window views convolution takes (``nn_spatial._windows``): max
pooling picks in each flattened window the element torch's rule picks (see [Note: max pooling and NaN]) and reads
it back there; average pooling sums and divides by torch's per-window divisor. Adaptive pooling has windows of
varying size: both gather every window at the largest size with its indices clamped to the window's last element.
Average pooling averages one spatial dim at a time, selecting (not zero-weighting) a window's own taps so that a
NaN stays in the windows holding it; for max pooling a repeated element changes neither the maximum nor the index
torch reports. Fractional max pooling is adaptive max pooling with torch's pseudo-random
window starts. Each carries torch's derivative and saves what torch saves: the input, and for max pooling the
indices it returns, whose positions the gradient is added at (so changing either in place before backward is
the error it is in torch), rather than the windows its decomposition makes.
"""

from __future__ import annotations

import math

from tilewise.dtypes import iinfo, int64
from tilewise.layouts import channels_last_3d, contiguous_format, in_format_of, suggest_memory_format
from tilewise.ops.formulas import HELPERS
from tilewise.ops.nn_functional import functional, int_tuple, private
from tilewise.ops.nn_spatial import _constant_pad, _windows, _windows_adjoint
from tilewise.ops.registry import OPS

_DIMS = {1: "2D or 3D", 2: "3D or 4D", 3: "4D or 5D"}


def _check_rank(op, input, spatial: int) -> None:
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"{op}: Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input, but got "
                           f"input of size: {list(input.shape)}")


def _pool_args(op, input, kernel_size, stride, padding, dilation, spatial: int = 2):
    _check_rank(op, input, spatial)
    kernel = int_tuple(kernel_size, spatial, "kernel_size", op)
    stride = kernel if not stride else int_tuple(stride, spatial, "stride", op)
    padding = int_tuple(padding, spatial, "padding", op)
    dilation = int_tuple(dilation, spatial, "dilation", op)
    _check_positive_windows(op, kernel, stride, dilation, padding)
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but got pad={p}, "
                               f"kernel_size={k} and dilation={d}")
    return kernel, stride, padding, dilation


def _check_positive_windows(op, kernel, stride, dilation, padding) -> None:
    """torch's pooling checks in its order (a zero stride first: it defaults to the kernel size)."""
    if 0 in stride:
        raise RuntimeError(f"{op}: stride should not be zero, got stride={list(stride)}")
    if min(kernel) <= 0:
        raise RuntimeError(f"{op}: kernel size should be greater than zero, but got kernel_size={list(kernel)}")
    if min(stride) < 0:
        raise RuntimeError(f"{op}: stride should be greater than zero, but got stride={list(stride)}")
    if min(dilation) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, but got dilation={list(dilation)}")
    if min(padding) < 0:
        raise RuntimeError(f"{op}: pad must be non-negative, but got padding={list(padding)}")


def _pooled_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    span = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _pooling_geometry(op, shape, kernel, stride, padding, dilation, ceil_mode):
    """(output sizes, (before, after) padding per spatial dim) of pooling a (..., C, *S) input: the padding
    after reaches as far as the last window does (past the input with ceil_mode)."""
    spatial = len(kernel)
    sizes = tuple(_pooled_size(n, k, s, p, d, ceil_mode)
                  for n, k, s, p, d in zip(shape[-spatial:], kernel, stride, padding, dilation))
    if min(sizes) < 1:
        # torch pools one spatial dim as two, the first of size 1, and says so
        given = "x".join(map(str, (shape[-spatial - 1], *(1,) * (spatial == 1), *shape[-spatial:])))
        made = "x".join(map(str, (shape[-spatial - 1], *(1,) * (spatial == 1), *sizes)))
        raise RuntimeError(f"Given input size: ({given}). Calculated output size: ({made}). Output size is too small "
                           f"(in {op})")
    pads = [(p, max((o - 1) * s + d * (k - 1) + 1 - n - p, 0))
            for n, o, k, s, p, d in zip(shape[-spatial:], sizes, kernel, stride, padding, dilation)]
    return sizes, pads


def _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, fill):
    """The (N, C, *O, *K) windows of x padded with fill (on the right as far as ceil_mode reaches)."""
    sizes, pads = _pooling_geometry(op, x.shape, kernel, stride, padding, dilation, ceil_mode)
    padded = _constant_pad(x, pads, fill) if any(before or after for before, after in pads) else x
    windows = _windows(padded, kernel, stride, dilation)
    return windows[(slice(None), slice(None), *(slice(0, o) for o in sizes))]


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else iinfo(dtype).min


def _along(values, k: int, spatial: int):
    """A 1-D tensor over output dim k of ``spatial``, shaped to broadcast against (*O)."""
    return values.reshape((-1,) + (1,) * (spatial - 1 - k))


def _window_argmax_to_input_index(position, kernel, stride, padding, dilation, input_sizes):
    """Flat index (row-major over the unpadded input's spatial dims) of each window's maximum, as torch returns."""
    from tilewise.ops.creation import arange

    spatial = len(kernel)
    out_sizes = position.shape[-spatial:]
    index = None
    for k in range(spatial):
        block = math.prod(kernel[k + 1:])
        starts = _along(arange(out_sizes[k], device=position.device) * stride[k] - padding[k], k, spatial)
        coordinate = starts + (position // block % kernel[k]) * dilation[k]
        index = coordinate if index is None else index * input_sizes[k] + coordinate
    return index


def _first_inside(windows: int, stride: int, pad: int, dilation: int, device):
    """Along one dim: the window offset (in kernel steps) of each window's first element inside the input."""
    from tilewise.ops.creation import arange

    before = (pad - arange(windows, device=device) * stride).clamp(min=0)
    return (before + dilation - 1) // dilation


def _window_maximum_position(flat, kernel, stride, padding, dilation, padded: bool):
    """Position in each flattened window (N, C, *O, K) of the element torch's max pooling picks.

    [Note: max pooling and NaN] torch walks a window in row-major order and takes an element when it is greater
    than the maximum so far *or NaN*, starting from -inf at the window's first element inside the input: the
    first maximum wins a tie, the *last* NaN wins over everything, and a window whose elements are all the
    lowest value reports its first element inside the input (never a padded one). ``argmax`` gives the first
    NaN or the first maximum of each window on its own, ``argmax`` of the reversed window the last NaN; the
    element found tells which rule applies, so every window follows the rule whatever its neighbours hold."""
    if flat.numel() == 0:  # an empty batch: no window to search
        return flat.sum(-1).long()
    position = flat.argmax(-1)
    found = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
    if flat.dtype.is_floating_point:
        last_nan = (flat.shape[-1] - 1) - flat.flip([-1]).argmax(-1)
        position = position.where(found == found, last_nan)
    if padded:
        spatial = len(kernel)
        out_sizes = flat.shape[2:2 + spatial]
        first = sum(_along(_first_inside(o, s, p, d, flat.device), k, spatial) * math.prod(kernel[k + 1:])
                    for k, (o, s, p, d) in enumerate(zip(out_sizes, stride, padding, dilation)))
        position = position.where(found != _lowest(flat.dtype), first)
    return position


CHAINED_WINDOW = 27  # windows up to 3x3x3 are walked element by element (see _window_maximum_chained)


def _window_maximum_chained(windows, kernel, stride, padding, dilation, padded: bool):
    """(maximum, position in the flattened window) of each (N, C, *O, *K) window by torch's rule (see [Note: max
    pooling and NaN]), walking the window's elements in row-major order: each element is one strided view of the
    padded input, taken when it is greater than the maximum so far or NaN, starting from the lowest value at the
    first element inside the input. Nothing is materialised per window, so a compiled program (or the fused eager
    kernel) reads the input once, where flattening the windows first copies the input prod(kernel) times."""
    import itertools

    from tilewise.ops.creation import full, zeros

    spatial = len(kernel)
    out = windows[(Ellipsis, *([0] * spatial))]
    best = full(out.shape, _lowest(windows.dtype), dtype=windows.dtype, device=windows.device)
    if padded:
        out_sizes = out.shape[2:]
        position = sum(_along(_first_inside(o, s, p, d, windows.device), k, spatial) * math.prod(kernel[k + 1:])
                       for k, (o, s, p, d) in enumerate(zip(out_sizes, stride, padding, dilation)))
        position = position.expand(out.shape)
    else:
        position = zeros(out.shape, dtype=int64, device=windows.device)
    floating = windows.dtype.is_floating_point
    for k, offset in enumerate(itertools.product(*(range(n) for n in kernel))):
        value = windows[(Ellipsis, *offset)]
        take = value > best
        if floating:
            take = take | (value != value)
        best = value.where(take, best)
        position = position.masked_fill(take, k)
    return best, position


def _max_pool_with_indices(spatial: int):
    op = f"max_pool{spatial}d"

    def max_pool_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, dilation, spatial)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        windows = _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, _lowest(x.dtype))
        padded = max(padding) > 0 or ceil_mode  # windows may then reach past the input
        if math.prod(kernel) <= CHAINED_WINDOW:
            values, position = _window_maximum_chained(windows, kernel, stride, padding, dilation, padded)
        else:
            flat = windows.reshape(*windows.shape[:2 + spatial], math.prod(kernel))
            position = _window_maximum_position(flat, kernel, stride, padding, dilation, padded)
            values = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
        indices = _window_argmax_to_input_index(position, kernel, stride, padding, dilation, x.shape[2:])
        if unbatched:
            values, indices = values.squeeze(0), indices.squeeze(0)
        return _in_format_of(input, values, spatial), _in_format_of(input, indices, spatial)

    return max_pool_with_indices


def _in_format_of(input, pooled, spatial: int, keeps_3d: bool = True):
    """torch's pooling kernels write a channels-last result for a batched channels-last input (but for
    ``channels_last_3d`` where not ``keeps_3d``: its 3-D average and adaptive ones), and a row-major one for any
    other."""
    if input.ndim != spatial + 2:
        return pooled.contiguous()
    memory_format = suggest_memory_format(input)
    if memory_format is channels_last_3d and not keeps_3d:
        return pooled.contiguous()
    return pooled.contiguous(memory_format=memory_format)


def max_pool_backward(grad, input, indices, spatial: int = 2, keeps: bool = True, keeps_3d: bool = True):
    """torch's max_pool*d_with_indices_backward: each window's gradient added at the input element its returned
    index names (where windows overlap, their gradients add up). It reads the input for its shape only, but
    torch saves the input and the indices, so changing either in place before backward is an error in both.

    The gradient is laid out as torch's kernels lay it out: channels-last for a batched channels-last input (of
    max pooling, and of 2-D adaptive max pooling: ``keeps``, ``keeps_3d`` as ``_in_format_of``), where the
    windows' gradients are added along the (N, H*W, C) planes such an input is; row-major otherwise. A row-major
    gradient of a channels-last activation left a compiled backward's batch-norm gradient reading two layouts."""
    from tilewise.ops.creation import zeros

    if keeps and input.ndim == spatial + 2 and spatial in (2, 3) and (keeps_3d or spatial == 2) \
            and suggest_memory_format(input) is not contiguous_format:
        n, c = input.shape[:2]
        plane, windows = math.prod(input.shape[2:]), math.prod(indices.shape[2:])
        flat_indices = indices.reshape(n, c, windows).transpose(1, 2)
        flat_grad = grad.reshape(n, c, windows).transpose(1, 2)
        grad_input = zeros((n, plane, c), dtype=grad.dtype, device=grad.device).scatter_add(1, flat_indices,
                                                                                            flat_grad)
        return grad_input.view(n, *input.shape[2:], c).permute(0, spatial + 1, *range(1, spatial + 1))
    plane = (*input.shape[:-spatial], math.prod(input.shape[-spatial:]))
    # sizes spelled out, not -1: an empty batch has no size to infer
    flat_indices = indices.reshape(*indices.shape[:-spatial], math.prod(indices.shape[-spatial:]))
    flat_grad = grad.reshape(*grad.shape[:-spatial], math.prod(grad.shape[-spatial:]))
    grad_input = zeros(plane, dtype=grad.dtype, device=grad.device).scatter_add(-1, flat_indices, flat_grad)
    return grad_input.reshape(input.shape)


def _check_max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode) -> None:
    """torch's max_pool1d (without indices) checks its arguments itself, in its own words, before it picks a kernel;
    with indices it is max_pool2d's checks that speak."""
    sizes = list(input.shape)
    if not ((input.ndim == 2 and sizes[0] and sizes[1]) or (input.ndim == 3 and sizes[1] and sizes[2])):
        raise RuntimeError("max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for "
                           f"input, but got:{sizes}")
    given = {"kernel_size": kernel_size, "stride": stride, "padding": padding, "dilation": dilation}
    values = {}
    for name, value in given.items():
        value = [] if value is None else list(value) if isinstance(value, (tuple, list)) else [value]
        if len(value) != 1 and not (name == "stride" and not value):
            kinds = "None, an int, list of ints, or tuple of ints" if name == "stride" else \
                "an int, list of ints or tuple of ints"
            raise RuntimeError(f"max_pool1d() {name} must be {kinds} of size 1 but got size {len(value)}")
        values[name] = int(value[0]) if value else None
    k, p, d = values["kernel_size"], values["padding"], values["dilation"]
    s = k if values["stride"] is None else values["stride"]
    for name, value, least in (("kernel_size", k, 1), ("stride", s, 1), ("padding", p, 0)):
        if value < least:
            bound = "be greater than zero" if least else "be non-negative"
            raise RuntimeError(f"max_pool1d() {name} must {bound}, but got {value}")
    if p > k // 2:
        raise RuntimeError(f"max_pool1d() padding should be at most half of kernel size, but got padding={p} and "
                           f"kernel_size={k}")
    if d < 1:
        raise RuntimeError(f"max_pool1d() dilation must be greater than zero, but got {d}")
    length = _pooled_size(sizes[-1], k, s, p, d, ceil_mode)
    if length < 1:
        raise RuntimeError(f"max_pool1d() Invalid computed output size: {length}")


def _max_pool(spatial: int):
    def max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if spatial == 1 and not return_indices:
            _check_max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode)
        values, indices = OPS[f"max_pool{spatial}d_with_indices"](input, kernel_size, stride, padding, dilation,
                                                                  ceil_mode)
        return (values, indices) if return_indices else values

    return max_pool


def _average_divisor(size, out, kernel, stride, pad, count_include_pad, device):
    """torch's per-window element count along one dim: windows are clipped to the padded input, and with
    count_include_pad=False also to the input itself."""
    from tilewise.ops.creation import arange

    start = arange(out, device=device) * stride - pad
    end = (start + kernel).clamp(max=size + pad)
    if count_include_pad:
        return end - start
    return end.clamp(max=size) - start.clamp(min=0)


def _window_divisors(pooled, input_sizes, kernel, stride, padding, count_include_pad, divisor_override):
    """What each average-pooling window's sum is divided by: the override, or a (*O) tensor of counts in the dtype
    of ``pooled`` (the window sums, or their gradient)."""
    if divisor_override is not None:
        return divisor_override
    spatial = len(kernel)
    counts = [_along(_average_divisor(n, o, k, s, p, count_include_pad, pooled.device), d, spatial)
              for d, (n, o, k, s, p) in enumerate(zip(input_sizes, pooled.shape[-spatial:], kernel, stride, padding))]
    return math.prod(counts[1:], start=counts[0]).to(pooled.dtype)


def _check_average_dtype(op, dtype) -> None:
    """torch averages floating windows and, of the integers, int64 only."""
    if not dtype.is_floating_point and dtype.name != "int64":
        raise NotImplementedError(f'"{op}" not implemented for \'{dtype.name}\': average pooling takes floating '
                                  "point or int64 input")


def _check_whole_kernel_fits(op, input, kernel) -> None:
    """torch's 3-D average pooling wants the unpadded input at least as large as the kernel in every dim."""
    sizes = input.shape[-3:]
    if any(n < k for n, k in zip(sizes, kernel)):
        raise RuntimeError(f"{op}: input image (T: {sizes[0]} H: {sizes[1]} W: {sizes[2]}) smaller than kernel size "
                           f"(kT: {kernel[0]} kH: {kernel[1]} kW: {kernel[2]})")


def _avg_pool(spatial: int):
    op = f"avg_pool{spatial}d"

    def avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, 1, spatial)
        if divisor_override is not None and divisor_override == 0:
            raise RuntimeError(f"{op}: divisor must be not zero")
        _check_average_dtype(op, input.dtype)
        if spatial == 3:
            _check_whole_kernel_fits(op, input, kernel)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        windows = _pooling_windows(op, x, kernel, stride, padding, dilation, ceil_mode, 0)
        total = windows.sum(tuple(range(-spatial, 0)))
        divisors = _window_divisors(total, x.shape[2:], kernel, stride, padding, count_include_pad, divisor_override)
        # int64 windows average in integer arithmetic, rounded toward zero as in torch's CPU kernel
        out = total / divisors if x.dtype.is_floating_point else total.div(divisors, rounding_mode="trunc")
        return _in_format_of(input, out.squeeze(0) if unbatched else out, spatial, keeps_3d=spatial != 3)

    return avg_pool


def avg_pool_backward(grad, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                      spatial: int = 2):
    """torch's avg_pool*d_backward: each window's gradient, divided as its sum was, spread over the input elements
    it covers. Like torch's, it saves the input (read for its shape) and not the output."""
    op = f"avg_pool{spatial}d"
    kernel, stride, padding, dilation = _pool_args(op, input, kernel_size, stride, padding, 1, spatial)
    unbatched = input.ndim == spatial + 1
    shape = (1, *input.shape) if unbatched else tuple(input.shape)
    g = grad.unsqueeze(0) if unbatched else grad
    _, pads = _pooling_geometry(op, shape, kernel, stride, padding, dilation, ceil_mode)
    per_element = g / _window_divisors(g, shape[2:], kernel, stride, padding, count_include_pad, divisor_override)
    windows = per_element.reshape(*g.shape, *(1,) * spatial).expand(*g.shape, *kernel)
    grad_input = _windows_adjoint(windows, shape, pads, stride, dilation)
    return grad_input.squeeze(0) if unbatched else _in_format_of(input, grad_input, spatial)


HELPERS.update(max_pool_backward=max_pool_backward, avg_pool_backward=avg_pool_backward)

# torch's CPU autocast list runs 3-d pooling (max, average, adaptive, and lp pooling through average pooling),
# unpooling and fractional max pooling in float32; CUDA's lists none of them
ON_CPU_IN_FLOAT32 = {"cpu": "fp32"}


def _max_pool3d_autocast_on_cpu(op, args) -> str | None:
    """torch lists max_pool3d, not max_pool3d_with_indices, which its max_pool3d(return_indices=True) calls."""
    return None if args[6] else "fp32"


def _in_3d(spatial: int) -> dict | None:
    return ON_CPU_IN_FLOAT32 if spatial == 3 else None


for _n in (1, 2, 3):
    functional(f"max_pool{_n}d_with_indices(Tensor input, int[{_n}] kernel_size, int[{_n}]? stride=None, "
               f"int[{_n}] padding=0, int[{_n}] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
               _max_pool_with_indices(_n), {"input": f"max_pool_backward(grad, input, result[1], {_n})"},
               function=False, nondiff_outputs=(1,),
               fwd=f"max_pool_jvp(input_t, result[1], {_n})")
    functional(f"max_pool{_n}d(Tensor input, int[{_n}] kernel_size, int[{_n}]? stride=None, int[{_n}] padding=0, "
               f"int[{_n}] dilation=1, bool ceil_mode=False, bool return_indices=False) -> Tensor", _max_pool(_n),
               autocast={"cpu": _max_pool3d_autocast_on_cpu} if _n == 3 else None)
functional("avg_pool1d(Tensor input, int[1] kernel_size, int[1]? stride=None, int[1] padding=0, "
           "bool ceil_mode=False, bool count_include_pad=True) -> Tensor", _avg_pool(1),
           {"input": "avg_pool_backward(grad, input, kernel_size, stride, padding, ceil_mode, count_include_pad, "
                     "None, 1)"},
           fwd="auto_linear")
for _n in (2, 3):
    functional(f"avg_pool{_n}d(Tensor input, int[{_n}] kernel_size, int[{_n}]? stride=None, int[{_n}] padding=0, "
               "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
               _avg_pool(_n), {"input": "avg_pool_backward(grad, input, kernel_size, stride, padding, ceil_mode, "
                                        f"count_include_pad, divisor_override, {_n})"}, function=False,
               fwd="auto_linear", autocast=_in_3d(_n), out=True)


# ============================================================================ adaptive pooling

def _adaptive_output_size(op, input, output_size, spatial: int) -> tuple[int, ...]:
    """The output size, torch's None entries (keep that input size) filled in."""
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * spatial
    if len(sizes) == 1:
        sizes = sizes * spatial
    if len(sizes) != spatial:
        raise RuntimeError(f"{op}: output_size must be {spatial}, got {list(sizes)}")
    sizes = tuple(n if o is None else int(o) for n, o in zip(input.shape[-spatial:], sizes))
    if min(sizes) < 0:
        raise RuntimeError(f"{op}: elements of output_size must be greater than or equal to 0 but received "
                           f"{{{', '.join(map(str, sizes))}}}")
    return sizes


def _check_none_sizes(input, output_size) -> None:
    """torch fills a None output size from the input's trailing dims before any other check (_list_with_default)."""
    if isinstance(output_size, (tuple, list)) and None in output_size and input.ndim <= len(output_size):
        raise ValueError(f"Input dimension should be at least {len(output_size) + 1}")


def _check_adaptive_input(op, input, spatial: int) -> None:
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"{op}(): Expected {_DIMS[spatial]} tensor, but got {list(input.shape)}")
    for d in range(1, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"{op}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(input.shape)} with dimension {d} being empty")


def _check_spatial_sizes(op, input, spatial: int) -> None:
    """torch's 2-D adaptive pooling kernels refuse an empty spatial dim (not an empty batch or channel dim)."""
    for d in range(input.ndim - spatial, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"{op}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(input.shape)} with dimension {d} being empty")


def _empty_pooled(input, sizes):
    """An adaptive pooling's result for an output size with a zero in it: empty, (*batch, channels, *sizes), with
    contiguous strides, still a function of the input for autograd (its gradient is zeros)."""
    from tilewise.ops.creation import zeros

    spatial = len(sizes)
    shape = (*input.shape[:-spatial], *sizes)
    out = input.sum(tuple(range(-spatial, 0)), keepdim=True)
    for k, size in enumerate(sizes):
        if size == 0:
            out = out.narrow(input.ndim - spatial + k, 0, 0)
    return zeros(shape, dtype=input.dtype, device=input.device) + out.expand(shape)


def _adaptive_windows(size: int, out: int, like):
    """Each adaptive window along one dim (torch's floor(i*size/out) .. ceil((i+1)*size/out) - 1): its (out, L)
    input positions (clamped to the window's last), which of them are its own, and its (out,) length."""
    from tilewise.ops.creation import arange

    i = arange(out, device=like.device).unsqueeze(1)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    longest = max(((k + 1) * size + out - 1) // out - (k * size) // out for k in range(out))
    taps = start + arange(longest, device=like.device)
    return taps.minimum(end - 1), taps < end, (end - start).squeeze(1).to(like.dtype)


def _average_along(x, d: int, out: int):
    """x averaged over each adaptive window of dim d. Taps past a window are dropped with a select, not weighted
    by zero, so a NaN or inf stays in the windows that hold it (0 * NaN would spread it to every output)."""
    index, own, length = _adaptive_windows(x.shape[d], out, x)
    trailing = (1,) * (x.ndim - d - 1)
    picked = x.index_select(d, index.reshape(-1)).reshape(*x.shape[:d], *index.shape, *x.shape[d + 1:])
    total = picked.where(own.reshape(*index.shape, *trailing), 0).sum(d + 1)
    return total / length.reshape(out, *trailing)


def _spread_along(grad, d: int, size: int):
    """The adjoint of ``_average_along``: each window's gradient, divided by its length, added to its taps."""
    from tilewise.ops.creation import zeros

    out = grad.shape[d]
    index, own, length = _adaptive_windows(size, out, grad)
    trailing = (1,) * (grad.ndim - d - 1)
    share = (grad / length.reshape(out, *trailing)).unsqueeze(d + 1)
    share = share.expand(*grad.shape[:d + 1], index.shape[1], *grad.shape[d + 1:])
    share = share.where(own.reshape(*index.shape, *trailing), 0)
    flat = share.reshape(*grad.shape[:d], index.numel(), *grad.shape[d + 1:])
    shape = (*grad.shape[:d], size, *grad.shape[d + 1:])
    return zeros(shape, dtype=grad.dtype, device=grad.device).index_add(d, index.reshape(-1), flat)


def _adaptive_avg_pool_separably(self, output_size):
    spatial = len(output_size)
    out = self
    for k, o in enumerate(output_size):
        out = _average_along(out, self.ndim - spatial + k, o)
    return out.contiguous()


def adaptive_avg_pool_backward(grad, self, spatial: int = 2):
    """The forward's window averages, adjoint. Like torch's, it saves the input (read for its shape)."""
    for k, size in enumerate(self.shape[-spatial:]):
        grad = _spread_along(grad, grad.ndim - spatial + k, size)
    return grad.contiguous()


def _global_mean(input, spatial: int):
    """The mean over the spatial dims; torch gives a batched channels-last input's (N, C, 1, 1) mean channels-last
    strides (C, 1, C, C), which the mean of the (N, H, W, C) view has when permuted back (and likewise in 3-D)."""
    rank = input.ndim
    if rank != spatial + 2 or suggest_memory_format(input) is contiguous_format:
        return input.mean(tuple(range(-spatial, 0)), keepdim=True)
    out = input.permute(0, *range(2, rank), 1).mean(tuple(range(1, rank - 1)), keepdim=True)
    out = out.permute(0, rank - 1, *range(1, rank - 1))
    out._base = None  # the mean is private: like torch's result, this is no view of anything
    return out


def _adaptive_avg_pool(spatial: int):
    op = f"adaptive_avg_pool{spatial}d"

    def adaptive_avg_pool(input, output_size):
        """torch's: a mean over the spatial dims for an output of ones (which saves nothing for backward), else the
        pooling op proper, which saves its input; 1-D pooling is 2-D pooling over a height of one."""
        _check_none_sizes(input, output_size)
        if spatial == 2 and input.ndim not in (3, 4):
            raise RuntimeError(f"{op}(): Expected 3D or 4D tensor, but got {list(input.shape)}")
        if spatial != 2:
            _check_adaptive_input(op, input, spatial)
        sizes = _adaptive_output_size(op, input, output_size, spatial)
        if spatial == 1:
            return OPS["adaptive_avg_pool2d"](input.unsqueeze(-2), (1, sizes[0])).squeeze(-2)
        if sizes == (1,) * spatial:  # the mean of an empty window is NaN, as torch's
            return _global_mean(input, spatial)
        _check_spatial_sizes(op, input, spatial)
        if 0 in sizes:
            return _empty_pooled(input, sizes)
        return _in_format_of(input, OPS[f"_adaptive_avg_pool{spatial}d"](input, sizes), spatial,
                             keeps_3d=False)

    return adaptive_avg_pool


HELPERS.update(adaptive_avg_pool_backward=adaptive_avg_pool_backward)
for _n in (1, 2, 3):
    functional(f"adaptive_avg_pool{_n}d(Tensor input, Scalar[{_n}] output_size) -> Tensor", _adaptive_avg_pool(_n),
               function=_n == 1, autocast=_in_3d(_n))
for _n in (2, 3):
    private(f"_adaptive_avg_pool{_n}d(Tensor self, int[{_n}] output_size) -> Tensor", _adaptive_avg_pool_separably,
            {"self": f"adaptive_avg_pool_backward(grad, self, {_n})"},
            fwd="auto_linear")


def _adaptive_window_indices(size: int, out: int, device):
    """(out, L) input positions of each adaptive window, L the largest window, each row clamped to its last one."""
    from tilewise.ops.creation import arange

    starts = [(i * size) // out for i in range(out)]
    ends = [((i + 1) * size + out - 1) // out for i in range(out)]
    longest = max(e - s for s, e in zip(starts, ends))
    i = arange(out, device=device).unsqueeze(1)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    return (start + arange(longest, device=device)).minimum(end - 1)


def _gather_windows(x, positions):
    """(N, C, *S) -> (N, C, *O, *L): x read at each dim's (O, L) window positions."""
    for k, index in enumerate(positions):
        d = 2 + k
        out, longest = index.shape
        gathered = x.index_select(d, index.reshape(-1))
        x = gathered.reshape(*gathered.shape[:d], out, longest, *gathered.shape[d + 1:]).movedim(d + 1, -1)
    return x


def _coordinate_picked(rows, step, k: int, spatial: int):
    """rows[o_k, step] at every output position: the input coordinate along dim k of each window's choice."""
    from tilewise.ops.creation import arange

    out, longest = rows.shape
    flat = _along(arange(out, device=rows.device) * longest, k, spatial) + step
    return rows.reshape(-1).index_select(0, flat.reshape(-1)).reshape(flat.shape)


def _windows_maximum(x, positions):
    """Values and flat input indices of each window's maximum (torch's rule), the windows given by each dim's
    (O, L) input positions."""
    spatial = len(positions)
    windows = _gather_windows(x, positions)
    flat = windows.reshape(*windows.shape[:2 + spatial], math.prod(windows.shape[2 + spatial:]))
    position = _window_maximum_position(flat, (), (), (), (), padded=False)
    values = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
    longest = [rows.shape[1] for rows in positions]
    index = None
    for k, rows in enumerate(positions):
        step = position // math.prod(longest[k + 1:]) % longest[k]
        coordinate = _coordinate_picked(rows, step, k, spatial)
        index = coordinate if index is None else index * x.shape[2 + k] + coordinate
    return values, index


def _adaptive_max_pool_with_indices(spatial: int):
    op = f"adaptive_max_pool{spatial}d"

    def adaptive_max_pool_with_indices(input, output_size):
        _check_none_sizes(input, output_size)
        _check_adaptive_input(op, input, spatial)
        if not input.dtype.is_floating_point:
            raise NotImplementedError(f'"{op}" not implemented for {input.dtype}: it takes floating-point input')
        sizes = _adaptive_output_size(op, input, output_size, spatial)
        if 0 in sizes:
            return _empty_pooled(input, sizes), _empty_pooled(input, sizes).to(int64)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        positions = [_adaptive_window_indices(n, o, x.device) for n, o in zip(x.shape[2:], sizes)]
        values, indices = _windows_maximum(x, positions)
        if unbatched:
            values, indices = values.squeeze(0), indices.squeeze(0)
        return (_in_format_of(input, values, spatial, keeps_3d=spatial != 3),
                _in_format_of(input, indices, spatial, keeps_3d=spatial != 3))

    return adaptive_max_pool_with_indices


def _adaptive_max_pool(spatial: int):
    def adaptive_max_pool(input, output_size, return_indices=False):
        values, indices = OPS[f"adaptive_max_pool{spatial}d_with_indices"](input, output_size)
        return (values, indices) if return_indices else values

    return adaptive_max_pool


for _n in (1, 2, 3):
    functional(f"adaptive_max_pool{_n}d_with_indices(Tensor input, Scalar[{_n}] output_size) -> (Tensor, Tensor)",
               _adaptive_max_pool_with_indices(_n),
               {"input": f"max_pool_backward(grad, input, result[1], {_n}, True, False)"},
               function=False, nondiff_outputs=(1,),
               fwd=f"max_pool_jvp(input_t, result[1], {_n})", autocast=_in_3d(_n))
    functional(f"adaptive_max_pool{_n}d(Tensor input, Scalar[{_n}] output_size, bool return_indices=False) -> Tensor",
               _adaptive_max_pool(_n), function=_n == 1, autocast=_in_3d(_n))


# ============================================================================ power-average pooling

def _lp_pool(spatial: int):
    op = f"lp_pool{spatial}d"

    def lp_pool(input, norm_type, kernel_size, stride=None, ceil_mode=False):
        """torch's: the average of x^p times the window size, to the 1/p (a negative average, which only an odd p
        gives, becomes 0); p = +-inf is the max (min) of |x|."""
        kernel = int_tuple(kernel_size, spatial, "kernel_size", op)
        if norm_type == float("inf"):
            return OPS[f"max_pool{spatial}d"](input.abs(), kernel_size, stride, 0, 1, ceil_mode)
        if norm_type == float("-inf"):
            return -OPS[f"max_pool{spatial}d"](-input.abs(), kernel_size, stride, 0, 1, ceil_mode)
        out = OPS[f"avg_pool{spatial}d"](input.pow(norm_type), kernel_size, stride, 0, ceil_mode)
        return (out.sign() * out.abs().relu()).mul(math.prod(kernel)).pow(1.0 / norm_type)

    return lp_pool


for _n in (1, 2, 3):
    functional(f"lp_pool{_n}d(Tensor input, float norm_type, int[{_n}] kernel_size, int[{_n}]? stride=None, "
               "bool ceil_mode=False) -> Tensor", _lp_pool(_n), function=False,
               autocast=_in_3d(_n))


# ============================================================================ max unpooling

def _unpool_output_size(input, kernel, stride, padding, output_size) -> tuple[int, ...]:
    spatial = len(kernel)
    default = [(input.shape[-spatial + d] - 1) * stride[d] + kernel[d] - 2 * padding[d] for d in range(spatial)]
    if output_size is None:
        sizes = default
    else:
        sizes = list(output_size)
        if len(sizes) == spatial + 2:
            sizes = sizes[2:]
        if len(sizes) != spatial:
            raise ValueError(f"output_size should be a sequence containing {spatial} or {spatial + 2} elements, but "
                             f"it has a length of '{len(sizes)}'")
        for d in range(spatial):
            low, high = default[d] - stride[d], default[d] + stride[d]
            if not low < sizes[d] < high:
                raise ValueError(f'invalid output_size "{tuple(output_size)}" (dim {d} must be between {low} and '
                                 f"{high})")
    for d, n in enumerate(sizes):
        if n < 0:
            raise ValueError(f"max_unpooling: output_size must contain non-negative spatial dimensions, but got "
                             f"output_size[{d}]={n}")
    return tuple(int(n) for n in sizes)


def _check_unpool_indices(op, indices, sizes) -> None:
    from tilewise.ops.nn_functional import concrete_cpu

    if indices.dtype.name != "int64":
        raise RuntimeError(f"{op}: elements in indices should be type int64 but got: {indices.dtype}")
    if indices.numel() and concrete_cpu(indices):
        plane = math.prod(sizes)
        bad = indices.detach().numpy()
        wrong = bad[(bad < 0) | (bad >= plane)]
        if wrong.size:
            raise RuntimeError(f"{op}: Found an invalid max index: {int(wrong.flat[0])} (output volumes are of size "
                               f"{'x'.join(map(str, sizes))})")


def _max_unpool(spatial: int):
    op = f"max_unpool{spatial}d"

    def max_unpool(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        """Each input element written at the position its index names in a zero plane of the output's size."""
        from tilewise.ops.creation import zeros

        kernel = int_tuple(kernel_size, spatial, "kernel_size", op)
        stride = kernel if stride is None else int_tuple(stride, spatial, "stride", op)
        padding = int_tuple(padding, spatial, "padding", op)
        if input.ndim not in (spatial + 1, spatial + 2):
            raise RuntimeError(f"{op}: Input to max_unpooling should be a {spatial + 1}d or {spatial + 2}d Tensor, "
                               f"but got a tensor with {input.ndim} dimensions.")
        if tuple(indices.shape) != tuple(input.shape):
            raise RuntimeError(f"{op}: Expected shape of indices to be same as that of the input tensor "
                               f"({list(input.shape)}) but got indices tensor with shape: {list(indices.shape)}")
        sizes = _unpool_output_size(input, kernel, stride, padding, output_size)
        _check_unpool_indices(op, indices, sizes)
        lead = tuple(input.shape[:-spatial])
        flat_input = input.reshape(*lead, -1)
        plane = zeros((*lead, math.prod(sizes)), dtype=input.dtype, device=input.device)
        out = plane.scatter(-1, indices.reshape(*lead, -1), flat_input).reshape(*lead, *sizes)
        return in_format_of(out, input) if spatial == 2 else out  # torch's 2-D unpooling keeps channels-last

    return max_unpool


for _n in (1, 2, 3):
    functional(f"max_unpool{_n}d(Tensor input, Tensor indices, int[{_n}] kernel_size, int[{_n}]? stride=None, "
               f"int[{_n}] padding=0, int[]? output_size=None) -> Tensor", _max_unpool(_n), function=False,
               autocast=ON_CPU_IN_FLOAT32)


# ============================================================================ fractional max pooling

def _fractional_starts(samples, size: int, out: int, pool: int):
    """torch's pseudo-random window starts along one dim, one row per plane: (N, C) samples in [0, 1) ->
    (N, C, out) starts, computed in the samples' dtype as torch computes them; the last window ends at the edge."""
    from tilewise.ops.creation import arange, full

    if out == 1:
        return full((*samples.shape, 1), size - pool, dtype=samples.dtype, device=samples.device).long()
    alpha = full((), float(size - pool), dtype=samples.dtype, device=samples.device) / (out - 1)
    steps = arange(out - 1, device=samples.device).to(samples.dtype)
    s = samples.unsqueeze(-1)
    starts = ((steps + s) * alpha).long() - (s * alpha).long()
    last = full((*samples.shape, 1), size - pool, dtype=starts.dtype, device=samples.device)
    return OPS["cat"]([starts, last], -1)


def _fractional_window_index(starts, kernel, input_sizes):
    """(N, C, *O, *K) flat input-plane index of every element of every window."""
    from tilewise.ops.creation import arange

    spatial = len(kernel)
    index = None
    for k, (rows, size) in enumerate(zip(starts, kernel)):
        # rows: (N, C, O_k) -> broadcast over (N, C, *O, *K) at output dim k and kernel dim k
        shape = [*rows.shape[:2]] + [1] * (2 * spatial)
        shape[2 + k] = rows.shape[2]
        offsets = arange(size, device=rows.device).reshape([size] + [1] * (spatial - 1 - k))
        coordinate = rows.reshape(shape) + offsets
        index = coordinate if index is None else index * input_sizes[k] + coordinate
    return index


def _fractional_max_pool_with_indices(spatial: int):
    op = f"fractional_max_pool{spatial}d"

    def fractional_max_pool_with_indices(input, kernel_size, output_size=None, output_ratio=None,
                                         _random_samples=None):
        from tilewise.ops.creation import rand

        kernel = int_tuple(kernel_size, spatial, "kernel_size", op)
        if output_size is None and output_ratio is None:
            raise ValueError(f"{op} requires specifying either an output_size or an output_ratio")
        if output_size is None:
            ratios = tuple(output_ratio) if isinstance(output_ratio, (tuple, list)) else (output_ratio,) * spatial
            if len(ratios) == 1:
                ratios = ratios * spatial
            output_size = [int(n * r) for n, r in zip(input.shape[-spatial:], ratios)]
        sizes = int_tuple(output_size, spatial, "output_size", op)
        _check_rank(op, input, spatial)
        unbatched = input.ndim == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        names = ("time", "height", "width")[-spatial:]
        for name, n, o, k in zip(names, x.shape[2:], sizes, kernel):
            if o + k - 1 > n:
                raise RuntimeError(f"{op}(): pool {name} {k} too large relative to input {name} {n} and output "
                                   f"{name} {o}")
        batch, channels = x.shape[:2]
        samples = _random_samples
        if samples is None:
            samples = rand(batch, channels, spatial, dtype=x.dtype, device=x.device)
        if samples.ndim != 3 or samples.shape[0] != batch or samples.shape[2] != spatial:
            raise RuntimeError(f"{op}: Expected _random_samples of shape ({batch}, {channels}, {spatial}), got "
                               f"{list(samples.shape)}")
        if samples.shape[1] != channels:
            raise RuntimeError("Expect _random_samples.size(1) equals to input channel size.")
        # torch's samples run from the last spatial dim to the first (width, height[, time])
        order = range(spatial - 1, -1, -1) if spatial == 2 else range(spatial)
        starts = [_fractional_starts(samples[:, :, j], n, o, k)
                  for j, n, o, k in zip(order, x.shape[2:], sizes, kernel)]
        index = _fractional_window_index(starts, kernel, x.shape[2:])
        index = index.expand(batch, channels, *sizes, *kernel)
        plane = x.reshape(batch, channels, -1)
        windows = plane.gather(-1, index.reshape(batch, channels, -1)).reshape(index.shape)
        flat = windows.reshape(batch, channels, *sizes, -1)
        position = _window_maximum_position(flat, (), (), (), (), padded=False)
        values = flat.gather(-1, position.unsqueeze(-1)).squeeze(-1)
        indices = index.reshape(flat.shape).gather(-1, position.unsqueeze(-1)).squeeze(-1)
        return (values.squeeze(0), indices.squeeze(0)) if unbatched else (values, indices)

    return fractional_max_pool_with_indices


def _fractional_max_pool(spatial: int):
    def fractional_max_pool(input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                            _random_samples=None):
        values, indices = OPS[f"fractional_max_pool{spatial}d_with_indices"](input, kernel_size, output_size,
                                                                             output_ratio, _random_samples)
        return (values, indices) if return_indices else values

    return fractional_max_pool


for _n in (2, 3):
    functional(f"fractional_max_pool{_n}d_with_indices(Tensor input, int[{_n}] kernel_size, int[{_n}]? "
               f"output_size=None, float[{_n}]? output_ratio=None, Tensor? _random_samples=None) -> (Tensor, Tensor)",
               _fractional_max_pool_with_indices(_n),
               {"input": f"max_pool_backward(grad, input, result[1], {_n}, False)", "_random_samples": None},
               function=False,
               nondiff_outputs=(1,),
               fwd=f"max_pool_jvp(input_t, result[1], {_n})", autocast=ON_CPU_IN_FLOAT32)
    functional(f"fractional_max_pool{_n}d(Tensor input, int[{_n}] kernel_size, int[{_n}]? output_size=None, "
               f"float[{_n}]? output_ratio=None, bool return_indices=False, Tensor? _random_samples=None) -> Tensor",
               _fractional_max_pool(_n), function=False, autocast=ON_CPU_IN_FLOAT32)
