"""Backend "nccl".

On the CPU: the backend's calls into NCCL and the CUDA runtime, through fakes of nccl4py and of the runtime
(which pointers, counts, data types and reductions reach NCCL, which stream each call runs on and what it waits
for, how communicators are made and shared), torch's errors, and ``record_stream`` keeping memory out of the
small-block free lists. Marked ``cuda``: the real thing, two processes on two GPUs (every collective and dtype
against numpy's arithmetic or the gloo result, stream order of asynchronous work, record_stream) and a
one-process world on one GPU.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import socket
import time
import traceback
from types import SimpleNamespace

import numpy as np
import pytest

import tilewise as tw
from tilewise.device import Device
from tilewise.distributed import nccl as N
from tilewise.distributed.backend import ReduceOp
from tilewise.storage import Storage
from tilewise.tensor import Tensor

# ---- fakes of nccl4py and the CUDA runtime -------------------------------------------------------------------


class FakeNccl:
    """nccl.bindings.nccl: records every call."""

    class NCCLError(Exception):
        pass

    DataType = SimpleNamespace(Int8=0, Uint8=1, Int32=2, Uint32=3, Int64=4, Uint64=5, Float16=6, Float32=7,
                               Float64=8, Bfloat16=9)
    RedOp = SimpleNamespace(Sum=0, Prod=1, Max=2, Min=3, Avg=4)

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def Comm(self, ptr):
        return ("comm", ptr)

    def __getattr__(self, name):
        if name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "group_start",
                    "group_end"):
            return lambda *args: self.calls.append((name, *args))
        raise AttributeError(name)


class FakeCore:
    """nccl.core: unique ids and communicators."""

    def __init__(self) -> None:
        self.made: list[dict] = []
        self.destroyed: list[int] = []
        self.UniqueId = SimpleNamespace(from_bytes=bytes)
        core = self

        class Communicator:
            @staticmethod
            def init(nranks, rank, unique_id):
                comm = SimpleNamespace(ptr=1000 + len(core.made), destroy=None)
                comm.destroy = lambda: core.destroyed.append(comm.ptr)
                core.made.append({"nranks": nranks, "rank": rank, "id": bytes(unique_id), "ptr": comm.ptr})
                return comm

        self.Communicator = Communicator

    def get_unique_id(self) -> bytes:
        return b"id-%d" % len(self.made)


class FakeEvent:
    def __init__(self, stream) -> None:
        self.stream, self.done, self.synchronized = stream, False, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = self.done = True

    def record(self, stream) -> None:
        self.stream, self.done = stream.handle, False


class FakeStream:
    def __init__(self, runtime, device: int, handle: int) -> None:
        self.runtime, self.device, self.handle = runtime, device, handle

    def wait_stream(self, other) -> None:
        self.runtime.log.append(("wait_stream", self.handle, other.handle))

    def wait_event(self, event) -> None:
        self.runtime.log.append(("wait_event", self.handle, event.stream))

    def record_event(self):
        event = FakeEvent(self.handle)
        self.runtime.events.append(event)
        return event


class FakeRuntime:
    """tilewise.backends.cuda.runtime: a caller stream per device, internal streams numbered from 100."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.events: list[FakeEvent] = []
        self.callers = {d: FakeStream(self, d, 7 + d) for d in range(4)}
        self.made = 0
        runtime = self

        def Stream(device):
            runtime.made += 1
            return FakeStream(runtime, device, 100 + runtime.made)

        self.Stream = Stream

    def current_stream(self, device):
        return self.callers[device]

    def ensure_context(self, device=None):
        self.log.append(("context", device))
        return device

    def current_device(self):
        return 0


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key, value) -> None:
        self.values[key] = bytes(value)

    def get(self, key) -> bytes:
        return self.values[key]


@pytest.fixture
def fakes(monkeypatch):
    nb, core, runtime = FakeNccl(), FakeCore(), FakeRuntime()
    recorded, capturing = [], {"on": False}
    monkeypatch.setattr(N, "_bindings", lambda: nb)
    monkeypatch.setattr(N, "_core", lambda: core)
    monkeypatch.setattr(N, "_runtime", lambda: runtime)
    monkeypatch.setattr(N, "is_capturing", lambda stream: capturing["on"])
    monkeypatch.setattr(N, "_INTERNAL_STREAMS", {})  # the process's streams: each test's fake runtime makes its own
    monkeypatch.setattr(N, "_ORDER_EVENTS", {})
    monkeypatch.setattr(N, "_TYPE_CODES", {})
    monkeypatch.setattr(N, "_OP_CODES", {})
    monkeypatch.setattr(N, "record_on", lambda tensors, stream: recorded.append(([t.data_ptr() for t in tensors],
                                                                                 stream.handle)))
    return SimpleNamespace(nb=nb, core=core, runtime=runtime, recorded=recorded, capturing=capturing)


_next_address = [0x7000_0000]


def cuda_tensor(shape, dtype=tw.float32, device: int = 0, strides=None) -> Tensor:
    """A tensor that says it lives on cuda:``device`` at a made-up address (never read: NCCL is faked)."""
    numel = int(np.prod(shape)) if shape else 1
    ptr = _next_address[0]
    _next_address[0] += max(numel * dtype.itemsize, 1) + 4096
    dev = Device(f"cuda:{device}")
    storage = Storage(SimpleNamespace(ptr=ptr, nbytes=numel * dtype.itemsize), dev, dtype, numel)
    if strides is None:
        strides = tuple(int(np.prod(shape[k + 1:])) for k in range(len(shape)))
    return Tensor._make(storage, tuple(shape), tuple(strides), 0, dtype, dev)


def group(rank: int = 0, size: int = 2, store=None) -> N.NCCLBackend:
    return N.NCCLBackend(store or FakeStore(), rank, size, datetime.timedelta(seconds=5))


def collective_calls(nb: FakeNccl) -> list[tuple]:
    return [c for c in nb.calls if c[0] not in ("group_start", "group_end")]


# ---- what reaches NCCL ---------------------------------------------------------------------------------------


def test_all_reduce_runs_on_the_internal_stream_after_the_callers_work(fakes):
    pg, x = group(), cuda_tensor((3, 4))
    work = pg.allreduce([x], ReduceOp.SUM)
    made = fakes.core.made
    assert made == [{"nranks": 2, "rank": 0, "id": b"id-0", "ptr": 1000}]
    assert pg.store.values == {"nccl/0": b"id-0"}
    internal = 101
    assert ("wait_event", internal, 7) in fakes.runtime.log, "the collective must wait for the caller's stream"
    assert fakes.nb.calls == [("all_reduce", x.data_ptr(), x.data_ptr(), 12, FakeNccl.DataType.Float32,
                               FakeNccl.RedOp.Sum, ("comm", 1000), internal)]
    assert fakes.recorded == [([x.data_ptr()], internal)], "its tensors are recorded on the internal stream"
    assert not work.is_completed()
    fakes.runtime.log.clear()
    assert work.wait() is True
    assert fakes.runtime.log == [("wait_event", 7, internal)], "wait() orders the caller's stream, no host block"
    fakes.runtime.events[-1].done = True
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.result() == [x]


def test_the_second_rank_reads_the_unique_id_and_later_collectives_reuse_the_communicator(fakes):
    store = FakeStore()
    store.set("nccl/0", b"from-rank-0")
    pg = group(rank=1, store=store)
    pg.allreduce([cuda_tensor((2,))], ReduceOp.SUM)
    pg.broadcast([cuda_tensor((2,))], 0)
    assert fakes.core.made == [{"nranks": 2, "rank": 1, "id": b"from-rank-0", "ptr": 1000}]
    assert fakes.runtime.made == 1, "one internal stream per device"


def test_each_device_gets_its_own_communicator_under_the_next_key(fakes):
    store = FakeStore()
    pg = group(store=store)
    pg.allreduce([cuda_tensor((2,), device=0)], ReduceOp.SUM)
    pg.allreduce([cuda_tensor((2,), device=1)], ReduceOp.SUM)
    assert sorted(store.values) == ["nccl/0", "nccl/1"]
    assert [c[-1] for c in fakes.nb.calls] == [101, 102]


@pytest.mark.parametrize(("dtype", "op", "nccl_type", "nccl_op", "count"), [
    (tw.float32, ReduceOp.SUM, "Float32", "Sum", 6),
    (tw.bfloat16, ReduceOp.AVG, "Bfloat16", "Avg", 6),
    (tw.float16, ReduceOp.PRODUCT, "Float16", "Prod", 6),
    (tw.float64, ReduceOp.MIN, "Float64", "Min", 6),
    (tw.int64, ReduceOp.MAX, "Int64", "Max", 6),
    (tw.int32, ReduceOp.SUM, "Int32", "Sum", 6),
    (tw.int8, ReduceOp.SUM, "Int8", "Sum", 6),
    (tw.uint8, ReduceOp.SUM, "Uint8", "Sum", 6),
    (tw.bool, ReduceOp.SUM, "Uint8", "Max", 6),  # torch: a sum of bools is an or, which uint8's max is
    (tw.bool, ReduceOp.PRODUCT, "Uint8", "Prod", 6),
    (tw.complex64, ReduceOp.SUM, "Float32", "Sum", 12),  # two floats an element
    (tw.complex128, ReduceOp.AVG, "Float64", "Avg", 12),
])
def test_dtypes_and_reductions_as_torch_maps_them(fakes, dtype, op, nccl_type, nccl_op, count):
    x = cuda_tensor((2, 3), dtype)
    group().allreduce([x], op)
    (call,) = fakes.nb.calls
    assert call[3:6] == (count, getattr(FakeNccl.DataType, nccl_type), getattr(FakeNccl.RedOp, nccl_op))


@pytest.mark.parametrize(("dtype", "op", "error", "message"), [
    (tw.int16, ReduceOp.SUM, TypeError, "Input tensor data type is not supported for NCCL process group: Short"),
    (tw.float8_e4m3fn, ReduceOp.SUM, TypeError, "Float8 dtypes are not currenlty supported for NCCL reductions"),
    (tw.bool, ReduceOp.AVG, TypeError, "Cannot use ReduceOp.AVG with boolean inputs"),
    (tw.float32, ReduceOp.BAND, ValueError, "Cannot use ReduceOp.BAND with NCCL"),
    (tw.float32, ReduceOp.BXOR, ValueError, "Cannot use ReduceOp.BXOR with NCCL"),
    (tw.float32, ReduceOp.PREMUL_SUM, ValueError, "Unhandled ReduceOp"),
    (tw.complex64, ReduceOp.MAX, ValueError, "all_reduce does not support RedOpType.MAX on complex tensors"),
])
def test_unsupported_dtypes_and_reductions_raise_torchs_errors(fakes, dtype, op, error, message):
    with pytest.raises(error, match=message):
        group().allreduce([cuda_tensor((4,), dtype)], op)
    assert fakes.nb.calls == [] and fakes.core.made == [], "nothing reaches NCCL, no communicator is made"


def test_float8_moves_as_bytes(fakes):
    x = cuda_tensor((5,), tw.float8_e5m2)
    group().broadcast([x], 1)
    assert fakes.nb.calls == [("broadcast", x.data_ptr(), x.data_ptr(), 5, FakeNccl.DataType.Uint8, 1,
                               ("comm", 1000), 101)]


def test_bad_tensors_raise_torchs_errors(fakes):
    pg = group()
    with pytest.raises(ValueError, match="Tensors must be CUDA and dense"):
        pg.allreduce([tw.ones(3)], ReduceOp.SUM)
    with pytest.raises(ValueError, match="Tensors must be contiguous"):
        pg.allreduce([cuda_tensor((3, 4), strides=(1, 3))], ReduceOp.SUM)
    with pytest.raises(ValueError, match="Expected list of tensors on the same device"):
        pg.allgather_into_tensor(cuda_tensor((4,), device=0), cuda_tensor((2,), device=1))
    with pytest.raises(ValueError, match="Tensor list must be nonempty"):
        pg.allreduce([], ReduceOp.SUM)
    with pytest.raises(TypeError, match="output tensor must have the same type as input tensor"):
        pg.allgather_into_tensor(cuda_tensor((4,)), cuda_tensor((2,), tw.float16))
    with pytest.raises(ValueError, match="output tensor size must be equal to world_size times input tensor size"):
        pg.allgather_into_tensor(cuda_tensor((5,)), cuda_tensor((2,)))
    with pytest.raises(TypeError, match="input tensor must be the same type as the output tensor"):
        pg.reduce_scatter_tensor(cuda_tensor((2,)), cuda_tensor((4,), tw.int32), ReduceOp.SUM)
    with pytest.raises(ValueError, match="input tensor must be the same size as output size times world size"):
        pg.reduce_scatter_tensor(cuda_tensor((2,)), cuda_tensor((5,)), ReduceOp.SUM)
    with pytest.raises(ValueError, match="Invalid root 2 for broadcast"):
        pg.broadcast([cuda_tensor((2,))], 2)
    assert fakes.nb.calls == []


def test_gather_and_scatter_pass_the_per_rank_count(fakes):
    pg = group(size=4)
    out, inp = cuda_tensor((8, 2)), cuda_tensor((2, 2))
    pg.allgather_into_tensor(out, inp)
    pg.reduce_scatter_tensor(inp, out, ReduceOp.AVG)
    assert fakes.nb.calls == [
        ("all_gather", inp.data_ptr(), out.data_ptr(), 4, FakeNccl.DataType.Float32, ("comm", 1000), 101),
        ("reduce_scatter", out.data_ptr(), inp.data_ptr(), 4, FakeNccl.DataType.Float32, FakeNccl.RedOp.Avg,
         ("comm", 1000), 101),
    ]
    assert fakes.recorded[0] == ([out.data_ptr(), inp.data_ptr()], 101)


def test_all_to_all_is_grouped_sends_and_receives_at_the_split_offsets(fakes):
    pg = group(rank=1, size=3)
    pg.store.set("nccl/0", b"x")
    inp, out = cuda_tensor((6, 2)), cuda_tensor((5, 2))
    pg.alltoall_base(out, inp, [2, 0, 3], [1, 2, 3])
    f32 = FakeNccl.DataType.Float32
    comm = ("comm", 1000)
    assert fakes.nb.calls == [
        ("group_start",),
        ("send", inp.data_ptr(), 2, f32, 0, comm, 101), ("recv", out.data_ptr(), 4, f32, 0, comm, 101),
        ("send", inp.data_ptr() + 2 * 4, 4, f32, 1, comm, 101),
        ("send", inp.data_ptr() + 6 * 4, 6, f32, 2, comm, 101), ("recv", out.data_ptr() + 4 * 4, 6, f32, 2, comm, 101),
        ("group_end",),
    ]


@pytest.mark.parametrize(("rows", "splits", "message"), [
    (3, [None, None], "Tensor's dim 0 does not divide equally across group size"),
    (4, [[1, 1, 1], None], "Number of tensor splits not equal to group size"),
    (4, [[1, 1], None], "Split sizes doesn't match total dim 0 size"),
])
def test_all_to_all_split_errors_are_torchs(fakes, rows, splits, message):
    with pytest.raises(RuntimeError, match=message):
        group().alltoall_base(cuda_tensor((rows,)), cuda_tensor((rows,)), *splits)


def test_send_and_recv_between_two_of_four_ranks_use_a_communicator_of_those_two(fakes):
    store = FakeStore()
    pg = group(rank=3, size=4, store=store)
    store.set("nccl/p2p/1:3/0", b"pair")
    x = cuda_tensor((4,))
    pg.send([x], 1, 0)
    pg.recv([x], 1, 0)
    assert fakes.core.made == [{"nranks": 2, "rank": 1, "id": b"pair", "ptr": 1000}]
    assert [c[:5] for c in fakes.nb.calls] == [("send", x.data_ptr(), 4, FakeNccl.DataType.Float32, 0),
                                                ("recv", x.data_ptr(), 4, FakeNccl.DataType.Float32, 0)]
    with pytest.raises(ValueError, match="cannot send to itself"):
        pg.send([x], 3, 0)


def test_send_in_a_two_rank_group_uses_the_groups_communicator(fakes):
    pg = group(rank=0, size=2)
    x = cuda_tensor((4,))
    pg.allreduce([x], ReduceOp.SUM)
    pg.send([x], 1, 0)
    assert len(fakes.core.made) == 1 and fakes.nb.calls[-1][:5] == ("send", x.data_ptr(), 4, 7, 1)


def test_under_graph_capture_calls_go_on_the_capturing_stream(fakes):
    fakes.capturing["on"] = True
    x = cuda_tensor((4,))
    work = group().allreduce([x], ReduceOp.SUM)
    assert fakes.nb.calls[0][-1] == 7, "issued on the caller's (capturing) stream"
    assert not [e for e in fakes.runtime.log if e[0] in ("wait_stream", "wait_event")]
    assert fakes.recorded == [] and fakes.runtime.events == []
    assert work.wait() and work.is_completed()


def test_the_future_orders_the_callers_stream_and_chains_callbacks(fakes):
    x = cuda_tensor((4,))
    work = group().allreduce([x], ReduceOp.SUM)
    future = work.get_future()
    assert future is work.get_future() and not future.done()
    fakes.runtime.log.clear()
    chained = future.then(lambda f: f.value()[0].shape)
    assert fakes.runtime.log == [("wait_event", 7, 101)], "the callback's kernels run after the collective"
    assert chained.wait() == (4,)
    failing = future.then(lambda f: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.wait()


def test_shutdown_destroys_every_communicator(fakes):
    store = FakeStore()
    store.set("nccl/p2p/0:2/0", b"pair")
    pg = group(rank=0, size=3, store=store)
    pg.allreduce([cuda_tensor((1,))], ReduceOp.SUM)
    pg.send([cuda_tensor((1,))], 2, 0)
    pg.shutdown()
    assert sorted(fakes.core.destroyed) == [1000, 1001]


def test_nccl_calls_that_fail_name_the_collective(fakes, monkeypatch):
    def failing(*args):
        raise FakeNccl.NCCLError("unhandled cuda error")

    monkeypatch.setattr(fakes.nb, "all_reduce", failing, raising=False)
    with pytest.raises(RuntimeError, match=r"NCCL error in all_reduce on cuda:0 \(group rank 0 of 2\)"):
        group().allreduce([cuda_tensor((1,))], ReduceOp.SUM)


def test_nvlink_multicast_stays_off_unless_set(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    group()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    group()
    assert os.environ["NCCL_NVLS_ENABLE"] == "1"


def test_the_module_level_collectives_reach_nccl_in_stream_order(fakes):
    import tilewise.distributed as dist

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x, out = cuda_tensor((4,)), cuda_tensor((4,))
        assert dist.all_reduce(x) is None
        assert fakes.runtime.log[-1] == ("wait_event", 7, 101), "async_op=False: the caller's stream waits"
        work = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True)
        assert isinstance(work, N.NCCLWork) and fakes.runtime.log[-1] == ("wait_event", 101, 7)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(x, out)
        dist.broadcast(x, src=0)
        dist.all_to_all_single(out, x)
        assert [c[0] for c in fakes.nb.calls] == ["all_reduce", "all_reduce", "all_gather", "reduce_scatter",
                                                  "broadcast", "group_start", "send", "recv", "group_end"]
        assert fakes.nb.calls[1][5] == FakeNccl.RedOp.Avg
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(tw.ones(3))
    finally:
        dist.destroy_process_group()
    assert fakes.core.destroyed == [1000]


def test_the_internal_stream_outlives_its_process_group(fakes):
    """A tensor a collective used is recorded on the internal stream; freed after destroy_process_group, its
    block's event is recorded there, so the stream must still exist (a destroyed one crashed the process)."""
    import tilewise.distributed as dist

    for _ in range(2):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        try:
            dist.all_reduce(cuda_tensor((4,)))
        finally:
            dist.destroy_process_group()
    assert fakes.runtime.made == 1 and list(N._INTERNAL_STREAMS) == [0]


# ---- record_stream and the small-block free lists ------------------------------------------------------------


def test_record_stream_keeps_a_freed_block_from_reuse_until_the_other_stream_is_done(monkeypatch):
    from test_cuda_runtime import make_allocator

    from tilewise.backends.cuda import device_memory as dm

    allocator, _, events = make_allocator()
    memory = dm.DeviceMemory.__new__(dm.DeviceMemory)
    memory.device, memory.allocator, memory.free_lists, memory.cached, memory.allocated, memory.peak = (
        99, allocator, {}, 0, 0, 0)
    monkeypatch.setitem(dm._memories, 99, memory)
    caller, other = 1, 2

    def tensor_on(buffer):
        return SimpleNamespace(_storage=SimpleNamespace(data=buffer))

    plain = dm.DeviceBuffer(4096, 99, caller)
    plain_ptr = plain.ptr
    del plain
    again = dm.DeviceBuffer(4096, 99, caller)
    assert again.ptr == plain_ptr, "unrecorded: reused at once on its stream, from the free lists"

    dm.record_stream(tensor_on(again), other)
    dm.record_stream(tensor_on(again), caller)  # its own stream: nothing to wait for
    del again
    assert [e.stream for e in events.recorded] == [other]
    assert memory.allocated == 0 and not any(memory.free_lists.values())
    later = dm.DeviceBuffer(4096, 99, caller)
    assert later.ptr != plain_ptr, "still read on the other stream: not handed out"
    events.complete(stream=other)
    assert allocator.malloc(4096, caller) == plain_ptr, "handed out once the other stream's work is done"


# ---- on GPUs ---------------------------------------------------------------------------------------------------

DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
MOVED_DTYPES = [d for d in DTYPES if d != "bool"] + ["float8_e4m3fn", "complex64"]


def gpu_count() -> int:
    try:
        return tw.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


needs_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason=f"needs 2 GPUs for 2 NCCL ranks; {gpu_count()} found")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, world: int, timeout: float = 120.0) -> list:
    """Run ``target(rank, world)`` in ``world`` spawned processes (rank r on cuda:r); their return values."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank_main, args=(target, rank, world, port, results)) for rank in range(world)]
    for p in processes:
        p.start()
    answers: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < world and time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=1)
                answers[rank] = (ok, value)
            except queue.Empty:
                dead = [r for r, p in enumerate(processes) if r not in answers and p.exitcode not in (None, 0)]
                assert not dead, f"rank(s) {dead} died without an answer (exit codes " \
                                 f"{[processes[r].exitcode for r in dead]})"
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert len(answers) == world, f"ranks {sorted(set(range(world)) - set(answers))} did not answer in {timeout:g} s"
    failures = [f"rank {r}: {v}" for r, (ok, v) in sorted(answers.items()) if not ok]
    assert not failures, "\n".join(failures)
    return [answers[r][1] for r in range(world)]


def _rank_main(target, rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), NCCL_NVLS_ENABLE="0")
    try:
        import tilewise as tw
        import tilewise.distributed as dist

        tw.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        try:
            value = target(rank, world)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 -- the parent reports it
        results.put((rank, False, traceback.format_exc()))


def rank_values(rank: int, dtype: str, n: int = 6) -> np.ndarray:
    """Small values distinct per rank (exact in every dtype and under every reduction of two ranks)."""
    if dtype == "bool":
        return (np.arange(n) + rank) % 2 == 0
    return ((np.arange(n) % 3) + rank + 1).astype(np.float64)


def expected_reduction(op: str, dtype: str, world: int, n: int = 6) -> np.ndarray:
    values = np.stack([rank_values(r, dtype, n).astype(np.float64) for r in range(world)])
    result = {"SUM": values.sum(0), "PRODUCT": values.prod(0), "MIN": values.min(0), "MAX": values.max(0),
              "AVG": values.mean(0)}[op]
    if dtype == "bool":
        return result != 0
    if dtype in ("uint8", "int8", "int32", "int64"):
        return np.floor(result)  # NCCL's integer average divides as integers
    return result


def _all_reduce_every_dtype_and_op(rank: int, world: int) -> list[str]:
    import tilewise.distributed as dist

    wrong = []
    for dtype in DTYPES:
        for op in OPS:
            if dtype == "bool" and op == "AVG":
                continue
            x = tw.tensor(rank_values(rank, dtype)).to(getattr(tw, dtype)).cuda()
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            got = x.cpu().float().numpy() if dtype != "bool" else x.cpu().numpy()
            want = expected_reduction(op, dtype, world)
            if not np.allclose(got, want, rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6):
                wrong.append(f"{dtype} {op}: {got} != {want}")
    return wrong


@pytest.mark.cuda
@needs_two_gpus
def test_all_reduce_every_dtype_and_op_on_two_gpus():
    assert run_ranks(_all_reduce_every_dtype_and_op, 2) == [[], []]


def _data_movement(rank: int, world: int) -> dict:
    import tilewise.distributed as dist

    found = {}
    for dtype in MOVED_DTYPES:
        kind = getattr(tw, dtype)
        x = tw.full((5,), rank + 1.0).to(kind).cuda()
        dist.broadcast(x, src=1)
        found[f"broadcast {dtype}"] = x.cpu().float().numpy().tolist()
        out = tw.zeros(5 * world, dtype=kind).cuda()
        dist.all_gather_into_tensor(out, tw.full((5,), rank + 1.0).to(kind).cuda())
        found[f"all_gather {dtype}"] = out.cpu().float().numpy().tolist()
    big = tw.arange(4 * world, dtype=tw.float32, device="cuda") * (rank + 1)
    part = tw.zeros(4, device="cuda")
    dist.reduce_scatter_tensor(part, big)
    found["reduce_scatter"] = part.cpu().numpy().tolist()
    inp = tw.arange(6, dtype=tw.float32, device="cuda") + 10 * rank
    out = tw.zeros(6, device="cuda")
    dist.all_to_all_single(out, inp)
    found["all_to_all equal"] = out.cpu().numpy().tolist()
    sends, receives = ([1, 2], [1, 3]) if rank == 0 else ([3, 1], [2, 1])
    inp = tw.arange(3, dtype=tw.float32, device="cuda") + 10 * rank if rank == 0 else (
        tw.arange(4, dtype=tw.float32, device="cuda") + 10 * rank)
    out = tw.zeros(sum(receives), device="cuda")
    dist.all_to_all_single(out, inp, output_split_sizes=receives, input_split_sizes=sends)
    found["all_to_all unequal"] = out.cpu().numpy().tolist()
    message = tw.arange(3, dtype=tw.float32, device="cuda") + 100
    if rank == 0:
        dist.send(message, dst=1)
    else:
        got = tw.zeros(3, device="cuda")
        dist.recv(got, src=0)
        found["recv"] = got.cpu().numpy().tolist()
    dist.barrier()
    return found


@pytest.mark.cuda
@needs_two_gpus
def test_broadcast_gather_scatter_all_to_all_and_point_to_point_on_two_gpus():
    first, second = run_ranks(_data_movement, 2)
    for dtype in MOVED_DTYPES:
        assert first[f"broadcast {dtype}"] == second[f"broadcast {dtype}"] == [2.0] * 5
        assert first[f"all_gather {dtype}"] == second[f"all_gather {dtype}"] == [1.0] * 5 + [2.0] * 5
    assert first["reduce_scatter"] == [0.0, 3.0, 6.0, 9.0] and second["reduce_scatter"] == [12.0, 15.0, 18.0, 21.0]
    assert first["all_to_all equal"] == [0, 1, 2, 10, 11, 12] and second["all_to_all equal"] == [3, 4, 5, 13, 14, 15]
    assert first["all_to_all unequal"] == [0, 10, 11, 12] and second["all_to_all unequal"] == [1, 2, 13]
    assert second["recv"] == [100.0, 101.0, 102.0]


def _async_order_and_record_stream(rank: int, world: int) -> dict:
    import tilewise.distributed as dist

    found = {}
    # the collective must see a kernel queued before it on the current stream, however late that kernel runs
    x = tw.ones(1 << 20, device="cuda")
    tw.cuda._sleep(50_000_000)
    x.mul_(rank + 2)
    work = dist.all_reduce(x, async_op=True)
    work.wait()  # orders the current stream only: reading x below is still in order
    found["ordered"] = float(x[0].item())
    # an input freed right after an asynchronous call keeps its memory until NCCL has read it
    out = tw.zeros(2 * (1 << 22), device="cuda")
    if rank == 1:
        time.sleep(0.5)  # rank 0's NCCL call waits on the GPU for this rank meanwhile
    inp = tw.full((1 << 22,), float(rank + 1), device="cuda")
    work = dist.all_gather_into_tensor(out, inp, async_op=True)
    del inp
    scribble = tw.empty(1 << 22, device="cuda")
    scribble.fill_(-7.0)
    work.wait()
    found["gathered"] = sorted(set(out.cpu().numpy().tolist()))
    found["scribble"] = float(scribble[0].item())
    return found


@pytest.mark.cuda
@needs_two_gpus
def test_async_work_is_ordered_on_the_stream_and_freed_inputs_are_not_reused_early():
    for found in run_ranks(_async_order_and_record_stream, 2):
        assert found["ordered"] == 5.0  # 2 + 3
        assert found["gathered"] == [1.0, 2.0]
        assert found["scribble"] == -7.0


def _one_rank_world(rank: int, world: int) -> dict:
    import tilewise.distributed as dist

    x = tw.arange(4, dtype=tw.float32, device="cuda")
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    out = tw.zeros(4, device="cuda")
    dist.all_gather_into_tensor(out, x)
    dist.barrier()
    return {"x": x.cpu().numpy().tolist(), "out": out.cpu().numpy().tolist()}


@pytest.mark.cuda
def test_a_one_process_world_on_one_gpu():
    (found,) = run_ranks(_one_rank_world, 1)
    assert found == {"x": [0.0, 1.0, 2.0, 3.0], "out": [0.0, 1.0, 2.0, 3.0]}


def test_a_barrier_whose_peer_never_answers_raises_after_the_groups_timeout(fakes, monkeypatch):
    import tilewise.ops.creation as creation

    monkeypatch.setattr(creation, "zeros", lambda *shape, **kwargs: cuda_tensor(shape))
    backend = N.NCCLBackend(FakeStore(), 0, 2, datetime.timedelta(seconds=0.2))
    work = backend.barrier()  # the fake event never completes, as when a peer died
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"NCCL work on cuda:0 timed out after 0.2 s: a rank of the group may"):
        work.wait()
    assert time.monotonic() - began < 5


def test_a_receive_names_its_sender(fakes):
    work = group(rank=0).recv([cuda_tensor((3,))], 1)
    assert work.source_rank() == 1


def test_the_functional_all_reduce_of_compiled_programs_is_one_out_of_place_call(fakes):
    """What a compiled DDP step's program runs for a bucket: NCCL reads the gradients and writes the planned
    output, on the caller's stream order (the caller then waits for the internal stream)."""
    import tilewise.distributed as dist
    from tilewise.backends.cuda.kernels import INTO
    from tilewise.distributed import _functional_collectives as funcol

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        grads, out = cuda_tensor((6,)), cuda_tensor((6,))
        assert INTO["_c10d_functional::all_reduce"](out, grads, "sum", "0") is True
        (name, src, dst, count, _, op, _, stream), = collective_calls(fakes.nb)
        assert (name, src, dst, count, op) == ("all_reduce", grads.data_ptr(), out.data_ptr(), 6, FakeNccl.RedOp.Sum)
        assert fakes.runtime.log[-1] == ("wait_event", 7, stream), "the caller's stream waits for the call"
        with pytest.raises(ValueError, match="unknown reduceOp 'bor'"):
            funcol.all_reduce(grads, "bor", None)
    finally:
        dist.destroy_process_group()


def test_the_functional_all_reduce_written_over_its_input_is_one_in_place_call(fakes):
    """Where the memory plan gives the all-reduce its input's buffer, NCCL reads and writes that one buffer."""
    import tilewise.distributed as dist
    import tilewise.distributed._functional_collectives  # noqa: F401 -- registers the program's step
    from tilewise.backends.cuda.kernels import INTO

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        grads = cuda_tensor((6,))
        assert INTO["_c10d_functional::all_reduce"](grads, grads, "sum", "0") is True
        (name, src, dst, count, _, _, _, _), = collective_calls(fakes.nb)
        assert (name, src, dst, count) == ("all_reduce", grads.data_ptr(), grads.data_ptr(), 6)
    finally:
        dist.destroy_process_group()
