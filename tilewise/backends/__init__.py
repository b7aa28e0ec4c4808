"""Backends: one module per device type, each with ``run(op, args, device)``.

The CPU backend is always present; the CUDA backend registers itself when the ``[cuda]`` extra is
installed and a GPU is found. Beside them live torch.backends' global settings: ``flags.py`` holds their state
(see [Note: backend flags]); ``cudnn``, ``mkldnn`` and ``mps`` are torch's modules of those names, and
``tilewise.backends.cuda`` and ``tilewise.backends.cuda.matmul`` carry torch.backends.cuda's functions and flags,
all importable without the GPU packages.
"""

from __future__ import annotations

import importlib

from tilewise.device import Device, as_device
from tilewise.device import cpu as _cpu_device
from tilewise.dispatch import BACKENDS, register_backend

_default_device: Device = _cpu_device


def default_device() -> Device:
    return _default_device


def set_default_device(device) -> None:
    global _default_device
    _default_device = as_device(device)


def get_default_device() -> Device:
    return _default_device


def backend_for(device: Device):
    backend = BACKENDS.get(device.type)
    if backend is None:
        raise RuntimeError(f"no backend for device {device}: CUDA needs the [cuda] extra and a GPU "
                           "(tilewise.cuda.is_available() says whether one was found)")
    return backend


def load() -> None:
    cpu_backend = importlib.import_module("tilewise.backends.cpu")
    cpu_backend._load_kernels()
    register_backend("cpu", cpu_backend)
    cuda = importlib.import_module("tilewise.cuda")  # tilewise.cuda works (and says False) without a GPU
    if cuda.is_available():
        cuda_backend = importlib.import_module("tilewise.backends.cuda")
        cuda_backend._load_kernels()
        register_backend("cuda", cuda_backend)
