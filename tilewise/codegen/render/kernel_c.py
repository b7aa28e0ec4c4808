"""Rendering the compiler's fused kernels (kernel IR + schedule) with the shared C-style renderer.

Expressions, loads and stores go through ``cstyle`` exactly as the eager kernels' do (``ExprRenderer``,
``load_code``, ``store_code``, the per-type helpers); the control flow here is the kernel IR's: nests,
loops over the kept dims, one loop over the reduced dims per phase, accumulators, per-row stores. A
reduction's combine step is the combiner's own scalar operator (``maximum`` for ``max``: NaN propagates
as in eager), emitted once per type as a ``tw_fold_*`` helper. What a target spells its own way about
the loops — parallel and vector annotations, how a combiner becomes a vector reduction, vector math
declarations — is the data in ``LOOPS``, keyed like the ``Language`` it completes.

[Note: max and min with a NaN flag] A float ``max``/``min`` reduction of a serial row (the ``rows`` strategy)
folds with the target's own reduction clause (``reduction(max:acc)``), which keeps the largest value that
compares greater, and an int flag ``nanJ`` (``reduction(|:nan)``) set by any NaN element; once the row's loop
ends, ``accJ`` becomes NaN where the flag is set: the value the NaN-propagating ``tw_fold_max`` gave, which as a
user-defined OpenMP reduction the C compiler vectorised poorly. A 48x64x64 causal softmax (with its log-sum-exp)
took 300 us against 186 (380 against 276 with the mask's -inf); with a bool flag, 295.
Split and column strategies, and integers, keep the fold helper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tilewise.codegen.kernel_ir import ARG_COMBINERS, COMBINER_OPS, Index, Kernel, Store, extent
from tilewise.codegen.render.cstyle import (
    SUFFIX,
    ExprRenderer,
    Language,
    Source,
    compute_of,
    literal,
    load_code,
    store_code,
)
from tilewise.codegen.render.cuda import identity
from tilewise.codegen.schedule import KernelSchedule, NestSchedule, cached_reads
from tilewise.dtypes import DType, int64
from tilewise.ops.expr import Expr, toposort

INDEX = "long long"

# glibc's libmvec has vector variants of these; declaring them `simd` lets the C compiler call them from
# vectorised loops (what glibc's own math.h does under -ffast-math). The toolchain defines TW_LIBMVEC
# when libmvec links.
_VECTOR_MATH = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
                "atan", "sinh", "cosh", "tanh", "erf", "pow", "atan2"]
_C_PRELUDE = "#ifdef TW_LIBMVEC\n#define TW_SIMD __attribute__((__simd__(\"notinbranch\")))\n" + "\n".join(
    f"TW_SIMD float {f}f({'float, float' if f in ('pow', 'atan2') else 'float'}); "
    f"TW_SIMD double {f}({'double, double' if f in ('pow', 'atan2') else 'double'});" for f in _VECTOR_MATH
) + "\n#endif"


@dataclass(frozen=True)
class LoopStyle:
    """How a target annotates the loops of a schedule."""

    parallel: str  # before the outermost thread-shared loop: "{collapse}" loops, "{simd}" when also innermost
    parallel_simd: str  # what "{simd}" becomes
    simd: str  # before an innermost loop: "{reductions}" clauses
    reduction: str  # one reduction clause: "{op}" and "{vars}"
    declare_reduction: str  # a combiner as a reduction: "{name}", "{T}", "{fold}", "{identity}"
    builtin_reductions: Mapping[str, str]  # combiners the target reduces natively -> their clause operator
    prelude: str
    # float max/min as the target's own reduction plus a NaN flag ([Note: max and min with a NaN flag]):
    # combiner -> (clause operator, the flag's clause operator, comparison that keeps the new value)
    flagged_reductions: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)


LOOPS = {
    "c": LoopStyle(
        parallel="#pragma omp parallel for{simd} schedule(static) collapse({collapse})",
        parallel_simd=" simd",
        simd="#pragma omp simd{reductions}",
        reduction=" reduction({op}:{vars})",
        declare_reduction="#pragma omp declare reduction({name} : {T} : omp_out = {fold}(omp_out, omp_in)) "
                          "initializer(omp_priv = {identity})",
        builtin_reductions={"add": "+", "mul": "*"},
        prelude=_C_PRELUDE,
        flagged_reductions={"max": ("max", "|", ">"), "min": ("min", "|", "<")},
    ),
}


def dim_name(d: int) -> str:
    return f"d{d}"


def size_code(size) -> str:
    """A literal size, or a symbolic one's name (a ``long long`` argument, see [Note: symbolic sizes])."""
    return f"{size}LL" if type(size) is int else size


def index_code(index: Index) -> str:
    parts = [dim_name(d) if s == 1 else f"{size_code(s)} * {dim_name(d)}" for d, s in index.terms]
    if index.offset or not parts:
        parts.append(size_code(index.offset))
    return " + ".join(parts)


def scalar_function(source: Source, name: str, expr: Expr, params: tuple[str, ...], dtype: DType) -> str:
    """The text of a helper function ``name`` computing ``expr`` over its scalar leaves ``params``, all of
    ``dtype`` like the result."""
    lang = source.lang
    renderer = ExprRenderer(source, {("scalar", p): (p, dtype) for p in params})
    code, _ = renderer.render(expr)
    c = lang.ctype(dtype)
    body = "".join(f" {line}" for line in renderer.lines)
    arguments = ", ".join(f"{c} {p}" for p in params)
    return f"{lang.helper_prefix} {c} {name}({arguments}) {{{body} return ({c})({code}); }}"


def fold_helper(source: Source, loops: LoopStyle, combiner: str, acc: DType) -> tuple[str, str]:
    """(fold function, reduction identifier) for ``combiner`` over ``acc``, emitted once per source."""
    lang = source.lang
    suffix = SUFFIX[acc.name]
    name = f"tw_fold_{combiner}_{suffix}"
    if name not in source.helpers:
        a, b = Expr("scalar", (), "a"), Expr("scalar", (), "b")
        text = scalar_function(source, name, Expr(COMBINER_OPS[combiner], (a, b)), ("a", "b"), acc)
        if combiner not in loops.builtin_reductions:
            text += "\n" + loops.declare_reduction.format(name=f"tw_{combiner}_{suffix}", T=lang.ctype(acc), fold=name,
                                                          identity=literal(identity(combiner, acc), acc, lang))
        guard = f"TW_HELPER_{name.upper()}"  # a translation unit may hold many kernels (each eager one is its own)
        source.helpers[name] = f"#ifndef {guard}\n#define {guard}\n{text}\n#endif"
    clause = loops.builtin_reductions.get(combiner, f"tw_{combiner}_{suffix}")
    return name, clause


_TAKE = """{FN} bool {name}({T} v1, long long i1, {T} v2, long long i2) {{
    if (i2 < 0) return false;
    if (i1 < 0) return true;
{nan}    return v2 {cmp} v1 || (v2 == v1 && i2 < i1);
}}"""


def take_helper(source: Source, combiner: str, acc: DType) -> str:
    """``tw_take_<combiner>_<S>(v1, i1, v2, i2)``: whether (v2, i2) wins over (v1, i1) in an arg-reduction;
    NaN wins (torch's argmax and max.dim report the first NaN), ties go to the lower position, position -1
    is "nothing yet". Every fold compares positions, so the order partial results meet in does not matter."""
    name = f"tw_take_{combiner}_{SUFFIX[acc.name]}"
    if name not in source.helpers:
        nan = "    const bool n1 = v1 != v1, n2 = v2 != v2;\n    if (n1 || n2) return n2 && (!n1 || i2 < i1);\n" \
            if acc.is_floating_point else ""
        text = _TAKE.format(FN=source.lang.helper_prefix, name=name, T=source.lang.ctype(acc), nan=nan,
                            cmp=">" if combiner == "argmax" else "<")
        source.helpers[name] = f"#ifndef {name.upper()}\n#define {name.upper()}\n{text}\n#endif"
    return name


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
        self.folds = [(take_helper(source, r.combiner, r.dtype), "") if r.combiner in ARG_COMBINERS
                      else fold_helper(source, loops, r.combiner, r.dtype) for r in self.nest.reductions]
        self.flagged = {j for j, r in enumerate(self.nest.reductions)
                        if ns.parallel not in ("split", "columns") and r.dtype.is_floating_point
                        and r.combiner in loops.flagged_reductions}
        self.arguments = {("scalar", a.name): (a.name, a.dtype) for a in kernel.arguments if a.dtype is not None}

    # ------------------------------------------------------------------ pieces
    def acc_leaves(self, upto_phase: int) -> dict:
        leaves = {("scalar", f"acc{j}"): (f"acc{j}", r.dtype) for j, r in enumerate(self.nest.reductions)
                  if r.phase < upto_phase}
        leaves.update({("scalar", f"pos{j}"): (f"pos{j}", int64) for j, r in enumerate(self.nest.reductions)
                       if r.phase < upto_phase and r.combiner in ARG_COMBINERS})
        return leaves

    def declare_accs(self, reds: list[int]) -> None:
        for j in reds:
            r = self.nest.reductions[j]
            value = literal(identity(r.combiner, r.dtype), r.dtype, self.lang)
            self.w.line(f"{self.lang.ctype(r.dtype)} acc{j} = {value};")
            if r.combiner in ARG_COMBINERS:
                self.w.line(f"long long pos{j} = -1;")
            if j in self.flagged:
                self.w.line(f"int nan{j} = 0;")  # an int: a bool flag's reduction vectorised no faster

    def emit(self, exprs: list[Expr], leaves: dict, suffix: str) -> tuple[ExprRenderer, list]:
        """Render ``exprs`` in the current scope: the loads they read, then their statements."""
        used = sorted({n.arg for e in exprs for n in toposort(e) if n.op == "input"})
        leaves = {**self.arguments, **leaves}
        for k in used:
            load = self.nest.loads[k]
            ctype = self.lang.ctype(compute_of(load.dtype))
            where = index_code(load.index)
            if load.iota is not None:
                code = load.iota_code(where)
            else:
                code = load_code(self.lang, load.dtype, f"{self.kernel.params[load.param].name}[{where}]")
            code = f"({ctype})({code})"
            if load.guard is not None:
                code = f"({load.guard_code(dim_name)}) ? {code} : ({ctype})0"
            self.w.line(f"const {ctype} x{k}{suffix} = {code};")
            leaves[("input", k)] = (f"x{k}{suffix}", compute_of(load.dtype))
        renderer = ExprRenderer(self.source, leaves, suffix)
        results = [renderer.render(e) for e in exprs]
        for line in renderer.lines:
            self.w.line(line)
        del renderer.lines[:]
        return renderer, results

    def flat_index(self, dims) -> str:
        """The row-major position over ``dims`` of the current iteration."""
        parts, sizes = [], []
        for d in reversed(dims):
            stride = extent(sizes)
            parts.append(dim_name(d) if stride == 1 else f"{size_code(stride)} * {dim_name(d)}")
            sizes.append(self.nest.shape[d])
        return " + ".join(reversed(parts)) or "0"

    def row_index(self) -> str:
        """The position of the current element within its row (row-major over the reduced dims)."""
        return self.flat_index(self.nest.reduce)

    def cache_leaves(self, phase: int) -> dict:
        return {("scalar", f"scr{k}"): (f"tw_scr{k}[{self.row_index()}]", c.dtype)
                for k, c in enumerate(self.ns.cached) if c.phase < phase}

    def keep_cached(self, phase: int, renderer: ExprRenderer) -> None:
        for k, c in enumerate(self.ns.cached):
            if c.phase == phase:
                code, _ = renderer.render(cached_reads(c.value, self.ns.cached, phase))
                for line in renderer.lines:
                    self.w.line(line)
                del renderer.lines[:]
                self.w.line(f"tw_scr{k}[{self.row_index()}] = {code};")

    def store(self, st: Store, code: str, t) -> None:
        param = self.kernel.params[st.param].name
        self.w.line(f"{param}[{index_code(st.index)}] = {store_code(self.lang, st.dtype, code, t, st.saturate)};")

    def fold(self, j: int, value_code: str) -> None:
        if j in self.flagged:
            _, _, keeps = self.loops.flagged_reductions[self.nest.reductions[j].combiner]
            self.w.line(f"acc{j} = {value_code} {keeps} acc{j} ? {value_code} : acc{j};")
            self.w.line(f"nan{j} |= {value_code} != {value_code};")
            return
        if self.nest.reductions[j].combiner in ARG_COMBINERS:  # the element's position in its row
            where = self.row_index()
            self.w.line(f"if ({self.folds[j][0]}(acc{j}, pos{j}, {value_code}, {where})) "
                        f"{{ acc{j} = {value_code}; pos{j} = {where}; }}")
            return
        self.w.line(f"acc{j} = {self.folds[j][0]}(acc{j}, {value_code});")

    def simd_line(self, reds: list[int]) -> str:
        by_clause: dict[str, list[str]] = {}
        for j in reds:
            if j in self.flagged:
                clause, flag, _ = self.loops.flagged_reductions[self.nest.reductions[j].combiner]
                by_clause.setdefault(clause, []).append(f"acc{j}")
                by_clause.setdefault(flag, []).append(f"nan{j}")
                continue
            by_clause.setdefault(self.folds[j][1], []).append(f"acc{j}")
        clauses = "".join(self.loops.reduction.format(op=op, vars=", ".join(v)) for op, v in by_clause.items())
        return self.loops.simd.format(reductions=clauses)

    def loop(self, d: int, lo: str = "0", hi: str | None = None) -> None:
        hi = hi if hi is not None else size_code(self.nest.shape[d])
        self.w.open(f"for ({INDEX} {dim_name(d)} = {lo}; {dim_name(d)} < {hi}; ++{dim_name(d)})")

    # ------------------------------------------------------------------ phases and rows
    def phase(self, p: int, chunk: tuple[str, str] | None = None) -> None:
        """One loop nest over the reduced dims: fold this phase's reductions, store this phase's values."""
        reduced = self.nest.reduce
        reds = [j for j, r in enumerate(self.nest.reductions) if r.phase == p]
        stores = [s for s in self.nest.stores if s.phase == p]
        for k, d in enumerate(reduced):
            if k == len(reduced) - 1 and self.ns.simd:
                self.w.line(self.simd_line(reds))
            if k == 0 and chunk is not None:
                self.loop(d, *chunk)
            else:
                self.loop(d)
        renderer, results = self.emit([self.nest.reductions[j].value for j in reds] + [s.value for s in stores],
                                      {**self.acc_leaves(p), **self.cache_leaves(p)}, f"_p{p}")
        self.keep_cached(p, renderer)
        for j, (code, _) in zip(reds, results):
            self.fold(j, code)
        for st, (code, t) in zip(stores, results[len(reds):]):
            self.store(st, code, t)
        for _ in reduced:
            self.w.close()
        for j in reds:
            if j in self.flagged:
                nan = literal(float("nan"), self.nest.reductions[j].dtype, self.lang)
                self.w.line(f"if (nan{j}) acc{j} = {nan};")

    def row_stores(self) -> None:
        stores = [s for s in self.nest.stores if s.phase is None]
        if stores:
            _, results = self.emit([s.value for s in stores], self.acc_leaves(self.nest.phases), "_r")
            for st, (code, t) in zip(stores, results):
                self.store(st, code, t)

    # ------------------------------------------------------------------ strategies
    def render(self) -> None:
        self.w.open(f"/* nest {self.k}: {self.ns.parallel} */")
        if self.ns.parallel == "split":
            self.split()
        elif self.ns.parallel == "columns":
            self.columns()
        else:
            self.rows()
        self.w.close()

    def rows(self) -> None:
        outer = self.nest.outer
        innermost = not self.nest.reduce
        if self.ns.parallel == "rows" and outer:
            simd = self.loops.parallel_simd if innermost and self.ns.simd else ""
            self.w.line(self.loops.parallel.format(collapse=len(outer), simd=simd))
        for k, d in enumerate(outer):
            if innermost and self.ns.simd and k == len(outer) - 1 and self.ns.parallel != "rows":
                self.w.line(self.simd_line([]))
            self.loop(d)
        self.declare_accs(list(range(len(self.nest.reductions))))
        row = extent([self.nest.shape[d] for d in self.nest.reduce])
        for k, c in enumerate(self.ns.cached):
            self.w.line(f"{self.lang.ctype(c.dtype)} tw_scr{k}[{row}];")
        for p in range(self.nest.phases):
            self.phase(p)
        self.row_stores()
        for _ in outer:
            self.w.close()

    def columns(self) -> None:
        """One phase, serial: the reduced dims outside, the kept dims inside (the innermost one contiguous and
        vectorised), each row folding into its own accumulator ``acc<j>[row]`` in the reduced dims' order."""
        nest = self.nest
        rows = extent([nest.shape[d] for d in nest.outer])
        reds = list(range(len(nest.reductions)))
        for j in reds:
            r = nest.reductions[j]
            value = literal(identity(r.combiner, r.dtype), r.dtype, self.lang)
            self.w.line(f"{self.lang.ctype(r.dtype)} acc{j}[{rows}];")
            self.w.line(f"for ({INDEX} row = 0; row < {rows}LL; ++row) acc{j}[row] = {value};")
        for d in nest.reduce:
            self.loop(d)
        for k, d in enumerate(nest.outer):
            if k == len(nest.outer) - 1 and self.ns.simd:
                self.w.line(self.simd_line([]))
            self.loop(d)
        stores = [st for st in nest.stores if st.phase == 0]
        _, results = self.emit([nest.reductions[j].value for j in reds] + [st.value for st in stores], {}, "_p0")
        row = self.flat_index(nest.outer)  # the current row among the rows
        for j, (code, _) in zip(reds, results):
            self.w.line(f"acc{j}[{row}] = {self.folds[j][0]}(acc{j}[{row}], {code});")
        for st, (code, t) in zip(stores, results[len(reds):]):
            self.store(st, code, t)
        for _ in (*nest.reduce, *nest.outer):
            self.w.close()
        row_stores = [st for st in nest.stores if st.phase is None]
        if row_stores:
            for d in nest.outer:
                self.loop(d)
            leaves = {("scalar", f"acc{j}"): (f"acc{j}[{row}]", r.dtype) for j, r in enumerate(nest.reductions)}
            _, results = self.emit([st.value for st in row_stores], leaves, "_r")
            for st, (code, t) in zip(row_stores, results):
                self.store(st, code, t)
            for _ in nest.outer:
                self.w.close()

    def split(self) -> None:
        """One row, one phase: each chunk of the outermost reduced dim folds into its own partial."""
        nest, chunks = self.nest, self.ns.chunks
        extent = nest.shape[nest.reduce[0]]
        step = -(-extent // chunks)
        reds = list(range(len(nest.reductions)))
        for j in reds:
            self.w.line(f"{self.lang.ctype(nest.reductions[j].dtype)} part{j}[{chunks}];")
        self.w.line(self.loops.parallel.format(collapse=1, simd=""))
        self.w.open(f"for ({INDEX} chunk = 0; chunk < {chunks}; ++chunk)")
        self.declare_accs(reds)
        lo = f"chunk * {step}LL"
        self.phase(0, (lo, f"({lo} + {step}LL < {extent}LL ? {lo} + {step}LL : {extent}LL)"))
        for j in reds:
            self.w.line(f"part{j}[chunk] = acc{j};")
        self.w.close()
        self.declare_accs(reds)
        self.w.open(f"for ({INDEX} chunk = 0; chunk < {chunks}; ++chunk)")
        for j in reds:
            self.fold(j, f"part{j}[chunk]")
        self.w.close()
        self.row_stores()


def render_kernel(sched: KernelSchedule, lang: Language, source: Source) -> str:
    """The C-family text of one scheduled kernel; its helpers go into ``source``."""
    kernel = sched.kernel
    loops = LOOPS[lang.name]
    source.helpers.setdefault("tw_fused_prelude", loops.prelude)
    for p in kernel.params:
        source.need_storage(p.dtype)
    params = [f"{'' if p.written else 'const '}{lang.ctype(p.dtype)}* {p.name}" for p in kernel.params]
    params += [f"{lang.ctype(a.dtype) if a.dtype is not None else INDEX} {a.name}" for a in kernel.arguments]
    w = _Writer()
    for k, ns in enumerate(sched.nests):
        _NestRenderer(kernel, ns, k, source, loops, w).render()
    return f"{lang.kernel_prefix.format(block=0)} {kernel.name}({', '.join(params)}) {{\n" + "\n".join(w.lines) + "\n}"


def render_program(scheds: list[KernelSchedule], lang: Language) -> str:
    """One translation unit holding every kernel of a program (helpers emitted once)."""
    source = Source(lang)
    bodies = [render_kernel(s, lang, source) for s in scheds]
    return source.text("\n\n".join(bodies))
