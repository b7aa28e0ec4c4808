"""Devices: ``Device("cpu")``, ``Device("cuda")``, ``Device("cuda", 1)``, ``Device("cuda:1")``.

Devices are interned, so identity comparison is cheap on the dispatch path.
"""

from __future__ import annotations

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
        if kind == "cuda" and index is None:
            index = 0
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

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return (Device, (str(self),))


cpu = Device("cpu")


def as_device(value) -> Device:
    if value is None:
        return cpu
    if type(value).__module__ == "torch":
        value = str(value)
    return Device(value)
