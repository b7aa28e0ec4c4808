"""Where the first compile of a transformer training step goes, from empty caches, on a host without a GPU.

The steps are the transformer matrix's (``transformer_matrix.py``: GPT-2 124M, Llama 125M, ViT-B/16, bf16
autocast, AdamW with ``clip_grad_norm_``), each compiled whole by ``tw.compile`` for the CUDA target on CPU tensors
and taken as far as a GPU is not needed: the trace, every graph pass, every lowering stage (fusion, kernel IR,
memory plan, schedules, CUDA C) and NVRTC's PTX and cubins, into a fresh kernel cache (its directory is new for
each model). As in a build for a GPU, each kernel's compile starts as soon as it is rendered; the NVRTC stage is what
is left to wait for after the last. Each stage has the name
``TILEWISE_LOG=compile`` gives it in a real compile; what only a GPU does (loading modules, the first run with
cuBLASLt's algorithm choices and cuDNN's graph builds) is measured by the matrix's first step on the GPU host.

NVRTC runs on the compile pool ([Note: parallel compiles] in ``codegen/toolchain/pool.py``) with
``--threads`` threads (default: one per CPU); ``--serial`` also compiles every text one after another into another
fresh cache and checks that the two give the same bytes. No peer figure: torch.compile's first step needs the GPU
(the matrix has it, beside ours).

    python benchmarks/compile_time.py [--models gpt2,llama,vit] [--tiny] [--threads N] [--serial] [--append FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import transformer_matrix as tm

import tilewise as tw
from tilewise._stages import Stages, collector_paused, stage
from tilewise.codegen.toolchain.cache import KernelCache
from tilewise.codegen.toolchain.pool import compile_all, compile_threads, finished
from tilewise.compiler.capture import capturing
from tilewise.compiler.function import _flatten_call, program_graphs
from tilewise.compiler.program import lower_program
from tilewise.compiler.program_cuda import KernelCompiles, shared_name
from tilewise.compiler.targets import get_target
from tilewise.config import settings


class HostCompiles(KernelCompiles):
    """A build's kernel compiles, started as each kernel is rendered, for ``arch`` rather than a device's."""

    def __init__(self, arch: str, cache: KernelCache):
        self.device, self.arch, self.cache, self.started = None, arch, cache, {}


def first_compile(case: tm.Case, arch: str, cache_root: Path, serial: bool) -> tuple[Stages, dict]:
    """The stages of a first compile of ``case``'s step for CUDA, and what it made."""
    weights, _ = tm.initial_weights(case)
    x, y = tm.on_device(tw, case, tm.sample_batches(case, 1)[0])
    compiled = tw.compile(tm.raw_tilewise_step(case, weights))
    target = get_target("cuda")
    flat, _ = _flatten_call((x, y), {})
    facts: dict = {}
    with Stages() as stages, collector_paused():
        with stage("trace"):
            cap, _ = compiled._start((x, y), {})
            try:
                with capturing(cap):
                    traced = cap.finish(compiled.fn(x, y), flat)
            finally:
                cap.restore()
        graphs, _ = program_graphs(traced, target)
        compiles = HostCompiles(arch, KernelCache(tempfile.mkdtemp(prefix="fresh-", dir=cache_root)))
        lows = [lower_program(graph, target, compiling=compiles) for graph in graphs]  # each compile starts as rendered
        units = list(dict.fromkeys(shared_name(n, s) for low in lows for n, s in low.sources.items()))
        with stage("compile kernels (NVRTC)"):  # what is left of them once everything is rendered
            futures = [compiles.started[unit] for unit in units]
            for _ in finished(futures):
                pass
            kernels = [future.result() for future in futures]
    facts["kernels"] = sum(len(low.sources) for low in lows)
    facts["texts"] = len(units)
    facts["characters"] = sum(len(source) for _, source in units)
    facts["nvrtc_sum"] = sum(k.compile_seconds for k in kernels)
    slowest = max(zip(kernels, units), key=lambda pair: pair[0].compile_seconds)
    facts["slowest"] = f"{slowest[1][0]} {slowest[0].compile_seconds:.2f} s ({len(slowest[1][1]):,} characters)"
    if serial:
        threads = settings.compile_threads
        settings.compile_threads = 1
        try:
            start = time.perf_counter()
            alone = compile_all(units, arch, KernelCache(tempfile.mkdtemp(prefix="serial-", dir=cache_root)))
            facts["serial"] = time.perf_counter() - start
        finally:
            settings.compile_threads = threads
        facts["identical"] = all(a.ptx == b.ptx and a.cubin == b.cubin for a, b in zip(kernels, alone))
    return stages, facts


def report(case: tm.Case, stages: Stages, facts: dict, threads: int) -> str:
    lines = [f"### {case.title}: first compile for CUDA (no GPU), from empty caches", "",
             f"{facts['kernels']} kernels, {facts['texts']} different texts ({facts['characters']:,} characters); "
             f"NVRTC on {threads} thread(s): {facts['nvrtc_sum']:.2f} s of compiles, the slowest {facts['slowest']}",
             "", "| stage | seconds |", "|---|---:|", f"| **total** | **{stages.total:.2f}** |"]
    for key, seconds in stages.seconds.items():
        count = stages.counts[key]
        times = f" ({count} times)" if count > 1 else ""
        lines.append(f"| {'&nbsp;&nbsp;' * (len(key) - 1)}{key[-1]}{times} | {seconds:.3f} |")
    if "serial" in facts:
        lines += ["", f"NVRTC one text after another (`TILEWISE_COMPILE_THREADS=1`): {facts['serial']:.2f} s; "
                      f"the same PTX and cubins as on the pool: {'yes' if facts['identical'] else '**NO**'}"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=lambda text: [tm.parse_model(m.strip()) for m in text.split(",") if m.strip()],
                        default=["gpt2", "llama", "vit"])
    parser.add_argument("--tiny", action="store_true", help="2 layers, width 64: a check in seconds")
    parser.add_argument("--threads", type=int, default=0, help="NVRTC threads (default: one per CPU)")
    parser.add_argument("--serial", action="store_true", help="also compile one text after another and compare")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--append", help="append the report to this markdown file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        settings.compile_threads = args.threads
    matrix = tm.parse_args(["--models", ",".join(args.models), "--device", "cpu", "--cuda-lowering"]
                           + (["--tiny"] if args.tiny else []))
    sections = [f"## First compile of the matrix's training steps for CUDA, on the host — `benchmarks/compile_time.py` "
                f"({datetime.date.today()}, {os.cpu_count()} CPUs, tilewise {tw.__version__}, python "
                f"{sys.version.split()[0]})"]
    with tempfile.TemporaryDirectory(prefix="tilewise-compile-time-") as root:
        for case in tm.cases(matrix):
            stages, facts = first_compile(case, args.arch, Path(root), args.serial)
            sections.append(report(case, stages, facts, compile_threads()))
            print(sections[-1], flush=True)
    text = "\n\n".join(sections) + "\n"
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
