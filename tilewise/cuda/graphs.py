"""torch.cuda.graphs: capturing eager work into a CUDA graph and replaying it with one launch.

[Note: capturing eager work] ``with tilewise.cuda.graph(g): out = model(static_input)`` records every kernel and
library call the block queues, on a side stream, into ``g`` instead of only running it; ``g.replay()`` then runs all
of it again with one launch, reading and writing the same memory. That is how code that is never compiled can skip
its per-operator host cost on a GPU: the host work of each operator happens once, at capture. As with torch:
- tensors the block allocates live in the graph's private memory pool (see "Private pools" in [Note: caching
  allocator]) and are the graph's outputs: each replay writes them in place, so read them after ``replay()`` and
  feed new inputs by copying into the tensors the capture read (``static_input.copy_(batch)``);
- the block must not need the host: reading a value (``.item()``, printing), copying to or from the CPU and
  synchronising raise at capture, since a replay would not repeat them; warm the work up before capturing (on a
  side stream, as torch's recipe does), so that first-use set-up (kernel compilation, library plans, optimizer
  state) is done;
- ``pool=other.pool()`` (or :func:`graph_pool_handle`) lets graphs that replay in capture order share memory.
The same machinery captures compiled programs (``backends/cuda/graphs.py``).
"""

from __future__ import annotations

import gc

from tilewise.backends.cuda.runtime.allocator import PrivatePool
from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing

__all__ = ["CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"]


class _PoolHandle(tuple):
    """What ``CUDAGraph.pool()`` and ``graph_pool_handle()`` return: an opaque handle of a private pool."""

    pool: PrivatePool


def _handle(pool: PrivatePool) -> _PoolHandle:
    handle = _PoolHandle((0, pool.id))
    handle.pool = pool
    return handle


def graph_pool_handle() -> _PoolHandle:
    """A new memory pool for graphs to share (``capture_begin(pool=...)``, ``graph(..., pool=...)``)."""
    return _handle(PrivatePool())


class CUDAGraph:
    """One CUDA graph: :meth:`capture_begin`/:meth:`capture_end` record the work queued on the current stream in
    between, :meth:`replay` runs it again (see [Note: capturing eager work])."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._recording = None
        self._graph = None
        self._pool: PrivatePool | None = None
        self.keep_graph = keep_graph

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        """Start recording the work queued on the current stream, which must not be the default stream."""
        from tilewise.backends.cuda.graphs import Recording
        from tilewise.backends.cuda.runtime import current_device, current_stream

        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode must be 'global', 'thread_local' or 'relaxed', got "
                             f"{capture_error_mode!r}")
        if self._recording is not None:
            raise RuntimeError("this CUDA graph is already capturing: call capture_end() first")
        if self._graph is not None:
            raise RuntimeError("this CUDA graph has already been captured: call reset() before capturing again")
        stream = current_stream(current_device())
        if stream.handle == 0:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, it's "
                               "ok to replay them on the default stream.)")
        self._pool = pool.pool if isinstance(pool, _PoolHandle) else PrivatePool()
        recording = Recording(stream, stream.device, self._pool)
        try:
            recording.begin()
        except BaseException:
            from tilewise.backends.cuda.graphs import _drop_pool

            _drop_pool(stream.device, self._pool)
            raise
        self._recording = recording

    def capture_end(self) -> None:
        """Stop recording and make the graph replayable."""
        if self._recording is None:
            raise RuntimeError("capture_end() without a capture_begin(): this CUDA graph is not capturing")
        recording, self._recording = self._recording, None
        self._graph = recording.end()

    def replay(self) -> None:
        """Run the captured work again, on the current stream."""
        from tilewise.backends.cuda.runtime import current_stream

        if self._graph is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        self._graph.replay(current_stream(self._graph.device).handle)

    def reset(self) -> None:
        """Free the graph and its pool's claim; the graph can be captured again."""
        if self._graph is not None:
            self._graph.release()
            self._graph = None

    def pool(self) -> _PoolHandle:
        """The handle of this graph's memory pool, for another capture to share."""
        if self._pool is None:
            raise RuntimeError("pool() is known only once capture_begin() has been called")
        return _handle(self._pool)

    def enable_debug_mode(self) -> None:
        """Accepted for torch's API; tilewise keeps no debug copy of the graph."""

    def debug_dump(self, debug_path: str) -> None:
        raise RuntimeError("debug_dump: tilewise keeps no debug copy of a CUDA graph (enable_debug_mode is accepted "
                           "and does nothing)")


def _synchronize() -> None:
    from tilewise.backends.cuda.runtime import current_device, synchronize

    synchronize(current_device())


def _empty_cache() -> None:
    from tilewise.backends.cuda import memory
    from tilewise.backends.cuda.runtime import current_device

    mem = memory(current_device())
    mem.release_free_lists()
    mem.allocator.empty_cache()


class graph:  # noqa: N801 — torch's name
    """``with graph(g): ...`` captures the block's work into ``g`` on a side stream (``stream``), after
    synchronising, collecting garbage and emptying the cache, as torch's does."""

    default_capture_stream = None

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global") -> None:
        from tilewise.backends.cuda.runtime import Stream

        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode
        self._stream_context = None

    def __enter__(self) -> None:
        from tilewise.backends.cuda.runtime import stream as using

        _synchronize()
        gc.collect()
        _empty_cache()
        self._stream_context = using(self.capture_stream)
        self._stream_context.__enter__()
        try:
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_context.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> bool:
        try:
            if exc[0] is not None and self.cuda_graph._recording is not None:  # the block raised: end, keep its error
                recording, self.cuda_graph._recording = self.cuda_graph._recording, None
                try:
                    recording.end(exc[1])
                except Exception:  # noqa: BLE001, S110 — the block's own error is the one to see
                    pass
            else:
                self.cuda_graph.capture_end()
        finally:
            self._stream_context.__exit__(*exc)
        return False
