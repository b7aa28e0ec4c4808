"""Device and dtype moves as Tensor methods: ``to`` and the dtype-only copy it and autocast use.

They dispatch the ``_to_copy`` operator (so autograd records a move and a traced function captures it), which
the tensor model below cannot import: this module installs them on ``Tensor`` when the operator library
loads (see [Note: methods from above] in ``tensor.py``). The spellings built on ``to`` (``cpu``, ``cuda``,
``float``, ``type_as``, ...) stay in ``tensor.py``.
"""

from __future__ import annotations

import warnings

from tilewise import dispatch
from tilewise import strides as S
from tilewise.dtypes import DType
from tilewise.layouts import preserve_format
from tilewise.ops import registry
from tilewise.ops.creation import to_device
from tilewise.tensor import Tensor, _parse_to


def to(self: Tensor, *args, **kwargs) -> Tensor:
    device, dtype, non_blocking, copy, memory_format = _parse_to(self, *args, **kwargs)
    out = self
    casts = dtype is not None and dtype is not self._dtype
    if casts and self._dtype.is_complex and not dtype.is_complex:
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=2)
    if memory_format is preserve_format:
        memory_format = None
    if device is not None and device is not self._device:
        # one copy that also casts: the backend picks the side to cast on (an upload from pinned memory
        # casts on the device, so the host never touches the bytes and the copy can stay asynchronous)
        out = to_device(self, device, non_blocking, dtype if casts else None, memory_format)
    elif casts and memory_format is None:
        out = dispatch.call(_TO_COPY, (self, dtype, None, False, None))  # bound already: no binder on the common path
    elif casts or _changes_format(self, memory_format):
        out = registry.call("_to_copy", self, dtype, memory_format=memory_format)
    if copy and out is self:
        out = self.clone(memory_format=memory_format)
    return out


def _changes_format(self: Tensor, memory_format) -> bool:
    """torch's ``to(memory_format=...)`` copies unless the strides already suggest that format."""
    return memory_format is not None and S.suggest_memory_format(self._shape, self._strides) != memory_format.name


def _to_dtype(self: Tensor, dtype: DType) -> Tensor:
    return dispatch.call(_TO_COPY, (self, dtype, None, False, None))


_TO_COPY = registry.OPS["_to_copy"]


Tensor.to = to
Tensor._to_dtype = _to_dtype
