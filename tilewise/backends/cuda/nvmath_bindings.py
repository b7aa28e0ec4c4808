"""nvmath-python's raw bindings (cuBLASLt, cuFFT, cuSOLVER, cuBLAS), imported one library at a time.

[Note: importing one nvmath binding]
``import nvmath.bindings.cublasLt`` first runs the initialisers of the packages above it: ``nvmath/__init__.py``
loads every CUDA math library it binds (cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE, cuTENSOR; for CuPy's sake)
and imports its high-level packages, and ``nvmath/bindings/__init__.py`` imports every binding. That costs about
1.4 s on an H200 host, in the first GEMM of every process; tilewise needs one library there. Where nvmath has
not been imported yet, :func:`binding` therefore registers the two packages without running their
initialisers, imports the one binding module, and leaves the packages to finish their initialisers the first
time anything else asks them for an attribute (``nvmath.linalg``, ``nvmath.__version__``, ``from nvmath import
fft``), so that a user's own ``import nvmath`` later gets the whole package, as it would have. A binding module
needs nothing of the package initialisers: they only import the bindings and load the libraries. Where nvmath
is already imported, or registering fails in any way, the binding is imported the ordinary way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

PACKAGES = ("nvmath", "nvmath.bindings")  # parents first
_lock = threading.RLock()
_finishing: list[bool] = [False]


class _Unfinished(types.ModuleType):
    """A package registered with its initialiser not yet run: the first missing attribute runs it."""

    def __getattr__(self, name: str):
        _finish()
        if type(self) is _Unfinished:  # asked while an initialiser runs: as a module half imported
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(self, name)


def _finish() -> None:
    """Run the registered packages' initialisers, in place: the bindings' first (nvmath's own initialiser needs
    every binding imported), then nvmath's. A failing initialiser takes its package out of ``sys.modules``, as a
    failing import does."""
    with _lock:
        if _finishing[0]:
            return
        _finishing[0] = True
        try:
            for name in reversed(PACKAGES):
                module = sys.modules.get(name)
                if type(module) is _Unfinished:
                    module.__class__ = types.ModuleType
                    try:
                        module.__spec__.loader.exec_module(module)
                    except BaseException:
                        sys.modules.pop(name, None)
                        raise
        finally:
            _finishing[0] = False


def _register() -> bool:
    """Register nvmath and nvmath.bindings without running their initialisers; False where that is not
    possible (nvmath is not installed, or is imported already)."""
    if any(name in sys.modules for name in PACKAGES):
        return False
    made = []
    try:
        parent = None
        for name in PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                raise ImportError(name)
            module = importlib.util.module_from_spec(spec)
            module.__class__ = _Unfinished
            sys.modules[name] = module
            made.append(name)
            if parent is not None:
                setattr(parent, name.rpartition(".")[2], module)
            parent = module
    except Exception:
        for name in made:
            sys.modules.pop(name, None)
        return False
    return True


def binding(name: str) -> types.ModuleType:
    """``nvmath.bindings.<name>`` (``cublasLt``, ``cufft``, ``cusolverDn``, ``cublas``), without the package
    initialisers where nvmath is not imported yet (see [Note: importing one nvmath binding]); ImportError where
    nvmath-python is not installed."""
    full = f"nvmath.bindings.{name}"
    found = sys.modules.get(full)
    if found is not None:
        return found
    with _lock:
        unfinished = _register() or type(sys.modules.get(PACKAGES[0])) is _Unfinished
        try:
            return importlib.import_module(full)
        except Exception:
            if not unfinished:
                raise
        # the binding would not import alone: finish the packages, as an ordinary import would have, and retry
        _finish()
        return importlib.import_module(full)
