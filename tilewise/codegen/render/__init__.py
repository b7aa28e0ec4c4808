"""Rendering scalar expressions and kernels to C-family source (see [Note: C-style rendering] in ``cstyle``).

``cstyle`` holds the shared expression renderer; ``cuda.CUDA`` and ``c.C`` are its two targets (data only);
``kernel_c`` and ``kernel_cuda`` render kernel IR, following a schedule, for each.
"""

from tilewise.codegen.render.c import C
from tilewise.codegen.render.cstyle import ExprRenderer, Language
from tilewise.codegen.render.cuda import CUDA

__all__ = ["C", "CUDA", "ExprRenderer", "Language"]
