"""DLPack both ways: ``Tensor.__dlpack__``/``__dlpack_device__`` and ``tilewise.from_dlpack``.

[Note: DLPack] DLPack is a C struct handed over in a PyCapsule: a pointer, a device, a dtype code, shape
and strides in elements, and a deleter the consumer calls when it no longer needs the memory. Both
directions here are zero-copy. Exporting builds the struct with ctypes and keeps the exported tensor
(hence its storage) alive in ``_EXPORTED`` until the consumer's deleter runs — or until the capsule is
garbage-collected unconsumed, which its destructor handles. Importing reads the struct, wraps the memory
in a flat numpy buffer for the Storage, and calls the producer's deleter when that buffer dies, so every
view and every ``.numpy()`` array made from the tensor keeps the producer's memory alive. Both the
legacy capsule (``"dltensor"``) and the versioned one of DLPack 1.x (``"dltensor_versioned"``) are
produced and understood.

[Note: CUDA DLPack] CUDA memory crosses with a stream handshake (the DLPack spec's ``__dlpack__(stream=)``): the
consumer names the stream it will use the memory on (1: the legacy default stream, 2: the per-thread one, else a
raw handle; -1: no synchronisation; None: the legacy default), and the producer, when that is not the stream its
pending writes are ordered on, records an event on its current stream and makes the consumer's stream wait for it,
so no host synchronisation happens either way. Importing, tilewise is the consumer and names its current stream.
The imported memory is wrapped, not allocated: a ``ForeignMemory`` (``ptr``, ``nbytes``) whose death calls the
producer's deleter, so any view keeps the producer's memory alive, as on the CPU. ``__cuda_array_interface__``
(version 3) is the other protocol CuPy and Numba speak: tilewise tensors expose it (``stream``: their current
stream), and ``from_dlpack`` takes an object that has only it, waits for its ``stream`` in the same way, and keeps
the object alive while the tensor lives.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from tilewise import dtypes
from tilewise.device import Device, cpu
from tilewise.storage import Storage
from tilewise.strides import contiguous_strides
from tilewise.tensor import Tensor, made_here

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


# DLPack type codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12,
# kDLFloat8_e8m0fnu 14, kDLFloat4_e2m1fn 17
_CODES = {
    dtypes.bool_: (6, 8), dtypes.uint8: (1, 8), dtypes.int8: (0, 8), dtypes.int16: (0, 16), dtypes.int32: (0, 32),
    dtypes.int64: (0, 64), dtypes.float16: (2, 16), dtypes.bfloat16: (4, 16), dtypes.float32: (2, 32),
    dtypes.float64: (2, 64), dtypes.float8_e4m3fn: (10, 8), dtypes.float8_e5m2: (12, 8),
    dtypes.float8_e8m0fnu: (14, 8), dtypes.float4_e2m1fn_x2: (17, 4),  # kDLFloat8_e8m0fnu, kDLFloat4_e2m1fn
}
_LANES = {dtypes.float4_e2m1fn_x2: 2}  # torch exports packed FP4 as two 4-bit lanes per element
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
    dl.dtype = _DataType(code, bits, _LANES.get(t.dtype, 1))
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    dl.byte_offset = 0


def _device_tuple(t: Tensor) -> tuple[int, int]:
    if t.device.type == "cpu":
        return _CPU, 0
    return _CUDA, t.device.index or 0


def _dlpack(self: Tensor, *, stream=None, max_version=None, dl_device=None, copy: bool | None = None):
    """Export this tensor as a DLPack capsule (zero-copy unless ``copy=True``); on CUDA, ``stream`` is the
    consumer's (see [Note: CUDA DLPack])."""
    if self.requires_grad:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    if dl_device is not None and tuple(dl_device) != _device_tuple(self):
        raise BufferError(f"__dlpack__: cannot export a tensor on {self.device} to DLPack device {tuple(dl_device)}")
    if self.device.type == "cuda":
        _check_stream_argument(stream)
    if copy is True:
        self = self.clone()
    if self.device.type == "cuda" and stream != -1:
        _order_for_consumer(self.device.index or 0, stream)
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


# ---------------------------------------------------------------------------- CUDA streams (the handshake)

_LEGACY, _PER_THREAD = 1, 2  # DLPack's and CUDA array interface's names for the default streams


def _check_stream_argument(stream) -> None:
    if stream is not None and (type(stream) is not int or stream == 0 or stream < -1):
        raise BufferError(f"__dlpack__: stream must be None, -1, 1, 2 or a CUDA stream handle for a CUDA tensor, got "
                          f"{stream!r} (0 is ambiguous and not allowed)")


def _driver_stream(stream: int | None) -> int:
    """The driver handle of a stream as DLPack names it (None and 1: the legacy default stream)."""
    if stream is None or stream == _LEGACY:
        return 0
    return stream  # 2 is CU_STREAM_PER_THREAD to the driver too


def _current_stream(device: int) -> int:
    from tilewise.backends.cuda.device_memory import stream_handle

    return stream_handle(device)


def _wait(waiter: int, producer: int, device: int) -> None:
    """Make stream ``waiter`` wait for the work queued on ``producer`` so far (an event; the host does not wait)."""
    if waiter == producer:
        return
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import ensure_context

    ensure_context(device)
    cu = driver_api()
    event = check(cu.cuEventCreate(int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
    try:
        check(cu.cuEventRecord(event, producer), "cuEventRecord")
        check(cu.cuStreamWaitEvent(waiter, event, 0), "cuStreamWaitEvent")
    finally:
        check(cu.cuEventDestroy(event), "cuEventDestroy")  # released once the wait has happened


def _order_for_consumer(device: int, stream: int | None) -> None:
    """The producer's side: the consumer's stream waits for this thread's current stream."""
    _wait(_driver_stream(stream), _current_stream(device), device)


def _consumer_stream(device: int) -> int:
    """The stream tilewise consumes on, as DLPack names it (the legacy default stream is 1, never 0)."""
    handle = _current_stream(device)
    return handle if handle else _LEGACY


# ---------------------------------------------------------------------------- __cuda_array_interface__

_TYPESTR = {dtypes.bool_: "|b1", dtypes.uint8: "|u1", dtypes.int8: "|i1", dtypes.int16: "<i2", dtypes.int32: "<i4",
            dtypes.int64: "<i8", dtypes.float16: "<f2", dtypes.float32: "<f4", dtypes.float64: "<f8",
            dtypes.complex64: "<c8", dtypes.complex128: "<c16"}
_FROM_TYPESTR = {np.dtype(text).str: dtype for dtype, text in _TYPESTR.items()}


def _cuda_array_interface(self: Tensor) -> dict:
    """Version 3 of Numba's CUDA array interface (``__cuda_array_interface__``), as torch exposes it."""
    if self.device.type != "cuda":
        raise AttributeError(f"Can't get __cuda_array_interface__ on non-CUDA tensor type: {self.type()} If CUDA "
                             "data is required use tensor.cuda() to copy tensor to device memory.")
    if self.requires_grad:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. If gradients aren't "
                           "needed, use var.detach() to get Variable that doesn't require grad.")
    typestr = _TYPESTR.get(self.dtype)
    if typestr is None:
        raise TypeError(f"dtype {self.dtype} is not supported by __cuda_array_interface__ (no numpy type string)")
    itemsize = self.dtype.itemsize
    contiguous = self.is_contiguous()
    return {"typestr": typestr, "shape": tuple(self.shape),
            "strides": None if contiguous else tuple(s * itemsize for s in self.stride()),
            "data": (self.data_ptr(), False), "version": 3,
            "stream": _consumer_stream(self.device.index or 0)}


Tensor.__cuda_array_interface__ = property(_cuda_array_interface)


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
        raise TypeError(f"from_dlpack(): expected an object with __dlpack__ (a numpy array, a torch tensor, ...), "
                        f"__cuda_array_interface__, or a DLPack capsule, got {type(obj).__name__}")
    kwargs = {}
    device = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_CPU, 0)
    if device[0] == _CUDA:  # the handshake: the producer orders its writes before our current stream's work
        kwargs["stream"] = _consumer_stream(device[1])
    try:
        return obj.__dlpack__(max_version=_VERSION, **kwargs)
    except TypeError:  # producers that predate DLPack 1.0 take no max_version
        return obj.__dlpack__(**kwargs)


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
    if not hasattr(ext, "__dlpack__") and hasattr(ext, "__cuda_array_interface__"):
        return _from_cuda_array_interface(ext)
    address, managed = _consume(_capsule_of(ext))
    try:
        dtype, shape, strides, span = _layout(managed.dl_tensor)
    except Exception:
        _release(address, managed)
        raise
    dl = managed.dl_tensor
    nbytes = span * dtype.itemsize
    start = (dl.data or 0) + dl.byte_offset
    if dl.device.device_type == _CUDA:
        memory = ForeignMemory(start, nbytes)
        weakref.finalize(memory, _release, address, managed)
        device = Device("cuda", dl.device.device_id)
        return made_here(_foreign(Tensor._make(Storage(memory, device, dtype, span), shape, strides, 0, dtype, device)))
    buffer = (ctypes.c_uint8 * nbytes).from_address(start) if nbytes else (ctypes.c_uint8 * 0)()
    weakref.finalize(buffer, _release, address, managed)
    flat = np.frombuffer(buffer, dtype=dtype.np, count=span)
    return made_here(_foreign(Tensor._make(Storage(flat, cpu, dtype, span), shape, strides, 0, dtype, cpu)))


def _layout(dl: _DLTensor) -> tuple:
    """(dtype, shape, strides, span in elements) of a CPU DLTensor, or a BufferError saying what is unsupported."""
    if dl.device.device_type not in (_CPU, _CUDA_HOST, _CUDA):
        raise BufferError(f"from_dlpack(): tilewise imports CPU (1), CUDA (2) and CUDA host (3) memory; got DLPack "
                          f"device type {dl.device.device_type}. Move the tensor to the CPU first")
    dtype = _DTYPES.get((dl.dtype.code, dl.dtype.bits))
    if dtype is None or dl.dtype.lanes != _LANES.get(dtype, 1):
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


class ForeignMemory:
    """CUDA memory another library owns, as a storage's ``data`` (``ptr``, ``nbytes``): ``owner`` (the producer's
    object, for the CUDA array interface) stays alive while it does, and a finalizer calls a DLPack deleter."""

    __slots__ = ("__weakref__", "nbytes", "owner", "ptr")

    def __init__(self, ptr: int, nbytes: int, owner=None) -> None:
        self.ptr, self.nbytes, self.owner = ptr, nbytes, owner


def _from_cuda_array_interface(obj) -> Tensor:
    """A tensor over the memory an object describes with ``__cuda_array_interface__`` (versions 0 to 3)."""
    cai = obj.__cuda_array_interface__
    typestr = np.dtype(cai["typestr"]).str
    dtype = _FROM_TYPESTR.get(typestr)
    if dtype is None:
        raise BufferError(f"from_dlpack(): unsupported __cuda_array_interface__ typestr {cai['typestr']!r}")
    if cai.get("mask") is not None:
        raise BufferError("from_dlpack(): masked __cuda_array_interface__ arrays are not supported")
    shape = tuple(int(n) for n in cai["shape"])
    itemsize = dtype.itemsize
    if cai.get("strides") is None:
        strides = tuple(contiguous_strides(shape))
    else:
        if any(s % itemsize or s < 0 for s in cai["strides"]):
            raise BufferError(f"from_dlpack(): strides {list(cai['strides'])} (bytes) are not non-negative multiples "
                              f"of the item size {itemsize}")
        strides = tuple(s // itemsize for s in cai["strides"])
    ptr = int(cai["data"][0] or 0)
    device = Device("cuda", _device_of_pointer(ptr) if ptr else 0)
    stream = cai.get("stream")
    if stream is not None and stream != -1:  # their pending writes come before our stream's work
        _wait(_current_stream(device.index), _driver_stream(stream), device.index)
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    memory = ForeignMemory(ptr, span * itemsize, obj)
    return made_here(_foreign(Tensor._make(Storage(memory, device, dtype, span), shape, strides, 0, dtype, device)))


def _device_of_pointer(ptr: int) -> int:
    """The ordinal of the device a CUDA pointer's memory is on."""
    from tilewise._cuda_api import check, driver_api

    cu = driver_api()
    return int(check(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
                     "cuPointerGetAttribute"))


def _foreign(t: Tensor) -> Tensor:
    """A tensor over memory another library owns: ``resize_`` of its storage is refused, as torch's."""
    t._storage.resizable_memory = False
    return t
