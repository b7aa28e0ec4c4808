"""Batches that cross from a worker process to the main process through shared memory.

[Note: shared-memory batches] A worker collates each tensor of a batch straight into an anonymous shared-memory
file (``memfd_create``; an unlinked file in /dev/shm where that is missing) and sends the batch over its own Unix
socket. The pickled message holds, for each tensor, only its dtype, shape, strides and offset; the files travel
beside it as file descriptors (``SCM_RIGHTS``). The main process maps each file and wraps the mapping as the
tensor's storage, so a batch's bytes are written once, by the worker's stack, and never pickled or copied again.
The files have no name, so nothing is left behind when either process dies: the memory goes with the last mapping.
A tensor that is not in shared memory yet (a custom ``collate_fn``, a sample returned as it is) is copied into a
new file when it is sent, as torch moves a storage to shared memory when it pickles it. Views of one storage in
one message arrive as views of one storage. Measured in ``benchmarks/dataloader_workers.py`` on 38.5 MB batches:
the main process spends 1.4-2.5 ms of CPU per batch (torch: 7-10 ms), against 95-125 ms to unpickle the same
bytes. What remains is the worker's first write into fresh shared pages (about 5 us a page here, as for torch).
"""

from __future__ import annotations

import array
import io
import mmap
import os
import pickle
import socket
import struct
import tempfile
import weakref
from collections.abc import Sequence

import numpy as np

from tilewise import strides as _strides
from tilewise.device import cpu
from tilewise.dtypes import DType, as_dtype
from tilewise.storage import Storage
from tilewise.tensor import Tensor

_HEADER = struct.Struct("<QI")  # payload bytes, file descriptors
_FDS_PER_MESSAGE = 253  # Linux's SCM_MAX_FD: one sendmsg carries at most this many descriptors


class SharedMapping(mmap.mmap):
    """A shared mapping of an anonymous file; ``fd`` stays open while the mapping lives (it is what is sent)."""

    fd: int | None = None


def _anonymous_file(nbytes: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tilewise-batch", os.MFD_CLOEXEC)
    else:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="tilewise-batch-", dir=shm)
        os.unlink(path)
    os.ftruncate(fd, nbytes)
    return fd


def _map(fd: int, nbytes: int, keep_fd: bool) -> SharedMapping:
    mapping = SharedMapping(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    if keep_fd:
        mapping.fd = fd
        weakref.finalize(mapping, os.close, fd)
    else:
        os.close(fd)
    return mapping


def shared_empty(shape: Sequence[int], dtype: DType) -> Tensor:
    """An uninitialised contiguous CPU tensor whose storage is an anonymous shared-memory file."""
    shape = tuple(shape)
    numel = int(np.prod(shape, dtype=np.int64))
    storage = _shared_storage(numel, dtype)
    return Tensor._make(storage, shape, _strides.contiguous_strides(shape), 0, dtype, cpu)


def _shared_storage(numel: int, dtype: DType) -> Storage:
    if numel == 0:
        return Storage(np.empty(0, dtype.np), cpu, dtype, 0)
    mapping = _map(_anonymous_file(numel * dtype.itemsize), numel * dtype.itemsize, keep_fd=True)
    return _mapped_storage(mapping, dtype, numel)


def _mapped_storage(mapping: SharedMapping, dtype: DType, numel: int) -> Storage:
    storage = Storage(np.frombuffer(mapping, dtype.np, numel), cpu, dtype, numel)
    storage.shared = True  # what ``Tensor.is_shared()`` reads
    return storage


def shared_fd(storage: Storage) -> int | None:
    """The open file behind ``storage`` if it lives in a shared mapping this process made, else None."""
    base = storage.data
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base.fd if isinstance(base, SharedMapping) else None


# ------------------------------------------------------------------------------------------- pickling

class _BatchPickler(pickle.Pickler):
    """Pickles a batch with every tensor replaced by its geometry and the index of the file that holds it."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds: list[int] = []
        self._fd_index: dict[int, int] = {}  # id(storage) -> position in fds
        self._keep_alive: list[Storage] = []  # storages copied for this message, alive until it is sent

    def persistent_id(self, obj):
        if not isinstance(obj, Tensor):
            return None
        _check_sendable(obj)
        requires_grad = obj.requires_grad
        if obj.numel() == 0:
            return ("tensor", None, obj.dtype.name, tuple(obj.shape), tuple(obj.stride()), 0, 0, requires_grad)
        storage = obj.untyped_storage()
        if shared_fd(storage) is None:
            obj = _copy_to_shared(obj)
            storage = obj.untyped_storage()
            self._keep_alive.append(storage)
        index = self._fd_index.get(id(storage))
        if index is None:
            index = self._fd_index[id(storage)] = len(self.fds)
            self.fds.append(shared_fd(storage))
        return ("tensor", index, obj.dtype.name, tuple(obj.shape), tuple(obj.stride()), obj.storage_offset(),
                storage.numel, requires_grad)


def _check_sendable(t: Tensor) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(f"a DataLoader worker can only send CPU tensors, and this batch holds one on {t.device}; "
                           "load to the CPU in the worker and move batches to the device in the main process "
                           "(pin_memory=True makes that copy asynchronous)")
    if t.requires_grad and t._grad_fn is not None:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does "
                           "not support crossing process boundaries.  If you just want to transfer the data, call "
                           "detach() on the tensor before serializing (e.g., putting it on the queue).")


def _copy_to_shared(t: Tensor) -> Tensor:
    out = shared_empty(tuple(t.shape), t.dtype)
    np.copyto(out._np(), t.detach()._np())
    return out


class _BatchUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, fds: list[int]) -> None:
        super().__init__(file)
        self._fds = fds
        self._storages: dict[int, Storage] = {}

    def persistent_load(self, pid):
        _, index, dtype_name, shape, strides, offset, storage_size, requires_grad = pid
        dtype = as_dtype(dtype_name)
        if index is None:
            storage = Storage(np.empty(0, dtype.np), cpu, dtype, 0)
        else:
            storage = self._storages.get(index)
            if storage is None:
                storage = self._storages[index] = _storage_from_fd(self._fds[index], dtype, storage_size)
        t = Tensor._make(storage, tuple(shape), tuple(strides), offset, dtype, cpu)
        return t.requires_grad_(True) if requires_grad else t

    def close_unmapped(self) -> None:
        """Close the files no tensor was made of (the message failed to unpickle part-way)."""
        for index, fd in enumerate(self._fds):
            if index not in self._storages:
                os.close(fd)


def _storage_from_fd(fd: int, dtype: DType, numel: int) -> Storage:
    return _mapped_storage(_map(fd, numel * dtype.itemsize, keep_fd=False), dtype, numel)


# ------------------------------------------------------------------------------------------- the socket

def send(sock: socket.socket, obj) -> None:
    """Send ``obj`` (any picklable object holding CPU tensors) to the process at the other end of ``sock``."""
    buffer = io.BytesIO()
    pickler = _BatchPickler(buffer)
    pickler.dump(obj)
    payload, fds = buffer.getbuffer(), pickler.fds
    chunks = [fds[i:i + _FDS_PER_MESSAGE] for i in range(0, len(fds), _FDS_PER_MESSAGE)] or [[]]
    sock.sendmsg([_HEADER.pack(len(payload), len(fds))], _rights(chunks[0]))
    for chunk in chunks[1:]:
        sock.sendmsg([b"\0"], _rights(chunk))
    sock.sendall(payload)


def _rights(fds: list[int]) -> list:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []


def recv(sock: socket.socket):
    """The next object sent by :func:`send`; raises EOFError when the other end has closed its socket."""
    fds: list[int] = []
    try:
        header = _recv_with_fds(sock, _HEADER.size, fds)
        nbytes, nfds = _HEADER.unpack(header)
        while len(fds) < nfds:
            _recv_with_fds(sock, 1, fds)
        payload = _recv_exactly(sock, nbytes)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    unpickler = _BatchUnpickler(io.BytesIO(payload), fds)
    try:
        return unpickler.load()
    finally:
        unpickler.close_unmapped()


def _recv_with_fds(sock: socket.socket, nbytes: int, fds: list[int]) -> bytes:
    ancillary = socket.CMSG_SPACE(_FDS_PER_MESSAGE * array.array("i").itemsize)
    data, ancdata, flags, _ = sock.recvmsg(nbytes, ancillary)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[:len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    if flags & socket.MSG_CTRUNC:  # the kernel dropped descriptors this process had no room for
        raise RuntimeError("Too many open files. Communication with the workers is no longer possible. Please "
                           "increase the limit using `ulimit -n` in the shell")
    if not data:
        raise EOFError
    return data + _recv_exactly(sock, nbytes - len(data)) if len(data) < nbytes else data


def _recv_exactly(sock: socket.socket, nbytes: int) -> bytes:
    out = bytearray(nbytes)
    view, got = memoryview(out), 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError
        got += n
    return out
