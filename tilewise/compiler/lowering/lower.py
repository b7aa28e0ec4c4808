"""Lowering: each fused group of the graph becomes kernel IR (``codegen.kernel_ir``).

[Note: lowering] ``lower`` turns a ``FusedKernel`` from the fusion pass into a ``Kernel``. Buffers are graph
values (graph inputs, kernel outputs, library-call results), each laid out contiguously in its own shape;
views of them become the strides and offsets of load indices, computed by the view operators' own rules
(``ops/views.py``). A pointwise member's expression is its operator's declared ``Expr`` with the leaves
replaced by what the member reads (an in-group value, a constant or a load); a reduction member becomes an
accumulator of the nest.
"""

from __future__ import annotations

from tilewise import strides as S
from tilewise.codegen.kernel_ir import Index, Kernel, Load, LoweringError, Nest, Param, Reduce, Store, cast
from tilewise.compiler.ir import Node, Ref, format_type
from tilewise.compiler.lowering.fusion import FusedKernel, Group, cat_operands, fusion_kind
from tilewise.compiler.lowering.views import buffer_of, geometry, view_chain  # noqa: F401 (re-exported)
from tilewise.compiler.meta import Stand
from tilewise.dtypes import DType, bool_, float32, int32, int64
from tilewise.ops import dtype_rules as R
from tilewise.ops.expr import Expr, rebuild, toposort, unit_product_dropped, with_srcs


def _is_one(expr: Expr) -> bool:
    return expr.op == "const" and not isinstance(expr.arg, bool) and expr.arg == 1


def spliced(template: Expr, mapping: dict[int, Expr], order: list[Expr] | None = None) -> Expr:
    """``template`` with the nodes keyed (by id) in ``mapping`` replaced, and its products by a literal 1 of
    floating values (``alpha=1`` of add/sub: a multiply or a fused multiply-add), which change nothing, dropped
    (``unit_product_dropped``). The replacements are values built the same way already, so only the template's
    own nodes are visited: a chain of n operators costs n steps, not n squared. ``order``: ``toposort(template)``,
    where ``mapping`` replaces leaves only (then the walk does not depend on it)."""
    if order is None:
        def make(node: Expr, srcs: tuple[Expr, ...]) -> Expr:
            if id(node) in mapping:
                return mapping[id(node)]
            return unit_product_dropped(with_srcs(node, srcs), _floating_times_one)

        return rebuild(template, make, stop=mapping)
    out: dict[int, Expr] = {}
    for node in order:
        found = mapping.get(id(node))
        out[id(node)] = found if found is not None else unit_product_dropped(
            with_srcs(node, tuple([out[id(s)] for s in node.srcs])), _floating_times_one)
    return out[id(template)]


def _floating_times_one(operand: Expr, factor: Expr) -> bool:
    return _is_one(factor) and _is_floating(operand.srcs[0] if operand.op == "neg" else operand)


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
    def load(self, value: Node, src_dims: tuple, placed: tuple[int, int, int] | None = None) -> Expr:
        """A load of ``value``, its dim ``k`` walking domain dim ``src_dims[k]``. ``placed`` (dim of ``value``, start,
        end): ``value`` is read where it lies in a concatenation, at ``[start, end)`` of the domain dim its ``dim``
        walks: guarded by that range, its index moved back by ``start`` along it."""
        shape, strides, offset = geometry(value)
        terms = []
        for k, (size, stride) in enumerate(zip(shape, strides)):
            if size == 1 or stride == 0:
                continue
            d = src_dims[k]
            if d is None:
                raise LoweringError(f"a load of {format_type(value.type)} varies along a dim the nest does not have")
            terms.append((d, stride))
        guard = None
        if placed is not None:
            dim, start, end = placed
            guard = (src_dims[dim], start, end)
            if shape[dim] != 1:
                offset -= start * strides[dim]
        buffer = buffer_of(value)
        index = Index(offset, tuple(sorted(terms)))
        if buffer.op == "arange" and fusion_kind(buffer) == "constant":  # an integer iota, not a float buffer
            start, _, step = buffer.args[:3]
            load = Load(-1, index, buffer.type.dtype, (int(start), int(step)), guard)
        else:
            load = Load(self.kernel.param(buffer, read=True), index, buffer.type.dtype, guard=guard)
        if load not in self.nest.loads:
            self.nest.loads.append(load)
        return Expr("input", (), self.nest.loads.index(load))

    def operand(self, member: Node, src: Node) -> Expr:
        """The expression for ``src`` as ``member`` reads it: an in-group value, a constant or a load."""
        base = buffer_of(src)
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
        elif kind == "cat":
            self.values[member] = self._cat(member)
        else:
            self.values[member] = self._pointwise(member)

    def _pointwise(self, member: Node) -> Expr:
        compute, template, order, leaves, scalars = _pointwise_plan(member)
        mapping = dict(scalars)
        for leaf, src, common, constant in leaves:
            if src is None:
                value = constant
            else:  # a 0-dim tensor of another dtype rounded to the half: see [Note: half operands]
                value = self.operand(member, member.srcs[src])
                if common is not None:
                    value = cast(cast(value, member.srcs[src].type.dtype), common)
            mapping[id(leaf)] = cast(value, compute)
        return cast(spliced(template, mapping, order), member.type.dtype)

    def _cat(self, member: Node) -> Expr:
        """A concatenation as its readers see it: at each position along the joined dim, the input that lies
        there (see [Note: concatenations in kernels] in ``fusion``)."""
        tensors, dim = cat_operands(member)
        dims = self.group.dims[member]
        dim = S.normalize_dim(dim, len(dims))
        along, length = dims[dim], member.type.shape[dim]
        position = Expr("input", (), self._iota(along, length))
        pieces, start = [], 0
        for src in tensors:
            end = start + src.type.shape[dim]
            if end > start:
                base = buffer_of(src)
                if fusion_kind(base) == "constant" and base.op == "full":
                    value = Expr("const", (), base.args[1])
                    value = cast(value, base.type.dtype)
                else:
                    value = self.load(src, dims, (dim, start, end))
                pieces.append((end, cast(value, member.type.dtype)))
            start = end
        value = pieces[-1][1]
        for end, piece in reversed(pieces[:-1]):
            value = Expr("where", (Expr("lt", (position, Expr("const", (), end))), piece, value))
        return value

    def _iota(self, dim: int, length: int) -> int:
        """The nest's load of the position along domain dim ``dim`` (of ``length``)."""
        dtype = int32 if length < 2**31 else int64
        load = Load(-1, Index(0, ((dim, 1),)), dtype, (0, 1))
        if load not in self.nest.loads:
            self.nest.loads.append(load)
        return self.nest.loads.index(load)

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
        return any(n.op == "input" and self.nest.loads[n.arg].dims() & reduced for n in toposort(expr))

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


_PLANS: dict[tuple, tuple] = {}  # see _pointwise_plan
_MAX_PLANS = 4096


def _pointwise_plan(member: Node) -> tuple[DType, Expr, list[Expr], list[tuple], dict[int, Expr]]:
    """What a pointwise member's expression is made of, but for its operands' values: the compute dtype, the
    operator's expression and its nodes in order (for ``spliced``), for each of its tensor parameters (its leaf,
    the position of the operand it reads or None, the half dtype a 0-dim operand is rounded to first or None, the
    constant it is otherwise) and the constants of its scalar parameters. Worked out once per operator (its
    declaration: one registered again is another), arguments and operand types (a transformer's layers repeat the
    same members: a third of lowering their nests)."""
    op = member.opdef
    key = (op, member.args_key, tuple(s.type for s in member.srcs), member.type)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan[:5]
    args = member.bound_args([Stand(s.type) for s in member.srcs])
    _, compute = op.dtype_rule(op, args)
    builder = op.attrs.get("expr_builder")
    template = builder(args, compute) if builder is not None else op.expr_on(member.type.device.type)
    tensor_params = [k for k, p in enumerate(op.schema.params) if p.type == "Tensor"]
    common = R.common_half(op, args, tensor_params) if compute is float32 else None
    # the parameters whose numbers torch rounds to the half on this device: see [Note: half operands]
    rounded = R.half_rounded(op, member.type.device.type) if common is not None else frozenset()
    params = op.schema.params
    leaves = []
    for position, k in enumerate(tensor_params):
        a = member.args[k]
        if a is None:
            continue
        leaf = Expr("input", (), position)
        if type(a) is Ref:
            src = member.srcs[a.i]
            leaves.append((leaf, a.i, common if params[k].name in rounded and src.type.dtype is not common else None,
                           None))
        elif params[k].name in rounded and type(a) in (int, float):  # 70000 becomes inf, as in torch
            leaves.append((leaf, None, None, Expr("const", (), R.round_to_half(a, common))))
        else:
            leaves.append((leaf, None, None, Expr("const", (), a)))
    scalars: dict[int, Expr] = {}
    named = []  # the scalar leaves, kept alive while their ids key ``scalars``
    for k, p in enumerate(params):
        if p.type != "Tensor":
            value = member.args[k]
            if p.name in rounded:
                value = R.rounded_scalar(op, value, common)
            named.append(Expr("scalar", (), p.name))
            scalars[id(named[-1])] = Expr("const", (), value)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    plan = _PLANS[key] = (compute, template, toposort(template), leaves, scalars, named)
    return plan[:5]


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
            params.append(Param(f"{role}{counts[role]}", value.type.dtype, read, written, format_type(value.type)))
            counts[role] += 1
        return Kernel(self.fused.name, params, nests, list(self.values))


def lower(fused: FusedKernel) -> Kernel:
    """The kernel IR of one fused kernel (see [Note: kernel IR])."""
    return _KernelBuilder(fused).build()
