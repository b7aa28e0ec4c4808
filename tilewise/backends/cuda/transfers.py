"""Copies between the host and CUDA devices, and page-locked host memory.

``upload`` (host to device), ``download`` (device to host) and the ``_to_copy`` kernel that moves a CUDA
tensor to the host or to another GPU; ``pin_memory``/``empty_pinned``/``is_pinned`` for the page-locked CPU
tensors that make uploads asynchronous. The CUDA backend offers them through the
:class:`~tilewise.device.Backend` protocol; the conversions they need on the device are the copy kernels'.
"""

from __future__ import annotations

import numpy as np

from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel
from tilewise.backends.cuda.kernels.copy import cast, contiguous, copy_into
from tilewise.device import Device, cpu
from tilewise.dtypes import DType
from tilewise.layouts import copy_strides
from tilewise.storage import Storage
from tilewise.tensor import Tensor, cast_array, from_array, from_array_strided


def upload(src: Tensor, device: Device, non_blocking: bool = False, dtype: DType | None = None,
           memory_format=None) -> Tensor:
    """Copy CPU tensor ``src`` to ``device``, converted to ``dtype`` (default: its own).

    [Note: uploads]
    From pageable memory the driver stages the bytes through a pinned buffer of its own and returns once all
    are staged: the copy blocks the host, and ``src`` may change or go right after, as in torch. From a
    contiguous pinned tensor the copy engine reads ``src`` itself, so nothing is staged: with
    ``non_blocking`` the call returns as soon as the copy is queued on the current stream, and ``src`` is
    held until an event recorded behind the copy has completed (the caller may drop it at once); without it
    the host waits for the stream, as torch does, so that writing ``src`` afterwards cannot race the copy. A
    pinned source that needs a dtype change is copied as it is and converted on the device, so the host
    never touches its bytes; a pageable one is converted on the host first (fewer bytes to stage when it
    narrows).
    """
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import copy_htod, ensure_context

    dtype = dtype or src._dtype
    index = ensure_context(device.index)
    stream = stream_handle(index)
    strides = copy_strides(src, memory_format)
    if strides != S.contiguous_strides(src._shape):
        return _upload_dense_block(src, device, dtype, strides, stream)
    if _uploads_from_pinned(src):
        out = empty(src._shape, src._dtype, device)
        if out.numel():
            copy_htod(data_ptr(out), _host_address(src), out.numel() * src._dtype.itemsize, stream)
            if non_blocking:
                _keep_until_done(src._storage.data, stream)
            else:
                check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
        if dtype is src._dtype:
            return out
        from tilewise.backends.cuda.kernels.copy import cast

        return cast(out, dtype)
    host = src._np()
    host = np.ascontiguousarray(host if host.dtype == dtype.np else cast_array(host, dtype.np))
    out = empty(src._shape, dtype, device)
    if host.nbytes:
        copy_htod(data_ptr(out), host.ctypes.data, host.nbytes, stream)
    return out


def _upload_dense_block(src: Tensor, device: Device, dtype: DType, strides: tuple, stream: int) -> Tensor:
    """An upload in another order than row-major (a channels-last tensor, say): laid out so on the host, then
    its dense block of memory copied as it is. The block may be ``src``'s own memory, which, pinned, the copy
    engine reads after the call returns: the host then waits for the copy, so that ``src`` may change at once."""
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import copy_htod, is_pinned

    host = src._np()
    staged = from_array_strided(host if host.dtype == dtype.np else cast_array(host, dtype.np), strides, dtype)
    out = empty(src._shape, dtype, device, strides)
    nbytes = out.numel() * dtype.itemsize
    if nbytes:
        copy_htod(data_ptr(out), _host_address(staged), nbytes, stream)
        if is_pinned(staged._storage.data):
            check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
    return out


def _uploads_from_pinned(src: Tensor) -> bool:
    from tilewise.backends.cuda.runtime import is_pinned

    return src.is_contiguous() and is_pinned(src._storage.data)


def _host_address(t: Tensor) -> int:
    return t._storage.data.ctypes.data + t._offset * t._dtype.itemsize


def download(x: Tensor, non_blocking: bool = False, memory_format=None) -> Tensor:
    """Copy a CUDA tensor to a new CPU tensor in ``memory_format`` (default: ``x``'s own order, as ``clone``
    keeps it); with ``non_blocking`` into pinned memory, returning
    before the copy has finished (synchronise the stream before reading it, as in torch). Every download is a
    point where results become visible, so it raises the index error an indexing kernel found meanwhile, if
    any (see [Note: device-side bounds checks])."""
    from tilewise.backends.cuda.runtime import copy_dtoh, ensure_context, pinned_empty
    from tilewise.backends.cuda.runtime.bounds import raise_index_errors

    index = x._device.index
    ensure_context(index)
    strides = copy_strides(x, memory_format)
    dense = x._strides == strides and S.is_non_overlapping_and_dense(x._shape, strides)
    src = x if dense else copy_into(empty(x._shape, x._dtype, x._device, strides), x)
    numel = src.numel()
    host = pinned_empty((numel,), src._dtype.np) if non_blocking else np.empty(numel, src._dtype.np)
    nbytes = numel * src._dtype.itemsize
    if nbytes:
        stream = stream_handle(index)
        copy_dtoh(host.ctypes.data, data_ptr(src), nbytes, stream)
        if not non_blocking:
            from tilewise._cuda_api import check, driver_api

            check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
    raise_index_errors()
    return Tensor._make(Storage(host, cpu, src._dtype, numel), src._shape, strides, 0, src._dtype, cpu)


def pin_memory(x: Tensor) -> Tensor:
    """A contiguous copy of CPU tensor ``x`` in page-locked memory (what makes ``non_blocking`` uploads
    asynchronous)."""
    from tilewise.backends.cuda.runtime import pinned_empty

    host = pinned_empty(x._shape, x._dtype.np)
    host[...] = x._np()
    return from_array(host, x._dtype)


def empty_pinned(shape: tuple, dtype: DType) -> Tensor:
    """An uninitialised contiguous CPU tensor in page-locked memory (``tilewise.empty(..., pin_memory=True)``)."""
    from tilewise.backends.cuda.runtime import pinned_empty

    return from_array(pinned_empty(tuple(shape), dtype.np), dtype)


_in_flight: list[tuple[np.ndarray, object]] = []  # pinned sources of asynchronous uploads, with their events


def _keep_until_done(array: np.ndarray, stream: int) -> None:
    """Hold a pinned source until the copy queued on ``stream`` so far has completed; release the sources of
    the copies that have."""
    from tilewise.backends.cuda.runtime import Event

    _in_flight[:] = [(a, e) for a, e in _in_flight if not e.query()]
    event = Event()
    event.record(stream)
    _in_flight.append((array, event))


def is_pinned(t: Tensor) -> bool:
    from tilewise.backends.cuda.runtime import is_pinned as pinned

    return t._storage is not None and pinned(t._storage.data)


# ---------------------------------------------------------------------------- the _to_copy kernel

@kernel("_to_copy")
def to_copy(device: Device, self: Tensor, dtype=None, target=None, non_blocking: bool = False,
            memory_format=None) -> Tensor:
    dtype = dtype or self._dtype
    if target is not None and target.type == "cpu":
        if dtype is self._dtype:
            return download(self, non_blocking, memory_format)
        return download(_converted(self, dtype, memory_format), non_blocking)
    if target is not None and target != self._device:
        return _peer_copy(cast(self, dtype) if dtype is not self._dtype else contiguous(self), target)
    return _converted(self, dtype, memory_format)


def _converted(x: Tensor, dtype: DType, memory_format) -> Tensor:
    """``x`` cast to ``dtype`` on its device, laid out as ``clone(memory_format=...)`` would lay it out."""
    return copy_into(empty(x._shape, dtype, x._device, copy_strides(x, memory_format)), x)


def _peer_copy(x: Tensor, target: Device) -> Tensor:
    """Contiguous ``x`` copied to another GPU, ordered as torch orders a copy between devices: it runs on the
    source's current stream once the target's current stream is done with the new block's memory, and the
    target's stream waits for it, so work queued next on either device sees the copy in order. (Each stream
    handle, 0 included, means a stream of its own device: the legacy default stream is per context.)"""
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import Event, Stream, ensure_context
    from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing

    source, dest = x._device.index, target.index
    out = empty(x._shape, x._dtype, target)
    nbytes = x.numel() * x._dtype.itemsize
    if not nbytes:
        return out
    cu = driver_api()
    source_stream, dest_stream = stream_handle(source), stream_handle(dest)
    ordered = not is_current_stream_capturing()  # a capture holds one stream: the copy joins it as it is
    if ordered:
        ready = Event()
        ready.record(Stream.from_handle(dest_stream, dest))
    ensure_context(source)
    if ordered:
        check(cu.cuStreamWaitEvent(source_stream, ready.handle, 0), "cuStreamWaitEvent")
    check(cu.cuMemcpyAsync(data_ptr(out), data_ptr(x), nbytes, source_stream), "cuMemcpyAsync")
    if ordered:
        done = Event()
        done.record(Stream.from_handle(source_stream, source))
        ensure_context(dest)
        check(cu.cuStreamWaitEvent(dest_stream, done.handle, 0), "cuStreamWaitEvent")
        ensure_context(source)  # the operation's device again (see [Note: the operation's device])
    return out
