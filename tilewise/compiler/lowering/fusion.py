"""fusion: partition the graph's computation into kernels; each kernel becomes one ``fused`` node.

[Note: fusion] A *group* is one loop nest: a domain shape ``S`` and, optionally, a set of reduced domain
dims ``D``. Every member is a value defined over some of the domain's dims; ``dims[member]`` says, for
each of its own dims, which domain dim it runs along (None where it is constant, size 1 or broadcast).
That one map covers the cases that matter: pointwise chains (every member over all of ``S``), reductions
with a pointwise prologue (members over ``S``, reduced over ``D``) and epilogue (members over the kept
dims only), several reductions in a row over the same dims (softmax, layer_norm: the lowering loops over
``D`` once per dependent reduction), and values reached through broadcasting, ``unsqueeze``, ``expand``,
reshapes that only add or drop size-1 dims, and permutations. Views of values outside the group are not
members: they become the index expressions of the group's loads.

Groups grow greedily in program order: a node joins the group of one of its operands when its dims map is
derivable and the group stays convex (no path leaves the group and comes back, which would make the kernel
depend on itself); operands from several compatible groups merge them. Then *sibling* groups with the same
domain that read a common input of more than one element merge into one nest (the input is loaded once), and
independent groups of the same dependency level share one kernel as separate nests (horizontal fusion: an
optimizer step over many parameters becomes a few kernels, not one per tensor) — but a group that needs a
collective's result never shares a kernel with one that does not: that kernel would run where the earlier
one does, waiting for the collective there (a gradient norm of DDP's first reduced bucket inside a kernel of
the rest of backward would stop the overlap of every later all-reduce). Operators no group can hold
(matmul, indexing, random, sorts) stay nodes of their own: library calls and fallbacks at run time.

A cheap value another group made is *recomputed* where reading it from memory costs more than making it again:
an elementwise member whose operands, per element, are no wider than it is (twice as wide when this is its only
reader, which also saves its store). Its operands that other groups make are made again too when that reads no
more than loading them (up to ``RECOMPUTE_DEPTH`` levels), else loaded. A widening cast (``float(g)`` of a
bfloat16 gradient that a layer norm's row reduction and its weight gradient's column sum both read) is then
loaded as bfloat16 by both kernels instead of being stored as float32 by one and loaded by the other; the
weight gradient's ``float(g) * x_hat`` is made by its column sum from ``g`` and ``x_hat`` instead of stored by
the layer norm's backward and read back, so both sums become one nest of the backward's kernel. The group a
value came from still stores it if anything else needs it. A value the program returns is never made again:
a kernel that made it again could round it differently (a vector ``expf`` against a scalar one), and a
backward that compares two returned values (amax's ``self == result``) would find no match. What a broadcast
operand costs to make is shared by the elements it is broadcast to: a layer norm's ``x_hat = (h - mean) * rstd``
is made again by its backward from ``h`` (4 bytes an element; the row statistics come almost free) rather than
stored by the forward as float32, with ``h - mean`` beside it, and read back.

[Note: reduction epilogues] A member over a reduction's kept dims only, made from its result (a batch norm's mean
``sum / count``, its ``rsqrt(var + eps)``, its running statistics ``mean * 0.1 + running_mean * 0.9`` written back in
place), is an *epilogue*, not a later phase: the kernel makes it once per row or column from that row's (column's)
own total, after the loops over the reduced dims (a store of ``phase`` None in the kernel IR), by the team that
folded it, or, for a reduction split across blocks, by the last block, which holds the total combined in a fixed
order. So ``_starves_phases`` counts only members that run along the reduced dims again, and only what the loops
over the domain read votes on the order they read it in (``_memory_votes``): a channels-last batch norm's forward,
two split column sums each followed by a one-block kernel over its 64 channels and the normalisation, is three
kernels, and a contiguous one a single kernel in phases (its running statistics were a second). An epilogue reads
only its own column: its dims map comes from the reduction's through element-wise members, and a reduction over the
kept dims joins no such nest. What it reads from other groups is made again in it when cheap (the recompute rule
above: ``running_mean * 0.9`` instead of a sibling nest storing it); a value whose operands are all outside the nest
is then placed where its reader reads it (``_placements``), since a channel vector beside an (N, C, H, W) domain has
no position of its own there; two nests that place one value differently do not merge (``Group.agrees``). A value
smaller than a reduction's domain tries that group first where what its other operands' groups make for it can be
made again there (``_epilogue_first``). An epilogue made after a library call that follows reductions with no
later phase, or waiting for a collective the rest of the nest does not wait for, stays out (``_delays``): the
reduction would wait for it too. The values are those of separate kernels: the same expressions, from the same total.

[Note: transposed copies stay out of reductions] A copy of a permuted member (``x.permute(...).contiguous()``, the
FP8 cast's transposed copy that Hopper's FP8 GEMMs read) whose innermost dim runs along another domain dim than the
nest's innermost joins no group with reductions (``_transposing_copy``). A row reduction's team walks its row along
the innermost dim, a column reduction's lanes walk the innermost kept dim, so such a copy's elements would each be
stored a sector apart: on an H200 a layer norm over [8192, 1024] that also wrote its e4m3 output transposed took
152 us, against 14.6 us writing the e4m3 output alone and 12.3 us for a tiled copy of it (``tiles`` strategy, see
[Note: transposing tiles] in ``codegen/render/tiles_cuda.py``). The copy then starts a group of its own (an
element-wise nest that reads the stored member: tiled), which a reduction over the same domain does not absorb.
A tiled store from a reduction's nest (a block of rows staged through shared memory) would save the copy's read
and write; no schedule does that yet.

[Note: concatenations in kernels] A ``cat`` whose dims before the joined one have more than one element (RoPE's
``cat((-x2, x1), -1)``, a q/k/v split's gradient along the heads) cannot be laid out in place by memory planning:
its inputs are not contiguous slabs of the result, so it used to be a copy of its own. Such a cat (``fusable_cat``)
is a member of kind "cat": the nest computes its element at position ``p`` along the joined dim as a ``where``
over ``p`` picking the input that lies there, each input a load guarded by its range (``kernel_ir``), read at
``p - start``. Its inputs are always loads, never members of its group (a member is computed at the nest's own
position, not at ``p - start``), so a cat starts a group of its own, which its pointwise readers then join, and
is made again, like a cheap pointwise value, by a reader in another group. Pointwise inputs are moved into the
result's frame before fusion (``passes/cats.py``), so that the kernel computes them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import strides as S
from tilewise.compiler.ir import Graph, Node, in_program_order, toposort
from tilewise.compiler.lowering.orders import order_of
from tilewise.compiler.lowering.views import buffer_of, geometry, view_chain
from tilewise.config import log

MAX_NESTS_PER_KERNEL = 32
# A cat of more inputs is copied by a step of its own: its readers would test its element's position against every
# input's range and carry a guarded load of each
MAX_CAT_INPUTS = 8
RECOMPUTED = ("recomputed",)  # the tag of a value ``recompute.py`` computes again for late readers
RECOMPUTE_DEPTH = 2  # how many levels of made values a recomputed value may be made from
# A node joins no group whose latest member came this many nodes before it with a library call (a GEMM, a
# convolution) in between: a backward's ``grad * (relu_out > 0)`` would otherwise put the mask into the forward's
# kernel, which then stores it for the whole forward and backward (a ResNet-50 step kept 0.6 GiB of masks); on its
# own, the mask is made next to its reader from the output. Without a call in between the nodes run at one point
# of the program however far apart the function wrote them (gradient clipping's scaling and the optimizer's
# update of each parameter, which then reads the unscaled gradient and scales it itself).
DISTANT = 64
BROADCAST_RATIO = 16  # an operand this many times smaller than its reader is broadcast: loaded, never remade
RESHAPES = ("view", "squeeze", "unsqueeze")
PERMUTES = ("permute", "transpose", "t")


def fusion_kind(node: Node) -> str:
    """"elementwise", "reduction", "cat" (a concatenation read in place by its readers' kernels, see [Note:
    concatenations in kernels]), "view", "constant" (a ``full`` or an integer ``arange``: a literal or the
    position itself where read, see ``kernel_ir``) or "extern". Found once per node (fusion asks tens of thousands
    of times, and a reduction's answer works out its reduced dims)."""
    kind = node.facts.get("fusion_kind")
    if kind is None:
        kind = node.facts["fusion_kind"] = _fusion_kind(node)
    return kind


def _fusion_kind(node: Node) -> str:
    kind = node.kind
    if node.op == "cat":
        return "cat" if fusable_cat(node) else "extern"
    if node.op == "full" or (node.op == "arange" and not node.type.dtype.is_floating_point
                             and all(isinstance(a, int) for a in node.args[:3])):
        return "constant"
    if kind == "pointwise" or node.op == "clone":
        return "elementwise"
    if node.op == "_to_copy":
        return "elementwise" if node.type.device == node.srcs[0].type.device else "extern"
    if kind == "reduction" and node.opdef.reduce is not None and not node.is_tuple and _reduces_something(node):
        return "reduction"
    if kind == "view":
        return "view"
    return "extern"


def cat_operands(node: Node) -> tuple[list[Node], int]:
    """The tensors a ``cat`` joins, in order, and the dim it joins them along (not normalised)."""
    args = node.bound_args(node.srcs)
    return list(args[0]), args[1] if len(args) > 1 else 0


def fusable_cat(node: Node) -> bool:
    """Whether a ``cat`` is computed by the kernels that read it (see [Note: concatenations in kernels]): inputs
    of its rank and device, at least two of them not empty (at most ``MAX_CAT_INPUTS``), and a dim before the
    joined one longer than 1 (otherwise the inputs are contiguous slabs of the result, which memory planning lays
    out in place)."""
    if node.op != "cat" or node.is_tuple or not node.type.shape or not node.type.numel:
        return False
    shape = node.type.shape
    tensors, dim = cat_operands(node)
    if len(tensors) > MAX_CAT_INPUTS or any(
            len(t.type.shape) != len(shape) or t.type.device != node.type.device for t in tensors):
        return False
    dim = dim + len(shape) if dim < 0 else dim
    if sum(t.type.shape[dim] > 0 for t in tensors) < 2:
        return False
    return S.numel(shape[:dim]) != 1


def is_collective(node: Node) -> bool:
    """Whether a node is a collective (an operator declared ``collective``), which a CUDA program runs on its
    communication stream (see [Note: collectives on their own stream] in ``streams``)."""
    return node.opdef is not None and bool(node.opdef.attrs.get("collective"))


def _reduces_something(node: Node) -> bool:
    """A reduction over at least one dim longer than 1 (anything else is a copy, left to the CPU backend)."""
    from tilewise.compiler.meta import Stand, reduction_dims

    src = node.srcs[0].type
    reduced, _ = reduction_dims(node.opdef, node.bound_args([Stand(src)]))
    return any(src.shape[d] != 1 for d in reduced)


def is_inlined_constant(src: Node, group: Group) -> bool:
    """A ``full`` read by a group is a literal in its kernel, an ``arange`` the position: neither is a buffer."""
    base = buffer_of(src)
    return fusion_kind(base) == "constant" and base not in group.dims


def view_dims(view: Node, dims: tuple) -> tuple | None:
    """The dims map of a view of a value whose map is ``dims`` (None when the view reorders elements)."""
    src, out = view.srcs[0].type.shape, view.type.shape
    if view.op == "expand":
        lead = len(out) - len(src)
        return (None,) * lead + tuple(dims[k] if src[k] == out[k + lead] else None for k in range(len(src)))
    if view.op in PERMUTES:
        _, strides, _ = view.opdef.view(src, tuple(range(1, len(src) + 1)), 0, *view.args[1:])
        return tuple(dims[s - 1] for s in strides)
    if view.op in RESHAPES:
        kept = [k for k, size in enumerate(src) if size != 1]
        if [src[k] for k in kept] != [size for size in out if size != 1]:
            return None
        it = iter(dims[k] for k in kept)
        return tuple(next(it) if size != 1 else None for size in out)
    return None


@dataclass(eq=False)
class Group:
    """One loop nest: domain ``shape``, reduced domain dims ``reduce``, members with their dims maps."""

    shape: tuple[int, ...]
    reduce: tuple[int, ...] = ()
    members: list[Node] = field(default_factory=list)
    dims: dict[Node, tuple] = field(default_factory=dict)
    outputs: list[Node] = field(default_factory=list)
    recomputed: set[Node] = field(default_factory=set)  # members another group owns (and stores, if needed)
    order: str = "logical"  # the order of the values its domain was built from (see [Note: value orders])

    def owned(self) -> list[Node]:
        return [m for m in self.members if m not in self.recomputed]

    def absorb(self, other: Group) -> None:
        """Take ``other``'s members: a value one of them recomputes and the other owns is owned."""
        owned = set(self.owned()) | set(other.owned())
        self.members = list(dict.fromkeys(self.members + other.members))
        self.dims.update(other.dims)
        self.outputs = list(dict.fromkeys(self.outputs + other.outputs))
        self.recomputed = (self.recomputed | other.recomputed) - owned

    def agrees(self, other: Group) -> bool:
        """Whether every value both groups make lies at the same domain point in both: a value made again is
        placed where its reader reads it (``_placements``), which two nests over one domain may do differently
        (a correlation's ``c / std.view(-1, 1)`` and ``c / std.view(1, -1)``); such nests cannot be one."""
        # a value two groups make is made again by one of them at least (each member has one owner)
        return (all(other.dims.get(m, self.dims[m]) == self.dims[m] for m in self.recomputed)
                and all(self.dims.get(m, other.dims[m]) == other.dims[m] for m in other.recomputed))

    def edge_dims(self, src: Node) -> tuple | None:
        """The dims map under which a member reads ``src`` inside this group, or None if it is external."""
        base, chain = view_chain(src)
        dims = self.dims.get(base)
        for view in chain:
            if dims is None:
                return None
            dims = view_dims(view, dims)
        return dims

    def owns_base(self, src: Node) -> bool:
        return buffer_of(src) in self.dims


@dataclass(eq=False)
class FusedKernel:
    """The groups one kernel runs (one nest each), the values it reads and the values it stores."""

    name: str
    groups: list[Group]
    inputs: list[Node]
    outputs: list[Node]
    graph_values: dict[Node, Node] = field(default_factory=dict)  # value before fusion -> node after

    def buffer_value(self, node: Node) -> Node:
        """The node of the fused graph that stands for ``node`` (an input, a kernel output, a call result)."""
        return self.graph_values.get(node, node)


# ---------------------------------------------------------------------------- dims maps of new members

def elementwise_dims(node: Node, group: Group) -> tuple | None:
    shape, domain = node.type.shape, group.shape
    dims: list = [None] * len(shape)
    for src in node.srcs:
        src_dims = group.edge_dims(src)
        if src_dims is None:
            if group.owns_base(src):
                return None  # a view of a member that reorders elements: it must be stored first
            continue
        lead = len(shape) - len(src.type.shape)
        for k, d in enumerate(src_dims):
            if d is None or src.type.shape[k] == 1:
                continue
            if dims[k + lead] not in (None, d):
                return None
            dims[k + lead] = d
    # a dim no operand in the group maps runs along the domain dim at its own position, when the sizes agree and
    # the operands that do map dims map them in place: a value in another order (a channels-last value beside a
    # group over the (N, C, H, W) order) would otherwise take H for C wherever the two sizes happen to be equal
    in_place = all(d is None or d == k for k, d in enumerate(dims)) and order_of(node) == group.order
    for j, size in enumerate(shape):
        if size != 1 and dims[j] is None:
            if not in_place or len(shape) != len(domain) or domain[j] != size or j in dims:
                return None
            dims[j] = j
    return _checked(tuple(dims), shape, domain)


def cat_dims(node: Node, group: Group) -> tuple | None:
    """The dims map of a ``cat`` joining ``group``: its inputs are always loaded (each from where it lies in the
    result), so none of them may be a member; the cat then runs along the domain at its own positions."""
    if any(group.owns_base(src) for src in node.srcs):
        return None
    return elementwise_dims(node, group)


def member_dims(node: Node, group: Group) -> tuple | None:
    """The dims map of an element-wise member or a cat joining ``group``."""
    return cat_dims(node, group) if fusion_kind(node) == "cat" else elementwise_dims(node, group)


def _checked(dims: tuple, shape: tuple, domain: tuple) -> tuple | None:
    used = [d for d in dims if d is not None]
    if len(set(used)) != len(used) or any(d is not None and domain[d] != shape[j] for j, d in enumerate(dims)):
        return None
    return dims


def reduction_dims_in(node: Node, group: Group) -> tuple[tuple, tuple] | None:
    """(dims map of the result, reduced domain dims) for a reduction joining ``group``."""
    from tilewise.compiler.meta import Stand, reduction_dims

    (src,) = node.srcs
    src_dims = group.edge_dims(src)
    if src_dims is None:
        if group.owns_base(src) or src.type.shape != group.shape or order_of(src) != group.order:
            return None
        src_dims = tuple(range(len(group.shape)))
    if _checked(src_dims, src.type.shape, group.shape) is None:
        return None
    reduced, keepdim = reduction_dims(node.opdef, node.bound_args([Stand(src.type)]))
    mapped = [src_dims[d] for d in reduced if src.type.shape[d] != 1]
    if None in mapped:  # reduces along a dim the group only broadcasts (a sum of an expand): not this nest's loop
        return None
    domain_reduced = tuple(sorted(mapped))
    if not domain_reduced or None in domain_reduced:
        return None
    if group.reduce and domain_reduced != group.reduce:
        return None
    if keepdim:
        out = tuple(None if k in reduced else d for k, d in enumerate(src_dims))
    else:
        out = tuple(d for k, d in enumerate(src_dims) if k not in reduced)
    return out, domain_reduced


def _read_dims(reader_dims: tuple, reader: Node, src: Node, group: Group) -> tuple | None:
    """The dims map of ``src``'s base as ``reader``, placed at ``reader_dims`` in ``group``, reads it: through
    broadcasting and reshapes that only add or drop size-1 dims (None through other views). A reduction reads an
    operand from outside at the nest's own positions (``reduction_dims_in``)."""
    if fusion_kind(reader) == "reduction":
        if src.type.shape != group.shape or order_of(src) != group.order:
            return None
        reader_dims = tuple(range(len(group.shape)))
    lead = len(reader_dims) - len(src.type.shape)
    if lead < 0:
        return None
    dims = tuple(None if size == 1 else reader_dims[k + lead] for k, size in enumerate(src.type.shape))
    _, chain = view_chain(src)
    for view in reversed(chain):
        source, out = view.srcs[0].type.shape, view.type.shape
        if view.op not in RESHAPES or [n for n in source if n != 1] != [n for n in out if n != 1]:
            return None
        kept = iter(d for d, n in zip(dims, out) if n != 1)
        dims = tuple(next(kept) if n != 1 else None for n in source)
    return dims


def _placements(reader: Node, src: Node, group: Group, chain: list[Node]) -> dict[Node, tuple]:
    """Where ``reader`` (a member of ``group``) and the members of ``chain`` (values made again for it, operands
    first) read each value of ``chain``: the dims maps ``_try_join`` places them at when none of their own
    operands is in the group."""
    found: dict[Node, tuple] = {}
    dims = _read_dims(group.dims[reader], reader, src, group)
    if dims is not None:
        found[buffer_of(src)] = dims
    inside = set(chain)
    for member in reversed(chain):
        if member not in found:
            continue
        for operand in member.srcs:
            base = buffer_of(operand)
            if base in inside and base not in found:
                dims = _read_dims(found[member], member, operand, group)
                if dims is not None:
                    found[base] = dims
    return found


def _reads_agree(group: Group, made: list[Node]) -> bool:
    """Whether the members of ``group`` placed before ``made`` joined it read each of ``made`` at the domain
    point where they are computed. A value made again in its reader's nest is placed from its own operands (or
    where its reader reads it, when they are all outside), its reader from its earlier operands: a reader of
    ``z.t()`` at ``(i, j)`` must find ``z[j, i]`` there, which a ``z`` placed by position does not give it."""
    inside = set(made)
    for member in group.members:
        if member in inside or not any(buffer_of(s) in inside for s in member.srcs):
            continue
        if fusion_kind(member) == "reduction":
            found = reduction_dims_in(member, group)
            if found is None or found != (group.dims[member], group.reduce):
                return False
        elif member_dims(member, group) != group.dims[member]:
            return False
    return True


def _try_join(node: Node, group: Group, placed: tuple | None = None) -> bool:
    """Add ``node`` to ``group`` (a trial copy) if its dims map is derivable and the nest keeps its phases.
    ``placed``: where a reader in the group reads ``node`` (``_read_dims``), for a value made again there; it
    places the value when none of its operands is in the group and its position does not (a running mean's
    ``running_mean * 0.9`` made in a batch norm statistics' epilogue, over the channel dim of an (N, C, H, W)
    domain)."""
    if node.type.device != _device(group):
        return False
    if fusion_kind(node) == "reduction":
        found = reduction_dims_in(node, group)
        if found is None:
            return False
        group.dims[node], group.reduce = found
    else:
        dims = member_dims(node, group)
        if dims is None and placed is not None and not any(group.owns_base(s) for s in node.srcs):
            dims = _checked(placed, node.type.shape, group.shape)
        if dims is None:
            return False
        group.dims[node] = dims
    if any(d is None and size != 1 for d, size in zip(group.dims[node], node.type.shape)):
        del group.dims[node]  # constant along a dim of its own (read through an expand): it could not be stored
        return False
    group.members.append(node)
    if group.reduce and (_transposing_copy(node, group) or (fusion_kind(node) == "reduction" and any(
            _transposing_copy(m, group) for m in group.members))):
        return False  # see [Note: transposed copies stay out of reductions]
    if _starves_phases(group):
        return False  # the caller's trial copy is dropped
    return True


def _transposing_copy(member: Node, group: Group) -> bool:
    """Whether ``member`` is a copy of a permuted member (``x.permute(...).contiguous()``) whose innermost dim
    runs along another domain dim than the one innermost in memory (the order the nest's operands are read in: a
    channels-last batch norm's output copied to its own layout runs along C, as its input does): each thread of a
    reduction's nest would store its elements a sector apart (see [Note: transposed copies stay out of
    reductions])."""
    if member.op != "clone":
        return False
    dims = [d for d, n in zip(group.dims[member], member.type.shape) if d is not None and n != 1]
    inner = _memory_order(group) or [d for d, n in enumerate(group.shape) if n != 1]
    return bool(dims) and bool(inner) and dims[-1] != inner[-1]


FEW_COLUMNS = 1 << 15  # kept elements below which a columns nest cannot keep the GPU busy with several phases
# ... when its columns are at least this long (shorter ones finish soon whoever folds them). Measured on an H200
# in a ResNet-50 bf16 step at batch 64: a batch norm's backward over [64, 14, 14] rows of 1024 channels (12544
# rows) fused in phases ran on 32 blocks in 0.24-0.30 ms; split, a statistics kernel and an element-wise one
# read the same bytes at full bandwidth in a tenth of that
LONG_COLUMNS = 1 << 10
# The same for a whole-tensor reduction with a later phase over the tensor: an amax with the cast it scales (FP8
# current scaling, ``x * (448 / amax(|x|))``) as one nest runs on one block (8192 x 768 elements, at one SM's
# bandwidth); apart, the amax splits across the GPU and the cast is an element-wise pass. Rows of softmax, layer
# norm or logsumexp (several rows: a few long ones fold their phases into one split pass) are untouched.
FEW_ROWS, LONG_ROWS = 2, 1 << 16


def _starves_phases(group: Group) -> bool:
    """Whether ``group`` has a member running along the reduced dims after one of its reductions (a later *phase*;
    an epilogue over the kept dims is none, see [Note: reduction epilogues]) while the reduction runs down columns
    (it keeps the innermost dim) of too few of them: a nest of several phases cannot be split
    across blocks (every block would need every other block's result), so it runs one block per 32 columns. A
    channels-last batch norm's normalisation after its statistics over [64, 112, 112] per channel would run on
    2 blocks (one over [64, 14, 14] rows of 1024 channels on 32); apart, the statistics split across the GPU
    and the normalisation is an element-wise pass. Rows keep their phases together (a block per row reads it
    once for all of them, see ``codegen.schedule``) unless there are fewer than ``FEW_ROWS`` rows of at least
    ``LONG_ROWS`` elements: a whole-tensor reduction feeding an element-wise pass over the same tensor."""
    if not group.reduce:
        return False
    shape = group.shape
    kept = 1
    for d, n in enumerate(shape):
        if d not in group.reduce:
            kept *= n
    reduced = 1
    for d in group.reduce:
        reduced *= shape[d]
    few_rows = kept < FEW_ROWS and reduced >= LONG_ROWS
    few_columns = kept < FEW_COLUMNS and reduced >= LONG_COLUMNS
    if not (few_rows or few_columns) or not _later_phase(group):  # (the memory order below costs the most)
        return False
    votes = _memory_votes(group)
    order = list(max(votes, key=lambda o: votes[o])) if votes else [d for d, n in enumerate(shape) if n != 1]
    if not order:
        return False
    # operands in two layouts (a channels-last activation and a row-major gradient): the scheduler weighs their
    # accesses its own way and may run down the columns the bytes here would run along, so either way is judged
    innermost = {o[-1] for o in votes} or {order[-1]}
    # reduced dims on both sides of a kept one in memory (N and H, W of an (N, C, H, W) batch norm) stay rows:
    # split as columns, a contiguous bf16 batch norm's forward and backward took 1.1-2.1x as long as in phases
    # on an H200 for ResNet-50's shapes (0.117 against 0.056 ms at [64, 2048, 7, 7]), faster only at
    # [64, 64, 112, 112] (0.218 against 0.295 ms)
    rows = few_rows and any(d in group.reduce for d in innermost)
    columns = few_columns and any(d not in group.reduce for d in innermost)
    return rows or columns  # else a block per row (per 32 columns) and enough of them, or short ones


def _later_phase(group: Group) -> bool:
    """Whether a member of ``group`` runs along the reduced dims after one of its reductions. An epilogue over the
    kept dims (a norm's sqrt, a batch norm's mean and running statistics) is none: it runs once per row or column,
    in the last block of a split (see [Note: reduction epilogues])."""
    late: set[Node] = set()
    for member in group.members:
        for src in member.srcs:
            base = buffer_of(src)
            if base in group.dims and base is not member and (fusion_kind(base) == "reduction" or base in late):
                late.add(member)
                break
    return any(d in group.reduce for member in late for d in group.dims[member] if d is not None)


def _memory_order(group: Group) -> list[int] | None:
    """The domain dims of more than one element, outermost first, in the memory order that most of the bytes the
    group reads whole from outside it follow (None if it reads none so): a channels-last tensor's (N, H, W, C)
    for its (N, C, H, W) shape. A broadcast operand (a stride of 0 along a dim of the domain) has no say: a
    scalar's gradient expanded over the batch norm's input once decided alone, for the (N, C, H, W) order, while
    the saved activations the scheduler then read down columns lay channels-last. Bytes decide where operands
    disagree, as they do for the scheduler (``codegen.schedule._prefer_columns``)."""
    votes = _memory_votes(group)
    return list(max(votes, key=lambda order: votes[order])) if votes else None


def _memory_votes(group: Group) -> dict[tuple[int, ...], int]:
    """``_memory_order``'s ballot: each memory order of the domain dims the group's whole operands from outside
    follow where the loops over the domain read them (an epilogue's do not vote), with the bytes that follow it."""
    votes: dict[tuple[int, ...], int] = {}
    seen: set[int] = set()
    reduced = frozenset(group.reduce)
    for member in group.members:
        dims = group.dims.get(member)
        # an epilogue (over the kept dims only) is made after the loops over the domain: it reads nothing in them
        if dims is None or fusion_kind(member) == "reduction" or (reduced and reduced.isdisjoint(dims)):
            continue
        for src in member.srcs:
            if buffer_of(src) in group.dims or src.type.shape != member.type.shape or id(src) in seen:
                continue
            seen.add(id(src))
            try:
                src_shape, strides, _ = geometry(src)
            except Exception:  # noqa: BLE001 — a view the lowering cannot place: no opinion
                continue
            axes = [a for a, n in enumerate(src_shape) if n != 1 and dims[a] is not None]
            if not axes or any(strides[a] == 0 for a in axes):
                continue
            order = tuple(dims[a] for a in sorted(axes, key=lambda a: -strides[a]))
            votes[order] = votes.get(order, 0) + src.type.numel * src.type.dtype.itemsize
    return votes


def _epilogue_only(group: Group, dims: tuple) -> bool:
    """Whether a member with dims map ``dims`` runs along none of ``group``'s reduced dims: it is made once per row
    (column) of the reduction, not in the nest's loops over the domain."""
    return bool(group.reduce) and not any(d in group.reduce for d in dims if d is not None)


def _device(group: Group):
    return group.members[0].type.device


def _new_group(node: Node) -> Group | None:
    if fusion_kind(node) == "reduction":
        group = Group(node.srcs[0].type.shape, order=order_of(node.srcs[0]))
        found = reduction_dims_in(node, group)
        if found is None:
            return None
        group.dims[node], group.reduce = found
    else:
        group = Group(node.type.shape, order=order_of(node))
        group.dims[node] = tuple(j if s != 1 else None for j, s in enumerate(node.type.shape))
    group.members.append(node)
    return group


# ---------------------------------------------------------------------------- vertical fusion

class _Partition:
    """Greedy grouping with convexity bookkeeping.

    Group ids merge through union-find. ``ancestors[node]`` holds the *frontier* of a node outside any
    group: the groups its operands belong to, through operands outside groups too; ``deps[group]`` the
    frontier of its members' external operands. A group's dependencies grow as it gains members, so what
    a node reaches is the closure over ``deps`` taken when asked (storing frontiers, not closures, keeps
    placing a node proportional to its operands, not to the number of groups).

    Each group's closure is kept once taken (``closures``), until its dependencies change: a group whose
    ``deps`` grow, or that merges, drops its own and those of the groups that depend on it (``dependents``,
    followed only through groups whose closure is kept, since a kept closure is made of kept ones). Taken
    afresh for each question, the closures were half of a GPT-2 training step's fusion (each walked some
    three hundred groups).
    """

    def __init__(self, order: dict[Node, int], readers: dict[Node, int], roots: frozenset = frozenset(),
                 last_read: dict[Node, int] | None = None):
        self.order, self.readers = order, readers
        self.last_read = last_read or {}  # value -> program position of its last reader
        self.live: frozenset[Node] = frozenset()  # values that live throughout the program (its inputs)
        self.calls_before: dict[Node, int] = {}  # node -> how many library calls come before it in the program
        self.after_collective: set[Node] = set()  # values made from a collective's result
        self.roots = roots  # values the program returns or writes back: stored, so never made twice
        self.groups: dict[int, Group] = {}
        self.parent: dict[int, int] = {}
        self.deps: dict[int, set[int]] = {}
        self.dependents: dict[int, set[int]] = {}  # group -> the groups whose ``deps`` name it
        self.closures: dict[int, frozenset[int]] = {}  # group (a root) -> every group it depends on (roots)
        self.group_of: dict[Node, int] = {}
        self.ancestors: dict[Node, set[int]] = {}

    def find(self, gid: int) -> int:
        while self.parent[gid] != gid:
            self.parent[gid] = self.parent[self.parent[gid]]
            gid = self.parent[gid]
        return gid

    def frontier(self, node: Node) -> set[int]:
        """The groups nearest to ``node`` it depends on (its own, if it is in one)."""
        if node in self.group_of:
            return {self.find(self.group_of[node])}
        return {self.find(g) for g in self.ancestors.get(node, ())}

    def reaches(self, node: Node, gid: int) -> bool:
        """Whether ``node`` depends on group ``gid`` (a root), directly or through other groups (its own
        included)."""
        frontier = self.frontier(node)
        return gid in frontier or any(gid in self.deps_closure(f) for f in frontier)

    def deps_closure(self, gid: int) -> frozenset[int]:
        """Every group the group ``gid`` (a root) depends on, directly or through other groups."""
        found = self.closures.get(gid)
        if found is not None:
            return found
        closures, path = self.closures, set()
        stack = [(gid, False)]
        while stack:  # depth first: the closures of a group's dependencies before its own
            g, expanded = stack.pop()
            direct = {self.find(d) for d in self.deps[g]}
            if expanded:
                closures[g] = frozenset(direct.union(*(closures[d] for d in direct)))
                path.discard(g)
                continue
            if g in closures:
                continue
            if g in path or g in direct or not path.isdisjoint(direct):
                return self._walked_closure(gid)  # a cycle (no valid partition has one): nothing kept
            path.add(g)
            stack.append((g, True))
            stack += [(d, False) for d in direct if d not in closures]
        return closures[gid]

    def _walked_closure(self, gid: int) -> frozenset[int]:
        found: set[int] = set()
        todo = {self.find(d) for d in self.deps[gid]}
        while todo:
            g = todo.pop()
            if g not in found:
                found.add(g)
                todo |= {self.find(d) for d in self.deps[g]} - found
        return frozenset(found)

    def add_deps(self, gid: int, groups: set[int]) -> None:
        """Group ``gid`` depends on ``groups`` too."""
        new = groups - self.deps[gid]
        if not new:
            return
        self.forget_closures(gid)
        self.deps[gid] |= new
        for d in new:
            self.dependents.setdefault(d, set()).add(gid)

    def forget_closures(self, gid: int) -> None:
        """Drop the kept closures that ``gid``'s dependencies are part of: its own, its dependents'."""
        todo = [gid]
        while todo:
            g = self.find(todo.pop())
            if self.closures.pop(g, None) is not None:
                todo += self.dependents.get(g, ())

    def _external(self, group: Group, member: Node) -> list[Node]:
        return [s for s in member.srcs if group.edge_dims(s) is None]

    def add(self, node: Node) -> None:
        if fusion_kind(node) in ("elementwise", "reduction", "cat"):
            self._place(node)
        if node not in self.group_of:
            self.ancestors[node] = set().union(*(self.frontier(s) for s in node.srcs)) if node.srcs else set()

    def _candidates(self, node: Node) -> list[int]:
        out = []
        for src in node.srcs:
            base = buffer_of(src)
            if base in self.group_of:
                gid = self.find(self.group_of[base])
                if gid not in out:
                    out.append(gid)
        return out

    def _place(self, node: Node) -> None:
        candidates = self._candidates(node)
        merged = self._merged_candidate(candidates)
        if merged is not None:  # the groups merged: their ids changed
            candidates = self._candidates(node)
        if len(candidates) > 1:
            candidates = self._epilogue_first(node, candidates)
        options = ([merged] if merged is not None else []) + candidates
        for gid in dict.fromkeys(options):
            group = self.groups[gid]
            if self._distant(group.members[-1], node):
                continue  # see DISTANT
            trial = Group(group.shape, group.reduce, list(group.members), dict(group.dims),
                          recomputed=set(group.recomputed), order=group.order)
            if not _try_join(node, trial):
                continue
            external = self._external(trial, node)
            if any(self.reaches(src, gid) for src in external):
                continue
            if trial.reduce and self._delays(node, trial, external):
                continue
            self.groups[gid] = trial
            self._join(node, gid, external)
            self._recompute_operands(node, gid)
            return
        group = _new_group(node)
        if group is None:
            return
        gid = len(self.parent)
        self.parent[gid], self.groups[gid], self.deps[gid] = gid, group, set()
        self._join(node, gid, list(node.srcs))
        self._recompute_operands(node, gid)

    def _epilogue_first(self, node: Node, candidates: list[int]) -> list[int]:
        """``candidates`` in the order ``node`` tries them: the group of a reduction it would be an epilogue of
        first when what the others make for it can all be made again there from the program's inputs
        (``running_mean * 0.9``, whichever operand the function wrote first): the others then store nothing for
        it, and may be left with nothing to do. Otherwise the operands' order (a value that another group would
        have to go on storing is better joined to that group, where the values after it may follow)."""
        if self._smaller_than_reduction(node, candidates[0]):
            return candidates  # already first
        for gid in candidates[1:]:
            if not self._smaller_than_reduction(node, gid):
                continue
            others = [src for src in node.srcs if buffer_of(src) in self.group_of
                      and self.find(self.group_of[buffer_of(src)]) != gid]
            if all(self._remade_in(node, buffer_of(src), gid) for src in others):
                return [gid] + [g for g in candidates if g != gid]
        return candidates

    def _smaller_than_reduction(self, node: Node, gid: int) -> bool:
        group = self.groups[gid]
        return bool(group.reduce) and node.type.numel < S.numel(group.shape)

    def _remade_in(self, reader: Node, base: Node, gid: int) -> bool:
        """Whether ``reader`` joining group ``gid`` would make ``base`` there again (see ``_recompute_operands``)
        from the program's inputs only (a running statistic, a parameter): what it reads is there from the start."""
        made = self._recomputable(base, gid)
        return made is not None and made[2] <= self.live and self._worth_remaking(reader, base, made[1], made[2])

    def _delays(self, node: Node, group: Group, external: list[Node]) -> bool:
        """Whether ``node``, joined to ``group`` (a trial copy holding it, with reductions) as their epilogue, would
        hold the reduction back (see [Note: reduction epilogues]): it comes after a library call that follows the
        group's reductions while the group has no later phase (a kernel runs where the program first needs what it
        stores: a norm's output, read by the next GEMM, keeps it before the call, and the epilogue's values are
        made there for the backward; reductions alone may store nothing else, and would run after the call, their
        operands kept alive across it: a bias gradient's column sum made with the optimizer's update of the bias
        kept the layer's output gradient through the rest of backward), or it waits for a collective that the rest
        of the group does not."""
        calls, after = self.calls_before.get(node, 0), self.after_collective
        # no call after the group's first member, no collective to wait for: nothing to delay
        called = calls > self.calls_before.get(group.members[0], 0)
        waits = bool(after) and not after.isdisjoint(external)
        if not (called or waits) or not _epilogue_only(group, group.dims[node]):
            return False
        if called and not _later_phase(group) and any(
                calls > self.calls_before.get(m, 0) for m in group.members if fusion_kind(m) == "reduction"):
            return True
        return waits and not any(m is not node and not after.isdisjoint(self._external(group, m))
                                 for m in group.members)

    def _distant(self, member: Node, node: Node) -> bool:
        """Whether ``node`` comes too long after ``member`` to join its group (see DISTANT)."""
        if self.order[node] - self.order.get(member, 0) <= DISTANT:
            return False
        return self.calls_before.get(node, 0) > self.calls_before.get(member, 0)

    def _recompute_operands(self, node: Node, gid: int) -> None:
        """Compute in ``node``'s group the operands other groups make that are cheaper to make again than to
        read (see the note)."""
        group = self.groups[gid]
        if fusion_kind(node) == "cat":
            return  # a cat loads its inputs; made again in its nest they would be read at other positions
        for src in node.srcs:
            base = buffer_of(src)
            owner = self.group_of.get(base)
            if owner is None or self.find(owner) == gid or group.edge_dims(src) is not None:
                continue
            made = self._recomputable(base, gid)
            if made is None:
                continue
            chain, width, loads = made
            if not self._worth_remaking(node, base, width, loads):
                continue
            trial = self._joined(group, chain)
            if trial is None:  # some value of the chain has no position of its own there: where it is read
                trial = self._joined(group, chain, _placements(node, src, group, chain))
            if trial is None:
                continue
            trial.members.sort(key=self.order.__getitem__)
            if trial.edge_dims(src) is None or not _reads_agree(trial, chain):
                continue
            trial.recomputed.update(chain)
            self.groups[gid] = group = trial
            for m in chain:
                for operand in m.srcs:
                    if buffer_of(operand) not in chain:
                        self.add_deps(gid, self.frontier(operand) - {gid})

    @staticmethod
    def _joined(group: Group, chain: list[Node], placed: dict[Node, tuple] | None = None) -> Group | None:
        """A trial copy of ``group`` with ``chain`` joined (each value at ``placed``'s map where derived from
        nothing in the group), or None."""
        trial = Group(group.shape, group.reduce, list(group.members), dict(group.dims),
                      recomputed=set(group.recomputed), order=group.order)
        placed = placed or {}
        return trial if all(_try_join(m, trial, placed.get(m)) for m in chain) else None

    def _worth_remaking(self, reader: Node, base: Node, width: int, loads: set[Node]) -> bool:
        """Whether ``reader``'s group should make ``base`` again from ``loads`` (``width`` bytes an element) rather
        than read it. Making it may read up to its width (twice for a sole reader, which also saves the store).
        Reading less than its width is always worth it; otherwise making it must not keep more memory alive than
        it frees: the values it is made of live on until ``reader`` (a training step's forward values read again
        by the backward), measured in bytes times program positions — a ReLU's mask is made again from its
        output, which the next layer's weight gradient reads just before, but a ReLU's output is not made again
        from its input, which nothing else reads after the forward."""
        itemsize = base.type.dtype.itemsize
        sole = self.readers[base] == 1
        if width > itemsize * (2 if sole else 1):
            return False
        if width < itemsize:
            return True  # less to read than the value itself: what it is made of is read anyway
        at = self.order[reader]
        freed = base.type.nbytes * max(0, at - self.order.get(base, at)) if sole else 0
        return self._kept_longer(reader, base, loads) <= freed

    def _kept_longer(self, reader: Node, base: Node, loads: set[Node]) -> int:
        """Bytes times program positions by which making ``base`` in ``reader``'s group from ``loads`` keeps them
        alive longer; the program's inputs live throughout anyway, and a broadcast operand (a row's statistics)
        is small."""
        at = self.order[reader]
        return sum(v.type.nbytes * max(0, at - self.last_read.get(v, at)) for v in loads
                   if v not in self.live and v.type.numel * BROADCAST_RATIO > base.type.numel)

    def _recomputable(self, node: Node, gid: int, depth: int = 0) -> tuple[list[Node], int, set[Node]] | None:
        """(``node`` and the values other groups make that it is made of, operands first; the bytes per element
        group ``gid`` reads from memory to make them, a broadcast operand's share divided among the elements
        it is broadcast to) when ``node`` is elementwise. An operand another group
        makes is made again too when that reads no more than loading it (at most ``RECOMPUTE_DEPTH`` deep),
        else loaded from the buffer its group stores. None when ``node`` cannot be made in ``gid``."""
        if fusion_kind(node) == "cat" and depth <= RECOMPUTE_DEPTH and node not in self.roots:
            return self._recomputable_cat(node, gid)
        if fusion_kind(node) != "elementwise" or node.op == "clone" or depth > RECOMPUTE_DEPTH or node in self.roots:
            return None
        chain: list[Node] = []
        width = 0
        loads: set[Node] = set()
        for src in node.srcs:
            base = buffer_of(src)
            if base in self.group_of and fusion_kind(base) != "constant":
                if base in self.groups[gid].dims:  # the group makes it already (owns or recomputes it)
                    continue
                made = self._recomputable(base, gid, depth + 1)
                # at equal width a value stored anyway is made again only where that keeps nothing alive longer
                cheap = made is not None and (made[1] < base.type.dtype.itemsize
                                              or (made[1] == base.type.dtype.itemsize
                                                  and self._kept_longer(node, base, made[2]) == 0))
                # a load must not make the group depend on itself (a group of the one node being placed cannot:
                # whatever it reads comes before it)
                loadable = cheap or len(self.groups[gid].members) == 1 or not self.reaches(base, gid)
                if loadable and base.type.numel * BROADCAST_RATIO <= node.type.numel:
                    made = None  # a broadcast operand (per-channel statistics) is loaded: its elements are shared
                if made is not None and (cheap or not loadable):
                    chain += [m for m in made[0] if m not in chain]
                    width += made[1] * min(base.type.numel, node.type.numel) // max(node.type.numel, 1)
                    loads |= made[2]
                    continue
                if not loadable:
                    return None
            if fusion_kind(base) != "constant":
                loads.add(base)
            if src.type.numel == node.type.numel and fusion_kind(base) != "constant":  # constants are not read
                width += src.type.dtype.itemsize
        return [*chain, node], width, loads

    def _recomputable_cat(self, node: Node, gid: int) -> tuple[list[Node], int, set[Node]] | None:
        """A cat is made again by loading each element from its input (an element of one input per element: its
        width is theirs), never from values the group makes."""
        bases = {buffer_of(s) for s in node.srcs}
        if bases & set(self.groups[gid].dims):
            return None
        loads = {b for b in bases if fusion_kind(b) != "constant"}
        return [node], max((b.type.dtype.itemsize for b in loads), default=0), loads

    def _join(self, node: Node, gid: int, external: list[Node]) -> None:
        self.group_of[node] = gid
        for src in external:
            self.add_deps(gid, self.frontier(src) - {gid})

    def _merged_candidate(self, candidates: list[int]) -> int | None:
        """Merge several operand groups with one domain into the first, when no path joins them outside.

        A group without reduced dims also merges into a reduction over the same domain: its members are then
        computed in the nest's loops over the domain like the reduction's own prologue and epilogue members
        (``g - exp(y) * g.sum(-1, keepdim=True)`` is one kernel, not a reduction and a pointwise pass)."""
        if len(candidates) < 2:
            return None
        first = self.groups[candidates[0]]
        reduce = next((self.groups[g].reduce for g in candidates if self.groups[g].reduce), first.reduce)
        same = [g for g in candidates if self.groups[g].shape == first.shape and self.groups[g].reduce in ((), reduce)
                and _device(self.groups[g]) == _device(first) and self.groups[g].order == first.order
                and not (reduce and any(_transposing_copy(m, self.groups[g]) for m in self.groups[g].members))]
        # a group another one depends on stays apart (a path would join them outside); the rest merge. A constant
        # comparison that every layer shares (a cat's position test) belongs to the first layer's group: the
        # groups of a later layer still merge without it
        closures = {g: self.deps_closure(g) for g in same}
        same = [g for g in same if not any(g in closures[h] for h in same if h != g)]
        agreeing: list[int] = []
        for g in same:
            if all(self.groups[g].agrees(self.groups[h]) for h in agreeing):
                agreeing.append(g)
        same = agreeing
        if len(same) < 2:
            return None
        reduce = next((self.groups[g].reduce for g in same if self.groups[g].reduce), ())
        target = same[0]
        for gid in same:
            self.forget_closures(gid)
        for gid in same[1:]:
            self.groups[target].absorb(self.groups.pop(gid))
            self.deps[target] |= self.deps.pop(gid)
            self.dependents.setdefault(target, set()).update(self.dependents.pop(gid, ()))
            self.parent[gid] = target
        self.groups[target].reduce = reduce
        self.deps[target] = {d for d in self.deps[target] if self.find(d) != target}
        self.groups[target].members.sort(key=self.order.__getitem__)
        return target

    def materialize_constants(self, graph: Graph) -> None:
        """A constant read by something other than a group (a library call, an output) needs a buffer."""
        grouped = set(self.group_of)
        for node in graph.body:
            if node.kind == "view" or node in grouped:
                continue
            for src in node.srcs:
                base = buffer_of(src)
                if fusion_kind(base) == "constant" and base not in self.group_of:
                    self._own_group(base)
        for root in graph.roots():
            base = buffer_of(root)
            if fusion_kind(base) == "constant" and base not in self.group_of:
                self._own_group(base)

    def _own_group(self, node: Node) -> None:
        gid = len(self.parent)
        self.parent[gid], self.deps[gid] = gid, set()
        self.groups[gid] = Group(node.type.shape, (), [node], {node: tuple(
            j if s != 1 else None for j, s in enumerate(node.type.shape))})
        self.group_of[node] = gid


def partition(graph: Graph) -> list[Group]:
    readers: dict[Node, int] = {}  # value -> how many nodes (not views) and outputs read it, through views or not
    last_read: dict[Node, int] = {}  # value -> position of its last reader (past the body for what is returned)
    for k, node in enumerate(graph.body):
        if node.kind != "view":
            for src in node.srcs:
                base = buffer_of(src)
                readers[base] = readers.get(base, 0) + 1
                last_read[base] = k
    for root in graph.roots():
        base = buffer_of(root)
        readers[base] = readers.get(base, 0) + 1
        last_read[base] = len(graph.body)
    roots = frozenset(buffer_of(root) for root in graph.roots())
    part = _Partition({n: k for k, n in enumerate(graph.body)}, readers, roots, last_read)
    calls = 0
    after = part.after_collective
    for node in graph.body:
        part.calls_before[node] = calls
        extern = fusion_kind(node) == "extern"
        calls += extern
        if (extern and is_collective(node)) or (after and not after.isdisjoint(node.srcs)):
            after.add(node)
    part.live = frozenset(graph.inputs)
    for node in graph.body:
        part.add(node)
    part.materialize_constants(graph)
    groups = list(part.groups.values())
    _mark_outputs(graph, groups)
    return groups


def _mark_outputs(graph: Graph, groups: list[Group]) -> None:
    """A member is stored, by the group that owns it, when a reader cannot make it itself (it is in no group,
    or its group neither owns nor recomputes it, or reads it through a view the nest cannot map), or it is a
    root. A group left with nothing to store (everything it made is recomputed where read) is dropped."""
    owner = {m: g for g in groups for m in g.owned()}
    makers: dict[Node, list[Group]] = {}  # the groups that compute each member: its owner, and any recomputing it
    for g in groups:
        for m in g.members:
            makers.setdefault(m, []).append(g)
    needed = {buffer_of(r) for r in graph.roots()}
    for node in graph.body:
        if node.kind == "view":
            continue
        readers = makers[node] if node in owner else [None]
        for src in node.srcs:
            base = buffer_of(src)
            if base in owner and any(g is None or g.edge_dims(src) is None for g in readers):
                needed.add(base)
    for g in groups:
        g.outputs = [m for m in g.owned() if m in needed]
    groups[:] = [g for g in groups if g.outputs]


# ---------------------------------------------------------------------------- siblings and horizontal fusion

def _levels(graph: Graph, groups: list[Group]) -> list[tuple[int, bool]]:
    """Each group's depth in the DAG of kernels and library calls (groups of equal depth are independent), and
    whether it needs a collective's result."""
    owner = {m: k for k, g in enumerate(groups) for m in g.owned()}
    producers: dict[Node, frozenset] = {}
    for node in graph.body:  # the units (groups, library calls) whose results each value needs
        if node in owner:
            producers[node] = frozenset({("group", owner[node])})
        elif fusion_kind(node) == "extern" and node.kind != "getitem":
            producers[node] = frozenset({("call", node)})
        else:
            producers[node] = frozenset().union(*(producers.get(s, frozenset()) for s in node.srcs))
    deps: dict[tuple, set] = {("group", k): set() for k in range(len(groups))}
    for k, g in enumerate(groups):
        for m in g.members:
            for src in m.srcs:
                if g.edge_dims(src) is None:
                    deps[("group", k)] |= producers.get(src, frozenset())
    for node in graph.body:
        if node not in owner and fusion_kind(node) == "extern" and node.kind != "getitem":
            deps[("call", node)] = set().union(*(producers.get(s, frozenset()) for s in node.srcs))
    level: dict[tuple, int] = {}
    after_collective: dict[tuple, bool] = {}
    for unit in deps:
        stack, visiting = [(unit, False)], set()
        while stack:
            u, ready = stack.pop()
            if ready:
                visiting.discard(u)
                level[u] = max((level[d] + 1 for d in deps[u]), default=0)
                after_collective[u] = any(after_collective[d] or (d[0] == "call" and is_collective(d[1]))
                                          for d in deps[u])
                continue
            if u in level:
                continue
            if u in visiting:
                raise RuntimeError("fusion produced kernels that depend on each other (a cycle); this is a bug")
            visiting.add(u)
            stack.append((u, True))
            stack.extend((d, False) for d in deps[u] if d not in level)
    return [(level[("group", k)], after_collective[("group", k)]) for k in range(len(groups))]


def _external_bases(group: Group) -> set[Node]:
    return {buffer_of(s) for m in group.members for s in m.srcs if group.edge_dims(s) is None}


def _worth_sharing(group: Group) -> set[Node]:
    """The inputs of a group worth loading once for a sibling too: a single element (a scalar every thread
    reads, such as the clip coefficient an optimizer update over every parameter shares) is no reason to
    merge: each of those nests would then load the other's operands too, and many such nests in one thread
    run out of registers."""
    return {base for base in _external_bases(group) if base.type.numel > 1}


def _merge_siblings(batch: list[Group], order: dict[Node, int]) -> list[Group]:
    out: list[tuple[Group, set[Node]]] = []  # with the inputs each is worth sharing
    for group in batch:
        reads = _worth_sharing(group)
        for other, other_reads in out:
            if (other.shape == group.shape and other.reduce == group.reduce and _device(other) == _device(group)
                    and other.order == group.order and other_reads & reads and other.agrees(group)):
                other.absorb(group)
                other.members.sort(key=order.__getitem__)  # a value one of them made again, before its readers
                other_reads |= reads
                break
        else:
            out.append((group, reads))
    return [group for group, _ in out]


def plan_kernels(graph: Graph, groups: list[Group]) -> list[FusedKernel]:
    levels = _levels(graph, groups)
    by_level: dict[tuple, list[Group]] = {}
    for k, group in enumerate(groups):
        # a recomputation (``recompute.py``) runs where its late readers need it, so it shares no kernel
        alone = k if any(m.tag == RECOMPUTED for m in group.members) else -1
        by_level.setdefault((*levels[k], str(_device(group)), alone), []).append(group)
    kernels = []
    order = {n: k for k, n in enumerate(graph.body)}
    for key in sorted(by_level, key=lambda k: k[:2]):
        batch = _merge_siblings(by_level[key], order)
        for start in range(0, len(batch), MAX_NESTS_PER_KERNEL):
            kernels.append(_kernel(f"k{len(kernels)}", _largest_first(batch[start:start + MAX_NESTS_PER_KERNEL])))
    return kernels


def _largest_first(groups: list[Group]) -> list[Group]:
    """A kernel's nests, the largest domain first (ties as they came).

    [Note: nest order] Independent nests of one dependency level share a kernel (horizontal fusion) in the order
    their groups were made, and that order is the order of the kernel's block ranges and parameters, so it is in
    the kernel's text. The same nests met in another order made another text: a transformer's last layer, whose
    weight gradients' norms (clip_grad_norm_) come before its layer norm's backward in program order, compiled a
    copy of every other layer's kernel with the nests swapped (one more NVRTC compile, 0.3-0.4 s, for each of
    ViT-B/16, GPT-2 and Llama). Ordered by size, like nests make one text. Largest first is also the order that
    leaves the shortest tail: the small nests' blocks fill the machine as the large one drains."""
    return sorted(groups, key=_domain_size, reverse=True) if len(groups) > 1 else groups


def _domain_size(group: Group) -> int:
    """The elements of the group's domain; 0 for a symbolic domain (kept where it came)."""
    return S.numel(group.shape) if all(type(d) is int for d in group.shape) else 0


def _kernel(prefix: str, groups: list[Group]) -> FusedKernel:
    inputs: list[Node] = []
    for g in groups:
        for m in g.members:
            for s in m.srcs:
                if g.edge_dims(s) is None and s not in inputs and not is_inlined_constant(s, g):
                    inputs.append(s)
    ops = []
    for g in groups:
        for m in g.members:
            name = m.op.split(".")[0].lstrip("_")
            if m.op != "full" and name not in ops:
                ops.append(name)
    name = "_".join([prefix, *ops[:6]]) + ("_etc" if len(ops) > 6 else "")
    return FusedKernel(name, groups, inputs, [o for g in groups for o in g.outputs])


# ---------------------------------------------------------------------------- the pass

def fuse(graph: Graph) -> Graph:
    """Replace each kernel's members by one ``fused`` node (plus ``getitem`` per output when several)."""
    kernels = plan_kernels(graph, partition(graph))
    while True:
        out = _fused_graph(graph, kernels)
        if not _drop_unread_outputs(out, kernels):
            break
    _log_kernels(kernels)
    return out


def _drop_unread_outputs(out: Graph, kernels: list[FusedKernel]) -> bool:
    """Stop storing values no node of the fused graph reads (every reader made them again itself); a nest left
    storing nothing goes. True when something was dropped (the graph is then mapped again)."""
    read = {id(n.args[0]): set() for n in out.body if n.op == "fused"}
    for n in (*out.body, *out.roots()):
        if n.op == "getitem" and n.srcs[0].op == "fused":
            read[id(n.srcs[0].args[0])].add(n.args[0])
    dropped = False
    for kernel in kernels:
        used = read.get(id(kernel))
        if used is None or len(kernel.outputs) < 2 or len(used) == len(kernel.outputs):
            continue
        unread = {o for k, o in enumerate(kernel.outputs) if k not in used}
        for g in kernel.groups:
            g.outputs = [o for o in g.outputs if o not in unread]
        kernel.groups = [g for g in kernel.groups if g.outputs]
        kernel.outputs = [o for g in kernel.groups for o in g.outputs]
        dropped = True
    if dropped:
        kernels[:] = [k for k in kernels if k.outputs]
    return dropped


def _fused_graph(graph: Graph, kernels: list[FusedKernel]) -> Graph:
    member_of = {m: k for k in kernels for g in k.groups for m in g.owned()}
    fused: dict[int, Node] = {}
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}

    def fused_node(kernel: FusedKernel) -> Node:
        node = fused.get(id(kernel))
        if node is None:
            types = tuple(o.type for o in kernel.outputs)
            node = Node("fused", tuple(mapping[s] for s in kernel.inputs), (kernel,),
                        types[0] if len(types) == 1 else types)
            fused[id(kernel)] = node
        return node

    def mapped(node: Node) -> Node:
        kernel = member_of.get(node)
        if kernel is None:
            return node.replace(srcs=tuple(mapping[s] for s in node.srcs))
        f = fused_node(kernel)
        if len(kernel.outputs) == 1:
            return f
        k = kernel.outputs.index(node)
        return Node("getitem", (f,), (k,), node.type)

    order = _kernel_order(graph, kernels, member_of)
    for node in order:
        if node in mapping:
            continue
        kernel = member_of.get(node)
        if kernel is not None and node not in kernel.outputs:
            continue
        mapping[node] = mapped(node)
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    # kernels and calls run in the order the function made their values (random draws, which take the
    # generator's next counters, among them), each after what it reads
    out.body = in_program_order([mapping[n] for n in order if n in mapping], out)
    for kernel in kernels:
        kernel.graph_values = mapping
    return out


def _kernel_order(graph: Graph, kernels: list[FusedKernel], member_of: dict) -> list[Node]:
    """The graph nodes the fused graph needs (what its outputs and writes reach through kernels' inputs, not
    through the values inside kernels), in the order the function made them, every kernel's inputs before its
    first output is mapped."""

    def sources(node: Node):
        kernel = member_of.get(node)
        return kernel.inputs if kernel is not None else node.srcs

    needed = set(toposort(graph.roots(), set(graph.inputs), sources))
    return toposort([n for n in graph.body if n in needed], set(graph.inputs), sources)


def _log_kernels(kernels: list[FusedKernel]) -> None:
    from tilewise.config import settings

    if "fusion" not in settings.log:
        return
    from tilewise.compiler.ir import format_type

    lines = []
    for k in kernels:
        lines.append(f"{k.name}: {len(k.groups)} nest(s), reads {len(k.inputs)}, writes {len(k.outputs)}")
        for g in k.groups:
            lines.append(f"  nest over {list(g.shape)} reducing dims {list(g.reduce)}:")
            for m in g.members:
                mark = " -> stored" if m in g.outputs else " (recomputed)" if m in g.recomputed else ""
                lines.append(f"    {m.op} : {format_type(m.type)} dims {g.dims[m]}{mark}")
    log("fusion", "\n".join(lines))
