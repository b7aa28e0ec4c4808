"""Several processes: collective bus bandwidth and GPT-2 DDP training throughput, tilewise beside torch.

One command runs everything: this script is the driver, and it launches its own ranks, tilewise's through
``python -m tilewise.distributed.run`` and torch's through torchrun (``python -m torch.distributed.run``), with
torchrun's flags, each rank running this same file with ``--worker``. Ranks write their figures as JSON into a
scratch folder; the driver reads them and prints the tables. A side whose launch fails (an API not there yet, an
error on a rank, a timeout) gets its error text in the table, and the other sides are still measured.

* ``--collectives``: bus bandwidth of all_reduce (size * 2(n-1)/n / time), all_gather_into_tensor and
  reduce_scatter_tensor (size * (n-1)/n / time, the size being the gathered or scattered whole, as nccl-tests
  count it) by message size, in bf16 and fp32, for tilewise.distributed, for raw nccl4py calls on the same
  buffers from the same processes (NCCL's own figure), and for torch.distributed (when torch has CUDA). Times are
  CUDA-event times of a run of calls on the current stream, each call synchronised as ``async_op=False`` does.
* ``--gpt``: GPT-2 124M (``tilewise/models/gpt.py``, the preset of ``gpt_train_step.py``: batch 8x1024 a rank,
  bf16 autocast, AdamW, gradients clipped to norm 1) trained with DistributedDataParallel on 1, 2 and 4 GPUs:
  tilewise with the whole step compiled by ``tw.compile`` (and eager), torch with DDP and the model compiled by
  ``torch.compile``, both from the same initial weights on the same batches. Reported: the median step time after
  the warm-up, global tokens/s, and the largest difference of the global loss (the mean of the ranks' losses) over
  the first steps (50 unless ``--steps`` is smaller) from single-GPU training of the same global batch (tilewise
  eager, the global batch as gradient accumulation over the ranks' parts, which is the same update). Where the
  host has a GPU the ranks leave free, that reference runs on it at the same time as the timed launches.
* ``--cpu``: the same over gloo between 2 CPU processes at tiny sizes (a smoke test; no nccl4py side).

* ``--sharded``: GPT-2 XL (1.56B parameters, fp32 weights, bf16 autocast, AdamW, one sequence a rank) trained
  unsharded in one process on the global batch, which gives the memory the model needs, and with ``fully_shard``
  on every block and the root over 2 (and 4) ranks: each rank's peak memory against that need, step times, and
  the loss difference between tilewise's sharded and unsharded training; torch's FSDP2 beside it.

    python benchmarks/distributed.py [--collectives] [--gpt] [--sharded] [--quick] [--cpu] [--nproc N]
        [--worlds 1,2,4] [--sizes 1M,128M] [--variants compiled,eager,plain] [--steps 50] [--warmup 5] [--append FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GPT_SOURCE = ROOT / "tilewise" / "models" / "gpt.py"
KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
SIZES = [KB << (2 * k) for k in range(11)]  # 1 KB .. 1 GB, by fours
QUICK_SIZES = [KB, MB, 64 * MB]
CPU_SIZES = [KB, 64 * KB]
GPT2 = {"layers": 12, "heads": 12, "embd": 768, "block": 1024, "batch": 8, "vocab": 50304, "autocast": "bfloat16"}
QUICK_GPT = {"layers": 2, "heads": 4, "embd": 128, "block": 128, "batch": 4, "vocab": 512, "autocast": "bfloat16"}
CPU_GPT = {"layers": 1, "heads": 2, "embd": 32, "block": 16, "batch": 2, "vocab": 20, "autocast": "fp32"}
# GPT-2 XL (1.56B parameters with the tied head): fp32 weights (the master copy), bf16 autocast, AdamW, one
# sequence a rank, so that the optimizer state (not the activations) is what sharding has to divide
GPT2_XL = {"layers": 48, "heads": 25, "embd": 1600, "block": 1024, "batch": 1, "vocab": 50304,
           "autocast": "bfloat16"}
QUICK_XL = {"layers": 4, "heads": 4, "embd": 256, "block": 256, "batch": 1, "vocab": 4096, "autocast": "bfloat16"}
_TORCH_IMPORTS = {
    "from tilewise import nn": "from torch import nn",
    "from tilewise.autograd.grad_mode import no_grad": "from torch import no_grad",
    "from tilewise.nn import functional as F": "from torch.nn import functional as F",
    "from tilewise.ops.creation import arange": "from torch import arange",
    "from tilewise.ops.functions import cat": "from torch import cat",
    "from tilewise.tensor import Tensor, tensor": "from torch import Tensor, tensor",
}
NAN = float("nan")
# --variants: how tilewise runs the step ("plain": the compiled step without DDP, each rank on its own part of the
# batch, no communication: what DDP's compiled step is measured against, in the same launch)
VARIANTS = {"compiled": "compiled step", "eager": "eager", "plain": "compiled, no DDP"}
EXIT_GRACE = 30.0  # seconds a launch may take to end after every rank has written its figures


# ============================================================================================= the driver

@dataclass
class Launch:
    """One launch of ranks (or of a single process) and what came back."""

    side: str
    results: list[dict] = field(default_factory=list)  # one per rank, by rank
    error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(library: str, nproc: int) -> list[str]:
    module = "tilewise.distributed.run" if library == "tilewise" else "torch.distributed.run"
    return [sys.executable, "-m", module, "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port())]


def launch(side: str, worker: str, config: dict, nproc: int | None, timeout: float, chosen: set[str],
           gpus: str | None = None) -> Launch:
    """Run ``worker`` on ``nproc`` ranks (None: one plain process) and collect each rank's JSON; a library left
    out by ``--sides`` is not launched. ``gpus``: the launch's CUDA_VISIBLE_DEVICES (default: as inherited)."""
    found = Launch(side)
    library = "torch" if worker.startswith("torch") else "tilewise"
    if library not in chosen:
        found.error = "not run (--sides)"
        return found
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tw-dist-bench-") as out:
        config = dict(config, out=out)
        script = [str(Path(__file__).resolve()), "--worker", worker, "--config", json.dumps(config)]
        command = [sys.executable, *script] if nproc is None else [*launcher(library, nproc), *script]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        ranks = 1 if nproc is None else nproc
        done = run_bounded(command, env, timeout, [Path(out) / f"{rank}.json" for rank in range(ranks)])
        for rank in range(ranks):
            path = Path(out) / f"{rank}.json"
            if path.exists():
                found.results.append(json.loads(path.read_text()))
        errors = [r["error"] for r in found.results if r.get("error")]
        if errors:
            found.error = errors[0]
        elif len(found.results) != ranks:
            found.error = f"exit status {done.returncode}: {last_error_line(done.stdout)}"
        elif done.returncode != 0:  # the figures are whole; say that the ranks did not end cleanly
            first = found.results[0]
            first["note"] = "; ".join(filter(None, [first.get("note", ""), last_error_line(done.stdout)]))
    # progress on stderr, so that a run stopped from outside still tells how far it came
    times = [t for r in found.results[:1] for t in r.get("times", [])][config.get("warmup", 0):]
    median = f", median step {statistics.median(times) * 1e3:.2f} ms" if times else ""
    print(f"[distributed.py] {worker} on {ranks} rank(s): {found.error or 'ok'}{median} "
          f"({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    return found


def run_bounded(command: list[str], env: dict, timeout: float, answers: list[Path]) -> subprocess.CompletedProcess:
    """Run ``command`` in its own process group, its output in a file (a rank left behind cannot hold a pipe
    open); kill the group past ``timeout``, or once every rank has answered and the launch has had
    :data:`EXIT_GRACE` seconds to end (a rank stuck on its way out must not stall the run)."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        deadline, answered_at, note = time.monotonic() + timeout, None, ""
        while process.poll() is None:
            now = time.monotonic()
            if answered_at is None and all(path.exists() for path in answers):
                answered_at = now
            if now > deadline or (answered_at is not None and now - answered_at > EXIT_GRACE):
                note = (f"\nTimeoutError: the launch ran past {timeout:g} s and was killed" if now > deadline
                        else f"\nevery rank answered, but the launch had not ended {EXIT_GRACE:g} s later: killed")
                stop(process, answers)
                break
            time.sleep(0.2)
        log.seek(0)
        output = log.read() + note
    if process.returncode != 0:
        sys.stderr.write(output[-4000:])
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def stop(process: subprocess.Popen, answers: list[Path]) -> None:
    """End a launch: SIGTERM first (a launcher then stops its ranks, which run in sessions of their own), SIGKILL
    to its process group and to every rank that gave its pid if that is not enough."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for path in answers:
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = json.loads(path.read_text())["pid"]
            if b"--worker" in Path(f"/proc/{pid}/cmdline").read_bytes():  # still that rank, not a reused pid
                os.kill(pid, signal.SIGKILL)


def last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    text = (errors or lines or ["no output"])[-1]
    return text[:297] + "..." if len(text) > 300 else text


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if ours == ours and theirs == theirs and theirs else "n/a"


def figure(value: float) -> str:
    """Three significant digits (bus bandwidths span 1e-3 to 1e3 GB/s), or n/a."""
    return f"{value:.3g}" if value == value else "n/a"


# ---- collectives

def collectives_config(args: argparse.Namespace) -> dict:
    sizes = args.sizes or (CPU_SIZES if args.cpu else QUICK_SIZES if args.quick else SIZES)
    return {"device": "cpu" if args.cpu else "cuda", "sizes": sizes, "dtypes": ["bfloat16", "float32"],
            "collectives": list(COLLECTIVES), "quick": bool(args.quick or args.cpu)}


def run_collectives(args: argparse.Namespace) -> str:
    config = collectives_config(args)
    nproc = args.nproc
    tilewise = launch("tilewise", "tilewise-collectives", config, nproc, args.timeout, args.sides)
    torch_side = launch("torch", "torch-collectives", config, nproc, args.timeout, args.sides)
    ours = rows_by_key(tilewise, "tilewise")
    raw = rows_by_key(tilewise, "nccl4py")
    theirs = rows_by_key(torch_side, "torch")
    peer = "gloo" if args.cpu else "nccl"
    lines = [f"### Collectives: bus bandwidth, {nproc} ranks, {'CPU over gloo' if args.cpu else 'GPUs over NCCL'}",
             "", versions(tilewise, torch_side), "",
             "| collective | dtype | size | tilewise GB/s | nccl4py raw GB/s | tilewise / raw | "
             f"torch ({peer}) GB/s | tilewise / torch | result (tilewise / torch) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in config["collectives"]:
        for dtype in config["dtypes"]:
            for size in config["sizes"]:
                key = (name, dtype, size)
                a, r, t = ours.get(key, {}), raw.get(key, {}), theirs.get(key, {})
                a_bw, r_bw, t_bw = a.get("busbw", NAN), r.get("busbw", NAN), t.get("busbw", NAN)
                lines.append(f"| {name} | {dtype} | {format_size(size)} | {figure(a_bw)} | {figure(r_bw)} | "
                             f"{ratio(a_bw, r_bw)} | {figure(t_bw)} | {ratio(a_bw, t_bw)} | "
                             f"{verdict(a)} / {verdict(t)} |")
    for launched, what in ((tilewise, "tilewise"), (torch_side, "torch")):
        if launched.error:
            lines.append(f"| {what}: error | | | | | | | | {cell(launched.error)} |")
    missing_raw = tilewise.results and not raw and not args.cpu
    if missing_raw:
        lines.append(f"| nccl4py raw: error | | | | | | | | {cell(tilewise.results[0].get('raw_error', ''))} |")
    return "\n".join(lines)


def versions(*launches: Launch) -> str:
    found = dict.fromkeys(r.get("version", "") for side in launches for r in side.results[:1])
    return "Ran with " + (", ".join(v for v in found if v) or "no side reporting its version") + "."


def verdict(row: dict) -> str:
    """Whether a checked call gave the values its arithmetic must give."""
    return {True: "ok", False: "WRONG"}.get(row.get("correct"), "n/a")


def rows_by_key(launched: Launch, side: str) -> dict[tuple, dict]:
    if not launched.results:
        return {}
    return {(r["collective"], r["dtype"], r["size"]): r for r in launched.results[0].get("rows", [])
            if r["side"] == side}


def format_size(size: int) -> str:
    for unit, name in ((GB, "GB"), (MB, "MB"), (KB, "KB")):
        if size >= unit:
            return f"{size // unit} {name}"
    return f"{size} B"


# ---- GPT

def gpt_config(args: argparse.Namespace) -> dict:
    model = CPU_GPT if args.cpu else QUICK_GPT if args.quick else GPT2
    steps = args.steps if args.steps is not None else (4 if args.cpu else 12 if args.quick else 50)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 3 if args.quick else 5)
    if steps <= warmup:
        raise SystemExit(f"--steps ({steps}) must exceed --warmup ({warmup})")
    return dict(model, device="cpu" if args.cpu else "cuda", steps=steps, warmup=warmup, lr=3e-4)


def write_weights(config: dict, folder: str) -> tuple[str, int]:
    """The initial weights every side and rank starts from (tilewise's GPT initialisation, seed 0), as .npz."""
    import tilewise as tw
    from tilewise.models import gpt as tw_gpt

    tw.manual_seed(0)
    model = tw_gpt.GPT(tw_gpt.GPTConfig(vocab_size=config["vocab"], block_size=config["block"],
                                        n_layer=config["layers"], n_head=config["heads"], n_embd=config["embd"]))
    path = os.path.join(folder, "weights.npz")
    np.savez(path, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    return path, model.num_parameters()


def visible_gpus() -> int:
    """How many GPUs this process may use (CUDA_VISIBLE_DEVICES respected), without making a CUDA context."""
    import tilewise as tw

    return tw.cuda.device_count() if tw.cuda.is_available() else 0


def run_gpt(args: argparse.Namespace) -> str:
    base = gpt_config(args)
    lines, launched, losses = [], [], []
    with tempfile.TemporaryDirectory(prefix="tw-dist-gpt-") as folder:
        weights, params = write_weights(base, folder)
        base["weights"] = weights
        tokens = base["batch"] * base["block"]
        lines += [f"### GPT training with DistributedDataParallel ({params / 1e6:.2f}M params, batch "
                  f"{base['batch']}x{base['block']} a rank, {base['autocast']}, AdamW lr {base['lr']}, "
                  f"clip_grad_norm_(1.0), {base['steps']} steps, median after {base['warmup']})", "",
                  f"| ranks | side | step (ms) | tokens/s (all ranks) | speed vs {peer_name(args)} | "
                  "first / second step (s) | max loss diff vs 1-GPU global batch | note |",
                  "|---:|---|---:|---:|---:|---:|---:|---|"]
        for world in args.worlds:
            config = dict(base, world=world)
            # the reference gives losses only: on a GPU the ranks leave free it runs beside them, else before them
            spare = not args.cpu and visible_gpus() > world
            ranks_on = ",".join(str(g) for g in range(world)) if spare else None
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(launch, "1 process, global batch", "tilewise-gpt-reference", config, None,
                                      args.timeout, {"tilewise"}, str(world) if spare else None)
                if not spare:
                    pending.result()
                peer = (peer_name(args), "torch-gpt-eager" if args.cpu else "torch-gpt-compiled")
                sides = [launch(side_name(variant), f"tilewise-gpt-{variant}", config, world, args.timeout,
                                args.sides, ranks_on) for variant in args.variants]
                sides.append(launch(*peer, config, world, args.timeout, args.sides, ranks_on))
                reference = pending.result()
            launched += sides
            peer_ms = step_ms(sides[-1], base["warmup"])
            for side in sides:
                ms = step_ms(side, base["warmup"])
                rate = f"{tokens * world / ms * 1e3:,.0f}" if ms == ms else "n/a"
                note = side.error or "; ".join(filter(None, (r.get("note", "") for r in side.results[:1])))
                lines.append(f"| {world} | {side.side} | {figure(ms)} | {rate} | {ratio(peer_ms, ms)} | "
                             f"{first_steps(side)} | {loss_difference(side, reference)} | {cell(note)} |")
            if reference.error:
                lines.append(f"| {world} | 1-GPU reference: error | | | | | | {cell(reference.error)} |")
            losses += [f"{world} rank(s), {side.side:<28}: " + " ".join(f"{v:.4f}" for v in global_losses(side)[:8])
                       for side in (reference, *sides)]
    return "\n".join([*lines[:1], "", versions(*launched), "", "First global losses:", "```", *losses, "```",
                      *lines[1:]])


def side_name(variant: str) -> str:
    return f"tilewise, {VARIANTS[variant]}" if variant == "plain" else f"tilewise DDP, {VARIANTS[variant]}"


def peer_name(args: argparse.Namespace) -> str:
    """torch DDP with torch.compile on GPUs; eager on the CPU smoke run, where Inductor's C++ build would take
    longer than the whole run should."""
    return "torch DDP, eager" if args.cpu else "torch DDP + torch.compile"


# ---- a model that needs sharding

def sharded_config(args: argparse.Namespace) -> dict:
    model = CPU_GPT if args.cpu else QUICK_XL if args.quick else GPT2_XL
    steps = args.steps if args.steps is not None else (3 if args.cpu else 6 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 2 if args.quick else 3)
    return dict(model, device="cpu" if args.cpu else "cuda", steps=steps, warmup=warmup, lr=1e-4)


def run_sharded(args: argparse.Namespace) -> str:
    """GPT-2 XL with AdamW: one unsharded process (the memory it needs), then ``fully_shard`` on each block and
    the root across ``--worlds`` ranks (each rank's peak memory against that need), tilewise beside torch's
    FSDP2. Each library starts from its own seeded initialisation; tilewise's sharded losses are compared with
    its unsharded ones on the same global batch."""
    base = sharded_config(args)
    rows, launched = [], []
    worlds = [w for w in args.worlds if w > 1] or [2]
    for world in worlds:
        config = dict(base, world=world)
        single = {lib: launch(f"{lib}, 1 process, unsharded, global batch", f"{lib}-gpt-unsharded", config, None,
                              args.timeout, args.sides) for lib in ("tilewise", "torch")}
        sharded = {lib: launch(f"{lib} fully_shard, {world} ranks", f"{lib}-gpt-sharded", config, world,
                               args.timeout, args.sides) for lib in ("tilewise", "torch")}
        launched += [*single.values(), *sharded.values()]
        for lib in ("tilewise", "torch"):
            need, side = peak_gib(single[lib]), sharded[lib]
            peak = peak_gib(side)
            diff = loss_difference(side, single[lib]) if lib == "tilewise" else "(own initialisation)"
            note = side.error or single[lib].error
            rows.append(f"| {world} | {lib} | {figure(need)} | {figure(peak)} | {ratio(peak, need)} | "
                        f"{figure(step_ms(single[lib], base['warmup']))} | {figure(step_ms(side, base['warmup']))} | "
                        f"{diff} | {cell(note)} |")
    params = base["layers"] * 12 * base["embd"] ** 2 + (base["vocab"] + base["block"]) * base["embd"]
    return "\n".join([f"### Sharded training: GPT {base['layers']}L {base['embd']}d (~{params / 1e9:.2f}B params), "
                      f"fp32 weights, {base['autocast']} autocast, AdamW, batch {base['batch']}x{base['block']} "
                      "a rank, "
                      f"{base['steps']} steps, median after {base['warmup']}", "", versions(*launched), "",
                      "| ranks | side | unsharded peak GiB (1 GPU, global batch) | sharded peak GiB a rank | "
                      "sharded / unsharded | unsharded step (ms) | sharded step (ms) | max loss diff vs unsharded | "
                      "note |", "|---:|---|---:|---:|---:|---:|---:|---:|---|", *rows])


def peak_gib(side: Launch) -> float:
    peaks = [r["peak"] for r in side.results if "peak" in r]
    return max(peaks) / GB if peaks else NAN


def step_ms(side: Launch, warmup: int) -> float:
    if side.error or not side.results:
        return NAN
    times = side.results[0]["times"][warmup:]
    return statistics.median(times) * 1e3 if times else NAN


def first_steps(side: Launch) -> str:
    times = side.results[0]["times"] if side.results and not side.error else []
    return f"{times[0]:.2f} / {times[1]:.2f}" if len(times) > 1 else "n/a"


def global_losses(side: Launch) -> list[float]:
    """The loss of the whole global batch at each step: the mean of the ranks' losses (equal-sized parts)."""
    per_rank = [r["losses"] for r in side.results] if not side.error else []
    return [float(np.mean(step)) for step in zip(*per_rank)] if per_rank else []


def loss_difference(side: Launch, reference: Launch) -> str:
    ours, theirs = global_losses(side), global_losses(reference)
    n = min(len(ours), len(theirs), 50)
    if side.error or reference.error or not n:
        return "n/a"
    return f"{max(abs(a - b) for a, b in zip(ours[:n], theirs[:n])):.2e} over {n}"


# ============================================================================================= the ranks

def rank_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def library(name: str) -> Any:
    if name == "torch":
        import torch

        return torch
    import tilewise

    return tilewise


def start_group(lib: Any, device_type: str) -> tuple[Any, str]:
    """Join the job's process group; return the module and this rank's device."""
    dist = importlib.import_module(f"{lib.__name__}.distributed")
    _, _, local = rank_env()
    if device_type == "cuda":
        if not lib.cuda.is_available():
            raise RuntimeError(f"{lib.__name__} has no CUDA here ({lib.__name__} {lib.__version__})")
        lib.cuda.set_device(local)
        dist.init_process_group(backend=None, timeout=datetime.timedelta(seconds=300))
        return dist, f"cuda:{local}"
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
    return dist, "cpu"


class Clock:
    """Seconds of a run of calls: CUDA events on the current stream, or the host's clock for CPU work."""

    def __init__(self, lib: Any, device: str) -> None:
        self.lib, self.cuda = lib, device.startswith("cuda")

    def time(self, call: Any, iterations: int) -> float:
        if self.cuda:
            start, end = self.lib.cuda.Event(enable_timing=True), self.lib.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iterations
        begin = time.perf_counter()
        for _ in range(iterations):
            call()
        return (time.perf_counter() - begin) / iterations


def iterations_for(size: int, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) calls for a message of ``size`` bytes: fewer for large ones."""
    if quick:
        return 2, 5
    return (5, 50) if size <= 16 * MB else (3, 20) if size <= 256 * MB else (2, 8)


def bus_factor(name: str, world: int) -> float:
    return 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world


def collective_buffers(lib: Any, name: str, size: int, dtype: Any, world: int, device: str) -> tuple[Any, Any]:
    """(output, input) of ``name`` for a message of ``size`` bytes (the whole of it, as nccl-tests count it)."""
    itemsize = lib.empty(0, dtype=dtype).element_size()
    whole = max(size // itemsize // world, 1) * world
    if name == "all_reduce":
        buf = lib.zeros(whole, dtype=dtype, device=device)
        return buf, buf
    if name == "all_gather_into_tensor":
        return lib.zeros(whole, dtype=dtype, device=device), lib.zeros(whole // world, dtype=dtype, device=device)
    return lib.zeros(whole // world, dtype=dtype, device=device), lib.zeros(whole, dtype=dtype, device=device)


def issue_with(dist: Any, name: str, output: Any, input: Any) -> Any:  # noqa: A002 -- torch's name
    if name == "all_reduce":
        return lambda: dist.all_reduce(output)
    if name == "all_gather_into_tensor":
        return lambda: dist.all_gather_into_tensor(output, input)
    return lambda: dist.reduce_scatter_tensor(output, input)


def check_collective(lib: Any, dist: Any, name: str, output: Any, input: Any, rank: int, world: int) -> bool:
    """One call on known values (rank + 1 everywhere), compared with the arithmetic it must give."""
    input.fill_(rank + 1)
    issue_with(dist, name, output, input)()
    got = output.float().cpu()
    if name == "all_gather_into_tensor":
        expected = lib.arange(1, world + 1, dtype=lib.float32).repeat_interleave(output.numel() // world)
    else:
        expected = lib.full((output.numel(),), float(world * (world + 1) // 2), dtype=lib.float32)
    return bool((got == expected).all().item())


class RawNccl:
    """nccl4py's raw calls on tilewise's buffers, through a communicator of their own: NCCL's own figure."""

    def __init__(self, dist: Any, rank: int, world: int) -> None:
        import nccl.core as nc
        from nccl.bindings import nccl as nb

        shared = [bytes(nc.get_unique_id()) if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        self.nb = nb
        self.comm = nc.Communicator.init(nranks=world, rank=rank, unique_id=nc.UniqueId.from_bytes(shared[0]))
        self.handle = nb.Comm(self.comm.ptr)

    def issue(self, lib: Any, name: str, output: Any, input: Any) -> Any:  # noqa: A002
        from tilewise.distributed.nccl import buffer_of

        nb, src, dst = self.nb, buffer_of(input), buffer_of(output)
        stream = lib.cuda.current_stream().handle
        if name == "all_reduce":
            return lambda: nb.all_reduce(src.ptr, dst.ptr, src.count, src.dtype, int(nb.RedOp.Sum), self.handle, stream)
        if name == "all_gather_into_tensor":
            return lambda: nb.all_gather(src.ptr, dst.ptr, src.count, src.dtype, self.handle, stream)
        return lambda: nb.reduce_scatter(src.ptr, dst.ptr, dst.count, dst.dtype, int(nb.RedOp.Sum), self.handle,
                                         stream)


def collectives_worker(lib_name: str, config: dict) -> dict:
    lib = library(lib_name)
    dist, device = start_group(lib, config["device"])
    rank, world, _ = rank_env()
    clock = Clock(lib, device)
    raw, raw_error = None, ""
    if lib_name == "tilewise" and device.startswith("cuda"):
        try:
            raw = RawNccl(dist, rank, world)
        except Exception as exc:  # noqa: BLE001 -- the raw side is reported as an error row
            raw_error = describe(exc)
    rows = []
    for name in config["collectives"]:
        for dtype_name in config["dtypes"]:
            for size in config["sizes"]:
                output, input_ = collective_buffers(lib, name, size, getattr(lib, dtype_name), world, device)
                correct = check_collective(lib, dist, name, output, input_, rank, world)
                warm, timed = iterations_for(size, config["quick"])
                calls = {lib_name: issue_with(dist, name, output, input_)}
                if raw is not None:
                    calls["nccl4py"] = raw.issue(lib, name, output, input_)
                for side, call in calls.items():
                    clock.time(call, warm)
                    seconds = clock.time(call, timed)
                    rows.append({"side": side, "collective": name, "dtype": dtype_name, "size": size,
                                 "seconds": seconds, "busbw": size * bus_factor(name, world) / seconds / 1e9,
                                 "correct": correct})
                del output, input_
    dist.barrier()
    dist.destroy_process_group()
    return {"rows": rows, "raw_error": raw_error}


# ---- GPT on the ranks

def torch_gpt_module() -> types.ModuleType:
    """``tilewise/models/gpt.py`` with its tilewise imports swapped for torch's (the rest of it unchanged)."""
    source = GPT_SOURCE.read_text()
    for ours, theirs in _TORCH_IMPORTS.items():
        if ours not in source:
            raise RuntimeError(f"gpt.py no longer has the import {ours!r}; update the swap table")
        source = source.replace(ours, theirs)
    module = types.ModuleType("gpt_on_torch")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, "gpt.py (torch imports)", "exec"), module.__dict__)
    return module


def gpt_model(lib: Any, config: dict, device: str) -> Any:
    if lib.__name__ == "torch":
        module = torch_gpt_module()
    else:
        from tilewise.models import gpt as module
    model = module.GPT(module.GPTConfig(vocab_size=config["vocab"], block_size=config["block"],
                                        n_layer=config["layers"], n_head=config["heads"], n_embd=config["embd"]))
    with np.load(config["weights"]) as weights:
        model.load_state_dict({k: lib.from_numpy(weights[k].copy()) for k in weights.files})
    return model.to(device)


def batch(lib: Any, config: dict, step: int, part: int, device: str) -> tuple[Any, Any]:
    """Rank ``part``'s share of step ``step``'s global batch (the same tokens for every side)."""
    rng = np.random.default_rng(1000 + step)
    size = (config["world"] * config["batch"], config["block"])
    x, y = rng.integers(0, config["vocab"], size=size), rng.integers(0, config["vocab"], size=size)
    rows = slice(part * config["batch"], (part + 1) * config["batch"])
    return lib.from_numpy(x[rows].copy()).to(device), lib.from_numpy(y[rows].copy()).to(device)


def autocast(lib: Any, config: dict, device: str) -> Any:
    if config["autocast"] == "fp32":
        return contextlib.nullcontext()
    return lib.autocast(device_type=device.split(":")[0], dtype=getattr(lib, config["autocast"]))


def gpt_step(lib: Any, model: Any, optimizer: Any, config: dict, device: str) -> Any:
    def step(x: Any, y: Any) -> Any:
        with autocast(lib, config, device):  # the forward only, as torch's mixed-precision recipe has it
            _, loss = model(x, y)
        loss.backward()
        lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def train(lib: Any, step: Any, config: dict, part: int, device: str) -> dict:
    sync = lib.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, losses = [], []
    for k in range(config["steps"]):
        x, y = batch(lib, config, k, part, device)
        sync()
        begin = time.perf_counter()
        loss = step(x, y)
        sync()
        times.append(time.perf_counter() - begin)
        losses.append(float(loss.item()))
    return {"times": times, "losses": losses}


def gpt_worker(lib_name: str, compiled: bool, config: dict, ddp: bool = True) -> dict:
    lib = library(lib_name)
    dist, device = start_group(lib, config["device"])
    rank, _, local = rank_env()
    model = gpt_model(lib, config, device)
    parallel = importlib.import_module(f"{lib.__name__}.nn.parallel")
    if ddp:
        ddp = parallel.DistributedDataParallel(model, device_ids=[local] if device.startswith("cuda") else None)
    else:
        ddp = model
    note = ""
    if lib_name == "torch":
        fused = {"fused": True} if device.startswith("cuda") else {}
        optimizer = lib.optim.AdamW(model.parameters(), lr=config["lr"], **fused)
        step = gpt_step(lib, lib.compile(ddp) if compiled else ddp, optimizer, config, device)
    else:
        optimizer = lib.optim.AdamW(model.parameters(), lr=config["lr"])
        step = gpt_step(lib, ddp, optimizer, config, device)
        if compiled:
            step = lib.compile(step)
    result = train(lib, step, config, rank, device)
    reason = getattr(step, "eager_reason", None)
    if reason:
        note = f"tilewise.compile ran the step eagerly: {reason}"
    dist.destroy_process_group()
    return dict(result, note=note)


def fresh_gpt(lib: Any, config: dict, device: str) -> Any:
    """A GPT of ``config`` from the library's own seeded initialisation (no weights file: GPT-2 XL's would be
    6 GB), made on ``device`` (initialising 1.5B parameters on the CPU takes minutes)."""
    module = torch_gpt_module() if lib.__name__ == "torch" else importlib.import_module("tilewise.models.gpt")
    lib.manual_seed(0)
    with lib.device(device):
        return module.GPT(module.GPTConfig(vocab_size=config["vocab"], block_size=config["block"],
                                           n_layer=config["layers"], n_head=config["heads"], n_embd=config["embd"]))


def sharded_worker(lib_name: str, sharded: bool, config: dict) -> dict:
    """Train with AdamW: unsharded in one process on the whole global batch (gradient accumulation over the
    ranks' parts), or sharded with ``fully_shard`` per block and at the root, a part a rank."""
    lib = library(lib_name)
    if sharded:
        dist, device = start_group(lib, config["device"])
        rank, world, _ = rank_env()
        parts = [rank]
    else:
        dist, device, world = None, "cuda:0" if config["device"] == "cuda" else "cpu", config["world"]
        if device.startswith("cuda"):
            lib.cuda.set_device(0)
        parts = list(range(world))
    model = fresh_gpt(lib, config, device)
    if sharded:
        fully_shard = importlib.import_module(f"{lib.__name__}.distributed.fsdp").fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = lib.optim.AdamW(model.parameters(), lr=config["lr"])
    cuda = device.startswith("cuda")
    if cuda:
        lib.cuda.synchronize()
        lib.cuda.reset_peak_memory_stats()
    result = accumulated_training(lib, model, optimizer, config, parts, device)
    result["peak"] = lib.cuda.max_memory_allocated() if cuda else 0
    if dist is not None:
        dist.destroy_process_group()
    return result


def accumulated_training(lib: Any, model: Any, optimizer: Any, config: dict, parts: list[int], device: str) -> dict:
    """``config["steps"]`` AdamW steps, each on the batch parts ``parts`` as gradient accumulation (the mean of
    their losses), gradients clipped to norm 1: each step's seconds between synchronisations and its loss."""
    sync = lib.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, losses = [], []
    for k in range(config["steps"]):
        batches = [batch(lib, config, k, part, device) for part in parts]
        sync()
        begin = time.perf_counter()
        total = 0.0
        for x, y in batches:
            with autocast(lib, config, device):
                _, loss = model(x, y)
            (loss / len(parts)).backward()
            total += float(loss.item()) / len(parts)
        lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - begin)
        losses.append(total)
    return {"times": times, "losses": losses}


def gpt_reference_worker(config: dict) -> dict:
    """Single-GPU training on the whole global batch, as gradient accumulation over the ranks' parts."""
    import tilewise as tw

    device = "cuda:0" if config["device"] == "cuda" else "cpu"
    model = gpt_model(tw, config, device)
    optimizer = tw.optim.AdamW(model.parameters(), lr=config["lr"])
    result = accumulated_training(tw, model, optimizer, config, list(range(config["world"])), device)
    return {"times": [], "losses": result["losses"]}


WORKERS = {
    "tilewise-collectives": lambda c: collectives_worker("tilewise", c),
    "torch-collectives": lambda c: collectives_worker("torch", c),
    "tilewise-gpt-compiled": lambda c: gpt_worker("tilewise", True, c),
    "tilewise-gpt-eager": lambda c: gpt_worker("tilewise", False, c),
    "tilewise-gpt-plain": lambda c: gpt_worker("tilewise", True, c, ddp=False),
    "torch-gpt-compiled": lambda c: gpt_worker("torch", True, c),
    "torch-gpt-eager": lambda c: gpt_worker("torch", False, c),
    "tilewise-gpt-reference": gpt_reference_worker,
    "tilewise-gpt-unsharded": lambda c: sharded_worker("tilewise", False, c),
    "tilewise-gpt-sharded": lambda c: sharded_worker("tilewise", True, c),
    "torch-gpt-unsharded": lambda c: sharded_worker("torch", False, c),
    "torch-gpt-sharded": lambda c: sharded_worker("torch", True, c),
}


def describe(exc: BaseException) -> str:
    traceback.print_exc()
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = " ".join(lines[:3])
    return text[:297] + "..." if len(text) > 300 else text


def version_of(worker: str) -> str:
    lib = sys.modules.get("torch" if worker.startswith("torch") else "tilewise")
    return f"{lib.__name__} {lib.__version__}" if lib is not None else ""


def worker_main(worker: str, config: dict) -> int:
    """Run one rank's part; its figures, or its error, go to ``<out>/<rank>.json``."""
    rank = rank_env()[0]
    try:
        result = WORKERS[worker](config)
    except Exception as exc:  # noqa: BLE001 -- the driver reports it as the side's error row
        result = {"error": describe(exc)}
    result["version"] = version_of(worker)
    result["pid"] = os.getpid()
    answer = Path(config["out"], f"{rank}.json")
    answer.with_suffix(".part").write_text(json.dumps(result))
    answer.with_suffix(".part").rename(answer)  # whole, or not there: the driver reads it as soon as it appears
    return 1 if "error" in result else 0


# ============================================================================================= entry point

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", action="store_true", help="bus bandwidth of the collectives")
    parser.add_argument("--gpt", action="store_true", help="GPT-2 124M DDP training tokens/s")
    parser.add_argument("--sharded", action="store_true",
                        help="GPT-2 XL with fully_shard: peak memory a rank against one unsharded process")
    parser.add_argument("--sizes", help="message sizes for --collectives, e.g. 1M,16M,128M (K, M, G suffixes)")
    parser.add_argument("--variants", default="compiled,eager",
                        help="how tilewise runs the step for --gpt: compiled, eager, plain (compiled without DDP)")
    parser.add_argument("--quick", action="store_true", help="few sizes, a small GPT, few steps")
    parser.add_argument("--cpu", action="store_true", help="gloo between 2 CPU processes at tiny sizes (smoke test)")
    parser.add_argument("--nproc", type=int, help="ranks for --collectives (default: every GPU; 2 with --cpu)")
    parser.add_argument("--worlds", help="rank counts for --gpt, e.g. 1,2,4 (default: those the GPUs allow)")
    parser.add_argument("--steps", type=int, help="GPT steps (default 50; the losses of up to 50 are compared)")
    parser.add_argument("--warmup", type=int, help="GPT steps left out of the median (default 5)")
    parser.add_argument("--sides", default="tilewise,torch", help="libraries to launch (tilewise, torch)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one launch may take")
    parser.add_argument("--append", help="append the report to this markdown file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sides = set(args.sides.split(","))
    if not (args.collectives or args.gpt or args.sharded):
        args.collectives = args.gpt = True
    args.sizes = [parse_size(text) for text in args.sizes.split(",")] if args.sizes else None
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    gpus = 0 if args.cpu else gpu_count()
    args.nproc = args.nproc or (2 if args.cpu else max(gpus, 1))
    if args.worlds:
        args.worlds = [int(w) for w in args.worlds.split(",")]
    else:
        args.worlds = [2] if args.cpu else [w for w in (1, 2, 4) if w <= max(gpus, 1)]
    return args


def parse_size(text: str) -> int:
    """``128M`` -> 134217728 (K, M and G are powers of 1024; a bare number is bytes)."""
    units = {"K": KB, "M": MB, "G": GB}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def gpu_count() -> int:
    """GPUs here, asked of the driver in a child process so that this one never holds a CUDA context."""
    probe = "import tilewise as tw; print(tw.cuda.device_count())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, json.loads(args.config))
    where = "CPU, gloo" if args.cpu else f"{gpu_count()} GPU(s)"
    sections = [f"## Several processes — `benchmarks/distributed.py` ({datetime.date.today()}, {where}, "
                f"python {sys.version.split()[0]})"]
    print(sections[0] + "\n", flush=True)
    for wanted, run in ((args.collectives, run_collectives), (args.gpt, run_gpt), (args.sharded, run_sharded)):
        if wanted:
            sections.append(run(args))
            print(sections[-1] + "\n", flush=True)
    text = "\n\n".join(sections) + "\n"
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
