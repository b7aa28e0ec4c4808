"""The interface a transport implements, and the Work and Future objects its collectives return.

[Note: backends] A process group (c10d.py) holds one ``Backend`` per device type and composes torch's whole
collective API from the few primitives below; a transport (gloo.py for CPU tensors over TCP, nccl.py for
CUDA tensors) implements only these. Ranks given to a backend are ranks *within its group*. Every primitive
returns a ``Work`` at once; the transport completes it (``_complete`` / ``_fail``) when the operation is
done. For gloo, ``Work.wait()`` blocks the host until then; a GPU transport overrides ``wait`` to make the
current stream wait instead, as torch's NCCL does. ``Work.get_future()`` is a ``Future`` whose value is the
list of output tensors, which DDP communication hooks chain with ``then``.

``ReduceOp`` has torch's members and spelling (``ReduceOp.SUM`` is ``<RedOpType.SUM: 0>``).
"""

from __future__ import annotations

import datetime
import enum
import threading
from collections.abc import Callable


class RedOpType(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8


class ReduceOp:
    """The reduction of a collective: ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ..."""

    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM

    def __new__(cls, op: RedOpType = RedOpType.SUM) -> RedOpType:
        return RedOpType(op)


class Future:
    """A value that arrives later (torch's ``torch.futures.Future``): ``wait``, ``value``, ``then``, ``done``."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._value = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []

    def done(self) -> bool:
        return self._done.is_set()

    def set_result(self, value) -> None:
        self._finish(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, value, error: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                raise RuntimeError("Future can only be marked completed once.")
            self._value, self._error = value, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def wait(self):
        self._done.wait()
        return self.value()

    def value(self):
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future], object]) -> Future:
        """A future of ``callback(self)``, run when this one completes (an error passes through)."""
        chained = Future()

        def run(done: Future) -> None:
            try:
                chained.set_result(callback(done))
            except BaseException as error:  # noqa: BLE001 (handed to whoever waits on the chained future)
                chained.set_exception(error)

        self.add_done_callback(run)
        return chained


class Work:
    """One issued operation (torch's ``torch.distributed.Work``); the transport completes it."""

    def __init__(self, outputs: list | None = None, source_rank: int = -1) -> None:
        self._future = Future()
        self._outputs = outputs if outputs is not None else []
        self._source_rank = source_rank

    def _complete(self, source_rank: int | None = None) -> None:
        if source_rank is not None:
            self._source_rank = source_rank
        self._future.set_result(self._outputs)

    def _fail(self, error: BaseException) -> None:
        self._future.set_exception(error)

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future._error is None

    def exception(self) -> BaseException | None:
        return self._future._error if self._future.done() else None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the operation is done; raise its error (a transport error or its timeout)."""
        seconds = None if timeout is None or timeout == datetime.timedelta(0) else timeout.total_seconds()
        if not self._future._done.wait(seconds):
            raise RuntimeError(f"Work timed out after {int(seconds * 1000)}ms: the operation did not complete")
        self._future.value()
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        return self._source_rank

    def get_future(self) -> Future:
        return self._future


class CompletedWork(Work):
    """A Work that is done when made: what an operation with nothing to move returns."""

    def __init__(self, outputs: list | None = None) -> None:
        super().__init__(outputs)
        self._complete()


class Backend:
    """A transport serving one device type for one process group (ranks are group ranks).

    Every method returns a ``Work``; in-place methods write their tensors, the others write ``output``.
    """

    device_type = "cpu"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self.store, self._rank, self._size, self.timeout = store, rank, size, timeout

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, tensors: list, op: RedOpType) -> Work:
        raise NotImplementedError

    def broadcast(self, tensors: list, root: int) -> Work:
        raise NotImplementedError

    def allgather_into_tensor(self, output, input) -> Work:  # noqa: A002 (torch's name)
        raise NotImplementedError

    def reduce_scatter_tensor(self, output, input, op: RedOpType) -> Work:  # noqa: A002
        raise NotImplementedError

    def alltoall_base(self, output, input, output_split_sizes: list[int] | None,  # noqa: A002
                      input_split_sizes: list[int] | None) -> Work:
        raise NotImplementedError

    def send(self, tensors: list, dst: int, tag: int) -> Work:
        raise NotImplementedError

    def recv(self, tensors: list, src: int, tag: int) -> Work:
        raise NotImplementedError

    def barrier(self) -> Work:
        raise NotImplementedError

    def shutdown(self) -> None:
        pass
