"""Thread counts of the CPU backend: torch.set_num_threads and friends, and how many threads each GEMM gets.

[Note: CPU threads] The CPU backend's multithreaded work is BLAS (numpy's OpenBLAS: matmul, linalg) and the
compiler's C target (OpenMP loops). ``set_num_threads`` sets the count both use (the default, as in torch: the
CPUs this process may run on). A BLAS library keeps its worker threads spinning for a while after each call
(OpenBLAS: about 0.1 s), so on a small machine a multithreaded GEMM leaves its workers competing with
everything that runs next: the Python thread of eager execution, an OpenMP team of a compiled program, or
another process. Measured on 2 cores (nanoGPT step, 2 layers of width 64: GEMMs of 10-40 MFLOP): eager
550 ms with 2 BLAS threads against 110 ms with 1; the compiled step 250-1000 ms against 24 ms. So a GEMM
runs on one BLAS thread unless it is large enough that splitting pays for the spinning
(``GEMM_PARALLEL_MIN_FLOPS``), and then on ``get_num_threads()``. The count is set on the BLAS library
directly (a ctypes call, skipped when it is already right); threadpoolctl finds the library (OpenBLAS, MKL or
BLIS) once. tilewise has no inter-op thread pool: ``set_num_interop_threads`` keeps the number, with torch's
rule that it can be set once.
"""

from __future__ import annotations

import ctypes
import os

from tilewise.codegen.toolchain.cc import openmp_runtime

_counts: dict[str, int | None] = {"intra": None, "interop": None}
GEMM_PARALLEL_MIN_FLOPS = 1 << 28  # 2*m*n*k below which a GEMM runs on one BLAS thread (see the note)
_blas: dict = {"controllers": None, "threads": None}  # the BLAS libraries' controllers; the count last set


def blas_thread_counts() -> list[int]:
    """The thread count of every BLAS library loaded in the process (numpy's), as the libraries report it."""
    import numpy  # noqa: F401 — loads numpy's BLAS, which threadpoolctl then finds
    from threadpoolctl import threadpool_info

    return [int(info["num_threads"]) for info in threadpool_info() if info.get("user_api") == "blas"]


def _check_count(n, what: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise RuntimeError(f"{what} expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError(f"{what} expects a positive integer")
    return n


def set_num_threads(n: int) -> None:
    """The number of threads CPU operators use (torch.set_num_threads): large matrix products' (BLAS) and
    compiled programs' (OpenMP).

    >>> import tilewise as tw
    >>> before = tw.get_num_threads()
    >>> tw.set_num_threads(1); tw.get_num_threads()
    1
    >>> tw.set_num_threads(before)
    """
    _counts["intra"] = _check_count(n, "set_num_threads")
    _set_blas_threads(n)
    _set_openmp_threads(n)


def get_num_threads() -> int:
    """The number of threads CPU operators use (torch.get_num_threads): by default, as in torch, the CPUs this
    process may run on, or fewer where ``OMP_NUM_THREADS`` asks for fewer."""
    return _counts["intra"] or min(_environment_count() or _cpu_count(), _cpu_count())


def _environment_count() -> int | None:
    text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def gemm_threads(flops: float) -> int:
    """The BLAS threads a GEMM of ``flops`` (2*m*n*k) runs on: one unless it is large (see [Note: CPU threads])."""
    return get_num_threads() if flops >= GEMM_PARALLEL_MIN_FLOPS else 1


def use_blas_threads(n: int) -> None:
    """Set the BLAS libraries' thread count to ``n`` before a call (a ctypes call when it changes, else nothing)."""
    if _blas["threads"] != n:
        _set_blas_threads(n)


def _set_blas_threads(n: int) -> None:
    for controller in _blas_controllers():
        controller.set_num_threads(n)
    _blas["threads"] = n


def _set_openmp_threads(n: int) -> None:
    """The OpenMP team size of the compiler's C programs, for the calling thread's later parallel loops."""
    runtime = openmp_runtime()
    if runtime is not None:
        runtime.omp_set_num_threads(ctypes.c_int(n))


def _blas_controllers() -> list:
    if _blas["controllers"] is None:
        import numpy  # noqa: F401 — loads numpy's BLAS, which threadpoolctl then finds
        from threadpoolctl import ThreadpoolController

        _blas["controllers"] = ThreadpoolController().select(user_api="blas").lib_controllers
    return _blas["controllers"]


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_num_interop_threads(n: int) -> None:
    """torch.set_num_interop_threads: kept for ``get_num_interop_threads`` (tilewise has no inter-op pool); as in
    torch, it can be set only once."""
    if _counts["interop"] is not None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work has started or "
                           "set_num_interop_threads called")
    _counts["interop"] = _check_count(n, "set_num_interop_threads")


def get_num_interop_threads() -> int:
    return _counts["interop"] or _cpu_count()


def init_num_threads() -> None:
    """torch.init_num_threads: set up the calling thread's intra-op pool; numpy's BLAS pool needs no set-up."""
