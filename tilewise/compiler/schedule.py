"""Scheduling: how each nest of a kernel runs on a target — loop order, parallelism, vectorisation.

[Note: scheduling] The kernel IR fixes *what* a nest computes; a schedule fixes *how*. First, for any
target, ``coalesce`` merges neighbouring domain dims that every index walks as one (a contiguous
[4096, 4096] pointwise nest becomes one loop of 16M) and drops size-1 dims. Then the target's scheduler
picks a strategy and records why, so ``TILEWISE_LOG=kernels`` shows the choice next to the code:

* C (OpenMP): loops over the kept dims outermost, one loop over the reduced dims per phase inside them.
  Enough rows: the kept loops are shared among threads (``parallel for``). A whole-tensor reduction
  (one row): the reduced loop is cut into fixed chunks, each chunk folded by one thread into a partial
  result, the partials combined in chunk order afterwards — so the result does not depend on the thread
  count. Small nests stay serial (forking threads costs more than they save). Every innermost loop is
  ``omp simd`` with its reductions declared, so the C compiler vectorises the accumulation too
  (reassociating it, as numpy's pairwise sum does; ``max``/``min`` keep propagating NaN). Iterations are
  independent by construction: a kernel writes a buffer it also reads only at the element it reads.
  When a later phase needs an expensive value an earlier phase computed (softmax: ``exp(x - max)`` in the
  sum and again in the normalisation), the earlier phase keeps it in a per-row buffer of at most
  ``SCRATCH_BYTES`` and the later one reads it back instead of recomputing it (``cache_across_phases``).

The CUDA scheduler (grid/block mapping, 16-byte vector access, warp/block/split reductions) plugs in at
``schedule`` beside the C one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import _strides as S
from tilewise.compiler.kernel_ir import Index, Kernel, Nest, Reduce, Store
from tilewise.dtypes import DType
from tilewise.ops.expr import Expr, substitute, toposort

PARALLEL_MIN_ELEMENTS = 1 << 15  # below this a nest runs on one thread
PARALLEL_MIN_ROWS = 8  # fewer kept-dim iterations than this: split the reduction instead
SPLIT_CHUNKS = 64
SCRATCH_BYTES = 1 << 16  # per row and thread: what the values kept between phases may occupy (stays in L2)
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                       "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfinv", "pow", "atan2"})


# ---------------------------------------------------------------------------- coalescing

def _stride(index: Index, dim: int) -> int:
    return dict(index.terms).get(dim, 0)


def coalesce(nest: Nest) -> Nest:
    """Merge adjacent dims (both kept or both reduced) that every index walks contiguously; drop size 1."""
    indices = [ld.index for ld in nest.loads] + [st.index for st in nest.stores]
    groups: list[list[int]] = []
    for d in range(len(nest.shape)):
        if nest.shape[d] == 1:
            continue
        if groups:
            prev = groups[-1][-1]
            same_kind = (prev in nest.reduce) == (d in nest.reduce)
            if same_kind and all(_stride(ix, prev) == _stride(ix, d) * nest.shape[d] for ix in indices):
                groups[-1].append(d)
                continue
        groups.append([d])
    new_of = {}
    for k, g in enumerate(groups):
        for d in g:
            new_of[d] = k

    def reindex(index: Index) -> Index:
        terms = {}
        for d, s in index.terms:
            k = new_of[d]
            if d == groups[k][-1]:
                terms[k] = s
        return Index(index.offset, tuple(sorted(terms.items())))

    shape = tuple(S.numel([nest.shape[d] for d in g]) for g in groups)
    reduce = tuple(k for k, g in enumerate(groups) if g[0] in nest.reduce)
    out = Nest(shape, reduce, [type(ld)(ld.param, reindex(ld.index), ld.dtype) for ld in nest.loads],
               list(nest.reductions),
               [Store(st.param, reindex(st.index), st.value, st.dtype, st.phase) for st in nest.stores])
    return out


# ---------------------------------------------------------------------------- schedules

@dataclass(frozen=True)
class Cached:
    """A value phase ``phase`` computes and keeps in per-row buffer ``scr<k>`` for the phases after it."""

    value: Expr  # as phase ``phase`` computes it
    dtype: DType
    phase: int


def _varies_along_reduce(nest: Nest, expr: Expr) -> bool:
    reduced = set(nest.reduce)
    return any(n.op == "input" and nest.loads[n.arg].index.dims() & reduced for n in toposort(expr))


def _phase_exprs(nest: Nest, phase: int) -> list[Expr]:
    return [r.value for r in nest.reductions if r.phase == phase] + [s.value for s in nest.stores if s.phase == phase]


def cache_across_phases(nest: Nest) -> tuple[Nest, list[Cached]]:
    """Keep expensive values a later phase would recompute; rewrite later phases to read them back."""
    if nest.phases < 2:
        return nest, []
    row = S.numel([nest.shape[d] for d in nest.reduce])
    first_phase: dict[int, int] = {}  # id of a subexpression -> the first phase computing it
    cached: list[Cached] = []
    for phase in range(nest.phases):
        exprs = _phase_exprs(nest, phase)
        covered: set[int] = set()
        for e in exprs:
            for node in reversed(toposort(e)):  # outermost first: keep the largest shared value
                if id(node) in covered:
                    continue
                first = first_phase.get(id(node))
                known = any(c.value is node for c in cached)
                if known or (first is not None and first < phase and node.op == "cast" and _is_expensive(node)
                             and _varies_along_reduce(nest, node)
                             and row * node.arg.itemsize * (len(cached) + 1) <= SCRATCH_BYTES):
                    if not known:
                        cached.append(Cached(node, node.arg, first))
                    covered |= {id(n) for n in toposort(node)}
        for e in exprs:
            for node in toposort(e):
                first_phase.setdefault(id(node), phase)
    if not cached:
        return nest, []
    reductions = [Reduce(r.combiner, cached_reads(r.value, cached, r.phase), r.dtype, r.phase)
                  for r in nest.reductions]
    stores = [Store(s.param, s.index, cached_reads(s.value, cached, s.phase), s.dtype, s.phase) for s in nest.stores]
    return Nest(nest.shape, nest.reduce, nest.loads, reductions, stores), cached


def cached_reads(expr: Expr, cached: list[Cached], phase: int | None) -> Expr:
    """``expr`` as phase ``phase`` (None: after the phases) computes it: kept values become reads."""
    mapping = {id(c.value): Expr("scalar", (), f"scr{k}") for k, c in enumerate(cached)
               if phase is None or c.phase < phase}
    return substitute(expr, mapping)


def _is_expensive(expr: Expr) -> bool:
    return any(n.op in EXPENSIVE for n in toposort(expr))


@dataclass
class NestSchedule:
    nest: Nest
    parallel: str  # "none" | "rows" (kept loops shared among threads) | "split" (reduction cut in chunks)
    chunks: int = 0
    simd: bool = False  # innermost loops vectorised
    notes: list[str] = field(default_factory=list)
    cached: list[Cached] = field(default_factory=list)  # values kept between phases, buffer scr<k> each


@dataclass
class KernelSchedule:
    kernel: Kernel
    target: str
    nests: list[NestSchedule]

    def describe(self) -> str:
        lines = [f"schedule of {self.kernel.name} for {self.target}:"]
        for k, ns in enumerate(self.nests):
            lines.append(f"  nest {k}: domain {list(ns.nest.shape)} reducing {list(ns.nest.reduce)}: "
                         f"{ns.parallel}" + (f" ({ns.chunks} chunks)" if ns.parallel == "split" else "")
                         + "".join(f"; {n}" for n in ns.notes))
        return "\n".join(lines)


def schedule_c(nest: Nest) -> NestSchedule:
    nest, cached = cache_across_phases(coalesce(nest))
    work = S.numel(nest.shape)
    rows = S.numel([nest.shape[d] for d in nest.outer])
    notes = [f"{work} elements, {rows} row(s)"]
    if work < PARALLEL_MIN_ELEMENTS:
        parallel = "none"
        notes.append("too small to fork threads")
    elif rows >= PARALLEL_MIN_ROWS:
        parallel = "rows"
    elif rows == 1 and nest.phases == 1 and all(st.phase is None for st in nest.stores) and nest.reductions:
        parallel = "split"
        notes.append("one row: reduction split into chunks")
    else:
        parallel = "rows" if rows > 1 else "none"
    notes.append("innermost loops vectorised")
    if cached:
        notes.append(f"{len(cached)} value(s) kept between phases instead of recomputed")
    return NestSchedule(nest, parallel, SPLIT_CHUNKS if parallel == "split" else 0, True, notes, cached)


SCHEDULERS = {"c": schedule_c}


def schedule(kernel: Kernel, target: str) -> KernelSchedule:
    try:
        scheduler = SCHEDULERS[target]
    except KeyError:
        raise NotImplementedError(f"no scheduler for target {target!r}; targets: {sorted(SCHEDULERS)}") from None
    return KernelSchedule(kernel, target, [scheduler(nest) for nest in kernel.nests])
