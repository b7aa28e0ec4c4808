"""Measured schedules: ``mode="max-autotune"`` times each kernel's candidate schedules and keeps the fastest.

[Note: autotuning] The scheduler's heuristics guess; ``schedule.candidates`` lists the legal alternatives to
each guess, the guess first. At build time each kernel's choice is looked up in the *decision cache*: in
memory, then on disk beside the compiled kernels (``$TILEWISE_CACHE_DIR/autotune``), under the sha256 of
everything that changes which candidate wins — the kernel's source under the heuristic's schedule (it spells
out the shapes, strides and dtypes), the candidates' knobs, the machine (C: compiler version, flags, CPU and
thread count; CUDA: GPU name, arch, NVRTC version) and :data:`AUTOTUNE_FORMAT_VERSION`. A kernel found there
is built with its winner straight away, so a second process compiling the same function times nothing.

The other kernels are built with the heuristic's schedule, and their candidates are compiled beside it. The
program's first run times them where they run, on that call's real buffers: the walk reaches a kernel with
its inputs computed, times every candidate, swaps the winner into the program, records the decision and runs
the winner for real. A kernel that writes memory it also reads (a parameter updated in place) runs its
candidates on a scratch copy of that memory, restored before every timed run, so the caller's tensors end
as one run leaves them.

Timing (``measure``) is the one cuBLASLt's algorithm choice proved trustworthy: the device is first kept
busy until its clocks leave idle; every candidate runs once untimed (first-launch costs); then rounds run the
candidates in turn, the order rotating every round, so neither clock drift nor the caches the previous
candidate left behind favour a position; a candidate's time is its median over rounds. A sample repeats a
short kernel until it lasts long enough for the timer, and long kernels get fewer rounds, to stay within a
per-kernel budget. The heuristic's choice stays unless another is faster by more than :data:`MARGIN`: a
difference within run-to-run noise should not change the generated code.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tilewise.codegen.kernel_ir import Kernel
from tilewise.codegen.schedule import KernelSchedule, Tuned
from tilewise.codegen.toolchain.cache import default_cache_dir
from tilewise.codegen.toolchain.disk import DiskCache
from tilewise.config import log

if TYPE_CHECKING:
    from tilewise.compiler.targets import Target

AUTOTUNE_FORMAT_VERSION = 2  # bumped when a knob's meaning or the entries' format changes
MARGIN = 0.03  # another candidate replaces the heuristic's only when at least this much faster


# ---------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class Policy:
    """How a target's candidates are timed (seconds)."""

    warmup: float  # device time spent before timing, for the clocks to leave idle
    sample: float  # a sample repeats a short kernel until it lasts about this long
    budget: float  # per kernel: every candidate's rounds together
    rounds: tuple[int, int] = (5, 25)  # the fewest and the most
    max_repeats: int = 1000




@dataclass
class Sampler:
    """One candidate, ready to time: ``run(repeats)`` returns seconds per run.

    ``repeatable`` is False for a kernel whose runs must each start from restored memory (it updates an
    input in place); the sampler restores it before timing, so such a kernel is timed one run at a time."""

    run: Callable[[int], float]
    repeatable: bool = True


def measure(samplers: list[Sampler], policy: Policy) -> list[float]:
    """Median seconds per run of each candidate, timed in interleaved rounds (see the note)."""
    _warm_up(samplers[0], policy)
    first = [s.run(1) for s in samplers]  # untimed: first-launch costs; a rough size of each sample
    repeats = [_repeats(s, t, policy) for s, t in zip(samplers, first)]
    per_round = sum(t * r for t, r in zip(first, repeats))
    low, high = policy.rounds
    rounds = max(low, min(high, int(policy.budget / max(per_round, 1e-9))))
    times: list[list[float]] = [[] for _ in samplers]
    n = len(samplers)
    for r in range(rounds):
        for k in [(r + j) % n for j in range(n)]:
            times[k].append(samplers[k].run(repeats[k]))
    return [statistics.median(t) for t in times]


def _warm_up(sampler: Sampler, policy: Policy) -> None:
    """Keep the device busy for ``policy.warmup`` of its time (at most four times that of the host's)."""
    repeats, spent = 1, 0.0
    deadline = time.perf_counter() + 4 * policy.warmup
    while spent < policy.warmup and time.perf_counter() < deadline:
        t = sampler.run(repeats)
        spent += t * repeats
        if sampler.repeatable and t * repeats < policy.sample:
            repeats = min(2 * repeats, policy.max_repeats)


def _repeats(sampler: Sampler, seconds: float, policy: Policy) -> int:
    if not sampler.repeatable:
        return 1
    return max(1, min(policy.max_repeats, math.ceil(policy.sample / max(seconds, 1e-9))))


def fastest(seconds: list[float]) -> int:
    """The winner: the heuristic's candidate (0) unless another is faster by more than ``MARGIN``."""
    best = min(range(len(seconds)), key=seconds.__getitem__)
    return best if seconds[best] < seconds[0] * (1 - MARGIN) else 0


def clobbered(kernel: Kernel, buffers: list[int], extent: Callable[[int], tuple[int, int]]) -> list[int]:
    """The buffers ``kernel`` writes that overlap memory it reads (``extent``: a buffer's address range):
    running it twice would read its own results."""
    reads = [extent(b) for p, b in zip(kernel.params, buffers) if p.read]
    out = set()
    for p, b in zip(kernel.params, buffers):
        lo, hi = extent(b)
        if p.written and any(lo < r_hi and r_lo < hi for r_lo, r_hi in reads):
            out.add(b)
    return sorted(out)


# ---------------------------------------------------------------------------- the decision cache

@dataclass
class DecisionStats:
    memory_hits: int = 0
    disk_hits: int = 0
    timed: int = 0  # kernels whose candidates were timed (and the decision stored)


class DecisionCache:
    """Which candidate won, per kernel and machine: in memory and on disk (one small JSON file each)."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir() / "autotune"
        self.disk = DiskCache(self.directory, "autotuning decision cache")
        self.stats = DecisionStats()
        self._memory: dict[str, Tuned] = {}
        self._lock = threading.Lock()

    def path_for(self, key: str) -> Path:
        return self.disk.path_for(_entry_name(key))

    def get(self, key: str, labels: tuple[str, ...]) -> Tuned | None:
        with self._lock:
            found = self._memory.get(key)
        if found is not None:
            self.stats.memory_hits += 1
            return found
        found = self._read(key, labels)
        if found is not None:
            self.stats.disk_hits += 1
            with self._lock:
                self._memory[key] = found
        return found

    def put(self, key: str, tuned: Tuned) -> None:
        self.stats.timed += 1
        with self._lock:
            self._memory[key] = replace(tuned, cached=True)
        entry = {"key": key, "labels": list(tuned.labels), "seconds": list(tuned.seconds), "winner": tuned.winner}
        self.disk.write(_entry_name(key), json.dumps(entry).encode())

    def _read(self, key: str, labels: tuple[str, ...]) -> Tuned | None:
        """The stored decision, or None when absent, damaged or made for other candidates."""
        data = self.disk.read(_entry_name(key))
        if data is None:
            return None
        try:
            entry = json.loads(data)
            tuned = Tuned(tuple(entry["labels"]), tuple(float(t) for t in entry["seconds"]), int(entry["winner"]),
                          True)
            valid = entry["key"] == key and 0 <= tuned.winner < len(tuned.labels) == len(tuned.seconds)
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            self.disk.report_damaged(self.path_for(key), "it is not a decision for this kernel")
            return None
        return tuned if tuned.labels == labels else None

    def clear_memory(self) -> None:
        """Forget the in-memory decisions (the disk keeps them)."""
        with self._lock:
            self._memory.clear()


def _entry_name(key: str) -> str:
    return f"{key[:2]}/{key}.json"


_default: DecisionCache | None = None


def default_decisions() -> DecisionCache:
    """The process-wide decision cache (directory from ``$TILEWISE_CACHE_DIR`` at first use)."""
    global _default
    if _default is None:
        _default = DecisionCache()
    return _default


def decision_key(target: str, heuristic_source: str, labels: tuple[str, ...], machine: dict) -> str:
    material = json.dumps({"format": AUTOTUNE_FORMAT_VERSION, "target": target, "source": heuristic_source,
                           "candidates": list(labels), "machine": machine}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


# ---------------------------------------------------------------------------- choosing at build, tuning at run

class Bench(Protocol):
    """Runs a program's steps on the buffers of the current call, and times kernel candidates on them."""

    def run(self, step) -> None: ...

    def samplers(self, steps: list) -> list[Sampler]: ...


class Tuning(Protocol):
    """A target's part of autotuning (``program_c.HostTuning``, ``program_cuda.CudaTuning``)."""

    target: Target  # its candidates, its timing policy, its name (part of a decision's key)

    def machine(self) -> dict: ...

    def source(self, sched: KernelSchedule, name: str) -> str:
        """The translation unit of one scheduled kernel, renamed ``name``."""

    def compile(self, pending: dict[str, Pending]) -> dict[str, list]:
        """Per pending kernel, each candidate's loaded function."""

    def step(self, step, sched: KernelSchedule, function):
        """``step`` (a kernel launch) running ``function``, scheduled as ``sched``."""

    def finish(self, program) -> None:
        """Rebuild what depends on every kernel's schedule (the C library, the source) once all are chosen."""


@dataclass
class Pending:
    """A kernel whose candidates are still to be timed, and the key its decision will be stored under."""

    key: str
    candidates: list[KernelSchedule]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(c.knobs.label() for c in self.candidates)


def renamed(sched: KernelSchedule, name: str) -> KernelSchedule:
    return replace(sched, kernel=replace(sched.kernel, name=name))


def choose(schedules: list[KernelSchedule], tuning: Tuning,
           cache: DecisionCache) -> tuple[list[KernelSchedule], dict[str, Pending]]:
    """Each kernel's schedule: the remembered winner where the cache knows it; else the heuristic's, with its
    candidates pending (kernels with a single candidate have nothing to choose)."""
    machine = tuning.machine()
    chosen, pending = [], {}
    for sched in schedules:
        options = tuning.target.candidates(sched.kernel)
        if len(options) == 1:
            chosen.append(sched)
            continue
        labels = tuple(c.knobs.label() for c in options)
        key = decision_key(tuning.target.name, tuning.source(options[0], "tw_kernel"), labels, machine)
        found = Pending(key, options)
        tuned = cache.get(found.key, labels)
        if tuned is None:
            chosen.append(sched)
            pending[sched.kernel.name] = found
        else:
            chosen.append(replace(options[tuned.winner], tuned=tuned))
    return chosen, pending


@dataclass
class Tuner:
    """Times the pending kernels of one program during its first run (see the note)."""

    pending: dict[str, Pending]
    tuning: Tuning
    cache: DecisionCache
    functions: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.functions = self.tuning.compile(self.pending)
        log("kernels", "autotune: at the first run, timing " + "; ".join(
            f"{name} ({len(p.candidates)} candidates)" for name, p in self.pending.items()))

    def walk(self, program, bench: Bench) -> None:
        """Run every step of ``program``, each pending kernel tuned first; then finish the program."""
        for k, step in enumerate(program.steps):
            kernel = getattr(step, "kernel", None)
            if kernel is not None and kernel.name in self.pending:
                step = program.steps[k] = self._tune(program, step, bench)
            bench.run(step)
        program.tuner = None
        self.tuning.finish(program)

    def _tune(self, program, step, bench: Bench):
        name = step.kernel.name
        pending = self.pending.pop(name)
        steps = [self.tuning.step(step, c, f) for c, f in zip(pending.candidates, self.functions.pop(name))]
        seconds = measure(bench.samplers(steps), self.tuning.target.policy)
        tuned = Tuned(pending.labels, tuple(seconds), fastest(seconds), False)
        self.cache.put(pending.key, tuned)
        at = next(k for k, s in enumerate(program.schedules) if s.kernel.name == name)
        program.schedules[at] = replace(pending.candidates[tuned.winner], tuned=tuned)
        log("kernels", "\n".join([f"autotune {name}:", *tuned.describe()]))
        return steps[tuned.winner]
