"""Many kernels compiled at once: NVRTC on the process's pool of threads, or one after another.

[Note: parallel compiles] A program's kernels are independent compiles, and NVRTC holds no Python lock while it
works: ``nvrtcCompileProgram`` releases the GIL, so a compile beside a thread running Python takes what it takes
alone, and on the 2-core host two threads compile a GPT-2 training step's 34 texts in 2.14 s against 3.93 s one
after another (two processes: 2.31 s). So threads, not processes: nothing to start, import or pickle, and the
kernel cache in memory is shared. The pool is the process's, made at the first compile that wants one, with a
thread per CPU the process may run on, at most ``MAX_THREADS`` (``TILEWISE_COMPILE_THREADS`` sets the number);
every program, ``explain`` and autotuning's candidates go through it. The longest texts are handed out first: a
program's compile ends with its slowest kernel, and started last that one would run alone at the end.

``TILEWISE_COMPILE_THREADS=1`` is the serial fallback: each kernel is compiled in the calling thread, one after
another, in the order given. Both give the same bytes (NVRTC's output depends only on the source and options,
which is what the kernel cache's key holds; the tests compare them), and the kernel cache stays correct either way:
a key another thread is compiling is waited for, not compiled twice, and each disk entry is written atomically.
A compile asked for from one of the pool's own threads runs in that thread (waiting on the pool from inside it
could wait forever), and a child process made by ``fork`` makes a pool of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

from tilewise.codegen.toolchain.cache import KernelCache, default_cache
from tilewise.codegen.toolchain.nvrtc import CompiledKernel
from tilewise.config import settings

MAX_THREADS = 32  # each NVRTC compile takes up to a few hundred MB: beyond this, memory rather than time

_pool: ThreadPoolExecutor | None = None
_pool_threads = 0
_pool_lock = threading.Lock()
_in_pool = threading.local()


def compile_threads() -> int:
    """How many kernels compile at once: ``TILEWISE_COMPILE_THREADS`` if set (1: one after another), else one per
    CPU this process may run on, at most ``MAX_THREADS``."""
    if settings.compile_threads > 0:
        return settings.compile_threads
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def start_compile(source: str, name: str, arch: str, cache: KernelCache | None = None) -> Future:
    """The kernel ``name`` of ``source`` compiling for ``arch`` through the kernel cache, on the pool; with one
    compile thread, or asked from a pool thread, it is compiled in the thread that first asks for its result."""
    cache = cache if cache is not None else default_cache()
    threads = compile_threads()
    if threads == 1 or getattr(_in_pool, "inside", False):
        return _Deferred(cache.compile, source, name, arch)
    return _shared_pool(threads).submit(cache.compile, source, name, arch)


GROUP_FIXED_CHARS = 6000  # what one compile costs beyond its text, in characters of text (NVRTC's start-up)


def compile_groups(sources: Sequence[str], threads: int) -> list[list[int]]:
    """The positions of ``sources`` in groups to compile as one translation unit each: one group per source when
    there are no more sources than ``threads``, else ``threads`` groups of about equal cost (largest first into
    the cheapest group), each in the order given.

    [Note: kernels compiled together] Each NVRTC compile pays a start-up beside its text's own work: on one core,
    the 8 smallest kernels of a ViT-B/16 training step took 2.76 s one by one and 0.91 s as one unit, 8 of its
    middle-sized ones 6.30 and 3.96 s. With more texts than compile threads, a program's first run waits for the
    sum of the compiles spread over the threads, so its texts are compiled in as many units as there are threads:
    a generated text guards every definition it shares with others (``TW_VEC_DEFINED``, ``TW_HELPER_*``), so texts
    concatenate. A unit that fails to compile is compiled text by text when its kernels are asked for, so an error
    names its own kernel."""
    if len(sources) <= threads:
        return [[k] for k in range(len(sources))]
    loads = [0] * threads
    groups: list[list[int]] = [[] for _ in range(threads)]
    for k in sorted(range(len(sources)), key=lambda k: len(sources[k]), reverse=True):
        cheapest = loads.index(min(loads))
        groups[cheapest].append(k)
        loads[cheapest] += len(sources[k]) + GROUP_FIXED_CHARS
    return [sorted(group) for group in groups if group]


def finished(futures: Sequence[Future]) -> Iterator[int]:
    """The positions of ``futures`` as each is done (those compiled on asking: in order, each compiled then).
    A compile error is raised when its kernel comes up; the compiles not yet started are then dropped."""
    if any(isinstance(f, _Deferred) for f in futures):
        for k, future in enumerate(futures):
            future.result()
            yield k
        return
    position = {future: k for k, future in enumerate(futures)}
    try:
        for future in as_completed(position):
            future.result()
            yield position[future]
    finally:
        for future in futures:
            future.cancel()


def compile_each(units: Sequence[tuple[str, str]], arch: str, cache: KernelCache | None = None
                 ) -> Iterator[tuple[int, CompiledKernel]]:
    """Compile each (kernel name, CUDA source) of ``units`` for ``arch`` through the kernel cache, yielding
    (its position in ``units``, the compiled kernel) as each is done: on the pool, longest source first, or one
    after another in the calling thread (see [Note: parallel compiles])."""
    order = sorted(range(len(units)), key=lambda k: len(units[k][1]), reverse=True)
    futures: list[Future | None] = [None] * len(units)
    for k in order:
        futures[k] = start_compile(units[k][1], units[k][0], arch, cache)
    for k in finished(futures):
        yield k, futures[k].result()


def compile_all(units: Sequence[tuple[str, str]], arch: str, cache: KernelCache | None = None
                ) -> list[CompiledKernel]:
    """:func:`compile_each`'s kernels in the order of ``units``."""
    out: list[CompiledKernel | None] = [None] * len(units)
    for k, kernel in compile_each(units, arch, cache):
        out[k] = kernel
    return out  # type: ignore[return-value]


class _Deferred(Future):
    """A compile that runs in the thread first asking for its result (the serial fallback)."""

    def __init__(self, fn, *args) -> None:
        super().__init__()
        self._call = (fn, args)

    def result(self, timeout: float | None = None):
        if self._call is not None:
            fn, args = self._call
            self._call = None
            try:
                self.set_result(fn(*args))
            except BaseException as exc:
                self.set_exception(exc)
        return super().result(timeout)


def _shared_pool(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_threads
    with _pool_lock:
        if _pool is None or _pool_threads != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="tilewise-compile", initializer=_mark_pool_thread)
            _pool_threads = threads
        return _pool


def _mark_pool_thread() -> None:
    _in_pool.inside = True


def _forget_pool_in_child() -> None:
    """After ``fork`` the parent's threads are gone from the child: its pool would take work and never run it."""
    global _pool, _pool_threads, _pool_lock
    _pool, _pool_threads, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)
