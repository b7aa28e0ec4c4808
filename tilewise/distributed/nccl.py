"""Backend "nccl": collectives between the CUDA tensors of several processes, through NCCL (nccl4py).

[Note: NCCL backend]
One NCCL communicator per (group, device), made by the first collective whose tensors live on that device: rank
0 of the group asks NCCL for a unique id and puts its 128 bytes in the group's store under the number of
communicators this group has made so far (every rank calls collectives in the same order, so the numbers agree
even where ranks use different devices), the others read it, and all initialise together. A send or recv
between two ranks of a larger group uses a communicator of just those two, made by those two alone, as torch
does, so a point-to-point call never waits for ranks that take no part in it.

Streams follow torch's ProcessGroupNCCL. A collective runs on an internal stream of its device that first waits
(through an event) for the caller's current stream, so it sees every kernel queued before it and overlaps with
what the caller queues after it. Its tensors are recorded on the internal stream (the caching allocator's
``record_stream``): a tensor freed right after an asynchronous call keeps its memory out of reuse until NCCL has
finished with it. ``Work.wait()`` makes the caller's current stream wait for the collective's end event without
blocking the host (a barrier's wait blocks, as torch's does); c10d calls it before returning when
``async_op=False``. Under CUDA-graph capture a collective is issued on the capturing stream itself: NCCL calls
are capturable, and a second stream would have to be joined to the capture.

nccl4py is imported when the first communicator is made, so this module imports where nccl4py is absent.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tilewise import strides
from tilewise.distributed.backend import Backend, Future, Work
from tilewise.dtypes import as_dtype, c10_name
from tilewise.tensor import Tensor

# NCCL's data type (a name in nccl4py's DataType) for each tilewise dtype, as torch's ProcessGroupNCCL maps them:
# bool travels as uint8 (so a SUM becomes MAX, a bitwise or), float8 as raw bytes (data movement only), and a
# complex number as two reals (data movement, SUM and AVG only).
NCCL_TYPES = {
    "bool": "Uint8", "uint8": "Uint8", "int8": "Int8", "int32": "Int32", "int64": "Int64", "float16": "Float16",
    "bfloat16": "Bfloat16", "float32": "Float32", "float64": "Float64", "float8_e4m3fn": "Uint8",
    "float8_e5m2": "Uint8", "complex64": "Float32", "complex128": "Float64",
}
NO_REDUCTIONS = frozenset({"float8_e4m3fn", "float8_e5m2"})
COMPLEX = frozenset({"complex64", "complex128"})


NCCL_OPS = {"SUM": "Sum", "PRODUCT": "Prod", "MIN": "Min", "MAX": "Max", "AVG": "Avg"}


def _bindings() -> Any:
    from nccl.bindings import nccl as nb

    return nb


def _core() -> Any:
    import nccl.core as nc

    return nc


# ---- what NCCL is told about a tensor --------------------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    """A tensor as NCCL sees it: its address, its length in NCCL elements, and NCCL's data type."""

    ptr: int
    count: int
    dtype: int
    itemsize: int  # bytes of one NCCL element


def op_name(op: Any) -> str:
    """``SUM`` for ReduceOp.SUM however the op is spelt (an enum member, ``RedOpType.SUM``, a ReduceOp)."""
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].upper()


def nccl_type_name(t: Tensor) -> str:
    name = NCCL_TYPES.get(t.dtype.name)
    if name is None:
        raise TypeError(
            f"Input tensor data type is not supported for NCCL process group: {c10_name(t.dtype)} "
            f"(NCCL carries {', '.join(c10_name(as_dtype(n)) for n in NCCL_TYPES)})"
        )
    return name


def nccl_op_name(op: Any, t: Tensor) -> str:
    """NCCL's reduction (a name in nccl4py's RedOp) for ``op`` on ``t``'s dtype, or torch's error."""
    name = op_name(op)
    dtype = t.dtype.name
    if dtype in NO_REDUCTIONS:
        raise TypeError("Float8 dtypes are not currenlty supported for NCCL reductions")
    if dtype in COMPLEX and name not in ("SUM", "AVG"):
        raise ValueError(f"all_reduce does not support RedOpType.{name} on complex tensors")
    if dtype == "bool":
        if name == "SUM":
            return "Max"  # a bitwise or that cannot overflow the uint8 a bool travels as
        if name == "AVG":
            raise TypeError("Cannot use ReduceOp.AVG with boolean inputs")
    if name in ("BAND", "BOR", "BXOR"):
        raise ValueError(f"Cannot use ReduceOp.{name} with NCCL")
    if name not in NCCL_OPS:
        raise ValueError(f"Unhandled ReduceOp {name}: NCCL reduces with {', '.join(NCCL_OPS)}")
    return NCCL_OPS[name]


def check_tensor(t: Tensor, *, p2p: bool = False) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"NCCL collectives take tilewise tensors, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"Tensors must be CUDA and dense (got a tensor on {t.device}: backend 'nccl' serves "
                         "CUDA tensors; use backend 'gloo' for CPU tensors)")
    if t.is_contiguous():
        return
    if p2p and strides.is_non_overlapping_and_dense(t.shape, t.stride()):
        warnings.warn("Detected non-contiguous tensor in P2P operations. It is user responsibility to guarantee "
                      "that source and destination tensors have the same contiguity format.", stacklevel=3)
        return
    raise ValueError(f"Tensors must be contiguous (got shape {tuple(t.shape)} with strides {t.stride()})")


def common_device(tensors: list[Tensor], *, p2p: bool = False) -> int:
    """The one CUDA device of ``tensors`` (checked as torch checks them), as an index."""
    if not tensors:
        raise ValueError("Tensor list must be nonempty")
    for t in tensors:
        check_tensor(t, p2p=p2p)
    devices = {t.device.index for t in tensors}
    if len(devices) > 1:
        raise ValueError("Expected list of tensors on the same device (got tensors on "
                         f"{', '.join(f'cuda:{d}' for d in sorted(devices))})")
    return devices.pop()


# (bindings, dtype name) -> (NCCL data type, NCCL elements per tensor element): looked up once per dtype, as a
# collective's host cost bounds the bus bandwidth of small messages
_TYPE_CODES: dict[tuple[Any, str], tuple[int, int]] = {}
_OP_CODES: dict[tuple[Any, Any, str], int] = {}  # (bindings, reduce op, dtype name) -> NCCL reduction


def buffer_of(t: Tensor) -> Buffer:
    nb = _bindings()
    key = (nb, t.dtype.name)
    found = _TYPE_CODES.get(key)
    if found is None:
        parts = 2 if t.dtype.name in COMPLEX else 1
        found = _TYPE_CODES[key] = (int(getattr(nb.DataType, nccl_type_name(t))), parts)
    code, parts = found
    return Buffer(t.data_ptr(), t.numel() * parts, code, t.dtype.itemsize // parts)


def nccl_op_code(nb: Any, op: Any, t: Tensor) -> int:
    """nccl4py's reduction code of ``op`` on ``t``'s dtype (:func:`nccl_op_name`, remembered)."""
    try:
        key = (nb, op, t.dtype.name)
        found = _OP_CODES.get(key)
    except TypeError:  # an unhashable spelling of the op
        return int(getattr(nb.RedOp, nccl_op_name(op, t)))
    if found is None:
        found = _OP_CODES[key] = int(getattr(nb.RedOp, nccl_op_name(op, t)))
    return found


# ---- CUDA plumbing ---------------------------------------------------------------------------------------------


def _runtime() -> Any:
    from tilewise.backends.cuda import runtime

    return runtime


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (the legacy stream never is)."""
    if not stream.handle:
        return False
    from tilewise._cuda_api import check, driver_api

    cu = driver_api()
    status = check(cu.cuStreamIsCapturing(stream.handle), "cuStreamIsCapturing")
    return status == cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


def record_on(tensors: list[Tensor], stream: Any) -> None:
    from tilewise.backends.cuda import record_stream

    for t in tensors:
        if t.numel():
            record_stream(t, stream.handle)


@contextlib.contextmanager
def nccl_group(nb: Any, active: bool) -> Iterator[None]:
    """ncclGroupStart/End around several calls that must progress together (a send beside a recv)."""
    if not active:
        yield
        return
    nb.group_start()
    try:
        yield
    finally:
        nb.group_end()


class CudaFuture(Future):
    """The future of CUDA work: its value (the output tensors) is there at once, in stream order, as torch's
    CUDA futures have it. It is done once the work's end event has completed; ``wait()`` and ``then()`` order
    the caller's current stream after the work instead of blocking the host (DDP's communication hooks chain
    their division and copies this way).

    >>> fut = work.get_future()  # doctest: +SKIP
    >>> averaged = fut.then(lambda f: f.value()[0].div_(world_size))  # doctest: +SKIP
    """

    def __init__(self, value: Any, device: int, event: Any | None, error: BaseException | None = None) -> None:
        super().__init__()
        self._device = device
        self._event = event
        if error is None:
            self.set_result(value)
        else:
            self.set_exception(error)

    def done(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> Any:
        if self._event is not None:
            _runtime().current_stream(self._device).wait_event(self._event)
        return self.value()

    def then(self, callback: Callable[[CudaFuture], Any]) -> CudaFuture:
        """A future of ``callback(self)``, run now with the current stream ordered after this future's work, so
        the kernels it queues read the finished result."""
        try:
            self.wait()
            result = callback(self)
        except Exception as error:  # torch hands the callback's error to the returned future
            return CudaFuture(None, self._device, None, error)
        return CudaFuture(result, self._device, _runtime().current_stream(self._device).record_event())

    def add_done_callback(self, callback: Callable[[CudaFuture], None]) -> None:
        self.wait()
        callback(self)


class NCCLWork(Work):
    """One NCCL call in flight: its end event, the device it ran on and its output tensors."""

    def __init__(self, outputs: list[Tensor], device: int, end: Any | None, *, blocking: bool = False,
                 timeout: datetime.timedelta | None = None) -> None:
        # Work.__init__ is not called: its host-side Future (a lock and a threading.Event) is not needed here,
        # and a collective's host cost bounds small messages' bandwidth; the CUDA future is made when asked for
        self._outputs = outputs
        self._source_rank = -1
        self._device = device
        self._end = end  # None: issued on the caller's stream (graph capture), already in order
        self._blocking = blocking
        self._timeout = timeout  # a blocking wait given none: the process group's (a peer that died never answers)
        self._future: CudaFuture | None = None

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Order the caller's current stream after the call (a barrier's wait blocks the host until it is done)."""
        if self._end is None:
            return True
        if self._blocking:
            self._block_host(timeout or self._timeout)
        else:
            _runtime().current_stream(self._device).wait_event(self._end)
        return True

    def _block_host(self, timeout: datetime.timedelta | float | None) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if not seconds:
            self._end.synchronize()
            return
        deadline = time.monotonic() + seconds
        while not self._end.query():
            if time.monotonic() > deadline:
                raise RuntimeError(f"NCCL work on cuda:{self._device} timed out after {seconds:g} s: a rank of the "
                                   "group may have died, or be waiting in a different collective")
            time.sleep(1e-4)

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        if self._end is not None:
            _runtime().current_stream(self._device).wait_event(self._end)

    def is_completed(self) -> bool:
        return self._end is None or self._end.query()

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self) -> BaseException | None:
        return None  # NCCL reports failures when a call is issued, which raises there

    def result(self) -> list[Tensor]:
        return self._outputs

    def get_future(self) -> CudaFuture:
        if self._future is None:
            self._future = CudaFuture(self._outputs, self._device, self._end)
        return self._future


# ---- the backend -----------------------------------------------------------------------------------------------


@dataclass
class Communicator:
    """One NCCL communicator of this group and the device it serves."""

    comm: Any  # nccl.core.Communicator: owns the NCCL handle
    handle: Any  # nccl.bindings.nccl.Comm: what the raw calls take
    device: int


# The internal stream of each device, shared by every backend and kept for the life of the process (as torch's
# stream pool): a tensor a collective used is recorded on it, and when that tensor is freed, maybe long after
# its process group was destroyed, the allocator records an event there, which a destroyed stream would crash.
_INTERNAL_STREAMS: dict[int, Any] = {}
_ORDER_EVENTS: dict[int, Any] = {}  # device -> the event each call's internal stream waits on (see _order_event)


class NCCLBackend(Backend):
    """Backend "nccl": CUDA tensors between processes, one NCCL communicator per device this group uses.

    Ranks are ranks within the group; c10d maps torch's global ranks onto them.

    >>> import tilewise.distributed as dist  # doctest: +SKIP
    >>> dist.init_process_group("nccl")  # doctest: +SKIP
    >>> dist.all_reduce(tw.ones(4, device="cuda"))  # doctest: +SKIP
    """

    device_type = "cuda"

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast hangs init on the hosts we run on
        self._communicators: dict[int, Communicator] = {}  # device -> the whole group's communicator
        self._pair_communicators: dict[tuple[int, int], Communicator] = {}  # (device, peer) -> a 2-rank one
        self._made = 0  # communicators of the whole group made so far: their store keys
        self._pairs_made: dict[int, int] = {}  # peer -> 2-rank communicators made with it so far

    # ---- communicators and streams

    def _communicator(self, device: int) -> Communicator:
        found = self._communicators.get(device)
        if found is None:
            key = f"nccl/{self._made}"
            self._made += 1
            found = self._communicators[device] = self._init(key, device, self._rank, self._size)
        return found

    def _pair_communicator(self, device: int, peer: int) -> Communicator:
        if self._size <= 2:
            return self._communicator(device)
        found = self._pair_communicators.get((device, peer))
        if found is None:
            low, high = sorted((self._rank, peer))
            count = self._pairs_made.get(peer, 0)
            self._pairs_made[peer] = count + 1
            key = f"nccl/p2p/{low}:{high}/{count}"
            found = self._init(key, device, int(self._rank == high), 2)
            self._pair_communicators[(device, peer)] = found
        return found

    def _init(self, key: str, device: int, rank: int, size: int) -> Communicator:
        """Make a communicator of ``size`` ranks on ``device``, its unique id shared under ``key``."""
        nc, nb = _core(), _bindings()
        _runtime().ensure_context(device)  # NCCL takes the device (and its primary context) current on the thread
        if rank == 0:
            unique_id = nc.get_unique_id()
            self.store.set(key, bytes(unique_id))
        else:
            unique_id = nc.UniqueId.from_bytes(bytes(self.store.get(key)))
        try:
            comm = nc.Communicator.init(nranks=size, rank=rank, unique_id=unique_id)
        except nb.NCCLError as error:
            raise RuntimeError(f"NCCL could not make a communicator of {size} ranks on cuda:{device} "
                               f"(this rank: {rank}): {error}") from error
        return Communicator(comm, nb.Comm(comm.ptr), device)

    def _stream(self, device: int) -> Any:
        found = _INTERNAL_STREAMS.get(device)
        if found is None:
            found = _INTERNAL_STREAMS[device] = _runtime().Stream(device)
        return found

    def _order_event(self, device: int, caller: Any) -> Any:
        """An event recorded now on ``caller``: one per device, re-recorded for each call (a stream's wait takes
        the event's state when it is queued, so reuse is safe and saves an event per collective)."""
        event = _ORDER_EVENTS.get(device)
        if event is None:
            event = _ORDER_EVENTS[device] = caller.record_event()
        else:
            event.record(caller)
        return event

    # ---- issuing a call

    def _issue(self, name: str, comm: Communicator, tensors: list[Tensor], outputs: list[Tensor],
               call: Callable[[Any, int], None], *, blocking: bool = False) -> NCCLWork:
        """Run ``call(nccl_comm, stream_handle)`` in stream order (see the note) and return its Work."""
        runtime = _runtime()
        device = comm.device
        runtime.ensure_context(device)
        caller = runtime.current_stream(device)
        if is_capturing(caller):
            from tilewise.backends.cuda.runtime.capturing import note_capture_holds

            note_capture_holds(comm)  # the graph will hold the communicator: released before it is destroyed
            self._call(name, comm, call, caller.handle)
            return NCCLWork(outputs, device, None)
        internal = self._stream(device)
        internal.wait_event(self._order_event(device, caller))
        self._call(name, comm, call, internal.handle)
        record_on(tensors, internal)
        return NCCLWork(outputs, device, internal.record_event(), blocking=blocking, timeout=self.timeout)

    def _call(self, name: str, comm: Communicator, call: Callable[[Any, int], None], stream: int) -> None:
        nb = _bindings()
        try:
            call(comm.handle, stream)
        except nb.NCCLError as error:
            raise RuntimeError(f"NCCL error in {name} on cuda:{comm.device} (group rank {self._rank} of "
                               f"{self._size}): {error}") from error

    # ---- collectives

    def allreduce(self, tensors: list[Tensor], op: Any) -> Work:
        device = common_device(tensors)
        nb = _bindings()
        plan = [(buffer_of(t), nccl_op_code(nb, op, t)) for t in tensors]
        return self._allreduce(device, tensors, plan)

    def _allreduce(self, device: int, tensors: list[Tensor], plan: list[tuple[Buffer, int]], *,
                   blocking: bool = False) -> NCCLWork:
        nb = _bindings()

        def call(comm: Any, stream: int) -> None:
            with nccl_group(nb, len(plan) > 1):
                for buf, nccl_op in plan:
                    nb.all_reduce(buf.ptr, buf.ptr, buf.count, buf.dtype, nccl_op, comm, stream)

        return self._issue("all_reduce", self._communicator(device), tensors, tensors, call, blocking=blocking)

    def allreduce_into(self, output: Tensor, input: Tensor, op: Any) -> NCCLWork:  # noqa: A002 -- torch's name
        """``output`` = ``input`` reduced over the group, out of place (one NCCL call reading one buffer and
        writing the other): the functional all_reduce of compiled programs, capturable in their CUDA graphs."""
        device = common_device([output, input])
        nb = _bindings()
        src, dst = buffer_of(input), buffer_of(output)
        nccl_op = nccl_op_code(nb, op, input)

        def call(comm: Any, stream: int) -> None:
            nb.all_reduce(src.ptr, dst.ptr, src.count, src.dtype, nccl_op, comm, stream)

        return self._issue("all_reduce", self._communicator(device), [output, input], [output], call)

    def broadcast(self, tensors: list[Tensor], root: int) -> Work:
        device = common_device(tensors)
        self._check_rank(root, "broadcast", "root")
        nb = _bindings()
        buffers = [buffer_of(t) for t in tensors]

        def call(comm: Any, stream: int) -> None:
            with nccl_group(nb, len(buffers) > 1):
                for buf in buffers:
                    nb.broadcast(buf.ptr, buf.ptr, buf.count, buf.dtype, int(root), comm, stream)

        return self._issue("broadcast", self._communicator(device), tensors, tensors, call)

    def allgather_into_tensor(self, output: Tensor, input: Tensor) -> Work:  # noqa: A002 -- torch's name
        device = common_device([output, input])
        if output.dtype != input.dtype:
            raise TypeError(f"output tensor must have the same type as input tensor (got {output.dtype} and "
                            f"{input.dtype})")
        if input.numel() * self._size != output.numel():
            raise ValueError(f"output tensor size must be equal to world_size times input tensor size (world_size "
                             f"{self._size}, input {input.numel()}, output {output.numel()} elements)")
        nb = _bindings()
        src, dst = buffer_of(input), buffer_of(output)

        def call(comm: Any, stream: int) -> None:
            nb.all_gather(src.ptr, dst.ptr, src.count, src.dtype, comm, stream)

        return self._issue("all_gather_into_tensor", self._communicator(device), [output, input], [output], call)

    def reduce_scatter_tensor(self, output: Tensor, input: Tensor, op: Any) -> Work:  # noqa: A002
        device = common_device([output, input])
        if output.dtype != input.dtype:
            raise TypeError(f"input tensor must be the same type as the output tensor. (got {input.dtype} and "
                            f"{output.dtype})")
        if output.numel() * self._size != input.numel():
            raise ValueError(f"input tensor must be the same size as output size times world size (world_size "
                             f"{self._size}, input {input.numel()}, output {output.numel()} elements)")
        nb = _bindings()
        src, dst = buffer_of(input), buffer_of(output)
        nccl_op = nccl_op_code(nb, op, input)

        def call(comm: Any, stream: int) -> None:
            nb.reduce_scatter(src.ptr, dst.ptr, dst.count, dst.dtype, nccl_op, comm, stream)

        return self._issue("reduce_scatter_tensor", self._communicator(device), [output, input], [output], call)

    def alltoall_base(self, output: Tensor, input: Tensor, output_split_sizes: list[int] | None,  # noqa: A002
                      input_split_sizes: list[int] | None) -> Work:
        device = common_device([output, input])
        if output.dtype != input.dtype:
            raise TypeError(f"all_to_all_single: output and input must have the same dtype (got {output.dtype} "
                            f"and {input.dtype})")
        sends = split_ranges(input, input_split_sizes, self._size)
        receives = split_ranges(output, output_split_sizes, self._size)
        nb = _bindings()
        src, dst = buffer_of(input), buffer_of(output)
        scale = 2 if input.dtype.name in COMPLEX else 1  # NCCL elements per tensor element

        def call(comm: Any, stream: int) -> None:
            with nccl_group(nb, True):
                for peer, ((send_at, send_n), (recv_at, recv_n)) in enumerate(zip(sends, receives)):
                    if send_n:
                        nb.send(src.ptr + send_at * input.dtype.itemsize, send_n * scale, src.dtype, peer, comm,
                                stream)
                    if recv_n:
                        nb.recv(dst.ptr + recv_at * output.dtype.itemsize, recv_n * scale, dst.dtype, peer, comm,
                                stream)

        return self._issue("all_to_all_single", self._communicator(device), [output, input], [output], call)

    def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> Work:
        return self._point_to_point("send", tensors, dst)

    def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> Work:
        return self._point_to_point("recv", tensors, src)

    def _point_to_point(self, name: str, tensors: list[Tensor], peer: int) -> Work:
        device = common_device(tensors, p2p=True)
        self._check_rank(peer, name, "peer")
        if peer == self._rank:
            raise ValueError(f"Invalid {name}: a rank cannot {name} to itself (rank {peer})")
        nb = _bindings()
        comm = self._pair_communicator(device, peer)
        nccl_peer = peer if self._size <= 2 else int(peer > self._rank)
        buffers = [buffer_of(t) for t in tensors]
        transfer = nb.send if name == "send" else nb.recv

        def call(handle: Any, stream: int) -> None:
            with nccl_group(nb, len(buffers) > 1):
                for buf in buffers:
                    transfer(buf.ptr, buf.count, buf.dtype, nccl_peer, handle, stream)

        outputs = tensors if name == "recv" else []
        work = self._issue(name, comm, tensors, outputs, call)
        work._source_rank = peer
        return work

    def barrier(self) -> Work:
        """A one-element all_reduce on the current device, whose ``wait()`` blocks the host (as torch's)."""
        from tilewise.ops.creation import zeros

        device = _runtime().current_device()
        token = zeros(1, device=f"cuda:{device}")
        nb = _bindings()
        plan = [(buffer_of(token), int(nb.RedOp.Sum))]
        return self._allreduce(device, [token], plan, blocking=True)

    def shutdown(self) -> None:
        """Destroy every communicator (after the work queued on them); the backend is unusable afterwards. The
        CUDA graphs that captured collectives on them are released first: NCCL waits for them to be gone, so
        destroying the group would otherwise hang (see [Note: graphs that hold a communicator])."""
        from tilewise.backends.cuda.graphs import release_graphs_holding

        runtime = _runtime()
        for comm in [*self._communicators.values(), *self._pair_communicators.values()]:
            runtime.ensure_context(comm.device)
            release_graphs_holding(comm)
            comm.comm.destroy()
        self._communicators.clear()
        self._pair_communicators.clear()

    def _check_rank(self, rank: int, name: str, what: str) -> None:
        if not 0 <= int(rank) < self._size:
            raise ValueError(f"Invalid {what} {rank} for {name}: the group has ranks 0..{self._size - 1}")


def split_ranges(t: Tensor, split_sizes: list[int] | None, group_size: int) -> list[tuple[int, int]]:
    """(first element, element count) of each rank's part of ``t``, split along dim 0 as all_to_all_single
    splits it (equal parts when ``split_sizes`` is empty), with torch's errors."""
    rows = t.shape[0] if t.dim() else 1
    row_numel = t.numel() // rows if rows else 0
    if not split_sizes:
        if rows % group_size:
            raise RuntimeError(f"Tensor's dim 0 does not divide equally across group size (dim 0 is {rows}, "
                               f"group size {group_size})")
        split_sizes = [rows // group_size] * group_size
    elif len(split_sizes) != group_size:
        raise RuntimeError(f"Number of tensor splits not equal to group size ({len(split_sizes)} splits, group "
                           f"size {group_size})")
    elif sum(split_sizes) != rows:
        raise RuntimeError(f"Split sizes doesn't match total dim 0 size (splits sum to {sum(split_sizes)}, dim 0 "
                           f"is {rows})")
    ranges, start = [], 0
    for n in split_sizes:
        ranges.append((start * row_numel, int(n) * row_numel))
        start += int(n)
    return ranges
