"""Does explain time the step as the profiler does, and how long does the report of a training step take?

One process, one GPU, the compiled GPT-2 training step of ``profiler_overhead.py`` (the demo's GPT at GPT-2
124M's sizes, bf16 autocast, AdamW, clip_grad_norm_, the whole step under one ``tw.compile``):

1. The step is compiled and warmed up; then ``tw.report(step, x, y)`` writes the HTML page of it, timed (its
   ``explain`` takes the compiled step as it is, runs it ``--repeats`` times with every program step launched
   alone and timed from CUPTI's records, disassembles the kernels and renders the page). The target is 10 s.
   ``explain`` of the plain step (compiled again, from the caches) is timed after it.
2. The same compiled step (the one ``explain`` built) runs ``--steps`` times inside ``tilewise.profiler.profile``
   (CUPTI where cupti-python is installed: each kernel's device time as CUPTI recorded it).
3. Each generated kernel's time per call as explain measured it is set beside the profiler's (kernels of one
   name summed over their launches in a call); library calls (GEMMs, attention) are compared as one sum, as
   their kernels are the libraries' own. Printed: every kernel whose two figures differ by more than 10%, the
   share of the generated kernels' time within 10%, and the totals.
4. ``explain`` of the seed chain ``relu(x) * 0.5 + 1`` (4096x4096 fp32) and of a row softmax (8192x4096 bf16):
   their fraction of the copy bandwidth, the figures RESULTS.md keeps for those kernels.

    python benchmarks/explain_timing.py [--quick] [--repeats 10] [--steps 10] [--out report.html] [--append FILE]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import tilewise as tw  # noqa: E402
import tilewise.profiler as tw_profiler  # noqa: E402
from benchmarks.gpt_train_step import autocast_for, make_step, tilewise_model  # noqa: E402
from benchmarks.profiler_overhead import GPT2, QUICK  # noqa: E402
from tilewise.models import gpt as tw_gpt  # noqa: E402
from tilewise.profiler.events import DeviceType  # noqa: E402
from tilewise.profiler.roofline import roofline  # noqa: E402

AGREE = 0.10  # the target: per-kernel times within 10% of the profiler's


def build(args: argparse.Namespace):
    config = tw_gpt.GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                              n_embd=args.embd)
    tw.manual_seed(0)
    reference = tw_gpt.GPT(config)
    weights = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items()}
    del reference
    model = tilewise_model(config, weights, args.device)
    step = make_step(model, tw.optim.AdamW(model.parameters(), lr=3e-4), tw.nn.utils.clip_grad_norm_,
                     autocast_for(tw, args))
    rng = np.random.default_rng(0)
    x, y = (tw.tensor(rng.integers(0, args.vocab, size=(args.batch, args.block))).to(args.device) for _ in range(2))
    return step, x, y


def profiled_kernels(compiled, x, y, steps: int, sync) -> tuple[dict[str, float], str]:
    """Device microseconds per call of each kernel name under the profiler, and how the device was timed."""
    sync()
    activities = [tw_profiler.ProfilerActivity.CPU]
    if tw.cuda.is_available():
        activities.append(tw_profiler.ProfilerActivity.CUDA)
    with tw_profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            compiled(x, y)
        sync()
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            for kernel in event.kernels:
                if kernel.kind == "kernel":
                    totals[kernel.name] += kernel.duration
    return {name: us / steps for name, us in totals.items()}, getattr(prof.profiler, "device_timing", "none")


def compare(explained, profiled: dict[str, float]) -> list[str]:
    ours: dict[str, float] = collections.defaultdict(float)  # microseconds per call
    library_ours = 0.0
    untimed = 0
    for record in explained.kernels:
        if record.seconds is None:
            untimed += 1
            continue
        if record.kind == "kernel":  # under the name the device runs it by, as the profiler sees it
            ours[record.symbol or record.name] += record.seconds * 1e6
        else:
            library_ours += record.seconds * 1e6
    generated = [name for name in ours if name in profiled]
    missing = [name for name in ours if name not in profiled]
    library_profiled = sum(us for name, us in profiled.items() if name not in ours)
    within = [n for n in generated if abs(ours[n] / profiled[n] - 1) <= AGREE]
    time_all = sum(profiled[n] for n in generated)
    time_within = sum(profiled[n] for n in within)
    lines = [f"generated kernels: {len(generated)} names matched, {len(missing)} not seen by the profiler"
             + (f" ({', '.join(missing[:5])}{'...' if len(missing) > 5 else ''})" if missing else "")
             + f"; {untimed} explain steps untimed",
             f"within {AGREE:.0%}: {len(within)} of {len(generated)} kernels, "
             f"{time_within / max(time_all, 1e-9):.1%} of "
             f"their profiled time",
             f"generated kernels' sum per call: explain {sum(ours[n] for n in generated) / 1e3:.3f} ms, "
             f"profiler {time_all / 1e3:.3f} ms (ratio {sum(ours[n] for n in generated) / max(time_all, 1e-9):.3f})",
             f"library calls per call: explain {library_ours / 1e3:.3f} ms, profiler {library_profiled / 1e3:.3f} ms "
             f"(ratio {library_ours / max(library_profiled, 1e-9):.3f})",
             "", "| kernel | explain (us) | profiler (us) | ratio |", "|---|---|---|---|"]
    outliers = sorted((n for n in generated if n not in within), key=lambda n: -profiled[n])
    for name in outliers[:25]:
        lines.append(f"| {name[:60]} | {ours[name]:.1f} | {profiled[name]:.1f} | {ours[name] / profiled[name]:.3f} |")
    if len(outliers) > 25:
        lines.append(f"| ... {len(outliers) - 25} more | | | |")
    return lines


def single_kernels(args: argparse.Namespace) -> list[str]:
    lines = []
    cases = [("seed chain relu(x)*0.5+1, 4096x4096 fp32", lambda x: x.relu() * 0.5 + 1, (4096, 4096), tw.float32),
             ("row softmax, 8192x4096 bf16", lambda x: x.softmax(-1), (8192, 4096), tw.bfloat16)]
    for title, fn, shape, dtype in cases:
        if args.quick:
            shape = (256, 256)
        x = tw.randn(*shape, device=args.device).to(dtype)
        explained = tw.explain(fn, x, repeats=args.repeats)
        for record in explained.kernels:
            placed = record.placement.describe() if record.placement is not None else "not placed"
            lines.append(f"- {title}: {record.name} {record.seconds * 1e3:.4f} ms; {placed}")
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="a tiny GPT: a smoke test")
    parser.add_argument("--repeats", type=int, default=10, help="explain's timed calls")
    parser.add_argument("--steps", type=int, default=10, help="profiled steps")
    parser.add_argument("--out", default="out/explain_timing/report.html", help="where the report page goes")
    parser.add_argument("--append", help="append the report to this file")
    args = parser.parse_args()
    vars(args).update(QUICK if args.quick else GPT2)
    args.autocast = "bfloat16" if not args.quick else "fp32"
    return args


def main() -> None:
    args = parse_args()
    if not tw.cuda.is_available() and args.device.startswith("cuda"):
        raise SystemExit("explain_timing.py compares device times: it needs a GPU (--device cuda; --device cpu "
                         "runs the steps with nothing to compare)")
    sync = tw.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    step, x, y = build(args)
    compiled = tw.compile(step)
    start = time.perf_counter()
    for _ in range(3):
        compiled(x, y)
    sync()
    first = time.perf_counter() - start
    start = time.perf_counter()  # the device's roofline is measured once per machine and cached: not the report's
    roofline(args.device)
    roofline_seconds = time.perf_counter() - start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path = tw.report(compiled, x, y, out=args.out, repeats=args.repeats)  # the compiled step itself
    report_seconds = time.perf_counter() - start
    start = time.perf_counter()
    explained = tw.explain(step, x, y, repeats=args.repeats)  # a fresh compile of the step
    explain_seconds = time.perf_counter() - start
    profiled, timing = profiled_kernels(explained.compiled, x, y, args.steps, sync)
    step_times = []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        explained.compiled(x, y)
        sync()
        step_times.append(time.perf_counter() - t0)
    device_name = tw.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    lines = [f"## explain against the profiler — `benchmarks/explain_timing.py` ({datetime.date.today()}, "
             f"{device_name}, tilewise {tw.__version__})", "",
             f"GPT {args.layers}L {args.heads}H {args.embd}d, batch {args.batch}x{args.block}, {args.autocast}; "
             f"explain repeats {args.repeats}, profiled steps {args.steps}, device timing: {timing}", "",
             f"- first 3 calls (compiling): {first:.1f} s",
             f"- the device's roofline (measured once per machine, then cached): {roofline_seconds:.1f} s",
             f"- report page: {report_seconds:.1f} s after the step compiled ({path}, "
             f"{path.stat().st_size / 1e6:.1f} MB)",
             f"- explain alone: {explain_seconds:.1f} s",
             f"- step (graph replay, unprofiled): median {statistics.median(step_times) * 1e3:.2f} ms; explain's steps "
             f"summed: {sum(r.seconds or 0 for r in explained.kernels) * 1e3:.2f} ms", ""]
    lines += compare(explained, profiled)
    lines += ["", "Single kernels (explain's roofline placement):"] + single_kernels(args)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as file:
            file.write("\n" + text)


if __name__ == "__main__":
    main()
