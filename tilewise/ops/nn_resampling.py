"""torch.nn.functional's resampling: interpolation, pixel shuffle, fold and unfold, and sampling grids.

Nearest-neighbour interpolation gathers with torch's float32 source-index rule.
"""

from __future__ import annotations

import math

from tilewise.dtypes import float32
from tilewise.ops.nn_functional import functional, int_tuple
from tilewise.ops.registry import OPS

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
