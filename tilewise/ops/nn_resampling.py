"""torch.nn.functional's resampling: interpolation, pixel and channel shuffles, fold and unfold, and sampling grids.

[Note: separable resampling] Every interpolation mode is separable, so ``interpolate`` resamples one spatial
dim at a time: nearest modes gather with torch's float32 source-index rules; linear modes (linear, bilinear,
trilinear) read the two neighbours of torch's source coordinate (``area_pixel_compute_source_index``) and blend
them; bicubic reads four with torch's cubic-convolution weights (A = -0.75), clamped to the edge; area is adaptive
average pooling. Antialiased modes (bilinear, bicubic with A = -0.5, lanczos) read every input within the filter's
support widened by the downscaling factor, with torch's weights normalised per output. ``grid_sample`` is not
separable (each output point has its own coordinates): it gathers the 2^d corners (or 4 x 4 taps for bicubic)
from the flattened input and weights them, taps outside the input reading zero, after torch's border or reflection
padding of the coordinates. ``fold``/``unfold`` are convolution's col2im/im2col over the shared window views. All
are composites: gradients, CUDA and the compiler come from their primitives (gathers become scatter-adds in
backward).
"""

from __future__ import annotations

import math
import warnings

from tilewise._warnings import warn_at_caller
from tilewise.dtypes import float32
from tilewise.layouts import in_format_of, suggest_memory_format
from tilewise.ops.nn_functional import functional, int_tuple
from tilewise.ops.nn_spatial import _constant_pad, _window_count, _windows, _windows_adjoint
from tilewise.ops.registry import OPS

# ============================================================================ resampling

def _nearest_source_index(size: int, out: int, scale, device, by_sizes: bool):
    """torch's nearest rule: src = min(floor(dst * s), size - 1), s = 1/scale_factor or size/out in float32.
    With ``by_sizes`` (torch's 2-D kernel), an output once or twice the input's size copies or halves the index
    whatever the scale factor; torch's 1-D and 3-D kernels follow the factor there too."""
    from tilewise.ops.creation import arange, full

    dst = arange(out, device=device)
    by_sizes = by_sizes or scale is None or not scale > 0 or out == size * scale
    if by_sizes and out == size:
        return dst
    if by_sizes and out == 2 * size:
        return dst // 2
    if scale is not None and scale > 0:
        step = full((), 1.0 / scale, dtype=float32, device=device)
    else:
        step = full((), float(size), dtype=float32, device=device) / out
    return (dst.to(float32) * step).floor().long().clamp(max=size - 1)


def _interpolate_sizes(op, input, size, scale_factor, recompute_scale_factor):
    """The output sizes and the scale factors the kernels see (None where recomputed from the sizes), checked in
    torch's order with torch's errors."""
    spatial = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError(f"{op}: only one of size or scale_factor should be defined, got size={size} and "
                         f"scale_factor={scale_factor}")
    if size is None and scale_factor is None:
        raise ValueError(f"{op}: either size or scale_factor should be defined")
    # the schema hands a single int size over as a 1-tuple: one entry stands for every spatial dim
    if size is not None and isinstance(size, (tuple, list)) and len(size) not in (1, spatial):
        raise ValueError(f"{op}: Input and output must have the same number of spatial dimensions, but got input "
                         f"with spatial dimensions of {list(input.shape[2:])} and output size of {size}. Please "
                         "provide input tensor in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) "
                         "format.")
    factors = None
    if scale_factor is not None:
        factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * spatial
        if len(factors) != spatial:
            raise ValueError(f"{op}: Input and scale_factor must have the same number of spatial dimensions, but got "
                             f"input with spatial dimensions of {list(input.shape[2:])} and scale_factor of shape "
                             f"{scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
                             "scale_factor in (s1, s2, ...,sK) format.")
    if recompute_scale_factor and size is not None:
        raise ValueError(f"{op}: recompute_scale_factor is not meaningful with an explicit size.")
    if size is not None:
        return int_tuple(size, spatial, "size", op), (None,) * spatial
    sizes = tuple(math.floor(float(n) * float(f)) for n, f in zip(input.shape[2:], factors))
    return sizes, (None,) * spatial if recompute_scale_factor else tuple(float(f) for f in factors)


_INTERPOLATE_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "lanczos", "area", "nearest-exact")
_MODE_RANK = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5, "lanczos": 4}
_CUBIC = -0.75  # torch's cubic convolution coefficient A


def _check_interpolate_mode(op, input, mode, align_corners, antialias) -> None:
    if mode in ("nearest", "area", "nearest-exact") and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                         "bicubic | trilinear")
    if antialias and (mode not in ("bilinear", "bicubic", "lanczos") or input.ndim != 4):
        raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires a "
                         "4-D tensor as input")
    if input.ndim not in (3, 4, 5) or mode not in _INTERPOLATE_MODES:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
                                  "the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
                                  f"nearest-exact (got {mode})")
    if mode == "lanczos" and input.ndim == 4:
        if align_corners:
            raise ValueError("Lanczos mode does not support align_corners=True")
        if not antialias:
            raise ValueError("Lanczos mode requires antialias=True")
    if mode in _MODE_RANK and input.ndim != _MODE_RANK[mode]:
        if mode == "lanczos":  # torch names no rank for it
            raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) "
                                      "for the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | "
                                      f"area | nearest-exact (got {mode})")
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_MODE_RANK[mode]}D input")


def _nearest_exact_source_index(size: int, out: int, scale, device):
    """torch's nearest-exact rule: src = min(floor((dst + 0.5) * s), size - 1), s in float32."""
    from tilewise.ops.creation import arange, full

    if scale is not None and scale > 0:
        step = full((), 1.0 / scale, dtype=float32, device=device)
    else:
        step = full((), float(size), dtype=float32, device=device) / out
    return ((arange(out, device=device).to(float32) + 0.5) * step).floor().long().clamp(max=size - 1)


def _source_coordinates(size: int, out: int, scale, align_corners: bool, cubic: bool, like):
    """torch's area_pixel_compute_source_index for every output position, in the input's compute dtype."""
    from tilewise.ops.creation import arange, full

    dst = arange(out, device=like.device).to(like.dtype)
    if align_corners:
        step = full((), float(size - 1), dtype=like.dtype, device=like.device) / (out - 1) if out > 1 else 0.0
        return dst * step
    if scale is not None and scale > 0:
        step = full((), 1.0 / scale, dtype=like.dtype, device=like.device)
    else:
        step = full((), float(size), dtype=like.dtype, device=like.device) / out
    source = (dst + 0.5) * step - 0.5
    return source if cubic else source.clamp(min=0)


def _select(x, d: int, index):
    """x read at ``index`` (a (out,) or (out, taps) tensor) along dim d."""
    picked = x.index_select(d, index.reshape(-1))
    return picked.reshape(*x.shape[:d], *index.shape, *x.shape[d + 1:])


def _linear_along(x, d: int, out: int, scale, align_corners: bool):
    size = x.shape[d]
    source = _source_coordinates(size, out, scale, align_corners, False, x)
    low = source.floor().long().clamp(max=size - 1)
    weight = (source - low.to(x.dtype)).clamp(0, 1)
    high = low + (low < size - 1).long()
    shape = (-1,) + (1,) * (x.ndim - d - 1)
    weight = weight.reshape(shape)
    return _select(x, d, low) * (1 - weight) + _select(x, d, high) * weight


def _cubic_weights(t):
    """The four cubic-convolution weights of taps -1, 0, 1, 2 at fractional offset t."""
    a = _CUBIC

    def near(v):  # |v| <= 1
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):  # 1 < |v| < 2
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    return OPS["stack"]([far(t + 1), near(t), near(1 - t), far(2 - t)], -1)


def _cubic_along(x, d: int, out: int, scale, align_corners: bool):
    from tilewise.ops.creation import arange

    size = x.shape[d]
    source = _source_coordinates(size, out, scale, align_corners, True, x)
    floor = source.floor()
    weights = _cubic_weights(source - floor)
    taps = (floor.long().unsqueeze(-1) + arange(-1, 3, device=x.device)).clamp(0, size - 1)
    picked = _select(x, d, taps)  # (..., out, 4, ...)
    shape = (out, 4) + (1,) * (x.ndim - d - 1)
    return (picked * weights.reshape(shape)).sum(d + 1)


_ANTIALIAS_CUBIC = -0.5  # torch's (and PIL's) cubic coefficient when antialiasing


def _antialias_filter(x, mode: str):
    """torch's aa_filter: the triangle (bilinear), Keys cubic with A = -0.5 (bicubic) or Lanczos-3 (lanczos), zero
    outside its support."""
    x = x.abs()
    if mode == "bilinear":
        return (1 - x).clamp(min=0)
    if mode == "lanczos":  # Lanczos-3: sinc(x) sinc(x / 3) inside |x| < 3
        return (OPS["sinc"](x) * OPS["sinc"](x / 3)).where(x < 3, x * 0)
    a = _ANTIALIAS_CUBIC
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return near.where(x < 1, far.where(x < 2, x * 0))


def _antialias_along(x, d: int, out: int, scale, align_corners: bool, mode: str):
    """torch's antialiased resampling of dim d (_compute_weights_aa): each output reads every input within the
    filter's support, widened by the downscaling factor, with weights normalised to sum to one."""
    from tilewise.ops.creation import arange

    size = x.shape[d]
    if align_corners:
        step = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else size / out
    half_width = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}[mode]
    support = half_width * step if step >= 1.0 else half_width
    inverse = 1.0 / step if step >= 1.0 else 1.0
    taps = math.ceil(support) * 2 + 1
    center = (arange(out, device=x.device).to(x.dtype) + 0.5) * step
    first = (center - support + 0.5).floor().clamp(min=0)
    count = ((center + support + 0.5).floor().clamp(max=size) - first).clamp(0, taps)
    offsets = arange(taps, device=x.device).to(x.dtype)
    weights = _antialias_filter((offsets + first.unsqueeze(-1) - center.unsqueeze(-1) + 0.5) * inverse, mode)
    weights = weights * (offsets < count.unsqueeze(-1)).to(x.dtype)
    total = weights.sum(-1, keepdim=True)
    weights = weights / total.where(total != 0, total + 1)
    index = (first.long().unsqueeze(-1) + arange(taps, device=x.device)).clamp(max=size - 1)
    shape = (out, taps) + (1,) * (x.ndim - d - 1)
    return (_select(x, d, index) * weights.reshape(shape)).sum(d + 1)


def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    op = "interpolate"
    if mode in ("nearest", "area", "nearest-exact") and align_corners is not None:
        _check_interpolate_mode(op, input, mode, align_corners, antialias)
    sizes, scales = _interpolate_sizes(op, input, size, scale_factor, recompute_scale_factor)
    _check_interpolate_mode(op, input, mode, align_corners, antialias)
    if min(sizes, default=1) <= 0 or min(input.shape[2:], default=1) <= 0:
        names = "DHW"[-len(sizes):]
        given = ", ".join(f"{a}: {n}" for a, n in zip(names, input.shape[2:]))
        made = ", ".join(f"{a}: {n}" for a, n in zip(names, sizes))
        asked = f"size={size}" if size is not None else f"scale_factor={scale_factor}"
        raise RuntimeError(f"{op}: Input and output sizes should be greater than 0, but got input ({given}) and "
                           f"output ({made}) from {asked}")
    if mode == "area":
        return OPS[f"adaptive_avg_pool{input.ndim - 2}d"](input, sizes)
    out = input
    for k, (n, o, s) in enumerate(zip(input.shape[2:], sizes, scales)):
        d = 2 + k
        if antialias:
            if n != o:  # torch leaves a dim of unchanged size as it is, whatever the scale factor
                out = _antialias_along(out, d, o, s, bool(align_corners), mode)
        elif mode == "nearest":
            out = _select(out, d, _nearest_source_index(n, o, s, input.device, input.ndim == 4))
        elif mode == "nearest-exact":
            out = _select(out, d, _nearest_exact_source_index(n, o, s, input.device))
        elif mode == "bicubic":
            out = _cubic_along(out, d, o, s, bool(align_corners))
        else:
            out = _linear_along(out, d, o, s, bool(align_corners))
    # its own storage (``x = interpolate(...); x += skip`` works), channels-last for such an input, as torch's
    layout = suggest_memory_format(input)
    return out.contiguous(memory_format=layout) if out._base is None else out.clone(memory_format=layout)


functional("interpolate(Tensor input, int[]? size=None, float[]? scale_factor=None, str mode='nearest', "
           "bool? align_corners=None, bool? recompute_scale_factor=None, bool antialias=False) -> Tensor",
           _interpolate, function=False, autocast={"cuda": "fp32"})


def _pixel_shuffle(input, upscale_factor):
    r = upscale_factor
    if r <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    if input.ndim < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    if input.shape[-3] % (r * r):
        raise RuntimeError(f"pixel_shuffle expects an input of shape (*, C * r^2, H, W) with C * r^2 divisible by "
                           f"upscale_factor^2 = {r * r}, got input of shape {list(input.shape)}")
    *lead, channels, height, width = input.shape
    n = len(lead)
    x = input.reshape(*lead, channels // (r * r), r, r, height, width)
    shuffled = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return in_format_of(shuffled.reshape(*lead, channels // (r * r), height * r, width * r), input)


def _pixel_unshuffle(input, downscale_factor):
    r = downscale_factor
    if r <= 0:
        raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    if input.ndim < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    if input.shape[-2] % r or input.shape[-1] % r:
        raise RuntimeError(f"pixel_unshuffle expects an input of shape (*, C, H, W) with H and W divisible by "
                           f"downscale_factor = {r}, got input of shape {list(input.shape)}")
    *lead, channels, height, width = input.shape
    n = len(lead)
    x = input.reshape(*lead, channels, height // r, r, width // r, r)
    shuffled = x.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return in_format_of(shuffled.reshape(*lead, channels * r * r, height // r, width // r), input)


functional("pixel_shuffle(Tensor input, int upscale_factor) -> Tensor", _pixel_shuffle)
functional("pixel_unshuffle(Tensor input, int downscale_factor) -> Tensor", _pixel_unshuffle)


# ============================================================================ fold and unfold

def _check_fold_args(op, kernel_size, dilation, padding, stride):
    kernel, dilation = int_tuple(kernel_size, 2, "kernel_size", op), int_tuple(dilation, 2, "dilation", op)
    padding, stride = int_tuple(padding, 2, "padding", op), int_tuple(stride, 2, "stride", op)
    if min(kernel) <= 0 or min(dilation) <= 0 or min(stride) <= 0 or min(padding) < 0:
        raise RuntimeError(f"{op}: kernel_size, dilation and stride should be greater than zero and padding "
                           f"non-negative, but got kernel_size={list(kernel)}, dilation={list(dilation)}, "
                           f"padding={list(padding)}, stride={list(stride)}")
    return kernel, dilation, padding, stride


def _im2col(input, kernel_size, dilation=1, padding=0, stride=1):
    """F.unfold: every sliding block of a (N, C, H, W) input as a column, (N, C * KH * KW, L)."""
    op = "im2col"
    kernel, dilation, padding, stride = _check_fold_args(op, kernel_size, dilation, padding, stride)
    if input.ndim not in (3, 4) or 0 in input.shape[1:]:
        raise RuntimeError(f"{op}: Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size and non-zero "
                           f"sizes for the other dims, but got input of size {list(input.shape)}")
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    blocks = [_window_count(n + 2 * p, k, s, d) for n, k, s, d, p in zip(x.shape[2:], kernel, stride, dilation,
                                                                          padding)]
    if min(blocks) < 1:
        raise RuntimeError(f"{op}: Given input with spatial size ({x.shape[2]}, {x.shape[3]}), kernel_size="
                           f"{list(kernel)}, dilation={list(dilation)}, padding={list(padding)}, calculated shape "
                           f"of the array of sliding blocks as ({blocks[0]}, {blocks[1]}), but its components must "
                           "be at least one.")
    if max(padding):
        x = _constant_pad(x, [(p, p) for p in padding], 0)
    windows = _windows(x, kernel, stride, dilation)  # (N, C, OH, OW, KH, KW)
    batch, channels = x.shape[:2]
    out = windows.permute(0, 1, 4, 5, 2, 3).reshape(batch, channels * kernel[0] * kernel[1], blocks[0] * blocks[1])
    return out.squeeze(0) if unbatched else out


def _col2im(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """F.fold: the adjoint of unfold, each column's entries summed into the (N, C, *output_size) blocks they came
    from."""
    op = "col2im"
    kernel, dilation, padding, stride = _check_fold_args(op, kernel_size, dilation, padding, stride)
    sizes = int_tuple(output_size, 2, "output_size", op)
    if input.ndim not in (2, 3) or 0 in input.shape[1:]:
        raise RuntimeError(f"{op}: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size and non-zero "
                           f"sizes for the other dims, but got input of size {list(input.shape)}")
    unbatched = input.ndim == 2
    x = input.unsqueeze(0) if unbatched else input
    per_block = kernel[0] * kernel[1]
    if x.shape[1] % per_block:
        raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but "
                           f"got input.size(1)={x.shape[1]} and kernel_size={tuple(kernel)}.")
    blocks = [_window_count(n + 2 * p, k, s, d) for n, k, s, d, p in zip(sizes, kernel, stride, dilation, padding)]
    if min(blocks) < 1 or blocks[0] * blocks[1] != x.shape[2]:
        raise RuntimeError(f"Given output_size={tuple(sizes)}, kernel_size={tuple(kernel)}, dilation="
                           f"{tuple(dilation)}, padding={tuple(padding)}, stride={tuple(stride)}, expected size of "
                           f"input's dimension 2 to match the calculated number of sliding blocks {blocks[0]} * "
                           f"{blocks[1]} = {blocks[0] * blocks[1]}, but got input.size(2)={x.shape[2]}.")
    batch, channels = x.shape[0], x.shape[1] // per_block
    windows = x.reshape(batch, channels, *kernel, *blocks).permute(0, 1, 4, 5, 2, 3)
    out = _windows_adjoint(windows, (batch, channels, *sizes), [(p, p) for p in padding], stride, dilation)
    out = out.contiguous()  # torch writes a fresh row-major result (the adjoint's is a window of a padded one)
    return out.squeeze(0) if unbatched else out


functional("im2col(Tensor input, int[2] kernel_size, int[2] dilation=1, int[2] padding=0, int[2] stride=1) -> Tensor",
           _im2col, function=False)
functional("col2im(Tensor input, int[2] output_size, int[2] kernel_size, int[2] dilation=1, int[2] padding=0, "
           "int[2] stride=1) -> Tensor", _col2im, function=False)


# ============================================================================ sampling grids

def _base_coordinates(n: int, align_corners: bool, like):
    """torch's linspace_from_neg_one: n points over [-1, 1], pulled in to the pixel centres without align_corners."""
    from tilewise.ops.creation import full, linspace

    if n <= 1:
        return full((n,), 0.0, dtype=like.dtype, device=like.device)
    points = linspace(-1, 1, n, dtype=like.dtype, device=like.device)
    return points if align_corners else points * ((n - 1) / n)


def _affine_grid(theta, size, align_corners=None):
    """F.affine_grid: the (N, *spatial, k) sampling grid of the affine maps ``theta`` (N, k, k + 1)."""
    from tilewise.ops.creation import ones

    op = "affine_grid"
    if not theta.dtype.is_floating_point:
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    size = tuple(size)
    spatial = len(size) - 2
    if spatial not in (2, 3):
        raise NotImplementedError(f"{op} only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
                                  f"respectively. Got size {list(size)}.")
    if theta.ndim != 3 or tuple(theta.shape[1:]) != (spatial, spatial + 1):
        shape = "Nx2x3" if spatial == 2 else "Nx3x4"
        raise ValueError(f"Expected a batch of {spatial}D affine matrices of shape {shape} for size {list(size)}. "
                         f"Got {list(theta.shape)}.")
    if min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {list(size)}")
    if theta.shape[0] != size[0]:  # torch's batched product of the base grid and theta refuses it
        raise RuntimeError(f"{op}: Expected size for first two dimensions of batch2 tensor to be: [{size[0]}, "
                           f"{spatial + 1}] but got: [{theta.shape[0]}, {spatial + 1}] (theta of shape "
                           f"{list(theta.shape)} for size {list(size)})")
    batch, sizes = size[0], size[2:]
    axes = [_base_coordinates(n, bool(align_corners), theta) for n in sizes]  # depth, height, width
    grids = []
    for k, axis in enumerate(reversed(axes)):  # x runs along the last dim, y the one before, z the first
        d = spatial - 1 - k
        shape = [1] * spatial
        shape[d] = sizes[d]
        grids.append(axis.reshape(shape).expand(*sizes))
    grids.append(ones(sizes, dtype=theta.dtype, device=theta.device))
    base = OPS["stack"](grids, -1).reshape(1, -1, spatial + 1).expand(batch, -1, -1)
    return base.bmm(theta.transpose(1, 2)).reshape(batch, *sizes, spatial)


functional("affine_grid(Tensor theta, int[] size, bool? align_corners=None) -> Tensor", _affine_grid, function=False,
           autocast={"cpu": "lower"})  # torch's reaches bmm


def _unnormalize(coordinate, size: int, align_corners: bool):
    """Grid values in [-1, 1] to input pixel coordinates."""
    if align_corners:
        return (coordinate + 1) / 2 * (size - 1)
    return ((coordinate + 1) * size - 1) / 2


def _reflect(coordinate, twice_low: int, twice_high: int):
    """torch's reflect_coordinates: fold a coordinate into [twice_low / 2, twice_high / 2] by mirroring."""
    if twice_low == twice_high:
        return coordinate * 0
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    distance = (coordinate - low).abs()
    extra = distance.fmod(span)
    flips = (distance / span).floor()
    even = flips.fmod(2) == 0
    return (extra + low).where(even, span - extra + low)


def _clip(coordinate, size: int):
    """torch's clip_coordinates: into [0, size - 1], a NaN (a NaN grid value, or an infinite one reflected) to 0.
    The gradient passes strictly inside only: torch's clip_coordinates_set_grad counts the borders as outside (a
    point on one, as every edge point of an identity grid is, gets none, where clamp's derivative would pass)."""
    clipped = coordinate.clamp(0, size - 1)
    if coordinate.requires_grad:
        clipped = clipped.where((coordinate > 0) & (coordinate < size - 1), clipped.detach())
    return clipped.where(clipped == clipped, 0)


def _padded_coordinate(coordinate, size: int, padding_mode: str, align_corners: bool):
    """torch's compute_coordinates: border clips to the input, reflection mirrors then clips."""
    if padding_mode == "border":
        return _clip(coordinate, size)
    if padding_mode == "reflection":
        if align_corners:
            coordinate = _reflect(coordinate, 0, 2 * (size - 1))
        else:
            coordinate = _reflect(coordinate, -1, 2 * size - 1)
        return _clip(coordinate, size)
    return coordinate


def _gather_taps(plane, taps, sizes):
    """plane (N, C, prod(S)) read at integer taps (one (N, *O) tensor per spatial dim, first dim first); taps outside
    the input read 0. Returns (N, C, *O)."""
    inside = None
    flat = None
    for index, size in zip(taps, sizes):
        ok = (index >= 0) & (index < size)
        inside = ok if inside is None else inside & ok
        clamped = index.clamp(0, size - 1)
        flat = clamped if flat is None else flat * size + clamped
    batch, channels = plane.shape[:2]
    out_shape = flat.shape[1:]
    gathered = plane.gather(-1, flat.reshape(batch, 1, math.prod(out_shape)).expand(batch, channels, -1))
    values = gathered.reshape(batch, channels, *out_shape)
    return values * inside.unsqueeze(1).to(values.dtype)


def _check_grid(op, input, grid) -> None:
    """torch's grid_sampler checks, in its order and words."""
    spatial = input.ndim - 2
    if grid.ndim == 0 or grid.shape[-1] != spatial:
        raise RuntimeError(f"{op}(): expected grid to have size {spatial} in last dimension, but got grid with sizes "
                           f"{list(grid.shape)}")
    if input.ndim not in (4, 5) or grid.ndim != input.ndim:
        rank = 4 if input.ndim == 4 else 5
        raise RuntimeError(f"{op}(): expected {rank}D input and grid with same number of dimensions, but got input "
                           f"with sizes {list(input.shape)} and grid with sizes {list(grid.shape)}")
    if grid.shape[0] != input.shape[0]:
        raise RuntimeError(f"{op}(): expected grid and input to have same batch size, but got input with sizes "
                           f"{list(input.shape)} and grid with sizes {list(grid.shape)}")
    for d in range(2, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"{op}(): expected input to have non-empty spatial dimensions, but input has sizes "
                               f"{list(input.shape)} with dimension {d} being empty")


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """F.grid_sample: the input read at each grid point (x, y[, z] in [-1, 1], x along the last dim), by bilinear
    (trilinear), nearest or bicubic interpolation, with zeros, border or reflection padding."""
    op = "grid_sample"
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', but "
                         f"got: '{mode}'")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError("nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: '{padding_mode}'")
    _check_grid(op, input, grid)
    spatial = input.ndim - 2
    if mode == "bicubic" and spatial != 2:
        raise RuntimeError(f"{op}(): bicubic interpolation only supports 4D input")
    if input.dtype is not grid.dtype:
        raise RuntimeError(f"{op}(): expected grid to have the same dtype as input, but got input of type "
                           f"{input.dtype} and grid of type {grid.dtype}")
    align = bool(align_corners)
    sizes = tuple(input.shape[2:])
    batch, channels = input.shape[:2]
    plane = input.reshape(batch, channels, math.prod(sizes))
    # grid components run x (last dim), y, z; coordinates here run first dim first
    raw = [_unnormalize(grid[..., spatial - 1 - d], sizes[d], align) for d in range(spatial)]
    if mode == "bicubic":
        return _grid_bicubic(plane, raw, sizes, padding_mode, align)
    coordinates = [_padded_coordinate(c, n, padding_mode, align) for c, n in zip(raw, sizes)]
    if mode == "nearest":
        out = _gather_taps(plane, [c.round().long() for c in coordinates], sizes)
        return out + _zero_gradient_path(grid) if grid.requires_grad else out
    lows = [c.floor() for c in coordinates]
    out = None
    for corner in range(2 ** spatial):
        taps, weight = [], None
        for d, (c, low) in enumerate(zip(coordinates, lows)):
            upper = (corner >> (spatial - 1 - d)) & 1
            tap = low + upper
            w = (c - low) if upper else (low + 1 - c)
            taps.append(tap.long())
            weight = w if weight is None else weight * w
        term = _gather_taps(plane, taps, sizes) * weight.unsqueeze(1)
        out = term if out is None else out + term
    return out


def _zero_gradient_path(grid):
    """Zeros of the output's shape but for channels, (N, 1, *O), whose gradient reaches ``grid`` as zeros: torch's
    nearest sampling gives the grid a zero gradient, where the integer taps alone would give it none (sign's
    derivative is zero, and nan_to_num keeps a NaN or infinite grid value from the sum)."""
    return grid[..., 0].sign().nan_to_num().mul(0).unsqueeze(1)


def _grid_bicubic(plane, raw, sizes, padding_mode, align):
    """Bicubic: 4 x 4 taps around each point with torch's cubic weights; border and reflection padding move each
    tap into the input (torch pads taps, not the point)."""
    floors = [c.floor() for c in raw]
    weights = [_cubic_weights(c - f) for c, f in zip(raw, floors)]  # (N, *O, 4) per dim
    out = None
    for i in range(4):
        for j in range(4):
            taps = []
            for d, tap in enumerate((i, j)):
                index = floors[d] + (tap - 1)
                if padding_mode != "zeros":
                    index = _padded_coordinate(index, sizes[d], padding_mode, align)
                taps.append(index.long())
            weight = weights[0][..., i] * weights[1][..., j]
            term = _gather_taps(plane, taps, sizes) * weight.unsqueeze(1)
            out = term if out is None else out + term
    return out


functional("grid_sample(Tensor input, Tensor grid, str mode='bilinear', str padding_mode='zeros', "
           "bool? align_corners=None) -> Tensor", _grid_sample, function=False,
           autocast={"cpu": "fp32", "cuda": "promote"})


def _upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """torch's deprecated spelling of interpolate."""
    warn_at_caller("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` instead.")
    return OPS["interpolate"](input, size, scale_factor, mode, align_corners)


def _upsample_nearest(input, size=None, scale_factor=None):
    warnings.warn("nn.functional.upsample_nearest is deprecated. Use nn.functional.interpolate instead.",
                  stacklevel=3)
    return OPS["interpolate"](input, size, scale_factor, "nearest")


def _upsample_bilinear(input, size=None, scale_factor=None):
    warnings.warn("nn.functional.upsample_bilinear is deprecated. Use nn.functional.interpolate instead.",
                  stacklevel=3)
    return OPS["interpolate"](input, size, scale_factor, "bilinear", True)


functional("upsample(Tensor input, int[]? size=None, float[]? scale_factor=None, str mode='nearest', "
           "bool? align_corners=None) -> Tensor", _upsample, function=False)
functional("upsample_nearest(Tensor input, int[]? size=None, float[]? scale_factor=None) -> Tensor",
           _upsample_nearest, function=False)
functional("upsample_bilinear(Tensor input, int[]? size=None, float[]? scale_factor=None) -> Tensor",
           _upsample_bilinear, function=False)
