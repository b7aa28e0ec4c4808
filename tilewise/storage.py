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
    """The memory of one or more tensors, and what ``Tensor.untyped_storage()`` returns: torch's ``UntypedStorage``
    (``tilewise.UntypedStorage``), counted in bytes by its public methods (``size()``, ``nbytes()``, ``len``).
    ``numel`` counts elements of ``dtype``, the type the buffer was made with; a tensor over it may read the
    bytes as another dtype (``view(dtype)``, ``view_as_real``, ``set_`` of an untyped storage). The methods that
    need operators (``copy_``, ``fill_``, ``resize_``, ...) are installed by ``tilewise.ops.storage_api``."""

    __slots__ = ("data", "device", "dtype", "numel", "version", "__weakref__", "__dict__")

    inference = False  # set, in the instance, on the memory of inference tensors (see [Note: inference tensors])
    shared = False  # set, in the instance, on memory shared between processes (a DataLoader worker's batches)
    # writes through ``Tensor.data`` (and its views), counted in ``version`` too: autograd's version of the memory is
    # ``version - untracked``, so such writes stay invisible to it, as torch's ``.data`` has a version counter of its
    # own, while caches keyed on ``version`` still see every write
    untracked = 0
    # False, in the instance, on memory the storage does not own (numpy arrays, buffers, files, DLPack capsules),
    # which ``resize_`` refuses as torch does
    resizable_memory = True
    filename = None  # the file a storage of ``from_file`` maps

    def __init__(self, data, device: Device, dtype: DType, size: int):
        self.data = data
        self.device = device
        self.dtype = dtype
        self.numel = size  # in elements of ``dtype``
        self.version = 0

    @classmethod
    def from_numpy(cls, flat: np.ndarray, dtype: DType) -> Storage:
        return cls(flat, cpu, dtype, flat.shape[0])

    def nbytes(self) -> int:
        """The storage's size in bytes (``UntypedStorage.nbytes()``)."""
        return self.numel * self.dtype.itemsize

    def size(self) -> int:
        """The storage's size in bytes, as an untyped storage counts it."""
        return self.numel * self.dtype.itemsize

    __len__ = size

    def element_size(self) -> int:
        """1, as an untyped storage's: ``Tensor.untyped_storage()`` counts bytes."""
        return 1

    def data_ptr(self) -> int:
        if not self.numel:
            return 0  # torch: an empty storage points at nothing
        if self.device.type == "cpu":
            return self.data.ctypes.data
        return int(self.data.ptr)

    def get_device(self) -> int | None:
        """The CUDA device's index, None on the CPU (as torch's storages answer)."""
        return self.device.index if self.device.type == "cuda" else None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    is_sparse = is_sparse_csr = False

    def resizable(self) -> bool:
        """Whether ``resize_`` may reallocate the memory (False for memory the storage does not own)."""
        return self.resizable_memory and not self.shared


def is_storage(obj, /) -> bool:
    """Whether ``obj`` is a storage (what ``Tensor.untyped_storage()`` returns), as torch.is_storage."""
    return isinstance(obj, Storage)


def empty_cpu(numel: int, dtype: DType) -> Storage:
    return Storage(np.empty(numel, dtype.np), cpu, dtype, numel)
