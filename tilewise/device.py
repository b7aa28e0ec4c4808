"""Devices: ``Device("cpu")``, ``Device("cuda")``, ``Device("cuda", 1)``, ``Device("cuda:1")``, and the
:class:`Backend` that runs each device type.

Devices are interned, so identity comparison is cheap on the dispatch path.

[Note: the Backend protocol] A device backend is an object registered once per device type
(``register_backend("cuda", backend)``) by the backends layer when it loads. Everything below that layer
reaches a device only through this protocol: the dispatcher runs operators with ``run``/``run_into``, a
tensor pins itself with ``pin_memory``, the CPU's copy kernel moves data with ``upload``. The registry lives
here, at the bottom of the stack (as c10 keeps torch's per-device-type interfaces), so that tensors and the
dispatcher can look a backend up without importing the layer that implements it; ``register_backend``
checks that the object has every method and names the one missing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tilewise.dtypes import DType
    from tilewise.tensor import Tensor

_VALID_TYPES = ("cpu", "cuda", "meta")
_interned: dict[tuple[str, int | None], Device] = {}


class Device:
    __slots__ = ("type", "index")

    def __new__(cls, type_or_str: str | Device | int, index: int | None = None) -> Device:
        if isinstance(type_or_str, Device):
            return type_or_str
        if type(type_or_str).__module__ == "torch":  # torch.device("cuda:1") names the same device
            type_or_str = str(type_or_str)
        if isinstance(type_or_str, int) and not isinstance(type_or_str, bool):
            type_or_str, index = "cuda", type_or_str
        if not isinstance(type_or_str, str):
            raise TypeError(f"Device(): expected a string like 'cpu', 'cuda' or 'cuda:1', got {type_or_str!r}")
        kind, _, idx = type_or_str.partition(":")
        if idx:
            if index is not None:
                raise ValueError(f"Device(): index given twice in {type_or_str!r} and index={index}")
            if not idx.isdigit():
                raise ValueError(f"Device(): invalid device string {type_or_str!r}; expected e.g. 'cuda:0'")
            index = int(idx)
        if kind not in _VALID_TYPES:
            raise ValueError(f"Device(): unknown device type {kind!r}; valid types: {', '.join(_VALID_TYPES)}")
        if kind == "cpu":
            index = None
        if kind == "cuda" and index is None:  # the thread's current device, as torch resolves "cuda" when it allocates
            current = getattr(BACKENDS.get("cuda"), "current_index", None)  # a stand-in backend may lack it
            index = current() if current is not None else 0
        key = (kind, index)
        dev = _interned.get(key)
        if dev is None:
            dev = object.__new__(cls)
            object.__setattr__(dev, "type", kind)
            object.__setattr__(dev, "index", index)
            _interned[key] = dev
        return dev

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = Device(other)
        return self is other

    # interned (one object per device), so hashed by identity: in C, for the compiler's hash-consed nodes' types
    __hash__ = object.__hash__

    def __reduce__(self):
        return (Device, (str(self),))

    def __enter__(self) -> Device:
        """``with tilewise.device("cuda"):``: factories on this thread put tensors here when given no device (a
        module built inside has its parameters made there), as torch's device context does."""
        stack = _device_context.__dict__.setdefault("stack", [])
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _device_context.stack.pop()


cpu = Device("cpu")


def as_device(value) -> Device:
    if value is None:
        return cpu
    if type(value).__module__ == "torch":
        value = str(value)
    return Device(value)


# ---------------------------------------------------------------------------- backends

class Backend:
    """What a device backend provides. Subclass it and override at least the ``REQUIRED`` methods; the others
    have defaults for a backend that cannot do what they ask (a device without page-locked host memory, or
    without kernels that write into a given output)."""

    REQUIRED = ("run", "empty", "upload", "download", "synchronize")
    OPTIONAL = ("run_into", "pin_memory", "is_pinned", "empty_pinned")
    pins_host_memory = False  # whether pin_memory/empty_pinned work: the backend that pins CPU tensors

    def run(self, op, args: tuple, device: Device):
        """Run operator ``op`` on its bound ``args`` on ``device``; return its result tensor(s)."""
        raise NotImplementedError

    def run_into(self, op, args: tuple, device: Device, out: Tensor) -> Tensor | None:
        """A pointwise op's result written into ``out`` (an in-place op's target) and returned, or None when
        the backend cannot, and the dispatcher runs ``op`` as usual (see ``dispatch.call_into``)."""
        return None

    def empty(self, shape: tuple, dtype: DType, device: Device, strides: tuple | None = None) -> Tensor:
        """An uninitialised tensor on ``device`` (contiguous unless dense ``strides`` are given)."""
        raise NotImplementedError

    def upload(self, src: Tensor, device: Device, non_blocking: bool = False, dtype: DType | None = None,
               memory_format=None) -> Tensor:
        """CPU tensor ``src`` copied to ``device``, converted to ``dtype`` (default: its own), laid out in
        ``memory_format`` (default: ``src``'s own order, as ``clone`` keeps it)."""
        raise NotImplementedError

    def download(self, x: Tensor, non_blocking: bool = False) -> Tensor:
        """Tensor ``x`` of this backend's device copied to a new contiguous CPU tensor."""
        raise NotImplementedError

    def synchronize(self, device: Device) -> None:
        """Wait for all work queued on ``device``."""
        raise NotImplementedError

    def pin_memory(self, t: Tensor) -> Tensor:
        """A contiguous copy of CPU tensor ``t`` in page-locked memory."""
        raise RuntimeError(f"pin_memory(): the {type(self).__name__} cannot pin host memory")

    def current_index(self) -> int:
        """The index ``Device(type)`` stands for on this thread (the current device, for CUDA)."""
        return 0

    def is_pinned(self, t: Tensor) -> bool:
        """Whether CPU tensor ``t`` lives in page-locked memory this backend allocated."""
        return False

    def empty_pinned(self, shape: tuple, dtype: DType) -> Tensor:
        """An uninitialised contiguous CPU tensor in page-locked memory."""
        raise RuntimeError(f"pin_memory=True: the {type(self).__name__} cannot pin host memory")


BACKENDS: dict[str, Backend] = {}  # device type -> its backend (the dispatcher reads this dict directly)


def register_backend(device_type: str, backend: Backend) -> None:
    """Make ``backend`` run every tensor of ``device_type``; refuses an object that lacks a method of the
    protocol, naming it."""
    if device_type not in _VALID_TYPES:
        raise ValueError(f"register_backend(): unknown device type {device_type!r}; valid types: "
                         f"{', '.join(_VALID_TYPES)}")
    missing = _missing_methods(backend)
    if missing:
        names = ", ".join(f"{name}()" for name in missing)
        raise TypeError(f"register_backend(): the backend {backend!r} for device type {device_type!r} has no "
                        f"method {names} of the Backend protocol (tilewise.device.Backend)")
    BACKENDS[device_type] = backend


def _missing_methods(backend) -> list[str]:
    """The protocol's methods ``backend`` lacks: a required one it does not define itself (inheriting
    ``Backend``'s placeholder counts as lacking it), an optional one it has no callable for."""
    missing = []
    for name in Backend.REQUIRED:
        if not callable(getattr(backend, name, None)) or getattr(type(backend), name, None) is getattr(Backend, name):
            missing.append(name)
    missing += [name for name in Backend.OPTIONAL if not callable(getattr(backend, name, None))]
    return missing


def backend_for(device: Device) -> Backend:
    backend = BACKENDS.get(device.type)
    if backend is None:
        raise RuntimeError(f"no backend for device {device}: CUDA needs the [cuda] extra and a GPU "
                           "(tilewise.cuda.is_available() says whether one was found)")
    return backend


def pinning_backend() -> Backend:
    """The registered backend that pins CPU tensors in page-locked memory (the CUDA one, where present)."""
    for backend in BACKENDS.values():
        if backend.pins_host_memory:
            return backend
    return backend_for(Device("cuda", 0))  # none: that lookup's error says what is missing


def is_pinned(t: Tensor) -> bool:
    """Whether CPU tensor ``t`` lives in page-locked memory (of any registered backend that pins)."""
    for backend in BACKENDS.values():
        if backend.pins_host_memory and backend.is_pinned(t):
            return True
    return False


# ---------------------------------------------------------------------------- the default device

_default_device: Device = cpu


_device_context = threading.local()  # .stack: the devices of the ``with device(...)`` blocks open on this thread


def default_device() -> Device:
    """Where factories put tensors when given no device: the innermost ``with tilewise.device(...)`` block of this
    thread, else ``tilewise.set_default_device``'s."""
    stack = _device_context.__dict__.get("stack")
    return stack[-1] if stack else _default_device


def set_default_device(device) -> None:
    global _default_device
    _default_device = as_device(device)


get_default_device = default_device
