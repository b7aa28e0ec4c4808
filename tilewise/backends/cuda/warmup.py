"""GPU libraries loaded on a thread of their own while a compile for CUDA works on the host.

[Note: libraries warmed while compiling] A process's first call into cuBLASLt costs over a second (importing its
bindings loads the library), and its first cuDNN attention or convolution graph a second more than the next one
(cuDNN loads its engines and compiles their kernels); measured on an H200 host, a GPT-2 training step's first
compiled call spent 2-3 s of its 5-6 s there. Those costs do not depend on the program's shapes, so a compile
that sees, once the CUDA target's passes have kept its library calls whole, which libraries its programs will
call (GEMMs; attention and convolutions that cuDNN runs) starts (:func:`start`) a thread that makes the
handles and builds small graphs of the same kinds (dtype, heads, head dim, causal mask; spatial dims), once per
process and device, while the compiler's passes, fusion, code generation and NVRTC run. The program's first run
waits for that thread (``CudaRuntime.run``) before it calls any library, so a handle is never used from two of
tilewise's threads at once. Nothing warmed is kept but the handles: the small graphs are dropped. A warm-up that
fails costs nothing but its time: the first call then builds as it would have (``TILEWISE_LOG=compile`` says so).
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
    ("gemm", dtype), ("attention", dtype, heads, key/value heads, head dim, causal) and ("convolution", dtype,
    spatial dims) items, each once."""
    from tilewise.backends.cuda import attention, convolution
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
            elif op in convolution._KEPT:
                args = node.bound_args([s.type for s in node.srcs])
                if convolution.keeps(op, args):
                    items[("convolution", args[0].dtype, len(args[0].shape) - 2)] = None
    return list(items)


def start(device: Device, graphs: list) -> threading.Thread | None:
    """Warm, on a new thread, what ``graphs`` will call on ``device`` and this process has not warmed yet; the
    thread (to be joined before the programs' first runs), or None when there is nothing to warm."""
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
    from tilewise.backends.cuda import attention, convolution, matmul
    from tilewise.backends.cuda.runtime import ensure_context

    ensure_context(device.index)
    for item in items:
        try:
            if item[0] == "gemm":
                matmul.warm(item[1], device)
            elif item[0] == "attention":
                attention.warm(*item[1:], device.index)
            else:
                convolution.warm(*item[1:], device.index)
        except Exception as e:  # noqa: BLE001 — the first call builds as it would have
            log("compile", f"warming {item} failed (its first call pays for it): {e}")
