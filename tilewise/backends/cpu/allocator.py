"""How the process allocates host memory for the CPU backend's arrays: glibc's malloc, set to keep what is freed.

[Note: host allocator] numpy takes every array larger than its small-block cache from malloc, and glibc serves
large blocks with ``mmap`` and returns them with ``munmap`` (and trims the heap top when it is freed): each
eager operator's multi-megabyte temporary is page-faulted in, zeroed by the kernel and handed back, every
step. Measured on 2 cores, a chain of pointwise operators ran 3-5x slower than its arithmetic, and a small
nanoGPT eager step about 25% slower (200-250 ms against 150-200 ms under load). PyTorch keeps its CPU tensors
in the same malloc; tilewise asks malloc, once when the CPU backend loads, to serve blocks below 32 MiB from
the heap and to keep up to 1 GiB of freed heap (the memory is reused by the next step's temporaries, not
leaked). ``TILEWISE_CPU_MALLOC=0`` leaves malloc as the C library set it; on a C library without glibc's
``mallopt`` nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters (malloc.h)
KEEP = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20))

_state = {"kept": None}  # whether malloc keeps freed memory: None before the first attempt


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks for reuse (see the note); True when it agreed. Done once."""
    if _state["kept"] is None:
        _state["kept"] = _mallopt_all(KEEP)
    return _state["kept"]


def _mallopt_all(settings: tuple) -> bool:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return all(libc.mallopt(param, value) for param, value in settings)
