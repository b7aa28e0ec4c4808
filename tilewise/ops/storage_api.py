"""torch's storage API over tilewise's storages: ``UntypedStorage`` (what ``Tensor.untyped_storage()`` returns),
the deprecated ``TypedStorage`` of ``Tensor.storage()`` and its legacy classes (``FloatStorage``, ...),
``Tensor.set_``, ``torch.from_file``.

[Note: storage API] A tilewise ``Storage`` (``tilewise/storage.py``) is already the one object every view of a
memory shares, so it is torch's ``UntypedStorage`` itself: ``x.untyped_storage() is x[1:].untyped_storage()`` and
it lives exactly as long as the memory, as in torch. Its buffer is typed (``numel`` elements of ``dtype``, the type
it was made with), but the public methods count bytes. The methods that need operators are written once here over
two flat tensors of the storage: its bytes (``uint8``, for ``copy_``, ``fill_``, ``[i]``) and its elements (for
``clone``, ``cpu``, ``cuda``), so they run on every device through the usual kernels and the CUDA allocator.
``UntypedStorage`` the class is a front whose constructor makes a storage and whose ``isinstance`` asks for a
``Storage``: the constructor of ``Storage`` itself stays the internal one that every tensor factory calls.

``resize_`` replaces the buffer of the storage object in place, so every tensor over it sees the new memory, as in
torch (FSDP frees a parameter's memory with ``resize_(0)`` and brings it back with ``resize_(n)`` and ``copy_``);
on the CPU the numpy views that tensors over it cached are dropped. A tensor read while its storage is too small
for it is refused (torch reads freed memory); on CUDA such a read is, as in torch, the caller's error.
Writes through a storage are counted in the storage's version for caches but hidden from autograd, as torch's
storage writes do not touch any tensor's version counter.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise._grad_mode import is_grad_enabled, no_grad
from tilewise.device import Device, as_device
from tilewise.device import cpu as CPU
from tilewise.ops.inplace import check_inference_write
from tilewise.storage import Storage
from tilewise.tensor import Size, Tensor, from_array

# ---------------------------------------------------------------------------- flat tensors over a storage


def _bytes_of(storage: Storage) -> Tensor:
    """The storage's bytes as a 1-D uint8 tensor; its writes are hidden from autograd (see the note)."""
    t = Tensor._make(storage, (storage.nbytes(),), (1,), 0, dtypes.uint8, storage.device)
    t._untracked = True
    return t


def _elements_of(storage: Storage, dtype=None) -> Tensor:
    """The storage's memory as a 1-D tensor of ``dtype`` (default: the type it was made with)."""
    dtype = dtype or storage.dtype
    t = Tensor._make(storage, (storage.nbytes() // dtype.itemsize,), (1,), 0, dtype, storage.device)
    t._untracked = True
    return t


def _empty_storage(nbytes: int, device: Device, dtype=dtypes.uint8) -> Storage:
    from tilewise.ops.creation import empty

    return empty(nbytes // dtype.itemsize, dtype=dtype, device=device)._storage


def _check_nbytes(size, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise RuntimeError(f"{what} expects an int, but got {type(size).__name__}")
    if size < 0:
        raise RuntimeError(f"{what}: alloc_cpu() seems to have been called with negative number: {size % 2**64}")
    return size


# ---------------------------------------------------------------------------- UntypedStorage's methods

def resize_(self: Storage, size: int) -> Storage:
    """Give the storage ``size`` bytes in place, keeping the bytes both sizes hold (see [Note: storage API])."""
    size = _check_nbytes(size, "resize_")
    if not self.resizable():
        raise RuntimeError("Trying to resize storage that is not resizable")
    dtype = self.dtype if size % self.dtype.itemsize == 0 else dtypes.uint8
    new = _empty_storage(size, self.device, dtype)
    keep = min(size, self.nbytes())
    if keep:
        with no_grad():
            _bytes_of(new)[:keep].copy_(_bytes_of(self)[:keep])
    data = new.data
    if self.device.type == "cpu" and not size:
        data = np.empty(1, dtype.np)  # numpy checks a view's extent against any buffer but an empty one
    self.data, self.dtype, self.numel = data, dtype, new.numel
    self.version += 1  # a cache keyed on the version must not reuse what it read from the old memory
    self.untracked += 1
    if self.device.type == "cpu":
        _forget_host_views(self)
    return self


def _forget_host_views(storage: Storage) -> None:
    """Drop the numpy views that tensors over ``storage`` cached of its old buffer (rare: CPU ``resize_``)."""
    for holder in gc.get_referrers(storage):
        if type(holder) is Tensor and holder._storage is storage:
            holder._array = None


def _as_untyped(src, what: str) -> Storage:
    if isinstance(src, TypedStorage):
        return src._untyped_storage
    if not isinstance(src, Storage):
        raise TypeError(f"{what}(): argument 'src' (position 1) must be Storage, not {type(src).__name__}")
    return src


def copy_(self: Storage, src, non_blocking: bool = False) -> Storage:
    """Copy the bytes of ``src`` (a storage of the same size in bytes, on any device) into this storage."""
    src = _as_untyped(src, "copy_")
    if src.nbytes() != self.nbytes():
        raise RuntimeError(f"size does not match, self was {self.nbytes()} bytes but src was {src.nbytes()} bytes")
    if self.nbytes():
        with no_grad():
            _bytes_of(self).copy_(_bytes_of(src), non_blocking=non_blocking)
    return self


def _byte_value(value, what: str) -> int:
    if not isinstance(value, (int, np.integer)):
        raise RuntimeError(f"{what} expects int, but got {type(value).__name__}")
    return int(value) % 256  # torch stores the low byte


def fill_(self: Storage, value) -> Storage:
    """Set every byte to ``value`` (its low byte, as torch)."""
    value = _byte_value(value, "fill_")
    if self.nbytes():
        with no_grad():
            _bytes_of(self).fill_(value)
    return self


def tolist(self: Storage) -> list:
    """The bytes as a list of ints."""
    return _bytes_of(self).tolist()


def _byte_index(self: Storage, index, setting: bool = False) -> int:
    """The byte ``index`` names, with torch's errors: reading counts a negative index from the end (an index out
    of range is reported counted from the start, as torch reports it); writing takes 0 <= index < size only."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise (RuntimeError if setting else TypeError)(
            f"can't index a tilewise.UntypedStorage with {type(index).__name__}")
    n = self.nbytes()
    if setting:
        if not 0 <= index < n:
            raise RuntimeError(f"out of bounds: byte {index} of a storage of {n} bytes (writing takes an index "
                               f"from 0 to {n - 1})")
        return int(index)
    wrapped = int(index) + n if index < 0 else int(index)
    if not 0 <= wrapped < n:
        raise IndexError(f"index {wrapped} out of range for storage of size {n}")
    return wrapped


def __getitem__(self: Storage, index):  # noqa: N807 — the protocol's method
    """``s[i]``, a byte as an int; ``s[a:b]``, a storage of those bytes sharing their memory (CPU only)."""
    if isinstance(index, slice):
        start, stop, step = index.indices(self.nbytes())
        if step != 1:
            raise RuntimeError(f"Trying to slice with a step of {step}, but only a step of 1 is supported")
        if self.device.type != "cpu":
            raise NotImplementedError(f"slicing a storage on {self.device} is not supported; use a tensor view "
                                      "of its memory (tensor[a:b]) instead")
        data = _bytes_of(self)._np()[start:max(start, stop)] if self.nbytes() else np.empty(0, np.uint8)
        part = Storage(data, CPU, dtypes.uint8, data.shape[0])
        part.resizable_memory = False
        return part
    return _bytes_of(self)[_byte_index(self, index)].item()


def __setitem__(self: Storage, index, value) -> None:  # noqa: N807
    value = _byte_value(value, "__setitem__")
    if not isinstance(index, slice):
        index = _byte_index(self, index, setting=True)
    with no_grad():
        _bytes_of(self)[index] = value


def __repr__(self: Storage) -> str:  # noqa: N807
    values = "\n ".join(map(str, tolist(self))) if self.device.type != "meta" else "..."
    return f" {values}\n[tilewise.storage.UntypedStorage(device={self.device}) of size {self.nbytes()}]"


def clone(self: Storage) -> Storage:
    """A copy of the storage on its device."""
    with no_grad():
        return _elements_of(self).clone()._storage


def to(self: Storage, *, device, non_blocking: bool = False) -> Storage:
    """The storage on ``device``: itself when it is there, otherwise a copy."""
    device = as_device(device)
    if device == self.device:
        return self
    with no_grad():
        return _elements_of(self).to(device, non_blocking=non_blocking)._storage


def cpu(self: Storage) -> Storage:
    return to(self, device=CPU)


def cuda(self: Storage, device=None, non_blocking: bool = False) -> Storage:
    if device is None and self.device.type == "cuda":
        return self
    target = Device("cuda", device) if device is None or isinstance(device, int) else as_device(device)
    return to(self, device=target, non_blocking=non_blocking)


def is_shared(self: Storage) -> bool:
    """Whether the memory is shared between processes: a device's always (as torch counts it), and on the CPU the
    memory of a ``from_file(shared=True)`` mapping or of DataLoader workers' batches."""
    return self.device.type == "cuda" or self.shared


def share_memory_(self: Storage) -> Storage:
    """A no-op for CUDA storages and memory already shared, as in torch; other CPU storages cannot move."""
    if self.device.type == "cpu" and not self.shared:
        raise NotImplementedError("share_memory_(): tilewise's CPU storages cannot move to shared memory; pass tensors "
                                  "between processes with tilewise.save/load or numpy arrays")
    return self


def is_pinned(self: Storage, device="cuda") -> bool:
    return self.device.type == "cpu" and bool(self.numel) and _elements_of(self).is_pinned()


def pin_memory(self: Storage, device="cuda") -> Storage:
    """A copy of this CPU storage in page-locked memory (itself when it already is). Needs CUDA."""
    if self.device.type != "cpu":
        raise TypeError(f"cannot pin '{type_name(self)}' only CPU memory can be pinned")
    if is_pinned(self):
        return self
    with no_grad():
        return _elements_of(self).pin_memory()._storage


def untyped(self: Storage) -> Storage:
    return self


def type_name(self: Storage, dtype=None, non_blocking: bool = False) -> str:
    """``UntypedStorage.type()``: the class's name (conversions to legacy typed classes are not supported)."""
    if dtype is not None:
        raise NotImplementedError("UntypedStorage.type(dtype): converting to a legacy storage class is not supported; "
                                  "use tensors (tensor.to(dtype))")
    return "tilewise.storage.UntypedStorage"


def __deepcopy__(self: Storage, memo) -> Storage:  # noqa: N807
    found = memo.get(id(self))
    if found is None:
        found = memo[id(self)] = clone(self)
    return found


_STORAGE_METHODS = (resize_, copy_, fill_, tolist, __getitem__, __setitem__, __repr__, clone, to, cpu, cuda,
                    is_shared, share_memory_, is_pinned, pin_memory, untyped, __deepcopy__)


# ---------------------------------------------------------------------------- the UntypedStorage class

class _StorageClass(type):
    """``isinstance(x, UntypedStorage)`` is ``isinstance(x, Storage)`` (see [Note: storage API])."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Storage)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, Storage)


class UntypedStorage(metaclass=_StorageClass):
    """torch's ``UntypedStorage``: ``UntypedStorage(nbytes, device=...)`` (uninitialised memory),
    ``UntypedStorage(sequence_of_bytes)``, ``UntypedStorage.from_buffer``, ``UntypedStorage.from_file``.

    >>> import tilewise as tw
    >>> s = tw.UntypedStorage([1, 2, 3])
    >>> s.size(), s.tolist(), isinstance(tw.ones(2).untyped_storage(), tw.UntypedStorage)
    (3, [1, 2, 3], True)
    """

    def __new__(cls, *args, device=None) -> Storage:
        device = CPU if device is None else as_device(device)
        if not args:
            return _empty_storage(0, device)
        if len(args) == 1 and isinstance(args[0], (int, np.integer)) and not isinstance(args[0], bool):
            return _empty_storage(_check_nbytes(int(args[0]), "UntypedStorage"), device)
        if len(args) == 1 and not isinstance(args[0], (str, bytes)) and hasattr(args[0], "__len__"):
            return _from_sequence(list(args[0]), device)
        if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
            return _from_sequence(list(args[0]), device)
        if len(args) == 1 and isinstance(args[0], str):
            raise RuntimeError("tilewise.UntypedStorage(): tried to construct a storage from a sequence (str), but one "
                               "of the items was of type str instead of int")
        got = ", ".join(type(a).__name__ for a in args)
        raise TypeError(f"tilewise.UntypedStorage() received an invalid combination of arguments - got ({got}), but "
                        "expected one of:\n * (*, device = None)\n * (int size, *, device = None)\n"
                        " * (object sequence, *, device = None)")

    @staticmethod
    def from_buffer(buffer, byte_order: str | None = None, dtype=None, count: int = -1, offset: int = 0) -> Storage:
        return from_buffer(buffer, byte_order, dtype, count, offset)

    @staticmethod
    def from_file(filename: str, shared: bool = False, nbytes: int = 0) -> Storage:
        """A storage of ``nbytes`` bytes mapping ``filename`` (writes reach the file when ``shared``)."""
        return _map_file(str(filename), bool(shared), nbytes, dtypes.uint8)


def _from_sequence(values: list, device: Device) -> Storage:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise RuntimeError("tilewise.UntypedStorage(): tried to construct a storage from a sequence (list), but "
                               f"one of the items was of type {type(v).__name__} instead of int")
    data = np.array([int(v) % 256 for v in values], dtype=np.uint8)
    return from_array(data, dtypes.uint8).to(device)._storage


def from_buffer(buffer, byte_order: str | None = None, dtype=None, count: int = -1, offset: int = 0) -> Storage:
    """A new storage holding a copy of ``buffer``'s bytes; with ``dtype`` the elements are read in ``byte_order``
    ('little', 'big' or 'native') and stored in the machine's order."""
    if dtype is None:
        raise RuntimeError("argument 'dtype' cannot be None")
    raw = np.frombuffer(buffer, dtype=np.uint8)
    if byte_order is None:
        raise RuntimeError("function missing required argument 'byte_order' (pos 2)")
    if byte_order not in ("big", "little", "native"):
        raise ValueError(f"invalid byte_order '{byte_order}' (expected 'big', 'little', or 'native')")
    dtype = dtypes.as_dtype(dtype)
    size = dtype.itemsize
    raw = raw[offset:]
    if count >= 0:
        raw = raw[:count * size]
    if raw.shape[0] % size:
        raise ValueError(f"buffer size ({raw.shape[0]}) must be a multiple of element size ({size})")
    elements = raw.reshape(-1, size)
    if byte_order != "native" and byte_order != sys.byteorder:
        elements = elements[:, ::-1]
    return Storage(np.ascontiguousarray(elements).reshape(-1).view(dtype.np), CPU, dtype, elements.shape[0])


# ---------------------------------------------------------------------------- from_file

def _map_file(filename: str, shared: bool, count: int, dtype) -> Storage:
    nbytes = count * dtype.itemsize
    if shared:
        try:
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise RuntimeError(f"unable to open file <{filename}> in read-write mode: {e.strerror} ({e.errno})") \
                from None
        try:
            if os.fstat(fd).st_size < nbytes:
                os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
    elif not os.path.exists(filename):
        raise RuntimeError(f"unable to open file <{filename}> in read-only mode: No such file or directory (2)")
    else:
        have = os.path.getsize(filename)
        if have < nbytes:
            raise RuntimeError(f"file <{filename}> size <{have}> is smaller than the required mapping size "
                               f"<{nbytes}>")
    if count:
        data = np.memmap(filename, dtype=dtype.np, mode="r+" if shared else "c", shape=(count,))
    else:
        data = np.empty(0, dtype.np)
    storage = Storage(data, CPU, dtype, count)
    storage.resizable_memory = False
    if shared:
        storage.shared = True
        storage.filename = filename
    return storage


def from_file(filename, shared: bool | None = None, size: int | None = 0, *, dtype=None, layout=None, device=None,
              pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor of ``size`` elements mapping the file ``filename``: with ``shared`` the file is created or
    extended as needed and writes reach it; without, it must hold the bytes and writes stay private.

    >>> import tempfile, tilewise as tw
    >>> name = tempfile.mktemp()
    >>> tw.from_file(name, shared=True, size=3, dtype=tw.int32).tolist()
    [0, 0, 0]
    """
    dtype = dtypes.get_default_dtype() if dtype is None else dtypes.as_dtype(dtype)
    if device is not None and as_device(device).type != "cpu" or pin_memory:
        raise RuntimeError("from_file: only CPU tensors can map a file; copy the result with .to(device)")
    size = _check_nbytes(0 if size is None else size, "from_file")
    storage = _map_file(os.fspath(filename), bool(shared), size, dtype)
    out = Tensor._make(storage, Size((size,)), (1,), 0, dtype, CPU)
    if requires_grad:
        out.requires_grad_()
    return out


# ---------------------------------------------------------------------------- TypedStorage

_TYPED_STORAGE_WARNING = ("TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the "
                          "only storage class. This should only matter to you if you are using storages directly.  To "
                          "access UntypedStorage directly, use tensor.untyped_storage() instead of tensor.storage()")
_warned = [False]


def _warn_typed_storage_removal(stacklevel: int = 3) -> None:
    """torch's deprecation warning, given once per process as torch gives it."""
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(_TYPED_STORAGE_WARNING, UserWarning, stacklevel=stacklevel)


class TypedStorage:
    """torch's deprecated ``TypedStorage``: an untyped storage (``_untyped_storage``) read as elements of ``dtype``
    (``size()`` counts them). ``Tensor.storage()`` returns one.

    >>> import tilewise as tw, warnings
    >>> warnings.simplefilter("ignore")
    >>> s = tw.arange(3.0).storage()
    >>> s.size(), s.dtype, s.tolist()
    (3, tilewise.float32, [0.0, 1.0, 2.0])
    """

    is_sparse = False

    def __init__(self, *args, device=None, dtype=None, wrap_storage=None, _internal: bool = False):
        if not _internal:
            _warn_typed_storage_removal()
        self.dtype = dtypes.get_default_dtype() if dtype is None else dtypes.as_dtype(dtype)
        if wrap_storage is not None:
            if args or device is not None:
                raise RuntimeError("TypedStorage.__init__ received an invalid combination of arguments: wrap_storage "
                                   "takes no size, data or device")
            self._untyped_storage = _as_untyped(wrap_storage, "TypedStorage")
            return
        device = CPU if device is None else as_device(device)
        if not args:
            self._untyped_storage = _empty_storage(0, device, self.dtype)
        elif len(args) == 1 and isinstance(args[0], (int, np.integer)) and not isinstance(args[0], bool):
            self._untyped_storage = _empty_storage(_check_nbytes(int(args[0]), "TypedStorage") * self.dtype.itemsize,
                                                   device, self.dtype)
        elif len(args) == 1:
            from tilewise.tensor import tensor

            self._untyped_storage = tensor(list(args[0]), dtype=self.dtype, device=device)._storage
        else:
            raise TypeError(f"TypedStorage.__init__ received an invalid combination of arguments: got {args}")

    def _elements(self) -> Tensor:
        return _elements_of(self._untyped_storage, self.dtype)

    @property
    def device(self) -> Device:
        return self._untyped_storage.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def size(self) -> int:
        return self._untyped_storage.nbytes() // self.dtype.itemsize

    __len__ = size

    def nbytes(self) -> int:
        return self._untyped_storage.nbytes()

    def element_size(self) -> int:
        return self.dtype.itemsize

    def data_ptr(self) -> int:
        return self._untyped_storage.data_ptr()

    def get_device(self) -> int | None:
        return self._untyped_storage.get_device()

    def untyped(self) -> Storage:
        return self._untyped_storage

    def tolist(self) -> list:
        return self._elements().tolist()

    def __getitem__(self, index):
        # torch's errors: a slice, then anything but an int (a RuntimeError), then a bool (a TypeError)
        if isinstance(index, slice):
            raise RuntimeError("slices are only supported in UntypedStorage.__getitem__")
        if not isinstance(index, int) or type(index) is not int:
            raise (TypeError if isinstance(index, int) else RuntimeError)(
                f"can't index a {type(self)} with {type(index)}")
        n = self.size()
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for storage of size {n}")
        return self._elements()[index % n].item()

    def __setitem__(self, index, value) -> None:
        # torch writes through a tensor of the elements: an int or a slice, with a tensor index's errors
        if not isinstance(index, (int, slice)):
            raise RuntimeError(f"can't index a {type(self)} with {type(index)}")
        with no_grad():
            self._elements()[index] = value

    def fill_(self, value) -> TypedStorage:
        with no_grad():
            self._elements().fill_(value)
        return self

    def copy_(self, source, non_blocking: bool = False) -> TypedStorage:
        if isinstance(source, TypedStorage):
            with no_grad():
                self._elements().copy_(source._elements(), non_blocking=non_blocking)
        else:
            copy_(self._untyped_storage, source, non_blocking)
        return self

    def _wrap(self, storage: Storage) -> TypedStorage:
        return TypedStorage(wrap_storage=storage, dtype=self.dtype, _internal=True)

    def clone(self) -> TypedStorage:
        return self._wrap(clone(self._untyped_storage))

    def cpu(self) -> TypedStorage:
        return self if self.device.type == "cpu" else self._wrap(cpu(self._untyped_storage))

    def cuda(self, device=None, non_blocking: bool = False) -> TypedStorage:
        return self._wrap(cuda(self._untyped_storage, device, non_blocking))

    def to(self, *, device, non_blocking: bool = False) -> TypedStorage:
        return self._wrap(to(self._untyped_storage, device=device, non_blocking=non_blocking))

    def resize_(self, size: int) -> None:
        resize_(self._untyped_storage, _check_nbytes(size, "resize_") * self.dtype.itemsize)

    def is_shared(self) -> bool:
        return is_shared(self._untyped_storage)

    def share_memory_(self) -> TypedStorage:
        share_memory_(self._untyped_storage)
        return self

    def is_pinned(self, device="cuda") -> bool:
        return is_pinned(self._untyped_storage)

    def pin_memory(self, device="cuda") -> TypedStorage:
        return self._wrap(pin_memory(self._untyped_storage))

    def pickle_storage_type(self) -> str:
        return f"{dtypes.c10_name(self.dtype)}Storage"

    def type(self, dtype=None, non_blocking: bool = False) -> str:
        if dtype is not None:
            raise NotImplementedError("TypedStorage.type(dtype): converting storages is not supported; use tensors")
        legacy = storage_class(self.dtype, self.device)
        return f"{legacy.__module__}.{legacy.__name__}" if legacy is not None else "tilewise.storage.TypedStorage"

    def __iter__(self):
        return iter(self.tolist())

    def __deepcopy__(self, memo) -> TypedStorage:
        return self._wrap(__deepcopy__(self._untyped_storage, memo))

    def __repr__(self) -> str:
        values = "\n ".join(map(str, self.tolist())) if self.device.type != "meta" else "..."
        return (f" {values}\n[tilewise.storage.TypedStorage(dtype={self.dtype}, device={self.device}) of size "
                f"{self.size()}]")


# ---------------------------------------------------------------------------- legacy typed classes

class _LegacyStorageClass(type):
    """``isinstance(s, FloatStorage)``: a TypedStorage of float32 on the class's device type, as in torch."""

    def __instancecheck__(cls, obj) -> bool:
        return (isinstance(obj, TypedStorage) and obj.dtype is cls.dtype
                and obj.device.type == cls.device_type)


def _legacy_new(cls, *args, device=None, **kwargs):
    if cls.device_type == "cuda" and device is None:
        device = "cuda"
    return TypedStorage(*args, dtype=cls.dtype, device=device, **kwargs)


_LEGACY = {}
for _device_type, _module in (("cpu", "tilewise"), ("cuda", "tilewise.cuda")):
    for _dtype in (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                   dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool_, dtypes.complex64, dtypes.complex128):
        _cls = _LegacyStorageClass(f"{dtypes.c10_name(_dtype)}Storage", (TypedStorage,),
                                   {"dtype": _dtype, "device_type": _device_type, "__new__": _legacy_new,
                                    "__module__": _module})
        _LEGACY[(_device_type, _dtype)] = _cls
LEGACY_CPU = {cls.__name__: cls for (kind, _), cls in _LEGACY.items() if kind == "cpu"}
LEGACY_CUDA = {cls.__name__: cls for (kind, _), cls in _LEGACY.items() if kind == "cuda"}


def storage_class(dtype, device: Device):
    """The legacy storage class of ``dtype`` on ``device``'s type (``FloatStorage``); None for dtypes without one."""
    return _LEGACY.get((device.type, dtype))


# ---------------------------------------------------------------------------- Tensor methods

def storage(self: Tensor) -> TypedStorage:
    """The tensor's memory as a deprecated ``TypedStorage`` of its dtype (prefer ``untyped_storage()``)."""
    _warn_typed_storage_removal()
    return TypedStorage(wrap_storage=self._storage, dtype=self._dtype, _internal=True)


def storage_type(self: Tensor):
    """The legacy storage class of the tensor's dtype and device (``tilewise.FloatStorage``)."""
    return storage_class(self._dtype, self._device)


def is_set_to(self: Tensor, tensor: Tensor) -> bool:
    """Whether both tensors view the same storage at the same offset, sizes and strides."""
    return (self._storage is tensor._storage and self._storage is not None
            and self.storage_offset() == tensor.storage_offset()
            and tuple(self.shape) == tuple(tensor.shape) and self.stride() == tensor.stride())


def _set_signature_error(args: tuple) -> TypeError:
    got = ", ".join(type(a).__name__ for a in args)
    return TypeError(f"set_() received an invalid combination of arguments - got ({got}), but expected one of:\n"
                     " * ()\n * (Storage source)\n"
                     " * (Storage source, int storage_offset, tuple of ints size, tuple of ints stride = None)\n"
                     " * (Tensor source)\n"
                     " * (Tensor source, int storage_offset, tuple of ints size, tuple of ints stride = None)")


def _ints(values, args: tuple) -> tuple:
    if not isinstance(values, (tuple, list, Size)) or any(isinstance(v, bool) or not isinstance(v, int)
                                                          for v in values):
        raise _set_signature_error(args)
    return tuple(values)


def _source_storage(self: Tensor, source) -> Storage:
    if isinstance(source, Tensor):
        if source._dtype is not self._dtype:
            raise RuntimeError(f"Could not set tensor of type {dtypes.type_meta_name(source._dtype)} to a tensor of "
                               f"type {dtypes.type_meta_name(self._dtype)}")
        return source._storage
    if isinstance(source, TypedStorage):
        if source.dtype is not self._dtype:
            raise RuntimeError(f"Expected a Storage of type {dtypes.type_meta_name(self._dtype)} or an "
                               f"UntypedStorage, but got type {dtypes.c10_name(source.dtype)} for argument 1 'storage'")
        return source._untyped_storage
    return source


def set_(self: Tensor, *args, **kwargs) -> Tensor:
    """Make ``self`` view ``source``'s memory (a tensor's storage, or a storage) at ``storage_offset`` with ``size``
    and ``stride`` (the source tensor's own view, or all of the storage, when only the source is given); with no
    source, an empty storage. A storage too small for the view grows, as in torch.

    >>> import tilewise as tw
    >>> x = tw.arange(6.0)
    >>> tw.empty(0).set_(x.untyped_storage(), 2, (2, 2), (1, 2)).tolist()
    [[2.0, 4.0], [3.0, 5.0]]
    """
    names = ("source", "storage_offset", "size", "stride")
    if len(args) > 4 or any(k not in names for k in kwargs):
        raise _set_signature_error(args + tuple(kwargs.values()))
    bound = dict(zip(names, args), **kwargs)
    if len(bound) != len(args) + len(kwargs):
        raise _set_signature_error(args + tuple(kwargs.values()))
    source = bound.get("source")
    check_inference_write(self)
    if self._storage is None:
        raise RuntimeError("set_(): a traced or batched tensor has no storage to replace; call set_ outside "
                           "tilewise.compile and vmap")
    if self._requires_grad and is_grad_enabled():
        if self._grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        raise RuntimeError("derivative for set_ is not implemented: set_ on a tensor that requires grad needs "
                           "tilewise.no_grad() or a detached tensor")
    if source is None:
        if len(bound) > 1:
            raise _set_signature_error(args + tuple(kwargs.values()))
        storage, offset, size, stride = _empty_storage(0, self._device, self._dtype), 0, (0,), None
    elif not isinstance(source, (Tensor, Storage, TypedStorage)):
        raise _set_signature_error(args + tuple(kwargs.values()))
    else:
        storage = _source_storage(self, source)
        if len(bound) == 1:
            if isinstance(source, Tensor):
                offset, size, stride = source._offset, tuple(source._shape), source._strides
            else:
                offset, size, stride = 0, (storage.nbytes() // self._dtype.itemsize,), None
        elif "size" not in bound:
            raise _set_signature_error(args + tuple(kwargs.values()))
        else:
            offset = bound.get("storage_offset", 0)
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise _set_signature_error(args + tuple(kwargs.values()))
            size = _ints(bound["size"], args)
            stride = bound.get("stride")
            stride = None if stride is None or stride == () else _ints(stride, args)
    if storage.device != self._device:
        raise RuntimeError(f'Attempted to set the storage of a tensor on device "{self._device}" to a storage on '
                           f'different device "{storage.device}".  This is no longer allowed; the devices must match.')
    if offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {offset}")
    for d in size:
        if d < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {d}: {list(size)}")
    stride = S.contiguous_strides(size) if stride is None else stride
    if len(stride) != len(size):
        raise RuntimeError(f"mismatch in length of strides and shape: sizes {list(size)}, strides {list(stride)}")
    if S.numel(size):
        needed = S.storage_span(size, stride, offset) * self._dtype.itemsize
        if needed > storage.nbytes():
            resize_(storage, needed)
    old = self._storage
    self._storage, self._shape, self._strides, self._offset = storage, Size(size), tuple(stride), offset
    self._array = None
    old.version += 1  # the write every view of the old memory shares, as torch's version counter
    if storage is not old:
        storage.version += 1
    return self


def attach() -> None:
    for fn in _STORAGE_METHODS:
        setattr(Storage, fn.__name__, fn)
    Storage.type = type_name
    for fn in (storage, storage_type, is_set_to, set_):
        setattr(Tensor, fn.__name__, fn)


__all__ = ["UntypedStorage", "TypedStorage", "from_file", "storage_class"]
