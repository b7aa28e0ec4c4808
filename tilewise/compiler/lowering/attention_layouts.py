"""attention_layouts: cuDNN's attention writes its output and gradients in the order their readers permute them to.

[Note: attention written in a given order] An attention kept whole (a cuDNN call) writes (B, H, L, E) results,
which its readers often permute before anything else: MultiheadAttention's output goes on as (L, B, H, E) merged
to (L * B, E) for the out-projection, and a head-split projection's gradient returns through the inverse of the
split's permute. Values of the graph IR are row-major in their logical shape, so such a permute followed by a
merge of dims is a transposing copy. cuDNN takes any output strides, so the result can be written in the
permuted order instead: the attention becomes its ``_ordered`` variant (``ops/nn_functional.py``), whose result
is the permuted value, row-major, and whose other readers see it through the inverse permute (a view). An order
is taken from a reader that permutes a result and keeps its last dim innermost (cuDNN reads and writes the head
dim contiguously). The attention's statistics and a forward's output read by its backward need nothing: cuDNN
reads operands through their strides. Where the three gradients are then joined (a packed query/key/value
projection's gradient: ``cat`` of the three, each only reshaped), the backward becomes its ``_packed`` variant,
whose result is the joined tensor: cuDNN writes each gradient into its slice.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, Node, Ref, TensorType, rewrite
from tilewise.compiler.passes.cleanup import dce
from tilewise.layouts import contiguous_format as CONTIGUOUS

FORWARD, BACKWARD = "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward"
ORDERED, PACKED = "_ordered", "_packed"
_RESULTS = {FORWARD: (0,), BACKWARD: (0, 1, 2)}  # the results that may be written in another order


def _permute(value: Node, order: tuple) -> Node:
    shape = tuple(value.type.shape[d] for d in order)
    return Node("permute", (value,), (Ref(0), order), TensorType(shape, value.type.dtype, value.type.device))


def _permutation(node: Node, rank: int) -> tuple | None:
    """The dims order a ``permute`` or ``transpose`` reads its source in; None for any other node."""
    if node.op == "permute":
        return tuple(d % rank for d in node.args[1])
    if node.op == "transpose":
        order = list(range(rank))
        a, b = node.args[1] % rank, node.args[2] % rank
        order[a], order[b] = order[b], order[a]
        return tuple(order)
    return None


def _inverse(order: tuple) -> tuple:
    return tuple(order.index(d) for d in range(len(order)))


def _orders(graph: Graph) -> dict[Node, dict[int, tuple]]:
    """For each attention node, the order each of its results is to be written in (a reader's permute or
    transpose that keeps the last dim innermost)."""
    users = graph.users()
    found: dict[Node, dict[int, tuple]] = {}
    for node in graph.body:
        if node.op != "getitem" or node.srcs[0].op not in _RESULTS or node.args[0] not in _RESULTS[node.srcs[0].op]:
            continue
        rank = len(node.type.shape)
        for reader in users[node]:
            order = _permutation(reader, rank)
            if order is not None and order[-1] == rank - 1 and order != tuple(range(rank)):
                found.setdefault(node.srcs[0], {})[node.args[0]] = order
                break
    return found


def attention_layouts(graph: Graph) -> Graph:
    """Attentions kept whole write their results in the order a reader permutes them to (see [Note: attention
    written in a given order]); a graph without such a reader is returned as it is."""
    orders = _orders(graph)
    if not orders:
        return graph
    ordered: dict[Node, dict[int, tuple]] = {}  # an ordered call -> the orders of its results
    views: dict[Node, tuple[Node, tuple]] = {}  # a result's logical view -> (the ordered value, its order)
    values: set[Node] = set()  # the ordered results
    original: dict[Node, Node] = {}
    returned = set(graph.outputs)

    def rebuilt(old: Node, new: Node) -> None:
        original[new] = original.get(old, old)

    def replace(node: Node) -> Node | None:
        chosen = orders.get(original.get(node, node))
        if chosen is not None and node.op in _RESULTS:
            args = tuple(node.args) + tuple(chosen.get(k, tuple(range(len(node.type[k].shape))))
                                            for k in _RESULTS[node.op])
            types = tuple(TensorType(tuple(t.shape[d] for d in chosen[k]), t.dtype, t.device) if k in chosen else t
                          for k, t in enumerate(node.type))
            call = Node(node.op + ORDERED, node.srcs, args, types, node.tag)
            ordered[call] = chosen
            return call  # read only through getitems, rebuilt below
        if node.op == "getitem" and node.srcs[0] in ordered:
            call, k = node.srcs[0], node.args[0]
            value = Node("getitem", (call,), (k,), call.type[k])
            if k not in ordered[call]:
                return value
            values.add(value)
            view = _permute(value, _inverse(ordered[call][k]))
            views[view] = (value, ordered[call][k])
            return view
        if node.srcs and node.srcs[0] in views:
            value, order = views[node.srcs[0]]
            if _permutation(node, len(order)) == order:
                return value  # the ordered value seen in its own order
        if node.op == "clone" and node.srcs[0] in values and node.type == node.srcs[0].type and \
                original.get(node, node) not in returned and node.args[1] in (None, CONTIGUOUS):
            return node.srcs[0]  # the row-major copy a merge of the permuted dims asked for: the value itself
        return None

    return _packed_gradients(dce(rewrite(graph, replace, rebuilt)))


_RESHAPES = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze"})


def _piece(value: Node, users: dict) -> tuple[Node, int] | None:
    """(the ordered backward, which gradient) where ``value`` is one of its gradients only reshaped (each node
    read once on the way), else None."""
    while value.op in _RESHAPES and len(users[value]) == 1:
        value = value.srcs[0]
    call = value.srcs[0] if value.op == "getitem" else None
    if call is None or call.op != BACKWARD + ORDERED or len(users[value]) != 1:
        return None
    return call, value.args[0]


def _packed_gradients(graph: Graph) -> Graph:
    """A ``cat`` of an ordered backward's three gradients, in order and only reshaped on the way (the gradient of
    a packed query/key/value projection), becomes the ``_packed`` backward: cuDNN writes each gradient into its
    slice of the joined result, and no kernel joins them."""
    users = graph.users()
    joins: set[Node] = set()
    for node in graph.body:
        if node.op != "cat" or len(node.args[0]) != 3 or any(len(users[s]) != 1 for s in node.srcs):
            continue
        pieces = [_piece(node.srcs[ref.i], users) for ref in node.args[0]]
        if None in pieces or len({call for call, _ in pieces}) != 1 or [k for _, k in pieces] != [0, 1, 2]:
            continue
        call = pieces[0][0]
        # its three gradients read there alone (a fourth result, a mask's gradient, would keep the call alive)
        if len(users[call]) == 3 and node.type.dtype is call.type[0].dtype:
            joins.add(node)
    if not joins:
        return graph
    original: dict[Node, Node] = {}

    def replace(node: Node) -> Node | None:
        if original.get(node, node) not in joins:
            return None
        first = node.srcs[node.args[0][0].i]
        while first.op != "getitem":
            first = first.srcs[0]
        call = first.srcs[0]  # as rebuilt: its operands may be values rebuilt below a join replaced earlier
        shapes = tuple(tuple(node.srcs[ref.i].type.shape) for ref in node.args[0])
        dim = node.args[1] % len(node.type.shape)
        return Node(BACKWARD + PACKED, call.srcs, tuple(call.args) + (*shapes, dim), node.type, call.tag)

    return dce(rewrite(graph, replace, lambda old, new: original.__setitem__(new, original.get(old, old))))
