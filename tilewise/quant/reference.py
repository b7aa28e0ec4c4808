"""NumPy reference of the block-scaled formats MXFP8 and NVFP4, written from their specifications.

[Note: block-scaled formats]
Both formats cut the last dimension into blocks and store each block as small elements times one scale.

MXFP8 (OCP Microscaling Formats v1.0, section 6.3): 32-element blocks, float8_e8m0fnu scales, float8_e4m3fn
elements. A block's shared exponent is ``floor(log2(amax)) - 8`` (8 is e4m3's largest exponent: 448 =
1.75 * 2^8), clamped to e8m0's range [-127, 127]; its scale is ``X = 2^shared``; each element is ``V / X``
rounded to e4m3 (nearest, ties to even) and saturated to ±448, which the spec prescribes for normal values
past the element's range (``amax / X`` lies in [256, 512), so the largest elements may saturate). An all-zero
block gets the smallest scale, 2^-127 (code 0), and zero elements. A block holding NaN or ±Inf gets the NaN
scale (0xFF) and NaN elements (0x7F): it dequantizes to NaN, as the spec's NaN scale means.

NVFP4 (NVIDIA's recipe, as in Blackwell's block-scaled GEMMs and TransformerEngine): 16-element blocks, e2m1
elements (two per byte, the first in the low nibble), float8_e4m3fn block scales and one float32 per-tensor
decode scale ``s = amax / (448 * 6)`` over the finite values (1 when that is 0), so that the largest block
scale lands at e4m3's top. A block's scale is ``e4m3(amax_block / 6 / s)`` (saturating); its elements are
``e2m1(V / (scale * s))`` (nearest, ties to even, saturating at ±6); dequantization is
``e2m1 * scale * s``. A block whose scale rounds to 0 (all zeros, or far below the tensor's largest values)
stores zero elements; a block holding NaN or ±Inf stores the e4m3 NaN scale (0x7F) and dequantizes to NaN.

Every step is a float32 operation in a fixed order (divisions, products, round-to-nearest conversions), so
the CUDA kernels (``backends/cuda/kernels/blockscale.py``) reproduce these bits exactly.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tilewise.dtypes import decode_e2m1, encode_e2m1

MX_BLOCK = 32
NV_BLOCK = 16
E4M3_MAX = np.float32(448.0)
E2M1_MAX = np.float32(6.0)
E4M3_EMAX = 8  # floor(log2(448))
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F


def blocks_of(x: np.ndarray, block: int, fmt: str) -> np.ndarray:
    """``x`` (float32, last dimension a multiple of ``block``) as (rows, blocks, block)."""
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"{fmt} quantization needs a last dimension that is a multiple of {block} (its block "
                         f"size), got shape {list(x.shape)}; pad the last dimension to a multiple of {block}")
    return x.reshape(-1, x.shape[-1] // block, block)


def block_amax(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest |finite value| of each block, whether each block holds NaN or ±Inf)."""
    finite = np.isfinite(blocks)
    return np.where(finite, np.abs(blocks), 0).max(axis=-1), ~finite.all(axis=-1)


def to_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn codes (uint8): round to nearest even, saturating at ±448 (cvt.rn.satfinite)."""
    return np.clip(values, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e4m3_value(codes: np.ndarray) -> np.ndarray:
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


# ---------------------------------------------------------------- MXFP8

def mxfp8_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 codes of x's shape, e8m0 scale codes of shape [..., K/32]), both uint8."""
    x = np.asarray(x, np.float32)
    blocks = blocks_of(x, MX_BLOCK, "mxfp8")
    amax, bad = block_amax(blocks)
    shared = np.where(amax > 0, np.frexp(amax)[1] - 1 - E4M3_EMAX, -127)  # frexp: amax = m * 2^e, m in [0.5, 1)
    shared = np.clip(shared, -127, 127)
    inverse = np.ldexp(np.float32(1), -shared).astype(np.float32)  # 2^-shared, exact (2^-127 is subnormal)
    elements = to_e4m3(blocks * inverse[..., None])
    elements[bad] = E4M3_NAN
    scales = np.where(bad, E8M0_NAN, shared + 127).astype(np.uint8)
    return elements.reshape(x.shape), scales.reshape(x.shape[:-1] + (-1,))


def mxfp8_dequantize(elements: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 values from e4m3 codes and e8m0 scale codes."""
    values = e4m3_value(elements)
    blocks = values.reshape(-1, scales.shape[-1] if scales.ndim else 1, MX_BLOCK)
    codes = scales.reshape(blocks.shape[:2]).astype(np.int32)
    powers = np.ldexp(np.float32(1), np.minimum(codes, E8M0_NAN - 1) - 127).astype(np.float32)
    scale = np.where(codes == E8M0_NAN, np.float32(np.nan), powers)
    return (blocks * scale[..., None]).reshape(values.shape)


# ---------------------------------------------------------------- NVFP4

def nvfp4_tensor_scale(x: np.ndarray) -> np.float32:
    """The per-tensor decode scale: amax / (448 * 6) over the finite values, or 1 where that is 0."""
    finite = np.abs(x[np.isfinite(x)])
    amax = finite.max() if finite.size else np.float32(0)
    scale = np.float32(amax) / np.float32(E4M3_MAX * E2M1_MAX)
    return np.float32(1) if scale == 0 else np.float32(scale)


def nvfp4_quantize(x: np.ndarray, tensor_scale=None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(packed e2m1 bytes of shape [..., K/2], e4m3 scale codes [..., K/16], float32 per-tensor scale)."""
    x = np.asarray(x, np.float32)
    blocks = blocks_of(x, NV_BLOCK, "nvfp4")
    s = nvfp4_tensor_scale(x) if tensor_scale is None else np.float32(tensor_scale)
    amax, bad = block_amax(blocks)
    scale_codes = to_e4m3((amax / E2M1_MAX) / s)
    scale_codes[bad] = E4M3_NAN
    denominator = (e4m3_value(scale_codes) * s)[..., None]
    usable = (denominator != 0) & ~bad[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(usable, blocks / np.where(usable, denominator, 1), 0).astype(np.float32)
    codes = encode_e2m1(scaled) & np.where(usable, 0xF, 0).astype(np.uint8)
    packed = pack_e2m1(codes.reshape(x.shape))
    return packed, scale_codes.reshape(x.shape[:-1] + (-1,)), s


def nvfp4_dequantize(packed: np.ndarray, scales: np.ndarray, tensor_scale) -> np.ndarray:
    values = decode_e2m1(unpack_e2m1(packed))
    blocks = values.reshape(-1, scales.shape[-1], NV_BLOCK)
    scale = e4m3_value(scales.reshape(blocks.shape[:2])) * np.float32(tensor_scale)
    return (blocks * scale[..., None]).astype(np.float32).reshape(values.shape)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Codes (uint8, 0..15) along the last dimension -> bytes of two, the first in the low nibble (torch's
    float4_e2m1fn_x2 layout)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out
