"""Eager CUDA performance, tilewise beside torch in one process: per-op cost, bandwidth, GEMM.

* per-op cost: a tiny tensor op in a loop, host bound (torch's figure, 9.3 us/op on an H200, is the target);
* bandwidth: large pointwise ops, row reductions, softmax and its backward, as GB/s and as a share of the
  device copy bandwidth measured here (bytes read + written); eager softmax and its backward each run as
  one kernel compiled from their decompositions;
* GEMM: TFLOP/s over a suite of shapes and dtypes, and linear + bias + GELU through the cuBLASLt epilogue.

Device times are CUDA-event medians after warm-up, on random inputs.

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


def device_ms(fn, events, sync, warmup: int = 3, repeats: int = 15, inner: int = 5) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls, in milliseconds.

    One call is queued before the start event, so the device is busy while the host queues the timed calls:
    what is timed is the steady-state time per call, not the host's latency to the first launch."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start, end = events()
        fn()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def torch_ms(fn, **kw) -> float:
    return device_ms(fn, lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)),
                     torch.cuda.synchronize, **kw)


def tw_ms(fn, **kw) -> float:
    return device_ms(fn, lambda: (tw.cuda.Event(enable_timing=True), tw.cuda.Event(enable_timing=True)),
                     tw.cuda.synchronize, **kw)


def host_us(fn, sync, number: int = 2000, repeats: int = 5) -> float:
    """Wall-clock microseconds per call of a host-bound loop (synchronised at the end of each repeat)."""
    fn()
    sync()
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        best.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(best)


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
        report(f"per-op cost: {name} (4x4 fp32)", host_us(xf, tw.cuda.synchronize), host_us(tf, torch.cuda.synchronize),
               "us/op", False)


def copy_bandwidth() -> float:
    n = 1 << 28  # 1 GiB of fp32
    t, t2 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    gbs = 2 * 4 * n / torch_ms(partial(t2.copy_, t), inner=3) / 1e6
    x, x2 = tw.empty(n, device="cuda"), tw.empty(n, device="cuda")
    ours = 2 * 4 * n / tw_ms(partial(x2.copy_, x), inner=3) / 1e6
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
            theirs, ours = torch_ms(partial(tf, ta, tb)), tw_ms(partial(xf, xa, xb))
            gbs = passes * size / ours / 1e6
            report(f"{name} 8192x4096 {dtype} (ms)", ours, theirs, "ms", False,
                   f"{gbs:.0f} GB/s = {100 * gbs / copy_gbs:.0f}% of copy")
        cast_to = "bfloat16" if dtype == "float32" else "float32"
        theirs = torch_ms(partial(ta.to, getattr(torch, cast_to)))
        ours = tw_ms(partial(xa.to, tw.dtypes.from_name(cast_to)))
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
            theirs, ours = torch_ms(partial(torch.matmul, ta, tb), inner=3), tw_ms(partial(tw.matmul, xa, xb), inner=3)
            report(f"GEMM {m}x{n}x{k} {dtype} (TFLOP/s)", flops / ours / 1e9, flops / theirs / 1e9, "TFLOP/s", True)
        torch.cuda.empty_cache()
    from tilewise.backends.cuda.matmul import linear_activation

    x, w, bias = rand((8192, 768)), rand((3072, 768), 1) * 0.05, rand((3072,), 2)
    tx, xx = pair(x, "bfloat16")
    tw_, xw = pair(w, "bfloat16")
    tbias, xbias = pair(bias, "bfloat16")
    gelu, linear = torch.nn.functional.gelu, torch.nn.functional.linear
    theirs = torch_ms(lambda: gelu(linear(tx, tw_, tbias), approximate="tanh"))
    ours = tw_ms(lambda: linear_activation(xx, xw, xbias, "gelu"))
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
