"""DLPack both ways: ``Tensor.__dlpack__``/``__dlpack_device__`` and ``tilewise.from_dlpack``.

[Note: DLPack] DLPack is a C struct handed over in a PyCapsule: a pointer, a device, a dtype code, shape
and strides in elements, and a deleter the consumer calls when it no longer needs the memory. Both
directions here are zero-copy. Exporting builds the struct with ctypes and keeps the exported tensor
(hence its storage) alive in ``_EXPORTED`` until the consumer's deleter runs — or until the capsule is
garbage-collected unconsumed, which its destructor handles. Importing reads the struct, wraps the memory
in a flat numpy buffer for the Storage, and calls the producer's deleter when that buffer dies, so every
view and every ``.numpy()`` array made from the tensor keeps the producer's memory alive. Both the
legacy capsule (``"dltensor"``) and the versioned one of DLPack 1.x (``"dltensor_versioned"``) are
produced and understood. Only CPU memory is exchanged for now.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from tilewise import dtypes
from tilewise.device import cpu
from tilewise.storage import Storage
from tilewise.strides import contiguous_strides
from tilewise.tensor import Tensor

_CPU = 1
_CUDA = 2
_CUDA_HOST = 3
_VERSION = (1, 0)


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _ManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# DLPack type codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12
_CODES = {
    dtypes.bool_: (6, 8), dtypes.uint8: (1, 8), dtypes.int8: (0, 8), dtypes.int16: (0, 16), dtypes.int32: (0, 32),
    dtypes.int64: (0, 64), dtypes.float16: (2, 16), dtypes.bfloat16: (4, 16), dtypes.float32: (2, 32),
    dtypes.float64: (2, 64), dtypes.float8_e4m3fn: (10, 8), dtypes.float8_e5m2: (12, 8),
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype, _capsule_is_valid.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_char_p)
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype, _capsule_get_pointer.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype, _capsule_set_name.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_char_p)
# the destructor gets a capsule whose refcount is already 0: it must not be touched as a Python object
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid",
                                                                                     ctypes.pythonapi))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer",
                                                                                         ctypes.pythonapi))

# ---------------------------------------------------------------------------- export

_EXPORTED: dict[int, tuple] = {}  # struct address -> everything that must outlive the consumer's use


@_Deleter
def _release_export(address: int) -> None:
    _EXPORTED.pop(address, None)


def _capsule_destructor(name: bytes):
    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def destructor(capsule: int) -> None:
        if _raw_is_valid(capsule, name):  # never consumed: the producer releases it itself
            _release_export(_raw_get_pointer(capsule, name))

    return destructor


_LEGACY_DESTRUCTOR = _capsule_destructor(b"dltensor")
_VERSIONED_DESTRUCTOR = _capsule_destructor(b"dltensor_versioned")


def _fill(dl: _DLTensor, t: Tensor, keep: list) -> None:
    code, bits = _CODES[t.dtype]
    shape = (ctypes.c_int64 * max(t.ndim, 1))(*t.shape)
    strides = (ctypes.c_int64 * max(t.ndim, 1))(*t.stride())
    keep += [shape, strides]
    dl.data = t.data_ptr() if t.numel() else t.untyped_storage().data_ptr()
    dl.device = _Device(*_device_tuple(t))
    dl.ndim = t.ndim
    dl.dtype = _DataType(code, bits, 1)
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    dl.byte_offset = 0


def _device_tuple(t: Tensor) -> tuple[int, int]:
    if t.device.type == "cpu":
        return _CPU, 0
    return _CUDA, t.device.index or 0


def _dlpack(self: Tensor, *, stream=None, max_version=None, dl_device=None, copy: bool | None = None):
    """Export this tensor as a DLPack capsule (zero-copy unless ``copy=True``)."""
    if self.requires_grad:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    if self.device.type != "cpu":
        raise BufferError(f"__dlpack__: tilewise exchanges CPU tensors only for now; this one is on {self.device}. "
                          "Copy it with .cpu() first")
    if dl_device is not None and tuple(dl_device) != (_CPU, 0):
        raise BufferError(f"__dlpack__: cannot export a CPU tensor to DLPack device {tuple(dl_device)}")
    if copy is True:
        self = self.clone()
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    managed = _ManagedTensorVersioned() if versioned else _ManagedTensor()
    keep: list = [self.detach(), managed]
    _fill(managed.dl_tensor, self, keep)
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _EXPORTED[address] = tuple(keep)
    if versioned:
        managed.version = _Version(*_VERSION)
        return _capsule_new(address, b"dltensor_versioned", ctypes.cast(_VERSIONED_DESTRUCTOR, ctypes.c_void_p))
    return _capsule_new(address, b"dltensor", ctypes.cast(_LEGACY_DESTRUCTOR, ctypes.c_void_p))


def _dlpack_device(self: Tensor) -> tuple[int, int]:
    return _device_tuple(self)


Tensor.__dlpack__ = _dlpack
Tensor.__dlpack_device__ = _dlpack_device


def to_dlpack(tensor: Tensor):
    """A legacy (unversioned) DLPack capsule sharing ``tensor``'s memory, as torch.to_dlpack (which exports a
    tensor that requires grad too, as its data)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"to_dlpack(): argument 'data' (position 1) must be Tensor, not {type(tensor).__name__}")
    return _dlpack(tensor.detach())

# ---------------------------------------------------------------------------- import


def _capsule_of(obj):
    if type(obj).__name__ == "PyCapsule":
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack(): expected an object with __dlpack__ (a numpy array, a torch tensor, ...) or a "
                        f"DLPack capsule, got {type(obj).__name__}")
    try:
        return obj.__dlpack__(max_version=_VERSION)
    except TypeError:  # producers that predate DLPack 1.0 take no max_version
        return obj.__dlpack__()


def _consume(capsule) -> tuple[int, ctypes.Structure]:
    """Take ownership of the capsule: return the managed struct and its address."""
    for name, struct_type in ((b"dltensor_versioned", _ManagedTensorVersioned), (b"dltensor", _ManagedTensor)):
        if _capsule_is_valid(capsule, name):
            address = _capsule_get_pointer(capsule, name)
            _capsule_set_name(capsule, b"used_" + name)
            managed = struct_type.from_address(address)
            if struct_type is _ManagedTensorVersioned and managed.version.major > _VERSION[0]:
                raise BufferError(f"from_dlpack(): DLPack version {managed.version.major}.{managed.version.minor} "
                                  f"is newer than the {_VERSION[0]}.x this tilewise understands")
            return address, managed
    raise ValueError("from_dlpack(): the capsule is not an unconsumed 'dltensor' or 'dltensor_versioned'; a DLPack "
                     "capsule can be consumed only once")


def _release(address: int, managed) -> None:
    if managed.deleter:
        managed.deleter(address)


def from_dlpack(ext) -> Tensor:
    """A tilewise tensor sharing memory with any DLPack producer (numpy array, torch tensor, capsule).

    >>> import numpy as np, tilewise as tw
    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> t = tw.from_dlpack(a)
    >>> a[0, 0] = 7.0
    >>> t[0, 0].item()
    7.0
    """
    if isinstance(ext, Tensor):
        return ext
    address, managed = _consume(_capsule_of(ext))
    try:
        dtype, shape, strides, span = _layout(managed.dl_tensor)
    except Exception:
        _release(address, managed)
        raise
    dl = managed.dl_tensor
    nbytes = span * dtype.itemsize
    start = (dl.data or 0) + dl.byte_offset
    buffer = (ctypes.c_uint8 * nbytes).from_address(start) if nbytes else (ctypes.c_uint8 * 0)()
    weakref.finalize(buffer, _release, address, managed)
    flat = np.frombuffer(buffer, dtype=dtype.np, count=span)
    return Tensor._make(Storage(flat, cpu, dtype, span), shape, strides, 0, dtype, cpu)


def _layout(dl: _DLTensor) -> tuple:
    """(dtype, shape, strides, span in elements) of a CPU DLTensor, or a BufferError saying what is unsupported."""
    if dl.device.device_type not in (_CPU, _CUDA_HOST):
        raise BufferError(f"from_dlpack(): tilewise imports CPU memory only for now; got DLPack device type "
                          f"{dl.device.device_type} (2 is CUDA). Move the tensor to the CPU first")
    dtype = _DTYPES.get((dl.dtype.code, dl.dtype.bits))
    if dtype is None or dl.dtype.lanes != 1:
        raise BufferError(f"from_dlpack(): unsupported DLPack dtype (code={dl.dtype.code}, bits={dl.dtype.bits}, "
                          f"lanes={dl.dtype.lanes}); tilewise supports {', '.join(d.name for d in _CODES)}")
    shape = tuple(dl.shape[k] for k in range(dl.ndim))
    if dl.strides:
        strides = tuple(dl.strides[k] for k in range(dl.ndim))
    else:
        strides = tuple(contiguous_strides(shape))
    if any(s < 0 for s in strides):
        raise BufferError(f"from_dlpack(): negative strides {list(strides)} are not supported; copy the array first")
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    return dtype, shape, strides, span
