"""cuDNN's attention engines loaded on a thread of their own while a compile for CUDA works on the host.

[Note: libraries warmed while compiling] A process's first cuDNN attention graph costs 0.5-1.8 s more than the
next one (cuDNN loads its engines and compiles their kernels), whatever its shapes. A compile that sees, once the
CUDA target's passes have kept its library calls whole, that its programs will call cuDNN's attention starts
(:func:`start`) a thread that makes the cuDNN handle and builds small graphs of the same kinds (dtype, heads, head
dim, causal mask), once per process and device, while the compiler's passes, fusion, code generation and NVRTC
run. The program's first run waits for that thread (``CudaRuntime.run``) before it calls any library, so the
handle is never used from two of tilewise's threads at once. Nothing warmed is kept but the handle: the small
graphs are dropped. A warm-up that fails costs nothing but its time: the first call then builds as it would have
(``TILEWISE_LOG=compile`` says so).

What it buys is bounded by the interpreter's lock, which cuDNN's frontend holds for part of a build: the compile's
own host stages run slower meanwhile (by about 0.5 s for GPT-2's step). Measured on GPT-2's first compiled step
(H200 host, two runs each, RESULTS.md): 6.17 / 4.74 s without, 4.94 / 5.22 s with; the first attention graphs,
which cost 0.47-1.5 s inside the first run, cost 0.1 s there. cuBLASLt is not warmed: importing its bindings (over
a second) is Python work, which a thread only shares the lock with (warming it too measured the same, 4.95 /
5.03 s); nor are convolutions: small convolution graphs held the lock long enough to slow a ViT's compile by more
than a second, and its first convolution graphs cost as much afterwards.
``TILEWISE_WARM_LIBRARIES=0`` turns it off."""

from __future__ import annotations

import threading

from tilewise.config import log, settings
from tilewise.device import Device

_done: set[tuple] = set()  # (device index, item) warmed or being warmed in this process
_lock = threading.Lock()


def wanted(graphs: list) -> list[tuple]:
    """The kinds of cuDNN attention ``graphs`` (a compile's, after the CUDA target's passes kept the library calls
    whole) will call: ("attention", dtype, heads, key/value heads, head dim, causal), each once."""
    from tilewise.backends.cuda import attention

    items: dict[tuple, None] = {}
    for graph in graphs:
        for node in graph.body:
            if node.op == attention.FORWARD:
                args = node.bound_args([s.type for s in node.srcs])
                if attention.keeps(node.op, args):
                    query, key = args[0], args[1]
                    items[("attention", query.dtype, query.shape[1], key.shape[1], query.shape[-1],
                           bool(args[5]))] = None
    return list(items)


def start(device: Device, graphs: list) -> threading.Thread | None:
    """Warm, on a thread of its own, what ``graphs`` will call on ``device`` and this process has not warmed yet;
    the thread, to be joined before the programs' first runs, or None when there is nothing to warm."""
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
    thread = threading.Thread(target=_warm, args=(items, Device("cuda", index)), name="tilewise-warm-libraries",
                              daemon=True)
    thread.start()
    return thread


def _warm(items: list[tuple], device: Device) -> None:
    from tilewise.backends.cuda import attention
    from tilewise.backends.cuda.runtime import ensure_context

    for item in items:
        try:
            ensure_context(device.index)
            attention.warm(*item[1:], device.index)
        except Exception as e:  # noqa: BLE001 — the first call builds as it would have
            log("compile", f"warming {item} failed (its first call pays for it): {e}")
