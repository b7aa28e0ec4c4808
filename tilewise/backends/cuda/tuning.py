"""When the libraries' candidate algorithms are timed: cuDNN's convolution plans and cuBLASLt's GEMM algorithms.

[Note: library algorithm choice]
Both libraries rank their candidates by heuristics. By default the first is taken, as torch takes it: timing
the candidates costs about 70 ms a GEMM shape (each candidate's kernel is loaded, warmed and timed), which was a
second or more of a compiled transformer step's first call, for steady-state steps that measured within 4%
either way (GPT-2 17.64 ms timed / 17.21 ms first choice, Llama 16.49 / 16.70, ViT-B/16 21.10 / 21.96 on an
H200). Candidates are timed on the real operands, the fastest kept and remembered on disk
(``$TILEWISE_CACHE_DIR/cudnn``, ``.../cublaslt``) for later processes: while a ``mode="max-autotune"``
compiled function runs for the first time (:func:`tuning`), with ``tilewise.backends.cudnn.benchmark`` set
(convolutions) or with ``TILEWISE_GEMM_TUNE=1`` (GEMMs). A choice remembered by an earlier process is used
whenever it is found (for GEMMs, unless ``TILEWISE_GEMM_TUNE=0``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_state = threading.local()


@contextmanager
def tuning():
    """Time the libraries' candidates of every new convolution and GEMM inside (``mode="max-autotune"``'s first
    run)."""
    previous = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous


def active() -> bool:
    """Whether this thread is inside :func:`tuning`."""
    return getattr(_state, "on", False)
