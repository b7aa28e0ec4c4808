"""torch's checkpoint format (``torch.save``'s zip archive, and its legacy single-stream format), read and
written without importing torch.

[Note: torch checkpoints] A ``torch.save`` file is a zip archive under one folder (``archive/`` for a stream,
the file's stem for a path): ``data.pkl`` is a protocol-2 pickle of the object in which every tensor is a
call ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` and every
storage a persistent id ``("storage", torch.FloatStorage, key, "cpu", numel)`` whose bytes are the record
``data/<key>``; ``byteorder``, ``version`` and a few markers sit beside it. Tensors that share a storage
name the same key, so views load as views of one buffer (offset and strides in elements). Dtypes without
a legacy typed storage class (float8, uint16...) are written as ``_rebuild_tensor_v3`` over an
``UntypedStorage`` whose numel counts bytes, as torch writes them.

Loading runs the pickle through :class:`tilewise._pickle.RestrictedUnpickler` with an allowlist that maps
torch's names to tilewise's own rebuild functions, dtypes, ``Size`` and ``device`` (see
[Note: restricted pickle]): nothing is imported and no other code runs. Every tensor is first built on the
host over its storage's bytes (read straight into one array per storage, or mapped copy-on-write with
``mmap=True``); ``map_location`` then moves each storage once, and its tensors with it, so views stay
views on the device too. Records are written uncompressed and 64-byte aligned (a padding extra field, as
torch's writer pads), so torch can map them too.
"""

from __future__ import annotations

import io
import os
import secrets
import struct
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from tilewise import dtypes
from tilewise import strides as _strides
from tilewise._pickle import NUMPY_GLOBALS, Call, Global, Persistent, PickleWriter, RestrictedUnpickler, UnpicklingError
from tilewise.device import Device, cpu
from tilewise.nn.parameter import Parameter
from tilewise.storage import Storage
from tilewise.tensor import Size, Tensor

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # pickle of the int 0x1950a86a20f9469cfc6c
_LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_ALIGNMENT = 64  # torch's writer starts every record's data on a multiple of this
_PADDING_FIELD = 0x4246  # "FB": the zip extra field torch pads with
_CHUNK_BYTES = 16 << 20

# torch's typed storage classes; any other dtype is stored in an UntypedStorage and rebuilt by _rebuild_tensor_v3
_TYPED_STORAGES = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage", "bfloat16": "BFloat16Storage",
    "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage", "int8": "CharStorage",
    "uint8": "ByteStorage", "bool": "BoolStorage", "complex128": "ComplexDoubleStorage",
    "complex64": "ComplexFloatStorage",
}
_TORCH_ONLY_DTYPES = (  # torch dtypes a checkpoint may name that tilewise cannot hold
    "complex32", "uint16", "uint32", "uint64", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "qint8", "qint32", "quint8", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
    "bits16",
)


def is_torch_zip(head: bytes) -> bool:
    """A zip's local header: a safetensors length of ``PK\\x03\\x04`` would be followed by four zero bytes."""
    return head[:4] == ZIP_MAGIC and head[4:8] != b"\0\0\0\0"


# ---------------------------------------------------------------------------- loading

class _Marker:
    """A torch name a checkpoint may mention but never call (a storage class, ``torch.Tensor``)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __call__(self, *args, **kwargs):
        raise UnpicklingError(f"tilewise.load: the checkpoint calls {self!r}, which only names a type here")


class _StorageType(_Marker):
    """What a storage class name in a checkpoint stands for: its dtype (None: untyped bytes)."""

    def __init__(self, name: str, dtype: dtypes.DType | None):
        super().__init__(name)
        self.dtype = dtype


_TENSOR_TYPE = _Marker("Tensor")


class _LoadedStorage:
    """One storage of the checkpoint: its bytes on the host, typed on demand by the tensors that read them."""

    def __init__(self, raw: np.ndarray, dtype: dtypes.DType | None, location: str, big_endian: bool):
        self.raw, self.dtype, self.location, self.big_endian = raw, dtype, location, big_endian
        self.typed: dict[dtypes.DType, Storage] = {}

    def as_dtype(self, dtype: dtypes.DType, what: str) -> Storage:
        storage = self.typed.get(dtype)
        if storage is None:
            if self.raw.nbytes % dtype.itemsize:
                raise UnpicklingError(f"{what}: a storage of {self.raw.nbytes} bytes cannot hold {dtype} elements")
            flat = self.raw.view(dtype.np)
            if self.big_endian and dtype.itemsize > 1:
                flat = flat.byteswap()
            storage = self.typed[dtype] = Storage(flat, cpu, dtype, flat.shape[0])
        return storage


class _Loader:
    """State of one load: the storages met, the tensors made (to be placed), the allowlist of names."""

    def __init__(self, what: str, read_storage: Callable[[str, int], np.ndarray], big_endian: bool):
        self.what = what
        self.read_storage = read_storage
        self.big_endian = big_endian
        self.storages: dict[str, _LoadedStorage] = {}
        self.tensors: list[Tensor] = []

    def persistent_load(self, pid: Any) -> _LoadedStorage:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise UnpicklingError(f"{self.what}: only storages may be persistent ids, got {_short(pid)}")
        _, storage_type, key, location, numel = pid[:5]
        _refuse_unsupported(storage_type)
        if len(pid) == 6 and pid[5] is not None:
            raise UnpicklingError(f"{self.what}: storage views (a format of torch before 0.4) are not supported")
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str) and isinstance(location, str)
                and isinstance(numel, int) and numel >= 0):
            raise UnpicklingError(f"{self.what}: malformed storage id {_short(pid)}")
        loaded = self.storages.get(key)
        if loaded is None:
            itemsize = storage_type.dtype.itemsize if storage_type.dtype is not None else 1
            raw = self.read_storage(key, numel * itemsize)
            loaded = self.storages[key] = _LoadedStorage(raw, storage_type.dtype, location, self.big_endian)
        return loaded

    def allowed(self, weights_only: bool = True) -> dict[str, Any]:
        """The names a checkpoint may use; numpy's arrays, scalars and dtypes too when not ``weights_only``
        (as torch.load's full unpickler reads them; tilewise still reads them as data, calling nothing else)."""
        names: dict[str, Any] = {
            "torch._utils._rebuild_tensor": self.rebuild_tensor,
            "torch._utils._rebuild_tensor_v2": self.rebuild_tensor_v2,
            "torch._utils._rebuild_tensor_v3": self.rebuild_tensor_v3,
            "torch._utils._rebuild_parameter": self.rebuild_parameter,
            "torch._utils._rebuild_parameter_with_state": self.rebuild_parameter_with_state,
            "torch._tensor._rebuild_from_type_v2": self.rebuild_from_type_v2,
            "torch.Size": Size, "torch.device": Device, "torch.Tensor": _TENSOR_TYPE,
            "torch.nn.parameter.Parameter": self.new_parameter,
            "torch.storage.UntypedStorage": _StorageType("UntypedStorage", None),
            "torch.UntypedStorage": _StorageType("UntypedStorage", None),
        }
        for dtype_name, storage_name in _TYPED_STORAGES.items():
            dtype = _tilewise_dtype(dtype_name)
            storage_type = _StorageType(storage_name, dtype) if dtype else _UnsupportedDType(dtype_name)
            names[f"torch.{storage_name}"] = storage_type
        for dtype in dtypes.ALL:
            names[f"torch.{dtype.name}"] = dtype
        if not weights_only:
            names.update(NUMPY_GLOBALS)
        return names

    def rebuild_tensor(self, storage, storage_offset, size, stride) -> Tensor:
        dtype = storage.dtype if isinstance(storage, _LoadedStorage) else None
        if dtype is None:
            raise UnpicklingError(f"{self.what}: _rebuild_tensor needs a typed storage")
        return self._tensor(storage, dtype, storage_offset, size, stride, False)

    def rebuild_tensor_v2(self, storage, storage_offset, size, stride, requires_grad, backward_hooks,
                          metadata=None) -> Tensor:
        dtype = storage.dtype if isinstance(storage, _LoadedStorage) else None
        if dtype is None:
            raise UnpicklingError(f"{self.what}: _rebuild_tensor_v2 needs a typed storage")
        return self._tensor(storage, dtype, storage_offset, size, stride, requires_grad, metadata)

    def rebuild_tensor_v3(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
                          metadata=None) -> Tensor:
        _refuse_unsupported(dtype)
        if not isinstance(dtype, dtypes.DType):
            raise UnpicklingError(f"{self.what}: _rebuild_tensor_v3 needs a dtype, got {_short(dtype)}")
        return self._tensor(storage, dtype, storage_offset, size, stride, requires_grad, metadata)

    def rebuild_parameter(self, data, requires_grad, backward_hooks) -> Tensor:
        if not isinstance(data, Tensor):
            raise UnpicklingError(f"{self.what}: _rebuild_parameter of a {type(data).__name__}")
        param = Parameter(data, bool(requires_grad))
        self.tensors.append(param)
        return param

    def new_parameter(self, data=None, requires_grad=True) -> Tensor:
        """``torch.nn.Parameter(data, requires_grad)`` as the NEWOBJ opcode spells it."""
        return self.rebuild_parameter(data, requires_grad, None)

    def rebuild_parameter_with_state(self, data, requires_grad, backward_hooks, state) -> Tensor:
        return self._with_state(self.rebuild_parameter(data, requires_grad, backward_hooks), state)

    def rebuild_from_type_v2(self, func, new_type, args, state) -> Tensor:
        rebuilders = (self.rebuild_tensor, self.rebuild_tensor_v2, self.rebuild_tensor_v3, self.rebuild_parameter,
                      self.rebuild_parameter_with_state)
        if func not in rebuilders or new_type not in (_TENSOR_TYPE, self.new_parameter) or not isinstance(args, tuple):
            raise UnpicklingError(f"{self.what}: _rebuild_from_type_v2 of {_short(func)} as {_short(new_type)} is not "
                                  "supported (only tensors and parameters)")
        t = func(*args)
        if new_type == self.new_parameter and not isinstance(t, Parameter):
            t = self.rebuild_parameter(t, t.requires_grad, None)
        return self._with_state(t, state)

    def _with_state(self, t: Tensor, state) -> Tensor:
        """Python attributes a tensor carried; only plain names, never tilewise's own (underscored) fields."""
        attributes = state[0] if isinstance(state, tuple) and state else state
        if attributes:
            if not isinstance(attributes, dict) or any(not isinstance(k, str) or k.startswith("_") for k in attributes):
                raise UnpicklingError(f"{self.what}: a tensor's saved attributes must be a dict of public names")
            t.__dict__.update(attributes)
        return t

    def _tensor(self, storage, dtype, offset, size, stride, requires_grad, metadata=None) -> Tensor:
        if not isinstance(storage, _LoadedStorage):
            raise UnpicklingError(f"{self.what}: a tensor must be rebuilt over a storage, got {_short(storage)}")
        if metadata:
            raise UnpicklingError(f"{self.what}: tensors with conjugate or negative bits are not supported")
        typed = storage.as_dtype(dtype, self.what)
        shape, strides = _ints(size, self.what), _ints(stride, self.what)
        if (len(shape) != len(strides) or not isinstance(offset, int) or offset < 0 or min(strides, default=0) < 0
                or _strides.numel(shape) and offset + _strides.storage_span(shape, strides, 0) > typed.numel):
            raise UnpicklingError(f"{self.what}: a tensor of size {shape}, stride {strides} and offset {offset} does "
                                  f"not fit its storage of {typed.numel} elements; the file is damaged")
        t = Tensor._make(typed, shape, strides, offset, dtype, cpu)
        if requires_grad:
            t.requires_grad_(True)
        self.tensors.append(t)
        return t


def _ints(values, what: str) -> tuple[int, ...]:
    if not isinstance(values, tuple) or not all(type(v) is int for v in values):
        raise UnpicklingError(f"{what}: a tensor's size and stride must be tuples of ints, got {_short(values)}")
    return tuple(values)


def _short(obj) -> str:
    text = repr(obj)
    return text if len(text) < 80 else text[:77] + "..."


def _tilewise_dtype(name: str) -> dtypes.DType | None:
    try:
        return dtypes.from_name(name)
    except TypeError:
        return None


def _allow_unsupported_dtypes(names: dict[str, Any]) -> None:
    """torch dtypes tilewise lacks resolve to a marker, so the error names the dtype rather than a global."""
    for name in _TORCH_ONLY_DTYPES:
        names.setdefault(f"torch.{name}", _UnsupportedDType(name))


class _UnsupportedDType(_Marker):
    def __repr__(self) -> str:
        return f"torch.{self.name} (not supported by tilewise)"


def _refuse_unsupported(value) -> None:
    if isinstance(value, _UnsupportedDType):
        raise UnpicklingError(f"tilewise.load: the checkpoint holds {value.name} tensors, which tilewise does not "
                              f"support; supported: {', '.join(d.name for d in dtypes.ALL)}")


def load_zip(file: BinaryIO, where: str, map_location, mmap_path: str | None, weights_only: bool = True) -> Any:
    try:
        archive = zipfile.ZipFile(file)
    except zipfile.BadZipFile as exc:
        raise RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: a damaged zip archive ({exc})") from None
    with archive:
        records = {info.filename: info for info in archive.infolist()}
        prefix = next(iter(records), "").split("/")[0]
        if f"{prefix}/data.pkl" not in records:
            raise RuntimeError(f"tilewise.load: {where} is a zip archive but not a torch checkpoint (no data.pkl)")
        byteorder = _small_record(archive, records, f"{prefix}/byteorder", b"little")
        reader = _RecordReader(file, archive, records, prefix, where, mmap_path)
        loader = _Loader("tilewise.load", reader.read, big_endian=byteorder == b"big")
        names = loader.allowed(weights_only)
        _allow_unsupported_dtypes(names)
        pickled = archive.read(f"{prefix}/data.pkl")
        result = RestrictedUnpickler(io.BytesIO(pickled), names, loader.persistent_load).load()
    _place(loader, map_location)
    return result


def _small_record(archive: zipfile.ZipFile, records: dict, name: str, default: bytes) -> bytes:
    return archive.read(name).strip() if name in records else default


class _RecordReader:
    """Reads ``data/<key>`` records into fresh arrays, or maps them copy-on-write (``mmap=True``)."""

    def __init__(self, file, archive, records, prefix, where, mmap_path):
        self.file, self.archive, self.records = file, archive, records
        self.prefix, self.where, self.mmap_path = prefix, where, mmap_path

    def read(self, key: str, nbytes: int) -> np.ndarray:
        info = self.records.get(f"{self.prefix}/data/{key}")
        if info is None:
            raise RuntimeError(f"tilewise.load: {self.where} is not a valid checkpoint: storage {key!r} has no record")
        if info.file_size != nbytes:
            raise RuntimeError(f"tilewise.load: {self.where} is not a valid checkpoint: storage {key!r} holds "
                               f"{info.file_size} bytes where its tensors need {nbytes}")
        if info.compress_type != zipfile.ZIP_STORED or not nbytes:
            return np.frombuffer(bytearray(self.archive.read(info)), np.uint8)
        start = self._data_offset(info)
        if self.mmap_path is not None:
            return np.memmap(self.mmap_path, np.uint8, mode="c", offset=start, shape=(nbytes,))
        raw = np.empty(nbytes, np.uint8)
        self.file.seek(start)
        if _read_into(self.file, memoryview(raw)) != nbytes:
            raise RuntimeError(f"tilewise.load: {self.where} is not a valid checkpoint: storage {key!r} ends early")
        return raw

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        self.file.seek(info.header_offset)
        header = self.file.read(30)
        if len(header) != 30 or header[:4] != ZIP_MAGIC:
            raise RuntimeError(f"tilewise.load: {self.where} is not a valid checkpoint: a damaged zip record")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        return info.header_offset + 30 + name_length + extra_length


def _read_into(file: BinaryIO, target: memoryview) -> int:
    done = 0
    while done < len(target):
        count = file.readinto(target[done:])
        if not count:
            break
        done += count
    return done


def load_legacy(file: BinaryIO, where: str, map_location, weights_only: bool = True) -> Any:
    """torch's format before 1.6 (``_use_new_zipfile_serialization=False``): four pickles, then the storages'
    bytes in the order the fourth lists their keys, each after its element count."""
    def plain(what: str) -> Any:
        return RestrictedUnpickler(file, {}, None, f"tilewise.load ({what})").load()

    if plain("magic number") != _LEGACY_MAGIC_NUMBER or plain("protocol") != _LEGACY_PROTOCOL:
        raise RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: a bad legacy torch header")
    info = plain("system info")
    big_endian = isinstance(info, dict) and info.get("little_endian") is False
    pending: dict[str, np.ndarray] = {}

    def allocate(key: str, nbytes: int) -> np.ndarray:
        pending[key] = np.empty(nbytes, np.uint8)
        return pending[key]

    loader = _Loader("tilewise.load", allocate, big_endian)
    names = loader.allowed(weights_only)
    _allow_unsupported_dtypes(names)
    result = RestrictedUnpickler(file, names, loader.persistent_load).load()
    keys = plain("storage keys")
    if not isinstance(keys, list) or set(keys) != set(pending):
        raise RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: its storage list does not match")
    for key in keys:
        raw = pending[key]
        count = file.read(8)
        itemsize = loader.storages[key].dtype.itemsize if loader.storages[key].dtype else 1
        if len(count) != 8 or struct.unpack("<q", count)[0] * itemsize != raw.nbytes:
            raise RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: storage {key!r} has a bad size")
        if _read_into(file, memoryview(raw)) != raw.nbytes:
            raise RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: storage {key!r} ends early")
    for loaded in loader.storages.values():  # typed storages view the bytes, except byte-swapped copies
        for dtype, storage in loaded.typed.items():
            if loaded.big_endian and dtype.itemsize > 1:
                storage.data[...] = loaded.raw.view(dtype.np).byteswap()
    _place(loader, map_location)
    return result


# ---------------------------------------------------------------------------- map_location

def _place(loader: _Loader, map_location) -> None:
    """Move each storage where ``map_location`` says (as torch.load reads it), and its tensors with it."""
    moved: dict[int, Storage] = {}
    for loaded in loader.storages.values():
        for storage in loaded.typed.values():
            target = placement(map_location, loaded.location, storage)
            if target is not storage:
                moved[id(storage)] = target
    for t in loader.tensors:
        target = moved.get(id(t._storage))
        if target is not None:
            t._storage, t._device, t._array = target, target.device, None


def placement(map_location, location: str, storage: Storage) -> Storage:
    """The storage ``storage`` (on the host, saved at ``location``) becomes under ``map_location``."""
    if callable(map_location) and not isinstance(map_location, (str, Device)) and type(map_location).__module__ != \
            "torch":
        result = map_location(_StorageArgument(storage), location)
        if isinstance(result, _StorageArgument):
            result = result.storage
        if result is not None:
            if not isinstance(result, Storage):
                raise TypeError(f"tilewise.load: map_location returned a {type(result).__name__}; it must return a "
                                "storage (the one it was given, or one moved to a device) or None")
            return result
        map_location = None
    if isinstance(map_location, dict):
        map_location = map_location.get(location, location)
    device = default_device(location) if map_location is None else _device(map_location)
    return storage if device == storage.device else _moved(storage, device)


class _StorageArgument:
    """What a ``map_location`` callable receives: the storage, with torch's ``cpu()``, ``cuda()`` and ``to()``
    (so ``lambda storage, loc: storage.cuda(1)`` works as it does with torch.load)."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def __getattr__(self, name: str):
        return getattr(self.storage, name)

    def cpu(self) -> _StorageArgument:
        return self.to(cpu)

    def cuda(self, device=None) -> _StorageArgument:
        return self.to(Device("cuda", device) if isinstance(device, int) or device is None else device)

    def to(self, device) -> _StorageArgument:
        device = _device(device)
        return self if device == self.storage.device else _StorageArgument(_moved(self.storage, device))


def default_device(location: str) -> Device:
    device = _device(location)
    if device.type == "cuda":
        from tilewise.backends.cuda.runtime import is_available

        if not is_available():
            raise RuntimeError("Attempting to deserialize object on a CUDA device but tilewise.cuda.is_available() is "
                               "False. If you are running on a CPU-only machine, please use tilewise.load with "
                               "map_location='cpu' to map your storages to the CPU.")
    return device


def _device(value) -> Device:
    try:
        return Device(value)
    except (TypeError, ValueError) as exc:
        raise RuntimeError(f"tilewise.load: cannot place tensors on {value!r}: {exc}") from None


def _moved(storage: Storage, device: Device) -> Storage:
    flat = Tensor._make(storage, (storage.numel,), (1,), 0, storage.dtype, storage.device)
    return flat.to(device)._storage


# ---------------------------------------------------------------------------- saving

class _Saver:
    """Turns tensors, storages, dtypes, devices and sizes into torch's pickle nodes, numbering storages."""

    def __init__(self):
        self.keys: dict[int, str] = {}
        self.storages: list[tuple[str, Storage]] = []

    def reduce(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            return self._tensor(obj)
        if isinstance(obj, dtypes.DType):
            return Global("torch", obj.name)
        if isinstance(obj, Device):
            return Call(Global("torch", "device"), (obj.type,) if obj.index is None else (obj.type, obj.index))
        if isinstance(obj, Size):
            return Call(Global("torch", "Size"), (tuple(obj),))
        if isinstance(obj, Storage):
            return self._storage(obj)
        return None

    def _tensor(self, t: Tensor) -> Call:
        t._require_real("tilewise.save")
        if t._storage is None or t.device.type == "meta":
            raise RuntimeError(f"tilewise.save: cannot save a tensor on {t.device} (it has no data)")
        hooks = Call(Global("collections", "OrderedDict"), ())
        shape, strides = tuple(t._shape), tuple(t._strides)
        if t.dtype.name in _TYPED_STORAGES:
            rebuilt = Call(Global("torch._utils", "_rebuild_tensor_v2"),
                           (self._storage(t._storage), t._offset, shape, strides, t.requires_grad, hooks))
        else:
            rebuilt = Call(Global("torch._utils", "_rebuild_tensor_v3"),
                           (self._storage(t._storage), t._offset, shape, strides, t.requires_grad, hooks,
                            Global("torch", t.dtype.name)))
        if isinstance(t, Parameter):
            return Call(Global("torch._utils", "_rebuild_parameter"),
                        (rebuilt, t.requires_grad, Call(Global("collections", "OrderedDict"), ())))
        return rebuilt

    def _storage(self, storage: Storage) -> Persistent:
        key = self.keys.get(id(storage))
        if key is None:
            key = self.keys[id(storage)] = str(len(self.storages))
            self.storages.append((key, storage))
        location = "cpu" if storage.device.type == "cpu" else str(storage.device)
        typed = _TYPED_STORAGES.get(storage.dtype.name)
        if typed:
            return Persistent(("storage", Global("torch", typed), key, location, storage.numel))
        return Persistent(("storage", Global("torch.storage", "UntypedStorage"), key, location, storage.nbytes()))


def save_zip(obj: Any, file: BinaryIO, archive_name: str) -> None:
    saver = _Saver()
    pickled = PickleWriter(saver.reduce).dumps(obj)
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        _write_record(archive, f"{archive_name}/data.pkl", [pickled], len(pickled))
        for name, data in ((".format_version", b"1"), (".storage_alignment", str(_ALIGNMENT).encode()),
                           ("byteorder", b"little")):
            _write_record(archive, f"{archive_name}/{name}", [data], len(data))
        for key, storage in saver.storages:
            _write_record(archive, f"{archive_name}/data/{key}", _storage_pieces(storage), storage.nbytes())
        _write_record(archive, f"{archive_name}/version", [b"3\n"], 2)
        serial = str(secrets.randbits(128)).zfill(40).encode()
        _write_record(archive, f"{archive_name}/.data/serialization_id", [serial], len(serial))


def _write_record(archive: zipfile.ZipFile, name: str, pieces, size: int) -> None:
    """A stored record whose data starts on a multiple of ``_ALIGNMENT`` bytes, written piece by piece."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    zip64 = size * 1.05 > zipfile.ZIP64_LIMIT
    header = 30 + len(name.encode()) + (20 if zip64 else 0)
    padding = -(archive.fp.tell() + header + 4) % _ALIGNMENT
    info.extra = struct.pack("<HH", _PADDING_FIELD, padding) + bytes(padding)
    with archive.open(info, "w", force_zip64=zip64) as record:
        for piece in pieces:
            record.write(piece)


def _storage_pieces(storage: Storage):
    """The storage's bytes in pieces of at most ``_CHUNK_BYTES`` (a device storage: its host copy, piece by
    piece)."""
    itemsize = storage.dtype.itemsize
    step = max(1, _CHUNK_BYTES // itemsize)
    for start in range(0, storage.numel, step):
        count = min(step, storage.numel - start)
        if storage.device.type == "cpu":
            flat = storage.data[start:start + count]
        else:
            flat = Tensor._make(storage, (count,), (1,), start, storage.dtype, storage.device).cpu()._np()
        yield memoryview(np.ascontiguousarray(flat).view(np.uint8))


def archive_name_for(path: str | os.PathLike | None) -> str:
    """torch names the archive's folder after the file's stem; a stream's is ``archive``."""
    if path is None:
        return "archive"
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return stem or "archive"


__all__ = ["LEGACY_MAGIC", "archive_name_for", "default_device", "is_torch_zip", "load_legacy", "load_zip",
           "placement", "save_zip"]
