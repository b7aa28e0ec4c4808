"""Backend "gloo": CPU tensors between processes over TCP, reduced with numpy.

[Note: gloo transport] Each rank listens on a port, publishes ``host:port`` in the group's store, and the
ranks build a full mesh: the higher rank of a pair connects, the lower accepts. Every peer has a sender
thread (frames leave in the order they were posted, so two ranks sending to each other never deadlock on
full socket buffers) and a receiver thread that files incoming frames by channel: collective frames into a
FIFO per peer, point-to-point frames by tag, handed straight to a posted ``irecv`` when one matches.

Collectives run on one worker thread per backend in issue order (``async_op`` returns at once; ``wait``
blocks). All ranks issue collectives in the same order, so a collective's frames carry its sequence number
and size, and a mismatch (ranks calling different collectives, or different sizes) raises an error naming
both instead of corrupting memory. all_reduce is a ring reduce-scatter followed by a ring all-gather, and
reduce_scatter_tensor / all_gather_into_tensor are its halves, so each rank moves about 2x (resp. 1x) the
tensor's bytes whatever the world size. Reductions are elementwise numpy operations in the tensor's own
dtype, as gloo does them (float16 and bfloat16 round after every addition; integers wrap); bool SUM/MAX is
logical or, PRODUCT/MIN logical and; AVG sums then divides by the world size.

A peer that dies closes its socket: every wait on it fails at once with gloo's "Connection closed by
peer". A peer that hangs or never comes fails the wait after the group's timeout with gloo's "Timed out
waiting ...". Neither ever hangs the caller.
"""

from __future__ import annotations

import collections
import datetime
import queue
import socket
import struct
import threading
import time

import numpy as np

from tilewise.distributed.backend import Backend, RedOpType, Work

_COLLECTIVE, _P2P = 0, 1
_HEADER = struct.Struct("<BqqQ")  # channel, tag (p2p tag or collective sequence number), op id, payload bytes
_ANY_SOURCE = -1


class GlooError(RuntimeError):
    pass


def _array(tensor) -> np.ndarray:
    """A flat writable view of a contiguous CPU tensor's elements."""
    return tensor.numpy().reshape(-1)


def _reducer(op: RedOpType, dtype: np.dtype):
    if dtype == np.bool_:
        table = {RedOpType.SUM: np.logical_or, RedOpType.MAX: np.logical_or, RedOpType.BOR: np.logical_or,
                 RedOpType.PRODUCT: np.logical_and, RedOpType.MIN: np.logical_and, RedOpType.BAND: np.logical_and,
                 RedOpType.BXOR: np.logical_xor, RedOpType.AVG: np.logical_or}
        return table[op]
    table = {RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PRODUCT: np.multiply,
             RedOpType.MIN: np.minimum, RedOpType.MAX: np.maximum, RedOpType.BAND: np.bitwise_and,
             RedOpType.BOR: np.bitwise_or, RedOpType.BXOR: np.bitwise_xor}
    if op not in table:
        raise GlooError(f"ProcessGroupGloo does not support {op!r}")
    return table[op]


def _finish_average(flat: np.ndarray, op: RedOpType, size: int) -> None:
    if op != RedOpType.AVG or flat.dtype == np.bool_:
        return
    if np.issubdtype(flat.dtype, np.integer):
        np.floor_divide(flat, size, out=flat)
    else:
        flat[...] = (flat / size).astype(flat.dtype)


def _chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [n * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


class _Peer:
    """One socket to one peer, with its sender and receiver threads."""

    def __init__(self, mesh: _Mesh, rank: int, sock: socket.socket):
        self.mesh, self.rank, self.sock = mesh, rank, sock
        self.address = "[{}]:{}".format(*sock.getpeername()[:2])
        self.outbox: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name=f"gloo-send-{rank}", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name=f"gloo-recv-{rank}", daemon=True)
        self._sender.start()
        self._receiver.start()

    def post(self, header: bytes, payload, on_sent=None) -> None:
        self.outbox.put((header, payload, on_sent))

    def _send_loop(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                return
            header, payload, on_sent = item
            error = None
            try:
                self.sock.sendall(header)
                if len(payload):
                    self.sock.sendall(payload)
            except OSError as exc:
                error = GlooError(f"[gloo] send to peer {self.address} (rank {self.rank}) failed: {exc}")
            if on_sent is not None:
                on_sent(error)

    def _read_exact(self, n: int) -> bytes:
        buffer = bytearray(n)
        view, got = memoryview(buffer), 0
        while got < n:
            count = self.sock.recv_into(view[got:], min(n - got, 1 << 22))
            if count == 0:
                raise GlooError(f"[gloo] Connection closed by peer {self.address}. This is typically caused by a "
                                "remote worker crashing. Check the logs of the remote worker before reporting an "
                                "error.")
            got += count
        return bytes(buffer) if n else b""

    def _receive_loop(self) -> None:
        try:
            while True:
                channel, tag, op_id, nbytes = _HEADER.unpack(self._read_exact(_HEADER.size))
                self.mesh.deliver(self, channel, tag, op_id, self._read_exact(nbytes))
        except (GlooError, OSError) as error:
            if not isinstance(error, GlooError):
                error = GlooError(f"[gloo] Connection closed by peer {self.address}: {error}")
            self.mesh.peer_failed(self, error)

    def finish_sending(self, linger: float) -> None:
        """Send what is queued, then end the stream; the peer reads everything before it sees the end."""
        self.outbox.put(None)
        self._sender.join(timeout=linger)
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self, linger: float) -> None:
        self._receiver.join(timeout=linger)  # closing with unread bytes would reset the peer's connection
        self.sock.close()


class _Mesh:
    """Sockets to every other rank of the group, and the inbox their frames land in."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        self.rank, self.size, self.timeout = rank, size, timeout
        self.arrived = threading.Condition()
        self.collective_frames: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.p2p_frames: dict[tuple[int, int], collections.deque] = collections.defaultdict(collections.deque)
        self.posted_receives: list[tuple[int, int, object]] = []  # (src or _ANY_SOURCE, tag, callback)
        self.closing = False
        self.peers: dict[int, _Peer] = {}
        self._connect_all(store)

    def _connect_all(self, store) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("", 0))
        listener.listen(self.size)
        host = store.local_address() if hasattr(store, "local_address") else "127.0.0.1"
        store.set(f"gloo/address/{self.rank}", f"{host}:{listener.getsockname()[1]}")
        deadline = time.monotonic() + self.timeout.total_seconds()
        for peer in range(self.rank):
            self._connect_to(store, peer, deadline)
        listener.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            for _ in range(self.rank + 1, self.size):
                sock, _address = listener.accept()
                sock.settimeout(None)
                (peer,) = struct.unpack("<q", self._read_greeting(sock))
                self.peers[peer] = _Peer(self, peer, sock)
        except TimeoutError:
            missing = sorted(set(range(self.rank + 1, self.size)) - set(self.peers))
            raise GlooError(f"[gloo] Timed out after {int(self.timeout.total_seconds() * 1000)}ms waiting for "
                            f"ranks {missing} to connect to rank {self.rank}") from None
        finally:
            listener.close()

    @staticmethod
    def _read_greeting(sock: socket.socket) -> bytes:
        data = b""
        while len(data) < 8:
            chunk = sock.recv(8 - len(data))
            if not chunk:
                raise GlooError("[gloo] a peer closed its connection while the mesh was being built")
            data += chunk
        return data

    def _connect_to(self, store, peer: int, deadline: float) -> None:
        store.wait([f"gloo/address/{peer}"], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        host, port = store.get(f"gloo/address/{peer}").decode().rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.001))
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(struct.pack("<q", self.rank))
        self.peers[peer] = _Peer(self, peer, sock)

    # frames in

    def deliver(self, peer: _Peer, channel: int, tag: int, op_id: int, payload: bytes) -> None:
        with self.arrived:
            if channel == _COLLECTIVE:
                self.collective_frames[peer.rank].append((tag, op_id, payload))
                self.arrived.notify_all()
                return
            callback = self._take_posted_receive(peer.rank, tag)
            if callback is None:
                self.p2p_frames[(peer.rank, tag)].append(payload)
                self.arrived.notify_all()
                return
        callback(peer.rank, payload, None)

    def _take_posted_receive(self, src: int, tag: int):
        for index, (want_src, want_tag, callback) in enumerate(self.posted_receives):
            if want_tag == tag and want_src in (src, _ANY_SOURCE):
                del self.posted_receives[index]
                return callback
        return None

    def peer_failed(self, peer: _Peer, error: GlooError) -> None:
        with self.arrived:
            if self.closing:
                return
            peer.error = error
            failed = [(src, cb) for src, _tag, cb in self.posted_receives if src in (peer.rank, _ANY_SOURCE)]
            self.posted_receives = [r for r in self.posted_receives if r[0] not in (peer.rank, _ANY_SOURCE)]
            self.arrived.notify_all()
        for _src, callback in failed:
            callback(peer.rank, None, error)

    def receive_collective(self, src: int, sequence: int, op_id: int, nbytes: int, what: str) -> bytes:
        deadline = time.monotonic() + self.timeout.total_seconds()
        peer = self.peers[src]
        with self.arrived:
            frames = self.collective_frames[src]
            while not frames:
                if peer.error is not None:
                    raise peer.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GlooError(f"[gloo] Timed out waiting {int(self.timeout.total_seconds() * 1000)}ms for "
                                    f"recv operation to complete ({what} from rank {src})")
                self.arrived.wait(left)
            tag, got_op, payload = frames.popleft()
        if tag != sequence or got_op != op_id or len(payload) != nbytes:
            raise GlooError(f"ProcessGroupGloo::{what}: rank {src} sent a different collective or size "
                            f"(expected collective #{sequence} ({what}) of {nbytes} bytes, got collective #{tag} "
                            f"({_OP_NAMES.get(got_op, got_op)}) of {len(payload)} bytes); every rank must call "
                            f"the same collectives in the same order with matching tensor sizes")
        return payload

    def post_receive(self, src: int, tag: int, callback) -> None:
        with self.arrived:
            sources = range(self.size) if src == _ANY_SOURCE else [src]
            for source in sources:
                frames = self.p2p_frames.get((source, tag))
                if frames:
                    payload = frames.popleft()
                    break
            else:
                dead = self.peers[src].error if src != _ANY_SOURCE else None
                if dead is None:
                    self.posted_receives.append((src, tag, callback))
                    return
                source, payload = src, None
        callback(source, payload, dead if payload is None else None)

    def close(self) -> None:
        with self.arrived:
            self.closing = True
        linger = min(self.timeout.total_seconds(), 5.0)
        for peer in self.peers.values():
            peer.finish_sending(linger)
        for peer in self.peers.values():
            peer.close(linger)


_OP_NAMES = {1: "allreduce", 2: "broadcast", 3: "allgather_into_tensor", 4: "reduce_scatter_tensor",
             5: "alltoall_base", 6: "barrier"}
_OP_IDS = {name: op_id for op_id, name in _OP_NAMES.items()}


class GlooBackend(Backend):
    """CPU tensors over a TCP mesh; see [Note: gloo transport]."""

    device_type = "cpu"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(store, rank, size, timeout)
        self._mesh = _Mesh(store, rank, size, timeout)
        self._sequence = 0
        self._jobs: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run_jobs, name=f"gloo-worker-{rank}", daemon=True)
        self._worker.start()

    # the worker thread

    def _run_jobs(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            body, work = job
            try:
                body()
            except BaseException as error:  # noqa: BLE001 (handed to whoever waits on the work)
                work._fail(error)
            else:
                work._complete()

    def _enqueue(self, name: str, body, outputs: list) -> Work:
        work = Work(outputs)
        self._sequence += 1
        sequence = self._sequence
        self._jobs.put((lambda: body(_Step(self._mesh, sequence, name)), work))
        return work

    # collectives

    def allreduce(self, tensors: list, op: RedOpType) -> Work:
        def body(step: _Step) -> None:
            for tensor in tensors:
                flat = _array(tensor)
                chunks = [flat[a:b] for a, b in _chunk_bounds(flat.size, self._size)]
                step.ring_reduce_scatter(chunks, _reducer(op, flat.dtype))
                step.ring_all_gather(chunks)
                _finish_average(flat, op, self._size)

        return self._enqueue("allreduce", body, tensors)

    def broadcast(self, tensors: list, root: int) -> Work:
        def body(step: _Step) -> None:
            for tensor in tensors:
                flat = _array(tensor)
                if self._rank == root:
                    for peer in range(self._size):
                        if peer != root:
                            step.send(peer, flat)
                else:
                    step.receive_into(root, flat)

        return self._enqueue("broadcast", body, tensors)

    def allgather_into_tensor(self, output, input) -> Work:  # noqa: A002 (torch's name)
        def body(step: _Step) -> None:
            flat = _array(output)
            chunks = [flat[a:b] for a, b in _chunk_bounds(flat.size, self._size)]
            chunks[self._rank][...] = _array(input)
            step.ring_all_gather(chunks)

        return self._enqueue("allgather_into_tensor", body, [output])

    def reduce_scatter_tensor(self, output, input, op: RedOpType) -> Work:  # noqa: A002
        def body(step: _Step) -> None:
            flat = _array(input).copy()
            chunks = [flat[a:b] for a, b in _chunk_bounds(flat.size, self._size)]
            step.ring_reduce_scatter(chunks, _reducer(op, flat.dtype))
            mine = chunks[self._rank]
            _finish_average(mine, op, self._size)
            _array(output)[...] = mine

        return self._enqueue("reduce_scatter_tensor", body, [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes) -> Work:  # noqa: A002
        def body(step: _Step) -> None:
            out_chunks = _split_rows(output, output_split_sizes, self._size)
            in_chunks = _split_rows(input, input_split_sizes, self._size)
            for peer in range(self._size):
                if peer != self._rank:
                    step.send(peer, in_chunks[peer])
            out_chunks[self._rank][...] = in_chunks[self._rank]
            for peer in range(self._size):
                if peer != self._rank:
                    step.receive_into(peer, out_chunks[peer])

        return self._enqueue("alltoall_base", body, [output])

    def barrier(self) -> Work:
        def body(step: _Step) -> None:
            token = np.zeros(self._size, dtype=np.uint8)
            chunks = [token[i:i + 1] for i in range(self._size)]
            step.ring_reduce_scatter(chunks, np.add)
            step.ring_all_gather(chunks)

        return self._enqueue("barrier", body, [])

    # point to point: straight to the peer's sender / the mesh's posted receives, never behind collectives

    def send(self, tensors: list, dst: int, tag: int) -> Work:
        work = Work(tensors)
        payload = b"".join(_array(t).tobytes() for t in tensors)

        def on_sent(error) -> None:
            work._fail(error) if error is not None else work._complete()

        self._mesh.peers[dst].post(_HEADER.pack(_P2P, tag, 0, len(payload)), payload, on_sent)
        return work

    def recv(self, tensors: list, src: int, tag: int) -> Work:
        work = _ReceiveWork(tensors, self.timeout)
        flats = [_array(t) for t in tensors]
        expected = sum(f.nbytes for f in flats)

        def on_arrival(source: int, payload: bytes | None, error) -> None:
            if error is None and len(payload) != expected:
                error = GlooError(f"ProcessGroupGloo::recv: rank {source} sent {len(payload)} bytes with tag {tag}, "
                                  f"but the receiving tensors hold {expected} bytes")
            if error is not None:
                work._fail(error)
                return
            offset = 0
            for flat in flats:
                flat[...] = np.frombuffer(payload, dtype=flat.dtype, count=flat.size, offset=offset)
                offset += flat.nbytes
            work._complete(source)

        self._mesh.post_receive(src, tag, on_arrival)
        return work

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=self.timeout.total_seconds())
        self._mesh.close()


class _ReceiveWork(Work):
    """A receive: waiting on it without a timeout still ends after the group's timeout, as gloo's does."""

    def __init__(self, outputs: list, timeout: datetime.timedelta):
        super().__init__(outputs)
        self._group_timeout = timeout

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        limit = timeout if timeout else self._group_timeout
        if not self._future._done.wait(limit.total_seconds()):
            raise GlooError(f"[gloo] Timed out waiting {int(limit.total_seconds() * 1000)}ms for recv operation "
                            "to complete")
        self._future.value()
        return True


def _split_rows(tensor, split_sizes: list[int] | None, parts: int) -> list[np.ndarray]:
    flat = _array(tensor)
    rows = tensor.shape[0] if tensor.dim() else 1
    row_elements = flat.size // rows if rows else 0
    sizes = split_sizes if split_sizes else [rows // parts] * parts
    bounds = np.cumsum([0, *sizes]) * row_elements
    return [flat[bounds[i]:bounds[i + 1]] for i in range(parts)]


class _Step:
    """The frames of one collective: its sequence number and name travel with every frame it sends."""

    def __init__(self, mesh: _Mesh, sequence: int, name: str):
        self.mesh, self.sequence, self.name = mesh, sequence, name
        self.op_id = _OP_IDS[name]
        self.rank, self.size = mesh.rank, mesh.size

    def send(self, peer: int, data: np.ndarray) -> None:
        payload = np.ascontiguousarray(data).tobytes()
        self.mesh.peers[peer].post(_HEADER.pack(_COLLECTIVE, self.sequence, self.op_id, len(payload)), payload)

    def receive(self, peer: int, like: np.ndarray) -> np.ndarray:
        payload = self.mesh.receive_collective(peer, self.sequence, self.op_id, like.nbytes, self.name)
        return np.frombuffer(payload, dtype=like.dtype, count=like.size)

    def receive_into(self, peer: int, out: np.ndarray) -> None:
        out[...] = self.receive(peer, out)

    def ring_reduce_scatter(self, chunks: list[np.ndarray], reduce) -> None:
        """Leave chunk ``rank`` reduced over all ranks in this rank's ``chunks`` (the others are partial)."""
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        for s in range(self.size - 1):
            self.send(right, chunks[(self.rank - s - 1) % self.size])
            target = chunks[(self.rank - s - 2) % self.size]
            reduce(self.receive(left, target), target, out=target)

    def ring_all_gather(self, chunks: list[np.ndarray]) -> None:
        """Fill every chunk from its owner (rank i owns chunk i)."""
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        for s in range(self.size - 1):
            self.send(right, chunks[(self.rank - s) % self.size])
            self.receive_into(left, chunks[(self.rank - s - 1) % self.size])
