"""Rendering scalar expressions and kernels to C-family source (see [Note: C-style rendering] in ``cstyle``).

``cstyle`` holds the shared renderer; ``cuda.CUDA`` and ``c.C`` are its two targets (data only), and
``cuda`` adds the CUDA reduction schedule.
"""

from tilewise.codegen.render.c import C
from tilewise.codegen.render.cstyle import (
    BROADCAST,
    CONTIGUOUS,
    STRIDED,
    VALUE,
    ExprRenderer,
    Language,
    Operand,
    PointwiseKernel,
    render_pointwise,
    vector_width,
)
from tilewise.codegen.render.cuda import COLUMN, CUDA, ROW, ReductionKernel, render_reduction

__all__ = [
    "BROADCAST", "C", "COLUMN", "CONTIGUOUS", "CUDA", "ExprRenderer", "Language", "Operand", "PointwiseKernel",
    "ROW", "ReductionKernel", "STRIDED", "VALUE", "render_pointwise", "render_reduction", "vector_width",
]
