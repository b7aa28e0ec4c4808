"""Lowering: from the optimised graph to kernels and a buffer plan.

[Note: lowering stages] After the graph passes (``compiler.passes``: rewrites that keep a graph a graph), a
graph is lowered in this order: ``partition`` cuts a joint forward+backward graph in two; ``epilogues`` folds
bias and activations into GEMM calls; ``fusion`` groups the remaining operators into fused kernels; ``lower``
turns each fused kernel into kernel IR (``codegen.kernel_ir``); ``memory`` plans the buffers. The target's
program builder (``compiler.targets``) runs them.
"""
