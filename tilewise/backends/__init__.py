"""Backends: one package per device type, each registering a :class:`~tilewise.device.Backend` (see [Note: the
Backend protocol] in ``device.py``).

The CPU backend is always present; the CUDA backend registers itself when the ``[cuda]`` extra is
installed and a GPU is found. Beside them live torch.backends' global settings: ``flags.py`` holds their state
(see [Note: backend flags]); ``cudnn``, ``mkldnn`` and ``mps`` are torch's modules of those names, and
``tilewise.backends.cuda`` and ``tilewise.backends.cuda.matmul`` carry torch.backends.cuda's functions and flags,
all importable without the GPU packages.
"""

from __future__ import annotations

from tilewise._cuda_api import is_available as _cuda_is_available
from tilewise.device import (
    BACKENDS,
    Backend,
    backend_for,
    default_device,
    get_default_device,
    register_backend,
    set_default_device,
)

__all__ = ["BACKENDS", "Backend", "backend_for", "default_device", "get_default_device", "load", "register_backend",
           "set_default_device"]


def load() -> None:
    """Register the CPU backend, and the CUDA one where a GPU is found."""
    from tilewise.backends import cpu

    cpu._load_kernels()
    register_backend("cpu", cpu.backend)
    if _cuda_is_available():  # False, without an error, where the [cuda] extra or a GPU is missing
        from tilewise.backends import cuda

        cuda._load_kernels()
        register_backend("cuda", cuda.backend)
