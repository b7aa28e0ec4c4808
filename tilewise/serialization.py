"""Checkpoints: ``tilewise.save`` and ``tilewise.load`` on safetensors, with JSON for everything else.

[Note: checkpoint format] A checkpoint is one safetensors file. Its tensors are stored under the dotted
path at which they sit in the saved object (``fc.weight`` for a state dict, ``state.0.exp_avg`` for an
optimizer's), so any safetensors reader sees meaningful names. The rest of the object — dicts (with any
key type), lists, tuples, numbers, strings, dtypes — is written as JSON into the file's ``__metadata__``
under ``"tilewise"``, with ``{"__tensor__": name}`` where a tensor stood. A tensor object that appears
twice is stored once and comes back as one object. No pickle is involved, so loading a checkpoint never
runs code. A safetensors file written by another library (torch's ``save_file``, say) has no such entry
and loads as a plain ``{name: tensor}`` dict.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, BinaryIO

import numpy as np

from tilewise import dtypes
from tilewise.tensor import Tensor, from_array

# safetensors' header codes; its writer takes the torch-style names, which are tilewise's dtype names
_SAFETENSORS_DTYPES = {
    dtypes.bool_: "BOOL", dtypes.uint8: "U8", dtypes.int8: "I8", dtypes.int16: "I16", dtypes.int32: "I32",
    dtypes.int64: "I64", dtypes.float16: "F16", dtypes.bfloat16: "BF16", dtypes.float32: "F32", dtypes.float64: "F64",
    dtypes.float8_e4m3fn: "F8_E4M3", dtypes.float8_e5m2: "F8_E5M2",
}
_FROM_SAFETENSORS = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}
_METADATA_KEY = "tilewise"


class _Encoder:
    """Turns an object into JSON-able structure plus a ``{name: contiguous numpy array}`` table."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}

    def encode(self, obj: Any, path: str) -> Any:
        if isinstance(obj, Tensor):
            return self._tensor(obj, path)
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, dtypes.DType):
            return {"__dtype__": obj.name}
        if isinstance(obj, tuple):
            return {"__tuple__": [self.encode(v, _join(path, str(k))) for k, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, _join(path, str(k))) for k, v in enumerate(obj)]
        if isinstance(obj, dict):
            items = [(k, self.encode(v, _join(path, str(k)))) for k, v in obj.items()]
            if all(isinstance(k, str) and not k.startswith("__") for k, _ in items):
                return dict(items)
            return {"__items__": [[self.encode(k, ""), v] for k, v in items]}
        raise TypeError(f"tilewise.save: cannot store a {type(obj).__name__} at {path or 'the top level'!r}; "
                        "checkpoints hold tensors, numbers, strings, None, dtypes, lists, tuples and dicts")

    def _tensor(self, t: Tensor, path: str) -> dict:
        name = self.names.get(id(t))
        if name is None:
            name = path or "tensor"
            while name in self.arrays:
                name += "_"
            self.names[id(t)] = name
            self.arrays[name] = np.ascontiguousarray(t.detach().cpu()._np()).reshape(t.shape)  # keeps 0-dim as 0-dim
        out: dict = {"__tensor__": name}
        if t.requires_grad:
            out["requires_grad"] = True
        return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def save(obj: Any, f: str | os.PathLike | BinaryIO) -> None:
    """Write ``obj`` (a state dict, an optimizer state, or any nest of tensors and plain values) to ``f``.

    >>> import io, tilewise as tw
    >>> buf = io.BytesIO()
    >>> tw.save({"w": tw.ones(2), "step": 3}, buf)
    >>> _ = buf.seek(0)
    >>> tw.load(buf)["step"]
    3
    """
    from safetensors import TensorSpec, serialize

    encoder = _Encoder()
    structure = encoder.encode(obj, "")
    specs = {name: TensorSpec(dtype=dtypes.from_numpy(a.dtype).name, shape=list(a.shape),
                              data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, a in encoder.arrays.items()}
    data = serialize(specs, {_METADATA_KEY: json.dumps(structure, allow_nan=True)})
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            fh.write(data)
    else:
        f.write(data)


def load(f: str | os.PathLike | BinaryIO, map_location=None, weights_only: bool = True) -> Any:
    """Read a checkpoint written by ``tilewise.save``, or any safetensors file (as ``{name: tensor}``).

    ``map_location`` moves every tensor to that device. ``weights_only`` is accepted for torch
    compatibility; checkpoints never contain code, so loading is always weights-only.
    """
    from safetensors import deserialize

    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            data = fh.read()
    else:
        data = f.read()
    tensors = {name: _tensor_from(entry, name, map_location) for name, entry in deserialize(data)}
    metadata = _header_metadata(data)
    if _METADATA_KEY not in metadata:
        return tensors
    return _decode(json.loads(metadata[_METADATA_KEY]), tensors, {})


def _header_metadata(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]).get("__metadata__") or {}


def _tensor_from(entry: dict, name: str, map_location) -> Tensor:
    dtype = _FROM_SAFETENSORS.get(entry["dtype"])
    if dtype is None:
        raise TypeError(f"tilewise.load: tensor {name!r} has safetensors dtype {entry['dtype']}, which tilewise does "
                        f"not support; supported: {', '.join(_FROM_SAFETENSORS)}")
    array = np.frombuffer(entry["data"], dtype=dtype.np).reshape(entry["shape"])
    t = from_array(array, dtype)
    return t.to(map_location) if map_location is not None else t


def _decode(node: Any, tensors: dict[str, Tensor], made: dict[str, Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, made) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        return _load_tensor(node, tensors, made)
    if "__dtype__" in node:
        return dtypes.from_name(node["__dtype__"])
    if "__tuple__" in node:
        return tuple(_decode(v, tensors, made) for v in node["__tuple__"])
    if "__items__" in node:
        return {_decode(k, tensors, made): _decode(v, tensors, made) for k, v in node["__items__"]}
    return {k: _decode(v, tensors, made) for k, v in node.items()}


def _load_tensor(node: dict, tensors: dict[str, Tensor], made: dict[str, Tensor]) -> Tensor:
    name = node["__tensor__"]
    t = made.get(name)
    if t is None:
        if name not in tensors:
            raise RuntimeError(f"tilewise.load: the checkpoint refers to tensor {name!r}, which the file does not "
                               "contain; the file is truncated or was edited")
        t = tensors[name]
        if node.get("requires_grad"):
            t.requires_grad_(True)
        made[name] = t
    return t


__all__ = ["save", "load"]
