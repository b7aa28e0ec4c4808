"""Pickle as ``torch.save`` writes it, read and written without importing torch and without running code.

[Note: restricted pickle] A pickle is a program: its GLOBAL opcode imports any name and REDUCE calls it, so
``pickle.load`` on an untrusted file can run ``os.system``. :class:`RestrictedUnpickler` is a small
interpreter of the pickle opcodes (protocols 2 to 5, the ones ``torch.save`` and ``pickle`` emit for data),
written after torch's ``weights_only`` unpickler: a GLOBAL resolves only through an allowlist the caller
passes (``"module.name" -> object``), and anything else raises ``pickle.UnpicklingError`` naming the global
before a single call is made; REDUCE and NEWOBJ call only objects that came from that allowlist; BUILD sets
attributes only on an ``OrderedDict`` (a state dict's ``_metadata``); persistent ids go to the caller's
``persistent_load``. Nothing is imported and nothing outside the allowlist is ever called.

:class:`PickleWriter` emits protocol 2, as ``torch.save`` does by default. It cannot use :mod:`pickle`'s own
Pickler, which checks every global by importing it (and torch is not there to import): it writes the data
types a checkpoint holds itself, and torch's rebuild calls as :class:`Global` / :class:`Call` /
:class:`Persistent` nodes that the caller's ``reduce`` hook substitutes for its tensors and storages.
Containers and hooked objects are memoized, so an object met twice is one object when loaded.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

try:
    from numpy._core import multiarray as _np_multiarray
except ImportError:  # numpy 1: the same module under its old name
    from numpy.core import multiarray as _np_multiarray

UnpicklingError = pickle.UnpicklingError

# [Note: safe globals] torch.serialization.add_safe_globals: the classes and functions a user declares trusted
# (each as the object, or as (object, "module.name")), which a checkpoint may then name: NEWOBJ creates instances of
# such a class, REDUCE calls it, and BUILD gives its instances their state (``__setstate__``, else the attributes).
# The set is the process's, as torch's is; anything not in it is still refused before a call is made.
SAFE_GLOBALS: set = set()


def user_allowed_globals() -> dict[str, Any]:
    """The declared safe globals by their full names (torch's ``_get_user_allowed_globals``, its errors too)."""
    names: dict[str, Any] = {}
    for entry in SAFE_GLOBALS:
        if isinstance(entry, tuple):
            if len(entry) != 2:
                raise ValueError(f"Expected tuple of length 2 (global, str of callable full path), but got tuple of "
                                 f"length: {len(entry)}")
            if type(entry[1]) is not str:
                raise TypeError(f"Expected second item in tuple to be str of callable full path, but got: "
                                f"{type(entry[1])}")
            names[entry[1]] = entry[0]
        else:
            names[f"{entry.__module__}.{entry.__qualname__}"] = entry
    return names


# ---------------------------------------------------------------------------- reading

def _encode_bytes(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode``, as protocol 2 spells a bytes object: only text codecs, never arbitrary ones."""
    if encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise UnpicklingError(f"_codecs.encode with encoding {encoding!r} is not allowed")
    return codecs.encode(text, encoding)


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``, as protocol 2 spells an empty bytes object (an empty array's data): nothing else."""
    if args:
        raise UnpicklingError("builtins.bytes with arguments is not allowed; protocol 2 calls it only for b''")
    return b""


BUILTIN_GLOBALS: dict[str, Any] = {
    "collections.OrderedDict": OrderedDict, "collections.Counter": Counter, "builtins.set": set,
    "builtins.frozenset": frozenset, "builtins.bytearray": bytearray, "builtins.complex": complex,
    "builtins.slice": slice, "_codecs.encode": _encode_bytes, "builtins.bytes": _empty_bytes,
}


class _NumpyArrayType:
    """What ``numpy.ndarray`` names in a pickle: the type ``_reconstruct`` makes, never a callable."""

    def __repr__(self) -> str:
        return "numpy.ndarray"


_NDARRAY = _NumpyArrayType()


def _np_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """numpy's ``_reconstruct``: an empty ndarray (never a subclass) that BUILD then fills from its state."""
    if subtype is not _NDARRAY or not isinstance(typecode, bytes) or not isinstance(shape, tuple):
        raise UnpicklingError(f"_reconstruct of {subtype!r}: only plain numpy arrays are loaded")
    return _np_multiarray._reconstruct(np.ndarray, shape, typecode)


def _np_dtype(spec: Any, align: Any = False, copy: Any = True) -> np.dtype:
    """``numpy.dtype(spec, align, copy)``: always a fresh dtype, so BUILD never changes numpy's own ones."""
    if not isinstance(spec, str):
        raise UnpicklingError(f"numpy.dtype of a {type(spec).__name__}: only dtypes named by a string are loaded")
    return np.dtype(spec, bool(align), True)


def _np_scalar(dtype: Any, data: Any = None) -> np.generic:
    if not isinstance(dtype, np.dtype):
        raise UnpicklingError(f"numpy scalar of {type(dtype).__name__}: a numpy scalar needs a dtype")
    return _np_multiarray.scalar(dtype, data) if data is not None else _np_multiarray.scalar(dtype)


# numpy's pickles of arrays, scalars and dtypes, under numpy 2's names and numpy 1's; allowed only by a load with
# weights_only=False, as torch.load allows them (see RestrictedUnpickler)
NUMPY_GLOBALS: dict[str, Any] = {
    "numpy.ndarray": _NDARRAY, "numpy.dtype": _np_dtype,
    "numpy._core.multiarray._reconstruct": _np_reconstruct, "numpy.core.multiarray._reconstruct": _np_reconstruct,
    "numpy._core.multiarray.scalar": _np_scalar, "numpy.core.multiarray.scalar": _np_scalar,
}


class RestrictedUnpickler:
    """Loads one pickle from ``file``, resolving globals only through ``allowed`` (see [Note: restricted pickle]).

    >>> import pickle, io
    >>> RestrictedUnpickler(io.BytesIO(pickle.dumps({"a": [1, 2.5, None]}, 2)), {}, None).load()
    {'a': [1, 2.5, None]}
    """

    def __init__(self, file: BinaryIO, allowed: dict[str, Any], persistent_load: Callable[[Any], Any] | None,
                 what: str = "tilewise.load"):
        self.read = file.read
        self.readline = file.readline
        self.allowed = {**BUILTIN_GLOBALS, **allowed}
        self.callable_ids = {id(v) for v in self.allowed.values()}
        self.user_types: set[int] = set()  # ids of the declared safe globals a GLOBAL named (see [Note: safe globals])
        self.persistent_load = persistent_load
        self.what = what
        self.memo: dict[int, Any] = {}

    def load(self) -> Any:
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        while True:
            key = self.read(1)
            if not key:
                raise UnpicklingError(f"{self.what}: the pickle ends before its STOP opcode (truncated file)")
            if key == pickle.STOP:
                return self.stack.pop()
            handler = _OPCODES.get(key[0])
            if handler is None:
                raise UnpicklingError(f"{self.what}: unsupported pickle opcode {key!r}; checkpoints are read with "
                                      "the opcodes of protocols 2 to 5 that data needs")
            handler(self)

    # -- helpers
    def _pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _global(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        if full not in self.allowed and SAFE_GLOBALS:
            user = user_allowed_globals()
            if full in user:
                self.user_types.update(id(v) for v in user.values())
                self.callable_ids.update(id(v) for v in user.values())
                return user[full]
        if full in NUMPY_GLOBALS and full not in self.allowed:
            raise UnpicklingError(
                f"{self.what}: Weights only load failed. Unsupported global: GLOBAL {full} was not an allowed global "
                "by default. numpy arrays, scalars and dtypes load with weights_only=False, as with torch.load "
                "(tilewise reads them without importing or running anything from the file)")
        if full not in self.allowed:
            raise UnpicklingError(
                f"{self.what}: Unsupported global: GLOBAL {full} is not allowed. Checkpoints may hold only tensors, "
                "storages, parameters, dtypes, devices, sizes and plain containers and values; loading never "
                "imports or calls anything else (as torch.load(weights_only=True)). If you trust this class or "
                f"function, allow it with `torch.serialization.add_safe_globals([{full}])` or the "
                f"`torch.serialization.safe_globals([{full}])` context manager")
        return self.allowed[full]

    def _check_callable(self, func: Any, opcode: str) -> None:
        if id(func) not in self.callable_ids:
            raise UnpicklingError(f"{self.what}: {opcode} of {type(func).__name__} {func!r}, which is not an "
                                  "allowed global")

    def _read_exactly(self, n: int) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise UnpicklingError(f"{self.what}: the pickle ends inside an opcode's argument (truncated file)")
        return data

    def _unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self._read_exactly(struct.calcsize(fmt)))[0]

    def _text(self, n: int) -> str:
        return str(self._read_exactly(n), "utf-8", "surrogatepass")


def _op_global(u: RestrictedUnpickler) -> None:
    module = u.readline()[:-1].decode("utf-8")
    name = u.readline()[:-1].decode("utf-8")
    u.stack.append(u._global(module, name))


def _op_stack_global(u: RestrictedUnpickler) -> None:
    name, module = u.stack.pop(), u.stack.pop()
    if not (isinstance(module, str) and isinstance(name, str)):
        raise UnpicklingError(f"{u.what}: STACK_GLOBAL needs two strings")
    u.stack.append(u._global(module, name))


def _op_reduce(u: RestrictedUnpickler) -> None:
    args = u.stack.pop()
    func = u.stack[-1]
    u._check_callable(func, "REDUCE (a call)")
    if not isinstance(args, tuple):
        raise UnpicklingError(f"{u.what}: REDUCE needs a tuple of arguments")
    u.stack[-1] = func(*args)


def _op_newobj(u: RestrictedUnpickler) -> None:
    args = u.stack.pop()
    cls = u.stack.pop()
    u._check_callable(cls, "NEWOBJ (an object's creation)")
    u.stack.append(cls.__new__(cls, *args) if isinstance(cls, type) else cls(*args))


def _op_build(u: RestrictedUnpickler) -> None:
    state = u.stack.pop()
    inst = u.stack[-1]
    if type(inst) is np.ndarray or isinstance(inst, np.dtype):  # made only by NUMPY_GLOBALS: numpy's own state
        if not isinstance(state, tuple):
            raise UnpicklingError(f"{u.what}: BUILD of a numpy {type(inst).__name__} needs a tuple state")
        try:
            inst.__setstate__(state)
        except (TypeError, ValueError) as exc:
            raise UnpicklingError(f"{u.what}: a numpy {type(inst).__name__} with a malformed state ({exc})") from None
        return
    if id(type(inst)) in u.user_types:  # a declared safe class: its state as pickle's load_build sets it
        if hasattr(inst, "__setstate__"):
            inst.__setstate__(state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        if state:
            inst.__dict__.update(state)
        for key, value in (slotstate or {}).items():
            setattr(inst, key, value)
        return
    if type(inst) is not OrderedDict or not isinstance(state, dict):
        raise UnpicklingError(f"{u.what}: BUILD (setting an object's state) is allowed only with a dict on an "
                              f"OrderedDict, not on a {type(inst).__name__}")
    inst.__dict__.update(state)


def _op_persid(u: RestrictedUnpickler) -> None:
    pid = u.stack.pop()
    if u.persistent_load is None:
        raise UnpicklingError(f"{u.what}: the pickle refers to external data (a persistent id) where none is expected")
    u.stack.append(u.persistent_load(pid))


def _op_append(u: RestrictedUnpickler) -> None:
    item = u.stack.pop()
    _list_target(u).append(item)


def _op_appends(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    _list_target(u).extend(items)


def _list_target(u: RestrictedUnpickler) -> list:
    target = u.stack[-1]
    if type(target) is not list:
        raise UnpicklingError(f"{u.what}: APPEND to a {type(target).__name__}; only lists can be appended to")
    return target


def _op_setitem(u: RestrictedUnpickler) -> None:
    value, key = u.stack.pop(), u.stack.pop()
    _dict_target(u)[key] = value


def _op_setitems(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    target = _dict_target(u)
    for k in range(0, len(items), 2):
        target[items[k]] = items[k + 1]


def _dict_target(u: RestrictedUnpickler) -> dict:
    target = u.stack[-1]
    if type(target) not in (dict, OrderedDict, Counter):
        raise UnpicklingError(f"{u.what}: SETITEM on a {type(target).__name__}; only dicts take items")
    return target


def _op_additems(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    target = u.stack[-1]
    if type(target) is not set:
        raise UnpicklingError(f"{u.what}: ADDITEMS on a {type(target).__name__}; only sets take items")
    target.update(items)


def _op_mark(u: RestrictedUnpickler) -> None:
    u.metastack.append(u.stack)
    u.stack = []


def _op_pop_mark(u: RestrictedUnpickler) -> None:
    u._pop_mark()


def _op_tuple(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    u.stack.append(tuple(items))


def _op_tuple_n(n: int) -> Callable[[RestrictedUnpickler], None]:
    def op(u: RestrictedUnpickler) -> None:
        if len(u.stack) < n:
            raise UnpicklingError(f"{u.what}: TUPLE{n} on a stack of {len(u.stack)}")
        items = tuple(u.stack[len(u.stack) - n:])
        del u.stack[len(u.stack) - n:]
        u.stack.append(items)
    return op


def _op_frozenset(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    u.stack.append(frozenset(items))


def _op_get(u: RestrictedUnpickler, index: int) -> None:
    if index not in u.memo:
        raise UnpicklingError(f"{u.what}: the pickle reads memo entry {index}, which it never wrote")
    u.stack.append(u.memo[index])


def _op_memoize(u: RestrictedUnpickler) -> None:
    u.memo[len(u.memo)] = u.stack[-1]


def _op_frame(u: RestrictedUnpickler) -> None:
    u._unpack("<Q")  # frames only group opcodes for buffered readers


def _op_proto(u: RestrictedUnpickler) -> None:
    proto = u._read_exactly(1)[0]
    if proto > 5:
        raise UnpicklingError(f"{u.what}: pickle protocol {proto} is newer than any this reader knows (2 to 5)")


def _push(value_of: Callable[[RestrictedUnpickler], Any]) -> Callable[[RestrictedUnpickler], None]:
    def op(u: RestrictedUnpickler) -> None:
        u.stack.append(value_of(u))
    return op


def _long(u: RestrictedUnpickler, length_fmt: str) -> int:
    n = u._unpack(length_fmt)
    return int.from_bytes(u._read_exactly(n), "little", signed=True)


def _put(u: RestrictedUnpickler, index: int) -> None:
    u.memo[index] = u.stack[-1]


_OPCODES: dict[int, Callable[[RestrictedUnpickler], None]] = {
    pickle.GLOBAL[0]: _op_global, pickle.STACK_GLOBAL[0]: _op_stack_global, pickle.REDUCE[0]: _op_reduce,
    pickle.NEWOBJ[0]: _op_newobj, pickle.BUILD[0]: _op_build, pickle.BINPERSID[0]: _op_persid,
    pickle.APPEND[0]: _op_append, pickle.APPENDS[0]: _op_appends, pickle.SETITEM[0]: _op_setitem,
    pickle.SETITEMS[0]: _op_setitems, pickle.ADDITEMS[0]: _op_additems, pickle.MARK[0]: _op_mark,
    pickle.POP_MARK[0]: _op_pop_mark, pickle.POP[0]: lambda u: u.stack.pop(),
    pickle.DUP[0]: lambda u: u.stack.append(u.stack[-1]),
    pickle.TUPLE[0]: _op_tuple, pickle.TUPLE1[0]: _op_tuple_n(1), pickle.TUPLE2[0]: _op_tuple_n(2),
    pickle.TUPLE3[0]: _op_tuple_n(3), pickle.FROZENSET[0]: _op_frozenset,
    pickle.NONE[0]: _push(lambda u: None), pickle.NEWTRUE[0]: _push(lambda u: True),
    pickle.NEWFALSE[0]: _push(lambda u: False), pickle.EMPTY_TUPLE[0]: _push(lambda u: ()),
    pickle.EMPTY_LIST[0]: _push(lambda u: []), pickle.EMPTY_DICT[0]: _push(lambda u: {}),
    pickle.EMPTY_SET[0]: _push(lambda u: set()),
    pickle.BININT[0]: _push(lambda u: u._unpack("<i")), pickle.BININT1[0]: _push(lambda u: u._read_exactly(1)[0]),
    pickle.BININT2[0]: _push(lambda u: u._unpack("<H")), pickle.LONG1[0]: _push(lambda u: _long(u, "<B")),
    pickle.LONG4[0]: _push(lambda u: _long(u, "<i")), pickle.BINFLOAT[0]: _push(lambda u: u._unpack(">d")),
    pickle.BINUNICODE[0]: _push(lambda u: u._text(u._unpack("<I"))),
    pickle.SHORT_BINUNICODE[0]: _push(lambda u: u._text(u._read_exactly(1)[0])),
    pickle.BINUNICODE8[0]: _push(lambda u: u._text(u._unpack("<Q"))),
    pickle.SHORT_BINSTRING[0]: _push(lambda u: u._read_exactly(u._read_exactly(1)[0]).decode("latin1")),
    pickle.BINSTRING[0]: _push(lambda u: u._read_exactly(u._unpack("<i")).decode("latin1")),
    pickle.SHORT_BINBYTES[0]: _push(lambda u: u._read_exactly(u._read_exactly(1)[0])),
    pickle.BINBYTES[0]: _push(lambda u: u._read_exactly(u._unpack("<I"))),
    pickle.BINBYTES8[0]: _push(lambda u: u._read_exactly(u._unpack("<Q"))),
    pickle.BYTEARRAY8[0]: _push(lambda u: bytearray(u._read_exactly(u._unpack("<Q")))),
    pickle.BINGET[0]: lambda u: _op_get(u, u._read_exactly(1)[0]),
    pickle.LONG_BINGET[0]: lambda u: _op_get(u, u._unpack("<I")),
    pickle.BINPUT[0]: lambda u: _put(u, u._read_exactly(1)[0]),
    pickle.LONG_BINPUT[0]: lambda u: _put(u, u._unpack("<I")),
    pickle.MEMOIZE[0]: _op_memoize, pickle.FRAME[0]: _op_frame, pickle.PROTO[0]: _op_proto,
}


def restricted_loads(data: bytes, allowed: dict[str, Any], persistent_load=None, what: str = "tilewise.load") -> Any:
    return RestrictedUnpickler(io.BytesIO(data), allowed, persistent_load, what).load()


# ---------------------------------------------------------------------------- writing

@dataclass(frozen=True)
class Global:
    """A name written with the GLOBAL opcode (``torch._utils._rebuild_tensor_v2``, ``torch.float32``)."""
    module: str
    name: str


@dataclass(frozen=True)
class Call:
    """``func(*args)`` written as GLOBAL, the arguments' tuple, REDUCE; ``state`` (a dict) is then BUILD."""
    func: Global
    args: tuple
    state: Any = None


@dataclass(frozen=True)
class Persistent:
    """A persistent id: the loader's ``persistent_load`` turns it into an object (torch: a storage)."""
    pid: tuple


class PickleWriter:
    """Writes a protocol-2 pickle of plain data; ``reduce(obj)`` may replace any object by a :class:`Call`,
    :class:`Global` or :class:`Persistent` node (returning None leaves it to the built-in rules).

    >>> import pickle
    >>> pickle.loads(PickleWriter().dumps({"a": (1, 2.5), "b": [None, "x", b"\\x00"]}))
    {'a': (1, 2.5), 'b': [None, 'x', b'\\x00']}
    """

    def __init__(self, reduce: Callable[[Any], Any] | None = None, what: str = "tilewise.save"):
        self.reduce = reduce or (lambda obj: None)
        self.what = what

    def dumps(self, obj: Any) -> bytes:
        self.out = io.BytesIO()
        self.memo: dict[Any, int] = {}
        self.keep_alive: list[Any] = []  # memo keys are ids: the objects must outlive the write
        self.out.write(pickle.PROTO + b"\x02")
        self.save(obj, "")
        self.out.write(pickle.STOP)
        return self.out.getvalue()

    def save(self, obj: Any, path: str) -> None:
        if self._save_atom(obj):
            return
        key = ("id", id(obj))
        if key in self.memo:
            self._get(self.memo[key])
            return
        node = obj if isinstance(obj, (Global, Call, Persistent)) else self.reduce(obj)
        if node is None:
            node = _numpy_reduce(obj)
        if node is not None:
            self._save_node(node, path)
            self._memoize(key, obj)
        elif isinstance(obj, (list, dict)):
            self._save_container(obj, key, path)
        elif isinstance(obj, tuple):
            refuse_named_tuple(obj, self.what, path)
            self._save_tuple(obj, path)
            self._memoize(key, obj)
        elif isinstance(obj, (set, frozenset)):
            kind = "set" if isinstance(obj, set) else "frozenset"
            self._save_node(Call(Global("builtins", kind), (list(obj),)), path)
            self._memoize(key, obj)
        else:
            where = path or "the top level"
            raise TypeError(f"{self.what}: cannot store a {type(obj).__name__} at {where!r} in a torch checkpoint; "
                            "it holds tensors, numbers, strings, bytes, None, dtypes, devices, lists, tuples, sets "
                            f"and dicts{state_dict_hint(obj)}")

    def _save_atom(self, obj: Any) -> bool:
        write = self.out.write
        if obj is None:
            write(pickle.NONE)
        elif obj is True or obj is False:
            write(pickle.NEWTRUE if obj else pickle.NEWFALSE)
        elif isinstance(obj, int):  # subclasses (an IntEnum) are written as their value, as numpy's float64 is
            self._save_int(int(obj))
        elif isinstance(obj, float):
            write(pickle.BINFLOAT + struct.pack(">d", float(obj)))
        elif isinstance(obj, str):
            data = str(obj).encode("utf-8", "surrogatepass")
            write(pickle.BINUNICODE + struct.pack("<I", len(data)) + data)
        elif type(obj) is bytes:  # protocol 2 has no bytes opcode: it spells them as _codecs.encode(text, "latin1")
            self._save_node(Call(Global("_codecs", "encode"), (obj.decode("latin1"), "latin1")), "")
        elif type(obj) is complex:
            self._save_node(Call(Global("builtins", "complex"), (obj.real, obj.imag)), "")
        else:
            return False
        return True

    def _save_int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out.write(pickle.BININT1 + bytes([value]))
        elif 0 <= value < 65536:
            self.out.write(pickle.BININT2 + struct.pack("<H", value))
        elif -(1 << 31) <= value < (1 << 31):
            self.out.write(pickle.BININT + struct.pack("<i", value))
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out.write(pickle.LONG1 + bytes([len(data)]) + data)

    def _save_node(self, node: Any, path: str) -> None:
        if isinstance(node, Global):
            self._save_global(node)
        elif isinstance(node, Persistent):
            self._save_tuple(node.pid, path)
            self.out.write(pickle.BINPERSID)
        elif isinstance(node, Call):
            self._save_global(node.func)
            self._save_tuple(node.args, path)
            self.out.write(pickle.REDUCE)
            if node.state:
                self.save(node.state, path)
                self.out.write(pickle.BUILD)
        else:
            self.save(node, path)

    def _save_global(self, ref: Global) -> None:
        key = ("global", ref.module, ref.name)
        if key in self.memo:
            self._get(self.memo[key])
            return
        module, name = ref.module, ref.name
        if (module, name) in _compat_pickle.REVERSE_NAME_MAPPING:  # protocol 2 spells builtins as __builtin__
            module, name = _compat_pickle.REVERSE_NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.REVERSE_IMPORT_MAPPING:
            module = _compat_pickle.REVERSE_IMPORT_MAPPING[module]
        self.out.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        self._put(key)

    def _save_tuple(self, items: tuple, path: str) -> None:
        if not items:
            self.out.write(pickle.EMPTY_TUPLE)
            return
        opcode = {1: pickle.TUPLE1, 2: pickle.TUPLE2, 3: pickle.TUPLE3}.get(len(items))
        if opcode is None:
            self.out.write(pickle.MARK)
        for k, item in enumerate(items):
            self.save(item, _join(path, str(k)))
        self.out.write(opcode or pickle.TUPLE)

    def _save_container(self, obj: list | dict, key: Any, path: str) -> None:
        if type(obj) in (list, dict):
            self.out.write(pickle.EMPTY_LIST if isinstance(obj, list) else pickle.EMPTY_DICT)
        elif isinstance(obj, OrderedDict):
            self._save_node(Call(Global("collections", "OrderedDict"), ()), path)
        elif type(obj) is Counter:  # as Counter.__reduce__ spells it (MultiStepLR's milestones are one)
            self._save_node(Call(Global("collections", "Counter"), (dict(obj),)), path)
            self._memoize(key, obj)
            return
        else:
            raise TypeError(f"{self.what}: cannot store a {type(obj).__name__} (a {type(obj).__base__.__name__} "
                            f"subclass) at {path or 'the top level'!r}; convert it to a plain one first")
        self._memoize(key, obj)  # before the items, so that a container that holds itself refers back to it
        if isinstance(obj, list):
            self._save_batched(pickle.APPENDS, [(item, str(k)) for k, item in enumerate(obj)], path)
        else:
            self._save_batched(pickle.SETITEMS, list(obj.items()), path, pairs=True)
        state = getattr(obj, "__dict__", None)
        if isinstance(obj, OrderedDict) and state:
            self.save(dict(state), path)
            self.out.write(pickle.BUILD)

    def _save_batched(self, opcode: bytes, entries: list, path: str, pairs: bool = False) -> None:
        for start in range(0, len(entries), 1000):  # as pickle batches, so no stack grows without bound
            self.out.write(pickle.MARK)
            for first, second in entries[start:start + 1000]:
                if pairs:
                    self.save(first, path)
                    self.save(second, _join(path, str(first)))
                else:
                    self.save(first, _join(path, second))
            self.out.write(opcode)

    def _memoize(self, key: Any, obj: Any) -> None:
        self.keep_alive.append(obj)
        self._put(key)

    def _put(self, key: Any) -> None:
        index = len(self.memo)
        self.memo[key] = index
        self.out.write(pickle.BINPUT + bytes([index]) if index < 256 else pickle.LONG_BINPUT + struct.pack("<I", index))

    def _get(self, index: int) -> None:
        self.out.write(pickle.BINGET + bytes([index]) if index < 256 else pickle.LONG_BINGET + struct.pack("<I", index))


_NUMPY_NAMES = {id(np.ndarray): Global("numpy", "ndarray"), id(np.dtype): Global("numpy", "dtype"),
                id(_np_multiarray._reconstruct): Global(_np_multiarray.__name__, "_reconstruct"),
                id(_np_multiarray.scalar): Global(_np_multiarray.__name__, "scalar")}


def _numpy_reduce(obj: Any) -> Call | None:
    """A numpy array, scalar or dtype as numpy pickles itself (and so as torch.save writes it); None for
    anything else. An array of objects holds its objects as a list, each then saved by the usual rules."""
    if not (type(obj) is np.ndarray or isinstance(obj, (np.generic, np.dtype))):
        return None
    func, args, *state = obj.__reduce__()
    names = [_NUMPY_NAMES.get(id(func))] + [_NUMPY_NAMES.get(id(a)) for a in args if isinstance(a, type)]
    if None in names:
        raise TypeError(f"cannot store {obj!r}: numpy pickles it with {func!r}, which checkpoints do not hold")
    args = tuple(_NUMPY_NAMES[id(a)] if isinstance(a, type) else a for a in args)
    return Call(names[0], args, state[0] if state else None)


def refuse_named_tuple(obj: tuple, what: str, path: str) -> None:
    """A namedtuple would come back a plain tuple (its class is code, which loading never imports): refused by
    name rather than changed silently. torch.load(weights_only=True) refuses one too."""
    if type(obj) is not tuple and hasattr(obj, "_fields"):
        raise TypeError(f"{what}: cannot store a {type(obj).__name__} (a namedtuple) at {path or 'the top level'!r}: "
                        "tilewise.load never imports code from a file, so it could not come back as one; store its "
                        "_asdict() or tuple(...) instead")


def state_dict_hint(obj: Any) -> str:
    """For an object with a state dict (a module, an optimizer, a scheduler): what to save instead of it."""
    if not callable(getattr(obj, "state_dict", None)):
        return ""
    return (f". Save its state_dict() and load that into a new {type(obj).__name__} with load_state_dict(): "
            "tilewise.load never imports or calls code from a file, so a pickled object could not be loaded back")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


__all__ = ["Call", "Global", "Persistent", "PickleWriter", "RestrictedUnpickler", "UnpicklingError",
           "refuse_named_tuple", "restricted_loads"]
