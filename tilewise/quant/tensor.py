"""Quantized tensors: ``quantize`` and ``dequantize`` on the CPU (the reference) and on CUDA (the kernels);
see [Note: quantized tensors] in ``quant/__init__.py``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilewise import dtypes
from tilewise.dtypes import DType
from tilewise.quant import reference
from tilewise.tensor import Tensor, from_array

FORMATS = {"mxfp8": reference.MX_BLOCK, "nvfp4": reference.NV_BLOCK}  # format -> block size
_INPUT_DTYPES = (dtypes.float32, dtypes.bfloat16, dtypes.float16)


@dataclass
class QuantizedTensor:
    """A block-scaled tensor: ``data`` (float8_e4m3fn for MXFP8, float4_e2m1fn_x2 with the last dimension
    halved for NVFP4), ``scales`` (float8_e8m0fnu / float8_e4m3fn, [..., K / block]), ``tensor_scale`` (NVFP4:
    a float32 0-dim tensor, else None), the original ``shape`` and ``dtype`` (what ``dequantize`` returns)."""

    format: str
    data: Tensor
    scales: Tensor
    tensor_scale: Tensor | None
    shape: tuple
    dtype: DType

    @property
    def device(self):
        return self.data.device

    @property
    def block_size(self) -> int:
        return FORMATS[self.format]

    @property
    def nbytes(self) -> int:
        """Bytes of everything stored: elements, block scales and the per-tensor scale."""
        parts = [self.data, self.scales] + ([self.tensor_scale] if self.tensor_scale is not None else [])
        return sum(p.numel() * p.element_size() for p in parts)

    def dequantize(self, dtype: DType | None = None) -> Tensor:
        return dequantize(self, dtype)

    def to(self, device) -> QuantizedTensor:
        moved = [None if p is None else p.to(device) for p in (self.data, self.scales, self.tensor_scale)]
        return QuantizedTensor(self.format, moved[0], moved[1], moved[2], self.shape, self.dtype)

    def __repr__(self) -> str:
        return (f"QuantizedTensor(format={self.format!r}, shape={list(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}, nbytes={self.nbytes})")


def _check(t, fmt: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"quantize: expected a tensor, got {type(t).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"quantize: unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    if t.dtype not in _INPUT_DTYPES:
        raise TypeError(f"quantize({fmt!r}): expected a float32, bfloat16 or float16 tensor, got {t.dtype.name} "
                        f"of shape {list(t.shape)}")
    block = FORMATS[fmt]
    if t.ndim == 0 or t.shape[-1] % block:
        raise ValueError(f"quantize({fmt!r}): the last dimension must be a multiple of {block} (the {fmt} block "
                         f"size), got shape {list(t.shape)}; pad the last dimension to a multiple of {block}")


def quantize(t: Tensor, format: str) -> QuantizedTensor:  # noqa: A002 — the name torchao's configs use
    """``t`` in the block-scaled ``format`` ("mxfp8" or "nvfp4"), blocks along the last dimension.

    >>> import tilewise as tw
    >>> q = tw.quantize(tw.linspace(-1, 1, 64).reshape(2, 32), "nvfp4")
    >>> q.data.dtype, list(q.scales.shape), q.nbytes
    (tilewise.float4_e2m1fn_x2, [2, 2], 40)
    >>> err = (tw.dequantize(q) - tw.linspace(-1, 1, 64).reshape(2, 32)).abs().max()
    >>> float(err) <= 1 / 6  # half of e2m1's widest gap (4 to 6), relative to a block's largest value (1)
    True
    """
    _check(t, format)
    t = t.detach()
    if t.device.type == "cuda":
        from tilewise.backends.cuda.kernels import blockscale

        x = t.contiguous()
        if format == "mxfp8":
            data, scales = blockscale.mxfp8_quantize(x)
            return QuantizedTensor(format, data, scales, None, tuple(t.shape), t.dtype)
        data, scales, tensor_scale = blockscale.nvfp4_quantize(x)
        return QuantizedTensor(format, data, scales, tensor_scale, tuple(t.shape), t.dtype)
    if t.device.type != "cpu":
        raise RuntimeError(f"quantize({format!r}): tensors on {t.device} are not supported; valid: cpu, cuda")
    x = t.float().numpy()
    if format == "mxfp8":
        elements, scales = reference.mxfp8_quantize(x)
        return QuantizedTensor(format, _bytes_as(elements, dtypes.float8_e4m3fn),
                               _bytes_as(scales, dtypes.float8_e8m0fnu), None, tuple(t.shape), t.dtype)
    packed, scales, tensor_scale = reference.nvfp4_quantize(x)
    return QuantizedTensor(format, _bytes_as(packed, dtypes.float4_e2m1fn_x2),
                           _bytes_as(scales, dtypes.float8_e4m3fn), from_array(np.array(tensor_scale, np.float32)),
                           tuple(t.shape), t.dtype)


def _bytes_as(codes: np.ndarray, dtype: DType) -> Tensor:
    return from_array(np.ascontiguousarray(codes).view(dtype.np), dtype)


def _codes(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.view(dtypes.uint8).numpy())


def dequantize(q: QuantizedTensor, dtype: DType | None = None) -> Tensor:
    """The values of a :class:`QuantizedTensor`, as ``dtype`` (default: the dtype it was quantized from)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize: expected a QuantizedTensor (from tilewise.quantize), got {type(q).__name__}")
    dtype = dtypes.as_dtype(dtype) if dtype is not None else q.dtype
    if dtype not in _INPUT_DTYPES:
        raise TypeError(f"dequantize: the result dtype must be float32, bfloat16 or float16, got {dtype.name}")
    if q.device.type == "cuda":
        from tilewise.backends.cuda.kernels import blockscale

        if q.format == "mxfp8":
            return blockscale.mxfp8_dequantize(q.data.contiguous(), q.scales.contiguous(), dtype)
        return blockscale.nvfp4_dequantize(q.data.contiguous(), q.scales.contiguous(), q.tensor_scale, dtype)
    if q.format == "mxfp8":
        values = reference.mxfp8_dequantize(_codes(q.data), _codes(q.scales))
    else:
        values = reference.nvfp4_dequantize(_codes(q.data), _codes(q.scales), q.tensor_scale.item())
    return from_array(values.reshape(q.shape)).to(dtype)
