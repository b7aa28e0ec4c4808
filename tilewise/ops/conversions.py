"""Device and dtype moves as Tensor methods: ``to`` and the dtype-only copy it and autocast use.

They dispatch the ``_to_copy`` operator (so autograd records a move and a traced function captures it), which
the tensor model below cannot import: this module installs them on ``Tensor`` when the operator library
loads (see [Note: methods from above] in ``tensor.py``). The spellings built on ``to`` (``cpu``, ``cuda``,
``float``, ``type_as``, ...) stay in ``tensor.py``.
"""

from __future__ import annotations

from tilewise.dtypes import DType
from tilewise.ops import registry
from tilewise.ops.creation import to_device
from tilewise.tensor import Tensor, _parse_to


def to(self: Tensor, *args, **kwargs) -> Tensor:
    device, dtype, non_blocking, copy = _parse_to(self, *args, **kwargs)
    out = self
    casts = dtype is not None and dtype is not self._dtype
    if device is not None and device is not self._device:
        # one copy that also casts: the backend picks the side to cast on (an upload from pinned memory
        # casts on the device, so the host never touches the bytes and the copy can stay asynchronous)
        out = to_device(self, device, non_blocking, dtype if casts else None)
    elif casts:
        out = _to_dtype(self, dtype)
    if copy and out is self:
        out = self.clone()
    return out


def _to_dtype(self: Tensor, dtype: DType) -> Tensor:
    return registry.call("_to_copy", self, dtype)


Tensor.to = to
Tensor._to_dtype = _to_dtype
