"""cats_of_pointwise: a concatenation computes its pointwise inputs where they lie in the result.

[Note: pointwise values placed in a cat] A ``cat`` that fusion computes in its readers' kernels (``fusable_cat``,
see [Note: concatenations in kernels] in ``lowering/fusion``) loads its inputs: an input that is itself a
pointwise value would be a kernel of its own, stored for the cat to read. RoPE's ``rotate_half``,
``cat((-x2, x1), -1)`` over the halves of ``x``, would keep its negation as such a kernel, and the backward's
``cat((g[..., h:], -g[..., :h]), -1)`` of the gradient ``g = grad * sin`` another. This pass moves the pointwise
work into the result's frame instead: input ``k``, which lies at ``[start_k, end_k)`` along the joined dim, is
rebuilt as a value over the whole result whose elements in that range are the input's, and the cat becomes a
``where`` over the position picking, in each range, the value built for it:

* a pointwise input is the same operator over its operands placed the same way (an operand constant along the
  joined dim, a per-row statistic or a scalar, is read as it is);
* a slice along the joined dim of a pointwise value places that value shifted by the slice's start;
* anything else (a graph input, a library call's result, a view, a value something else needs too) is placed by
  a cat of zeros, the part of it in range, and zeros: a cat of one loaded input, which the reading kernel reads
  with a guarded load.

Outside its range a placed value is computed from zeros and never selected. Only floating-point operators are
moved (an integer division by a zero outside the range would raise on the C target), only values that nothing
but this cat reads (a value needed elsewhere is stored anyway, and is read rather than made twice), and only
``MAX_PLACED`` of them per cat. The result is the cat's element for element: every element comes from the
same operators on the same operands.
"""

from __future__ import annotations

from tilewise import strides as S
from tilewise.compiler.capture import retrace
from tilewise.compiler.ir import Graph, Node, TensorType, rewrite, toposort
from tilewise.compiler.lowering.fusion import cat_operands, fusion_kind
from tilewise.compiler.lowering.views import buffer_of
from tilewise.dtypes import int32, int64
from tilewise.ops import public_function
from tilewise.ops.creation import arange, zeros

where, cat = public_function("where"), public_function("cat")

MAX_PLACED = 32  # pointwise values a cat's inputs may be rebuilt from


def cats_of_pointwise(graph: Graph) -> Graph:
    readers, roots = _readers(graph)

    def rebuilt(old: Node, new: Node) -> None:
        readers[new] = readers.get(old, 0)
        if old in roots:
            roots.add(new)

    return rewrite(graph, lambda n: _placed_cat(n, readers, roots), rebuilt)


def _readers(graph: Graph) -> tuple[dict[Node, int], set[Node]]:
    """How many live nodes (other than views) read each value, through views or not, counting what the graph
    returns or writes back as a reader too; and those values. (Earlier passes leave dead nodes behind: the view
    scatters a gradient's cat replaced still read its parts.)"""
    live = set(toposort(graph.roots(), set(graph.inputs)))
    readers: dict[Node, int] = {}
    for node in graph.body:
        if node.kind != "view" and node in live:
            for src in node.srcs:
                base = buffer_of(src)
                readers[base] = readers.get(base, 0) + 1
    roots = {buffer_of(r) for r in graph.roots()}
    for base in roots:
        readers[base] = readers.get(base, 0) + 1
    return readers, roots


def _placed_cat(node: Node, readers: dict[Node, int], roots: set[Node]) -> Node | None:
    if fusion_kind(node) != "cat":
        return None
    tensors, dim = cat_operands(node)
    shape = node.type.shape
    dim = S.normalize_dim(dim, len(shape))
    moved = _movable(node, tensors, dim, readers, roots)
    if not moved:
        return None
    placer = _Placer(shape, dim, moved)
    pieces, start = [], 0
    for t in tensors:
        end = start + t.type.shape[dim]
        if end > start:
            pieces.append((end, placer.place(t, start, start, end)))
        start = end
    ends = [end for end, _ in pieces]
    dtype, device, length = node.type.dtype, node.type.device, shape[dim]

    def select(*placed):
        along = [length if k == dim else 1 for k in range(len(shape))]
        # over the whole shape, so that the comparison's nest is the one of the values it selects between
        position = arange(length, dtype=int32 if length < 2**31 else int64, device=device).view(along).expand(shape)
        out = placed[-1].to(dtype)
        for end, value in zip(reversed(ends[:-1]), reversed(placed[:-1])):
            out = where(position < end, value.to(dtype), out)
        return out

    return retrace(select, [p for _, p in pieces])[0]


def _slice_along(node: Node, dim: int, rank: int) -> tuple[Node, int] | None:
    """(source, start) when ``node`` is a unit-step slice of a value of its rank along ``dim``."""
    if node.op != "slice" or len(node.srcs[0].type.shape) != rank:
        return None
    _, sdim, start, _, *step = node.bound_args(node.srcs)
    if S.normalize_dim(sdim, rank) != dim or (step and step[0] != 1):
        return None
    start = start or 0
    return node.srcs[0], start + node.srcs[0].type.shape[dim] if start < 0 else start


def _floating(node: Node) -> bool:
    return fusion_kind(node) == "elementwise" and node.type.dtype.is_floating_point and all(
        s.type.dtype.is_floating_point for s in node.srcs)


def _lined_up(src: Node, node: Node, dim: int) -> bool:
    """Whether operand ``src`` of pointwise ``node`` runs along ``node``'s ``dim`` (else it is broadcast there)."""
    lead = len(node.type.shape) - len(src.type.shape)
    return dim >= lead and src.type.shape[dim - lead] != 1


def _movable(node: Node, tensors: list[Node], dim: int, readers: dict[Node, int], roots: set[Node]) -> set[Node]:
    """The pointwise values the cat's inputs are rebuilt from: reached from them through pointwise operators and
    slices along ``dim``, floating-point, and read by nothing else (a fixed point: dropping one may leave a value
    it read with a reader outside)."""
    rank = len(node.type.shape)
    found: set[Node] = set()
    todo = list(tensors)
    while todo and len(found) < MAX_PLACED:
        x = todo.pop()
        sliced = _slice_along(x, dim, rank)
        base = sliced[0] if sliced is not None else x
        if base in found or base in roots or len(base.type.shape) != rank or not _floating(base):
            continue
        found.add(base)
        todo.extend(s for s in base.srcs if _lined_up(s, base, dim))
    while True:
        reached: dict[Node, int] = {}
        for reader in (node, *found):
            for src in reader.srcs:
                base = buffer_of(src)
                reached[base] = reached.get(base, 0) + 1
        kept = {n for n in found if reached.get(n, 0) == readers.get(n, 0)}
        if kept == found:
            return found
        found = kept


class _Placer:
    """Builds, for a value ``x`` and a shift ``offset``, a value over the cat's shape whose elements at positions
    ``[lo, hi)`` along the joined dim are ``x``'s at ``position - offset``."""

    def __init__(self, shape: tuple, dim: int, moved: set[Node]):
        self.shape, self.dim, self.moved = shape, dim, moved

    def place(self, x: Node, offset: int, lo: int, hi: int) -> Node:
        rank, dim = len(self.shape), self.dim
        sliced = _slice_along(x, dim, rank)
        if sliced is not None and sliced[0] in self.moved:
            return self.place(sliced[0], offset - sliced[1], lo, hi)
        base = buffer_of(x)
        if base.op == "full":  # the same everywhere: one element, broadcast
            return base.replace(args=((), *base.args[1:]), type=TensorType((), base.type.dtype, base.type.device))
        if x not in self.moved:
            return self._loaded(x, offset, lo, hi)
        srcs = tuple(self.place(s, offset, lo, hi) if _lined_up(s, x, dim) else s for s in x.srcs)
        out = S.broadcast_shapes(*(s.type.shape for s in srcs))
        return x.replace(srcs=srcs, type=TensorType(out, x.type.dtype, x.type.device))

    def _loaded(self, x: Node, offset: int, lo: int, hi: int) -> Node:
        """``x``'s elements in range, between zeros: a cat of one input that its reader loads where it lies. ``x``
        is expanded to the cat's shape first, so that this cat is one its reader's kernel computes too (its dims
        before the joined one are the original cat's)."""
        shape, dim = self.shape, self.dim
        full = _along(shape, dim, x.type.shape[dim - (len(shape) - len(x.type.shape))])
        length = shape[dim]

        def pad(t):
            t = t.expand(full) if tuple(t.shape) != full else t
            part = t.narrow(dim, lo - offset, hi - lo)
            if lo == 0 and hi == length:
                return part
            parts = [zeros(_along(full, dim, lo), dtype=t.dtype, device=t.device)] if lo else []
            parts.append(part)
            if hi < length:
                parts.append(zeros(_along(full, dim, length - hi), dtype=t.dtype, device=t.device))
            return cat(parts, dim)

        return retrace(pad, (x,))[0]


def _along(shape: tuple, dim: int, n: int) -> tuple:
    return tuple(n if k == dim else s for k, s in enumerate(shape))
