"""Every tilewise setting, in one place, each readable from a ``TILEWISE_*`` environment variable.

[Note: settings] Settings are plain attributes of :data:`settings`, read once from the environment when
tilewise is imported and changeable at run time (``tilewise.config.settings.log = {"kernels"}``). Code
that needs a setting reads it here, never from ``os.environ``, so a reader can see every knob at once.

========================  =====================================================================================
variable                  meaning
========================  =====================================================================================
``TILEWISE_LOG``          comma-separated log channels printed to stderr: ``kernels`` (each generated kernel's
                          name, source and launch shape, the first time it is launched), ``fallback`` (operators
                          that run on the host because the device has no kernel for them), ``matmul`` (the
                          cuBLASLt algorithm chosen for each GEMM shape), ``attention`` (why an attention runs
                          its decomposition instead of cuDNN), ``convolution`` (why a convolution runs its
                          decomposition instead of cuDNN, and the timed choice of cuDNN plans), and for
                          ``tilewise.compile``: ``graph``
                          (the graph after capture and after every pass), ``fusion`` (the fused groups),
                          ``recompiles`` (which guard failed when a compiled function is compiled again),
                          ``graph_breaks`` (where a compiled function's Python must run on every call: a value
                          read into Python, an operator the graph cannot hold, a side effect, and the line),
                          ``graphs`` (each CUDA graph a compiled program captures, or why it captures none),
                          ``compile`` (where a compile's time went: trace, each pass, fusion, code generation,
                          NVRTC, the first run with cuBLASLt's algorithm choices and cuDNN's graph builds)
``TILEWISE_RECOMPILES``   variants ``tilewise.compile`` keeps per function before running it eagerly (8)
``TILEWISE_CC``           the C compiler for the compiler's CPU target (default ``cc``)
``TILEWISE_CACHE_DIR``    where compiled kernels, and ``mode="max-autotune"``'s schedule choices (in ``autotune/``),
                          are kept on disk (default ``~/.cache/tilewise/kernels``); read by
                          ``tilewise.codegen.toolchain.cache``
``TILEWISE_VERIFY``       ``1`` checks the graph IR's invariants after capture and after every compiler pass
                          (``ir.verify``), naming the pass that broke one; off by default (the test suite turns
                          it on), as it costs a tenth of a large graph's compile time
``TILEWISE_CPU_MALLOC``   ``1`` (default) asks glibc's malloc, when the CPU backend loads, to keep freed blocks for
                          reuse ([Note: host allocator] in ``backends/cpu/allocator.py``); ``0`` leaves it alone
``TILEWISE_CPU_FUSED``    elements from which an eager CPU call of a hot composite or costly pointwise operator
                          (softmax, layer_norm, cross_entropy, gelu, their backwards) runs as one compiled C kernel
                          ([Note: fused composites] in ``compiler/composites.py``); default 16384, ``0``: always,
                          ``-1``: never
``TILEWISE_GEMM_TUNE``    ``1`` times cuBLASLt's heuristic candidates once per GEMM shape, keeps the fastest and
                          remembers it on disk; ``0`` always takes cuBLASLt's first choice; unset (default): the
                          first choice, or one remembered on disk, timed only in a ``mode="max-autotune"``
                          compiled function's first run ([Note: library algorithm choice] in
                          ``backends/cuda/tuning.py``)
``TILEWISE_GEMM_SM_``     SMs a compiled CUDA program's GEMMs leave to a collective running beside them on the
``CARVEOUT``              communication stream (a DDP bucket's all-reduce): they are planned by cuBLASLt for the
                          device's SMs less these ([Note: GEMMs beside collectives] in
                          ``compiler/lowering/streams.py``), read when a program is built; ``0`` (default): off
``TILEWISE_COMPILED_``    ``1`` runs each eager ``backward()`` whose graph was seen before as one compiled program
``BACKWARD``              ([Note: compiled backward] in ``compiler/backward.py``); ``0`` (default): node by node.
                          ``tilewise.autograd.compiled_backward()`` turns it on for a block of code
``TILEWISE_DONATE_``      ``1`` (default) lets a compiled backward write its intermediates into the memory of saved
``SAVED``                 tensors nothing else can reach, once it has read them for the last time ([Note: donated
                          saved tensors] in ``compiler/backward.py``); ``0`` keeps every saved tensor intact
``TILEWISE_CUDA_GRAPHS``  ``1`` (default) lets a compiled CUDA program replay its steps as one captured CUDA graph
                          from its second call; ``0`` launches its steps one by one on every call
``TILEWISE_COMPILE_``     how many kernels NVRTC compiles at once, on a pool of threads ([Note: parallel compiles] in
``THREADS``               ``codegen/toolchain/pool.py``); ``0`` (default): one per CPU the process may run on, up to
                          32; ``1``: one after another in the compiling thread (the serial fallback, same kernels)
========================  =====================================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

LOG_CHANNELS = ("kernels", "fallback", "matmul", "attention", "convolution", "graph", "fusion", "recompiles",
                "graph_breaks", "graphs", "compile")


def _channels(text: str) -> set[str]:
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = names - set(LOG_CHANNELS) - {"all"}
    if unknown:
        print(f"tilewise: ignoring unknown TILEWISE_LOG channel(s) {sorted(unknown)}; known: {LOG_CHANNELS}",
              file=sys.stderr)
    return set(LOG_CHANNELS) if "all" in names else names & set(LOG_CHANNELS)


@dataclass
class Settings:
    log: set[str] = field(default_factory=lambda: _channels(os.environ.get("TILEWISE_LOG", "")))
    gemm_tune: bool | None = field(default_factory=lambda: {"1": True, "0": False}.get(
        os.environ.get("TILEWISE_GEMM_TUNE", "")))
    gemm_sm_carveout: int = field(default_factory=lambda: int(os.environ.get("TILEWISE_GEMM_SM_CARVEOUT", "0")))
    cuda_graphs: bool = field(default_factory=lambda: os.environ.get("TILEWISE_CUDA_GRAPHS", "1") != "0")
    recompile_limit: int = field(default_factory=lambda: int(os.environ.get("TILEWISE_RECOMPILES", "8")))
    cc: str = field(default_factory=lambda: os.environ.get("TILEWISE_CC", "cc"))
    verify: bool = field(default_factory=lambda: os.environ.get("TILEWISE_VERIFY", "0") == "1")
    cpu_malloc: bool = field(default_factory=lambda: os.environ.get("TILEWISE_CPU_MALLOC", "1") != "0")
    cpu_fused_min_elements: int = field(default_factory=lambda: int(os.environ.get("TILEWISE_CPU_FUSED", "16384")))
    compiled_backward: bool = field(default_factory=lambda: os.environ.get("TILEWISE_COMPILED_BACKWARD", "0") == "1")
    donate_saved: bool = field(default_factory=lambda: os.environ.get("TILEWISE_DONATE_SAVED", "1") != "0")
    compile_threads: int = field(default_factory=lambda: int(os.environ.get("TILEWISE_COMPILE_THREADS", "0")))
    cudnn_plans_on_disk: bool = field(default_factory=lambda: os.environ.get("TILEWISE_CUDNN_PLANS", "1") != "0")

    def logs(self, channel: str) -> bool:
        return channel in self.log


settings = Settings()


def log(channel: str, message: str | Callable[[], str]) -> None:
    """Print ``message`` to stderr when ``channel`` is enabled; a callable makes the message only then (a large
    graph's text takes longer to write than the pass that changed it)."""
    if channel in settings.log:
        text = message() if callable(message) else message
        print(f"[tilewise:{channel}] {text}", file=sys.stderr, flush=True)
