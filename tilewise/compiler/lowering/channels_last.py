"""channels_last: convolutions and the element-wise work around them in channels-last memory (CUDA target).

[Note: channels-last programs] cuDNN's tensor-core convolutions work in channels-last memory (NHWC); given
row-major NCHW operands they transpose around the kernel or pick slower kernels (measured on an H200 over
ResNet-50's bf16 convolutions: 2.17 ms NCHW against 1.32 ms NHWC forward). Values of the graph IR are laid
out row-major in their logical shape, so a value kept channels-last is a value whose logical shape is the
channels-last permutation (N, H, W, C), seen by its readers through a ``permute`` view back to (N, C, H, W):

* each 2-D/3-D convolution (forward, input and weight gradients, transposed) becomes its ``_channels_last``
  operator, whose result is laid out (N, H, W, C) — cuDNN writes it there — followed by that permute view;
  its operands are read as channels-last views, and an operand that is not already one (the image, a weight)
  is copied into one first (a ``clone`` that fusion folds into the kernel producing the operand, or a
  transposing copy);
* an element-wise operator with a full-rank operand that is such a view is rebuilt on the channels-last
  values (every operand seen through the inverse permute), so batch norm's scaling, ReLU, the residual add
  and their gradients keep the layout and read and write memory in order, and a convolution's input is the
  value itself rather than a copy; a statistic (a reduction over N, H, W) reads the channels-last value through
  its view, which the scheduler sums as columns.
Everything else reads the values through their views as it would any strided value; a view chain that
cannot express the permutation (a reshape that merges H and C) gets a contiguous copy (``legalize_views``).
An input of rank 4 or 5 read through the permute from (N, *S, C) to (N, C, *S) is such a value too (a fused
composite's channels-last argument), and a result permuted to (N, *S, C) at the end is the value itself. The
values made here are marked for fusion, which must not map them by position onto a nest built in the other
order ([Note: value orders] in ``orders.py``).
"""

from __future__ import annotations

from tilewise.compiler.formats import from_channels_last, to_channels_last
from tilewise.compiler.ir import Graph, Node, Ref, TensorType, rewrite
from tilewise.compiler.lowering.fusion import fusion_kind
from tilewise.compiler.lowering.orders import mark_channels_last, order_of
from tilewise.compiler.passes.layout import legalize_views

CONVOLUTIONS = frozenset(f"{name}{suffix}" for n in (2, 3) for name in (f"_conv{n}d", f"_conv_transpose{n}d")
                         for suffix in ("", "_backward_input", "_backward_weight"))
SUFFIX = "_channels_last"


def _permuted(ty: TensorType, dims: tuple) -> TensorType:
    return TensorType(tuple(ty.shape[d] for d in dims), ty.dtype, ty.device)


def _permute(value: Node, dims: tuple) -> Node:
    return Node("permute", (value,), (Ref(0), dims), _permuted(value.type, dims))


class _Layouts:
    def __init__(self, inputs) -> None:
        # values laid out (N, *S, C) standing for an (N, C, *S) value; an input of rank 4 or 5 may be one (a
        # channels-last argument of a fused composite, see ``compiler.composites``): it is one exactly where it is
        # read through the permute back to (N, C, *S)
        self.native: set[Node] = {n for n in inputs if len(n.type.shape) in (4, 5)}

    def is_view(self, value: Node) -> bool:
        """``value`` is the NCHW view of a channels-last value."""
        if value.op != "permute":
            return False
        rank = len(value.type.shape)
        return (value.srcs[0] in self.native
                and tuple(value.args[1]) == from_channels_last(rank))

    def channels_last(self, value: Node, rank: int) -> Node:
        """``value`` (of rank ``rank`` or less, broadcast) seen in the channels-last order of rank ``rank``."""
        if self.is_view(value):
            return value.srcs[0]
        if len(value.type.shape) < rank:
            shape = (1,) * (rank - len(value.type.shape)) + value.type.shape
            value = Node("view", (value,), (Ref(0), shape), TensorType(shape, value.type.dtype, value.type.device))
        return _permute(value, to_channels_last(rank))

    def operand(self, value: Node, rank: int) -> Node:
        """A convolution's operand as an NCHW view of a dense channels-last value (copied into one if need be)."""
        if self.is_view(value):
            return value
        copy = Node("clone", (self.channels_last(value, rank),), (Ref(0), None),
                    _permuted(value.type, to_channels_last(rank)))
        self._made(copy)
        return _permute(copy, from_channels_last(rank))

    def _made(self, value: Node) -> None:
        self.native.add(value)
        mark_channels_last(value)  # see [Note: value orders]

    def rewrite(self, node: Node) -> Node | None:
        if node.is_tuple:  # several results (attention with its statistics, ...): their type is a tuple
            return None
        rank = len(node.type.shape)
        if rank not in (4, 5):
            return None
        if node.op == "permute" and self.is_view(node.srcs[0]) and tuple(node.args[1]) == to_channels_last(rank):
            return node.srcs[0].srcs[0]  # a channels-last value seen back in its own order
        if node.op in CONVOLUTIONS:
            srcs = tuple(self.operand(s, rank) for s in node.srcs)
            conv = Node(node.op + SUFFIX, srcs, node.args, _permuted(node.type, to_channels_last(rank)), node.tag)
            self._made(conv)
            return _permute(conv, from_channels_last(rank))
        if fusion_kind(node) == "elementwise" and any(
                self.is_view(s) and len(s.type.shape) == rank for s in node.srcs):
            srcs = tuple(self.channels_last(s, rank) for s in node.srcs)
            value = Node(node.op, srcs, node.args, _permuted(node.type, to_channels_last(rank)), node.tag)
            self._made(value)
            return _permute(value, from_channels_last(rank))
        return None


def channels_last(graph: Graph) -> Graph:
    """Keep 2-D/3-D convolutions, and the element-wise operators that read their results, channels-last (see
    [Note: channels-last programs]); a graph without them is returned as it is."""
    layouts = _Layouts(graph.inputs)
    if not any((n.op in CONVOLUTIONS and len(n.type.shape) in (4, 5)) or layouts.is_view(n) for n in graph.body):
        return graph
    return legalize_views(rewrite(graph, layouts.rewrite), rebuilt=_keep_mark)


def _keep_mark(old: Node, new: Node) -> None:
    """A channels-last value rebuilt on a copied source (``legalize_views``) is still one."""
    if order_of(old) == "channels_last":
        mark_channels_last(new)
