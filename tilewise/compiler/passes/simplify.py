"""simplify: algebraic identities and constant folding, as local rewrites applied until none fires.

Each rule looks at one node and returns a replacement or None. Identities only fire when the result has
exactly the node's type (``x * 1`` stays a cast when it promotes). Constants are ``full`` nodes: pointwise
operators over constants, views of constants and casts of constants fold into a new ``full`` whose value
the CPU backend computes from the operator's own expression, so folding cannot disagree with eager.
"""

from __future__ import annotations

from numbers import Number

import numpy as np

from tilewise import strides as S
from tilewise.compiler.ir import Graph, Node, Ref, TensorType, rewrite
from tilewise.tensor import Tensor, from_array


def constant_value(value):
    """The number a Python scalar argument or a ``full`` node stands for, else None."""
    if isinstance(value, Node):
        return value.args[1] if value.op == "full" else None
    if isinstance(value, Number) and not isinstance(value, bool):
        return value
    return None


def full(ty: TensorType, value) -> Node:
    return Node("full", (), (ty.shape, value, ty.dtype, ty.device), ty)


def _operand(node: Node, k: int):
    a = node.args[k]
    return node.srcs[a.i] if type(a) is Ref else a


def _identity_view(node: Node) -> Node | None:
    if node.kind != "view" or node.op == "as_strided":
        return None
    src = node.srcs[0]
    shape = src.type.shape
    geometry = node.opdef.view(shape, S.contiguous_strides(shape), 0, *node.args[1:])
    same = tuple(geometry[0]) == shape and tuple(geometry[1]) == S.contiguous_strides(shape) and geometry[2] == 0
    return src if same and node.type == src.type else None


def _identity_chain(node: Node) -> Node | None:
    """Views that together select every element in place (``x.t().t()``) are the value they view."""
    if node.kind != "view" or node.srcs[0].kind != "view":
        return None
    chain = []
    base = node
    while base.kind == "view":
        chain.append(base)
        base = base.srcs[0]
    shape = base.type.shape
    geometry = (shape, S.contiguous_strides(shape), 0)
    for view in reversed(chain):
        if view.op == "as_strided":
            return None
        try:
            geometry = view.opdef.view(tuple(geometry[0]), tuple(geometry[1]), geometry[2], *view.args[1:])
        except RuntimeError:
            return None
    same = (tuple(geometry[0]), tuple(geometry[1]), geometry[2]) == (shape, S.contiguous_strides(shape), 0)
    return base if same and node.type == base.type else None


def _identity_as_strided(node: Node) -> Node | None:
    if node.op != "as_strided":
        return None
    src = node.srcs[0]
    _, size, stride, offset = node.args
    if tuple(size) == src.type.shape and tuple(stride) == S.contiguous_strides(size) and offset == 0:
        return src
    return None


def _identity_copy(node: Node) -> Node | None:
    """A copy of a whole value is the value; a copy of a view stays, it lays the view out contiguously."""
    if node.op in ("clone", "_to_copy") and node.srcs[0].type == node.type and node.srcs[0].kind != "view":
        return node.srcs[0]
    return None


_NEUTRAL = {"add": (1, 0), "sub": (1, 0), "mul": (1, 1), "div": (1, 1)}  # op -> (operand, neutral value)


def _identity_arithmetic(node: Node) -> Node | None:
    rule = _NEUTRAL.get(node.op)
    if rule is None:
        if node.op == "neg" and node.srcs[0].op == "neg" and node.srcs[0].srcs[0].type == node.type:
            return node.srcs[0].srcs[0]
        if node.op == "where.self" and len(node.srcs) == 3 and node.srcs[1] is node.srcs[2]:
            return node.srcs[1] if node.srcs[1].type == node.type else None
        return None
    k, neutral = rule
    if node.op in ("add", "sub") and node.args[2] != 1:
        return None
    orders = ((0, 1), (1, 0)) if node.op in ("add", "mul") else ((0, 1),)
    for keep, drop in orders:
        x = _operand(node, keep)
        if isinstance(x, Node) and x.type == node.type and constant_value(_operand(node, drop)) == neutral:
            return x
    return None


def _full_cover(node: Node) -> Node | None:
    """``view_scatter`` over every element in row-major order is a reshape of what is written."""
    if node.op != "view_scatter":
        return None
    base, src = node.srcs
    _, _, shape, strides, offset = node.args
    if S.numel(shape) != base.type.numel or tuple(strides) != S.contiguous_strides(shape) or offset != 0:
        return None
    if src.type.shape == base.type.shape:
        return src
    return Node("view", (src,), (Ref(0), base.type.shape), base.type)


def _read_back(node: Node) -> Node | None:
    """Reading exactly the elements a ``view_scatter`` just wrote gives what was written."""
    if node.op != "as_strided" or node.srcs[0].op != "view_scatter":
        return None
    scatter = node.srcs[0]
    if tuple(node.args[1:]) == tuple(scatter.args[2:]) and scatter.srcs[1].type == node.type:
        return scatter.srcs[1]
    return None


def _fold(node: Node) -> Node | None:
    if node.op in ("full", "input", "getitem", "fused") or not node.srcs:
        return None
    if not all(s.op == "full" for s in node.srcs) or node.is_tuple:
        return None
    if node.kind == "view" or node.op == "expand":
        return full(node.type, node.srcs[0].args[1])
    if node.kind == "pointwise" or node.op in ("_to_copy", "clone"):
        return full(node.type, _evaluate(node))
    return None


def _evaluate(node: Node):
    """The operator applied to one element of each constant operand, by the CPU backend."""
    from tilewise.backends.cpu import run as cpu_run
    from tilewise.compiler.meta import suspended
    from tilewise.device import cpu

    scalars = [from_array(np.asarray(s.args[1], dtype=s.type.dtype.np), s.type.dtype) for s in node.srcs]
    args = node.bound_args(scalars)
    with suspended():
        result = cpu_run(node.opdef, args, cpu) if node.op != "_to_copy" else scalars[0]._np()
    array = result._np() if type(result) is Tensor else np.asarray(result)
    return array.astype(node.type.dtype.np).reshape(()).item()


RULES = (_identity_view, _identity_chain, _identity_as_strided, _identity_copy, _identity_arithmetic, _full_cover,
         _read_back, _fold)


def simplify_node(node: Node) -> Node | None:
    changed = None
    while True:
        for rule in RULES:
            new = rule(node)
            if new is not None and new is not node:
                node = changed = new
                break
        else:
            return changed


def simplify(graph: Graph) -> Graph:
    return rewrite(graph, simplify_node)
