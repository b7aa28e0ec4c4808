"""Padding layers over ``F.pad``: constant (and zero), reflection, replication and circular, for one, two and three
spatial dims. ``padding`` is an int (every side) or the (left, right[, top, bottom[, front, back]]) tuple."""

from __future__ import annotations

from collections.abc import Iterable

from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.module import Module
from tilewise.tensor import Tensor


def _sides(padding, dims: int) -> tuple[int, ...]:
    """torch's reading: a sequence as given (F.pad checks its length against the input's rank where it pads, so
    ``ConstantPad2d((1, 2), v)`` pads the last dim only, as in torch), anything else repeated for every side."""
    if isinstance(padding, Iterable):
        return tuple(padding)
    return (padding,) * (2 * dims)


class _PadNd(Module):
    _dims: int
    _mode: str

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = _sides(padding, self._dims)

    def forward(self, input: Tensor) -> Tensor:
        if self._mode == "circular" and input.dim() not in (self._dims + 1, self._dims + 2):
            raise ValueError(f"expected {self._dims + 1}D or {self._dims + 2}D input (got {input.dim()}D input)")
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(Module):
    _dims: int

    def __init__(self, padding, value: float) -> None:
        super().__init__()
        self.padding = _sides(padding, self._dims)
        self.value = value

    def forward(self, input: Tensor) -> Tensor:
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    _dims = 1


class ConstantPad2d(_ConstantPadNd):
    _dims = 2


class ConstantPad3d(_ConstantPadNd):
    _dims = 3


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd):
    _dims = 1


class ZeroPad2d(_ZeroPadNd):
    """Pad the last two dims with zeros: ``padding`` is an int or ``(left, right, top, bottom)``.

    >>> import tilewise as tw
    >>> tw.nn.ZeroPad2d((1, 0, 2, 0))(tw.ones(1, 2, 2)).shape
    tilewise.Size([1, 4, 3])
    """

    _dims = 2


class ZeroPad3d(_ZeroPadNd):
    _dims = 3


class ReflectionPad1d(_PadNd):
    """Pad the last dim with its reflection about the edge element."""

    _dims, _mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    _dims, _mode = 2, "reflect"


class ReflectionPad3d(_PadNd):
    _dims, _mode = 3, "reflect"


class ReplicationPad1d(_PadNd):
    """Pad the last dim with copies of its edge element."""

    _dims, _mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    _dims, _mode = 2, "replicate"


class ReplicationPad3d(_PadNd):
    _dims, _mode = 3, "replicate"


class CircularPad1d(_PadNd):
    """Pad the last dim by wrapping around: the elements from the other end."""

    _dims, _mode = 1, "circular"


class CircularPad2d(_PadNd):
    _dims, _mode = 2, "circular"


class CircularPad3d(_PadNd):
    _dims, _mode = 3, "circular"
