"""Key-value stores through which the processes of a job find each other.

[Note: stores] A store is the one thing every process can reach before any transport exists: ranks publish
their addresses in it, count arrivals with ``add`` and block on ``wait`` until the others have written.
The interface is torch's (``torch.distributed.Store``): values are bytes (a ``str`` is stored as UTF-8),
``get`` and ``wait`` block until the keys exist and raise ``DistStoreError("wait timeout after Nms, keys:
...")`` when the store's timeout passes, ``add`` keeps an integer as its decimal text so ``get`` reads it
back, and ``compare_set`` writes only where the current value equals the expected one (a missing key
matches ``""``). Every store is built on ``_KeyValueTable``, one dictionary guarded by a condition variable,
so the blocking rules live in one place:

- ``HashStore`` is that table in this process (threads of one process);
- ``TCPStore`` runs the table in a server thread of the master process and talks to it over one socket
  per client with a small length-prefixed binary protocol (never pickle: a store listens on the network);
  a blocking ``wait`` is answered by the server when the keys arrive or the client's timeout passes;
- ``FileStore`` appends records to a shared file under ``flock`` and polls it, for hosts sharing a disk;
- ``PrefixStore`` puts ``prefix/`` before every key, so each process group and backend gets a namespace.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import socketserver
import struct
import threading
import time

DEFAULT_STORE_TIMEOUT = datetime.timedelta(seconds=300)


class DistError(RuntimeError):
    """An error of the distributed runtime (torch's ``torch.distributed.DistError``)."""


class DistStoreError(DistError):
    """A store operation failed or timed out (torch's ``torch.distributed.DistStoreError``)."""


class DistNetworkError(DistError):
    """A socket of the distributed runtime failed (torch's ``torch.distributed.DistNetworkError``)."""


def _as_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return bytes(value)
    raise TypeError(f"Store value must be str or bytes, got {type(value).__name__}")


def _timeout_error(keys: list[str], timeout: datetime.timedelta) -> DistStoreError:
    ms = int(timeout.total_seconds() * 1000)
    return DistStoreError(f"wait timeout after {ms}ms, keys: {', '.join('/' + k for k in keys)}")


def _seconds(timeout: datetime.timedelta | None, default: datetime.timedelta) -> float:
    return (timeout if timeout is not None else default).total_seconds()


class Store:
    """The interface of every store; subclasses implement the raw operations on bytes."""

    def __init__(self) -> None:
        self._timeout = DEFAULT_STORE_TIMEOUT

    @property
    def timeout(self) -> datetime.timedelta:
        return self._timeout

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout

    def set(self, key: str, value) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        raise NotImplementedError

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        raise NotImplementedError

    def check(self, keys: list[str]) -> bool:
        raise NotImplementedError

    def delete_key(self, key: str) -> bool:
        raise NotImplementedError

    def num_keys(self) -> int:
        raise NotImplementedError

    def multi_set(self, keys: list[str], values: list) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]


class _KeyValueTable:
    """A dictionary of bytes with blocking reads; the state behind HashStore and the TCPStore server."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.changed:
            self.data[key] = value
            self.changed.notify_all()

    def add(self, key: str, amount: int) -> int:
        with self.changed:
            current = self.data.get(key, b"0")
            try:
                total = int(current) + amount
            except ValueError:
                raise DistStoreError(f"add(): the value of key '{key}' is not an integer: {current!r}") from None
            self.data[key] = str(total).encode()
            self.changed.notify_all()
            return total

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.changed:
            current = self.data.get(key)
            if current is None:
                if expected:
                    return expected
                current = b""
            if current == expected:
                self.data[key] = desired
                self.changed.notify_all()
                return desired
            return current

    def wait(self, keys: list[str], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        with self.changed:
            while not all(k in self.data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def get(self, key: str, seconds: float) -> bytes | None:
        with self.changed:
            if not self.wait([key], seconds):
                return None
            return self.data[key]

    def delete(self, key: str) -> bool:
        with self.changed:
            return self.data.pop(key, None) is not None


class HashStore(Store):
    """A store in this process's memory, shared by its threads."""

    def __init__(self) -> None:
        super().__init__()
        self._table = _KeyValueTable()

    def set(self, key: str, value) -> None:
        self._table.set(key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        value = self._table.get(key, self._timeout.total_seconds())
        if value is None:
            raise DistStoreError("Wait timeout")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._table.add(key, int(amount))

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        return self._table.compare_set(key, _as_bytes(expected_value), _as_bytes(desired_value))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        if not self._table.wait(list(keys), _seconds(timeout, self._timeout)):
            raise DistStoreError("Wait timeout")

    def check(self, keys: list[str]) -> bool:
        return self._table.wait(list(keys), 0)

    def delete_key(self, key: str) -> bool:
        return self._table.delete(key)

    def num_keys(self) -> int:
        return len(self._table.data)


# TCPStore's wire protocol: a request is an opcode byte and a list of byte strings, a reply a status byte and
# a list of byte strings; a list is a u32 count then, for each string, a u32 length and the bytes.
_SET, _GET, _ADD, _CAS, _WAIT, _CHECK, _DELETE, _NUM_KEYS = range(8)
_OK, _TIMEOUT, _ERROR = range(3)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. "
                                   "Did the remote server shutdown or crash?")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _pack(head: int, parts: list[bytes]) -> bytes:
    out = [struct.pack("<BI", head, len(parts))]
    for part in parts:
        out.append(struct.pack("<I", len(part)))
        out.append(part)
    return b"".join(out)


def _unpack(sock: socket.socket) -> tuple[int, list[bytes]]:
    head, count = struct.unpack("<BI", _recv_exact(sock, 5))
    parts = []
    for _ in range(count):
        (length,) = struct.unpack("<I", _recv_exact(sock, 4))
        parts.append(_recv_exact(sock, length))
    return head, parts


class _StoreRequestHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        table: _KeyValueTable = self.server.table
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            try:
                op, args = _unpack(self.request)
            except (DistNetworkError, OSError):
                return
            try:
                status, reply = self.answer(table, op, args)
            except DistStoreError as error:
                status, reply = _ERROR, [str(error).encode()]
            try:
                self.request.sendall(_pack(status, reply))
            except OSError:
                return

    @staticmethod
    def answer(table: _KeyValueTable, op: int, args: list[bytes]) -> tuple[int, list[bytes]]:
        if op == _SET:
            table.set(args[0].decode(), args[1])
            return _OK, []
        if op == _GET:
            value = table.get(args[0].decode(), float(args[1]))
            return (_TIMEOUT, []) if value is None else (_OK, [value])
        if op == _ADD:
            return _OK, [str(table.add(args[0].decode(), int(args[1]))).encode()]
        if op == _CAS:
            return _OK, [table.compare_set(args[0].decode(), args[1], args[2])]
        if op == _WAIT:
            keys = [k.decode() for k in args[1:]]
            return (_OK if table.wait(keys, float(args[0])) else _TIMEOUT), []
        if op == _CHECK:
            return (_OK if table.wait([k.decode() for k in args], 0) else _TIMEOUT), []
        if op == _DELETE:
            return (_OK if table.delete(args[0].decode()) else _TIMEOUT), []
        if op == _NUM_KEYS:
            return _OK, [str(len(table.data)).encode()]
        return _ERROR, [f"unknown store request {op}".encode()]


class _StoreServer(socketserver.ThreadingTCPServer):
    """Serves until ``stopping`` is set. Not ``serve_forever``: its ``shutdown()`` waits for the serving thread,
    which never runs again once the interpreter is exiting, so a store dropped at exit would hang the process."""

    daemon_threads = True
    allow_reuse_address = True
    timeout = 0.2  # seconds handle_request waits, so ``stopping`` is seen promptly

    def __init__(self, port: int):
        super().__init__(("", port), _StoreRequestHandler)
        self.table = _KeyValueTable()
        self.stopping = False

    def serve_until_stopped(self) -> None:
        while not self.stopping:
            self.handle_request()
        self.server_close()


class TCPStore(Store):
    """A store served over TCP by the master process (``is_master=True``) to every other process.

    >>> store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True)
    >>> store.set("key", "value"); store.get("key")
    b'value'
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: datetime.timedelta = DEFAULT_STORE_TIMEOUT, wait_for_workers: bool = True,
                 multi_tenant: bool = False, master_listen_fd: int | None = None, use_libuv: bool = True):
        super().__init__()
        self._timeout = timeout
        self.host = host_name
        self._server = None
        if is_master:
            self._server = _StoreServer(int(port))
            port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_until_stopped, name="tilewise-tcpstore", daemon=True).start()
        self.port = int(port)
        self._lock = threading.Lock()
        self._socket = self._connect(host_name, self.port, timeout)
        if world_size is not None and world_size > 0:
            self.add("init/", 1)
            if is_master and wait_for_workers:
                self._wait_for_workers(world_size)

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 (torch's name)
        return False

    @staticmethod
    def _connect(host: str, port: int, timeout: datetime.timedelta) -> socket.socket:
        deadline = time.monotonic() + timeout.total_seconds()
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as error:
                if time.monotonic() + delay > deadline:
                    raise DistNetworkError(
                        f"The client socket has timed out after {int(timeout.total_seconds() * 1000)}ms while "
                        f"trying to connect to ({host}, {port}): {error}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _wait_for_workers(self, world_size: int) -> None:
        deadline = time.monotonic() + self._timeout.total_seconds()
        while int(self._request(_GET, ["init/", b"0"])[1][0]) < world_size:
            if time.monotonic() > deadline:
                raise DistStoreError(f"Timed out after {int(self._timeout.total_seconds())} seconds waiting for "
                                     f"clients. {self._request(_GET, ['init/', b'0'])[1][0].decode()}/"
                                     f"{world_size} clients joined.")
            time.sleep(0.01)

    def _request(self, op: int, args: list) -> tuple[int, list[bytes]]:
        payload = _pack(op, [_as_bytes(a) for a in args])
        with self._lock:
            self._socket.sendall(payload)
            status, reply = _unpack(self._socket)
        if status == _ERROR:
            raise DistStoreError(reply[0].decode())
        return status, reply

    def set(self, key: str, value) -> None:
        self._request(_SET, [key, _as_bytes(value)])

    def get(self, key: str) -> bytes:
        status, reply = self._request(_GET, [key, str(self._timeout.total_seconds())])
        if status == _TIMEOUT:
            raise _timeout_error([key], self._timeout)
        return reply[0]

    def add(self, key: str, amount: int) -> int:
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"add(): incompatible function arguments: amount must be an int, got "
                            f"{type(amount).__name__}")
        return int(self._request(_ADD, [key, str(amount)])[1][0])

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        return self._request(_CAS, [key, _as_bytes(expected_value), _as_bytes(desired_value)])[1][0]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        timeout = timeout if timeout is not None else self._timeout
        status, _ = self._request(_WAIT, [str(timeout.total_seconds()), *keys])
        if status == _TIMEOUT:
            raise _timeout_error(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        return self._request(_CHECK, list(keys))[0] == _OK

    def delete_key(self, key: str) -> bool:
        return self._request(_DELETE, [key])[0] == _OK

    def num_keys(self) -> int:
        return int(self._request(_NUM_KEYS, [])[1][0])

    def local_address(self) -> str:
        """The address of this host as the master sees it: where peers of this process can reach it."""
        return self._socket.getsockname()[0]

    def __del__(self) -> None:
        socket_ = getattr(self, "_socket", None)
        if socket_ is not None:
            socket_.close()
        if getattr(self, "_server", None) is not None:
            self._server.stopping = True  # never wait here: see _StoreServer


class FileStore(Store):
    """A store in a file that every process can open (one host, or a shared file system).

    Records are appended under an exclusive ``flock``; a reader replays the file, the last record of a key
    winning, and a deleted key is a record with no value.
    """

    _POLL_SECONDS = 0.005

    def __init__(self, file_name: str, world_size: int = -1):
        super().__init__()
        self.path = file_name
        open(file_name, "ab").close()  # noqa: SIM115 (create it if missing)
        self.world_size = world_size

    def _locked(self, exclusive: bool):
        handle = open(self.path, "a+b")  # noqa: SIM115 (closed by the caller's with)
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return handle

    @staticmethod
    def _replay(handle) -> dict[str, bytes]:
        handle.seek(0)
        raw = handle.read()
        data, offset = {}, 0
        while offset + 9 <= len(raw):
            key_len, value_len, present = struct.unpack_from("<IIB", raw, offset)
            offset += 9
            key = raw[offset:offset + key_len].decode()
            offset += key_len
            if present:
                data[key] = raw[offset:offset + value_len]
                offset += value_len
            else:
                data.pop(key, None)
        return data

    @staticmethod
    def _append(handle, key: str, value: bytes | None) -> None:
        encoded = key.encode()
        handle.seek(0, os.SEEK_END)
        handle.write(struct.pack("<IIB", len(encoded), len(value or b""), value is not None) + encoded
                     + (value or b""))
        handle.flush()

    def _read(self) -> dict[str, bytes]:
        with self._locked(exclusive=False) as handle:
            return self._replay(handle)

    def set(self, key: str, value) -> None:
        with self._locked(exclusive=True) as handle:
            self._append(handle, key, _as_bytes(value))

    def add(self, key: str, amount: int) -> int:
        with self._locked(exclusive=True) as handle:
            total = int(self._replay(handle).get(key, b"0")) + int(amount)
            self._append(handle, key, str(total).encode())
            return total

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        expected, desired = _as_bytes(expected_value), _as_bytes(desired_value)
        with self._locked(exclusive=True) as handle:
            current = self._replay(handle).get(key)
            if current is None and expected:
                return expected
            if (current or b"") == expected:
                self._append(handle, key, desired)
                return desired
            return current

    def _poll(self, keys: list[str], seconds: float) -> dict[str, bytes] | None:
        deadline = time.monotonic() + seconds
        while True:
            data = self._read()
            if all(k in data for k in keys):
                return data
            if time.monotonic() > deadline:
                return None
            time.sleep(self._POLL_SECONDS)

    def get(self, key: str) -> bytes:
        data = self._poll([key], self._timeout.total_seconds())
        if data is None:
            raise _timeout_error([key], self._timeout)
        return data[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        timeout = timeout if timeout is not None else self._timeout
        if self._poll(list(keys), timeout.total_seconds()) is None:
            raise _timeout_error(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        data = self._read()
        return all(k in data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self._locked(exclusive=True) as handle:
            if key not in self._replay(handle):
                return False
            self._append(handle, key, None)
            return True

    def num_keys(self) -> int:
        return len(self._read())


class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix/``: a namespace for one group or backend."""

    def __init__(self, prefix: str, store: Store):
        super().__init__()
        self.prefix = prefix
        self.underlying_store = store

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    @property
    def timeout(self) -> datetime.timedelta:
        return self.underlying_store.timeout

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.underlying_store.set_timeout(timeout)

    def set(self, key: str, value) -> None:
        self.underlying_store.set(self._key(key), value)

    def get(self, key: str) -> bytes:
        return self.underlying_store.get(self._key(key))

    def add(self, key: str, amount: int) -> int:
        return self.underlying_store.add(self._key(key), amount)

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        return self.underlying_store.compare_set(self._key(key), expected_value, desired_value)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.underlying_store.wait([self._key(k) for k in keys], timeout)

    def check(self, keys: list[str]) -> bool:
        return self.underlying_store.check([self._key(k) for k in keys])

    def delete_key(self, key: str) -> bool:
        return self.underlying_store.delete_key(self._key(key))

    def num_keys(self) -> int:
        return self.underlying_store.num_keys()

    def local_address(self) -> str:
        inner = self.underlying_store
        return inner.local_address() if hasattr(inner, "local_address") else "127.0.0.1"
