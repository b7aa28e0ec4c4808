"""GPU libraries loaded on a thread of their own while a compile for CUDA works on the host.

[Note: libraries warmed while compiling] A process's first call into cuBLASLt costs over a second (importing its
bindings loads the library), and its first cuDNN attention graph a second more than the next one (cuDNN loads its
engines and compiles their kernels); measured on an H200 host, a GPT-2 training step's first compiled call spent
2-3 s of its 5-6 s there. Those costs do not depend on the program's shapes, so a compile that sees, once the
CUDA target's passes have kept its library calls whole, which libraries its programs will call (GEMMs; attention
that cuDNN runs) starts (:func:`start`) a thread per library that makes its handle and runs a small GEMM, or builds
small graphs of the same kind (dtype, heads, head dim, causal mask), once per process and device, while the
compiler's passes, fusion, code generation and NVRTC run. The program's first run waits for those threads
(``CudaRuntime.run``) before it calls any library, so a handle is never used from two of tilewise's threads at
once. Nothing warmed is kept but the handles: the small graphs are dropped. A warm-up that fails costs nothing
but its time: the first call then builds as it would have (``TILEWISE_LOG=compile`` says so).

What it buys is bounded by the interpreter's lock: importing cuBLASLt's bindings is Python work (nvmath imports
its whole package), and cuDNN's frontend holds the lock for part of a build, so the compile's own host stages run
slower meanwhile (by 0.5-1 s for GPT-2's step). Measured on GPT-2's first compiled step (H200 host, two runs
each, RESULTS.md): 6.17 / 4.74 s without, 4.95 / 5.03 s with; the first cuDNN attention graph, which cost 0.47 to
1.5 s inside the first run, costs 0.1 s there.
``TILEWISE_WARM_LIBRARIES=0`` turns it off."""

from __future__ import annotations

import threading

from tilewise.config import log, settings
from tilewise.device import Device

GEMM_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation"})

_done: set[tuple] = set()  # (device index, item) warmed or being warmed in this process
_lock = threading.Lock()


def wanted(graphs: list) -> list[tuple]:
    """What ``graphs`` (a compile's, after the CUDA target's passes kept the library calls whole) will call:
    ("gemm", dtype) and ("attention", dtype, heads, key/value heads, head dim, causal) items, each once.

    Convolutions are not warmed: measured on a ViT's step, building small convolution graphs on the warming thread
    held the interpreter's lock long enough to slow the compile's own host work by more than a second, and the
    program's first convolution graphs cost as much afterwards."""
    from tilewise.backends.cuda import attention
    from tilewise.backends.cuda.matmul import SUPPORTED

    items: dict[tuple, None] = {}
    for graph in graphs:
        for node in graph.body:
            op = node.op
            if op in GEMM_OPS and not node.is_tuple and node.type.dtype.name in SUPPORTED:
                items[("gemm", node.type.dtype)] = None
            elif op == attention.FORWARD:
                args = node.bound_args([s.type for s in node.srcs])
                if attention.keeps(op, args):
                    query, key = args[0], args[1]
                    items[("attention", query.dtype, query.shape[1], key.shape[1], query.shape[-1],
                           bool(args[5]))] = None
    return list(items)


def start(device: Device, graphs: list) -> Warming | None:
    """Warm, on threads of their own (one per library), what ``graphs`` will call on ``device`` and this process has
    not warmed yet; the threads, to be joined before the programs' first runs, or None when there is nothing to
    warm."""
    if not settings.warm_libraries or device is None or device.type != "cuda":
        return None
    index = device.index or 0
    try:
        items = wanted(graphs)
    except Exception as e:  # noqa: BLE001 — only an optimisation: the first run loads what it calls
        log("compile", f"the libraries to warm could not be worked out: {e}")
        return None
    with _lock:
        items = [item for item in items if (index, item) not in _done]
        _done.update((index, item) for item in items)
    if not items:
        return None
    by_library: dict[str, list[tuple]] = {}
    for item in items:  # one thread per library: its handle is used by one thread at a time
        by_library.setdefault(item[0], []).append(item)
    threads = [threading.Thread(target=_warm, args=(group, Device("cuda", index)), name="tilewise-warm-libraries",
                                daemon=True) for group in by_library.values()]
    for thread in threads:
        thread.start()
    return Warming(threads)


class Warming:
    """The threads warming a compile's libraries."""

    def __init__(self, threads: list[threading.Thread]):
        self.threads = threads

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


def _warm(items: list[tuple], device: Device) -> None:
    from tilewise.backends.cuda import attention, matmul
    from tilewise.backends.cuda.runtime import ensure_context

    for item in items:
        try:
            ensure_context(device.index)
            if item[0] == "gemm":
                matmul.warm(item[1], device)
            else:
                attention.warm(*item[1:], device.index)
        except Exception as e:  # noqa: BLE001 — the first call builds as it would have
            log("compile", f"warming {item} failed (its first call pays for it): {e}")
