"""Rendering a tiled element-wise nest as CUDA C (the ``tiles`` strategy of ``codegen.schedule``).

[Note: transposing tiles] An element-wise nest in which some access walks another dim than the rest (the FP8
cast of an activation stored both as it is and transposed for the backward GEMMs; a transposing copy) has no
order in which every access is contiguous: walked along the innermost dim, each element of a transposed access
is a memory sector of its own (the cast took 387 us instead of about 20). The domain is cut into tiles over the
transposed dim R and the innermost dim C (and one per index of the other dims), a block per tile, and each
thread takes a block of ``rows`` x ``cols`` elements held in registers (``TileShape``): it reads each access
that walks C as one vector per row of its block (16 bytes: 8 bfloat16) and each access that walks R as one
vector per column, computes every element, and writes each store the same way, so a transposed FP8 store
leaves a thread 8 bytes at a time. One element at a time through a shared-memory tile, the same cast moved
0.8 TB/s of a 4.8 TB/s GPU: 2-byte loads, 1-byte stores, a barrier per tile. The lanes of a warp sit side by
side along both dims so that every access fills whole sectors (the 4 x 8 lanes of a bfloat16 -> FP8 cast read
128 contiguous bytes of each of 32 rows and write 64 of each row and 32 of each transposed row), and the warps
of a block so that its tile spans a 128-byte line of each row it writes. Sizes are multiples of the vectors
(``vector_width``), so a thread's block is wholly inside the domain or wholly outside: one test. The
transposition is the registers' indexing, which the CUDA compiler resolves, every loop being unrolled: no
shared memory, no barrier.
"""

from __future__ import annotations

import re

from tilewise.codegen.kernel_ir import Index
from tilewise.codegen.render.cstyle import ExprRenderer, compute_of, load_code, store_code
from tilewise.codegen.render.cuda import CUDA
from tilewise.ops.expr import Expr, substitute, toposort


def _along(index: Index, dim: int) -> int:
    return dict(index.terms).get(dim, 0)


def render_tiles(host, stored: list[Expr]) -> None:
    """Emit the tiled nest of ``host`` (the CUDA renderer of one nest: its writer, index type, parameters and
    hoisting), whose stores write the values ``stored``."""
    nest, plan, idx, w = host.nest, host.plan, host.idx, host.w
    shape = plan.tile
    inner, across = len(nest.shape) - 1, plan.tile_dim
    size_r, size_c = nest.shape[across], nest.shape[inner]
    tiles_c = -(-size_c // shape.block_cols)
    tiles_r = -(-size_r // shape.block_rows)
    w.line(f"const {idx} tw_tc = ({idx})(tw_block % {tiles_c}u) * {shape.block_cols};")
    w.line(f"const {idx} tw_tr = ({idx})((tw_block / {tiles_c}u) % {tiles_r}u) * {shape.block_rows};")
    others = tuple(d for d in range(len(nest.shape)) if d not in (across, inner))
    if others:
        w.line(f"const {idx} tw_rest = ({idx})(tw_block / {tiles_c * tiles_r}u);")
        host.decompose("tw_rest", others)
    # what is the same over the tile (a scale read from a one-element tensor and its reciprocal) once per block
    mapping, hoisted = host.invariant_parts(stored, {across, inner}, set(), "tw_h", {}, arguments=True)
    w.line("const int tw_lane = threadIdx.x & 31, tw_warp = threadIdx.x >> 5;")
    w.line(f"const {idx} d{across} = tw_tr + ({idx})((tw_warp / {shape.warps_c}) * {shape.lanes_r} + "
           f"tw_lane / {shape.lanes_c}) * {shape.rows};")
    w.line(f"const {idx} d{inner} = tw_tc + ({idx})((tw_warp % {shape.warps_c}) * {shape.lanes_c} + "
           f"tw_lane % {shape.lanes_c}) * {shape.cols};")
    w.open(f"if (d{across} < {size_r} && d{inner} < {size_c})")
    block = _RegisterBlock(host, across, inner)
    roots = [substitute(value, mapping) for value in stored]
    used = sorted({n.arg for e in roots for n in toposort(e) if n.op == "input"})
    elements = {j: block.load(j) for j in used}
    outputs = [block.output(s) for s in range(len(nest.stores))]
    w.line("#pragma unroll")
    w.open(f"for (int tw_u = 0; tw_u < {shape.rows}; ++tw_u)")
    w.line("#pragma unroll")
    w.open(f"for (int tw_v = 0; tw_v < {shape.cols}; ++tw_v)")
    leaves = {**host.arguments, **hoisted}
    for j in used:
        load = nest.loads[j]
        value = elements[j] if load.iota is not None else load_code(CUDA, load.dtype, elements[j])
        leaves[("input", j)] = (f"(({CUDA.ctype(compute_of(load.dtype))})({value}))", compute_of(load.dtype))
    renderer = ExprRenderer(host.source, leaves)
    converted: dict[str, str] = {}  # an element's conversion to a store's dtype, made once for stores that share it
    for s, st in enumerate(nest.stores):
        copied = _copied(roots[s], nest, st.dtype)
        if copied is not None:  # the bits as they are: a copy keeps a NaN's payload, as eager's copies do
            code = elements[copied]
        else:
            code = store_code(CUDA, st.dtype, *renderer.render(roots[s]), st.saturate)
            for line in renderer.lines:
                w.line(line)
            renderer.lines.clear()
        if code not in converted:
            converted[code] = f"tw_s{s}"
            w.line(f"const {CUDA.ctype(st.dtype)} tw_s{s} = {code};")
        w.line(outputs[s].format(converted[code]))
    w.close()
    w.close()
    for s in range(len(nest.stores)):
        block.write(s)
    w.close()


def _copied(value: Expr, nest, dtype) -> int | None:
    """The load that a store of ``dtype`` writes unchanged (a copy), or None."""
    if value.op == "cast" and value.arg is dtype:
        value = value.srcs[0]
    if value.op != "input":
        return None
    load = nest.loads[value.arg]
    return value.arg if load.iota is None and load.dtype is dtype else None


class _RegisterBlock:
    """The accesses of one thread's block of a tiled nest (``[Note: transposing tiles]``): loads into register
    arrays before the loops over the block's elements, the elements' values named by the loop variables
    ``tw_u`` (along R) and ``tw_v`` (along C), stores written out of register arrays after them."""

    def __init__(self, host, across: int, inner: int):
        self.host, self.nest, self.w, self.idx = host, host.nest, host.w, host.idx
        self.across, self.inner = across, inner
        self.rows, self.cols = host.plan.tile.rows, host.plan.tile.cols

    def how(self, index: Index) -> tuple[str, int, int]:
        """("cols" | "rows" | "each", stride along R, stride along C): vectors along C (one per row), along R
        (one per column) or an element at a time."""
        s_r, s_c = _along(index, self.across), _along(index, self.inner)
        if s_c == 1 and self.cols > 1:
            return "cols", s_r, s_c
        if s_r == 1 and self.rows > 1:
            return "rows", s_r, s_c
        return "each", s_r, s_c

    def at(self, index: Index, u: str, v: str) -> str:
        """The position of element (``u``, ``v``) of the block in ``index``'s buffer."""
        s_r, s_c = _along(index, self.across), _along(index, self.inner)
        steps = [f"({self.idx}){var} * {s}" if s != 1 else f"({self.idx}){var}" for var, s in ((u, s_r), (v, s_c))
                 if s and var != "0"]
        return " + ".join([self.host.where(index)] + steps)

    def load(self, j: int) -> str:
        """Emit load ``j`` for the whole block; return the C expression of the element (tw_u, tw_v) as its buffer
        holds it (an iota's: its value)."""
        load = self.nest.loads[j]
        ctype = CUDA.ctype(load.dtype)
        if load.iota is not None:
            return f"(({CUDA.ctype(compute_of(load.dtype))})({load.iota_code(self.at(load.index, 'tw_u', 'tw_v'))}))"
        how, s_r, s_c = self.how(load.index)
        param = self.host.param(load.param)
        if how == "each":
            us, vs = (self.rows if s_r else 1), (self.cols if s_c else 1)
            self.w.line(f"{ctype} x{j}[{us}][{vs}];")
            self.loop([("u", us), ("v", vs)],
                      f"x{j}[tw_u][tw_v] = {param}[{self.at(load.index, 'tw_u', 'tw_v')}];")
            element = f"x{j}[{'tw_u' if s_r else 0}][{'tw_v' if s_c else 0}]"
        else:
            lanes, count, var, step = (self.cols, self.rows if s_r else 1, "u", s_r) if how == "cols" else \
                (self.rows, self.cols if s_c else 1, "v", s_c)
            vt = f"tw_vec<{ctype}, {lanes}>"
            u, v = ("tw_u", "0") if how == "cols" else ("0", "tw_v")
            self.w.line(f"{vt} x{j}[{count}];")
            self.loop([(var, count)], f"x{j}[tw_{var}] = *reinterpret_cast<const {vt}*>({param} + "
                                      f"{self.at(load.index, u, v)});")
            lane = "tw_v" if how == "cols" else "tw_u"
            element = f"x{j}[{f'tw_{var}' if step else 0}].v[{lane}]"
        return element

    def output(self, s: int) -> str:
        """Declare what store ``s`` writes from; return the statement (a format of the element's value) that
        puts element (tw_u, tw_v) there, or stores it at once where it goes an element at a time."""
        store = self.nest.stores[s]
        ctype = CUDA.ctype(store.dtype)
        how, _, _ = self.how(store.index)
        if how == "each":
            return f"{self.host.param(store.param)}[{self.at(store.index, 'tw_u', 'tw_v')}] = {{}};"
        if how == "cols":
            self.w.line(f"tw_vec<{ctype}, {self.cols}> o{s}[{self.rows}];")
            return f"o{s}[tw_u].v[tw_v] = {{}};"
        self.w.line(f"tw_vec<{ctype}, {self.rows}> o{s}[{self.cols}];")
        return f"o{s}[tw_v].v[tw_u] = {{}};"

    def write(self, s: int) -> None:
        store = self.nest.stores[s]
        how, _, _ = self.how(store.index)
        if how == "each":
            return
        ctype, param = CUDA.ctype(store.dtype), self.host.param(store.param)
        lanes, count, var = (self.cols, self.rows, "u") if how == "cols" else (self.rows, self.cols, "v")
        u, v = ("tw_u", "0") if how == "cols" else ("0", "tw_v")
        vt = f"tw_vec<{ctype}, {lanes}>"
        self.loop([(var, count)], f"*reinterpret_cast<{vt}*>({param} + {self.at(store.index, u, v)}) = o{s}[tw_{var}];")

    def loop(self, loops: list[tuple[str, int]], statement: str) -> None:
        """``statement`` inside unrolled loops over ``tw_<var>`` (a loop of one trip is left out: its variable
        is 0)."""
        opened = 0
        for var, count in loops:
            if count > 1:
                self.w.line("#pragma unroll")
                self.w.open(f"for (int tw_{var} = 0; tw_{var} < {count}; ++tw_{var})")
                opened += 1
            else:
                statement = re.sub(rf"\btw_{var}\b", "0", statement)
        self.w.line(statement)
        for _ in range(opened):
            self.w.close()
