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

* CUDA: every nest becomes a range of blocks of one launch (a kernel's nests are independent, so a
  horizontally fused optimizer step is one launch), all with the kernel's block size. Each thread moves
  ``vector`` adjacent elements along one domain dim with 16-byte loads and stores where every access that
  walks that dim contiguously is aligned for it (other accesses load per lane, or once when they do not
  vary along it). Four strategies:

  - ``elements`` (no reduction): one vector of elements per thread over the flattened domain;
  - ``tiles`` (no reduction, some access walking another dim than the innermost: an FP8 cast stored as it is
    and transposed, a transposing copy): a block per tile of the innermost dim and that one, each thread a
    block of elements in registers, a vector of each access along the dim it walks (``TileShape``,
    ``[Note: transposing tiles]``);
  - ``rows``: a *team* of threads per output row folds the reduced elements (a warp, several rows per
    block, for short rows; the whole block for long ones), combines partials with warp shuffles and one
    shared-memory step, and every member holds the result for the next phase. When a row needs several
    phases (softmax, layer_norm) and each thread's share is small, the row's loaded values stay in
    registers from the first phase to the last: one pass over memory (``in_registers``). Rows too long
    for that sum ``exp(x - max)`` in the pass that finds the max, rescaling as it grows (``online_softmax``):
    a cross entropy over a 50k vocabulary reads its logits twice, not three times;
  - ``columns``: when the accesses are contiguous along the kept dims rather than the reduced ones (a sum
    over the leading dim), 32 x vector adjacent rows per block, a vector of them per lane (one phase;
    one row per lane otherwise), with the reduction spread over the block's warps and combined through
    shared memory. Too few such groups to fill the GPU (a bias gradient) are split along the reduction
    like long rows below.

  A few very long rows (a whole-tensor sum, a gradient norm) are *split*: several blocks fold a chunk of a
  row (or of a group of columns) each and write their partial result to the kernel's scratch memory; the last block
  to finish a row (an atomic counter per row, which it resets for the next launch) combines the partials in
  chunk order (the result does not depend on timing) and stores the row's results. Several phases over few very
  long rows (a softmax over a million elements) stay one block per row; the dump says so.

Symbolic sizes (the eager CUDA kernels, [Note: symbolic sizes]): coalescing merges only literal dims; the
strategy follows from what is static (which dims are reduced, which accesses have literal stride 1, dtypes)
and from the caller's knobs (``strategy``, ``block``, ``split``, ``unroll``, which it chose from the sizes
of the launch it plans); a vector along a symbolic dim is allowed where the renderer finishes its ragged
end, and a symbolic stride or offset is taken to be aligned (the caller checks at launch, and runs its
``Knobs(vector=1)`` variant where it is not); the grid (``blocks`` 0) and a split's factor are the caller's,
given at launch, and a split stores partial results for a second launch (``CudaPlan.partials``) rather than
combining them through scratch memory and atomic counters.

Every choice above is a heuristic's guess. ``Knobs`` overrides them for a whole kernel (CUDA: block size,
widest vector, warp or block teams, splitting, the columns strategy; C: threads or not, chunks of a split,
vectorised inner loops), and ``candidates`` lists a kernel's distinct legal schedules — the heuristic's
first, then one knob changed at a time — for ``mode="max-autotune"`` to time (``autotune``). An
override never makes a schedule illegal: a narrower vector keeps every alignment a wider one had, any
block size is a multiple of a warp, and strategies only change who folds which element.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from tilewise import strides as S
from tilewise.codegen.kernel_ir import ARG_COMBINERS, Index, Kernel, Nest, extent, known, structure
from tilewise.dtypes import DType, bool_
from tilewise.ops.expr import Expr, substitute, toposort

# Below this a nest runs on one thread. A parallel loop is a fork and a barrier; where other work holds a core
# (BLAS workers, other processes), the barrier waits for a descheduled thread. A compiled nanoGPT step (2 layers
# of width 64: nests of 50-200k elements) on 2 busy cores: 300-1200 ms at 1 << 15, 40-60 ms at 1 << 18.
PARALLEL_MIN_ELEMENTS = 1 << 18
PARALLEL_MIN_ROWS = 8  # fewer kept-dim iterations than this: split the reduction instead
SPLIT_CHUNKS = 64
SCRATCH_BYTES = 1 << 16  # per row and thread: what the values kept between phases may occupy (stays in L2)
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                       "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfinv", "pow", "atan2", "asinh", "acosh",
                       "atanh", "erfc", "lgamma", "hypot"})


# ---------------------------------------------------------------------------- coalescing

def _stride(index: Index, dim: int) -> int:
    return dict(index.terms).get(dim, 0)


def coalesce(nest: Nest) -> Nest:
    """Merge adjacent dims (both kept or both reduced) that every index walks contiguously; drop size 1. A dim a
    load is guarded on stays a dim of its own (its guard is a range of that dim's index)."""
    indices = [ld.index for ld in nest.loads] + [st.index for st in nest.stores]
    guarded = {ld.guard[0] for ld in nest.loads if ld.guard is not None}
    groups: list[list[int]] = []
    for d in range(len(nest.shape)):
        if nest.shape[d] == 1 and d not in guarded:
            continue
        if groups:
            prev = groups[-1][-1]
            same_kind = (prev in nest.reduce) == (d in nest.reduce) and not {prev, d} & guarded
            literal = known(nest.shape[d], *(_stride(ix, prev) for ix in indices), *(_stride(ix, d) for ix in indices))
            if same_kind and literal and all(_stride(ix, prev) == _stride(ix, d) * nest.shape[d] for ix in indices):
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
            k = new_of.get(d)  # None: a dim of size 1, whose only index is 0
            if k is not None and d == groups[k][-1]:
                terms[k] = s
        return Index(index.offset, tuple(sorted(terms.items())))

    def reguard(guard: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
        return guard if guard is None else (new_of[guard[0]], *guard[1:])

    shape = tuple(extent([nest.shape[d] for d in g]) for g in groups)
    reduce = tuple(k for k, g in enumerate(groups) if g[0] in nest.reduce)
    out = Nest(shape, reduce, [replace(ld, index=reindex(ld.index), guard=reguard(ld.guard)) for ld in nest.loads],
               list(nest.reductions), [replace(st, index=reindex(st.index)) for st in nest.stores])
    return out


# ---------------------------------------------------------------------------- schedules

@dataclass(frozen=True)
class Cached:
    """A value phase ``phase`` computes and keeps in per-row buffer ``scr<k>`` for the phases after it."""

    value: Expr  # as phase ``phase`` computes it
    dtype: DType
    phase: int


class _NodeFacts:
    """Per expression node, whether an expensive operation or a load that varies along the reduced dims is
    among what it is computed from; each node is looked at once, so asking of every node of a deep
    expression costs its size, not its size squared."""

    def __init__(self, nest: Nest) -> None:
        reduced = set(nest.reduce)
        self.varying_loads = {k for k, load in enumerate(nest.loads) if load.dims() & reduced}
        self.expensive: dict[int, bool] = {}
        self.varies: dict[int, bool] = {}

    def learn(self, expr: Expr) -> None:
        for node in toposort(expr, stop=self.varies):
            if id(node) in self.varies:
                continue
            srcs = [id(s) for s in node.srcs]
            self.expensive[id(node)] = node.op in EXPENSIVE or any(self.expensive[s] for s in srcs)
            self.varies[id(node)] = ((node.op == "input" and node.arg in self.varying_loads)
                                     or any(self.varies[s] for s in srcs))


def _phase_exprs(nest: Nest, phase: int) -> list[Expr]:
    return [r.value for r in nest.reductions if r.phase == phase] + [s.value for s in nest.stores if s.phase == phase]


def cache_across_phases(nest: Nest) -> tuple[Nest, list[Cached]]:
    """Keep expensive values a later phase would recompute; rewrite later phases to read them back."""
    if nest.phases < 2:
        return nest, []
    row = S.numel([nest.shape[d] for d in nest.reduce])
    first_phase: dict[int, int] = {}  # id of a subexpression -> the first phase computing it
    cached: list[Cached] = []
    facts = _NodeFacts(nest)
    for phase in range(nest.phases):
        exprs = _phase_exprs(nest, phase)
        covered: set[int] = set()
        for e in exprs:
            facts.learn(e)
            for node in reversed(toposort(e)):  # outermost first: keep the largest shared value
                if id(node) in covered:
                    continue
                first = first_phase.get(id(node))
                known = any(c.value is node for c in cached)
                if known or (first is not None and first < phase and node.op == "cast" and facts.expensive[id(node)]
                             and facts.varies[id(node)]
                             and row * node.arg.itemsize * (len(cached) + 1) <= SCRATCH_BYTES):
                    if not known:
                        cached.append(Cached(node, node.arg, first))
                    covered |= {id(n) for n in toposort(node)}
        for e in exprs:
            for node in toposort(e):
                first_phase.setdefault(id(node), phase)
    if not cached:
        return nest, []
    reductions = [replace(r, value=cached_reads(r.value, cached, r.phase)) for r in nest.reductions]
    stores = [replace(s, value=cached_reads(s.value, cached, s.phase)) for s in nest.stores]
    return Nest(nest.shape, nest.reduce, nest.loads, reductions, stores), cached


def cached_reads(expr: Expr, cached: list[Cached], phase: int | None) -> Expr:
    """``expr`` as phase ``phase`` (None: after the phases) computes it: kept values become reads."""
    mapping = {id(c.value): Expr("scalar", (), f"scr{k}") for k, c in enumerate(cached)
               if phase is None or c.phase < phase}
    return substitute(expr, mapping)


def _uncast(expr: Expr) -> Expr:
    while expr.op == "cast" and expr.arg.is_floating_point:
        expr = expr.srcs[0]
    return expr


def _accumulator(expr: Expr) -> int | None:
    """J for the leaf ``scalar accJ``, else None."""
    return int(expr.arg[3:]) if expr.op == "scalar" and expr.arg.startswith("acc") else None


def _accumulators(expr: Expr) -> set[int]:
    return {j for j in map(_accumulator, toposort(expr)) if j is not None}


def _guarded_max(expr: Expr) -> Expr:
    """``accM`` for ``where(accM == -inf, 0, accM)`` (a softmax's guard for rows that are all -inf), else
    ``expr``. Folded online, the running maximum is read that way anyway (``fused_cuda``)."""
    if expr.op != "where":
        return expr
    cond, zero, acc = (_uncast(e) for e in expr.srcs)
    while cond.op == "cast" and cond.arg is bool_:
        cond = cond.srcs[0]
    if cond.op != "eq" or zero.op != "const" or zero.arg != 0 or acc.op != "scalar":
        return expr
    sides = [_uncast(e) for e in cond.srcs]
    if acc in sides and any(e.op == "const" and e.arg == float("-inf") for e in sides):
        return acc
    return expr


def _online_max(nest: Nest, j: int) -> int | None:
    """The max accumulator ``m`` when reduction ``j`` sums ``exp(a - accM)`` with ``a`` the value ``m`` is the
    maximum of (float casts aside) and reads no other accumulator of ``m``'s phase; else None."""
    r = nest.reductions[j]
    if r.combiner != "add" or not r.dtype.is_floating_point or r.rescale is not None:
        return None
    value = _uncast(r.value)
    if value.op != "exp":
        return None
    diff = _uncast(value.srcs[0])
    if diff.op != "sub":
        return None
    a, acc = (_uncast(e) for e in diff.srcs)
    m = _accumulator(_guarded_max(acc))
    if m is None:
        return None
    mx = nest.reductions[m]
    if (mx.combiner != "max" or mx.dtype != r.dtype or mx.phase != r.phase - 1 or _uncast(mx.value) is not a
            or any(nest.reductions[k].phase == mx.phase and k != m for k in _accumulators(r.value))):
        return None
    return m


def online_softmax(nest: Nest) -> Nest:
    """Fold each sum of ``exp(a - max)`` in the pass that finds the max, where a whole phase is such sums.

    [Note: online softmax] A softmax or cross entropy over a long row reads it once for the maximum, once
    for the sum of ``exp(x - max)`` and once more to normalise. The sum can be taken in the first pass
    against the maximum seen so far: when the maximum grows from ``m`` to ``m'``, the sum so far is
    multiplied by ``exp(m - m')`` (a thread takes its vector's maximum first, so that is one more ``exp``
    per vector, not per element), and partial (max, sum) pairs of threads and blocks combine the same way.
    The terms are ``exp(x - m)`` with ``m`` at least ``x``, never more than 1, as in the two-pass form.
    While every element seen is -inf the running maximum is read as 0, so masked elements add
    ``exp(-inf) = 0`` rather than ``exp(-inf + inf) = NaN`` (a softmax's own guard,
    ``where(max == -inf, 0, max)``, reads it the same way and is matched too). One pass over memory less;
    used on CUDA for rows that are not kept in registers between phases."""
    merged = True
    while merged:
        merged = False
        for q in range(1, nest.phases):
            reds = [j for j, r in enumerate(nest.reductions) if r.phase == q]
            maxes = [_online_max(nest, j) for j in reds]
            if not reds or None in maxes or any(st.phase == q for st in nest.stores):
                continue
            rescale = dict(zip(reds, maxes))

            def earlier(phase: int | None, q=q) -> int | None:
                return phase - 1 if phase is not None and phase >= q else phase

            reductions = [replace(r, phase=earlier(r.phase), rescale=rescale.get(j, r.rescale))
                          for j, r in enumerate(nest.reductions)]
            stores = [replace(st, phase=earlier(st.phase)) for st in nest.stores]
            nest = Nest(nest.shape, nest.reduce, nest.loads, reductions, stores)
            merged = True
            break
    return nest


def reciprocal_of_softmax_sums(nest: Nest) -> Nest:
    """Divide by a sum of ``exp(x - max)`` as a multiplication by its reciprocal, taken once per row.

    [Note: dividing by a softmax sum] Normalising a softmax divides every element by the row's sum; a
    correctly rounded division is about ten instructions and a branch per element, which leaves a long-row
    softmax or cross entropy bound by instruction issue rather than memory. ``a * (1 / s)`` differs from
    ``a / s`` by at most one rounding, and is safe exactly when ``1 / s`` neither overflows nor vanishes:
    such a sum is at least 1 (the maximum's own term is ``exp(0)``) and at most the row length, or else 0,
    inf or NaN, where both forms give the same inf or NaN. Only such sums are rewritten (``_online_max``
    recognises them); the reciprocal is row-invariant, so the renderer computes it before the loop."""
    sums = {j for j, r in enumerate(nest.reductions) if r.rescale is not None or _online_max(nest, j) is not None}
    if not sums:
        return nest
    def go(expr: Expr) -> Expr:
        mapping = {id(n): n.srcs[0] * Expr("div", (Expr("const", (), 1.0), n.srcs[1])) for n in toposort(expr)
                   if n.op == "div" and _accumulator(_uncast(n.srcs[1])) in sums}
        return substitute(expr, mapping) if mapping else expr

    reductions = [replace(r, value=go(r.value)) for r in nest.reductions]
    stores = [replace(st, value=go(st.value)) if st.phase is not None else st for st in nest.stores]
    return Nest(nest.shape, nest.reduce, nest.loads, reductions, stores)


@dataclass(frozen=True)
class Knobs:
    """Overrides of the heuristic's choices for a whole kernel; the defaults override nothing."""

    block: int = 0  # CUDA: threads per block
    vector: int = 0  # CUDA: at most this many elements per access
    team: str = ""  # CUDA rows: "warp" (several rows per block) or "block" (one row per block)
    split: bool = True  # a few long rows may be split (CUDA: across blocks; C: across threads)
    columns: bool = True  # CUDA: the columns strategy where the accesses favour it
    online: bool = True  # CUDA rows: sums of exp(x - max) folded in the max's pass (``online_softmax``)
    strategy: str = ""  # CUDA reductions: "rows" or "columns", whatever the accesses favour
    tiles: bool = True  # CUDA element-wise: an access walking another dim than the rest goes through tiles
    unroll: int = 0  # CUDA reductions: trips of the loop over a row unrolled (0: the CUDA compiler decides)
    threads: str = ""  # C: "serial" or "parallel", whatever the size
    chunks: int = 0  # C: chunks of a split reduction
    simd: bool = True  # C: innermost loops vectorised

    def label(self) -> str:
        changed = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != f.default]
        return ", ".join(changed) or "heuristic"


HEURISTIC = Knobs()


@dataclass(frozen=True)
class Tuned:
    """How ``mode="max-autotune"`` chose a kernel's schedule: its candidates' median times and the winner."""

    labels: tuple[str, ...]
    seconds: tuple[float, ...]  # median per run, one per candidate
    winner: int
    cached: bool  # read from the decision cache: timed by an earlier compile

    def describe(self) -> list[str]:
        where = "from the decision cache" if self.cached else "timed now"
        lines = [f"  autotuned over {len(self.labels)} candidates (median per run, {where}):"]
        for k, (label, t) in enumerate(zip(self.labels, self.seconds)):
            mark = "  <- chosen" if k == self.winner else ""
            lines.append(f"    #{k} {label}: {t * 1e6:.2f} us{mark}")
        return lines


@dataclass(frozen=True)
class TileShape:
    """How a tiled nest's block covers its tile (``[Note: transposing tiles]``): each thread a block of ``rows``
    elements along the transposed dim R by ``cols`` along the innermost dim C (one vector of each access walking
    R per column, one of each walking C per row), a warp's lanes ``lanes_r`` by ``lanes_c`` such blocks, the
    block's warps ``warps_r`` by ``warps_c`` warps' worth."""

    rows: int
    cols: int
    lanes_r: int
    lanes_c: int
    warps_r: int
    warps_c: int

    @property
    def block_rows(self) -> int:
        return self.rows * self.lanes_r * self.warps_r

    @property
    def block_cols(self) -> int:
        return self.cols * self.lanes_c * self.warps_c


@dataclass(frozen=True)
class CudaPlan:
    """How one nest maps onto CUDA blocks and threads (see the module note)."""

    strategy: str  # "elements" | "tiles" | "rows" | "columns"
    vector: int  # adjacent elements per thread access along ``vector_dim``
    vector_dim: int | None
    team: int  # threads sharing one row (1 for elements)
    rows_per_block: int
    blocks: int
    steps: int  # per thread and row: trips over the reduced elements (vectors for rows)
    in_registers: bool  # rows: loaded values kept in registers across phases
    index: str  # C type of index arithmetic
    split: int = 1  # rows: blocks sharing one row, each folding a chunk (see ``split_rows``)
    chunk: int = 0  # elements of a row per block when split
    scratch: int = 0  # byte offset of this nest's partial results and counters in the kernel's scratch
    online: bool = False  # rows: some sum is rescaled as its max grows (``online_softmax``)
    # symbolic sizes: blocks share each row (group of columns) in a number and chunk given at launch (arguments
    # ``tw_split`` and ``tw_chunk``), each storing its partial results for a second launch to combine
    partials: bool = False
    unroll: int = 0  # rows, columns: ``#pragma unroll`` of the loop over a row (0: none)
    tile_dim: int | None = None  # tiles: the dim the transposed accesses walk (see [Note: transposing tiles])
    tile: TileShape | None = None  # tiles: how a block's threads cover its tile


@dataclass
class NestSchedule:
    nest: Nest
    parallel: str  # "none" | "rows" (kept loops shared among threads) | "split" (reduction cut in chunks)
    #                | "columns" (serial: reduced dims outside, kept dims inside, one accumulator per row)
    chunks: int = 0
    simd: bool = False  # innermost loops vectorised
    notes: list[str] = field(default_factory=list)
    cached: list[Cached] = field(default_factory=list)  # values kept between phases, buffer scr<k> each
    cuda: CudaPlan | None = None


@dataclass
class KernelSchedule:
    kernel: Kernel
    target: str
    nests: list[NestSchedule]
    block: int = 0  # CUDA: threads per block, shared by every nest of the kernel
    scratch_bytes: int = 0  # CUDA: device memory for split reductions (zeroed once; kernels leave it zeroed)
    knobs: Knobs = HEURISTIC
    tuned: Tuned | None = None  # set when max-autotune chose this schedule

    @property
    def grid(self) -> int:
        return sum(ns.cuda.blocks for ns in self.nests)

    def describe(self) -> str:
        lines = [f"schedule of {self.kernel.name} for {self.target}:"]
        for k, ns in enumerate(self.nests):
            lines.append(f"  nest {k}: domain {list(ns.nest.shape)} reducing {list(ns.nest.reduce)}: "
                         f"{ns.parallel}" + (f" ({ns.chunks} chunks)" if ns.parallel == "split" else "")
                         + "".join(f"; {n}" for n in ns.notes))
        if self.block:  # a launch of thread blocks (CUDA)
            lines.append(f"  launch: {self.grid or 'as many as the sizes need'} block(s) of {self.block} threads")
        if self.knobs != HEURISTIC:
            lines.append(f"  knobs: {self.knobs.label()}")
        if self.tuned is not None:
            lines += self.tuned.describe()
        return "\n".join(lines)

    def signature(self) -> tuple:
        """What rendering depends on besides the kernel: equal signatures render the same code."""
        return self.block, tuple((ns.parallel, ns.chunks, ns.simd, ns.cuda) for ns in self.nests)

    def rendering_key(self) -> tuple:
        """Everything rendering reads but the kernel's name: schedules of equal keys render the same text, but
        for the name."""
        return (self.kernel.structure(), self.target, structure(self.nests), self.block, self.scratch_bytes,
                self.knobs, self.tuned)


def schedule_c_nest(nest: Nest, knobs: Knobs = HEURISTIC) -> NestSchedule:
    if not known(*nest.shape):  # sizes given at run time (the host-side check of the eager CUDA kernels)
        nest = coalesce(nest)
        return NestSchedule(nest, "none", 0, False, ["sizes known at run time: serial"])
    nest, cached = cache_across_phases(coalesce(nest))
    work = S.numel(nest.shape)
    rows = S.numel([nest.shape[d] for d in nest.outer])
    notes = [f"{work} elements, {rows} row(s)"]
    splittable = rows == 1 and nest.phases == 1 and all(st.phase is None for st in nest.stores) and nest.reductions
    if knobs.threads == "serial":
        parallel = "none"
        notes.append("serial (knob)")
    elif work < PARALLEL_MIN_ELEMENTS and knobs.threads != "parallel":
        parallel = "none"
        notes.append("too small to fork threads")
    elif rows >= PARALLEL_MIN_ROWS:
        parallel = "rows"
    elif splittable and knobs.split:
        parallel = "split"
        notes.append("one row: reduction split into chunks")
    else:
        parallel = "rows" if rows > 1 else "none"
    if knobs.simd:
        notes.append("innermost loops vectorised")
    if cached:
        notes.append(f"{len(cached)} value(s) kept between phases instead of recomputed")
    chunks = (knobs.chunks or SPLIT_CHUNKS) if parallel == "split" else 0
    if parallel == "none" and _by_columns(nest, rows, cached):
        parallel = "columns"
        notes.append("reduced dims outside the kept ones (rows read across memory): one accumulator per row, "
                     "the kept dims innermost")
    return NestSchedule(nest, parallel, chunks, knobs.simd, notes, cached)


C_COLUMN_ROWS = 4096  # accumulators a nest reduced by columns keeps on the stack


def _by_columns(nest: Nest, rows: int, cached: list) -> bool:
    """Whether a serial nest reduces better column-wise: its innermost dim is a kept one (so a row's elements
    lie across memory), one phase, no arg-reductions and no values kept between phases: then the loops run the
    reduced dims outside and the kept dims inside (contiguous, vectorised), each row folding into its own
    accumulator, in the same order along the reduced dims as a row at a time."""
    if not nest.reduce or not nest.outer or nest.phases != 1 or cached or rows > C_COLUMN_ROWS:
        return False
    if any(r.combiner in ARG_COMBINERS for r in nest.reductions):
        return False
    return max(nest.outer) > max(nest.reduce)


# ---------------------------------------------------------------------------- CUDA

POINTWISE_THREADS = 256
MIN_ROW_BLOCK = 128  # a block of warp-per-row teams holds this many threads
MAX_THREADS = 1024
VECTORS_PER_THREAD = 4  # a row team is sized so each member folds about this many vectors
REGISTER_ELEMENTS = 32  # per thread and load: what a row kept in registers may take
VECTOR_BYTES = 16


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _accesses(nest: Nest) -> list[tuple[Index, DType]]:
    """The memory accesses (an iota reads none)."""
    return [(ld.index, ld.dtype) for ld in nest.loads if ld.iota is None] + [(st.index, st.dtype) for st in nest.stores]


def vector_width(nest: Nest, dim: int | None, accesses: list[tuple[Index, DType]] | None = None) -> int:
    """Elements per 16-byte access along ``dim``: every access walking it contiguously stays aligned.
    ``accesses``: those made with vectors (by default all of the nest's)."""
    if dim is None:
        return 1
    accesses = _accesses(nest) if accesses is None else accesses
    contiguous = [(ix, dt) for ix, dt in accesses if _stride(ix, dim) == 1]
    if not contiguous:
        return 1
    if not known(nest.shape[dim]) and not _ragged_ok(nest, dim):
        return 1
    width = VECTOR_BYTES // max(dt.itemsize for _, dt in contiguous)
    bounds = [b for ld in nest.loads if ld.guard is not None and ld.guard[0] == dim for b in ld.guard[1:]]
    while width > 1:
        aligned = all(_multiple(ix.offset, width) and all(_multiple(s, width) for d, s in ix.terms if d != dim)
                      for ix, _ in contiguous)
        aligned = aligned and all(b % width == 0 for b in bounds)  # a vector lies wholly inside a guard or out
        if _multiple(nest.shape[dim], width) and aligned:
            return width
        width //= 2
    return 1


def _multiple(size, width: int) -> bool:
    """Whether ``size`` is a multiple of ``width``. A symbolic stride or offset is taken to be one: a caller
    with symbolic sizes checks that at launch and runs a ``Knobs(vector=1)`` schedule where it is not (the
    eager kernels' vector and scalar variants); a symbolic size is allowed only along a dim whose ragged end
    the renderer handles (``_ragged_ok``)."""
    return type(size) is not int or size % width == 0


def _ragged_ok(nest: Nest, dim: int) -> bool:
    """A vector dim of symbolic size is only allowed where it is the nest's one kept dim (elements) or its one
    reduced dim (rows): the renderer then finishes the last, partial vector element by element."""
    return (not nest.reduce and len(nest.shape) == 1) or nest.reduce == (dim,)


def _index_type(nest: Nest) -> str:
    if not known(*nest.shape, *(s for ix, _ in _accesses(nest) for s in (ix.offset, *(t for _, t in ix.terms)))):
        return "long long"  # symbolic: the kernel states its index type (``Kernel.index``)
    reach = max([S.numel(nest.shape)] + [ix.offset + sum(abs(s) * (nest.shape[d] - 1) for d, s in ix.terms)
                                         for ix, _ in _accesses(nest)])
    return "int" if reach < 2**31 - 1024 else "long long"


def _prefer_columns(nest: Nest) -> bool:
    """More of the bytes accessed walk the innermost kept dim contiguously than the innermost reduced one,
    leaving out accesses the same for every kept index (a row statistic of a layer norm's weight gradient: one
    load all the columns of a warp share). Bytes decide where operands disagree: a channels-last batch norm's
    gradient reading one operand laid out channels-first reads the other three down columns (as rows, with
    vectors along the reduced dim, those three would each load a 2-byte element per 32-byte sector)."""
    outer = nest.outer
    if not outer:
        return False
    last_reduced, last_kept = nest.reduce[-1], outer[-1]
    accesses = [(ix, dt) for ix, dt in _accesses(nest) if ix.dims() & set(outer)]
    along_reduced = sum(dt.itemsize for ix, dt in accesses if _stride(ix, last_reduced) == 1)
    if not along_reduced:
        return any(_stride(ix, last_kept) == 1 for ix, _ in accesses)
    # only accesses that also walk the reduced dims weigh: one that is the same along them (a row's target
    # class) is read once per row whichever way the rows go
    streamed = [(ix, dt) for ix, dt in accesses if ix.dims() & set(nest.reduce)]
    return sum(dt.itemsize for ix, dt in streamed if _stride(ix, last_kept) == 1) > along_reduced


def _loads_in_phases(nest: Nest) -> list[int]:
    """The loads that the loops over the reduced dims read (for a reduction or a store of a phase); the others
    are read once per row, by the stores after the phases."""
    exprs = [r.value for r in nest.reductions] + [st.value for st in nest.stores if st.phase is not None]
    return sorted({n.arg for e in exprs for n in toposort(e) if n.op == "input"})


def _capped(width: int, knobs: Knobs) -> int:
    """A narrower vector stays legal: every alignment that holds for ``width`` holds for its divisors."""
    return min(width, knobs.vector) if knobs.vector else width


def _cuda_strategy(nest: Nest, knobs: Knobs) -> tuple[str, int, int | None, int]:
    """(strategy, vector, vector dim, preferred team or block size) of a coalesced nest."""
    if not nest.reduce:
        tile = transposed_dim(nest) if knobs.tiles else None
        if tile is not None:
            return "tiles", knobs.vector, tile, knobs.block or POINTWISE_THREADS
        dim = nest.outer[-1] if nest.outer else None
        return "elements", _capped(vector_width(nest, dim), knobs), dim, knobs.block or POINTWISE_THREADS
    row = extent([nest.shape[d] for d in nest.reduce])
    if not known(row):
        return _symbolic_strategy(nest, knobs)
    if knobs.columns and _prefer_columns(nest):
        warps = COLUMN_WARPS if nest.phases == 1 and knobs.split else 32  # one phase: blocks split the columns
        dim = nest.outer[-1]
        # a column's total is stored by one thread, alone, and so are the values made from it and what they load
        # (a batch norm's running statistics, read and written back per channel)
        in_loop = [(nest.loads[j].index, nest.loads[j].dtype) for j in _loads_in_phases(nest)
                   if nest.loads[j].iota is None]
        in_loop += [(st.index, st.dtype) for st in nest.stores if st.phase is not None]
        vector = _capped(vector_width(nest, dim, in_loop), knobs) if nest.phases == 1 else 1  # see ``_cuda_plan``
        return "columns", vector, dim if vector > 1 else None, 32 * min(warps, _pow2_at_least(-(-row // 8)))
    dim = nest.reduce[-1]
    vector = _capped(vector_width(nest, dim), knobs)
    team = min(MAX_THREADS, max(32, _pow2_at_least(-(-row // (vector * VECTORS_PER_THREAD)))))
    rows = S.numel([nest.shape[d] for d in nest.outer])
    if knobs.split and rows <= SPLIT_MAX_ROWS and nest.phases == 1:  # split across blocks (``split_rows``): a
        team = min(team, SPLIT_TEAM)  # smaller block only means more of them, and nests sharing the kernel keep theirs
    elif rows >= MANY_ROWS:  # enough rows to fill the GPU: more rows in flight per SM beat wider teams (a loss
        team = min(team, MANY_ROWS_TEAM)  # over 8192x50304 logits: 1.06 ms with 1024 threads a row, 0.95 with 256)
    if knobs.team == "warp":
        team = 32
    elif knobs.team == "block":
        team = max(team, 64)  # any team wider than a warp is the whole block (``_cuda_plan``)
    return "rows", vector, dim, team


TILE = 32  # the side (elements) below which a dim is not worth tiling
TILE_ELEMENTS = 64  # per thread of a tiled nest: its block of rows x columns, each value kept in registers
SECTOR = 32  # bytes: the unit of memory traffic; a warp's access should fill whole ones
LINE = 128  # bytes: what a block's tile should span of each row it reads or writes, along either dim


def _units_to_fill(size: int, width: int, accesses: list[tuple[Index, DType]]) -> int:
    """How many units of ``width`` elements side by side (a power of two) fill ``size`` bytes of the narrowest
    of ``accesses``."""
    if not accesses:
        return 1
    narrowest = min(dt.itemsize for _, dt in accesses)
    return _pow2_at_least(_ceil_div(size, width * narrowest))


def tile_shape(nest: Nest, dim: int, widest: int, block: int) -> TileShape:
    """The thread, warp and block shape of a tiled nest over ``dim`` (``[Note: transposing tiles]``). A thread
    takes one vector of each access along the dim it walks contiguously (16 bytes where sizes and alignment
    allow; at most ``widest`` elements unless that is 0), within ``TILE_ELEMENTS``; a warp's lanes sit side by
    side along both dims so that every access fills whole sectors, and a block's warps so that its tile spans
    a line of each row it touches, as far as the domain has room."""
    inner = len(nest.shape) - 1
    straight = [(ix, dt) for ix, dt in _accesses(nest) if _stride(ix, inner) == 1]
    across = [(ix, dt) for ix, dt in _accesses(nest) if _stride(ix, dim) == 1 and _stride(ix, inner) != 1]
    cap = Knobs(vector=widest)
    cols, rows = _capped(vector_width(nest, inner, straight), cap), _capped(vector_width(nest, dim, across), cap)
    while rows * cols > TILE_ELEMENTS:
        if rows >= cols:
            rows //= 2
        else:
            cols //= 2
    need_c = min(32, _units_to_fill(SECTOR, cols, straight))
    need_r = min(32, _units_to_fill(SECTOR, rows, across))
    spare = 32 // (need_c * need_r)  # lanes beyond those needed, shared between the dims
    lanes_c = need_c << (spare.bit_length() // 2) if spare else need_c
    lanes_r = 32 // lanes_c
    warps = block // 32
    warps_c = min(warps, _units_to_fill(LINE, cols * lanes_c, straight),
                  _pow2_at_least(_ceil_div(nest.shape[inner], cols * lanes_c)))
    warps_r = min(warps // warps_c, _pow2_at_least(_ceil_div(nest.shape[dim], rows * lanes_r)))
    return TileShape(rows, cols, lanes_r, lanes_c, warps_r, warps // warps_r)


def transposed(index: Index, inner: int) -> bool:
    """Whether a thread of a warp walking ``inner`` would reach each element of this access in a sector of its
    own: the access moves along ``inner``, but not contiguously."""
    return _stride(index, inner) not in (0, 1)


def transposed_dim(nest: Nest) -> int | None:
    """The dim through which an element-wise nest is mapped onto tiles (``[Note: transposing tiles]``): the kept
    dim, other than the innermost, that the most bytes of transposed accesses walk contiguously; None where no
    access is transposed or the sizes are not literal (the eager kernels, whose accesses are the operands'
    strides at launch)."""
    if nest.reduce or len(nest.shape) < 2 or not known(*nest.shape):
        return None
    inner = len(nest.shape) - 1
    if nest.shape[inner] < TILE // 2:
        return None
    weights: dict[int, int] = {}
    for index, dtype in _accesses(nest):
        if transposed(index, inner):
            for d, s in index.terms:
                if s == 1 and d != inner and nest.shape[d] >= TILE // 2:
                    weights[d] = weights.get(d, 0) + dtype.itemsize
    return max(weights, key=lambda d: (weights[d], d)) if weights else None


def _symbolic_strategy(nest: Nest, knobs: Knobs) -> tuple[str, int, int | None, int]:
    """``_cuda_strategy`` of a nest whose row length is known only at launch: the accesses decide between rows
    and columns (unless ``knobs.strategy`` does), the caller's block size is the team (a warp per row for a
    block of 32, else the whole block) or the warps of a columns block, and only rows use vectors."""
    columns = knobs.strategy == "columns" or (not knobs.strategy and knobs.columns and _prefer_columns(nest))
    block = knobs.block or SPLIT_TEAM
    if columns:
        return "columns", 1, None, block
    dim = nest.reduce[-1]
    return "rows", _capped(vector_width(nest, dim), knobs), dim, block


SPLIT_MAX_ROWS = 64
SPLIT_TARGET_BLOCKS = 512
SPLIT_MIN_VECTORS = 8  # per thread and block: below this a row is not worth another block
COLUMN_WARPS = 8  # warps of a columns block whose reduction may be split across blocks
SPLIT_TEAM = 256  # threads per block a row that will be split asks for
MANY_ROWS, MANY_ROWS_TEAM = 1024, 256  # rows at which a long row's team is capped, and the cap


def split_rows(nest: Nest, plan: CudaPlan, block: int) -> CudaPlan:
    """Share each of a few long rows among blocks when one phase folds it (its element-wise stores happen in
    the chunk that holds the element, its per-row stores in the row's last block). Symbolic sizes: the
    caller asked for a split (``Knobs.split``) knowing the sizes, and gives its factor at launch."""
    rows = extent([nest.shape[d] for d in nest.outer])
    row = extent([nest.shape[d] for d in nest.reduce])
    per_block = block * plan.vector * SPLIT_MIN_VECTORS
    if plan.strategy == "rows" and plan.rows_per_block == 1 and nest.phases == 1 and not known(row, rows):
        return replace(plan, partials=True)
    if (plan.strategy != "rows" or plan.rows_per_block != 1 or rows > SPLIT_MAX_ROWS or nest.phases != 1
            or row < 2 * per_block):
        return plan
    split = min(_ceil_div(row, per_block), max(2, SPLIT_TARGET_BLOCKS // rows))
    chunk = _ceil_div(_ceil_div(row, split), plan.vector) * plan.vector  # a whole number of vectors
    split = _ceil_div(row, chunk)
    return replace(plan, split=split, chunk=chunk, blocks=rows * split, steps=_ceil_div(chunk, block * plan.vector))


def split_columns(nest: Nest, plan: CudaPlan) -> CudaPlan:
    """Share the reduction of each group of columns (32 x vector, a block's) among blocks when there are too
    few groups to fill the GPU and one phase folds it (a bias gradient: 768 bf16 columns over 8192 rows is 3
    groups of 256)."""
    groups = plan.blocks
    row = extent([nest.shape[d] for d in nest.reduce])
    if plan.strategy == "columns" and nest.phases == 1 and not known(row, groups):
        return replace(plan, partials=True)
    per_block = plan.team * SPLIT_MIN_VECTORS  # elements of a column per block: a few per warp
    if plan.strategy != "columns" or nest.phases != 1 or groups >= SPLIT_TARGET_BLOCKS or row < 2 * per_block:
        return plan
    split = min(_ceil_div(row, per_block), _ceil_div(SPLIT_TARGET_BLOCKS, groups))
    chunk = _ceil_div(row, split)
    split = _ceil_div(row, chunk)
    return replace(plan, split=split, chunk=chunk, blocks=groups * split, steps=_ceil_div(chunk, plan.team))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scratch_layout(nest: Nest, plan: CudaPlan, offset: int) -> tuple[CudaPlan, int]:
    """Place a split nest's partials (per reduction, split x rows) and row counters at ``offset``."""
    if plan.split == 1:
        return plan, offset
    rows = S.numel([nest.shape[d] for d in nest.outer])
    start = offset
    for r in nest.reductions:
        offset += -(-rows * plan.split * r.dtype.itemsize // 16) * 16
    offset += -(-rows * 4 // 16) * 16
    return replace(plan, scratch=start), offset


def _blocks(count, per_block: int) -> int:
    """Blocks for ``count`` items, ``per_block`` a block; 0 where ``count`` is known only at launch."""
    return _ceil_div(count, per_block) if known(count) else 0


def _cuda_plan(nest: Nest, strategy: str, vector: int, dim: int | None, team: int, block: int) -> CudaPlan:
    rows = extent([nest.shape[d] for d in nest.outer])
    row = extent([nest.shape[d] for d in nest.reduce])
    index = _index_type(nest)
    if strategy == "elements":
        return CudaPlan(strategy, vector, dim, 1, 1, _blocks(rows, vector * block), 1, False, index)
    if strategy == "tiles":
        inner = len(nest.shape) - 1
        shape = tile_shape(nest, dim, vector, block)
        tiles = _blocks(nest.shape[dim], shape.block_rows) * _blocks(nest.shape[inner], shape.block_cols)
        rest = S.numel([n for d, n in enumerate(nest.shape) if d not in (dim, inner)])
        return CudaPlan(strategy, shape.cols, inner, 1, 1, tiles * rest, 1, False, index, tile_dim=dim, tile=shape)
    if strategy == "columns":
        # [Note: vector columns] A lane folds ``vector`` adjacent columns (one 16-byte access per buffer and
        # row, an accumulator per column), a warp 32 x vector columns, the block's warps other rows of them.
        # After the warps' partials meet in shared memory, each thread of the block owns one column, so the
        # block must have a thread for each: ``vector`` is at most the number of warps. One phase only: a
        # later phase would need every lane's column total back in the lane.
        team = block // 32
        vector = min(vector, team)
        return CudaPlan(strategy, vector, dim if vector > 1 else None, team, 32 * vector, _blocks(rows, 32 * vector),
                        _blocks(row, team), False, index)
    team = 32 if team <= 32 else block
    per_block = block // team
    steps = _blocks(row, team * vector)
    in_registers = nest.phases > 1 and 0 < steps and steps * vector <= REGISTER_ELEMENTS
    online = any(r.rescale is not None for r in nest.reductions)
    return CudaPlan(strategy, vector, dim, team, per_block, _blocks(rows, per_block), steps, in_registers, index,
                    online=online)


def _online_unless_in_registers(nest: Nest, knobs: Knobs) -> Nest:
    """``online_softmax(nest)`` for a nest of rows too long to keep in registers between phases (in registers,
    a later phase costs no memory traffic and the rescaling would only add work)."""
    online = online_softmax(nest)
    if online is nest:
        return nest
    strategy, vector, dim, team = _cuda_strategy(nest, knobs)
    if strategy != "rows" or _cuda_plan(nest, strategy, vector, dim, team, max(MIN_ROW_BLOCK, team)).in_registers:
        return nest
    return online


def schedule_cuda(kernel: Kernel, knobs: Knobs = HEURISTIC) -> KernelSchedule:
    nests = [coalesce(n) for n in kernel.nests]
    if knobs.online:
        nests = [_online_unless_in_registers(n, knobs) for n in nests]
    nests = [reciprocal_of_softmax_sums(n) for n in nests]
    strategies = [_cuda_strategy(n, knobs) for n in nests]
    block = knobs.block or max(max(MIN_ROW_BLOCK, t) if s == "rows" else t for s, _, _, t in strategies)
    out = []
    scratch = 0
    for nest, (strategy, vector, dim, team) in zip(nests, strategies):
        plan = _cuda_plan(nest, strategy, vector, dim, team, block)
        if kernel.index:
            plan = replace(plan, index=kernel.index)
        if strategy not in ("elements", "tiles") and knobs.unroll:
            plan = replace(plan, unroll=knobs.unroll)
        if knobs.split:
            plan = split_columns(nest, plan) if strategy == "columns" else split_rows(nest, plan, block)
        plan, scratch = scratch_layout(nest, plan, scratch)
        notes = [f"{plan.blocks or 'as many as the sizes need'} block(s)", f"{plan.vector} element(s) per access" + (
            f" along d{dim}" if plan.vector > 1 else "")]
        if strategy == "tiles":
            shape = plan.tile
            notes[1] = f"{shape.rows}x{shape.cols} element(s) per thread, a vector of each access along the dim " \
                       "it walks"
            notes.insert(0, f"{shape.block_rows}x{shape.block_cols} tiles over d{dim} and the innermost dim, "
                            f"{shape.lanes_r}x{shape.lanes_c} lanes, {shape.warps_r}x{shape.warps_c} warps")
        elif strategy != "elements":
            rows = extent([nest.shape[d] for d in nest.outer])
            notes.insert(0, f"{rows} row(s) of {extent([nest.shape[d] for d in nest.reduce])}")
            notes.append(f"{plan.team} thread(s) per row, {plan.rows_per_block} row(s) per block, "
                         f"{plan.steps} trip(s) each")
            if plan.in_registers:
                notes.append("row kept in registers across phases")
            if plan.online:
                notes.append("sums of exp(x - max) folded in the max's pass (online softmax)")
            if plan.split > 1:
                what = f"each group of {plan.rows_per_block} columns" if strategy == "columns" else "each row"
                notes.append(f"{what} split over {plan.split} blocks of {plan.chunk} elements")
            elif plan.partials:
                notes.append("split over blocks as the launch says, partial results for a second launch")
            elif strategy == "rows" and known(rows) and rows < SPLIT_MAX_ROWS and plan.steps > 64:
                notes.append("few long rows over several phases: one block each")
        if plan.index != "int":
            notes.append("64-bit indexing")
        out.append(NestSchedule(nest, strategy, 0, plan.vector > 1, notes, [], plan))
    return KernelSchedule(kernel, "cuda", out, block, scratch, knobs)


def schedule_c(kernel: Kernel, knobs: Knobs = HEURISTIC) -> KernelSchedule:
    """The C target's schedule of a kernel: each nest scheduled on its own."""
    return KernelSchedule(kernel, "c", [schedule_c_nest(nest, knobs) for nest in kernel.nests], knobs=knobs)


# ---------------------------------------------------------------------------- candidates (max-autotune)

CUDA_BLOCKS = (128, 256, 512, 1024)
C_SPLIT_CHUNKS = (16, 256)


def variants_cuda(heuristic: KernelSchedule) -> list[Knobs]:
    plans = [ns.cuda for ns in heuristic.nests]
    variants = [Knobs(block=b) for b in CUDA_BLOCKS if b != heuristic.block]
    widest = max(p.vector for p in plans)
    variants += [Knobs(vector=w) for w in sorted({widest // 2, 1}, reverse=True) if 1 <= w < widest]
    rows = [p for p in plans if p.strategy == "rows"]
    if any(p.team == 32 for p in rows):
        variants.append(Knobs(team="block"))
    wide = [p for p in rows if p.team > 32]
    if wide and all(p.blocks // p.split >= SPLIT_MAX_ROWS for p in wide):  # a warp per row of a few long rows
        variants.append(Knobs(team="warp"))  # would leave the GPU idle: a whole-tensor sum took 300x longer
    if any(p.split > 1 for p in plans):
        variants.append(Knobs(split=False))
    if any(p.strategy == "columns" for p in plans):
        variants.append(Knobs(columns=False))
    if any(p.online for p in plans):
        variants.append(Knobs(online=False))
    if any(p.strategy == "tiles" for p in plans):
        variants.append(Knobs(tiles=False))
    return variants


def variants_c(heuristic: KernelSchedule) -> list[Knobs]:
    variants = [Knobs(threads="serial"), Knobs(threads="parallel"), Knobs(simd=False)]
    if any(ns.parallel == "split" for ns in heuristic.nests):
        variants += [Knobs(chunks=c) for c in C_SPLIT_CHUNKS]
    return variants
