"""Thread counts of the CPU backend: torch.set_num_threads and friends.

[Note: CPU threads] The CPU backend's only multithreaded work is BLAS (numpy's OpenBLAS: matmul, linalg);
numpy's elementwise loops and the compiler's C target are single-threaded. ``set_num_threads`` therefore sets
the thread count of the BLAS libraries numpy loaded, through threadpoolctl (which finds them, OpenBLAS, MKL or
BLIS, and calls their own setters). Where none is found the count is kept and reported, and changes nothing.
tilewise has no inter-op thread pool: ``set_num_interop_threads`` keeps the number, with torch's rule that it
can be set once.
"""

from __future__ import annotations

import os

_counts: dict[str, int | None] = {"intra": None, "interop": None}


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
    """The number of threads CPU operators use (torch.set_num_threads): OpenBLAS's, for matrix products.

    >>> import tilewise as tw
    >>> before = tw.get_num_threads()
    >>> tw.set_num_threads(1); tw.get_num_threads()
    1
    >>> tw.set_num_threads(before)
    """
    _check_count(n, "set_num_threads")
    import numpy  # noqa: F401 — loads numpy's BLAS, which threadpoolctl then finds
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")  # stays in force: the returned context is not exited
    _counts["intra"] = n


def get_num_threads() -> int:
    """The number of threads CPU operators use: numpy's BLAS's count where it has one."""
    counts = blas_thread_counts()
    if counts:
        return max(counts)
    return _counts["intra"] or _cpu_count()


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
    return _counts["interop"] or get_num_threads()


def init_num_threads() -> None:
    """torch.init_num_threads: set up the calling thread's intra-op pool; numpy's BLAS pool needs no set-up."""
