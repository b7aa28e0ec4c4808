"""Pinned (page-locked) host memory and the raw copy helpers.

[Note: pinned memory]
Copies between the host and the device are asynchronous only when the host side is page-locked; from
pageable memory the driver stages through its own pinned buffer and the copy blocks the host. A
:class:`PinnedBuffer` comes from ``cuMemHostAlloc(..., CU_MEMHOSTALLOC_PORTABLE)`` (usable from every
context) and is seen from Python as a numpy array over the same bytes, built with ctypes
``from_address``; every array made from it keeps the buffer alive, and the memory is freed
(``cuMemFreeHost``) when the last of them goes. The copy helpers take plain integer addresses and byte
counts, which is what the tensor layer has at hand; they are asynchronous with respect to the host
when the host memory is pinned, and ordered on ``stream``.
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from tilewise._cuda_api import check, driver_api
from tilewise.backends.cuda.runtime.capturing import refuse_under_capture
from tilewise.backends.cuda.runtime.device import call_in_context, context_device, ensure_context


class PinnedBuffer:
    """``nbytes`` of page-locked host memory.

    >>> buf = PinnedBuffer(4096)  # doctest: +SKIP
    >>> x = buf.as_array(np.float32, (1024,))  # doctest: +SKIP
    """

    def __init__(self, nbytes: int, device: int | None = None) -> None:
        if nbytes < 0:
            raise ValueError(f"PinnedBuffer size must be >= 0, got {nbytes}")
        # portable memory: any context will do, so the one current stays (see device.py's context_device)
        self.device = ensure_context(device) if device is not None else context_device()
        cu = driver_api()
        self.nbytes = nbytes
        self.ptr = int(check(cu.cuMemHostAlloc(max(nbytes, 1), cu.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"))

    def as_array(self, dtype: np.dtype | type = np.uint8, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A numpy view of the buffer (the whole of it, or its first ``prod(shape)`` elements)."""
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize if shape is None else int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > self.nbytes:
            raise ValueError(
                f"shape {shape} of {dtype} needs {count * dtype.itemsize} bytes; the buffer has {self.nbytes}"
            )
        raw = (ctypes.c_byte * max(self.nbytes, 1)).from_address(self.ptr)
        raw._owner = self  # the array's base chain ends in `raw`, which keeps this buffer alive
        array = np.frombuffer(raw, dtype=dtype, count=count)
        return array if shape is None else array.reshape(shape)

    def __del__(self) -> None:
        if getattr(self, "ptr", 0):
            with contextlib.suppress(Exception):  # at interpreter shutdown the driver may be gone
                call_in_context(self.device, driver_api().cuMemFreeHost, self.ptr)


def is_pinned(array: np.ndarray) -> bool:
    """True when ``array`` views memory of a :class:`PinnedBuffer` (its base chain ends at one)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(getattr(base, "_owner", None), PinnedBuffer)


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialised numpy array in pinned memory."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return PinnedBuffer(nbytes).as_array(dtype, tuple(shape))


def copy_htod(dst: int, src: int, nbytes: int, stream: int = 0) -> None:
    """Copy ``nbytes`` from host address ``src`` to device address ``dst``, ordered on ``stream``."""
    refuse_under_capture("copying host memory to the device")
    context_device()  # the operation's context, see device.py's context_device
    check(driver_api().cuMemcpyHtoDAsync(dst, src, nbytes, int(stream)), "cuMemcpyHtoDAsync")


def copy_dtoh(dst: int, src: int, nbytes: int, stream: int = 0) -> None:
    """Copy ``nbytes`` from device address ``src`` to host address ``dst``, ordered on ``stream``."""
    refuse_under_capture("reading device memory on the host")
    context_device()  # the operation's context, see device.py's context_device
    check(driver_api().cuMemcpyDtoHAsync(dst, src, nbytes, int(stream)), "cuMemcpyDtoHAsync")


def copy_dtod(dst: int, src: int, nbytes: int, stream: int = 0) -> None:
    """Copy ``nbytes`` between two device addresses, ordered on ``stream``."""
    context_device()  # the operation's context, see device.py's context_device
    check(driver_api().cuMemcpyDtoDAsync(dst, src, nbytes, int(stream)), "cuMemcpyDtoDAsync")
