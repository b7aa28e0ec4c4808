"""``tilewise.layout`` and ``tilewise.memory_format``: torch's enumerations of how a tensor lies in memory.

tilewise tensors are all strided (views over a flat storage), so ``strided`` is the one layout and every tensor's
``layout``. Memory formats name orders of dims in memory (see [Note: memory formats] in ``tilewise.strides``, where
their stride arithmetic lives): ``contiguous_format``, ``channels_last`` (4-d), ``channels_last_3d`` (5-d), and
``preserve_format``, which asks a copy to keep its source's order. Operators take the instances and pass them on
unchanged; backends read their ``name``. The instances are fixed, as torch's: the classes cannot make more.

>>> import tilewise as tw
>>> tw.ones(2).layout
tilewise.strided
>>> tw.empty(2, 3, 4, 5, memory_format=tw.channels_last).stride()
(60, 1, 15, 3)
"""

from __future__ import annotations

from tilewise import strides as S


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
legacy_contiguous_format = contiguous_format  # torch's other name of it (F.gumbel_softmax's zeros_like spells it so)
preserve_format = memory_format._make("preserve_format")
channels_last = memory_format._make("channels_last")
channels_last_3d = memory_format._make("channels_last_3d")

_INSTANCES = {x.name: x for x in (strided, contiguous_format, preserve_format, channels_last, channels_last_3d)}


def _by_name(name: str):
    return _INSTANCES[name]



def format_name(value, op: str) -> str:
    """The name of a ``memory_format`` argument (None: the contiguous format); torch's TypeError for others."""
    if value is None:
        return "contiguous_format"
    if type(value) is not memory_format:
        raise TypeError(f"{op}(): argument 'memory_format' must be tilewise.memory_format, not {type(value).__name__}")
    return value.name


def suggest_memory_format(t) -> memory_format:
    """The format tensor ``t``'s strides follow (torch's ``Tensor.suggest_memory_format``); a value a compiled
    function traces has the strides eager would give it (see [Note: eager strides of traced values] in
    compiler/formats.py)."""
    return _INSTANCES[S.suggest_memory_format(t._shape, t._strides)]


def copy_strides(src, memory_format) -> tuple:
    """The strides of a copy of tensor ``src`` in ``memory_format`` (None: preserve), as ``clone`` and
    ``empty_like`` make it in torch."""
    if memory_format is None or memory_format is preserve_format:
        return S.preserved_strides(src._shape, src._strides)
    return S.format_strides(memory_format.name, src._shape)


def in_format_of(t, like):
    """``t`` laid out as torch's kernels that write "in the input's suggested memory format" lay theirs out
    (normalisations, pixel and channel shuffles, unpooling): in the format tensor ``like`` suggests, so channels-last
    when it is, else row-major whatever its order."""
    return t.contiguous(memory_format=suggest_memory_format(like))


def in_order_of(t, like):
    """``t`` (of ``like``'s shape) laid out as a copy of ``like`` under ``preserve_format`` is: ``t`` itself when it
    already is, else copied through the permutation that lays ``like``'s dims out row-major (a view, a copy and
    the inverse view, so autograd and compiled functions see operators they know)."""
    strides = S.preserved_strides(like._shape, like._strides)
    if all(a == b or n == 1 for a, b, n in zip(t._strides, strides, t._shape)):
        return t
    order = S.memory_order(like._shape, like._strides)
    return t.permute(order).contiguous().permute(sorted(range(len(order)), key=order.__getitem__))
