"""Eager CUDA performance, tilewise beside torch in one process: per-op cost, bandwidth, GEMM.

* per-op cost: the host's time to issue a tiny tensor op, in bursts (torch's figure, 9.3 us/op on an H200, is
  the target);
* bandwidth: large pointwise ops, row reductions, softmax and its backward, as GB/s and as a share of the
  device copy bandwidth measured here (bytes read + written); eager softmax and its backward each run as
  one kernel compiled from their decompositions;
* GEMM: TFLOP/s over a suite of shapes and dtypes, and linear + bias + GELU through the cuBLASLt epilogue.

Device times are CUDA-event medians after warm-up, on random inputs, torch's and ours timed in alternating
blocks so that both run at the same clocks.

    python benchmarks/cuda_eager.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import numpy as np
import torch

import tilewise as tw
from tilewise.ops.registry import OPS


def _block_ms(fn, events, inner: int, hold_cycles: int) -> float:
    """Mean milliseconds per call of ``inner`` back-to-back calls, by events.

    One call is queued first, then a kernel that spins for ``hold_cycles`` GPU clock cycles; the host queues
    the timed calls while it spins, so they run back to back. What is timed is the device time per call: a
    20 us reduction would otherwise be timed at the host's rate of queueing it wherever that is slower (the
    host cost per call is the per-op case's figure)."""
    (start, end), sleep = events()
    fn()
    if hold_cycles:
        sleep(hold_cycles)
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / inner


def _torch_events():
    return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)), torch.cuda._sleep


def _tw_events():
    return (tw.cuda.Event(enable_timing=True), tw.cuda.Event(enable_timing=True)), tw.cuda._sleep




def _warm(fn, sync, warmup: int, inner: int) -> int:
    """Run ``fn`` ``warmup`` times; the spin, in cycles, that outlasts queueing ``inner`` calls twice over."""
    for _ in range(warmup):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    queued_us = (time.perf_counter() - t) * 1e6
    sync()
    # cycles of the top clock: at a lower one the spin lasts longer, never shorter
    return int((2 * queued_us + 50) * tw.cuda.get_device_properties().clock_rate_khz / 1000)


def device_ms(fn, events, sync, warmup: int = 3, repeats: int = 15, inner: int = 5) -> float:
    """Median over ``repeats`` of :func:`_block_ms`, in milliseconds."""
    hold = _warm(fn, sync, warmup, inner)
    return statistics.median(_block_ms(fn, events, inner, hold) for _ in range(repeats))


def torch_ms(fn, **kw) -> float:
    return device_ms(fn, _torch_events, torch.cuda.synchronize, **kw)


def tw_ms(fn, **kw) -> float:
    return device_ms(fn, _tw_events, tw.cuda.synchronize, **kw)


def paired_ms(torch_fn, tw_fn, warmup: int = 3, repeats: int = 15, inner: int = 5) -> tuple[float, float]:
    """(torch's, ours): medians of :func:`_block_ms`, the two sides' blocks alternating.

    Timed one side after the other, the second side ran on a GPU that the first had heated: a long GEMM lowers
    its clocks within tens of milliseconds, so whichever side came second lost several percent. Alternating
    blocks give both sides the same clocks."""
    torch_hold = _warm(torch_fn, torch.cuda.synchronize, warmup, inner)
    tw_hold = _warm(tw_fn, tw.cuda.synchronize, warmup, inner)
    theirs, ours = [], []
    for _ in range(repeats):
        theirs.append(_block_ms(torch_fn, _torch_events, inner, torch_hold))
        ours.append(_block_ms(tw_fn, _tw_events, inner, tw_hold))
    return statistics.median(theirs), statistics.median(ours)


def _host_us(fn, sync, number: int) -> float:
    """Host microseconds per call to queue ``number`` calls (the wait for the device after them is not counted)."""
    sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    elapsed = time.perf_counter() - start
    sync()
    return elapsed / number * 1e6


def paired_host_us(torch_fn, tw_fn, number: int = 200, repeats: int = 25) -> tuple[float, float]:
    """(torch's, ours): host microseconds per call of a tiny op, medians over ``repeats`` bursts of ``number``
    calls of each side, alternating.

    A burst is short enough that the device's queue never fills, so what is timed is the host's cost of an op.
    In a loop of thousands of calls the queue fills wherever the device runs tiny kernels slower than the host
    queues them, and both sides then time the device: on one H200 host such a loop took 16.4 us per add for
    tilewise and 11.5 for torch, where bursts of 256 took 9.8 and 7.3."""
    torch_fn()
    tw_fn()
    theirs, ours = [], []
    for _ in range(repeats):
        theirs.append(_host_us(torch_fn, torch.cuda.synchronize, number))
        ours.append(_host_us(tw_fn, tw.cuda.synchronize, number))
    return statistics.median(theirs), statistics.median(ours)


def pair(a: np.ndarray, dtype: str):
    t = torch.from_numpy(a).cuda().to(getattr(torch, dtype))
    x = tw.from_numpy(a).cuda().to(tw.dtypes.from_name(dtype))
    return t, x


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


ROWS: list[dict] = []


def report(case: str, ours: float, theirs: float, unit: str, higher_better: bool, extra: str = "") -> None:
    ratio = (ours / theirs) if higher_better else (theirs / ours)
    ROWS.append({"case": case, "tilewise": ours, "torch": theirs, "unit": unit, "speed_vs_torch": ratio,
                 "note": extra})
    print(f"{case:<46} {ours:>10.3f} {theirs:>10.3f} {unit:<8} {ratio:>6.2f}x  {extra}", flush=True)


# ---------------------------------------------------------------------------------------------- cases

def per_op_cost() -> None:
    a, b = rand((4, 4)), rand((4, 4), 1)
    ta, xa = pair(a, "float32")
    tb, xb = pair(b, "float32")
    cases = {"add": (lambda: ta + tb, lambda: xa + xb), "mul scalar": (lambda: ta * 2.0, lambda: xa * 2.0),
             "exp": (lambda: ta.exp(), lambda: xa.exp()), "sum": (lambda: ta.sum(), lambda: xa.sum()),
             "matmul 4x4": (lambda: ta @ tb, lambda: xa @ xb)}
    for name, (tf, xf) in cases.items():
        theirs, ours = paired_host_us(tf, xf)
        report(f"per-op cost: {name} (4x4 fp32)", ours, theirs, "us/op", False)


def copy_bandwidth() -> float:
    n = 1 << 28  # 1 GiB of fp32
    t, t2 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    x, x2 = tw.empty(n, device="cuda"), tw.empty(n, device="cuda")
    theirs, ours = paired_ms(partial(t2.copy_, t), partial(x2.copy_, x), inner=3)
    gbs, ours = 2 * 4 * n / theirs / 1e6, 2 * 4 * n / ours / 1e6
    report("device copy 1 GiB fp32 (GB/s)", ours, gbs, "GB/s", True)
    return gbs


BANDWIDTH = [  # name, passes over the input's bytes, torch version, tilewise version (of inputs a, b)
    ("add", 3, lambda a, b: a + b, lambda a, b: a + b),
    ("exp", 2, lambda a, b: a.exp(), lambda a, b: a.exp()),
    ("mul scalar", 2, lambda a, b: a * 0.5, lambda a, b: a * 0.5),
    ("row sum", 1, lambda a, b: a.sum(-1), lambda a, b: a.sum(-1)),
    ("row amax", 1, lambda a, b: a.amax(-1), lambda a, b: a.amax(-1)),
    ("column sum", 1, lambda a, b: a.sum(0), lambda a, b: a.sum(0)),
    ("softmax", 2, lambda a, b: torch.softmax(a, -1), lambda a, b: tw.nn.functional.softmax(a, -1)),
    ("softmax backward", 3, lambda a, b: torch.ops.aten._softmax_backward_data(a, b, -1, a.dtype),
     lambda a, b: OPS["_softmax_backward_data"](a, b, -1, a.dtype)),
]


def bandwidth_cases(copy_gbs: float, quick: bool) -> None:
    shape = (8192, 4096)
    a, b = rand(shape), rand(shape, 1)
    for dtype in ("float32", "bfloat16"):
        ta, xa = pair(a, dtype)
        tb, xb = pair(b, dtype)
        size = ta.element_size() * ta.numel()
        for name, passes, tf, xf in BANDWIDTH:
            theirs, ours = paired_ms(partial(tf, ta, tb), partial(xf, xa, xb))
            gbs = passes * size / ours / 1e6
            report(f"{name} 8192x4096 {dtype} (ms)", ours, theirs, "ms", False,
                   f"{gbs:.0f} GB/s = {100 * gbs / copy_gbs:.0f}% of copy")
        cast_to = "bfloat16" if dtype == "float32" else "float32"
        theirs, ours = paired_ms(partial(ta.to, getattr(torch, cast_to)), partial(xa.to, tw.dtypes.from_name(cast_to)))
        moved = size + ta.numel() * (2 if cast_to == "bfloat16" else 4)
        report(f"cast {dtype}->{cast_to} 8192x4096 (ms)", ours, theirs, "ms", False,
               f"{moved / ours / 1e6:.0f} GB/s = {100 * moved / ours / 1e6 / copy_gbs:.0f}% of copy")
        if quick:
            break


GEMMS = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 3072, 768), (8192, 768, 3072), (1024, 1024, 1024),
         (128, 4096, 4096), (4096, 50304, 768)]


def gemm_cases(quick: bool) -> None:
    for dtype in ("bfloat16", "float16", "float32"):
        for m, n, k in GEMMS[:3] if quick else GEMMS:
            if dtype == "float32" and m * n * k > 4096**3:
                continue
            ta, xa = pair(rand((m, k)) * 0.1, dtype)
            tb, xb = pair(rand((k, n), 1) * 0.1, dtype)
            flops = 2 * m * n * k
            theirs, ours = paired_ms(partial(torch.matmul, ta, tb), partial(tw.matmul, xa, xb), inner=3)
            report(f"GEMM {m}x{n}x{k} {dtype} (TFLOP/s)", flops / ours / 1e9, flops / theirs / 1e9, "TFLOP/s", True)
        torch.cuda.empty_cache()
    from tilewise.backends.cuda.matmul import linear_activation

    x, w, bias = rand((8192, 768)), rand((3072, 768), 1) * 0.05, rand((3072,), 2)
    tx, xx = pair(x, "bfloat16")
    tw_, xw = pair(w, "bfloat16")
    tbias, xbias = pair(bias, "bfloat16")
    gelu, linear = torch.nn.functional.gelu, torch.nn.functional.linear
    theirs, ours = paired_ms(lambda: gelu(linear(tx, tw_, tbias), approximate="tanh"),
                             lambda: linear_activation(xx, xw, xbias, "gelu"))
    report("linear+bias+GELU 8192x768->3072 bf16 (ms)", ours, theirs, "ms", False, "cuBLASLt GELU_BIAS epilogue")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    props = tw.cuda.get_device_properties()
    print(f"device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}; "
          f"tilewise {tw.__version__}")
    print(f"{'case':<46} {'tilewise':>10} {'torch':>10} {'unit':<8} {'speed':>7}")
    per_op_cost()
    copy_gbs = copy_bandwidth()
    bandwidth_cases(copy_gbs, args.quick)
    gemm_cases(args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "rows": ROWS}, f, indent=1)


if __name__ == "__main__":
    main()
