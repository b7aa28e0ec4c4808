"""Slices handed to compiled programs as tensors of their own: windows of the memory they lie in.

[Note: fused calls on slices]
A compiled program is specialised on each tensor's offset into its storage, so a composite called on the
slices of one tensor (a recurrent layer's cell on the input projection of each time step) would compile once
per slice. Below the dispatcher a slice is only memory to read, so it is handed to the program as a tensor of
its own: a storage window from the 16-byte boundary at or before its first element to its last element, kept
alive with the storage it lies in. Allocations start on such boundaries, so the window keeps the slice's
alignment (a program's vector loads depend on it) and its offset is one of at most 16 / itemsize values:
the slices of every step share one program, or a few. The first slice, at offset 0 of a larger storage, is
windowed too, so that it looks like the others. A fused batch norm writes its running statistics through their
windows into the storage they lie in; the window's version counter moves, the storage's does not, as torch's
kernels leave a running statistic's counter where it was.

The same windows carry a compiled function's sliced arguments ([Note: sliced arguments] in ``function.py``).
"""

from __future__ import annotations

from tilewise import strides as S
from tilewise.storage import Storage
from tilewise.tensor import Tensor


class Window:
    """Device memory inside another storage's allocation."""

    __slots__ = ("base", "nbytes", "ptr")

    def __init__(self, base, ptr: int, nbytes: int) -> None:
        self.base, self.ptr, self.nbytes = base, ptr, nbytes


def rebased(t: Tensor) -> Tensor:
    """``t`` over a storage window that starts at the 16-byte boundary at or before its first element and ends at
    its last (see the note)."""
    numel = S.numel(t._shape)
    if t._offset == 0 and numel == t._storage.numel:  # all of its storage (the usual argument): nothing to cut
        return t
    itemsize = t._dtype.itemsize
    span = 1 + sum((n - 1) * s for n, s in zip(t._shape, t._strides)) if numel else 0
    if (t._offset == 0 and span == t._storage.numel) or any(s < 0 for s in t._strides) or 16 % itemsize:
        return t
    lead = t._offset % (16 // itemsize)  # elements between the boundary and the first element
    start, size = t._offset - lead, lead + span
    base = t._storage.data
    if t._device.type == "cpu":  # the C target's programs (tests run the mechanism there): a numpy view
        window = base[start:start + size]
    else:
        window = Window(base, base.ptr + start * itemsize, size * itemsize)
    return Tensor._make(Storage(window, t._device, t._dtype, size), t._shape, t._strides, lead, t._dtype, t._device)
