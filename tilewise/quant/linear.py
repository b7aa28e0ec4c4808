"""Weight-only MXFP8 / NVFP4 inference of Linear layers.

[Note: weight-only block-scaled Linear]
``QuantizedLinear`` keeps its weight ([out, in]) quantized along ``in``, the GEMM's reduction dimension, so
each block of 16 or 32 weights that one dot product reads shares a scale (the layout block-scaled GEMMs read).
On the CPU and on Hopper the forward dequantizes the weight into the activation's dtype (one bandwidth-bound
kernel on CUDA, [Note: block-scaled kernels]) and runs the ordinary Linear (cuBLASLt on CUDA); the weight's
memory is the quantized bytes between calls. Blackwell (sm_100) reads block-scaled operands natively
(cuBLASLt's ``MatmulMatrixScale.VEC32_UE8M0`` / ``VEC16_UE4M3`` scale modes on A and B); that path also
quantizes the activation and needs the scales swizzled into 128x4 tiles: :func:`native_gemm_plan` names what it
sets and refuses other archs; the forward uses the dequantizing path on every arch until that plan has run on
such a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise import dtypes
from tilewise.nn import functional as F
from tilewise.nn.modules.linear import Linear
from tilewise.nn.modules.module import Module
from tilewise.quant.tensor import FORMATS, QuantizedTensor, dequantize, quantize
from tilewise.tensor import Tensor

# cuBLASLt (through nvmath.bindings.cublasLt and cuda.bindings' cudaDataType) for a native block-scaled GEMM
_NATIVE = {
    "mxfp8": {"data_type": "CUDA_R_8F_E4M3", "scale_type": "CUDA_R_8F_UE8M0", "scale_mode": "VEC32_UE8M0"},
    "nvfp4": {"data_type": "CUDA_R_4F_E2M1", "scale_type": "CUDA_R_8F_UE4M3", "scale_mode": "VEC16_UE4M3"},
}
NATIVE_MIN_CAPABILITY = (10, 0)


def native_gemm_plan(format: str, capability: tuple[int, int]) -> dict:  # noqa: A002
    """The cuBLASLt settings of a native block-scaled GEMM in ``format`` on a GPU of ``capability``: operand
    and scale data types (``cudaDataType`` names), the A/B scale mode (``MatmulMatrixScale`` member) and the
    descriptor attributes it sets (``MatmulDescAttribute`` members). Raises where the arch has no such GEMM."""
    if format not in _NATIVE:
        raise ValueError(f"native_gemm_plan: unknown format {format!r}; valid formats: {', '.join(_NATIVE)}")
    if tuple(capability) < NATIVE_MIN_CAPABILITY:
        major, minor = capability
        raise RuntimeError(f"native block-scaled {format} GEMM needs compute capability 10.0 or newer (Blackwell, "
                           f"sm_100), got {major}.{minor} (sm_{major}{minor}); on this GPU QuantizedLinear "
                           "dequantizes the weight into a bf16 buffer and runs a bf16 cuBLASLt GEMM")
    return dict(_NATIVE[format], transa="T", transb="N",  # Blackwell's FP4/FP8 GEMMs take the "TN" layout
                attributes=("A_SCALE_MODE", "B_SCALE_MODE", "A_SCALE_POINTER", "B_SCALE_POINTER"),
                scale_layout="128x4 swizzled tiles of row-major [rows, K / block] scales")


class QuantizedLinear(Module):
    """``y = x @ dequantize(weight).T + bias`` with the weight stored as MXFP8 or NVFP4.

    >>> import tilewise as tw
    >>> layer = tw.nn.Linear(64, 8)
    >>> q = tw.quant.QuantizedLinear.from_float(layer, "nvfp4")
    >>> q(tw.ones(2, 64)).shape, q.weight_nbytes < layer.weight.numel() * 2 * 0.3
    (tilewise.Size([2, 8]), True)
    """

    def __init__(self, weight: QuantizedTensor, bias: Tensor | None) -> None:
        super().__init__()
        self.format = weight.format
        self.out_features, self.in_features = weight.shape
        self.weight_dtype = weight.dtype
        self.register_buffer("weight_data", weight.data)
        self.register_buffer("weight_scales", weight.scales)
        self.register_buffer("weight_tensor_scale", weight.tensor_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_float(cls, linear: Linear, format: str) -> QuantizedLinear:  # noqa: A002
        if not isinstance(linear, Linear):
            raise TypeError(f"QuantizedLinear.from_float: expected an nn.Linear, got {type(linear).__name__}")
        if format not in FORMATS:
            raise ValueError(f"QuantizedLinear.from_float: unknown format {format!r}; valid: {', '.join(FORMATS)}")
        block = FORMATS[format]
        if linear.in_features % block:
            raise ValueError(f"QuantizedLinear.from_float({format!r}): in_features must be a multiple of {block} "
                             f"(the {format} block size), got a Linear({linear.in_features}, {linear.out_features})")
        return cls(quantize(linear.weight.detach(), format), linear.bias)

    @property
    def weight(self) -> QuantizedTensor:
        return QuantizedTensor(self.format, self.weight_data, self.weight_scales, self.weight_tensor_scale,
                               (self.out_features, self.in_features), self.weight_dtype)

    @property
    def weight_nbytes(self) -> int:
        return self.weight.nbytes

    def forward(self, input: Tensor) -> Tensor:
        if input.shape[-1:] != (self.in_features,) if input.ndim else True:
            raise RuntimeError(f"QuantizedLinear ({self.format}): input of shape {list(input.shape)} does not match "
                               f"in_features={self.in_features}; the last dimension must be {self.in_features}")
        if not input.is_floating_point() or input.dtype not in (dtypes.float32, dtypes.bfloat16, dtypes.float16):
            raise TypeError(f"QuantizedLinear ({self.format}): expected a float32, bfloat16 or float16 input, got "
                            f"{input.dtype.name}")
        if input.device != self.weight_data.device:
            raise RuntimeError(f"QuantizedLinear ({self.format}): input on {input.device}, weight on "
                               f"{self.weight_data.device}; move the module with .to(device)")
        weight = dequantize(self.weight, input.dtype)
        bias = None if self.bias is None else self.bias.to(input.dtype)
        return F.linear(input, weight, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}")


def quantize_(model: Module, format: str, filter_fn: Callable[[Module, str], bool] | None = None) -> Module:  # noqa: A002
    """Replace, in place, every ``nn.Linear`` of ``model`` (where ``filter_fn(module, name)`` agrees) by a
    weight-only :class:`QuantizedLinear` in ``format``, as torchao's ``quantize_``; returns ``model``."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, Linear) and (filter_fn is None or filter_fn(child, full)):
                setattr(module, child_name, QuantizedLinear.from_float(child, format))
    return model
