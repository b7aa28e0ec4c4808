"""Where a graph value's elements lie on its buffer: the chain of views from the value that owns the buffer, and
the (shape, strides, offset) those views' rules give. Fusion reads it to find memory order; lowering and the
programs read it to address operands."""
from __future__ import annotations

from tilewise import strides as S
from tilewise.codegen.kernel_ir import LoweringError
from tilewise.compiler.ir import Node


def view_chain(node: Node) -> tuple[Node, list[Node]]:
    """The first non-view ancestor of ``node`` and the views leading from it to ``node``."""
    chain = []
    while node.kind == "view":
        chain.append(node)
        node = node.srcs[0]
    return node, chain[::-1]


def buffer_of(value: Node) -> Node:
    """The graph value whose buffer holds ``value`` (views read their base's buffer): ``view_chain``'s first
    part, found without the list of views (fusion asks for it some hundred thousand times in a GPT-2 step)."""
    while value.kind == "view":
        value = value.srcs[0]
    return value


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
