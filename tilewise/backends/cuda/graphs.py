"""CUDA graphs: the work one Python function queues, captured once and replayed with one launch.

[Note: graph capture] :func:`capture` runs a function with a stream of its own as the current stream, under
``cuStreamBeginCapture``, and returns a :class:`CudaGraph` to replay. What it owns, and why:
- memory: a graph bakes in the addresses its work touched, so what the function allocates meanwhile (a custom
  operator's outputs and temporaries) comes from a private pool of the caching allocator that the graph keeps
  for its life, and that no other tensor is handed while the graph may replay (see "Private pools" in
  [Note: caching allocator]). The capture stream is one kept for captures only, its free lists emptied first,
  so no block cached for eager work ends up inside a graph;
- host operations: downloads, uploads, synchronizations and random draws are refused while it captures
  ([Note: host operations under capture]), since a replay would not repeat them;
- failure: anything the function raises, a capture the driver invalidated (work that waited on the capturing
  stream, joined another one, or was not permitted), or a graph that does not instantiate ends the capture
  cleanly (the stream leaves capture mode, the pool is released) and raises :class:`GraphCaptureError` with the
  cause. Nothing captured ran, so the caller can run the same work uncaptured instead.
- communicators: a graph that captured NCCL collectives holds their communicators, which cannot be destroyed
  while it lives; :func:`release_graphs_holding` releases such graphs first ([Note: graphs that hold a
  communicator] in ``runtime/capturing``).
The capture mode is ``RELAXED``: the allocator may call ``cuMemAlloc`` while capturing (torch relaxes its mode
around its own ``cudaMalloc`` for the same reason).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from tilewise._cuda_api import CudaError, check, driver_api
from tilewise.backends.cuda.device_memory import memory
from tilewise.backends.cuda.runtime.allocator import PrivatePool
from tilewise.backends.cuda.runtime.capturing import capture_scope
from tilewise.backends.cuda.runtime.device import ensure_context
from tilewise.backends.cuda.runtime.stream import Stream
from tilewise.backends.cuda.runtime.stream import stream as using

_capture_streams: dict[int, list[Stream]] = {}  # device -> streams kept for captures, not in use now
_holding: weakref.WeakSet = weakref.WeakSet()  # live graphs whose captured work holds a resource (a communicator)


class GraphCaptureError(RuntimeError):
    """Work could not be captured into a CUDA graph; ``__cause__`` holds what the captured function raised."""


class CudaGraph:
    """One captured graph: the executable, the graph, and the private pool its captured allocations live in;
    ``holds``: the resources (communicators) its captured work holds references on."""

    def __init__(self, exec_handle, graph_handle, pool: PrivatePool, device: int, holds: tuple = ()):
        self.exec, self.graph, self.pool, self.device, self.holds = exec_handle, graph_handle, pool, device, holds
        self.released = False
        if holds:
            _holding.add(self)

    def replay(self, stream: int) -> None:
        if self.released:
            raise RuntimeError("this CUDA graph was released (it captured collectives of a communicator that has "
                               "since been destroyed) and cannot be replayed")
        ensure_context(self.device)  # stream 0 is the current context's: see [Note: the operation's device]
        check(driver_api().cuGraphLaunch(self.exec, stream), "cuGraphLaunch")

    def release(self) -> None:
        """Destroy the graph now (after the device has finished what it queued): its executable, its graph and
        its pool; a released graph never replays."""
        if self.released:
            return
        self.released = True
        _holding.discard(self)
        cu = driver_api()
        ensure_context(self.device)
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")  # a replay in flight may still read the pool
        cu.cuGraphExecDestroy(self.exec)
        cu.cuGraphDestroy(self.graph)
        _drop_pool(self.device, self.pool)

    def __del__(self) -> None:
        if self.released:
            return
        try:
            cu = driver_api()
            cu.cuGraphExecDestroy(self.exec)
            cu.cuGraphDestroy(self.graph)
            _drop_pool(self.device, self.pool)
        except Exception:  # noqa: S110 — at interpreter shutdown the driver may already be gone
            pass


def _drop_pool(device: int, pool: PrivatePool) -> None:
    """One graph (or failed capture) less using ``pool``; the last one gives it back to the allocator."""
    pool.users -= 1
    if pool.users <= 0:
        memory(device).allocator.release_pool(pool)


def release_graphs_holding(resource: object) -> int:
    """Release every live graph whose captured work holds ``resource`` (a communicator about to be destroyed:
    NCCL waits for such graphs to be gone first); how many were released."""
    found = [g for g in list(_holding) if any(held is resource for held in g.holds)]
    for graph in found:
        graph.release()
    return len(found)


class Recording:
    """A capture under way on ``stream`` (a Stream of ``device``), from :meth:`begin` to :meth:`end`: the stream in
    capture mode, the thread marked as capturing, and the allocations on the stream routed to ``pool``."""

    def __init__(self, stream: Stream, device: int, pool: PrivatePool) -> None:
        self.stream, self.device, self.pool = stream, device, pool
        pool.users += 1  # graphs may share a pool (torch's pool=): it goes back when the last of them is gone
        self.holds: list = []
        self._scope = None

    def begin(self) -> None:
        mem, cu = memory(self.device), driver_api()
        mem.release_free_list(self.stream.handle)
        began = cu.cuStreamBeginCapture(self.stream.handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        try:
            check(began, "cuStreamBeginCapture")
        except CudaError as exc:
            raise GraphCaptureError(f"the capture did not begin: {exc}") from exc
        mem.allocator.route(self.stream.handle, self.pool)
        self._scope = capture_scope(self.stream.handle, self.holds)
        self._scope.__enter__()

    def end(self, raised: Exception | None = None) -> CudaGraph:
        """End the capture (always: the stream leaves capture mode) and instantiate the graph; ``raised``: what the
        captured work raised, which makes the capture unusable (:class:`GraphCaptureError` from it)."""
        mem, cu = memory(self.device), driver_api()
        try:
            try:
                self._scope.__exit__(None, None, None)
            finally:
                mem.allocator.route(self.stream.handle, None)
                ended = cu.cuStreamEndCapture(self.stream.handle)
            graph = _ended_graph(ended, raised)
        except BaseException:
            _drop_pool(self.device, self.pool)
            raise
        try:
            executable = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except CudaError as exc:
            cu.cuGraphDestroy(graph)
            _drop_pool(self.device, self.pool)
            raise GraphCaptureError(f"the captured graph does not instantiate: {exc}") from exc
        return CudaGraph(executable, graph, self.pool, self.device, tuple(self.holds))


def capture(body: Callable[[int], None], device: int) -> CudaGraph:
    """Capture what ``body(stream)`` queues on ``stream`` (the current stream while it runs) into a graph."""
    stream = _take_stream(device)
    try:
        recording = Recording(stream, device, PrivatePool())
        try:
            recording.begin()
        except BaseException:
            _drop_pool(device, recording.pool)
            raise
        raised = None
        try:
            with using(stream):
                body(stream.handle)
        except Exception as exc:  # noqa: BLE001 — whatever it was, the capture cannot be used
            raised = exc
        return recording.end(raised)
    finally:
        _capture_streams.setdefault(device, []).append(stream)


def _ended_graph(ended: tuple, raised: Exception | None):
    """The graph ``cuStreamEndCapture`` returned, or :class:`GraphCaptureError` saying why there is none."""
    try:
        graph = check(ended, "cuStreamEndCapture")
    except CudaError as exc:
        if raised is not None:
            raise GraphCaptureError(f"{type(raised).__name__}: {raised}") from raised
        raise GraphCaptureError(f"the driver invalidated the capture ({exc}): something waited on the stream "
                                "being captured, or queued work on the legacy default stream or another stream "
                                "that the capture could not hold") from exc
    if raised is not None:
        driver_api().cuGraphDestroy(graph)
        raise GraphCaptureError(f"{type(raised).__name__}: {raised}") from raised
    return graph


def _take_stream(device: int) -> Stream:
    """A stream used for captures only: no eager work allocates on it (its free lists are emptied before each
    capture all the same)."""
    free = _capture_streams.get(device)
    return free.pop() if free else _CaptureStream(device)


class _CaptureStream(Stream):
    """A stream kept for captures: a new driver stream (never one a ``Stream()`` had, whose buffers could still come
    back to its free lists), never handed back to the pool of streams that ``Stream()`` draws from."""

    def __init__(self, device: int) -> None:
        self.device = ensure_context(device)
        self.priority = 0
        flags = driver_api().CUstream_flags.CU_STREAM_NON_BLOCKING
        self.handle = int(check(driver_api().cuStreamCreateWithPriority(flags, 0), "cuStreamCreateWithPriority"))
        self._owned = True

    def __del__(self) -> None:
        pass
