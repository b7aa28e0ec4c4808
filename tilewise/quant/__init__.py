"""Block-scaled quantization: MXFP8 and NVFP4 tensors, and weight-only quantized Linear layers.

[Note: quantized tensors]
``quantize(t, "mxfp8" | "nvfp4")`` cuts ``t``'s last dimension into blocks and returns a
:class:`QuantizedTensor`: the packed elements, one scale per block and (NVFP4) a float32 per-tensor scale,
each an ordinary tensor on ``t``'s device, so they can be saved, moved and inspected like any other. The
formats, their rounding and their special cases are defined once, in ``quant/reference.py`` (see [Note:
block-scaled formats]); on CUDA the kernels of ``backends/cuda/kernels/blockscale.py`` reproduce the
reference bit for bit. Scales are stored row-major ([..., K / block]), as the reference and torchao's
``to_mx`` keep them; the swizzled 128x4 layout that Blackwell's block-scaled GEMMs read is built from this one
by the Linear path that needs it (``quant/linear.py``).
"""

from tilewise.quant.linear import QuantizedLinear, native_gemm_plan, quantize_
from tilewise.quant.tensor import FORMATS, QuantizedTensor, dequantize, quantize

__all__ = ["FORMATS", "QuantizedLinear", "QuantizedTensor", "dequantize", "native_gemm_plan", "quantize",
           "quantize_"]
