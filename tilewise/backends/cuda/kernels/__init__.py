"""Eager CUDA kernels: the per-operator registry, and loading and launching generated kernels.

[Note: eager CUDA kernels]
Pointwise and reduction operators need no entry here: their kernels are built from the operator's
declared ``Expr`` or combiner as kernel IR (``pointwise.py``, ``reduction.py``), specialised on dtypes, rank
and contiguity, with sizes and strides as run-time arguments, so one compile serves every shape, and are
scheduled and rendered by ``codegen`` exactly as the compiler's fused kernels are. Operators
whose meaning is not an expression (copies, creation, random, indexing, matmul) register a function here
with :func:`kernel`, taking ``(device, *bound_args)``. Those whose single result can be written into a tensor
the caller provides also register that form with :func:`kernel_into` (see [Note: kernels into a given
output]). :func:`load` turns a kernel's source into a
loaded function once per device (NVRTC, then the memory/disk cache of ``codegen.toolchain``), and
:func:`launch` runs it on the current stream; ``TILEWISE_LOG=kernels`` prints each kernel's name, source
and launch shape at its first launch.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tilewise._cuda_api import check, driver_api
from tilewise.backends.cuda.runtime.device import _thread_state, ensure_context
from tilewise.backends.cuda.runtime.module import _pack
from tilewise.config import log, settings

KERNELS: dict[str, Callable] = {}  # operator full name -> fn(device, *bound_args)
INTO: dict[str, Callable] = {}  # operator full name -> fn(out, *bound_args) -> bool (see kernel_into)
PREPARE: dict[str, Callable] = {}  # operator full name -> fn(out, *bound_args) -> None (kernel_into's prepare)

_functions: dict[tuple[str, str, int], Any] = {}
_launched: set[int] = set()
_lock = threading.Lock()


def kernel(*names: str):
    def register(fn: Callable) -> Callable:
        for name in names:
            if name in KERNELS:
                raise ValueError(f"CUDA kernel for {name} registered twice")
            KERNELS[name] = fn
        return fn

    return register


def kernel_into(*names: str, prepare: Callable | None = None):
    """Register ``fn(out, *bound_args) -> bool``, which writes an operator's result into ``out``, and with it
    ``prepare(out, *bound_args) -> None``, which a compiled program calls once when it is built, on tensors that
    stand for the step's operands and outputs (their geometry, dtype and device, at addresses where nothing is),
    to build ahead what ``fn`` will need for them (see [Note: library calls prepared at build]).

    [Note: kernels into a given output]
    A compiled program gives every value a planned buffer, and replays its steps from a CUDA graph, which
    bakes in every address a kernel touches. An operator the compiler runs as a library call can join such
    a graph only if it writes straight into its planned buffer, allocates nothing (a temporary from the
    caching allocator would be handed to someone else while the graph still writes it) and reads nothing
    back to the host. A function registered here promises exactly that: it launches kernels on the current
    stream that write ``out`` (a dense tensor of the result's shape and dtype, on the inputs' device,
    sharing no memory with them). When the arguments would need a temporary (an index to convert to
    int64, a value to move to the device, ...) it writes nothing and returns False, and the caller runs
    the ordinary kernel instead. The eager kernels of these operators are the same functions behind an
    ``empty`` output, so both paths run the same code."""

    def register(fn: Callable) -> Callable:
        for name in names:
            if name in INTO:
                raise ValueError(f"CUDA kernel into an output for {name} registered twice")
            INTO[name] = fn
            if prepare is not None:
                PREPARE[name] = prepare
        return fn

    return register


def load(source: str, name: str, device: int):
    """The kernel ``name`` of ``source``, compiled for ``device``'s architecture and loaded there."""
    key = (source, name, device)
    fn = _functions.get(key)
    if fn is not None:
        return fn
    from tilewise.backends.cuda.runtime import get_device_properties
    from tilewise.backends.cuda.runtime.module import load_module
    from tilewise.codegen.toolchain import compile_cached

    with _lock:
        fn = _functions.get(key)
        if fn is None:
            compiled = compile_cached(source, name, get_device_properties(device).arch)
            fn = load_module(compiled.cubin, device).get_function(name)
            fn.source = source
            _functions[key] = fn
    return fn


_rendered: dict = {}


def load_rendered(render, *key, device: int, name: str | None = None):
    """The kernel ``render`` describes for ``key``, loaded on ``device``: ``render(*key)`` returns (name, source),
    or, for a kernel the caller names, ``render(name, *key)`` returns its source. Rendering is pure, so it runs
    once per specialisation and device, not at every launch (:func:`load`'s own key is the whole source)."""
    cache_key = (render, name, *key, device)
    fn = _rendered.get(cache_key)
    if fn is None:
        if name is None:
            name, text = render(*key)
        else:
            text = render(name, *key)
        fn = _rendered[cache_key] = load(text, name, device)
    return fn


def launch(fn, grid, block, args: Sequence[Any], stream: int, shared_mem: int = 0) -> None:
    """Launch on ``stream``; the first launch of each kernel is logged under ``TILEWISE_LOG=kernels``.

    The arguments are packed by the toolchain's packer and handed to ``cuLaunchKernel`` directly: this is
    the hot path of every eager op, so it skips re-validating what the kernel's plan already fixed."""
    if "kernels" in settings.log and id(fn) not in _launched:
        _launched.add(id(fn))
        log("kernels", f"{fn.name}  grid={grid} block={block} shared={shared_mem}\n{fn.source}")
    device = fn.module.device
    if _thread_state.context_device != device:
        ensure_context(device)
    gx, gy = (grid, 1) if type(grid) is int else grid
    bx, by = (block, 1) if type(block) is int else block
    params = _pack(fn, args)
    result = (_launch_kernel or _bind_launch())(fn._driver_handle, gx, gy, 1, bx, by, 1, shared_mem, stream, params, 0)
    if int(result[0]):
        check(result, f"cuLaunchKernel({fn.name})")


def launch_packed(fn, grid: int, block: int, packer, args: Sequence[Any], stream: int) -> None:
    """:func:`launch` of a 1-D grid for a caller that fixed its argument types once: ``packer`` is the
    struct :func:`packer_for` gave for them, so a call skips working out how to pack (the eager pointwise
    plans launch through here: [Note: pointwise plans])."""
    if "kernels" in settings.log and id(fn) not in _launched:
        _launched.add(id(fn))
        log("kernels", f"{fn.name}  grid={grid} block={block} shared=0\n{fn.source}")
    if _thread_state.context_device != fn.module.device:
        ensure_context(fn.module.device)
    buffer, _, params = fn._scratch()
    try:
        packer.pack_into(buffer, 0, *args)
    except struct.error:  # a value this format cannot hold: the general packer takes it
        launch(fn, grid, block, args, stream)
        return
    result = _launch_kernel(fn._driver_handle, grid, 1, 1, block, 1, 1, 0, stream, params, 0)
    if int(result[0]):
        check(result, f"cuLaunchKernel({fn.name})")


def packer_for(fn, args: Sequence[Any]):
    """The struct that packs arguments of the types of ``args`` for ``fn`` (None when values of these types
    need the general packer, say an unsigned parameter), for :func:`launch_packed`."""
    _pack(fn, args)  # reads the parameter layout and builds the packer for these types once
    _bind_launch()
    return fn._packers.get(tuple(map(type, args)))


_launch_kernel = None


def _bind_launch():
    global _launch_kernel
    _launch_kernel = driver_api().cuLaunchKernel
    return _launch_kernel


_SPIN = """extern "C" __global__ void __launch_bounds__(1) tw_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


def spin(cycles: int, device: int, stream: int) -> None:
    """Queue one thread that spins for ``cycles`` of the GPU's clock on ``stream``.

    Kernels queued behind it while it spins run back to back when it ends, so the time between events around
    them is their device time even where the host takes longer to queue one than the device takes to run it
    (how GEMM candidates of a few microseconds are timed; ``tilewise.cuda._sleep`` for benchmarks)."""
    launch(load(_SPIN, "tw_spin", device), 1, 1, [int(cycles)], stream)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
