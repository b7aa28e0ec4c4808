"""Guards: when a compiled variant applies to a call, and what a trace read from (or did to) Python state.

[Note: Python-state guards] A variant is a trace of one call, replayed on later calls, so it is right only
while everything the trace read is unchanged. Tensors are guarded by ``Guards`` (shape, strides, dtype,
device, requires_grad and sharing of every tensor the program reads). Python values are recorded while the
trace runs, by a ``Recorder``:
  globals   — every name a user function's code loads with LOAD_GLOBAL (read from its code object when the
              frame starts), with the value it had;
  cells     — the closure variables a user function's code loads (its ``__closure__`` cells);
  attributes — reads of attributes of the objects reached from those values, from the arguments and from
              ``self``: the class of each such object gets, for the duration of the trace, a
              ``__getattribute__``/``__getattr__`` that records (object, name, value) for instance attributes
              (``__dict__``, slots, a module's parameters/buffers/submodules) and plain class attributes, and a
              ``__setattr__``/``__delattr__`` that notices writes. Methods and properties are code, not state.
"User" code is every frame outside this package's own modules (``tilewise/models`` counts as user code).
A value is compared by ``value_key``: numbers (but a compiled function's dynamic number arguments, guarded by type:
[Note: dynamic numbers] in ``numbers.py``), strings and None by value, tuples element by element,
lists/dicts/sets by identity, length and (for up to 256 entries) their elements' keys, numpy arrays of up to
4096 elements by value (larger ones by identity, shape and dtype), everything else by identity. The default
dtype and device, grad mode, the autocast state and the backend flags that decide a GEMM's numerics (TF32,
reduced-precision reductions, deterministic mode: ``backends/flags.py``) are guarded too.

Checking hundreds of module attribute reads on every call would cost more than some steps' kernels, so a
class may declare ``_tw_version``, a one-element list it increments whenever any of its instances changes
(``nn.Module`` does, for attribute assignment and its parameter/buffer/module/hook tables): those reads are
re-checked only when that counter moved. Mutable containers read from such objects are checked every call.

The same records tell whether the trace had *side effects* a replay would not repeat: after the trace,
every read is evaluated again (a value the function changed — a counter, a list it appended to — differs
from what it read first), a write to an object the trace reached is noticed by the patched ``__setattr__``,
and ``print``, logging, Python's and numpy's random state and a change to a tensor's own metadata
(``requires_grad_``) are watched directly. A function with side effects is not replayed: it runs its Python
on every call (see [Note: segmented calls] in ``compiler/segments.py``). What the records cannot see —
mutations nested deeper than a container's elements, state inside C objects, file writes — is the limit of
this scheme; ``TILEWISE_LOG=recompiles`` shows every guard that failed.
"""

from __future__ import annotations

import builtins
import dis
import enum
import functools
import gc
import logging
import operator
import os
import random
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass, field

import numpy as np

from tilewise.amp.autocast_mode import describe as describe_autocast
from tilewise.backends import flags
from tilewise.compiler.capture import LAYOUT_FIELDS, Source, Traced, signature
from tilewise.compiler.errors import _GENERATED
from tilewise.compiler.numbers import admits
from tilewise.dispatch import STATE
from tilewise.dtypes import get_default_dtype
from tilewise.tensor import Tensor

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARIES = tuple({os.path.abspath(sysconfig.get_path(name)) + os.sep
                    for name in ("stdlib", "platstdlib", "purelib", "platlib")})
_USER_DIRS = (os.path.join(_PACKAGE_DIR, "models") + os.sep,)  # inside the package, but written like user code
_MISSING = object()
_PLAIN = (int, bool, str, bytes, type(None), complex)
_CONTAINER_ELEMENTS = 256  # containers up to this size are compared element by element
_ARRAY_ELEMENTS = 4096  # numpy arrays up to this size are compared by value


# ---------------------------------------------------------------------------- values


def value_key(value, depth: int = 1):
    """What a guard compares a Python value by (see [Note: Python-state guards])."""
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return (float, repr(value))  # tells -0.0 from 0.0 and keeps NaN equal to itself
    if kind is tuple:
        return (tuple, tuple(value_key(v, depth) for v in value)) if len(value) <= _CONTAINER_ELEMENTS else \
            (tuple, id(value), len(value))
    if kind is np.ndarray:  # a trace that made a tensor of it holds a copy: small arrays are compared by value
        if value.size <= _ARRAY_ELEMENTS:
            return (kind, id(value), value.shape, value.dtype.str, value.tobytes())
        return (kind, id(value), value.shape, value.dtype.str)
    if isinstance(value, (list, dict, set, frozenset)) and not isinstance(value, tuple):
        if depth <= 0 or len(value) > _CONTAINER_ELEMENTS:
            return (kind, id(value), len(value))
        if isinstance(value, dict):
            return (kind, id(value), tuple((value_key(k, 0), value_key(v, depth - 1)) for k, v in value.items()))
        if isinstance(value, (set, frozenset)):
            return (kind, id(value), frozenset(value_key(v, 0) for v in value))
        return (kind, id(value), tuple(value_key(v, depth - 1) for v in value))
    return (kind, id(value))


def _is_mutable_container(value) -> bool:
    """A list, dict or set whose changes nothing counts (a versioned class's own tables bump its counter)."""
    return isinstance(value, (list, dict, set)) and getattr(type(value), "_tw_version", None) is None


def _key_text(key) -> str:
    """The value a ``value_key`` was made from, as text, where the key holds it."""
    if key[0] is float:
        return key[1]
    if key[0] in _PLAIN:
        return repr(key[1])
    return f"another {key[0].__name__}"


def describe_value(value) -> str:
    text = repr(value) if type(value) in (*_PLAIN, float) else f"a {type(value).__name__} object"
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------- reads


@dataclass(eq=False)
class Read:
    """One Python value the trace read: ``where`` fetches it again; ``key`` is what it was."""

    label: str  # e.g. "global lr", "closure variable scale", "Block.dropout_p"
    fetch: object  # () -> the value now (or _MISSING)
    key: object
    holds: object = None  # keeps the object whose id the key contains alive (ids are not reused)
    versioned: bool = False  # re-checked only when its class's _tw_version moved
    same: object = _MISSING  # the object itself, where the key is its identity (one ``is`` to check)

    def changed(self) -> bool:
        try:
            value = self.fetch()
            if self.same is not _MISSING:
                return value is not self.same
            return value_key(value) != self.key
        except Exception:  # noqa: BLE001 — a value that can no longer be read has changed
            return True


def _global_fetch(namespace: dict, name: str):
    return lambda: namespace.get(name, _MISSING)


def _cell_fetch(cell):
    def fetch():
        try:
            return cell.cell_contents
        except ValueError:
            return _MISSING

    return fetch


def _attribute_fetch(owner, name: str):
    return lambda: getattr(owner, name, _MISSING)


def _class_attribute_fetch(cls: type, name: str):
    return lambda: cls.__dict__.get(name, _MISSING)


# ---------------------------------------------------------------------------- the recorder


class _Current(threading.local):
    recorder = None  # the Recorder of the trace running in this thread, if any


_CURRENT = _Current()
_PATCH_LOCK = threading.RLock()
_PATCHED: dict[type, list] = {}  # class -> [count of recorders using it, {name: original or _MISSING}]


def _in_libraries(path: str) -> bool:
    """The standard library and installed packages: code whose module state a compiled function does not own."""
    return os.path.abspath(path).startswith(_LIBRARIES)


def _in_package(path: str) -> bool:
    path = os.path.abspath(path)
    return path.startswith(_PACKAGE_DIR + os.sep) and not path.startswith(_USER_DIRS)


@dataclass
class _CodeFacts:
    user: bool
    globals_read: tuple[str, ...] = ()
    globals_written: tuple[str, ...] = ()
    cells_read: tuple[str, ...] = ()
    cells_written: tuple[str, ...] = ()
    module_attributes: tuple[tuple[str, str], ...] = ()  # (global, attribute): ``config.LR``, ``utils.helper``
    nested: tuple[types.CodeType, ...] = ()  # functions and lambdas defined inside


_CODE_FACTS: dict[types.CodeType, _CodeFacts] = {}


def _code_facts(code: types.CodeType) -> _CodeFacts:
    facts = _CODE_FACTS.get(code)
    if facts is None:
        if code.co_filename.startswith(_GENERATED) or _in_package(code.co_filename) or \
                _in_libraries(code.co_filename):
            facts = _CodeFacts(False)  # the package and its generated code (binders, formulas), libraries
        else:
            facts = _read_code(code)
        _CODE_FACTS[code] = facts
    return facts


def _read_code(code: types.CodeType) -> _CodeFacts:
    loads, stores, cell_loads, cell_stores, attributes = set(), set(), set(), set(), set()
    free = set(code.co_freevars)
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            loads.add(ins.argval)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and previous is not None and \
                previous.opname == "LOAD_GLOBAL":
            attributes.add((previous.argval, ins.argval))
        elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            stores.add(ins.argval)
        elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval in free:
            cell_loads.add(ins.argval)
        elif ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in free:
            cell_stores.add(ins.argval)
        if ins.opname not in ("CACHE", "EXTENDED_ARG"):
            previous = ins
    nested = tuple(c for c in code.co_consts if isinstance(c, types.CodeType))
    return _CodeFacts(True, tuple(sorted(loads)), tuple(sorted(stores)), tuple(sorted(cell_loads)),
                      tuple(sorted(cell_stores)), tuple(sorted(attributes)), nested)


def _watchable(cls: type) -> bool:
    """Whether the attribute reads of ``cls``'s instances are recorded: Python classes of user code, and the
    package's classes that version their state (``_tw_version``, as nn.Module)."""
    if not (cls.__flags__ & (1 << 9)) or cls.__flags__ & (1 << 8):  # HEAPTYPE and not IMMUTABLETYPE: a class
        return False                                                 # statement's, whose attributes can be set
    if issubclass(cls, (Tensor, BaseException, type, enum.Enum, types.ModuleType, dict, list, set, tuple)):
        return False
    if cls.__module__.split(".")[0] == "tilewise" and getattr(cls, "_tw_version", None) is None:
        return False
    return True


def _owner_of(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass, klass.__dict__[name]
    return None, _MISSING


def _is_state(attribute) -> bool:
    """Whether a class attribute is a value (state) rather than code (methods, properties, descriptors)."""
    if isinstance(attribute, (types.FunctionType, types.BuiltinFunctionType, staticmethod, classmethod,
                              property, types.MethodDescriptorType, types.WrapperDescriptorType, type)):
        return False
    return not (hasattr(type(attribute), "__get__"))


class Recorder:
    """Records the Python state a trace reads and the side effects it has (see [Note: Python-state guards])."""

    def __init__(self, fn, arguments: list, fullgraph: bool) -> None:
        self.fn = fn
        self.fullgraph = fullgraph
        self.reads: dict[tuple, Read] = {}
        self.effects: list[str] = []  # side effects seen, described for the log
        self.known: dict[int, object] = {}  # objects reached from the roots (held: their ids stay theirs)
        self.classes: list[type] = []
        self.thread = threading.get_ident()
        self.busy = False
        self._seen_codes: set[types.CodeType] = set()
        self._base = None
        self._arguments = arguments

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> Recorder:
        self._random_state = random.getstate()
        self._numpy_state = _numpy_random_position()
        _CURRENT.recorder = self
        self._base = sys._getframe(1)  # the frame that runs the traced function (``with recorder:``)
        self._watch_roots()
        _watch_output()
        return self

    def __exit__(self, *exc) -> bool:
        _CURRENT.recorder = None
        self._base = None  # the frame holds this recorder: keeping it would make a cycle of every traced call
        _unwatch_output()
        self._unpatch()
        return False

    def side_effects(self) -> list[str]:
        """After the trace (and after the capture restored what it changed): what a replay would not repeat."""
        effects = list(self.effects)
        self.busy = True
        try:
            for read in list(self.reads.values()):
                if read.changed():
                    effects.append(f"{read.label} changed while the function ran")
        finally:
            self.busy = False
        if random.getstate() != self._random_state:
            effects.append("it draws from Python's random module")
        if _numpy_random_position() != self._numpy_state:
            effects.append("it draws from numpy's global random generator")
        return effects

    # ------------------------------------------------------------------ roots
    def _watch_roots(self) -> None:
        fn = self.fn
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            self.reach(owner)
        function = getattr(fn, "__func__", fn)
        for value in self._arguments:
            if type(value) is not Tensor:
                self.reach(value)
        self.reach(function)

    def reach(self, value) -> None:
        """Watch the attribute reads of ``value`` (an object the traced code can read state from); for a function,
        what its code reads."""
        cls = type(value)
        if cls is types.FunctionType:
            self.function(value)
            return
        if cls is types.MethodType:
            self.function(value.__func__)
            value = value.__self__
            cls = type(value)
        elif cls is functools.partial:
            self.reach(value.func)
            for v in (*value.args, *value.keywords.values()):
                self.reach(v)
            return
        if id(value) in self.known or not _watchable(cls) or not self._patch(cls):
            return
        self.known[id(value)] = value
        if isinstance(value, (list, tuple)) and len(value) <= _CONTAINER_ELEMENTS:
            for v in value:
                self.reach(v)
        elif isinstance(value, dict) and len(value) <= _CONTAINER_ELEMENTS:
            for v in value.values():
                self.reach(v)

    def function(self, function: types.FunctionType) -> None:
        """What ``function``'s code reads: found from the traced function, and from every value the recorder
        reaches, without running anything (a called function is one of those values, or on the stack when an
        operator is called: ``operator_called``)."""
        code = function.__code__
        if code not in self._seen_codes:
            self._seen_codes.add(code)
            self._code_reads(function, code, function.__globals__)

    def operator_called(self) -> None:
        """An operator is being recorded: the user functions on the stack are read (a function reached in no
        other way, such as one looked up in a dict, is found here)."""
        frame, seen, base = sys._getframe(2), self._seen_codes, self._base
        while frame is not None and frame is not base:  # up to the frame that called the traced function
            code = frame.f_code
            if code not in seen:
                seen.add(code)
                if _code_facts(code).user:
                    self._code_reads(_function_of(frame), code, frame.f_globals)
            frame = frame.f_back

    def _code_reads(self, function, code: types.CodeType, namespace: dict, nested: bool = False) -> None:
        facts = _code_facts(code)
        if not facts.user:
            return
        busy, self.busy = self.busy, True
        try:
            self._reads_of(facts, function, code, namespace, nested)
        finally:
            self.busy = busy

    def _reads_of(self, facts: _CodeFacts, function, code: types.CodeType, namespace: dict, nested: bool) -> None:
        for name in facts.globals_written:
            self.effects.append(f"{code.co_name} assigns the global {name!r}")
        for name in facts.globals_read:
            value = namespace.get(name, _MISSING)
            if value is _MISSING:
                continue  # a builtin
            self._record(("global", id(namespace), name), f"global {name!r}", _global_fetch(namespace, name), value)
        for name, attribute in facts.module_attributes:
            module = namespace.get(name)
            if isinstance(module, types.ModuleType):
                value = getattr(module, attribute, _MISSING)
                if value is not _MISSING:
                    self._record(("global", id(module.__dict__), attribute), f"{name}.{attribute}",
                                 _global_fetch(module.__dict__, attribute), value)
        for inner in facts.nested:  # its closure variables are this function's: made anew by each call
            if inner not in self._seen_codes:
                self._seen_codes.add(inner)
                self._code_reads(None, inner, namespace, nested=True)
        if nested:
            return
        if facts.cells_read or facts.cells_written:
            cells = dict(zip(code.co_freevars, function.__closure__ or ())) if function is not None else {}
            for name in facts.cells_written:
                self.effects.append(f"{code.co_name} assigns the closure variable {name!r}")
            for name in facts.cells_read:
                cell = cells.get(name)
                if cell is None:
                    self.effects.append(f"closure variable {name!r} of {code.co_name} could not be found")
                    continue
                self._record(("cell", id(cell)), f"closure variable {name!r}", _cell_fetch(cell),
                             _cell_fetch(cell)(), holds=cell)

    def _record(self, where: tuple, label: str, fetch, value, holds=None, versioned: bool = False) -> None:
        if where in self.reads:
            return
        key = value_key(value)
        same = value if len(key) == 2 and key[1] == id(value) and type(value) not in _PLAIN else _MISSING
        self.reads[where] = Read(label, fetch, key, holds=(holds, value), versioned=versioned, same=same)
        if type(value) is not Tensor:
            self.reach(value)

    # ------------------------------------------------------------------ frames
    # ------------------------------------------------------------------ attribute reads and writes
    def on_read(self, obj, name: str, value, stored: bool = False) -> None:
        if self.busy or id(obj) not in self.known:
            return
        self.busy = True
        try:
            cls = type(obj)
            versioned = getattr(cls, "_tw_version", None) is not None and not _is_mutable_container(value) or \
                (stored and getattr(cls, "_tw_version", None) is not None)
            if stored or _instance_attribute(obj, name):
                self._record(("attr", id(obj), name), f"{cls.__name__}.{name}", _attribute_fetch(obj, name), value,
                             holds=obj, versioned=versioned)
                return
            owner, attribute = _owner_of(cls, name)
            if owner is not None and _is_state(attribute):
                self._record(("class", id(owner), name), f"{owner.__name__}.{name}",
                             _class_attribute_fetch(owner, name), attribute, holds=owner)
            elif isinstance(attribute, types.FunctionType):  # a method about to run: what its code reads
                self.function(attribute)
            elif isinstance(attribute, property) and isinstance(attribute.fget, types.FunctionType):
                self.function(attribute.fget)
        finally:
            self.busy = False

    def on_write(self, obj, name: str) -> None:
        if not self.busy and id(obj) in self.known:
            self.effects.append(f"it sets {type(obj).__name__}.{name}")

    def _patch(self, cls: type) -> bool:
        """Record reads of ``cls``'s instances while this recorder runs; False where the class refuses hooks."""
        if cls in self.classes:
            return True
        with _PATCH_LOCK:
            entry = _PATCHED.get(cls)
            if entry is None:
                try:
                    entry = _PATCHED[cls] = [0, _install_hooks(cls)]
                except TypeError:  # a metaclass that forbids it: its instances are compared by identity only
                    return False
            entry[0] += 1
        self.classes.append(cls)
        return True

    def _unpatch(self) -> None:
        with _PATCH_LOCK:
            for cls in self.classes:
                entry = _PATCHED[cls]
                entry[0] -= 1
                if entry[0] == 0:
                    _remove_hooks(cls, entry[1])
                    del _PATCHED[cls]
        self.classes = []

    # ------------------------------------------------------------------ output and logging
    def output(self, what: str) -> None:
        """User code printed or logged while traced: a side effect of every call, a graph break for torch."""
        if self.fullgraph:
            from tilewise.compiler.errors import data_dependent_error

            raise data_dependent_error(f"{what} (output is a graph break; fullgraph=True allows none)")
        self.effects.append(f"it calls {what}")


_OUTPUT_WATCH: list = []  # [count of recorders, original print, original Logger._log] while any records


def _called_from_user(depth: int) -> bool:
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename == logging.__file__:
        frame = frame.f_back
    return frame is not None and _code_facts(frame.f_code).user


def _watch_output() -> None:
    """Route ``print`` and logging through a check of the calling thread's recorder, and pause recording in
    garbage-collection callbacks (once for all recorders)."""
    with _PATCH_LOCK:
        if _OUTPUT_WATCH:
            _OUTPUT_WATCH[0] += 1
            return
        original_print, original_log = builtins.print, logging.Logger._log

        def print_(*args, **kwargs):
            recorder = _CURRENT.recorder
            if recorder is not None and not recorder.busy and _called_from_user(2):
                recorder.output("print()")
            return original_print(*args, **kwargs)

        def log_(logger, *args, **kwargs):
            recorder = _CURRENT.recorder
            if recorder is not None and not recorder.busy and _called_from_user(2):
                recorder.output("logging")
            return original_log(logger, *args, **kwargs)

        _OUTPUT_WATCH[:] = [1, original_print, original_log, list(gc.callbacks)]
        builtins.print = print_
        logging.Logger._log = log_
        gc.callbacks[:] = [_unrecorded(callback) for callback in gc.callbacks]  # not the function's doing


def _unwatch_output() -> None:
    with _PATCH_LOCK:
        _OUTPUT_WATCH[0] -= 1
        if _OUTPUT_WATCH[0] == 0:
            builtins.print, logging.Logger._log = _OUTPUT_WATCH[1], _OUTPUT_WATCH[2]
            gc.callbacks[:] = _OUTPUT_WATCH[3]
            _OUTPUT_WATCH.clear()


def _unrecorded(callback):
    """``callback`` run with the calling thread's recorder paused (a garbage collection can call it anywhere)."""
    def run(*args):
        recorder = _CURRENT.recorder
        if recorder is None or recorder.busy:
            return callback(*args)
        recorder.busy = True
        try:
            return callback(*args)
        finally:
            recorder.busy = False

    return run


def _numpy_random_position() -> tuple:
    state = np.random.get_state(legacy=False)
    return state["state"]["pos"], state["has_gauss"], state["gauss"], state["state"]["key"].tobytes()


def _instance_attribute(obj, name: str) -> bool:
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        state = None
    if state is not None and name in state:
        return True
    _, attribute = _owner_of(type(obj), name)
    return isinstance(attribute, types.MemberDescriptorType)  # a __slots__ member


def _function_of(frame):
    """The function object running ``frame`` (for its closure cells): found once per code object."""
    code = frame.f_code
    if not code.co_freevars:
        return None
    candidates = [f for f in gc.get_referrers(code) if type(f) is types.FunctionType and f.__code__ is code]
    if len(candidates) == 1:
        return candidates[0]
    values = frame.f_locals
    for f in candidates:
        try:
            if all(values.get(name, _MISSING) is cell.cell_contents
                   for name, cell in zip(code.co_freevars, f.__closure__ or ())):
                return f
        except ValueError:
            continue
    return candidates[0] if candidates else None


def _install_hooks(cls: type) -> dict:
    """Give ``cls`` recording attribute hooks; return what its own ``__dict__`` held under those names."""
    originals = {name: cls.__dict__.get(name, _MISSING)
                 for name in ("__getattribute__", "__getattr__", "__setattr__", "__delattr__")}
    get = cls.__getattribute__
    set_ = cls.__setattr__
    delete = cls.__delattr__

    def getattribute_hook(self, name, _get=get):
        value = _get(self, name)
        recorder = _CURRENT.recorder
        if recorder is not None and name[:2] != "__":
            recorder.on_read(self, name, value)
        return value

    def setattr_hook(self, name, value, _set=set_):
        recorder = _CURRENT.recorder
        if recorder is not None:
            recorder.on_write(self, name)
        _set(self, name, value)

    def delattr_hook(self, name, _delete=delete):
        recorder = _CURRENT.recorder
        if recorder is not None:
            recorder.on_write(self, name)
        _delete(self, name)

    try:
        type.__setattr__(cls, "__getattribute__", getattribute_hook)
        type.__setattr__(cls, "__setattr__", setattr_hook)
        type.__setattr__(cls, "__delattr__", delattr_hook)
    except TypeError:
        _remove_hooks(cls, originals)
        raise
    missing = getattr(cls, "__getattr__", None)
    if missing is not None:
        def getattr_hook(self, name, _missing=missing):
            value = _missing(self, name)
            recorder = _CURRENT.recorder
            if recorder is not None:
                recorder.on_read(self, name, value, stored=True)
            return value

        type.__setattr__(cls, "__getattr__", getattr_hook)
    return originals


def _remove_hooks(cls: type, originals: dict) -> None:
    for name, original in originals.items():
        if original is _MISSING:
            if name in cls.__dict__:
                type.__delattr__(cls, name)
        else:
            type.__setattr__(cls, name, original)


# ---------------------------------------------------------------------------- what a variant checks


@dataclass
class PythonGuards:
    """The Python-state part of a variant's guards: reads checked every call, and reads re-checked only when a
    versioned class's counter moved (see [Note: Python-state guards])."""

    always: list[Read] = field(default_factory=list)
    versioned: list[Read] = field(default_factory=list)
    version: list | None = None  # the counter the versioned reads follow
    passed_at: int = -1  # the counter's value when they last passed
    default_dtype: object = None
    default_device: object = None
    backend_numerics: tuple | None = None  # backends.flags.gemm_numerics() when traced: what GEMMs were planned for

    @classmethod
    def from_recorder(cls, recorder: Recorder | None) -> PythonGuards:
        guards = cls(default_dtype=get_default_dtype(), default_device=_default_device(),
                     backend_numerics=flags.gemm_numerics())
        if recorder is None:
            return guards
        for read in recorder.reads.values():
            (guards.versioned if read.versioned else guards.always).append(read)
        for read in guards.versioned:
            owner = read.holds[0]
            guards.version = getattr(type(owner), "_tw_version", None)
            break
        if guards.version is not None:
            guards.passed_at = guards.version[0]
        return guards

    def failure(self) -> str | None:
        for read in self.always:
            if read.changed():
                return f"{read.label} is now {describe_value(read.fetch())}"
        if self.version is not None and self.version[0] != self.passed_at:
            now = self.version[0]
            for read in self.versioned:
                if read.changed():
                    return f"{read.label} is now {describe_value(read.fetch())}"
            self.passed_at = now
        if get_default_dtype() is not self.default_dtype:
            return f"the default dtype is {get_default_dtype().name}, compiled for {self.default_dtype.name}"
        if _default_device() != self.default_device:
            return f"the default device is {_default_device()}, compiled for {self.default_device}"
        if self.backend_numerics is not None and flags.gemm_numerics() != self.backend_numerics:
            return "a backend flag changed (TF32 matmul precision, reduced-precision reductions or deterministic mode)"
        return None


def _default_device():
    from tilewise.backends import default_device

    return default_device()


# ---------------------------------------------------------------------------- tensors and modes


def _describe_signature(sig) -> str:
    if sig is None:
        return "None"
    shape, strides, offset, dtype, device, requires_grad, size = sig
    return (f"shape {list(shape)}, strides {list(strides)}, offset {offset}, {dtype.name} on {device}, "
            f"requires_grad={requires_grad}, storage of {size}")


def constant_key(value):
    return value_key(value, 0)


@dataclass
class Guards:
    spec: object
    constants: list[tuple[int, object]]
    tensors: list[tuple[Source, tuple]]
    aliasing: tuple
    grad_presence: list[tuple[Source, bool]]
    grad_enabled: bool
    training: tuple
    optimizers: list  # the optimizers the function reaches: their state tables and param groups are guarded
    state_layout: list  # _state_layout(optimizers) when traced
    hyperparameters: tuple  # _hyperparameters(optimizers) when traced: the trace baked them in
    autocast: tuple = ()  # AutocastState.key when traced: the casts it recorded
    python: PythonGuards = field(default_factory=PythonGuards)
    held: list = field(default_factory=list)  # the constant arguments compared by identity (their ids stay theirs)
    numbers: list = field(default_factory=list)  # (leaf, int or float, nonzero): dynamic numbers, guarded by type
    identities: tuple = ()  # _leaf_identities(flat) when traced: which tensor arguments were one object

    def failure(self, flat: list, spec, module) -> str | None:
        """None when this variant applies to the call, else which guard failed."""
        if spec != self.spec:
            return "the arguments have a different structure (number, nesting or keyword names)"
        if _leaf_identities(flat) != self.identities:
            return _identity_change(flat, self.identities)
        for index, key in self.constants:
            if constant_key(flat[index]) != key:
                return f"argument leaf {index} is {describe_value(flat[index])}, compiled for another value"
        for index, kind, nonzero in self.numbers:
            value = flat[index]
            if not admits(value, kind) or nonzero and value == 0:
                return f"argument leaf {index} is {describe_value(value)}, compiled for any {kind.__name__}" + \
                    (" but zero" if nonzero else "")
        return self._state_failure(flat, module)

    def numbers_changed(self, flat: list, spec, module) -> list[int]:
        """The argument leaves, ints or floats, whose values alone keep this variant from the call (see [Note:
        dynamic numbers] in numbers.py); empty when any other guard fails too."""
        if spec != self.spec or _leaf_identities(flat) != self.identities:
            return []
        changed = []
        for index, key in self.constants:
            if constant_key(flat[index]) != key:
                if key[0] not in (int, float) or type(flat[index]) not in (int, float):
                    return []
                changed.append(index)
        if not changed or any(not admits(flat[index], kind) or nonzero and flat[index] == 0
                              for index, kind, nonzero in self.numbers):
            return []
        return changed if self._state_failure(flat, module) is None else []

    def _state_failure(self, flat: list, module) -> str | None:
        if STATE.grad_enabled != self.grad_enabled:
            return f"grad mode is {'on' if STATE.grad_enabled else 'off'}, compiled with it " \
                   f"{'on' if self.grad_enabled else 'off'}"
        if _autocast_key() != self.autocast:
            return f"the autocast guard failed: called under {describe_autocast(_autocast_key())}, compiled under " \
                   f"{describe_autocast(self.autocast)}"
        if module is not None and _training_flags(module) != self.training:
            return "a module's training flag changed (train()/eval())"
        if _state_layout(self.optimizers) != self.state_layout:
            return "an optimizer's state changed (buffers created or replaced)"
        if _hyperparameters(self.optimizers) != self.hyperparameters:
            return _hyperparameter_change(self.optimizers, self.hyperparameters)
        reason = self.python.failure()
        if reason is not None:
            return reason
        reason = self._tensor_failure(flat)
        if reason is not None:
            return reason
        for source, had in self.grad_presence:
            owner = source.fetch(flat)
            if (owner._grad is not None) != had:
                return f"{source.label}.grad is {'set' if owner._grad is not None else 'None'}; compiled with it " \
                       f"{'set' if had else 'None'}"
        for o in self.optimizers:  # the rates the program reads at run time, refilled for this call
            refresh = getattr(o, "refresh_runtime_hyperparameters", None)
            if refresh is not None:
                refresh()
        return None

    def __post_init__(self) -> None:
        # [Note: fast guards] A training step reads every parameter and optimizer state tensor: GPT-2's is
        # 594 tensors, and checking them one by one in Python took half a millisecond a call, more than some
        # steps' kernels. The tensors held as objects are checked with one C-level map of an attrgetter over a
        # fixed list, and the storages' sharing is recomputed only when some storage is another object than
        # at the last call that passed. A failure is then explained by the one-by-one walk.
        # A training loop passes a new batch at every call: when only the arguments' storages are new, their
        # sharing is checked against the held tensors' storage groups of the last call that passed (one dict
        # lookup an argument) instead of the whole pattern being recomputed.
        objects = [k for k, (source, _) in enumerate(self.tensors) if source.kind == "object"]
        others = [k for k, (source, _) in enumerate(self.tensors) if source.kind != "object"]
        self._order = objects + others
        self._objects = [self.tensors[k][0].obj for k in objects]
        # a held view's requires_grad may follow its base's (``capture.signature``), which its layout does not show
        self._held_views = [t for t in self._objects if t._base is not None]
        self._others = [self.tensors[k][0] for k in others]
        self._expected = [self.tensors[k][1] for k in self._order]
        self._passed: tuple | None = None  # (held layouts, other storages, held views' signatures) of the last call
        # that passed
        self._held_storages: frozenset = frozenset()  # ids of the held tensors' storages at that call
        # the storage group (the pattern's first position) of each argument tensor, and of the held tensors
        self._other_groups = [self.aliasing[k] if k < len(self.aliasing) else k for k in others]
        self._held_group_ids = frozenset(self.aliasing[k] for k in objects if k < len(self.aliasing))
        self._held_groups: dict[int, int] = {}  # held storage id -> its group, at the last call that passed

    def _tensor_failure(self, flat: list) -> str | None:
        others = [source.fetch(flat) for source in self._others]
        other_signatures = [signature(t) if type(t) is Tensor else None for t in others]
        other_storages = [id(t._storage) if type(t) is Tensor else 0 for t in others]
        held = list(map(_LAYOUT, self._objects))
        views = list(map(signature, self._held_views))
        passed = self._passed
        if passed is not None and passed[0] == held and passed[2] == views:
            # the held tensors are as at the last call that passed, their storages the same objects: only the
            # arguments' signatures, and their storages' sharing, are left to check
            if other_signatures != self._expected[len(held):]:
                return self._explain(flat)
            if passed[1] == other_storages:
                return None
            if not self._arguments_share_as_compiled(other_storages):
                return "tensors that shared storage when compiled no longer do (or the reverse)"
            self._passed = (held, other_storages, views)
            return None
        if list(map(signature, self._objects)) + other_signatures != self._expected:
            return self._explain(flat)
        storages = [id(t._storage) for t in self._objects] + other_storages
        in_order = [0] * len(storages)
        for position, k in enumerate(self._order):
            in_order[k] = storages[position]
        if _alias_pattern(in_order) != self.aliasing:
            return "tensors that shared storage when compiled no longer do (or the reverse)"
        # one assignment, so that a thread checking at the same time sees one call's pair; holding the layouts
        # holds the storages: no other storage can take their ids while compared
        self._held_groups = {in_order[k]: self.aliasing[k] for k in self._order[:len(held)]}
        self._passed = (held, other_storages, views)
        self._held_storages = frozenset(id(t._storage) for t in self._objects)
        return None

    def _arguments_share_as_compiled(self, storages: list[int]) -> bool:
        """Whether the argument tensors' storages (ids; 0 for a leaf that is no tensor) share with each other and
        with the held tensors as when compiled, the held tensors' storages being those of the last call that
        passed."""
        held_groups, held_group_ids = self._held_groups, self._held_group_ids
        by_storage: dict[int, int] = {}
        by_group: dict[int, int] = {}
        for storage, group in zip(storages, self._other_groups):
            found = held_groups.get(storage)
            if found is not None:
                if found != group:
                    return False
                continue
            if group in held_group_ids:  # compiled sharing a held tensor's storage; now it does not
                return False
            if by_storage.setdefault(storage, group) != group or by_group.setdefault(group, storage) != storage:
                return False
        return True

    def holds_any(self, windows: dict) -> bool:
        """Whether a tensor held by the function lies in a storage a rebased argument was cut from (see [Note:
        sliced arguments] in function.py); read after ``failure`` admitted the call."""
        held = self._held_storages
        return any(id(given._storage) in held for _, given in windows.values())

    def _explain(self, flat: list) -> str | None:
        for source, expected in self.tensors:
            t = source.fetch(flat)
            got = signature(t) if type(t) is Tensor else None
            if got != expected:
                return f"{source.label}: {_describe_signature(got)}; compiled for {_describe_signature(expected)}"
        return None


_LAYOUT = operator.attrgetter(*LAYOUT_FIELDS, "_storage")  # ``signature`` with the storage itself, not its size


def _autocast_key() -> tuple:
    state = STATE.autocast
    return state.key if state is not None else ()


def _leaf_identities(flat: list) -> tuple:
    """For each tensor among the argument leaves, the position of the first leaf that is the same object. A trace
    reads an argument passed twice (``f(x, x)``) through one of its leaves only, so the variant it made serves a
    call only where those leaves are again one tensor."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(v), k) for k, v in enumerate(flat) if type(v) is Tensor)


def _identity_change(flat: list, compiled: tuple) -> str:
    positions = [k for k, v in enumerate(flat) if type(v) is Tensor]
    for k, (now, then) in enumerate(zip(_leaf_identities(flat), compiled)):
        if now != then:
            leaf = positions[k]
            if then != positions[k]:
                return f"argument leaves {then} and {leaf} were one tensor when compiled; now they are two"
            return f"argument leaves {now} and {leaf} are one tensor; compiled for two"
    return "the tensor arguments changed in number"


def _alias_pattern(ids: list[int]) -> tuple:
    first: dict[int, int] = {}
    return tuple(first.setdefault(i, k) for k, i in enumerate(ids))


def _training_flags(module) -> tuple:
    modules = module.modules() if hasattr(module, "modules") else [module]
    return tuple(bool(getattr(m, "training", False)) for m in modules)


_PLAIN_STATE = (int, float, bool, str, type(None))


def _state_layout(optimizers: list) -> list:
    """Which entries the optimizers' state tables hold (the tables they hold now: ``load_state_dict`` replaces
    them): tensors by identity, other values by value, flat (one list, compared in one step)."""
    out: list = []
    for o in optimizers:
        out.append(len(o.state))
        for owner, entry in o.state.items():
            out.append(id(owner))
            out.append(len(entry))
            out.extend(entry)
            out.extend([id(v) if type(v) is Tensor else v if type(v) in _PLAIN_STATE else repr(v)
                        for v in entry.values()])
    return out


def _hyperparameters(optimizers: list) -> tuple:
    """What the optimizers' param groups hold besides their parameters (lr, betas, weight_decay, ...), by value:
    a trace reads them as Python numbers, so the program holds them as constants; a learning rate the program
    reads at run time only by type (see [Note: learning rates in compiled steps] in optim/optimizer.py)."""
    out = []
    for o in optimizers:
        runtime = o.runtime_hyperparameters() if hasattr(o, "runtime_hyperparameters") else {}
        out.append(tuple(tuple((name, (float, "a number read at run time") if name == "lr" and g in runtime
                                       and isinstance(v, (int, float)) else value_key(v, 2))
                               for name, v in group.items() if name != "params")
                         for g, group in enumerate(o.param_groups)))
    return tuple(out)


def _hyperparameter_change(optimizers: list, compiled: tuple) -> str:
    now = _hyperparameters(optimizers)
    for o, groups, old_groups in zip(optimizers, now, compiled):
        for k, (group, old) in enumerate(zip(groups, old_groups)):
            for (name, value), (old_name, old_value) in zip(group, old):
                if (name, value) != (old_name, old_value):
                    return (f"{type(o).__name__}.param_groups[{k}][{name!r}] is {o.param_groups[k].get(name)!r}, "
                            f"compiled for {_key_text(old_value)}")
    return "an optimizer's param groups changed (groups or hyperparameters added or removed)"


def make_guards(traced: Traced, flat: list, spec, module, optimizers: list, recorder: Recorder | None,
                numbers: dict | None = None) -> Guards:
    """The guards of a variant; ``numbers`` maps the leaves read at run time to (int or float, whether the trace
    divided by it): they are guarded by type (see [Note: dynamic numbers] in numbers.py)."""
    numbers = numbers or {}
    constants = [(k, constant_key(v)) for k, v in enumerate(flat) if type(v) is not Tensor and k not in numbers]
    held = [v for v in flat if type(v) is not Tensor and type(v) not in (*_PLAIN_STATE, tuple)]
    sources = [ts for ts in traced.tensor_sources if ts.source.kind != "number"]
    tensors = [(ts.source, ts.signature) for ts in sources]
    storages = [id(ts.source.fetch(flat)._storage) for ts in sources]
    return Guards(spec, constants, tensors, _alias_pattern(storages), traced.grad_presence, STATE.grad_enabled,
                  _training_flags(module) if module is not None else (), optimizers, _state_layout(optimizers),
                  _hyperparameters(optimizers), _autocast_key(), PythonGuards.from_recorder(recorder), held,
                  [(k, kind, nonzero) for k, (kind, nonzero) in sorted(numbers.items())], _leaf_identities(flat))
