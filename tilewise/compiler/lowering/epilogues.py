"""gemm_epilogues: a matrix product, its bias and its activation as one cuBLASLt call (CUDA target).

``add(mm(a, b), bias)`` with a bias of one value per output column becomes ``addmm(bias, a, b)``, and a
ReLU or a tanh-approximated GELU of that sum ``_addmm_activation(bias, a, b, use_gelu=...)``: cuBLASLt
adds the bias and applies the activation while it writes the product (its BIAS, RELU_BIAS and GELU_BIAS
epilogues), so the product is written once instead of written, read back by a fused kernel and written
again. A step only joins when nothing else reads the value it consumes (the product, or the sum before
the activation); otherwise that value must exist in memory anyway and the fused kernel stays. A product
viewed with other leading dims before the bias is added (a linear layer over a 3-D input) joins too: the
call's result is viewed instead.

A training step reads the sum before a tanh GELU again in its backward, so there the forward becomes
``_addmm_gelu``, one call writing both the GELU and its input (cuBLASLt's GELU_AUX_BIAS). The backward's
``gelu_backward(mm(a, b), pre)`` becomes ``_mm_gelu_backward``, one call applying GELU's derivative to the
product as it writes it (DGELU). See [Note: GELU epilogues with a second matrix] in
``backends/cuda/matmul.py``.

The C target folds only the bias, and only in float16 and bfloat16: ``bias_into_product`` makes the same
``addmm``, which the CPU backend computes in float32 and rounds once, as torch's CPU ``linear`` does (see [Note: a
product and its bias, rounded once] in ``backends/cpu/kernels.py``); a product rounded before its bias is added
differs from torch's in the last bit.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, Node, Ref, TensorType, in_program_order
from tilewise.compiler.lowering.recompute import RECOMPUTED

DTYPES = ("float32", "float16", "bfloat16")


def _readers(graph: Graph) -> dict[Node, int]:
    count: dict[Node, int] = {}
    for node in graph.body:
        for s in node.srcs:
            count[s] = count.get(s, 0) + 1
    for v in [*graph.outputs, *(v for _, v in graph.writes)]:
        count[v] = count.get(v, 0) + 2  # a value the caller sees must exist
    return count


def _bias_add(node: Node, readers: dict) -> tuple[Node, Node, Node | None] | None:
    """(product, bias, reshape) when ``node`` adds a per-column bias to a product only it reads, or to a
    reshape of it that keeps its columns (a linear layer over [batch, time, features] multiplies the
    [batch * time, features] view of its input and views the product back): ``reshape`` is that view."""
    if node.op != "add" or len(node.srcs) != 2 or node.args[2:] not in ((), (1,)):
        return None
    for value, bias in (node.srcs, node.srcs[::-1]):
        prod = _product_of(value, readers)
        if (prod is not None and bias.type.shape == prod.type.shape[-1:] and bias.type.dtype == prod.type.dtype
                and bias.type.device == prod.type.device and node.type == value.type):
            return prod, bias, value if value is not prod else None
    return None


def _activation(node: Node) -> str | None:
    if node.op == "relu":
        return "relu"
    if node.op == "gelu" and node.args[1:] == ("tanh",):
        return "gelu"
    return None


def _product_of(value: Node, readers: dict) -> Node | None:
    """The ``mm`` that ``value`` is, or is a view of keeping its columns, when nothing else reads it."""
    if value.op == "view" and readers.get(value) == 1:
        value = value.srcs[0] if value.type.shape[-1:] == value.srcs[0].type.shape[-1:] else value
    if value.op == "mm" and readers.get(value) == 1 and value.type.dtype.name in DTYPES:
        return value
    return None


def _tuple(op: str, operands: tuple, types: tuple) -> tuple[Node, ...]:
    call = Node(op, operands, tuple(Ref(i) for i in range(len(operands))), types)
    return tuple(Node("getitem", (call,), (k,), t) for k, t in enumerate(types))


def _like(value: Node, shape: tuple) -> Node:
    """``value`` viewed with ``shape`` (itself when it has that shape)."""
    if value.type.shape == shape:
        return value
    if value.op == "view" and value.srcs[0].type.shape == shape:
        return value.srcs[0]
    return Node("view", (value,), (Ref(0), shape), TensorType(shape, value.type.dtype, value.type.device))


def gemm_epilogues(graph: Graph) -> Graph:
    readers = _readers(graph)
    gelu_of: dict[Node, Node] = {}  # a GELU's input -> the GELU (not a recomputation of it in the backward)
    for n in graph.body:
        if _activation(n) == "gelu" and n.tag != RECOMPUTED:
            gelu_of.setdefault(n.srcs[0], n)
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}
    later: dict[Node, Node] = {}  # a node already replaced by a call made when an earlier node was visited
    for node in graph.body:
        if node in later:
            mapping[node] = later[node]
            continue
        srcs = tuple(mapping[s] for s in node.srcs)
        new = node.replace(srcs=srcs) if srcs != node.srcs else node
        if new.op == "view" and new.srcs[0].op == "view" and new.srcs[0].srcs[0].type.shape == new.type.shape:
            new = new.srcs[0].srcs[0]  # a call's result viewed back to its own shape (made by the rules below)
        act = _activation(node)
        inner = node.srcs[0] if act is not None else node
        found = _bias_add(inner, readers) if act is None or readers.get(inner) == 1 else None
        if found is not None and act is None and node in gelu_of and readers.get(node, 0) > 1:
            # a GELU's input that something else reads too (its backward): one call writes both
            prod, bias, reshape = found
            out, pre = _tuple("_addmm_gelu", (mapping[bias], mapping[prod.srcs[0]], mapping[prod.srcs[1]]),
                              (prod.type, prod.type))
            new = reshape.replace(srcs=(pre,)) if reshape is not None else pre
            later[gelu_of[node]] = reshape.replace(srcs=(out,)) if reshape is not None else out
        elif found is not None:
            prod, bias, reshape = found
            operands = (mapping[bias], mapping[prod.srcs[0]], mapping[prod.srcs[1]])
            refs = (Ref(0), Ref(1), Ref(2), 1, 1)
            new = (Node("_addmm_activation", operands, (*refs, act == "gelu"), prod.type) if act is not None
                   else Node("addmm", operands, refs, prod.type))
            if reshape is not None:
                new = reshape.replace(srcs=(new,))
        elif node.op == "gelu_backward" and node.args[2:] == ("tanh",) and all(
                s.type == node.type for s in node.srcs):
            prod = _product_of(node.srcs[0], readers)
            if prod is not None:
                operands = (mapping[prod.srcs[0]], mapping[prod.srcs[1]], _like(mapping[node.srcs[1]], prod.type.shape))
                new = _like(Node("_mm_gelu_backward", operands, (Ref(0), Ref(1), Ref(2)), prod.type), node.type.shape)
        mapping[node] = new
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    out.body = in_program_order([mapping[n] for n in graph.body], out)
    return out


def bias_into_product(graph: Graph) -> Graph:
    """Each float16 or bfloat16 ``add(mm(a, b), bias)`` (through a view of the product too) as ``addmm``."""
    readers = _readers(graph)
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}
    for node in graph.body:
        srcs = tuple(mapping[s] for s in node.srcs)
        new = node.replace(srcs=srcs) if srcs != node.srcs else node
        low_precision = node.op == "add" and node.type.dtype.name in ("float16", "bfloat16")
        found = _bias_add(node, readers) if low_precision else None
        if found is not None:
            prod, bias, reshape = found
            new = Node("addmm", (mapping[bias], mapping[prod.srcs[0]], mapping[prod.srcs[1]]),
                       (Ref(0), Ref(1), Ref(2), 1, 1), prod.type)
            new = reshape.replace(srcs=(new,)) if reshape is not None else new
        mapping[node] = new
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    out.body = in_program_order([mapping[n] for n in graph.body], out)
    return out
