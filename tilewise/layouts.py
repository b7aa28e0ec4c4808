"""``tilewise.layout`` and ``tilewise.memory_format``: torch's enumerations of how a tensor lies in memory.

tilewise tensors are all strided (views over a flat storage), so ``strided`` is the one layout and every tensor's
``layout``. Memory formats name orders of dims in memory; tilewise makes tensors in the contiguous format, so it offers
``contiguous_format`` and ``preserve_format`` (the channels-last formats would promise strides it does not give).
The instances are fixed, as torch's: the classes cannot make more.

>>> import tilewise as tw
>>> tw.ones(2).layout
tilewise.strided
"""

from __future__ import annotations

from tilewise.tensor import Tensor


class _Enumeration:
    __slots__ = ("name",)

    def __new__(cls, *args, **kwargs):
        raise TypeError(f"cannot create 'tilewise.{cls.__name__}' instances")

    @classmethod
    def _make(cls, name: str):
        instance = object.__new__(cls)
        instance.name = name
        return instance

    def __repr__(self) -> str:
        return f"tilewise.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


class layout(_Enumeration):  # noqa: N801 — torch's name
    """How a tensor's elements are stored: tilewise has ``strided`` only."""


class memory_format(_Enumeration):  # noqa: N801 — torch's name
    """An order of a tensor's dims in memory."""


strided = layout._make("strided")
contiguous_format = memory_format._make("contiguous_format")
preserve_format = memory_format._make("preserve_format")

_INSTANCES = {x.name: x for x in (strided, contiguous_format, preserve_format)}


def _by_name(name: str):
    return _INSTANCES[name]


Tensor.layout = property(lambda self: strided, doc="The tensor's layout: always ``tilewise.strided``.")
