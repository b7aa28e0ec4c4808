"""One CUDA kernel launched from tilewise and from torch: the cost of tilewise's launch path and custom operators.

The fused RMSNorm forward of ``examples/custom_kernels.py`` is compiled once by ``tilewise.cuda.load_inline``
(NVRTC); the same cubin is launched
  * from tilewise: ``module.rms_norm_forward(x, w, y, rstd, ..., grid=, block=)`` on tilewise tensors, and as the
    custom operator ``ext::rms_norm`` (binder, dispatcher, the kernel function, the fake check done once);
  * from torch: the cubin loaded with cuda-python's driver bindings and launched with ``cuLaunchKernel`` on torch
    tensors' ``data_ptr()`` on torch's current stream (torch's ``load_inline`` needs nvcc; this is the same
    machine code, so only the host paths differ); beside it, torch's own ``torch.nn.functional.rms_norm``.
Host cost: microseconds per call over bursts of back-to-back calls, the device synchronised after each burst.
Device time: CUDA-event milliseconds per call. Both are medians of alternating blocks (tilewise, torch, ...) so
that both run at the same clocks. The line "kernel device time" gives tilewise's launch over torch's (the target:
within 3%).

Second part, the custom operator inside a compiled step: a training step of ``examples/custom_kernels.py``'s block
(RMSNorm, two linear layers, GELU, MSE loss, backward, AdamW) compiled by ``tilewise.compile``, with the norm as
the custom operator ``ext::rms_norm`` (its forward and backward the CUDA C kernels) and, beside it, the same step
with the norm written in tilewise operators (fused by the compiler). Each runs as a CUDA graph (the program
captured once, replayed per call) and with graphs off (its steps launched one by one); host microseconds per call
as above (the time to queue a burst of calls, the device synchronised after it) and CUDA-event device time. The
target: the captured step with the custom operator costs the host no more than the captured step without it.

    python benchmarks/custom_ops.py [--rows 4096] [--cols 4096] [--repeats 7] [--width 256] [--batch 64]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import statistics
import time
from pathlib import Path

import torch

import tilewise as tw

ROOT = Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("custom_kernels", ROOT / "examples" / "custom_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torch_launcher(cubin: bytes, name: str):
    """``launch(grid, block, args, types)`` of the cubin's kernel through cuda-python, on torch's current stream."""
    from cuda.bindings import driver

    torch.cuda.init()
    status, module = driver.cuModuleLoadData(cubin)
    assert int(status) == 0, status
    status, function = driver.cuModuleGetFunction(module, name.encode())
    assert int(status) == 0, status

    def launch(grid: int, block: int, args: tuple, types: tuple) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        (status,) = driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, (args, types), 0)
        assert int(status) == 0, status

    launch.module = module  # keeps it loaded
    return launch


def _host_us(fn, sync, calls: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def _device_ms(fn, event, calls: int) -> float:
    start, end = event(), event()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _queue_us(fn, calls: int) -> float:
    """Host microseconds per call to queue ``calls`` calls back to back (the device synchronised before and after)."""
    tw.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    queued = time.perf_counter() - start
    tw.cuda.synchronize()
    return queued / calls * 1e6


def _training_step(example, norm, width: int, batch: int, graphs: bool):
    """A compiled training step of the example's block with ``norm``, warmed up (compiled, captured where
    ``graphs``); returns the call and its last program's runtime."""
    tw.manual_seed(0)
    model = example.Block(width, norm).to("cuda")
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = tw.randn(batch, width, device="cuda"), tw.randn(batch, width, device="cuda")

    @tw.compile
    def step(x, y):
        loss = tw.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for _ in range(2):  # the first call makes the optimizer's state, the second runs the steady-state variant
        step(x, y)
    if not graphs:  # before the third call, which would capture
        for program in step.programs():
            program.runtime.use_graphs = False
    for _ in range(3):
        step(x, y)
    runtime = step.programs()[-1].runtime
    return (lambda: step(x, y)), runtime


def compiled_steps(example, width: int, batch: int, repeats: int, calls: int) -> None:
    """Host and device time per call of the compiled training step, with and without the custom operator, captured
    into a CUDA graph and not."""
    eps = 1e-6
    norms = {"ext::rms_norm (custom operator)": lambda x, w: example.rms_norm(x, w, eps)[0],
             "rms_norm in tilewise operators": lambda x, w: example.reference_rms_norm(x, w, eps)}
    cases = {}
    for label, norm in norms.items():
        for graphs in (True, False):
            cases[(label, graphs)] = _training_step(example, norm, width, batch, graphs)
    host = {key: [] for key in cases}
    device = {key: [] for key in cases}
    event = lambda: tw.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        for key, (fn, _) in cases.items():
            host[key].append(_queue_us(fn, calls))
            device[key].append(_device_ms(fn, event, calls))
    print(f"compiled training step of the example's block (width {width}, batch {batch}, AdamW), "
          f"medians of {repeats} alternating blocks of {calls} calls")
    for (label, graphs), (_, runtime) in cases.items():
        how = (f"CUDA graph ({runtime.replays} replays)" if graphs and not runtime.why_not else
               "graphs off" if not graphs else f"NOT captured: {runtime.why_not}")
        steps = len(runtime.program.steps)
        h, d = statistics.median(host[(label, graphs)]), statistics.median(device[(label, graphs)])
        print(f"  {label:32s} {how:24s} {steps:4d} steps   host {h:8.2f} us/call   device {d * 1e3:8.2f} us/call")
    custom, reference = norms
    with_op = statistics.median(host[(custom, True)])
    without = statistics.median(host[(reference, True)])
    print(f"wall time per call of the captured step: {with_op:.2f} us with the custom operator, {without:.2f} us "
          f"with the norm in tilewise operators ({with_op - without:+.2f} us, device time included)")
    # a captured call is one graph launch: what the host adds beyond the device's work is wall - device time
    beyond = {key: statistics.median(host[key]) - statistics.median(device[key]) * 1e3 for key in host}
    print(f"host time beyond the device's per captured call: {beyond[(custom, True)]:+.2f} us with the custom "
          f"operator, {beyond[(reference, True)]:+.2f} us without it: the custom operator adds "
          f"{beyond[(custom, True)] - beyond[(reference, True)]:+.2f} us of host cost per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if not (tw.cuda.is_available() and torch.cuda.is_available()):
        print("custom_ops: needs a CUDA GPU (and torch built with CUDA); nothing measured")
        return

    example = _example()
    module = tw.cuda.load_inline("rms_norm", example.RMS_NORM_CUDA, ["rms_norm_forward", "rms_norm_backward"])
    example.register_cuda_kernels(module)
    rows, cols, eps, block = args.rows, args.cols, 1e-6, example.BLOCK

    x = tw.randn(rows, cols, device="cuda")
    w = tw.rand(cols, device="cuda")
    y, rstd = tw.empty_like(x), tw.empty(rows, device="cuda")
    tx, tw_ = torch.from_dlpack(x), torch.from_dlpack(w)  # the same memory, seen by torch
    ty, trstd = torch.empty_like(tx), torch.empty(rows, device="cuda")
    launch = _torch_launcher(module.cubin, module.rms_norm_forward.lowered_name)
    types = (ctypes.c_void_p,) * 4 + (ctypes.c_int, ctypes.c_float)

    cases = {
        "tilewise: module.kernel(...)": lambda: module.rms_norm_forward(x, w, y, rstd, cols, eps, grid=rows,
                                                                        block=block),
        "torch tensors: cuLaunchKernel": lambda: launch(rows, block, (tx.data_ptr(), tw_.data_ptr(), ty.data_ptr(),
                                                                      trstd.data_ptr(), cols, eps), types),
        "tilewise: custom op ext::rms_norm": lambda: example.rms_norm(x, w, eps),
        "torch: F.rms_norm (its own kernel)": lambda: torch.nn.functional.rms_norm(tx, (cols,), tw_, eps),
    }
    sync = {name: (tw.cuda.synchronize if name.startswith("tilewise") else torch.cuda.synchronize) for name in cases}
    event = {name: ((lambda: tw.cuda.Event(enable_timing=True)) if name.startswith("tilewise") else
                    (lambda: torch.cuda.Event(enable_timing=True))) for name in cases}
    for name, fn in cases.items():  # warm-up: compile, load, the custom op's first-call fake check
        for _ in range(5):
            fn()
        sync[name]()
    module.rms_norm_forward(x, w, y, rstd, cols, eps, grid=rows, block=block)
    launch(rows, block, (tx.data_ptr(), tw_.data_ptr(), ty.data_ptr(), trstd.data_ptr(), cols, eps), types)
    torch.cuda.synchronize()
    difference = float((tw.from_dlpack(ty) - y).abs().max())

    host = {name: [] for name in cases}
    device = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            host[name].append(_host_us(fn, sync[name], args.calls))
            device[name].append(_device_ms(fn, event[name], args.calls))

    print(f"{torch.cuda.get_device_name()}: rms_norm forward, {rows}x{cols} float32 "
          f"(same cubin both ways: largest difference {difference:.1e}); {module.rms_norm_forward.describe()}")
    print(f"medians of {args.repeats} alternating blocks of {args.calls} calls")
    nbytes = 2 * rows * cols * 4
    for name in cases:
        h, d = statistics.median(host[name]), statistics.median(device[name])
        spread = (max(host[name]) - min(host[name])) / h * 100
        print(f"  {name:38s} host {h:8.2f} us/call (spread {spread:4.0f}%)   device {d * 1e3:8.2f} us/call "
              f"({nbytes / d / 1e6:7.1f} GB/s)")
    ours = statistics.median(device["tilewise: module.kernel(...)"])
    theirs = statistics.median(device["torch tensors: cuLaunchKernel"])
    print(f"kernel device time, launched from tilewise / from torch: {ours / theirs:.4f} "
          f"({(ours / theirs - 1) * 100:+.2f}%; target within 3%)")
    print()
    compiled_steps(example, args.width, args.batch, args.repeats, args.calls)


if __name__ == "__main__":
    main()
