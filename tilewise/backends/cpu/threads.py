"""Thread counts of the CPU backend: torch.set_num_threads and friends.

[Note: CPU threads] The CPU backend's only multithreaded work is BLAS (numpy's OpenBLAS: matmul, linalg);
numpy's elementwise loops and the compiler's C target are single-threaded. ``set_num_threads`` therefore sets
OpenBLAS's thread count, through the library numpy loaded (found among numpy's bundled libraries or the
process's mapped ones, and called by its exported ``openblas_set_num_threads`` symbol, whose name the numpy
wheels suffix). Where no OpenBLAS is found (numpy built on another BLAS) the count is kept and reported, and
changes nothing. tilewise has no inter-op thread pool: ``set_num_interop_threads`` keeps the number, with
torch's rule that it can be set once.
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

_SYMBOLS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")


class _Blas:
    """The OpenBLAS numpy uses, with its thread-count setter and getter (None where none was found)."""

    def __init__(self) -> None:
        self.set = self.get = None
        for path in _candidate_libraries():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in _SYMBOLS:
                setter = getattr(lib, name, None)
                getter = getattr(lib, name.replace("set_", "get_"), None)
                if setter is not None and getter is not None:
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    self.set, self.get = setter, getter
                    return


def _candidate_libraries() -> list[str]:
    import numpy

    root = Path(numpy.__file__).parent
    found = [p for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*.dll")
             for p in glob.glob(str(root / pattern))]
    try:
        with open("/proc/self/maps") as maps:
            found += sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        pass
    return found


_blas: list[_Blas] = []
_counts: dict[str, int | None] = {"intra": None, "interop": None}


def _library() -> _Blas:
    if not _blas:
        _blas.append(_Blas())
    return _blas[0]


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
    blas = _library()
    if blas.set is not None:
        blas.set(n)
    _counts["intra"] = n


def get_num_threads() -> int:
    """The number of threads CPU operators use: OpenBLAS's count where numpy has OpenBLAS."""
    blas = _library()
    if blas.get is not None:
        return int(blas.get())
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
