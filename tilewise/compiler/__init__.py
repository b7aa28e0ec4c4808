"""The compiler: ``tilewise.compile(fn)`` turns Python code over tensors into fused, generated kernels.

[Note: the compiler] Every stage is a module of its own and can be dumped (``TILEWISE_LOG=graph,fusion,
kernels,recompiles``):

1. ``capture``   — run the function on trace tensors through the dispatcher's Trace key (below autograd,
                   so ``backward()`` inside lands in the same graph); functionalize in-place writes.
2. ``ir``        — the graph IR: SSA, hash-consed nodes, text form, ``verify``.
3. ``passes``    — functionalize, decompose, simplify (identities, constant folding), simplify_indexing
                   (gathers, scatters and view scatters rewritten so fusion sees through them), cse, dce;
                   then ``fusion`` (loop nests, kernels) and ``memory`` (static buffer plan, cats in place).
4. ``kernel_ir`` — each fused kernel as nests of loads, reductions and stores over symbolic indices.
5. ``schedule``  — per target: loop order, parallelism, vectorisation, reduction strategy; ``autotune``
                   times a kernel's candidate schedules in ``mode="max-autotune"`` and remembers the winner.
6. ``render``    — one C-style renderer; the C and CUDA targets differ in data only.
7. ``toolchain`` — ``cc`` (C, OpenMP, ctypes) and NVRTC (CUDA), with on-disk caches.
8. ``program``   — a list of steps over the buffer plan; ``function`` wraps it with guards.
"""

from tilewise.compiler.capture import DataDependentError
from tilewise.compiler.function import CompiledFunction, UnsupportedTargetError, compile

__all__ = ["CompiledFunction", "DataDependentError", "UnsupportedTargetError", "compile"]
