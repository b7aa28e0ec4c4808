"""tilewise.compile on the CPU (generated C + OpenMP) beside numpy, tilewise eager, torch eager and torch.compile.

Two cases from ../shared/BENCHMARKS.md, measured in one process: the seed chain ``relu(x) * 0.5 + 1`` on a
4096x4096 float32 tensor and a row softmax on 8192x4096 float32. Each figure is the median wall time of
``--repeats`` calls after warm-up, outputs allocated by each call as a user would see them. "speed" is the
peer's time over ours: above 1 means tilewise's compiled code is faster; a plain memory copy of the same bytes
(read the input, write the output) is listed as the floor a bandwidth-bound kernel can reach. The first-call times
are tilewise's first call of the compiled function (capture, passes, code generation, C compiler or disk
cache, then one run): with an empty kernel cache, and in a second process that finds the library on disk.

    python benchmarks/compiled_cpu.py [--repeats 20] [--append benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tilewise as tw  # noqa: E402

SEED_SHAPE, SOFTMAX_SHAPE = (4096, 4096), (8192, 4096)


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def numpy_softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def cases():
    rng = np.random.default_rng(0)
    seed = rng.standard_normal(SEED_SHAPE, dtype=np.float32)
    rows = rng.standard_normal(SOFTMAX_SHAPE, dtype=np.float32)
    return [
        ("seed chain relu(x)*0.5+1, 4096x4096 f32", seed, lambda x: x.relu() * 0.5 + 1,
         lambda a: np.maximum(a, 0) * np.float32(0.5) + np.float32(1), lambda t: torch.relu(t) * 0.5 + 1),
        ("row softmax, 8192x4096 f32", rows, lambda x: x.softmax(-1), numpy_softmax,
         lambda t: torch.softmax(t, -1)),
    ]


CACHED_COMPILE = """
import time, numpy as np, tilewise as tw
x = tw.from_numpy(np.zeros({shape}, dtype=np.float32))
f = tw.compile({fn})
start = time.perf_counter(); f(x); print(time.perf_counter() - start)
"""


def first_call_in_new_process(shape: tuple, source: str) -> float:
    script = CACHED_COMPILE.format(shape=shape, fn=source)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.split()[-1])


def torch_compiled(fn, t: torch.Tensor):
    try:
        compiled = torch.compile(fn)
        compiled(t)
        return compiled, ""
    except Exception as exc:  # noqa: BLE001 — report why the peer could not run, do not abort the benchmark
        return None, f"torch.compile failed: {type(exc).__name__}"


def measure(name: str, array: np.ndarray, tw_fn, np_fn, torch_fn, source: str, repeats: int) -> list[tuple]:
    x, t = tw.from_numpy(array), torch.from_numpy(array)
    compiled = tw.compile(tw_fn)
    start = time.perf_counter()
    compiled(x)
    first_call = time.perf_counter() - start
    ours = median_ms(lambda: compiled(x), repeats)
    np.testing.assert_allclose(compiled(x).numpy(), np_fn(array), rtol=1e-5, atol=1e-6)
    out = np.empty_like(array)
    peers = [("memory copy of the same bytes (np.copyto)", median_ms(lambda: np.copyto(out, array), repeats),
              "the floor for a bandwidth-bound kernel"),
             ("numpy", median_ms(lambda: np_fn(array), repeats), ""),
             ("tilewise eager", median_ms(lambda: tw_fn(x), repeats), ""),
             ("torch eager", median_ms(lambda: torch_fn(t), repeats), "")]
    tc, why = torch_compiled(torch_fn, t)
    peers.append(("torch.compile", median_ms(lambda: tc(t), repeats) if tc else float("nan"), why))
    rows = [(name, peer, ours, ms, ms / ours, note) for peer, ms, note in peers]
    rows.append((name, "first call (s)", first_call, first_call_in_new_process(array.shape, source), float("nan"), ""))
    return rows


def run(repeats: int) -> list[tuple]:
    sources = ("lambda x: x.relu() * 0.5 + 1", "lambda x: x.softmax(-1)")
    return [row for case, source in zip(cases(), sources) for row in measure(*case, source, repeats)]


def table(rows: list[tuple]) -> str:
    lines = ["| case | peer | tilewise compiled (ms) | peer (ms) | speed | note |", "|---|---|---:|---:|---:|---|"]
    for name, peer, ours, theirs, speed, note in rows:
        if peer == "first call (s)":
            lines.append(f"| {name} | first call (s): empty cache / disk cache, new process | {ours:.3f} | "
                         f"{theirs:.3f} |  | {note} |")
        else:
            speed_text = f"{speed:.2f}x" if speed == speed else "n/a"
            lines.append(f"| {name} | {peer} | {ours:.2f} | {theirs:.2f} | {speed_text} | {note} |")
    return "\n".join(lines)


def header() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"## Compiled CPU (C + OpenMP) — `benchmarks/compiled_cpu.py` ({datetime.date.today()}, {cpu}, "
            f"{os.cpu_count()} cores, numpy {np.__version__}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch threads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--append", help="append the result table to this markdown file")
    args = parser.parse_args()
    text = header() + "\n\n" + table(run(args.repeats)) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
