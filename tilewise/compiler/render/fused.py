"""Rendering the compiler's fused kernels (kernel IR + schedule) with the shared C-style renderer.

Expressions, loads and stores go through ``cstyle`` exactly as the eager kernels' do (``ExprRenderer``,
``load_code``, ``store_code``, the per-type helpers); the control flow here is the kernel IR's: nests,
loops over the kept dims, one loop over the reduced dims per phase, accumulators, per-row stores. What a
target spells its own way about those loops — the parallel-loop and simd-reduction annotations — is the
data in ``LOOPS``, keyed like the ``Language`` it completes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.compiler.kernel_ir import COMBINER_OPS, Index, Kernel
from tilewise.compiler.render.cstyle import ExprRenderer, Language, Source, compute_of, literal, load_code, store_code
from tilewise.compiler.render.cuda import identity
from tilewise.compiler.schedule import KernelSchedule, NestSchedule
from tilewise.ops.expr import Expr, toposort

INDEX = "long long"


@dataclass(frozen=True)
class LoopStyle:
    """How a target annotates the loops of a schedule."""

    parallel_rows: str  # before the outermost kept loop, "{collapse}" = number of kept loops
    parallel_chunks: str  # before the chunk loop of a split reduction
    simd_reduce: str  # before an inner reduction loop; "{op}" C operator, "{vars}" accumulators


LOOPS = {
    "c": LoopStyle(parallel_rows="#pragma omp parallel for schedule(static) collapse({collapse})",
                   parallel_chunks="#pragma omp parallel for schedule(static)",
                   simd_reduce="#pragma omp simd reduction({op}:{vars})"),
}
SIMD_OPERATORS = {"add": "+", "mul": "*"}


def dim_name(d: int) -> str:
    return f"d{d}"


def index_code(index: Index) -> str:
    parts = [dim_name(d) if s == 1 else f"{s}LL * {dim_name(d)}" for d, s in index.terms]
    if index.offset or not parts:
        parts.append(f"{index.offset}LL")
    return " + ".join(parts)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def open(self, text: str) -> None:
        self.line(text + " {")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.line("}")


class _NestRenderer:
    def __init__(self, kernel: Kernel, ns: NestSchedule, k: int, source: Source, loops: LoopStyle, w: _Writer):
        self.kernel, self.ns, self.nest, self.k = kernel, ns, ns.nest, k
        self.source, self.lang, self.loops, self.w = source, source.lang, loops, w

    # ------------------------------------------------------------------ pieces
    def acc_type(self, j: int):
        return self.nest.reductions[j].dtype

    def acc_leaves(self, upto_phase: int) -> dict:
        return {("scalar", f"acc{j}"): (f"acc{j}", r.dtype) for j, r in enumerate(self.nest.reductions)
                if r.phase < upto_phase}

    def declare_accs(self, reds: list[int], prefix: str = "") -> None:
        for j in reds:
            r = self.nest.reductions[j]
            value = literal(identity(r.combiner, r.dtype), r.dtype, self.lang)
            self.w.line(f"{self.lang.ctype(r.dtype)} {prefix}acc{j} = {value};")

    def emit(self, exprs: list[Expr], leaves: dict, suffix: str) -> tuple[ExprRenderer, list]:
        """Render ``exprs`` in the current scope: the loads they read, then their statements."""
        used = sorted({n.arg for e in exprs for n in toposort(e) if n.op == "input"})
        leaves = dict(leaves)
        for k in used:
            load = self.nest.loads[k]
            param = self.kernel.params[load.param].name
            ctype = self.lang.ctype(compute_of(load.dtype))
            code = load_code(self.lang, load.dtype, f"{param}[{index_code(load.index)}]")
            self.w.line(f"const {ctype} x{k}{suffix} = ({ctype})({code});")
            leaves[("input", k)] = (f"x{k}{suffix}", compute_of(load.dtype))
        renderer = ExprRenderer(self.source, leaves, suffix)
        results = [renderer.render(e) for e in exprs]
        for line in renderer.lines:
            self.w.line(line)
        return renderer, results

    def store(self, st, code: str, t) -> None:
        param = self.kernel.params[st.param].name
        self.w.line(f"{param}[{index_code(st.index)}] = {store_code(self.lang, st.dtype, code, t)};")

    def fold(self, j: int, value_code: str, value_type, target: str = "") -> None:
        """``acc_j = combine(acc_j, value)`` through the combiner's own scalar operator."""
        r = self.nest.reductions[j]
        acc = Expr("scalar", (), f"acc{j}")
        other = Expr("scalar", (), "v")
        leaves = {("scalar", f"acc{j}"): (f"{target}acc{j}", r.dtype), ("scalar", "v"): (value_code, value_type)}
        renderer = ExprRenderer(self.source, leaves, f"_f{j}")
        code, _ = renderer.render(Expr(COMBINER_OPS[r.combiner], (acc, other)))
        for line in renderer.lines:
            self.w.line(line)
        self.w.line(f"{target}acc{j} = {code};")

    def loops_over(self, dims: tuple[int, ...]) -> None:
        for d in dims:
            self.w.open(f"for ({INDEX} {dim_name(d)} = 0; {dim_name(d)} < {self.nest.shape[d]}LL; ++{dim_name(d)})")

    # ------------------------------------------------------------------ phases and rows
    def phase(self, p: int, reduced: tuple[int, ...], chunk: tuple[int, int] | None = None) -> None:
        reds = [j for j, r in enumerate(self.nest.reductions) if r.phase == p]
        stores = [s for s in self.nest.stores if s.phase == p]
        if p in self.ns.simd_phases and reds:
            ops = {SIMD_OPERATORS[self.nest.reductions[j].combiner] for j in reds}
            if len(ops) == 1:
                self.w.line(self.loops.simd_reduce.format(op=ops.pop(), vars=", ".join(f"acc{j}" for j in reds)))
        if chunk is not None:
            first, rest = reduced[0], reduced[1:]
            lo, hi = chunk
            self.w.open(f"for ({INDEX} {dim_name(first)} = {lo}; {dim_name(first)} < {hi}; ++{dim_name(first)})")
            self.loops_over(rest)
        else:
            self.loops_over(reduced)
        exprs = [self.nest.reductions[j].value for j in reds] + [s.value for s in stores]
        _, results = self.emit(exprs, self.acc_leaves(p), f"_p{p}")
        for j, (code, t) in zip(reds, results):
            self.fold(j, code, t)
        for st, (code, t) in zip(stores, results[len(reds):]):
            self.store(st, code, t)
        for _ in range(len(reduced)):
            self.w.close()

    def row_stores(self) -> None:
        stores = [s for s in self.nest.stores if s.phase is None]
        if not stores:
            return
        _, results = self.emit([s.value for s in stores], self.acc_leaves(self.nest.phases), "_r")
        for st, (code, t) in zip(stores, results):
            self.store(st, code, t)

    def row_body(self) -> None:
        self.declare_accs(list(range(len(self.nest.reductions))))
        for p in range(self.nest.phases):
            self.phase(p, self.nest.reduce)
        self.row_stores()

    # ------------------------------------------------------------------ strategies
    def render(self) -> None:
        self.w.open(f"/* nest {self.k}: {self.ns.parallel} */")
        if self.ns.parallel == "split":
            self.split()
        else:
            outer = self.nest.outer
            if self.ns.parallel == "rows" and outer:
                self.w.line(self.loops.parallel_rows.format(collapse=len(outer)))
            self.loops_over(outer)
            self.row_body()
            for _ in outer:
                self.w.close()
        self.w.close()

    def split(self) -> None:
        """One row, one phase: each chunk of the outermost reduced dim folds into its own partial."""
        nest, chunks = self.nest, self.ns.chunks
        first = nest.reduce[0]
        extent = nest.shape[first]
        step = -(-extent // chunks)
        reds = list(range(len(nest.reductions)))
        for j in reds:
            self.w.line(f"{self.lang.ctype(self.acc_type(j))} part{j}[{chunks}];")
        self.w.line(self.loops.parallel_chunks)
        self.w.open(f"for ({INDEX} chunk = 0; chunk < {chunks}; ++chunk)")
        self.declare_accs(reds)
        lo = f"chunk * {step}LL"
        hi = f"({lo} + {step}LL < {extent}LL ? {lo} + {step}LL : {extent}LL)"
        self.phase(0, nest.reduce, (lo, hi))
        for j in reds:
            self.w.line(f"part{j}[chunk] = acc{j};")
        self.w.close()
        self.declare_accs(reds)
        self.w.open(f"for ({INDEX} chunk = 0; chunk < {chunks}; ++chunk)")
        for j in reds:
            self.fold(j, f"part{j}[chunk]", self.acc_type(j))
        self.w.close()
        self.row_stores()


def render_kernel(sched: KernelSchedule, lang: Language, source: Source | None = None) -> str:
    """C-family source of one scheduled kernel (appended to ``source`` when given, to share helpers)."""
    kernel = sched.kernel
    own = source is None
    source = source or Source(lang)
    for p in kernel.params:
        source.need_storage(p.dtype)
    params = []
    for p in kernel.params:
        const = "" if p.written else "const "
        params.append(f"{const}{lang.ctype(p.dtype)}* {p.name}")
    w = _Writer()
    for k, ns in enumerate(sched.nests):
        _NestRenderer(kernel, ns, k, source, LOOPS[lang.name], w).render()
    text = f"{lang.kernel_prefix.format(block=0)} {kernel.name}({', '.join(params)}) {{\n" + "\n".join(w.lines) + "\n}"
    return source.text(text) if own else text


def render_program(scheds: list[KernelSchedule], lang: Language) -> str:
    """One translation unit holding every kernel of a program (helpers emitted once)."""
    source = Source(lang)
    bodies = [render_kernel(s, lang, source) for s in scheds]
    return source.text("\n\n".join(bodies))
