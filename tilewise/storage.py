"""Storage: a flat, typed buffer on one device, shared by every view of it.

[Note: storage] On the CPU the buffer is a one-dimensional numpy array; on CUDA it is a device allocation
from the caching allocator (``data`` is then an object with ``ptr`` and ``nbytes``). The storage also
carries the version counter that in-place operators bump and autograd checks, so every view of one
buffer sees the same version, as in torch.
"""

from __future__ import annotations

import numpy as np

from tilewise.device import Device, cpu
from tilewise.dtypes import DType


class HostOutOfMemoryError(RuntimeError):
    """The CPU could not allocate a buffer (torch raises a RuntimeError from its DefaultCPUAllocator)."""

    def __init__(self, message: str, nbytes: int | None = None):
        super().__init__(message)
        self.nbytes = nbytes


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} PiB"


def out_of_host_memory(what: str, nbytes: int, detail: str) -> HostOutOfMemoryError:
    return HostOutOfMemoryError(f"{what}: DefaultCPUAllocator: not enough memory: you tried to allocate {nbytes} "
                                f"bytes ({human_bytes(nbytes)}) {detail}", nbytes)


class Storage:
    __slots__ = ("data", "device", "dtype", "size", "version", "__weakref__")

    def __init__(self, data, device: Device, dtype: DType, size: int):
        self.data = data
        self.device = device
        self.dtype = dtype
        self.size = size  # in elements
        self.version = 0

    @classmethod
    def from_numpy(cls, flat: np.ndarray, dtype: DType) -> Storage:
        return cls(flat, cpu, dtype, flat.shape[0])

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def data_ptr(self) -> int:
        if self.device.type == "cpu":
            return self.data.ctypes.data if self.size else 0
        return int(self.data.ptr)

    def __repr__(self) -> str:
        return f"Storage(size={self.size}, dtype={self.dtype.name}, device={self.device})"


def is_storage(obj, /) -> bool:
    """Whether ``obj`` is a storage (what ``Tensor.untyped_storage()`` returns), as torch.is_storage."""
    return isinstance(obj, Storage)


def empty_cpu(numel: int, dtype: DType) -> Storage:
    return Storage(np.empty(numel, dtype.np), cpu, dtype, numel)
