"""The compiler: ``tilewise.compile(fn)`` turns Python code over tensors into fused, generated kernels.

[Note: the compiler] Every stage is a module of its own and can be dumped (``TILEWISE_LOG=graph,fusion,
kernels,recompiles``):

1. ``capture``   — run the function on trace tensors through the dispatcher's Trace key (below autograd,
                   so ``backward()`` inside lands in the same graph); functionalize in-place writes.
2. ``ir``        — the graph IR: SSA, hash-consed nodes, text form, ``verify``.
3. ``passes``    — graph rewrites: functionalize, decompose, simplify (identities, constant folding),
                   simplify_indexing (gathers, scatters and view scatters rewritten so fusion sees through
                   them), cse, dce; on CUDA, grouped_query_attention (a key/value head repeat before a kept
                   attention becomes cuDNN's grouped-query attention).
4. ``lowering``  — partition (forward/backward), GEMM epilogues, fusion (loop nests, kernels), ``lower``
                   (each fused kernel as kernel IR: ``codegen.kernel_ir``) and ``memory`` (static buffer plan).
5. code generation (``tilewise.codegen``, shared with the eager CUDA kernels): schedules per target,
                   one C-style renderer, the toolchain; ``autotune`` times a kernel's candidate schedules in
                   ``mode="max-autotune"`` and remembers the winner.
6. ``program``   — a list of steps over the buffer plan; ``function`` wraps it with guards.

``composites`` plugs the compiler into the eager CUDA backend: composite operators (softmax, layer_norm, the
losses) run there as one compiled kernel each.
"""

from tilewise.compiler import backward, composites  # noqa: F401, E402 — registers the compiled backward with the engine, the fused composites with the CUDA backend
from tilewise.compiler.errors import DataDependentError
from tilewise.compiler.function import CompiledFunction, UnsupportedTargetError, compile


def is_compiling() -> bool:
    """Whether the caller runs inside a function ``tilewise.compile`` is tracing (torch.compiler.is_compiling)."""
    from tilewise.dispatch import STATE

    return bool(STATE.trace_depth)


__all__ = ["CompiledFunction", "DataDependentError", "UnsupportedTargetError", "compile", "is_compiling"]
