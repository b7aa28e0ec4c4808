"""grouped_query_attention: a head repeat of key or value feeding attention becomes the attention's own grouping.

[Note: head repeats before attention] Grouped-query attention has fewer key/value heads than query heads, and
model files repeat them before ``scaled_dot_product_attention``: ``k.repeat_interleave(g, dim=1)``, or
``k[:, :, None].expand(b, h_kv, g, s, e).reshape(b, h_kv * g, s, e)`` as Hugging Face's ``repeat_kv`` has it.
Both capture as ``view(clone(expand(unsqueeze(k, -3))))``: a copy of key and value ``g`` times over forward, and,
backward, the attention's key/value gradients in the query's head count summed over each group. A fused attention
that takes the key/value heads as they are (cuDNN's: query head ``h`` reads key/value head ``h // g``, the repeat's
order, and its backward sums each group in float32) needs neither: this pass gives the attention (forward, and
backward where every reader of its key/value gradients is that group sum) the un-repeated tensor with
``enable_gqa``, and the group sum the gradient the backward now returns. A dtype cast between the repeat and the
attention (autocast's, of a RoPE'd key in float32) is applied to the un-repeated tensor instead, and to the
gradient after it.

It runs on the operators a target keeps whole (after ``decompose``), and only where ``accepts(op name, bound
args)`` takes the grouped call, so that a target whose attention would decompose keeps the graph it has: the
decomposition would repeat the heads anyway, and the summed gradients would round differently.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise import strides as S
from tilewise.compiler.capture import retrace
from tilewise.compiler.ir import Graph, Node, TensorType, rewrite
from tilewise.ops.registry import OPS

FORWARD, BACKWARD = "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward"
# operand positions: key, value and enable_gqa in each operator's arguments; (key, value) gradient outputs
_KEY_VALUE = {FORWARD: (1, 2), BACKWARD: (2, 3)}
_GRADIENTS = (1, 2)


def grouped_query_attention(graph: Graph, accepts: Callable[[str, tuple], bool]) -> Graph:
    users = graph.users()
    origin: dict[Node, Node] = {}
    backwards: dict[Node, Node] = {}  # the backward as captured (rebuilt) -> its grouped form
    sums: dict[Node, tuple[Node, int, list[Node]]] = {}  # group sum -> (captured backward, output, casts)

    def rebuilt(old: Node, new: Node) -> None:
        origin[new] = origin.get(old, old)

    def replace(node: Node) -> Node | None:
        if node.op == FORWARD and not node.args[-1]:
            return _grouped_call(node, accepts, lambda k: True)
        if node.op == BACKWARD and not node.args[-1]:
            grouped = _grouped_call(node, accepts, lambda k: _summed_per_group(origin.get(node, node), k, users, sums))
            if grouped is not None:
                backwards[origin.get(node, node)] = grouped
            return None  # its gradients' readers move to the grouped call (below); dce drops it
        if node.op == "getitem" and origin.get(node.srcs[0], node.srcs[0]) in backwards:
            grouped = backwards[origin.get(node.srcs[0], node.srcs[0])]
            k = node.args[0]  # a gradient that changed its head count is read through its group sum (below)
            return Node("getitem", (grouped,), (k,), node.type) if grouped.type[k] == node.type else None
        summed = sums.get(origin.get(node, node))
        if summed is not None and summed[0] in backwards:
            captured, k, casts = summed
            grouped = backwards[captured]
            return _cast_like(Node("getitem", (grouped,), (k,), grouped.type[k]), casts)
        return None

    return rewrite(graph, replace, rebuilt)


def _grouped_call(node: Node, accepts, gradient_summed) -> Node | None:
    """``node`` (the attention forward or backward) with each repeated key/value operand replaced by what it
    repeats, as one call with ``enable_gqa``; None when neither is a head repeat, when the backward's gradient of
    a repeated operand is read otherwise than summed per group (``gradient_summed(output)``), or when the target
    would not keep the grouped call whole."""
    args = list(node.bound_args(node.srcs))
    changed = False
    for k, position in zip(_GRADIENTS, _KEY_VALUE[node.op]):
        found = head_repeat(args[position])
        if found is not None and (node.op == FORWARD or gradient_summed(k)):
            args[position], changed = found, True
    if not changed:
        return None
    args[-1] = True
    if not accepts(node.op, tuple(a.type if isinstance(a, Node) else a for a in args)):
        return None
    tensors = [k for k, a in enumerate(args) if isinstance(a, Node)]

    def call(*operands):
        bound = list(args)
        for k, t in zip(tensors, operands):
            bound[k] = t
        return OPS[node.op](*bound)

    first = retrace(call, [args[k] for k in tensors], keep=lambda op, _: op == node.op)[0]
    return first.srcs[0]  # a getitem of the call


def head_repeat(node: Node) -> Node | None:
    """What ``node`` repeats head by head, as ``repeat_interleave(x, g, dim=-3)`` with ``g > 1`` does (the
    un-repeated tensor with ``node``'s casts applied), or None. Matched on shapes: (..., h, s, e) viewed as (...,
    h, 1, s, e), expanded to (..., h, g, s, e), copied, and viewed as (..., h * g, s, e)."""
    x, casts = _through_casts(node)
    if x.op not in ("view", "reshape"):
        return None
    copy = x.srcs[0]
    expanded = copy.srcs[0] if copy.op in ("clone", "contiguous") else copy
    if expanded.op != "expand" or expanded.srcs[0].op not in ("unsqueeze", "view", "reshape"):
        return None
    one = expanded.srcs[0]
    source = one.srcs[0]
    if len(source.type.shape) < 3 or not source.type.shape[-3]:
        return None
    *lead, heads, length, dim = source.type.shape
    groups = x.type.shape[-3] // heads
    if groups < 2 or one.type.shape != (*lead, heads, 1, length, dim) or \
            expanded.type.shape != (*lead, heads, groups, length, dim) or \
            x.type.shape != (*lead, heads * groups, length, dim):
        return None
    return _cast_like(source, casts)


def _is_cast(node: Node) -> bool:
    """Whether ``node`` is a dtype cast: ``_to_copy`` on the same device (its values, element for element)."""
    return node.op == "_to_copy" and node.type.device == node.srcs[0].type.device and \
        node.type.shape == node.srcs[0].type.shape


def _through_casts(node: Node) -> tuple[Node, list[Node]]:
    """The value under a chain of dtype casts, and the casts, innermost first."""
    casts = []
    while _is_cast(node):
        casts.append(node)
        node = node.srcs[0]
    return node, casts[::-1]


def _cast_like(node: Node, casts: list[Node]) -> Node:
    """``node`` through the same dtype casts (innermost first) as ``casts`` applied to another tensor."""
    for cast in casts:
        node = cast.replace(srcs=(node,), type=TensorType(node.type.shape, cast.type.dtype, cast.type.device))
    return node


def _summed_per_group(backward: Node, k: int, users: dict[Node, list[Node]], sums: dict) -> bool:
    """Whether output ``k`` of the captured ``backward`` (a gradient in the query's head count) is read only by a
    sum over each group of heads (``view(..., h, g, s, e)`` then ``sum(-3)``, after dtype casts, as the gradient
    of a head repeat has it); records that sum in ``sums``."""
    readers = [u for u in users.get(backward, ()) if u.op == "getitem" and u.args[0] == k]
    if len(readers) != 1:
        return not readers  # an output nothing reads needs no sum
    node, casts = readers[0], []
    while True:
        following = users.get(node, ())
        if len(following) != 1:
            return False
        reader = following[0]
        if not _is_cast(reader):
            break
        casts.append(reader)
        node = reader
    view, shape = reader, node.type.shape
    if view.op not in ("view", "reshape") or len(view.type.shape) != len(shape) + 1:
        return False
    *lead, heads, groups, length, dim = view.type.shape
    if (*lead, heads * groups, length, dim) != shape or len(users.get(view, ())) != 1:
        return False
    (total,) = users[view]
    if total.op != "sum" or total.srcs[0] is not view:
        return False
    _, dims, keepdim, dtype = total.bound_args(total.srcs)
    if dtype is not None or dims is None or S.normalize_dims(dims, len(view.type.shape)) != (len(lead) + 1,):
        return False
    result = total
    if keepdim:
        squeezes = users.get(total, ())
        if len(squeezes) != 1 or squeezes[0].op not in ("squeeze", "view", "reshape"):
            return False
        result = squeezes[0]
    if result.type.shape != (*lead, heads, length, dim):
        return False
    sums[result] = (backward, k, casts)
    return True
