"""Storage: a flat, typed buffer on one device, shared by every view of it.

[Note: storage] On the CPU the buffer is a one-dimensional numpy array; on CUDA it is a device allocation
from the caching allocator (``data`` is then an object with ``ptr`` and ``nbytes``). The storage also
carries the version counter that in-place operators bump and autograd checks, so every view of one
buffer sees the same version, as in torch.

[Note: inference tensors] A tensor made inside ``tilewise.inference_mode`` is an *inference tensor*, as in torch:
it may not be written in place, nor saved for backward, nor made to require grad outside the mode. What makes
one is its memory, so the flag is the storage's (``Storage.inference``): every view of an inference tensor,
made inside the mode or after it, ``detach()`` and ``.data`` among them, is one too, at no cost to any view
operator, while a view of a normal tensor made inside the mode shares normal memory and stays normal (torch
marks it the same way). Only the dispatcher's Inference key and the tensor factories that bypass it set the
flag, and only inside the mode; everywhere else it is read from the class default, which costs no lookup
in the instance's (never created) ``__dict__``. The refusals are checked where they are already rare: in-place
writes (``ops/inplace.py``), saving for backward (``autograd/graph.py``) and ``requires_grad_``.
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
    __slots__ = ("data", "device", "dtype", "size", "version", "__weakref__", "__dict__")

    inference = False  # set, in the instance, on the memory of inference tensors (see [Note: inference tensors])
    shared = False  # set, in the instance, on memory shared between processes (a DataLoader worker's batches)
    # writes through ``Tensor.data`` (and its views), counted in ``version`` too: autograd's version of the memory is
    # ``version - untracked``, so such writes stay invisible to it, as torch's ``.data`` has a version counter of its
    # own, while caches keyed on ``version`` still see every write
    untracked = 0

    def __init__(self, data, device: Device, dtype: DType, size: int):
        self.data = data
        self.device = device
        self.dtype = dtype
        self.size = size  # in elements
        self.version = 0

    @classmethod
    def from_numpy(cls, flat: np.ndarray, dtype: DType) -> Storage:
        return cls(flat, cpu, dtype, flat.shape[0])

    def nbytes(self) -> int:
        """The storage's size in bytes (``UntypedStorage.nbytes()``)."""
        return self.size * self.dtype.itemsize

    def element_size(self) -> int:
        """1, as an untyped storage's: ``Tensor.untyped_storage()`` counts bytes."""
        return 1

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
