"""simplify_indexing: rewrite indexing operators so that fusion can see through them.

[Note: indexing rewrites] Gathers, scatters and view scatters are library calls to fusion: whatever they
read must be materialised, and whatever they write is a buffer of its own. Four rewrites take the common
cases of a training step out of that:

* **A gather of a pointwise value gathers the operands instead.** ``gather(f(x, m), d, i)`` is
  ``f(gather(x, d, i), m)`` when ``m`` is constant along ``d`` (a per-row statistic). The negative
  log-likelihood reads one element per row of ``log_softmax(x) = x - max - log(sum(exp))``: after the rewrite
  it gathers those elements of ``x`` and the row statistics, and the log-softmax of the whole matrix is never
  written. Applied only when the gather reads fewer elements than the value has.
* **A scatter of one element per row is a select.** ``scatter(base, d, i, s)`` with ``i`` of size 1 along
  ``d`` writes, in each row, ``s`` where the position equals ``i``: ``where(arange == i, s, base)``, a
  pointwise expression the consumer's kernel computes on the fly (the loss gradient is never materialised
  as a scattered matrix). A scatter checks its indices and a select cannot, so the rewrite applies only
  where the same index tensor is also gathered along the same dim of the same size: that gather raises on
  an index out of range.
* **A constant base is read as one element.** A scatter or ``index_put`` into ``zeros`` (an embedding's
  gradient) reads the zeros as a broadcast scalar, so they are never written out in full to be copied.
* **View scatters that tile a buffer are a concatenation.** Autograd adds the gradients of
  ``q, k, v = qkv.unbind(0)`` (or of slices of one dim) as one ``view_scatter_add`` each, zero-filled
  buffers summed. When the views are slabs of one dim that cover the buffer without overlap, the sum is
  ``cat`` of the gradients, which memory planning can lay out in place.
"""

from __future__ import annotations

from tilewise import strides as S
from tilewise.compiler.capture import retrace
from tilewise.compiler.ir import Graph, Node, Ref, rewrite
from tilewise.dtypes import int32
from tilewise.ops import public_function
from tilewise.ops.creation import arange

where, cat = public_function("where"), public_function("cat")

SCATTERS = ("scatter.src", "scatter.value", "scatter_add")


# ---------------------------------------------------------------------------- gather through pointwise

def _pushable(node: Node) -> bool:
    if node.is_tuple:
        return False
    if node.kind == "pointwise":
        return True
    return node.op in ("_to_copy", "clone") and node.type.device == node.srcs[0].type.device


def gather_through_pointwise(node: Node) -> Node | None:
    """``node``, a gather of a pointwise value, as that operator over gathers of its operands (pushed on down
    through pointwise operands in turn); None when it does not apply. Iterative: a gather may sit below a
    chain of thousands of pointwise operators."""
    first = _gathered_operands(node)
    if first is None:
        return None
    done: dict[Node, Node] = {}
    stack = [(node, first, False)]
    while stack:
        gather, plan, ready = stack.pop()
        src, operands, pushed, ishape = plan
        if not ready:
            stack.append((gather, plan, True))
            for operand, push in zip(operands, pushed):
                deeper = _gathered_operands(operand) if push and operand not in done else None
                if deeper is not None:
                    stack.append((operand, deeper, False))
                elif push:
                    done.setdefault(operand, operand)
            continue
        srcs = tuple(done[o] if push else o for o, push in zip(operands, pushed))
        done[gather] = src.replace(srcs=srcs, type=type(src.type)(ishape, src.type.dtype, src.type.device))
    return done[node]


def _gathered_operands(node: Node) -> tuple[Node, list[Node], list[bool], tuple] | None:
    """(the pointwise value ``node`` gathers, its operands as the rewrite reads them, whether each is a new
    gather, the gather's shape), or None when ``node`` is not a gather that can be pushed through the value it reads."""
    if node.op != "gather":
        return None
    src, dim, index = node.bound_args(node.srcs)[:3]
    shape, rank = src.type.shape, len(src.type.shape)
    if not rank or not _pushable(src) or index.type.numel >= src.type.numel:
        return None
    dim = S.normalize_dim(dim, rank)
    ishape = index.type.shape
    if len(ishape) != rank or any(ishape[k] != shape[k] for k in range(rank) if k != dim):
        return None
    operands, pushed = [], []
    for s in src.srcs:
        aligned = (1,) * (rank - len(s.type.shape)) + s.type.shape
        if aligned[dim] == 1:  # constant along the gathered dim: read as it is, broadcast over the index
            operands.append(s)
            pushed.append(False)
            continue
        gathered = retrace(lambda t, i: (t if t.shape == shape else t.expand(shape)).gather(dim, i), (s, index))[0]
        operands.append(gathered)
        pushed.append(True)
    return src, operands, pushed, ishape


# ---------------------------------------------------------------------------- one-element scatters

def checked_indices(graph: Graph) -> set[tuple[Node, int, int]]:
    """(index, dim, size of that dim) of every gather: indices a gather raises on when out of range."""
    checked = set()
    for node in graph.body:
        if node.op == "gather":
            src, dim, index = node.bound_args(node.srcs)[:3]
            if src.type.shape:
                dim = S.normalize_dim(dim, len(src.type.shape))
                checked.add((index, dim, src.type.shape[dim]))
    return checked


def scatter_as_select(node: Node, checked: set) -> Node | None:
    if node.op not in SCATTERS:
        return None
    base, dim, index, src = node.bound_args(node.srcs)[:4]
    shape, rank = base.type.shape, len(base.type.shape)
    if not rank:
        return None
    dim = S.normalize_dim(dim, rank)
    if index.type.shape != shape[:dim] + (1,) + shape[dim + 1:] or (index, dim, shape[dim]) not in checked:
        return None
    op, number = node.op, not isinstance(src, Node)  # scatter(..., value) may come as a number in src's place
    if not number and src.type.shape != index.type.shape:
        return None

    def select(b, i, s=None):

        along = [shape[dim] if k == dim else 1 for k in range(rank)]
        narrow = int32 if shape[dim] < 2**31 else i.dtype  # positions are computed in kernels: 32-bit arithmetic
        hit = arange(shape[dim], dtype=narrow, device=b.device).view(along) == i
        s = src if number else s
        out = where(hit, b + s if op == "scatter_add" else s, b)
        return out if out.dtype is b.dtype else out.to(b.dtype)

    return retrace(select, (base, index) if number else (base, index, src))[0]


# ---------------------------------------------------------------------------- view scatters tiling a buffer

def _slab(shape: tuple, view_shape: tuple, strides: tuple, offset: int, dim: int) -> tuple[int, int, bool] | None:
    """(start, length, selected) when the view is ``narrow(dim, start, length)`` of a contiguous ``shape``, or
    (with ``selected``) ``select(dim, start)``; else None."""
    full = S.contiguous_strides(shape)
    step = full[dim]
    if step == 0 or offset % step:
        return None
    start = offset // step
    if tuple(view_shape) == shape[:dim] + shape[dim + 1:] and tuple(strides) == full[:dim] + full[dim + 1:]:
        return (start, 1, True) if start < shape[dim] else None
    if (len(view_shape) == len(shape) and tuple(strides) == full
            and all(view_shape[k] == shape[k] for k in range(len(shape)) if k != dim)
            and start + view_shape[dim] <= shape[dim]):
        return start, view_shape[dim], False
    return None


def _scattered_summands(node: Node) -> list[Node] | None:
    """The terms of the sum ``node`` (nested ``add``s of its type, alpha 1), left to right, when every one is
    a view scatter into a buffer of its type; else None, found at the first other term seen (the terms of a
    long chain of additions are never all listed just to be refused)."""
    def is_sum(n: Node) -> bool:
        return (n.op == "add" and n.args[2] == 1 and n.type == node.type
                and all(type(a) is Ref for a in n.args[:2]))

    def is_slab(n: Node) -> bool:
        return (n.op == "view_scatter_add" and tuple(n.args[1]) == node.type.shape and n.type == node.type
                and n.srcs[0].type.shape == tuple(n.args[2]))

    if not is_sum(node):
        return None
    terms, stack = [], [node]
    while stack:
        n = stack.pop()
        if not is_sum(n):
            terms.append(n)
            continue
        operands = n.bound_args(n.srcs)[:2]
        if not all(is_sum(o) or is_slab(o) for o in operands):
            return None
        stack.extend(reversed(operands))
    return terms


def _tiling(shape: tuple, terms: list[Node]) -> tuple[int, list[int], list[bool]] | None:
    """(dim, order of the terms along it, whether each is a select) when the terms' views tile ``shape``."""
    for dim in range(len(shape)):
        slabs = [_slab(shape, tuple(t.args[2]), tuple(t.args[3]), t.args[4], dim) for t in terms]
        if any(s is None for s in slabs):
            continue
        order = sorted(range(len(terms)), key=lambda k: slabs[k][0])
        end = 0
        for k in order:
            if slabs[k][0] != end:
                break
            end += slabs[k][1]
        if end == shape[dim]:
            return dim, order, [slabs[k][2] for k in order]
    return None


def scatters_as_cat(node: Node) -> Node | None:
    terms = _scattered_summands(node)
    if terms is None:
        return None
    shape = node.type.shape
    tiling = _tiling(shape, terms)
    if tiling is None:
        return None
    dim, order, selected = tiling

    def tile(*grads):
        return cat([g.unsqueeze(dim) if sel else g for g, sel in zip(grads, selected)], dim)

    return retrace(tile, [terms[k].srcs[0] for k in order])[0]


# ---------------------------------------------------------------------------- constant bases

def constant_base_as_broadcast(node: Node) -> Node | None:
    """A scatter or index_put into a constant reads it as one element broadcast: nothing writes the constant
    out in full for the call to copy (an embedding's gradient starts from zeros of the whole table)."""
    if node.op not in (*SCATTERS, "index_put") or type(node.args[0]) is not Ref:
        return None
    base = node.srcs[node.args[0].i]
    args = node.bound_args(node.srcs)
    uses = sum(a is base for arg in args for a in (arg if isinstance(arg, tuple) else (arg,)))
    if base.op != "full" or base.type.numel <= 1 or uses > 1:
        return None
    scalar = base.replace(args=((), *base.args[1:]), type=type(base.type)((), base.type.dtype, base.type.device))
    expanded = retrace(lambda t: t.expand(base.type.shape), (scalar,))[0]
    srcs = list(node.srcs)
    srcs[node.args[0].i] = expanded
    return node.replace(srcs=tuple(srcs))


def simplify_indexing(graph: Graph) -> Graph:
    graph = rewrite(graph, lambda n: gather_through_pointwise(n) or scatters_as_cat(n)
                    or constant_base_as_broadcast(n))
    checked = checked_indices(graph)
    return rewrite(graph, lambda n: scatter_as_select(n, checked))
