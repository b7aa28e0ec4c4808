"""Rendering the compiler's fused kernels as CUDA C, following the CUDA schedule.

[Note: fused CUDA kernels] One ``__global__`` function per kernel; its nests own consecutive ranges of
``blockIdx.x`` (``tw_block`` counts blocks within the nest). Expressions, loads, stores, literals and
per-type helpers come from ``cstyle`` exactly as for the eager kernels and the C target; the combine step
of a reduction is the combiner's own scalar operator (``fold_helper``), so NaN propagates as in eager.
What is CUDA's own is the thread mapping (``CudaPlan``): per thread, ``vector`` lanes along one dim (one
16-byte access for each buffer walked contiguously, one load for a buffer constant along that dim, one
access per lane otherwise), the lanes rendered one after another with their own statement names; and
for reductions, teams of threads folding a row, combined by shuffles (``__shfl_xor_sync``, so every
member ends with the total) and shared memory. A block runs exactly one nest, so the nests' shared
arrays are carved out of one ``tw_smem`` buffer as large as the largest nest needs.

The compiler's kernels have literal sizes and strides: compiled for one set of shapes, like the program
they belong to. The eager backend's have symbolic ones ([Note: symbolic sizes]): the same code with the
argument's name where the number would be, plus what a size known only at launch needs: the last, partial
vector of a dim taken element by element (``elements``: one 1-D domain; ``rows``: the one reduced dim), the
grid and a split's factor and chunk (``tw_split``, ``tw_chunk``) given at launch, a split's partial results
stored for a second launch instead of combined by the row's last block (``CudaPlan.partials``), and the
arg-reductions (``argmax``/``argmin``: a position ``pos<j>`` next to each accumulator, folded with
``tw_take_*`` so that the first NaN, then the first of equal values, wins whatever order partials meet in).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from tilewise import strides as S
from tilewise.codegen.kernel_ir import ARG_COMBINERS, Index, Kernel, Load, extent, known, structure
from tilewise.codegen.render.cstyle import (
    ExprRenderer,
    Source,
    compute_of,
    literal,
    load_code,
    new_nodes,
    store_code,
)
from tilewise.codegen.render.cuda import CUDA, identity
from tilewise.codegen.render.kernel_c import LoopStyle, fold_helper, scalar_function, take_helper
from tilewise.codegen.render.tiles_cuda import render_tiles
from tilewise.codegen.schedule import KernelSchedule, NestSchedule
from tilewise.dtypes import DType, bfloat16, float8_e4m3fn, float16, int64
from tilewise.ops.expr import Expr, substitute, toposort, where

_FOLDS = LoopStyle(parallel="", parallel_simd="", simd="", reduction="", declare_reduction="",
                   builtin_reductions={}, prelude="")

_SHUFFLE_XOR = """#ifndef TW_SHUFFLE_XOR_DEFINED
#define TW_SHUFFLE_XOR_DEFINED
template <typename T> static __device__ __forceinline__ T tw_shfl_xor(T v, int s) {
    return __shfl_xor_sync(0xffffffffu, v, s);
}
template <> __device__ __forceinline__ bool tw_shfl_xor<bool>(bool v, int s) {
    return __shfl_xor_sync(0xffffffffu, (int)v, s) != 0;
}
#endif"""


class _Writer:
    def __init__(self, depth: int = 1):
        self.lines: list[str] = []
        self.depth = depth

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def open(self, text: str) -> None:
        self.line(text + " {")
        self.depth += 1

    def close(self, tail: str = "") -> None:
        self.depth -= 1
        self.line("}" + tail)


def _stored(store) -> Expr:
    """What a store converts to its buffer's dtype: a value already cast to a 16-bit float (or a float8) is
    stored from before the cast, since converting rounds the same way (one conversion per element, not a
    rounding to bfloat16, a widening back and the store's own conversion)."""
    value = store.value
    if value.op == "cast" and value.arg is store.dtype and store.dtype in (bfloat16, float16):
        return value.srcs[0]
    # a float8 cast converts as the store does (``[Note: float8 conversions]``), unless the store saturates where
    # the cast overflows to infinity (e5m2)
    if value.op == "cast" and value.arg is store.dtype and store.dtype.is_float8 and \
            (store.dtype is float8_e4m3fn or not store.saturate):
        return value.srcs[0]
    return value


def _stride(index: Index, dim: int | None) -> int:
    return dict(index.terms).get(dim, 0) if dim is not None else 0


def _size_code(size, idx: str) -> str:
    """A literal size cast to the index type, or a symbolic one's name (an argument of that type)."""
    return f"({idx}){size}" if type(size) is int else size


def _index_code(index: Index, idx: str) -> str:
    parts = [f"d{d}" if s == 1 else f"{_size_code(s, idx)} * d{d}" for d, s in index.terms]
    if index.offset or not parts:
        parts.append(_size_code(index.offset, idx))
    return " + ".join(parts)


def _step(idx: str, lane: int, stride) -> str:
    """The offset of vector lane ``lane`` along a dim of ``stride``."""
    return f"({idx}){lane * stride}" if type(stride) is int else f"({idx}){lane} * {stride}"




@dataclass
class _Access:
    """How one buffer access is made per thread: one vector, one scalar for all lanes, or per lane."""

    how: str  # "vector" | "shared" | "lanes"
    stride: int  # along the vector dim


class _Nest:
    def __init__(self, kernel: Kernel, ns: NestSchedule, k: int, source: Source, block: int, w: _Writer,
                 generic: bool = False):
        self.kernel, self.ns, self.nest, self.k = kernel, ns, ns.nest, k
        self.plan = ns.cuda
        self.source, self.block, self.w = source, block, w
        self.idx = self.plan.index
        self.folds = [take_helper(source, r.combiner, r.dtype) if r.combiner in ARG_COMBINERS
                      else fold_helper(source, _FOLDS, r.combiner, r.dtype)[0] for r in self.nest.reductions]
        self.args = [r.combiner in ARG_COMBINERS for r in self.nest.reductions]
        # the kernel's by-value scalars, which every expression may read
        self.arguments = {("scalar", a.name): (a.name, a.dtype) for a in kernel.arguments if a.dtype is not None}
        self.vector = self.plan.vector  # lanes per access; 1 while rendering the ragged end of a symbolic dim
        self.flat = ""  # elements: the variable holding the element's row-major position over the whole domain
        self.smem = 0  # bytes of the kernel's shared buffer this nest uses (nests never run in one block)
        # generic: buffers are the variables tw_q0, tw_q1, ... (``used`` lists their params in that order) and
        # the element count is tw_n, so nests that differ only in those share one body (see _groups)
        self.generic = generic
        self.used: list[int] = []
        self.hoisted: dict[int, tuple[dict, dict]] = {}  # phase -> (node id -> leaf, leaf -> C name), see hoist

    def shared(self, ctype: str, name: str, count: int, itemsize: int) -> None:
        """Declare ``name``: ``count`` elements of the kernel's shared buffer, after what this nest took."""
        self.w.line(f"{ctype}* {name} = reinterpret_cast<{ctype}*>(tw_smem + {self.smem});")
        self.smem += -(-count * itemsize // 16) * 16

    # ------------------------------------------------------------------ accesses
    def access(self, index: Index) -> _Access:
        s = _stride(index, self.plan.vector_dim)
        if self.vector == 1 or s == 0:
            return _Access("shared", s)
        return _Access("vector" if s == 1 else "lanes", s)

    def where(self, index: Index) -> str:
        """The C code of ``index``: the element's flat position where the index is the domain's row-major layout
        (a contiguous operand of an eager kernel whose other operands are strided: no multiply by a symbolic
        stride per dim), else offset + stride * coordinate per dim."""
        shape = self.nest.shape
        if self.flat and len(shape) > 1 and index.offset == 0 and dict(index.terms) == {
                d: extent(shape[d + 1:]) for d in range(len(shape))}:
            return self.flat
        return _index_code(index, self.idx)

    def param(self, k: int) -> str:
        if not self.generic:
            return self.kernel.params[k].name
        if k not in self.used:
            self.used.append(k)
        return f"tw_q{self.used.index(k)}"

    def vec_type(self, dtype: DType) -> str:
        return f"tw_vec<{CUDA.ctype(dtype)}, {self.vector}>"

    def guarded(self, load: Load, code: str, ctype: str, lane: int = 0) -> str:
        """``code``, the value of ``load`` at vector lane ``lane``, under the load's guard (0 outside it)."""
        if load.guard is None:
            return code
        dim = load.guard[0]
        shift = lane if dim == self.plan.vector_dim and self.vector > 1 else 0
        return f"({load.guard_code(lambda d: f'(d{d} + {shift})' if shift else f'd{d}')}) ? {code} : ({ctype})0"

    def load_lanes(self, j: int, load: Load, suffix: str, lanes: int) -> list[str]:
        """Emit the load ``j`` for ``lanes`` lanes; return each lane's C name. A guarded load reads memory only
        inside its guard: a vector (whose lanes the schedule keeps on one side of the guard's bounds) reads the
        buffer's start instead outside it, a lane never reads."""
        ctype = CUDA.ctype(compute_of(load.dtype))
        where = self.where(load.index)
        name = f"x{j}{suffix}"
        acc = self.access(load.index)
        per_lane = lanes > 1 and load.guard is not None and load.guard[0] == self.plan.vector_dim
        if load.iota is not None:  # positions, not memory
            steps = [0] if (acc.how == "shared" or lanes == 1) and not per_lane else [
                v * acc.stride for v in range(lanes)]
            names = [f"{name}_{v}" for v in range(len(steps))]
            for v, (n, step) in enumerate(zip(names, steps)):
                at = where if not step else f"{where} + {_step(self.idx, v, acc.stride)}"
                self.w.line(f"const {ctype} {n} = {self.guarded(load, f'({ctype})({load.iota_code(at)})', ctype, v)};")
            return names * (lanes if len(steps) == 1 else 1)
        if (acc.how == "shared" or lanes == 1) and not per_lane:
            code = load_code(CUDA, load.dtype, f"{self.param(load.param)}[{where}]")
            self.w.line(f"const {ctype} {name} = {self.guarded(load, f'({ctype})({code})', ctype)};")
            return [name] * lanes
        if acc.how == "vector":
            vt = self.vec_type(load.dtype)
            at = where if load.guard is None else f"(({self.guarded(load, where, self.idx)}))"
            self.w.line(f"const {vt} {name}v = *reinterpret_cast<const {vt}*>({self.param(load.param)} + {at});")
            stored = [f"{name}v.v[{v}]" for v in range(lanes)]
        elif acc.how == "shared":  # one element for every lane, each lane under its own guard
            stored = [f"{self.param(load.param)}[{where}]"] * lanes
        else:
            stored = [f"{self.param(load.param)}[{where} + {_step(self.idx, v, acc.stride)}]" for v in range(lanes)]
        names = []
        for v, code in enumerate(stored):
            value = f"({ctype})({load_code(CUDA, load.dtype, code)})"
            self.w.line(f"const {ctype} {name}_{v} = {self.guarded(load, value, ctype, v)};")
            names.append(f"{name}_{v}")
        return names

    def lanes(self, exprs: list[Expr], leaves: dict, suffix: str, cached: dict | None = None,
              loaded: dict | None = None) -> list[list]:
        """Render ``exprs`` for every lane (loads first); per lane, the (code, type) of each expression.
        ``cached``: lane names of loads already made; ``loaded`` receives the lane names of each load."""
        lanes = self.vector
        new = new_nodes(exprs)
        used = sorted({n.arg for nodes in new for n in nodes if n.op == "input"})
        per_lane = [{**self.arguments, **leaves} for _ in range(lanes)]
        for j in used:
            load = self.nest.loads[j]
            if cached is not None and j in cached:
                names = cached[j]
            else:
                names = self.load_lanes(j, load, suffix, lanes)
            if loaded is not None:
                loaded[j] = names
            for v in range(lanes):
                per_lane[v][("input", j)] = (names[v], compute_of(load.dtype))
        results = []
        for v in range(lanes):
            renderer = ExprRenderer(self.source, per_lane[v], f"{suffix}_{v}")
            results.append([renderer.render(e, nodes) for e, nodes in zip(exprs, new)])
            for line in renderer.lines:
                self.w.line(line)
        return results

    def store_lanes(self, stores: list, results: list[list], offset: int) -> None:
        """Write each store's lanes (``results[lane][offset + s]``)."""
        for s, st in enumerate(stores):
            param, where = self.param(st.param), self.where(st.index)
            acc = self.access(st.index)
            codes = [store_code(CUDA, st.dtype, *results[v][offset + s], st.saturate) for v in range(self.vector)]
            if acc.how == "vector":
                vt = self.vec_type(st.dtype)
                self.w.line(f"{{ {vt} o; " + " ".join(f"o.v[{v}] = {c};" for v, c in enumerate(codes))
                            + f" *reinterpret_cast<{vt}*>({param} + {where}) = o; }}")
            elif acc.how == "shared":
                self.w.line(f"{param}[{where}] = {codes[-1]};")
            else:
                for v, c in enumerate(codes):
                    self.w.line(f"{param}[{where} + {_step(self.idx, v, acc.stride)}] = {c};")

    # ------------------------------------------------------------------ coordinates
    def decompose(self, var: str, dims: tuple[int, ...]) -> None:
        """Declare ``d<k>`` for ``dims`` from ``var``, their row-major linear index."""
        rest = var
        for pos in range(len(dims) - 1, -1, -1):
            d = dims[pos]
            extent = self.nest.shape[d]
            if pos == 0:
                self.w.line(f"const {self.idx} d{d} = {rest};")
            else:
                self.w.line(f"const {self.idx} d{d} = {rest} % {extent};")
                inner = f"{var}_{pos}"
                self.w.line(f"const {self.idx} {inner} = {rest} / {extent};")
                rest = inner

    # ------------------------------------------------------------------ strategies
    def render(self) -> None:
        getattr(self, self.plan.strategy)()

    def elements(self) -> None:
        nest, plan, idx = self.nest, self.plan, self.idx
        n = extent(nest.shape)
        self.w.line(f"const {idx} e = (({idx})tw_block * {self.block} + threadIdx.x) * {plan.vector};")
        if not known(n) and plan.vector > 1:  # a symbolic length: the last vector may be partial
            self.w.open(f"if (e + {plan.vector} <= {n})")
            self.element_stores("e")
            self.w.close(" else {")
            self.w.depth += 1
            self.vector = 1
            self.w.open(f"for ({idx} i = e; i < {n}; ++i)")
            self.element_stores("i")
            self.w.close()
            self.vector = plan.vector
            self.w.close()
            return
        self.w.open(f"if (e < {'tw_n' if self.generic else _size_code(n, idx)})")
        self.element_stores("e")
        self.w.close()

    def tiles(self) -> None:
        """[Note: transposing tiles], in ``tiles_cuda``: each thread a block of elements in registers."""
        self.vector = 1
        render_tiles(self, [_stored(st) for st in self.nest.stores])
        self.vector = self.plan.vector

    def element_stores(self, var: str) -> None:
        self.decompose(var, self.nest.outer)
        self.flat = var
        results = self.lanes([_stored(st) for st in self.nest.stores], {}, "")
        self.store_lanes(self.nest.stores, results, 0)
        self.flat = ""

    # rows and columns share the per-row skeleton; they differ in who folds which element and how
    # the team combines its partial results
    def acc_leaves(self, upto_phase: int) -> dict:
        leaves = {("scalar", f"acc{j}"): (f"acc{j}", r.dtype) for j, r in enumerate(self.nest.reductions)
                  if r.phase < upto_phase}
        leaves.update({("scalar", f"pos{j}"): (f"pos{j}", int64) for j, r in enumerate(self.nest.reductions)
                       if r.phase < upto_phase and self.args[j]})
        return leaves

    def fold(self, j: int, acc: str, value: str, position: str = "") -> str:
        """The statement folding ``value`` (at reduced position ``position``, for an arg-reduction) into
        accumulator ``acc`` of reduction ``j``."""
        if not self.args[j]:
            return f"{acc} = {self.folds[j]}({acc}, {value});"
        pos = acc.replace("acc", "pos", 1)
        return f"if ({self.folds[j]}({acc}, {pos}, {value}, {position})) {{ {acc} = {value}; {pos} = {position}; }}"

    def position(self, lane: int) -> str:
        """The reduced position (row-major over the reduced dims) of lane ``lane`` of the current element."""
        along = self.plan.vector_dim in self.nest.reduce and self.vector > 1
        return f"(j + {lane})" if along and lane else "j"

    @property
    def lane_accumulators(self) -> bool:
        """Each lane folds a column of its own (``[Note: vector columns]``): an accumulator per lane."""
        return self.plan.strategy == "columns" and self.plan.vector > 1

    def acc(self, j: int, lane: int) -> str:
        return f"acc{j}_{lane}" if self.lane_accumulators else f"acc{j}"

    def begin_row(self, row: str) -> None:
        self.decompose(row, self.nest.outer)
        lanes = self.plan.vector if self.lane_accumulators else 1
        for j, r in enumerate(self.nest.reductions):
            for v in range(lanes):
                self.w.line(f"{CUDA.ctype(r.dtype)} {self.acc(j, v)} = "
                            f"{literal(identity(r.combiner, r.dtype), r.dtype, CUDA)};")
                if self.args[j]:
                    self.w.line(f"long long {self.acc(j, v).replace('acc', 'pos', 1)} = -1;")

    def element_body(self, p: int, suffix: str, cached: dict | None = None) -> None:
        """Fold phase ``p``'s reductions and write its stores at the current element's lanes. Sums rescaled
        by a maximum of this phase (``online_softmax``) come after the maximum has taken every lane: one
        rescaling per vector, then each lane's term against the new maximum."""
        nest = self.nest
        reds = [j for j, r in enumerate(nest.reductions) if r.phase == p and r.rescale is None]
        online = [j for j, r in enumerate(nest.reductions) if r.phase == p and r.rescale is not None]
        stores = [s for s in nest.stores if s.phase == p]
        loaded = dict(cached or {})
        mapping, hoisted = self.hoisted.get(p, ({}, {}))
        results = self.lanes([substitute(nest.reductions[j].value, mapping) for j in reds]
                             + [substitute(_stored(s), mapping) for s in stores],
                             {**self.acc_leaves(p), **hoisted}, suffix, loaded, loaded)
        maxes = sorted({nest.reductions[j].rescale for j in online})
        for m in maxes:
            self.w.line(f"const {CUDA.ctype(nest.reductions[m].dtype)} tw_was{m} = acc{m};")
        tree = self.vector > 1 and not self.lane_accumulators and not any(self.args[j] for j in reds)
        if tree:  # a pairwise tree over the lanes: log2(vector) dependent folds into the accumulator, not vector
            for pos, j in enumerate(reds):
                names = [results[v][pos][0] for v in range(self.vector)]
                while len(names) > 1:
                    pairs = []
                    for k in range(0, len(names), 2):
                        pairs.append(f"tw_f{j}_{k // 2}{suffix}_{len(names)}")
                        self.w.line(f"const {CUDA.ctype(nest.reductions[j].dtype)} {pairs[-1]} = "
                                    f"{self.folds[j]}({names[k]}, {names[k + 1]});")
                    names = pairs
                self.w.line(self.fold(j, self.acc(j, 0), names[0]))
        for v in range(self.vector if not tree else 0):
            for pos, j in enumerate(reds):
                self.w.line(self.fold(j, self.acc(j, v), results[v][pos][0], self.position(v)))
        self.store_lanes(stores, results, len(reds))
        if not online:
            return
        for j in online:
            m = nest.reductions[j].rescale
            self.w.line(f"acc{j} *= {self.rescale(j)}(tw_was{m}, acc{m});")
        for m in maxes:  # while every element so far is -inf, terms are exp(-inf - 0) = 0, not exp(-inf + inf)
            t = nest.reductions[m].dtype
            self.w.line(f"const {CUDA.ctype(t)} tw_max{m} = acc{m} == {literal(float('-inf'), t, CUDA)} ? "
                        f"{literal(0, t, CUDA)} : acc{m};")
        leaves = {**self.acc_leaves(p), **hoisted}
        leaves.update({("scalar", f"acc{m}"): (f"tw_max{m}", nest.reductions[m].dtype) for m in maxes})
        terms = self.lanes([substitute(nest.reductions[j].value, mapping) for j in online], leaves, suffix + "o",
                           loaded)
        for v in range(self.vector):
            for pos, j in enumerate(online):
                self.w.line(f"acc{j} = {self.folds[j]}(acc{j}, {terms[v][pos][0]});")

    def invariant_parts(self, roots: list[Expr], varying: set[int], finished: set[str], tag: str,
                        leaves: dict, arguments: bool = False) -> tuple[dict, dict]:
        """Render now the largest parts of ``roots`` that read no load walking a dim of ``varying`` (and of the
        named scalars only the accumulators ``finished``, and with ``arguments`` the kernel's by-value
        arguments), as ``<tag>_<k>``; return the mapping that substitutes them into the roots and the leaves
        that name them."""
        nest = self.nest
        invariant: dict[int, bool] = {}
        for root in roots:
            for n in toposort(root):  # operands first
                if n.op == "input":
                    invariant[id(n)] = not nest.loads[n.arg].dims() & varying
                elif n.op == "scalar":
                    invariant[id(n)] = n.arg in finished or (arguments and ("scalar", n.arg) in self.arguments)
                else:
                    invariant[id(n)] = all(invariant[id(x)] for x in n.srcs)
        chosen: list[Expr] = []
        seen: set[int] = set()
        todo = list(roots)
        while todo:  # the largest invariant parts, outermost first
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            leafy = node.op in ("scalar", "const") or (node.op == "cast" and node.srcs[0].op in ("scalar", "const"))
            if not invariant[id(node)]:
                todo.extend(node.srcs)
            elif not leafy:
                chosen.append(node)
        if not chosen:
            return {}, {}
        leaves = {**self.arguments, **leaves}
        for j in sorted({n.arg for e in chosen for n in toposort(e) if n.op == "input"}):
            load = nest.loads[j]
            leaves[("input", j)] = (self.load_lanes(j, load, f"_{tag}", 1)[0], compute_of(load.dtype))
        renderer = ExprRenderer(self.source, leaves, f"_{tag}")
        mapping, hoisted = {}, {}
        for k, node in enumerate(chosen):
            code, t = renderer.render(node)
            name = f"{tag}_{k}"
            for line in renderer.lines:
                self.w.line(line)
            renderer.lines.clear()
            self.w.line(f"const {CUDA.ctype(t)} {name} = {code};")
            mapping[id(node)] = Expr("scalar", (), name)
            hoisted[("scalar", name)] = (name, t)
        return mapping, hoisted

    def hoist(self, p: int) -> None:
        """Compute, before phase ``p``'s loop over a row, the parts of its expressions that are the same for
        every element of the row: per-row loads (a row's target, a statistic), accumulators of earlier phases
        and what is made of them alone (``1 / sum``). The loop reads them as ``h<p>_<k>``. The row's
        bounds hold here (callers hoist only where every thread of the loop has a row)."""
        nest = self.nest
        finished = {f"acc{j}" for j, r in enumerate(nest.reductions) if r.phase < p}
        roots = [r.value for r in nest.reductions if r.phase == p]
        roots += [_stored(st) for st in nest.stores if st.phase == p]
        mapping, hoisted = self.invariant_parts(roots, set(nest.reduce), finished, f"h{p}", self.acc_leaves(p))
        if not mapping:
            return
        self.hoisted[p] = (mapping, hoisted)

    def rescale(self, j: int) -> str:
        """The helper ``(was, now) -> exp(was - now)`` (1 where equal, so two empty maxima give 1, not NaN) in
        the dtype of sum ``j``."""
        dtype = self.nest.reductions[j].dtype
        name = f"tw_rescale_{dtype.name}"
        if name not in self.source.helpers:
            was, now = Expr("scalar", (), "was"), Expr("scalar", (), "now")
            expr = where(was.eq(now), 1.0, (was - now).exp())
            self.source.helpers[name] = scalar_function(self.source, name, expr, ("was", "now"), dtype)
        return name

    def fold_pairs(self, reds: list[int], other) -> None:
        """Fold another partial result into this thread's for reductions ``reds`` of one phase: each maximum
        with the sums rescaled by it as a pair, every other reduction with its combiner. ``other(j)`` is the
        code of the other partial of reduction ``j``, ``other(j, "pos")`` that of an arg-reduction's position."""
        nest = self.nest
        online = {j: nest.reductions[j].rescale for j in reds if nest.reductions[j].rescale is not None}
        for j in reds:
            if j in online:
                continue
            sums = [k for k, m in online.items() if m == j]
            if self.args[j]:  # both partials read before either is replaced (a shuffle every lane takes part in)
                c = CUDA.ctype(nest.reductions[j].dtype)
                self.w.line(f"{{ const {c} tw_o = {other(j)}; const long long tw_op = {other(j, 'pos')}; "
                            f"{self.fold(j, f'acc{j}', 'tw_o', 'tw_op')} }}")
                continue
            if not sums:
                self.w.line(f"acc{j} = {self.folds[j]}(acc{j}, {other(j)});")
                continue
            c = CUDA.ctype(nest.reductions[j].dtype)
            self.w.open("")
            self.w.line(f"const {c} tw_o = {other(j)}, tw_n = {self.folds[j]}(acc{j}, tw_o);")
            for k in sums:
                self.w.line(f"acc{k} = {self.folds[k]}(acc{k} * {self.rescale(k)}(acc{j}, tw_n), "
                            f"{other(k)} * {self.rescale(k)}(tw_o, tw_n));")
            self.w.line(f"acc{j} = tw_n;")
            self.w.close()

    def row_stores(self, who: str) -> None:
        stores = [s for s in self.nest.stores if s.phase is None]
        if not stores:
            return
        self.w.open(f"if ({who})")
        leaves = {**self.arguments, **self.acc_leaves(self.nest.phases)}
        for j in sorted({n.arg for st in stores for n in toposort(_stored(st)) if n.op == "input"}):
            load = self.nest.loads[j]
            leaves[("input", j)] = (self.load_lanes(j, load, "_r", 1)[0], compute_of(load.dtype))
        renderer = ExprRenderer(self.source, leaves, "_r")
        results = [renderer.render(_stored(s)) for s in stores]
        for line in renderer.lines:
            self.w.line(line)
        for st, (code, t) in zip(stores, results):
            where = _index_code(st.index, self.idx)
            if self.plan.partials:  # slot ``tw_part`` of the row's ``tw_split`` partial results
                where = f"({where}) * tw_split + tw_part"
            self.w.line(f"{self.param(st.param)}[{where}] = {store_code(CUDA, st.dtype, code, t, st.saturate)};")
        self.w.close()

    def varying(self) -> list[int]:
        reduced = set(self.nest.reduce)
        return [j for j, ld in enumerate(self.nest.loads) if ld.dims() & reduced]

    def rows(self) -> None:
        nest, plan, idx = self.nest, self.plan, self.idx
        if plan.split > 1:
            self.split_row()
            return
        if not known(*nest.shape):
            self.symbolic_rows()
            return
        row_len = S.numel([nest.shape[d] for d in nest.reduce])
        rows = S.numel([nest.shape[d] for d in nest.outer])
        team, vec = plan.team, plan.vector
        self.w.line("const int tw_t = threadIdx.x" + (f" % {team};" if plan.rows_per_block > 1 else ";"))
        row = f"({idx})tw_block * {plan.rows_per_block} + threadIdx.x / {team}" if plan.rows_per_block > 1 \
            else f"({idx})tw_block"
        self.w.line(f"const {idx} row = {row};")
        guarded = rows % plan.rows_per_block != 0  # only warp teams share a block: no barrier inside
        if guarded:
            self.w.open(f"if (row < ({idx}){rows})")
        self.begin_row("row")
        partial = row_len % (team * vec) != 0
        cached = None
        if plan.in_registers:
            cached = self.keep_in_registers(row_len, partial)
        for p in range(nest.phases):
            self.hoist(p)
            if plan.in_registers:
                self.w.line("#pragma unroll")
                self.w.open(f"for (int kk = 0; kk < {plan.steps}; ++kk)")
                self.w.line(f"const {idx} j = (({idx})kk * {team} + tw_t) * {vec};")
                if partial:
                    self.w.open(f"if (j < ({idx}){row_len})")
            else:
                self.w.open(f"for ({idx} j = ({idx})tw_t * {vec}; j < ({idx}){row_len}; j += {team * vec})")
            self.decompose("j", nest.reduce)
            lanes = None
            if cached is not None:
                lanes = {j: [f"{name}[kk * {vec} + {v}]" for v in range(vec)] for j, name in cached.items()}
            self.element_body(p, f"_p{p}", lanes)
            if plan.in_registers and partial:
                self.w.close()
            self.w.close()
            self.team_reduce(p)
        self.row_stores("tw_t == 0")
        if guarded:
            self.w.close()

    def symbolic_rows(self) -> None:
        """Rows of a length known at launch (one phase): ``vector`` lanes per trip up to the last whole vector
        of the thread's range, then the rest element by element; a split row (``partials``) is a range of
        ``tw_chunk`` (a whole number of vectors) per block."""
        nest, plan, idx = self.nest, self.plan, self.idx
        row_len = extent([nest.shape[d] for d in nest.reduce])
        rows = extent([nest.shape[d] for d in nest.outer])
        team, vec = plan.team, plan.vector
        self.w.line("const int tw_t = threadIdx.x" + (f" % {team};" if plan.rows_per_block > 1 else ";"))
        if plan.partials:
            self.w.line(f"const {idx} row = ({idx})tw_block / tw_split, tw_part = ({idx})tw_block % tw_split;")
            self.chunk_bounds(row_len)
        else:
            per_block = plan.rows_per_block
            row = f"({idx})tw_block * {per_block} + threadIdx.x / {team}" if per_block > 1 else f"({idx})tw_block"
            self.w.line(f"const {idx} row = {row};")
            self.w.line(f"const {idx} lo = 0, hi = {_size_code(row_len, idx)};")
        if plan.rows_per_block > 1:  # only warp teams share a block: no barrier inside
            self.w.open(f"if (row < {_size_code(rows, idx)})")
        self.begin_row("row")
        self.hoist(0)
        end = "hi"
        if vec > 1:
            self.w.line(f"const {idx} tw_vend = lo + (hi - lo) / {vec} * {vec};")
            end = "tw_vend"
        if plan.unroll:
            self.w.line(f"#pragma unroll {plan.unroll}")
        first = f"({idx})tw_t * {vec}" if vec > 1 else "tw_t"
        self.w.open(f"for ({idx} j = lo + {first}; j < {end}; j += {team * vec})")
        self.decompose("j", nest.reduce)
        self.element_body(0, "_p0")
        self.w.close()
        if vec > 1:
            self.vector = 1
            self.w.open(f"for ({idx} j = tw_vend + tw_t; j < hi; j += {team})")
            self.decompose("j", nest.reduce)
            self.element_body(0, "_t0")
            self.w.close()
            self.vector = vec
        self.team_reduce(0)
        self.row_stores("tw_t == 0")
        if plan.rows_per_block > 1:
            self.w.close()

    def chunk_bounds(self, row_len) -> None:
        """``lo`` and ``hi`` of chunk ``tw_part`` of a row split at launch, both clamped to the row (a chunk rounded
        up to whole vectors may leave the last parts past its end: they fold nothing)."""
        idx, n = self.idx, _size_code(row_len, self.idx)
        self.w.line(f"const {idx} tw_lo = tw_part * tw_chunk, lo = tw_lo < {n} ? tw_lo : {n}, "
                    f"hi = lo + tw_chunk < {n} ? lo + tw_chunk : {n};")

    def split_row(self) -> None:
        """A chunk of a long row per block; partials to scratch; the row's last block combines them."""
        nest, plan, idx = self.nest, self.plan, self.idx
        row_len = S.numel([nest.shape[d] for d in nest.reduce])
        rows = S.numel([nest.shape[d] for d in nest.outer])
        g, vec, team = plan.split, plan.vector, plan.team
        self.w.line("const int tw_t = threadIdx.x;")
        self.w.line(f"const {idx} row = ({idx})(tw_block / {g}u), part = ({idx})(tw_block % {g}u);")
        self.begin_row("row")
        self.w.line(f"const {idx} lo = part * {plan.chunk}, hi = lo + {plan.chunk} < {row_len} ? lo + {plan.chunk} "
                    f": ({idx}){row_len};")
        self.hoist(0)
        self.w.open(f"for ({idx} j = lo + ({idx})tw_t * {vec}; j < hi; j += {team * vec})")
        self.decompose("j", nest.reduce)
        self.element_body(0, "_p0")
        self.w.close()
        self.team_reduce(0)
        self.combine_parts(rows, "row", "part", "tw_t == 0")
        self.row_stores("*tw_last && tw_t == 0")

    def keep_in_registers(self, row_len: int, partial: bool) -> dict[int, str]:
        """Load the row's varying loads once into per-thread arrays (``kk * vector + lane``)."""
        plan, idx = self.plan, self.idx
        names = {}
        for j in self.varying():
            ctype = CUDA.ctype(compute_of(self.nest.loads[j].dtype))
            names[j] = f"xr{j}"
            self.w.line(f"{ctype} xr{j}[{plan.steps * plan.vector}];")
        self.w.line("#pragma unroll")
        self.w.open(f"for (int kk = 0; kk < {plan.steps}; ++kk)")
        self.w.line(f"const {idx} j = (({idx})kk * {plan.team} + tw_t) * {plan.vector};")
        self.w.open(f"if (j < ({idx}){row_len})" if partial else "")
        self.decompose("j", self.nest.reduce)
        for j in names:
            lanes = self.load_lanes(j, self.nest.loads[j], "_k", plan.vector)
            for v, lane in enumerate(lanes):
                self.w.line(f"xr{j}[kk * {plan.vector} + {v}] = {lane};")
        self.w.close()
        self.w.close()
        return names

    def team_reduce(self, p: int) -> None:
        reds = [j for j, r in enumerate(self.nest.reductions) if r.phase == p]
        if not reds:
            return
        self.source.helpers.setdefault("tw_shfl_xor", _SHUFFLE_XOR)
        team = self.plan.team
        if self.plan.strategy == "columns":
            for j in reds:
                r = self.nest.reductions[j]
                self.shared(CUDA.ctype(r.dtype), f"tw_c{j}", team * 33, r.dtype.itemsize)  # [team][33]
                self.w.line(f"tw_c{j}[tw_y * 33 + tw_x] = acc{j};")
                if self.args[j]:
                    self.shared("long long", f"tw_cpos{j}", team * 33, 8)
                    self.w.line(f"tw_cpos{j}[tw_y * 33 + tw_x] = pos{j};")
            self.w.line("__syncthreads();")
            for j in reds:
                self.w.line(f"acc{j} = tw_c{j}[tw_x];")
                if self.args[j]:
                    self.w.line(f"pos{j} = tw_cpos{j}[tw_x];")
                    fold = self.fold(j, f"acc{j}", f"tw_c{j}[y * 33 + tw_x]", f"tw_cpos{j}[y * 33 + tw_x]")
                    self.w.line(f"for (int y = 1; y < {team}; ++y) {fold}")
                    continue
                fold = f"{self.folds[j]}(acc{j}, tw_c{j}[y * 33 + tw_x])"
                self.w.line(f"for (int y = 1; y < {team}; ++y) acc{j} = {fold};")
            return
        self.w.open("for (int s = 16; s > 0; s >>= 1)")
        self.fold_pairs(reds, lambda j, what="acc": f"tw_shfl_xor({what}{j}, s)")
        self.w.close()
        if team <= 32:
            return
        warps = team // 32
        for j in reds:
            r = self.nest.reductions[j]
            self.shared(CUDA.ctype(r.dtype), f"tw_w{j}", warps, r.dtype.itemsize)
            self.w.line(f"if ((threadIdx.x & 31) == 0) tw_w{j}[threadIdx.x >> 5] = acc{j};")
            if self.args[j]:
                self.shared("long long", f"tw_wpos{j}", warps, 8)
                self.w.line(f"if ((threadIdx.x & 31) == 0) tw_wpos{j}[threadIdx.x >> 5] = pos{j};")
        self.w.line("__syncthreads();")
        for j in reds:
            self.w.line(f"acc{j} = tw_w{j}[0];")
            if self.args[j]:
                self.w.line(f"pos{j} = tw_wpos{j}[0];")
        self.w.open(f"for (int w = 1; w < {warps}; ++w)")
        self.fold_pairs(reds, lambda j, what="acc": f"tw_w{'pos' if what == 'pos' else ''}{j}[w]")
        self.w.close()

    def columns(self) -> None:
        nest, plan, idx = self.nest, self.plan, self.idx
        row_len = extent([nest.shape[d] for d in nest.reduce])
        rows = extent([nest.shape[d] for d in nest.outer])
        g, width, vec = plan.split, plan.rows_per_block, plan.vector
        self.w.line("const int tw_x = threadIdx.x & 31, tw_y = threadIdx.x >> 5;")
        group = f"tw_block / {g}u" if g > 1 else "tw_block"
        if plan.partials:
            self.w.line(f"const {idx} tw_part = ({idx})tw_block % tw_split;")
            group = "tw_block / tw_split"
        lane = f"tw_x * {vec}" if vec > 1 else "tw_x"
        self.w.line(f"const {idx} group = ({idx})({group}), row = group * {width} + {lane};")
        self.w.line(f"const bool tw_valid = row < {_size_code(rows, idx)};")
        self.begin_row("row")
        lo, hi = "0", _size_code(row_len, idx)
        if plan.partials:
            self.chunk_bounds(row_len)
            lo, hi = "lo", "hi"
        if g > 1:
            self.w.line(f"const {idx} lo = ({idx})(tw_block % {g}u) * {plan.chunk}, "
                        f"hi = lo + {plan.chunk} < {row_len} ? lo + {plan.chunk} : ({idx}){row_len};")
            lo, hi = "lo", "hi"
        for p in range(nest.phases):
            if plan.unroll:  # a bound the loop's trip count follows from, so the unrolled loads are independent
                self.w.line(f"const {idx} tw_end{p} = tw_valid ? {hi} : {lo};")
                self.w.line(f"#pragma unroll {plan.unroll}")
                self.w.open(f"for ({idx} j = {lo} + tw_y; j < tw_end{p}; j += {plan.team})")
            else:
                self.w.open(f"for ({idx} j = {lo} + tw_y; tw_valid && j < {hi}; j += {plan.team})")
            self.decompose("j", nest.reduce)
            self.element_body(p, f"_p{p}")
            self.w.close()
            if self.lane_accumulators:
                self.column_owners(rows)
            else:
                self.team_reduce(p)
        owners = "tw_valid" if self.lane_accumulators else "tw_valid && tw_y == 0"
        if g > 1:
            self.combine_parts(rows, "group", f"tw_block % {g}u", owners)
            self.row_stores(f"*tw_last && {owners}")
        else:
            self.row_stores(owners)
        if self.lane_accumulators:
            self.w.close()

    def column_owners(self, rows: int) -> None:
        """Vector columns (one phase): the warps' per-lane partials meet in shared memory, then thread ``t``
        of the block folds column ``t`` of the group, as ``acc<j>``, ``row`` and its coordinates, in a scope
        the caller closes after the column's stores."""
        nest, plan, idx = self.nest, self.plan, self.idx
        width, vec, team = plan.rows_per_block, plan.vector, plan.team
        for j, r in enumerate(nest.reductions):
            self.shared(CUDA.ctype(r.dtype), f"tw_c{j}", team * width, r.dtype.itemsize)  # [team][width]
            for v in range(vec):
                self.w.line(f"tw_c{j}[tw_y * {width} + tw_x * {vec} + {v}] = {self.acc(j, v)};")
        self.w.line("__syncthreads();")
        self.w.open("")
        self.w.line(f"const {idx} row = group * {width} + threadIdx.x;")
        self.w.line(f"const bool tw_valid = threadIdx.x < {width} && row < ({idx}){rows};")
        self.decompose("row", nest.outer)
        for j, r in enumerate(nest.reductions):
            self.w.line(f"{CUDA.ctype(r.dtype)} acc{j} = {literal(identity(r.combiner, r.dtype), r.dtype, CUDA)};")
        self.w.open("if (threadIdx.x < " + str(width) + ")")
        for j in range(len(nest.reductions)):
            self.w.line(f"acc{j} = tw_c{j}[threadIdx.x];")
            self.w.line(f"for (int y = 1; y < {team}; ++y) acc{j} = {self.folds[j]}(acc{j}, tw_c{j}[y * {width} "
                        "+ threadIdx.x]);")
        self.w.close()

    def combine_parts(self, rows: int, counter: str, part: str, owners: str) -> None:
        """A split nest: the ``owners`` of the block's partial results (one thread per row) write them to
        scratch slot ``part`` of their row (part-major, so a block's columns write side by side); the last
        block of the row group (``counter``) to finish combines every part in order, so the result does not
        depend on which block came last."""
        nest, plan, g = self.nest, self.plan, self.plan.split
        offset = plan.scratch
        for j, r in enumerate(nest.reductions):
            c = CUDA.ctype(r.dtype)
            self.w.line(f"{c}* tw_part{j} = reinterpret_cast<{c}*>(tw_scratch + {offset}) + row;")
            offset += -(-rows * g * r.dtype.itemsize // 16) * 16
        self.w.line(f"unsigned int* tw_count = reinterpret_cast<unsigned int*>(tw_scratch + {offset}) + {counter};")
        self.shared("bool", "tw_last", 1, 1)
        self.w.open(f"if ({owners})")
        for j in range(len(nest.reductions)):
            self.w.line(f"tw_part{j}[({part}) * {rows}] = acc{j};")
        self.w.line("__threadfence();")
        self.w.close()
        self.w.line("__syncthreads();")
        self.w.line(f"if (threadIdx.x == 0) *tw_last = atomicAdd(tw_count, 1u) == {g - 1}u;")
        self.w.line("__syncthreads();")
        self.w.open(f"if (*tw_last && {owners})")
        self.w.line("__threadfence();")
        for j, r in enumerate(nest.reductions):
            self.w.line(f"acc{j} = {literal(identity(r.combiner, r.dtype), r.dtype, CUDA)};")
        self.w.open(f"for (int p = 0; p < {g}; ++p)")
        self.fold_pairs(list(range(len(nest.reductions))), lambda j: f"__ldcg(tw_part{j} + p * {rows})")
        self.w.close()
        self.w.close()
        self.w.line("if (*tw_last && threadIdx.x == 0) *tw_count = 0u;")


def render_kernel(sched: KernelSchedule, source: Source, aliased: frozenset[int] = frozenset()) -> str:
    """The CUDA C text of one scheduled kernel; its helpers go into ``source``.

    ``aliased``: the parameters that share their buffer with another (a value stored in place of an input it
    reads); every other parameter is declared ``__restrict__``."""
    kernel = sched.kernel
    for p in kernel.params:
        source.need_storage(p.dtype)
    params = [f"{'' if p.written else 'const '}{CUDA.ctype(p.dtype)}*{_qualifier(k, aliased)} {p.name}"
              for k, p in enumerate(kernel.params)]
    index = "long long" if any(ns.cuda.index != "int" for ns in sched.nests) else "int"
    params += [f"{CUDA.ctype(a.dtype) if a.dtype is not None else index} {a.name}" for a in kernel.arguments]
    if any(ns.cuda.partials for ns in sched.nests):  # the split given at launch (see ``CudaPlan.partials``)
        params += [f"{index} tw_split", f"{index} tw_chunk"]
    if sched.scratch_bytes:
        params.append("unsigned char* __restrict__ tw_scratch")
    w = _Writer()
    w.line("unsigned int tw_block = blockIdx.x;")
    groups = _groups(sched, source, aliased)
    smem = 0
    for g, members in enumerate(groups):
        last = g == len(groups) - 1
        blocks = sum(ns.cuda.blocks for _, ns, _ in members)
        k0, ns0, template = members[0]
        if template is None:
            head = f"/* nest {k0}: {ns0.cuda.strategy}, {blocks or 'as many'} block(s) */"
        else:
            head = f"/* nests {_ranges([k for k, _, _ in members])}: {ns0.cuda.strategy}, {blocks} block(s), " \
                   f"one body for {len(members)} nests */"
        w.open(head if last else f"if (tw_block < {blocks}u) {head}")
        if template is None:
            nest = _Nest(kernel, ns0, k0, source, sched.block, w)
            nest.render()
            smem = max(smem, nest.smem)
        else:
            _render_group(kernel, members, w)
        if not last:
            w.line("return;")
        w.close()
        if not last:
            w.line(f"tw_block -= {blocks}u;")
    if smem:  # one buffer for the whole kernel: a block runs one nest, so the nests' arrays share it
        w.lines.insert(0, f"    __shared__ __align__(16) unsigned char tw_smem[{smem}];")
    return f"{CUDA.kernel_prefix.format(block=sched.block)} {kernel.name}({', '.join(params)}) {{\n" + \
        "\n".join(w.lines) + "\n}"


def _ranges(indices: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` as ``1-3, 7, 9-10``."""
    runs: list[list[int]] = []
    for k in indices:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


@dataclass
class _Template:
    """A nest rendered generically: its body, the parameter behind each ``tw_q<j>`` and their declarations."""

    body: list[str]
    used: list[int]
    declarations: tuple[str, ...]
    count_type: str


def _qualifier(param: int, aliased: frozenset[int]) -> str:
    """``__restrict__`` for a parameter whose buffer no other parameter of the kernel shares."""
    return "" if param in aliased else " __restrict__"


def _template(kernel: Kernel, ns: NestSchedule, k: int, source: Source, block: int, aliased: frozenset[int]):
    """``ns`` as a generic body (see ``_Nest.generic``), or None where a nest has a body of its own."""
    if ns.cuda.strategy != "elements" or not known(*ns.nest.shape):
        return None
    w = _Writer(depth=2)
    nest = _Nest(kernel, ns, k, source, block, w, generic=True)
    nest.render()
    if nest.smem:
        return None
    params = [kernel.params[q] for q in nest.used]
    declarations = tuple(f"{'' if p.written else 'const '}{CUDA.ctype(p.dtype)}*{_qualifier(q, aliased)} tw_q{j}"
                         for j, (q, p) in enumerate(zip(nest.used, params)))
    return _Template(w.lines, nest.used, declarations, nest.idx)


def _generic_key(kernel: Kernel, ns: NestSchedule, aliased: frozenset[int]) -> tuple[tuple, list[int]]:
    """Everything a nest's generic body (``_template``) is made from in its kernel, its parameters numbered in the
    order its loads and stores first name them, and those parameters in that order: two nests of one kernel with
    equal keys have the same body, over their own parameters (``tw_q<j>`` is the same position in both lists)."""
    number: dict[int, int] = {}
    nest = ns.nest
    loads = [replace(ld, param=number.setdefault(ld.param, len(number))) if ld.param >= 0 else ld for ld in nest.loads]
    stores = [replace(st, param=number.setdefault(st.param, len(number))) for st in nest.stores]
    params = tuple((kernel.params[q].dtype, kernel.params[q].read, kernel.params[q].written, q in aliased)
                   for q in number)
    return (structure(replace(ns, nest=replace(nest, loads=loads, stores=stores))), params), list(number)


def _groups(sched: KernelSchedule, source: Source, aliased: frozenset[int]) -> list[list[tuple]]:
    """The kernel's nests in groups of (index, schedule, template): the elementwise nests whose generic bodies
    are the same text over the same buffer types form one group wherever they sit in the kernel, rendered
    once (``_render_group``); any other nest is a group of its own, with template None. Groups come in the
    order of their first nest; a group's nests take consecutive blocks.

    [Note: one body for many nests] A whole training step's optimizer update is one kernel with a nest per
    parameter tensor, every nest the same expression over other buffers and another length. Rendered one
    by one, the kernel is one long chain of bodies: each block walks past every earlier nest's test, each
    test in another stretch of code, and the compile grows with the parameter count. Rendered once with
    the buffers and the length as variables, the code is one body, and a block finds its nest, with the
    nest's buffers and length, in a balanced tree of comparisons of ``tw_block`` (log2 of the nest count
    levels deep, a few instructions each). The nests of a kernel are independent (blocks of one launch
    cannot wait for each other), so the blocks of like nests can be laid side by side: a transformer's
    parameters alternate between a few shapes and dtypes, and each kind is one body, not one per run."""
    groups: list[list[tuple]] = []
    by_key: dict[tuple, list[tuple]] = {}
    made: dict[tuple, tuple[_Template | None, list[int]]] = {}  # generic key -> a template, its nest's parameters
    for k, ns in enumerate(sched.nests):
        template = _known_template(sched.kernel, ns, k, source, sched.block, aliased, made)
        if template is None:
            groups.append([(k, ns, None)])
            continue
        key = ("\n".join(template.body), template.declarations, template.count_type)
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = []
            groups.append(group)
        group.append((k, ns, template))
    return [group if len(group) > 1 else [(group[0][0], group[0][1], None)] for group in groups]


def _known_template(kernel: Kernel, ns: NestSchedule, k: int, source: Source, block: int, aliased: frozenset[int],
                    made: dict[tuple, tuple[_Template | None, list[int]]]) -> _Template | None:
    """``_template`` of the nest, or that of an earlier nest of the kernel with the same ``_generic_key`` over this
    nest's parameters: an optimizer's kernel has a nest per parameter tensor, most of them alike, and rendering each
    only to find the same text was most of rendering a GPT-2 step. (The earlier nest asked ``source`` for the
    same helpers.)"""
    if ns.cuda.strategy != "elements" or not known(*ns.nest.shape):
        return None
    key, params = _generic_key(kernel, ns, aliased)
    found = made.get(key)
    if found is None:
        template = _template(kernel, ns, k, source, block, aliased)
        made[key] = (template, params)
        return template
    template, theirs = found
    if template is None:
        return None
    position = {q: j for j, q in enumerate(theirs)}
    return _Template(template.body, [params[position[q]] for q in template.used], template.declarations,
                     template.count_type)


def _render_group(kernel: Kernel, members: list[tuple], w: _Writer) -> None:
    template = members[0][2]
    for declaration in template.declarations:
        w.line(f"{declaration};")
    w.line(f"{template.count_type} tw_n;")
    starts = [0]
    for _, ns, _ in members:
        starts.append(starts[-1] + ns.cuda.blocks)

    def choose(lo: int, hi: int) -> None:  # members lo..hi-1; tw_block counts from the group's first block
        if hi - lo == 1:
            _, ns, own = members[lo]
            names = ", ".join(kernel.params[q].name for q in own.used)
            for j, q in enumerate(own.used):
                w.line(f"tw_q{j} = {kernel.params[q].name};")
            w.line(f"tw_n = ({template.count_type}){S.numel(ns.nest.shape)};  /* nest {members[lo][0]}: {names} */")
            if starts[lo]:
                w.line(f"tw_block -= {starts[lo]}u;")
            return
        mid = (lo + hi) // 2
        w.open(f"if (tw_block < {starts[mid]}u)")
        choose(lo, mid)
        w.close(" else {")
        w.depth += 1
        choose(mid, hi)
        w.close()

    choose(0, len(members))
    w.lines.extend(template.body)


def render_source(sched: KernelSchedule) -> str:
    """The CUDA translation unit of one scheduled kernel: its headers, helpers and the kernel."""
    source = Source(CUDA)
    body = render_kernel(sched, source)
    return source.text(body)


def render_program(scheds: list[KernelSchedule], aliased: dict[str, frozenset[int]] | None = None,
                   rendered: Callable[[str, str], None] | None = None) -> dict[str, str]:
    """One CUDA translation unit per kernel of a program, by kernel name: compiled in parallel, and a kernel
    two programs share (the variants of one function) is compiled once.

    A kernel whose schedule and aliased parameters equal an earlier one's (``rendering_key``: a transformer's
    layers make each kernel once per layer) takes that one's text under its own name rather than being rendered
    again: a GPT-2 training step has 214 kernels of 34 texts. The largest kernels are rendered first, and
    ``rendered(name, text)`` hears of each as it is made: its compile can start while the rest are rendered, the
    slowest first (see [Note: parallel compiles])."""
    sources: dict[str, str] = {}
    made: dict[tuple, tuple[str, str]] = {}  # rendering key -> (the kernel rendered, its text)
    for s in sorted(scheds, key=lambda s: s.kernel.statements(), reverse=True):
        name = s.kernel.name
        shared = (aliased or {}).get(name, frozenset())
        key = (s.rendering_key(), shared)
        earlier = made.get(key)
        if earlier is not None:
            sources[name] = text = earlier[1].replace(earlier[0], name)
        else:
            source = Source(CUDA)
            sources[name] = text = source.text(render_kernel(s, source, shared))
            if text.count(name) == 1:  # named once, in its head: renamed exactly by replacing the name
                made[key] = (name, text)
        if rendered is not None:
            rendered(name, text)
    return {s.kernel.name: sources[s.kernel.name] for s in scheds}
