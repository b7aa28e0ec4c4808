"""Kernel IR: what one generated kernel computes, before any target decides how to run it.

[Note: kernel IR] A ``Kernel`` is a list of ``Nest``s over buffer parameters. A nest has an iteration
domain (a shape, some of whose dims are reduced) and three kinds of statements, all over that domain:
``Load``s (a buffer and a symbolic, affine ``Index``: offset + sum of stride * domain index), ``Reduce``s
(fold an expression over the reduced dims with a combiner, into an accumulator) and ``Store``s (write an
expression at an index). Expressions are the operators' own scalar ``Expr``s, spliced together: the
leaf ``input k`` is the nest's k-th load and ``scalar accJ`` the J-th accumulator. A reduction or store
whose expression reads accumulators belongs to a later *phase* (another loop over the reduced dims);
stores that do not vary along the reduced dims happen once per row, after the phases. Nothing here says
which loop is parallel, what is vectorised, or which thread does what: that is ``schedule``'s job, per
target, and rendering follows the schedule.

Lowering (``lower``) turns a ``FusedKernel`` from the fusion pass into this form. Buffers are graph
values (graph inputs, kernel outputs, library-call results), each laid out contiguously in its own
shape; views of them become the strides and offsets of load indices, computed by the view operators'
own rules (``ops/views.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import _strides as S
from tilewise.compiler.ir import Node, Ref, format_type
from tilewise.compiler.meta import Stand
from tilewise.compiler.passes.fusion import FusedKernel, Group, fusion_kind, view_chain
from tilewise.dtypes import DType, bool_
from tilewise.ops.expr import Expr, rebuild, render_shared, toposort, with_srcs

COMBINER_OPS = {"add": "add", "mul": "mul", "max": "maximum", "min": "minimum", "or": "logical_or",
                "and": "logical_and"}


class LoweringError(RuntimeError):
    """A fused group the kernel IR cannot express (a bug in fusion, reported with the offending node)."""


@dataclass(frozen=True)
class Index:
    """``offset + sum(stride * d[dim])`` over domain dims."""

    offset: int
    terms: tuple[tuple[int, int], ...]  # (domain dim, stride), each stride non-zero

    def dims(self) -> set[int]:
        return {d for d, _ in self.terms}

    def text(self, names=lambda d: f"d{d}") -> str:
        parts = [f"{names(d)}" if s == 1 else f"{s}*{names(d)}" for d, s in self.terms]
        if self.offset or not parts:
            parts.append(str(self.offset))
        return " + ".join(parts)


@dataclass(frozen=True)
class Load:
    param: int  # -1 for an ``iota``
    index: Index
    dtype: DType  # the buffer's storage dtype
    # (start, step): no buffer is read, element k of the virtual buffer is ``start + step * k`` (an integer
    # ``arange`` read by the nest: a one-hot compare reads positions, not a buffer of them)
    iota: tuple[int, int] | None = None

    def iota_code(self, where: str) -> str:
        """C code of an iota's element at position ``where``."""
        start, step = self.iota
        scaled = f"({where})" if step == 1 else f"{step} * ({where})"
        return scaled if start == 0 else f"{start} + {scaled}"


@dataclass(frozen=True)
class Reduce:
    combiner: str
    value: Expr
    dtype: DType  # the accumulator's dtype
    phase: int
    # a sum of ``exp(a - accM)`` folded in the pass that finds the maximum ``accM`` (``online_softmax`` in
    # ``schedule``): the value reads accM's running value, and the sum is rescaled whenever accM grows
    rescale: int | None = None


@dataclass(frozen=True)
class Store:
    param: int
    index: Index
    value: Expr
    dtype: DType
    phase: int | None  # None: once per row, after the phases


@dataclass
class Nest:
    shape: tuple[int, ...]
    reduce: tuple[int, ...]
    loads: list[Load] = field(default_factory=list)
    reductions: list[Reduce] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)

    @property
    def phases(self) -> int:
        used = [r.phase for r in self.reductions] + [s.phase for s in self.stores if s.phase is not None]
        return max(used, default=-1) + 1

    @property
    def outer(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.reduce)


@dataclass(frozen=True)
class Param:
    name: str
    dtype: DType
    read: bool
    written: bool


@dataclass
class Kernel:
    name: str
    params: list[Param]
    nests: list[Nest]
    values: list[Node] = field(default_factory=list)  # the graph value each parameter's buffer holds

    def __str__(self) -> str:
        return format_kernel(self)


# ---------------------------------------------------------------------------- text form

def format_kernel(kernel: Kernel) -> str:
    params = ", ".join(f"{p.name}: {format_type(v.type)}{' (read)' if p.read and p.written else ''}"
                       for p, v in zip(kernel.params, kernel.values))
    lines = [f"kernel {kernel.name}({params})"]
    for k, nest in enumerate(kernel.nests):
        lines.append(f"  nest {k} over {list(nest.shape)}, reducing dims {list(nest.reduce)}, {nest.phases} phase(s)")
        for j, load in enumerate(nest.loads):
            if load.iota is not None:
                lines.append(f"    x{j} = {load.iota_code(load.index.text())}  (arange, {load.dtype.name})")
                continue
            lines.append(f"    x{j} = {kernel.params[load.param].name}[{load.index.text()}]")
        shared, texts = render_shared([r.value for r in nest.reductions] + [st.value for st in nest.stores])
        lines += [f"    {name} = {text}" for name, text in shared]
        for j, (red, text) in enumerate(zip(nest.reductions, texts)):
            online = f", rescaled as acc{red.rescale} grows" if red.rescale is not None else ""
            lines.append(f"    phase {red.phase}: acc{j} = {red.combiner}(acc{j}, {text}){online}")
        for st, text in zip(nest.stores, texts[len(nest.reductions):]):
            when = f"phase {st.phase}" if st.phase is not None else "per row"
            lines.append(f"    {when}: {kernel.params[st.param].name}[{st.index.text()}] = {text}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- physical layouts

def buffer_of(value: Node) -> Node:
    """The graph value whose buffer holds ``value`` (views read their base's buffer)."""
    return view_chain(value)[0]


def geometry(value: Node) -> tuple[tuple, tuple, int]:
    """(shape, strides, offset) of ``value`` on its buffer, by applying its views' rules to the buffer."""
    base, chain = view_chain(value)
    shape = base.type.shape
    strides, offset = S.contiguous_strides(shape), 0
    for view in chain:
        if view.op == "as_strided":
            if tuple(strides) != S.contiguous_strides(shape):
                raise LoweringError(f"as_strided over a non-contiguous view ({list(shape)}, strides {list(strides)})")
            _, size, stride, extra = view.args
            shape, strides, offset = tuple(size), tuple(stride), offset + extra
            continue
        try:
            shape, strides, offset = view.opdef.view(tuple(shape), tuple(strides), offset, *view.args[1:])
        except RuntimeError as exc:
            raise LoweringError(f"{view.op} cannot be applied to the layout of its source: {exc}") from None
    return tuple(shape), tuple(strides), offset


# ---------------------------------------------------------------------------- lowering

def cast(expr: Expr, dtype: DType) -> Expr:
    """``expr`` converted to ``dtype``; a value already cast to it is not cast again."""
    if expr.op == "cast" and expr.arg is dtype:
        return expr
    return Expr("cast", (expr,), dtype)


def _is_one(expr: Expr) -> bool:
    return expr.op == "const" and not isinstance(expr.arg, bool) and expr.arg == 1


def spliced(template: Expr, mapping: dict[int, Expr]) -> Expr:
    """``template`` with the nodes keyed (by id) in ``mapping`` replaced, and its multiplications by a literal 1
    of floating values (``alpha=1`` of add/sub), which change nothing, dropped. The replacements are values
    built the same way already, so only the template's own nodes are visited: a chain of n operators costs n
    steps, not n squared."""
    def make(node: Expr, srcs: tuple[Expr, ...]) -> Expr:
        if id(node) in mapping:
            return mapping[id(node)]
        out = with_srcs(node, srcs)
        if out.op == "mul" and _is_floating(out.srcs[0]) and _is_one(out.srcs[1]):
            return out.srcs[0]
        return out

    return rebuild(template, make, stop=mapping)


def _is_floating(expr: Expr) -> bool:
    return expr.op == "cast" and expr.arg.is_floating_point


class _NestBuilder:
    """Builds one Nest from one fusion group; parameters are shared across the kernel's nests."""

    def __init__(self, kernel: _KernelBuilder, group: Group):
        self.kernel = kernel
        self.group = group
        self.nest = Nest(group.shape, group.reduce)
        self.values: dict[Node, Expr] = {}
        self.acc_phase: dict[str, int] = {}

    # ------------------------------------------------------------------ leaves
    def load(self, value: Node, src_dims: tuple) -> Expr:
        shape, strides, offset = geometry(value)
        terms = []
        for k, (size, stride) in enumerate(zip(shape, strides)):
            if size == 1 or stride == 0:
                continue
            d = src_dims[k]
            if d is None:
                raise LoweringError(f"a load of {format_type(value.type)} varies along a dim the nest does not have")
            terms.append((d, stride))
        buffer = buffer_of(value)
        index = Index(offset, tuple(sorted(terms)))
        if buffer.op == "arange" and fusion_kind(buffer) == "constant":  # an integer iota, not a float buffer
            start, _, step = buffer.args[:3]
            load = Load(-1, index, buffer.type.dtype, (int(start), int(step)))
        else:
            load = Load(self.kernel.param(buffer, read=True), index, buffer.type.dtype)
        if load not in self.nest.loads:
            self.nest.loads.append(load)
        return Expr("input", (), self.nest.loads.index(load))

    def operand(self, member: Node, src: Node) -> Expr:
        """The expression for ``src`` as ``member`` reads it: an in-group value, a constant or a load."""
        base = view_chain(src)[0]
        if base in self.values and self.group.edge_dims(src) is not None:
            return self.values[base]
        if fusion_kind(base) == "constant" and base.op == "full":
            return cast(Expr("const", (), base.args[1]), base.type.dtype)
        return self.load(src, self._src_dims(member, src))

    def _src_dims(self, member: Node, src: Node) -> tuple:
        if fusion_kind(member) == "reduction":
            return tuple(range(len(self.group.shape)))
        dims = self.group.dims[member]
        lead = len(member.type.shape) - len(src.type.shape)
        return tuple(dims[k + lead] for k in range(len(src.type.shape)))

    # ------------------------------------------------------------------ members
    def add(self, member: Node) -> None:
        kind = fusion_kind(member)
        if kind == "reduction":
            self.values[member] = self._reduction(member)
        elif member.op in ("clone", "_to_copy"):
            self.values[member] = cast(self.operand(member, member.srcs[0]), member.type.dtype)
        elif member.op == "full":
            self.values[member] = cast(Expr("const", (), member.args[1]), member.type.dtype)
        elif member.op == "arange":  # an arange stored for a reader outside the kernel
            self.values[member] = self.load(member, self.group.dims[member])
        else:
            self.values[member] = self._pointwise(member)

    def _pointwise(self, member: Node) -> Expr:
        op = member.opdef
        stands = [Stand(s.type) for s in member.srcs]
        args = member.bound_args(stands)
        _, compute = op.dtype_rule(op, args)
        builder = op.attrs.get("expr_builder")
        template = builder(args, compute) if builder is not None else op.expr
        mapping: dict[int, Expr] = {}
        tensor_params = [k for k, p in enumerate(op.schema.params) if p.type == "Tensor"]
        for position, k in enumerate(tensor_params):
            a = member.args[k]
            if a is None:
                continue
            leaf = Expr("input", (), position)
            if type(a) is Ref:
                value = self.operand(member, member.srcs[a.i])
            else:
                value = Expr("const", (), a)
            mapping[id(leaf)] = cast(value, compute)
        for k, p in enumerate(op.schema.params):
            if p.type != "Tensor":
                mapping[id(Expr("scalar", (), p.name))] = Expr("const", (), member.args[k])
        return cast(spliced(template, mapping), member.type.dtype)

    def _reduction(self, member: Node) -> Expr:
        op = member.opdef
        args = member.bound_args([Stand(member.srcs[0].type)])
        _, compute = op.dtype_rule(op, args)
        acc = compute if op.reduce not in ("or", "and") else bool_
        value = cast(self.operand(member, member.srcs[0]), acc)
        j = len(self.nest.reductions)
        phase = self._phase_of(value)
        self.nest.reductions.append(Reduce(op.reduce, value, acc, phase))
        self.acc_phase[f"acc{j}"] = phase
        return Expr("cast", (Expr("scalar", (), f"acc{j}"),), member.type.dtype)

    def _phase_of(self, expr: Expr) -> int:
        """0 for values of loads only; one more than the latest accumulator they read otherwise."""
        return max((self.acc_phase[n.arg] + 1 for n in toposort(expr) if n.op == "scalar"), default=0)

    def varies_along_reduce(self, expr: Expr) -> bool:
        reduced = set(self.nest.reduce)
        return any(n.op == "input" and self.nest.loads[n.arg].index.dims() & reduced for n in toposort(expr))

    def store(self, member: Node) -> None:
        value = self.values[member]
        dims = self.group.dims[member]
        strides = S.contiguous_strides(member.type.shape)
        terms = []
        for j, (size, stride) in enumerate(zip(member.type.shape, strides)):
            if size == 1:
                continue
            if dims[j] is None:
                raise LoweringError(f"{member.op} is stored but does not vary along its dim {j}")
            terms.append((dims[j], stride))
        param = self.kernel.param(member, written=True)
        index = Index(0, tuple(sorted(terms)))
        full = self.varies_along_reduce(value) or bool(index.dims() & set(self.nest.reduce))
        phase = self._phase_of(value) if full else None
        self.nest.stores.append(Store(param, index, value, member.type.dtype, phase))


class _KernelBuilder:
    def __init__(self, fused: FusedKernel):
        self.fused = fused
        self.values: list[Node] = []
        self.flags: list[list[bool]] = []  # [read, written]

    def param(self, buffer: Node, read: bool = False, written: bool = False) -> int:
        buffer = self.fused.buffer_value(buffer)
        if buffer not in self.values:
            self.values.append(buffer)
            self.flags.append([False, False])
        k = self.values.index(buffer)
        self.flags[k][0] |= read
        self.flags[k][1] |= written
        return k

    def build(self) -> Kernel:
        nests = []
        for group in self.fused.groups:
            nb = _NestBuilder(self, group)
            for member in group.members:
                nb.add(member)
            for member in group.outputs:
                nb.store(member)
            nests.append(nb.nest)
        params = []
        counts = {"in": 0, "out": 0, "io": 0}
        for value, (read, written) in zip(self.values, self.flags):
            role = "io" if read and written else "out" if written else "in"
            params.append(Param(f"{role}{counts[role]}", value.type.dtype, read, written))
            counts[role] += 1
        return Kernel(self.fused.name, params, nests, list(self.values))


def lower(fused: FusedKernel) -> Kernel:
    """The kernel IR of one fused kernel (see [Note: kernel IR])."""
    return _KernelBuilder(fused).build()
