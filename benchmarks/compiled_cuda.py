"""tilewise.compile on the GPU beside torch eager and torch.compile, in one process.

Cases from ../shared/BENCHMARKS.md, each written once over a library namespace so that tilewise and torch
run the same expression:

* a device copy ``y.copy_(x)`` of 1 GiB fp32, measured first: torch eager's figure is the copy bandwidth that
  the memory-bound cases are set against;
* the seed chain ``x.relu() * 0.5 + 1`` on 4096x4096 fp32;
* row softmax on 8192x4096 bf16 with fp32 math: ``softmax(x, -1, dtype=float32).to(bfloat16)``;
* residual add + layer norm on 8192x4096 bf16: ``layer_norm(x + residual, (4096,), weight, bias)`` with bf16
  weight and bias, as an ``nn.LayerNorm`` converted with ``.to(bfloat16)`` holds them in torch (torch computes
  in fp32 inside its kernel and returns bf16); only the normalised output is returned;
* linear + bias + GELU(tanh), 8192x768 -> 3072 bf16: ``gelu(linear(x, weight, bias), approximate="tanh")``.

Device times are medians over ``--repeats`` of the mean of ``--inner`` back-to-back calls between two CUDA
events (``tilewise.cuda.Event`` for tilewise, ``torch.cuda.Event`` for torch), after warm-up, on fresh random
inputs (``--seed`` repeats a run). A call is timed as a user makes it: guards, launches and output
allocation included, so where the host work of a call exceeds its device time the figure is host bound.
"speed" is the peer's time over ours: above 1 means tilewise's compiled code is faster. Memory-bound cases
give bytes read + written over our time, and that as a share of the copy bandwidth; the GEMM case gives
TFLOP/s. "kernels" is the kernel count of each compiled program (``Program.kernel_count``).

First-call times, in seconds, include capture, compilation and one run: tilewise's with an empty kernel
cache (``TILEWISE_CACHE_DIR`` is a fresh directory unless set) and again in a second process that finds the
kernels on disk; torch.compile's with fresh Inductor and Triton cache directories (the first torch.compile
of the process also pays for importing Inductor). A side that raises, or a tilewise function that
``tilewise.compile`` gave up on and ran eagerly, gets its error text in the row instead of a time.

``--device cpu --quick`` runs every code path on small shapes without a GPU (wall-clock timing there).

    python benchmarks/compiled_cuda.py [--quick] [--device cuda] [--mode default] [--no-torch-compile]
                                       [--case seed ...] [--repeats 20] [--append benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-bench-cache-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402

MODES = ("default", "reduce-overhead", "max-autotune")
NAN = float("nan")


# ---------------------------------------------------------------------------------------------- cases

def device_copy(lib):
    return lambda x, out: out.copy_(x)


def seed_chain(lib):
    return lambda x: x.relu() * 0.5 + 1


def row_softmax(lib):
    F = lib.nn.functional  # noqa: N806 — torch's spelling
    return lambda x: F.softmax(x, -1, dtype=lib.float32).to(lib.bfloat16)


def residual_layer_norm(lib):
    F = lib.nn.functional  # noqa: N806
    return lambda x, residual, weight, bias: F.layer_norm(x + residual, weight.shape, weight, bias, eps=1e-5)


def linear_bias_gelu(lib):
    F = lib.nn.functional  # noqa: N806
    return lambda x, weight, bias: F.gelu(F.linear(x, weight, bias), approximate="tanh")


@dataclass(frozen=True)
class Arg:
    shape: tuple[int, ...]
    dtype: str
    scale: float = 1.0
    shift: float = 0.0
    read: bool = True  # False for an argument the function only writes (counts as output bytes)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * (4 if self.dtype == "float32" else 2)


@dataclass(frozen=True)
class Case:
    key: str
    label: str  # formatted with the argument shapes, positionally, and ``size`` (the first argument's bytes)
    build: Callable[[Any], Callable]  # library namespace (tilewise or torch) -> the function to run
    full: tuple[Arg, ...]
    quick: tuple[Arg, ...]
    tolerance: tuple[float, float]  # rtol, atol against torch eager's output
    flops: Callable[[tuple[Arg, ...]], int] | None = None  # compute-bound cases: FLOPs per call

    def args(self, quick: bool) -> tuple[Arg, ...]:
        return self.quick if quick else self.full

    def title(self, quick: bool) -> str:
        args = self.args(quick)
        return self.label.format(*(a.shape for a in args), size=size_text(args[0].nbytes))


BF16_TOLERANCE = (2e-2, 1e-2)  # bf16 results may differ by a rounding or two (up to 2^-7 relative each)

CASES = (
    Case("copy", "device copy y.copy_(x), {size} fp32", device_copy,
         (Arg((1 << 28,), "float32"), Arg((1 << 28,), "float32", read=False)),
         (Arg((1 << 20,), "float32"), Arg((1 << 20,), "float32", read=False)), (0.0, 0.0)),
    Case("seed", "seed chain relu(x)*0.5+1, {0[0]}x{0[1]} fp32", seed_chain,
         (Arg((4096, 4096), "float32"),), (Arg((256, 256), "float32"),), (1e-6, 1e-6)),
    Case("softmax", "row softmax, {0[0]}x{0[1]} bf16 in, fp32 math, bf16 out", row_softmax,
         (Arg((8192, 4096), "bfloat16", scale=3.0),), (Arg((256, 512), "bfloat16", scale=3.0),), (1e-2, 1e-6)),
    Case("layernorm", "residual add + layer_norm, {0[0]}x{0[1]} bf16 (bf16 weight, bias)", residual_layer_norm,
         (Arg((8192, 4096), "bfloat16"), Arg((8192, 4096), "bfloat16"), Arg((4096,), "bfloat16", 0.1, 1.0),
          Arg((4096,), "bfloat16", 0.1)),
         (Arg((256, 512), "bfloat16"), Arg((256, 512), "bfloat16"), Arg((512,), "bfloat16", 0.1, 1.0),
          Arg((512,), "bfloat16", 0.1)), BF16_TOLERANCE),
    Case("gelu", "linear + bias + GELU(tanh), {0[0]}x{0[1]} -> {1[0]} bf16", linear_bias_gelu,
         (Arg((8192, 768), "bfloat16"), Arg((3072, 768), "bfloat16", 0.05), Arg((3072,), "bfloat16", 0.5)),
         (Arg((64, 96), "bfloat16"), Arg((128, 96), "bfloat16", 0.05), Arg((128,), "bfloat16", 0.5)),
         BF16_TOLERANCE, flops=lambda a: 2 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
)
BY_KEY = {case.key: case for case in CASES}


def size_text(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def host_array(arg: Arg, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(arg.shape, dtype=np.float32) * np.float32(arg.scale) + np.float32(arg.shift)


def tilewise_inputs(arrays: list[np.ndarray], args: tuple[Arg, ...], device: str) -> list:
    return [tw.from_numpy(a).to(device).to(tw.dtypes.from_name(arg.dtype)) for a, arg in zip(arrays, args)]


def torch_inputs(arrays: list[np.ndarray], args: tuple[Arg, ...], device: str) -> list:
    # copies: on the CPU from_numpy would otherwise share the array with tilewise's tensor
    return [torch.from_numpy(a.copy()).to(device).to(getattr(torch, arg.dtype)) for a, arg in zip(arrays, args)]


# ---------------------------------------------------------------------------------------------- clocks

class WallEvent:
    """The CPU's stand-in for a CUDA event (``--device cpu``): host wall time between two records."""

    def __init__(self) -> None:
        self.time = 0.0

    def record(self) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: WallEvent) -> float:
        return (end.time - self.time) * 1e3


@dataclass(frozen=True)
class Clock:
    event: Callable[[], Any]
    sync: Callable[[], None]


def clocks(device: str) -> tuple[Clock, Clock]:
    """(tilewise's clock, torch's clock) for ``device``."""
    if device.startswith("cuda"):
        return (Clock(lambda: tw.cuda.Event(enable_timing=True), tw.cuda.synchronize),
                Clock(lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize))
    wall = Clock(WallEvent, lambda: None)
    return wall, wall


@dataclass(frozen=True)
class Timing:
    warmup: int
    repeats: int
    inner: int


def median_ms(fn: Callable[[], Any], clock: Clock, timing: Timing) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls, in milliseconds.

    One call is queued before the start event, so the device is busy while the host queues the timed calls:
    what is timed is the steady-state time per call, not the host's latency to the first launch (which,
    with few calls, made a framework with more host time per call look slower on device-bound work)."""
    for _ in range(timing.warmup):
        fn()
    clock.sync()
    times = []
    for _ in range(timing.repeats):
        start, end = clock.event(), clock.event()
        fn()
        start.record()
        for _ in range(timing.inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / timing.inner)
    return statistics.median(times)


def first_call(fn: Callable, inputs: list, clock: Clock) -> tuple[Any, float]:
    """The result and the seconds of one call, device work included."""
    clock.sync()
    start = time.perf_counter()
    out = fn(*inputs)
    clock.sync()
    return out, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------- one case

@dataclass
class Row:
    title: str
    ours: float = NAN  # ms
    eager: float = NAN
    compiled: float = NAN
    moved: int = 0  # bytes read + written by one call
    flops: int = 0
    kernels: str = ""
    first_call: float = NAN  # s
    cached_first_call: float = NAN
    torch_first_call: float = NAN
    notes: list[str] = field(default_factory=list)


def report_error(exc: BaseException) -> str:
    """Print the traceback to stderr; return a table-sized account of the exception."""
    traceback.print_exc()
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = " ".join(lines[:3])
    return (text[:297] + "...") if len(text) > 300 else text


def compiled_by_tilewise(fn: Callable, mode: str):
    compiled = tw.compile(fn, mode=mode)

    def checked(*inputs):
        out = compiled(*inputs)
        if compiled.eager_reason:
            raise RuntimeError(f"tilewise.compile ran the function eagerly: {compiled.eager_reason}")
        return out

    return compiled, checked


def kernel_counts(compiled) -> str:
    return "+".join(str(getattr(p, "kernel_count", "?")) for p in compiled.programs()) or "0"


def as_float32(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().float().cpu().numpy()
    return t.detach().to(tw.float32).cpu().numpy()


def compare(ours, reference: np.ndarray, tolerance: tuple[float, float]) -> str:
    """'' when ``ours`` matches torch eager's output, else what differs."""
    got = as_float32(ours)
    if got.shape != reference.shape:
        return f"output shape {list(got.shape)}, torch eager's {list(reference.shape)}"
    rtol, atol = tolerance
    if np.allclose(got, reference, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    return (f"OUTPUT DIFFERS from torch eager: max abs diff {np.nanmax(np.abs(got - reference)):.3g} "
            f"(rtol {rtol:g}, atol {atol:g})")


def measure_tilewise(row: Row, case: Case, inputs: list, reference: np.ndarray | None, clock: Clock,
                     options: argparse.Namespace) -> None:
    try:
        compiled, fn = compiled_by_tilewise(case.build(tw), options.mode)
        out, row.first_call = first_call(fn, inputs, clock)
        if reference is not None:
            row.notes.append(compare(out, reference, case.tolerance))
        del out
        row.ours = median_ms(lambda: fn(*inputs), clock, options.timing)
        row.kernels = kernel_counts(compiled)
        if len(compiled.variants) > 1:
            row.notes.append(f"tilewise compiled {len(compiled.variants)} variants")
    except Exception as exc:  # noqa: BLE001 — report what tilewise cannot do yet, measure the rest
        row.notes.append(f"tilewise: {report_error(exc)}")


def measure_torch(row: Row, case: Case, inputs: list, clock: Clock, options: argparse.Namespace) -> np.ndarray | None:
    """Time torch eager and torch.compile; return torch eager's output (the reference) as float32."""
    eager, reference = case.build(torch), None
    try:
        reference = as_float32(eager(*inputs))
        row.eager = median_ms(lambda: eager(*inputs), clock, options.timing)
    except Exception as exc:  # noqa: BLE001
        row.notes.append(f"torch eager: {report_error(exc)}")
    if options.no_torch_compile:
        return reference
    try:
        compiled = torch.compile(case.build(torch), mode=options.mode)
        _, row.torch_first_call = first_call(compiled, inputs, clock)
        row.compiled = median_ms(lambda: compiled(*inputs), clock, options.timing)
    except Exception as exc:  # noqa: BLE001
        row.notes.append(f"torch.compile: {report_error(exc)}")
    return reference


def measure(case: Case, rng: np.random.Generator, options: argparse.Namespace) -> Row:
    args = case.args(options.quick)
    row = Row(case.title(options.quick))
    arrays = [host_array(arg, rng) for arg in args]
    ours_clock, torch_clock = clocks(options.device)
    torch_args = torch_inputs(arrays, args, options.device)
    reference = measure_torch(row, case, torch_args, torch_clock, options)
    tw_args = tilewise_inputs(arrays, args, options.device)
    del arrays, torch_args
    free_device_memory(options.device)
    measure_tilewise(row, case, tw_args, reference, ours_clock, options)
    del tw_args
    free_device_memory(options.device)
    row.moved = sum(a.nbytes for a in args if a.read) + output_bytes(case, args)
    row.flops = case.flops(args) if case.flops else 0
    if row.kernels:
        row.cached_first_call = first_call_in_new_process(row, case, options)
    return row


def output_bytes(case: Case, args: tuple[Arg, ...]) -> int:
    """The bytes the function writes: its output's, from a run on meta tensors."""
    meta = [torch.empty(a.shape, dtype=getattr(torch, a.dtype), device="meta") for a in args]
    out = case.build(torch)(*meta)
    return out.numel() * out.element_size()


def free_device_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        tw.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- second process

def first_call_in_new_process(row: Row, case: Case, options: argparse.Namespace) -> float:
    """tilewise's first call of the case in a fresh process that finds the kernels in the on-disk cache."""
    command = [sys.executable, __file__, "--first-call", case.key, "--device", options.device, "--mode", options.mode,
               *(["--quick"] if options.quick else [])]
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        row.notes.append("second process: no result in 600 s")
        return NAN
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        row.notes.append(f"second process failed: {last[:200]}")
        return NAN
    return float(done.stdout.split()[-1])


def print_first_call(key: str, options: argparse.Namespace) -> None:
    """The ``--first-call`` mode of the second process: print the seconds of tilewise's first call."""
    case = BY_KEY[key]
    args = case.args(options.quick)
    rng = np.random.default_rng(0)
    inputs = tilewise_inputs([host_array(arg, rng) for arg in args], args, options.device)
    _, fn = compiled_by_tilewise(case.build(tw), options.mode)
    _, seconds = first_call(fn, inputs, clocks(options.device)[0])
    print(seconds)


# ---------------------------------------------------------------------------------------------- report

def ratio(theirs: float, ours: float) -> str:
    return f"{theirs / ours:.2f}x" if theirs == theirs and ours == ours else "n/a"


def number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}" if value == value else "n/a"


def achieved(row: Row, copy_gbs: float) -> str:
    if row.ours != row.ours:
        return "n/a"
    if row.flops:
        return f"{row.flops / row.ours / 1e9:.1f} TFLOP/s"
    gbs = row.moved / row.ours / 1e6
    share = f" = {100 * gbs / copy_gbs:.0f}% of copy" if copy_gbs == copy_gbs else ""
    return f"{gbs:.0f} GB/s{share}"


def table(rows: list[Row], copy_gbs: float) -> str:
    lines = ["| case | tilewise compiled (ms) | torch eager (ms) | torch.compile (ms) | speed vs eager | "
             "speed vs compile | tilewise achieved | kernels | tilewise first call (s): empty cache / disk cache | "
             "torch.compile first call (s) | note |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        note = "; ".join(n for n in r.notes if n).replace("|", "\\|")
        lines.append(f"| {r.title} | {number(r.ours, 3)} | {number(r.eager, 3)} | {number(r.compiled, 3)} | "
                     f"{ratio(r.eager, r.ours)} | {ratio(r.compiled, r.ours)} | {achieved(r, copy_gbs)} | "
                     f"{r.kernels or 'n/a'} | {number(r.first_call, 3)} / {number(r.cached_first_call, 3)} | "
                     f"{number(r.torch_first_call, 3)} | {note} |")
    return "\n".join(lines)


def device_text(device: str) -> str:
    if device.startswith("cuda"):
        props = tw.cuda.get_device_properties()
        return f"{props.name}, {props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu"


def header(options: argparse.Namespace, seed: int) -> str:
    return (f"## Compiled vs torch on {options.device} — `benchmarks/compiled_cuda.py` ({datetime.date.today()}, "
            f"{device_text(options.device)}, tilewise {tw.__version__}, torch {torch.__version__}, "
            f"numpy {np.__version__}, mode {options.mode!r}{', quick shapes' if options.quick else ''}, seed {seed})")


# ---------------------------------------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test, also on the CPU)")
    parser.add_argument("--mode", choices=MODES, default="default", help="tw.compile and torch.compile mode")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--case", action="append", choices=list(BY_KEY), help="run only these cases (repeatable)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--inner", type=int, default=5, help="back-to-back calls per timed interval")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, help="input seed (default: a fresh one, printed)")
    parser.add_argument("--append", help="append the result table to this markdown file")
    parser.add_argument("--first-call", choices=list(BY_KEY), help=argparse.SUPPRESS)
    options = parser.parse_args()
    options.timing = Timing(options.warmup, options.repeats, options.inner)
    return options


def main() -> None:
    options = parse_args()
    if options.first_call:
        print_first_call(options.first_call, options)
        return
    seed = options.seed if options.seed is not None else secrets.randbits(32)
    rng = np.random.default_rng(seed)
    rows, copy_gbs = [], NAN
    for case in CASES:
        if options.case and case.key not in options.case:
            continue
        row = measure(case, rng, options)
        if case.key == "copy" and row.eager == row.eager:
            copy_gbs = row.moved / row.eager / 1e6
            row.notes.insert(0, f"torch eager copy: {copy_gbs:.0f} GB/s, the reference bandwidth")
        rows.append(row)
        print(f"{row.title}: tilewise {number(row.ours, 3)} ms, torch eager {number(row.eager, 3)} ms, "
              f"torch.compile {number(row.compiled, 3)} ms", flush=True)
    text = header(options, seed) + "\n\n" + table(rows, copy_gbs) + "\n"
    print(text)
    if options.append:
        with open(options.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
