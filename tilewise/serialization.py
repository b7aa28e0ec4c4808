"""Checkpoints: ``tilewise.save`` and ``tilewise.load`` in safetensors (with JSON for everything else) or in
torch's own format.

[Note: which format] The file's extension decides what ``save`` writes, and ``save`` never writes a format
the extension does not promise: ``.pt``, ``.pth``, ``.bin`` and ``.ckpt`` get torch's zip format (what
``torch.save`` writes and ``torch.load(weights_only=True)`` reads; see [Note: torch checkpoints]),
``.safetensors`` gets safetensors; any other name, and a stream, gets safetensors unless ``format="torch"``
asks otherwise (``format`` that contradicts the extension is an error). ``load`` ignores the name and reads
the format from the file's first bytes: a zip archive, torch's legacy pickle stream, or safetensors. Neither
format runs code when loaded.

[Note: checkpoint format] A checkpoint is one safetensors file. Its tensors are stored under the dotted
path at which they sit in the saved object (``fc.weight`` for a state dict, ``state.0.exp_avg`` for an
optimizer's), so any safetensors reader sees meaningful names. The rest of the object — dicts (with any
key type; an OrderedDict stays one, with a state dict's ``_metadata``), lists, tuples, numbers, strings,
dtypes — is written as JSON into the file's ``__metadata__`` under ``"tilewise"``, with
``{"__tensor__": name}`` where a tensor stood (a numpy array or scalar is stored as a tensor too, its node
marked ``"numpy"`` so it comes back as numpy gave it, with ``weights_only=False`` as torch.load's). No
pickle is involved, so loading a checkpoint never runs code. A safetensors file written by another library
(torch's ``save_file``, say) has no such entry and loads as a plain ``{name: tensor}`` dict.
``__metadata__`` is the one name the format reserves: a tensor at that path is stored under
``__metadata___`` and put back where it was by the JSON.

Shared storage is kept as ``torch.save`` keeps it. A tensor object that appears twice comes back as one
object; distinct tensors on one storage (tied weights: ``state_dict`` detaches each name separately; a
transpose beside its matrix) come back as views of one storage, as ``torch.load`` gives them. On disk this
follows the safetensors library's ``save_model``: the bytes are written once, under the name of the first
when all are the same view, else of a contiguous tensor that covers all the others, and the others are
recorded in the JSON as views of it (offset, shape, strides), so a plain safetensors reader sees each stored
name with its own values and no overlapping data (which the format forbids). Tensors that share storage
with no contiguous tensor covering them, and lone non-contiguous views, are written by value and come back
contiguous.

Saving is atomic and streams: the header is computed from shapes alone, then each tensor's bytes go to a
temporary file beside the destination, one tensor at a time (a non-contiguous one in pieces of at most
:data:`CHUNK_BYTES`), and the file replaces the destination only once complete and synced
(``tilewise.fileio``). A process killed mid-save leaves the previous checkpoint intact, and saving needs
no memory beyond a piece (a device tensor: its host copy). Loading reads each tensor straight into its own
array.
"""

from __future__ import annotations

import json
import os
import struct
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from tilewise import _pickle, _torch_format, dtypes
from tilewise import strides as _strides
from tilewise._pickle import refuse_named_tuple, state_dict_hint
from tilewise.fileio import atomic_writer
from tilewise.nn.parameter import Parameter
from tilewise.tensor import Tensor, from_array

# safetensors' header codes; its writer takes the torch-style names, which are tilewise's dtype names
_SAFETENSORS_DTYPES = {
    dtypes.bool_: "BOOL", dtypes.uint8: "U8", dtypes.int8: "I8", dtypes.int16: "I16", dtypes.int32: "I32",
    dtypes.int64: "I64", dtypes.float16: "F16", dtypes.bfloat16: "BF16", dtypes.float32: "F32", dtypes.float64: "F64",
    dtypes.float8_e4m3fn: "F8_E4M3", dtypes.float8_e5m2: "F8_E5M2", dtypes.float8_e8m0fnu: "F8_E8M0",
    dtypes.complex64: "C64",
    dtypes.float4_e2m1fn_x2: "F4",  # safetensors counts F4 in 4-bit elements: the last dimension doubles
}
_FROM_SAFETENSORS = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}
_METADATA_KEY = "tilewise"
_ORDERS_KEY = "tilewise.strides"  # name -> strides of each tensor saved in another dense order than row-major
_RESERVED = "__metadata__"  # the safetensors header's own entry: no tensor may be named so
_MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers
CHUNK_BYTES = 16 << 20  # a non-contiguous tensor is written in contiguous pieces of at most this size
FORMATS = ("safetensors", "torch")
_FORMAT_OF_EXTENSION = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch",
                        ".ckpt": "torch"}


class _Encoder:
    """Turns an object into a JSON-able structure, listing the tensors to write and the views of them."""

    def __init__(self):
        self.names: set[str] = {_RESERVED}
        self.stored: list[tuple[str, Tensor]] = []  # what the file holds, by name
        self.seen: dict[int, dict] = {}  # id(tensor) -> its JSON node (a tensor object met twice)
        self.met: list[tuple[Tensor, dict]] = []  # every tensor object and its node, in the order met
        self.keep: list[Any] = []  # numpy values met: ``seen`` keys on their ids

    def encode(self, obj: Any, path: str) -> Any:
        if isinstance(obj, Tensor):
            return self._tensor(obj, path)
        if type(obj) is np.ndarray or isinstance(obj, np.generic) and not isinstance(obj, (bool, int, float, str)):
            return self._numpy(obj, path)
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, dtypes.DType):
            return {"__dtype__": obj.name}
        if isinstance(obj, tuple):
            refuse_named_tuple(obj, "tilewise.save", path)
            return {"__tuple__": [self.encode(v, _join(path, str(k))) for k, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, _join(path, str(k))) for k, v in enumerate(obj)]
        if isinstance(obj, dict):
            items = [(k, self.encode(v, _join(path, str(k)))) for k, v in obj.items()]
            if all(isinstance(k, str) and not k.startswith("__") for k, _ in items):
                node = dict(items)
            else:
                node = {"__items__": [[self.encode(k, ""), v] for k, v in items]}
            return self._ordered(obj, node, path) if isinstance(obj, OrderedDict) else node
        raise TypeError(f"tilewise.save: cannot store a {type(obj).__name__} at {path or 'the top level'!r}; "
                        "checkpoints hold tensors, numbers, strings, None, dtypes, lists, tuples and dicts"
                        f"{state_dict_hint(obj)}")

    def _numpy(self, obj: np.ndarray | np.generic, path: str) -> dict:
        """A numpy array or scalar: its values stored as a tensor, marked to come back as numpy gave them (its
        dtype and memory order), as torch.save's pickle of it loads with weights_only=False."""
        node = self.seen.get(id(obj))
        if node is not None:
            return node
        where = path or "the top level"
        try:
            dtype = dtypes.from_numpy(obj.dtype.newbyteorder("="))
        except TypeError:
            dtype = None
        if dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"tilewise.save: the numpy {type(obj).__name__} at {where!r} has dtype {obj.dtype}, which "
                            "a safetensors file cannot hold; save it in torch's format (a .pt file, or "
                            "format='torch'), which holds any numpy array")
        array = np.asarray(obj)
        fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
        node = self._tensor(from_array(np.asarray(array, dtype.np, order="C"), dtype), path)
        # in native byte order: numpy's pickle (so torch.save's) loads a big-endian array in native order too
        node["numpy"] = {"dtype": obj.dtype.newbyteorder("=").str, "fortran": fortran,
                         "scalar": isinstance(obj, np.generic)}
        self.seen[id(obj)] = node
        self.keep.append(obj)
        return node

    def _ordered(self, obj: OrderedDict, node: Any, path: str) -> dict:
        """An OrderedDict comes back one, with a state dict's ``_metadata`` (module versions), as torch.load
        gives it."""
        ordered = {"__ordered__": node}
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            ordered["_metadata"] = self.encode(metadata, _join(path, "_metadata"))
        return ordered

    def _tensor(self, t: Tensor, path: str) -> dict:
        node = self.seen.get(id(t))
        if node is not None:
            return node
        t._require_real("tilewise.save")
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"tilewise.save: the {t.dtype} tensor at {path or 'the top level'!r} has no safetensors "
                            f"dtype (safetensors holds {', '.join(d.name for d in _SAFETENSORS_DTYPES)}); save it "
                            "in torch's format (a .pt file, or format='torch'), which holds every dtype")
        name = path or "tensor"
        while name in self.names:
            name += "_"
        self.names.add(name)
        node = {"__tensor__": name}
        if t.requires_grad:
            node["requires_grad"] = True
        if isinstance(t, Parameter):
            node["parameter"] = True
        self.seen[id(t)] = node
        self.met.append((t, node))
        return node

    def place(self) -> None:
        """Decide which tensors are written and which are views of a written one (see the note)."""
        by_storage: dict[tuple, list[tuple[Tensor, dict]]] = {}
        for t, node in self.met:  # offsets and strides count elements: only views of one dtype compare
            key = (id(t._storage), t.dtype) if t._storage is not None and t.numel() else (id(t), None)
            by_storage.setdefault(key, []).append((t, node))
        for group in by_storage.values():
            base = _base_of(group)
            for t, node in group:
                if base is None or t is base:
                    self.stored.append((node["__tensor__"], t))
                    continue
                # the geometry of the view on the base as it is loaded: contiguous, from its first element
                same = _geometry(t) == _geometry(base)
                offset = 0 if same else t._offset - base._offset
                strides = _loaded_strides(t) if same else t._strides
                node["view"] = [node["__tensor__"], offset, list(t._shape), list(strides)]
                node["__tensor__"] = self.seen[id(base)]["__tensor__"]


def _keeps_strides(t: Tensor) -> bool:
    """Whether ``t`` is dense in another order than row-major (channels-last, say): its values are written
    row-major, as safetensors requires, and laid out again in its order on load, as ``torch.load`` gives it."""
    return t._strides != _strides.contiguous_strides(t._shape) and _strides.is_non_overlapping_and_dense(t._shape,
                                                                                                       t._strides)


def _loaded_strides(t: Tensor) -> tuple:
    return t._strides if _keeps_strides(t) else _strides.contiguous_strides(t._shape)


def _base_of(group: list[tuple[Tensor, dict]]) -> Tensor | None:
    """The tensor of ``group`` (one storage) to write, the others being views of it: any of them when all are
    the same view (tied weights), else a contiguous one whose elements include every other's; None when there
    is no such tensor (each is then written by value)."""
    if len(group) == 1:
        return None
    tensors = [t for t, _ in group]
    if all(_geometry(t) == _geometry(tensors[0]) for t in tensors):
        return tensors[0]
    spans = [_span(t) for t in tensors]
    low, high = min(s[0] for s in spans), max(s[1] for s in spans)
    return next((t for t, span in zip(tensors, spans) if t.is_contiguous() and span == (low, high)), None)


def _geometry(t: Tensor) -> tuple:
    return t._offset, tuple(t._shape), tuple(t._strides)


def _span(t: Tensor) -> tuple[int, int]:
    """[first, last + 1) of the storage elements ``t`` reads."""
    return t._offset, t._offset + _strides.storage_span(t._shape, t._strides, 0)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def save(obj: Any, f: str | os.PathLike | BinaryIO, pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True, _disable_byteorder_record: bool = False, *,
         format: str | None = None) -> None:  # noqa: A002 — the name says what it chooses
    """Write ``obj`` (a state dict, an optimizer state, or any nest of tensors and plain values) to ``f``.

    The format follows the file's extension (see [Note: which format]): ``.pt``/``.pth``/``.bin``/``.ckpt`` are
    torch checkpoints that ``torch.load`` reads, ``.safetensors`` and anything else safetensors;
    ``format="torch"`` or ``"safetensors"`` chooses for a stream or an extension that promises neither.
    Given a path, the file is replaced atomically: a crash mid-save leaves the previous file as it was.
    The other arguments are ``torch.save``'s; tilewise always writes pickle protocol 2 in the zip format.

    >>> import io, tilewise as tw
    >>> buf = io.BytesIO()
    >>> tw.save({"w": tw.ones(2), "step": 3}, buf)
    >>> _ = buf.seek(0)
    >>> tw.load(buf)["step"]
    3
    """
    if pickle_module is not None:
        raise ValueError("tilewise.save: pickle_module is not supported; tilewise writes its pickles itself")
    if not _use_new_zipfile_serialization:
        raise ValueError("tilewise.save: only torch's zip format is written (_use_new_zipfile_serialization=True)")
    name = _name_of(f)
    chosen = _save_format(name, format)
    if chosen == "torch":
        write = _writer_of_torch(obj, name)
    else:
        write = _writer_of_safetensors(obj)
    if isinstance(f, (str, os.PathLike)):
        with atomic_writer(f) as file:
            write(file)
    else:
        write(f)


def _name_of(f) -> str | None:
    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return os.fspath(name) if isinstance(name, (str, os.PathLike)) else None


def _save_format(name: str | None, format: str | None) -> str:  # noqa: A002
    extension = os.path.splitext(name)[1].lower() if name else ""
    promised = _FORMAT_OF_EXTENSION.get(extension)
    if format is None:
        return promised or "safetensors"
    if format not in FORMATS:
        raise ValueError(f"tilewise.save: format must be one of {', '.join(map(repr, FORMATS))}, got {format!r}")
    if promised is not None and promised != format:
        raise ValueError(f"tilewise.save: {name!r} ends in {extension}, which promises a {promised} file; "
                         f"save it as {format} under another name, or drop format={format!r}")
    return format


def _writer_of_torch(obj: Any, name: str | None):
    archive = _torch_format.archive_name_for(name)
    return lambda file: _torch_format.save_zip(obj, file, archive)


def _writer_of_safetensors(obj: Any):
    encoder = _Encoder()
    structure = encoder.encode(obj, "")
    encoder.place()
    # widest dtypes first: after the 8-byte-aligned header, every tensor then starts aligned to its itemsize
    stored = sorted(encoder.stored, key=lambda s: (-s[1].dtype.itemsize, s[0]))
    orders = {name: list(t._strides) for name, t in stored if _keeps_strides(t)}
    header = _header(stored, json.dumps(structure, allow_nan=True), json.dumps(orders) if orders else None)
    return lambda file: _write(file, header, stored)


def _file_shape(dtype: dtypes.DType, shape: list) -> list:
    """The shape safetensors records: F4 counts FP4 values, two per float4_e2m1fn_x2 element."""
    if dtype is dtypes.float4_e2m1fn_x2:
        if not shape:
            raise RuntimeError("tilewise.save: a 0-dim float4_e2m1fn_x2 tensor has no safetensors shape (F4 counts "
                               "values along the last dimension); reshape it to (1,)")
        return shape[:-1] + [2 * shape[-1]]
    return shape


def _tensor_shape(dtype: dtypes.DType, shape) -> list | None:
    """The tensor shape of a safetensors entry, or None where F4's last dimension is missing or odd."""
    if dtype is not dtypes.float4_e2m1fn_x2 or not isinstance(shape, list):
        return shape
    if not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
        return None
    return shape[:-1] + [shape[-1] // 2]


def _header(stored: list[tuple[str, Tensor]], structure: str, orders: str | None = None) -> bytes:
    """The safetensors header: 8-byte length, then JSON padded with spaces to a multiple of 8 bytes. ``orders``
    (JSON: name -> strides) names the tensors to lay out again on load (see ``_keeps_strides``)."""
    entries: dict[str, Any] = {_RESERVED: {_METADATA_KEY: structure}}
    if orders is not None:
        entries[_RESERVED][_ORDERS_KEY] = orders
    offset = 0
    for name, t in stored:
        size = t.numel() * t.dtype.itemsize
        entries[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": _file_shape(t.dtype, list(t.shape)),
                         "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _write(file: BinaryIO, header: bytes, stored: list[tuple[str, Tensor]]) -> None:
    file.write(header)
    for _, t in stored:
        _write_tensor(file, t)


def _write_tensor(file: BinaryIO, t: Tensor) -> None:
    """Append ``t``'s elements in row-major order: straight from its memory when contiguous on the host."""
    if not t.numel():
        return
    array = t.detach()._np() if t.device.type == "cpu" else t.detach().cpu()._np()
    for piece in _row_major_pieces(array, CHUNK_BYTES):
        file.write(memoryview(np.ascontiguousarray(piece).reshape(-1).view(np.uint8)))


def _row_major_pieces(array: np.ndarray, limit: int):
    """Consecutive parts of ``array`` in row-major order, each contiguous or at most ``limit`` bytes."""
    pending = [array]
    while pending:
        part = pending.pop()
        if part.flags.c_contiguous or part.nbytes <= limit or part.ndim == 0:
            yield part
            continue
        row = part.nbytes // part.shape[0]
        if row <= limit:
            step = limit // row
            pending.extend(part[k:k + step] for k in reversed(range(0, part.shape[0], step)))
        else:
            pending.extend(part[k] for k in reversed(range(part.shape[0])))


def load(f: str | os.PathLike | BinaryIO, map_location=None, pickle_module: Any = None, *,
         weights_only: bool | None = None, mmap: bool | None = None, **pickle_load_args) -> Any:
    """Read a checkpoint: torch's zip or legacy format, or safetensors (a tilewise checkpoint, or any
    safetensors file as ``{name: tensor}``), told apart by the file's bytes, not its name.

    ``map_location`` is torch's: a device or its name moves every tensor there; a dict maps saved locations
    (``{"cuda:1": "cuda:0"}``); a callable ``(storage, location)`` returns the storage to use, or None for
    the default (the device it was saved from). Loading never runs code from the file, whatever
    ``weights_only`` says: a torch pickle may hold only tensors, storages, parameters, dtypes, devices, sizes
    and plain containers and values, and anything else raises ``pickle.UnpicklingError`` naming it. numpy
    arrays, scalars and dtypes are refused as ``torch.load`` refuses them by default, and read (as data, by
    numpy's own unpickling of their state) with ``weights_only=False``, as torch.load reads them.
    ``mmap=True`` maps a torch zip checkpoint's tensors from the file (copy-on-write) instead of reading them.
    """
    if pickle_module is not None:
        raise RuntimeError("tilewise.load: Can not safely load weights when explicit pickle_module is specified")
    unknown = set(pickle_load_args) - {"encoding"}
    if unknown:
        raise TypeError(f"tilewise.load() got unexpected keyword arguments {sorted(unknown)}")
    if mmap and not isinstance(f, (str, os.PathLike)):
        raise ValueError("tilewise.load: f must be a file path in order to use the mmap argument")
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as file:
            return _load(file, str(f), map_location, os.fspath(f) if mmap else None, weights_only is not False)
    return _load(f, "the stream", map_location, None, weights_only is not False)


def _load(file: BinaryIO, where: str, map_location, mmap_path: str | None, weights_only: bool) -> Any:
    start = file.tell()
    head = file.read(len(_torch_format.LEGACY_MAGIC))
    file.seek(start)
    if _torch_format.is_torch_zip(head):
        return _torch_format.load_zip(file, where, map_location, mmap_path, weights_only)
    if mmap_path is not None:
        raise RuntimeError(f"tilewise.load: mmap can only be used with torch's zip format, and {where} is not one")
    if head == _torch_format.LEGACY_MAGIC:
        return _torch_format.load_legacy(file, where, map_location, weights_only)
    return _load_safetensors(file, where, map_location, weights_only)


def _load_safetensors(file: BinaryIO, where: str, map_location, weights_only: bool = True) -> Any:
    entries, metadata, data_start = _read_header(file, where)
    tensors = {}
    for name, entry in sorted(entries.items(), key=lambda item: item[1]["data_offsets"][0]):
        tensors[name] = _read_tensor(file, data_start, name, entry, where, map_location)
    if _METADATA_KEY not in metadata:
        return tensors
    for name, strides in json.loads(metadata.get(_ORDERS_KEY, "{}")).items():
        tensors[name] = _laid_out(tensors.get(name), strides, where)
    return _decode(json.loads(metadata[_METADATA_KEY]), tensors, {}, weights_only)


def _laid_out(t: Tensor | None, strides: list, where: str) -> Tensor:
    """A stored tensor copied into the dense order it was saved in."""
    strides = tuple(strides)
    if t is None or len(strides) != t.ndim or not _strides.is_non_overlapping_and_dense(t._shape, strides) \
            or _strides.storage_span(t._shape, strides, 0) != t.numel():
        raise _corrupt(where, f"its stored strides {list(strides)} do not lay out a tensor densely")
    return t.new_empty_strided(t._shape, strides).copy_(t)


def _read_header(file: BinaryIO, where: str) -> tuple[dict, dict, int]:
    """(tensor entries, ``__metadata__``, where the data starts), checked as the safetensors library checks."""
    start = file.tell()
    prefix = file.read(8)
    if len(prefix) < 8:
        raise _corrupt(where, "it is shorter than a safetensors header")
    (length,) = struct.unpack("<Q", prefix)
    if length > _MAX_HEADER_BYTES:
        raise _corrupt(where, f"its header claims {length} bytes")
    raw = file.read(length)
    try:
        header = json.loads(raw) if len(raw) == length else None
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise _corrupt(where, "its header is not a JSON object (truncated or not a safetensors file)")
    metadata = header.pop(_RESERVED, None) or {}
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: _offsets(item[1])):
        begin, stop = _offsets(entry)
        dtype = _FROM_SAFETENSORS.get(entry.get("dtype")) if isinstance(entry, dict) else None
        shape = _tensor_shape(dtype, entry.get("shape")) if isinstance(entry, dict) else None
        if dtype is None and isinstance(entry, dict) and isinstance(entry.get("dtype"), str):
            raise TypeError(f"tilewise.load: tensor {name!r} has safetensors dtype {entry['dtype']}, which tilewise "
                            f"does not support; supported: {', '.join(_FROM_SAFETENSORS)}")
        if (dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or begin != end or stop - begin != _strides.numel(shape) * dtype.itemsize):
            raise _corrupt(where, f"the entry of tensor {name!r} is malformed or overlaps another")
        end = stop
    data_start = start + 8 + length
    file.seek(0, os.SEEK_END)
    if file.tell() - data_start != end:
        raise _corrupt(where, f"it holds {file.tell() - data_start} bytes of tensor data where its header describes "
                              f"{end} (truncated or extended)")
    return header, metadata, data_start


def _offsets(entry) -> tuple[int, int]:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        return (-1, -1)
    return offsets[0], offsets[1]


def _corrupt(where: str, why: str) -> RuntimeError:
    return RuntimeError(f"tilewise.load: {where} is not a valid checkpoint: {why}")


def _read_tensor(file: BinaryIO, data_start: int, name: str, entry: dict, where: str, map_location) -> Tensor:
    dtype = _FROM_SAFETENSORS[entry["dtype"]]
    begin, stop = entry["data_offsets"]
    array = np.empty(_tensor_shape(dtype, entry["shape"]), dtype.np)
    file.seek(data_start + begin)
    target = memoryview(array.reshape(-1).view(np.uint8))
    if _read_into(file, target) != stop - begin:
        raise _corrupt(where, f"the data of tensor {name!r} ends early")
    t = from_array(array, dtype)
    storage = _torch_format.placement(map_location, "cpu", t._storage)
    if storage is t._storage:
        return t
    return Tensor._make(storage, t._shape, t._strides, t._offset, t.dtype, storage.device)


def _read_into(file: BinaryIO, target: memoryview) -> int:
    readinto = getattr(file, "readinto", None)
    if readinto is None:
        data = file.read(len(target))
        target[:len(data)] = data
        return len(data)
    done = 0
    while done < len(target):
        count = readinto(target[done:])
        if not count:
            break
        done += count
    return done


def _decode(node: Any, tensors: dict[str, Tensor], made: dict[str, Any], weights_only: bool) -> Any:
    def decode(value: Any) -> Any:
        return _decode(value, tensors, made, weights_only)

    if isinstance(node, list):
        return [decode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        return _load_numpy(node, tensors, made, weights_only) if "numpy" in node else _load_tensor(node, tensors, made)
    if "__dtype__" in node:
        return dtypes.from_name(node["__dtype__"])
    if "__tuple__" in node:
        return tuple(decode(v) for v in node["__tuple__"])
    if "__items__" in node:
        return {decode(k): decode(v) for k, v in node["__items__"]}
    if "__ordered__" in node:
        ordered = OrderedDict(decode(node["__ordered__"]))
        if "_metadata" in node:
            ordered._metadata = decode(node["_metadata"])
        return ordered
    return {k: decode(v) for k, v in node.items()}


def _load_numpy(node: dict, tensors: dict[str, Tensor], made: dict[str, Any], weights_only: bool) -> Any:
    """A numpy array or scalar saved by ``_Encoder._numpy``: refused unless ``weights_only=False``, as torch.load
    refuses torch.save's pickle of one (its global is named as torch names it)."""
    spec = node["numpy"]
    key = "numpy:" + (node["view"][0] if node.get("view") else node["__tensor__"])
    if key in made:
        return made[key]
    if weights_only:
        name = "scalar" if spec.get("scalar") else "_reconstruct"
        raise _pickle.UnpicklingError(
            f"tilewise.load: Weights only load failed. Unsupported global: GLOBAL numpy._core.multiarray.{name} was "
            "not an allowed global by default. numpy arrays, scalars and dtypes load with weights_only=False, as "
            "with torch.load")
    t = _load_tensor(node, tensors, {})
    values = np.asarray(t.detach().cpu().numpy(), np.dtype(spec["dtype"]))
    fortran = bool(spec.get("fortran"))
    array = np.ndarray((0,), values.dtype)  # filled as numpy's unpickling fills it (an empty one's strides too)
    array.__setstate__((1, values.shape, values.dtype, fortran, values.tobytes("F" if fortran else "C")))
    made[key] = array[()] if spec.get("scalar") else array
    return made[key]


def _load_tensor(node: dict, tensors: dict[str, Tensor], made: dict[str, Tensor]) -> Tensor:
    """The tensor a JSON node stands for: a stored tensor, or a view of one (``"view"``: its own name, then
    its geometry). A tensor saved twice has two equal nodes, and comes back as one object."""
    name, view = node["__tensor__"], node.get("view")
    own = view[0] if view else name
    t = made.get(own)
    if t is not None:
        return t
    if name not in tensors:
        raise RuntimeError(f"tilewise.load: the checkpoint refers to tensor {name!r}, which the file does not "
                           "contain; the file is truncated or was edited")
    t = _view_of(tensors[name], view) if view else tensors[name]
    if node.get("parameter"):
        t = Parameter(t, requires_grad=bool(node.get("requires_grad")))
    elif node.get("requires_grad"):
        t.requires_grad_(True)
    made[own] = t
    return t


def _view_of(base: Tensor, view: list) -> Tensor:
    """A view ``[name, offset, shape, strides]`` of ``base``'s storage, relative to ``base``'s first element."""
    _, offset, shape, strides = view
    try:
        return base.detach().as_strided(tuple(shape), tuple(strides), base.storage_offset() + offset)
    except RuntimeError as exc:
        raise RuntimeError(f"tilewise.load: view {view[0]!r} does not fit the tensor it views ({exc}); the file was "
                           "edited or damaged") from None


def add_safe_globals(safe_globals: list) -> None:
    """Declare classes and functions a checkpoint may name (each the object, or ``(object, "module.name")``), as
    torch.serialization.add_safe_globals: loading creates, calls and fills in only these beyond its own allowlist
    (see [Note: safe globals])."""
    _pickle.SAFE_GLOBALS.update(safe_globals)


def get_safe_globals() -> list:
    return list(_pickle.SAFE_GLOBALS)


def clear_safe_globals() -> None:
    _pickle.SAFE_GLOBALS.clear()


class safe_globals:  # noqa: N801 — torch's name
    """The globals declared safe for the duration of a ``with`` block."""

    def __init__(self, safe_globals: list) -> None:
        self.safe_globals = safe_globals

    def __enter__(self) -> None:
        add_safe_globals(self.safe_globals)

    def __exit__(self, *exc) -> None:
        _pickle.SAFE_GLOBALS.difference_update(self.safe_globals)


__all__ = ["save", "load", "add_safe_globals", "get_safe_globals", "clear_safe_globals", "safe_globals"]
