"""gemm_epilogues: a matrix product, its bias and its activation as one cuBLASLt call (CUDA target).

``add(mm(a, b), bias)`` with a bias of one value per output column becomes ``addmm(bias, a, b)``, and a
ReLU or a tanh-approximated GELU of that sum ``_addmm_activation(bias, a, b, use_gelu=...)``: cuBLASLt
adds the bias and applies the activation while it writes the product (its BIAS, RELU_BIAS and GELU_BIAS
epilogues), so the product is written once instead of written, read back by a fused kernel and written
again. A step only joins when nothing else reads the value it consumes (the product, or the sum before
the activation); otherwise that value must exist in memory anyway and the fused kernel stays. A product
viewed with other leading dims before the bias is added (a linear layer over a 3-D input) joins too: the
call's result is viewed instead.
"""

from __future__ import annotations

from tilewise.compiler.ir import Graph, Node, Ref, toposort

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
        prod, reshape = value, None
        if value.op == "view" and readers.get(value) == 1 and value.srcs[0].op == "mm" \
                and value.type.shape[-1:] == value.srcs[0].type.shape[-1:]:
            prod, reshape = value.srcs[0], value
        if (prod.op == "mm" and readers.get(prod) == 1 and prod.type.dtype.name in DTYPES
                and bias.type.shape == prod.type.shape[-1:] and bias.type.dtype == prod.type.dtype
                and bias.type.device == prod.type.device and node.type == value.type):
            return prod, bias, reshape
    return None


def _activation(node: Node) -> str | None:
    if node.op == "relu":
        return "relu"
    if node.op == "gelu" and node.args[1:] == ("tanh",):
        return "gelu"
    return None


def gemm_epilogues(graph: Graph) -> Graph:
    readers = _readers(graph)
    mapping: dict[Node, Node] = {n: n for n in graph.inputs}
    for node in graph.body:
        srcs = tuple(mapping[s] for s in node.srcs)
        new = node.replace(srcs=srcs) if srcs != node.srcs else node
        act = _activation(node)
        inner = node.srcs[0] if act is not None else node
        found = _bias_add(inner, readers) if act is None or readers.get(inner) == 1 else None
        if found is not None:
            prod, bias, reshape = found
            operands = (mapping[bias], mapping[prod.srcs[0]], mapping[prod.srcs[1]])
            refs = (Ref(0), Ref(1), Ref(2), 1, 1)
            new = (Node("_addmm_activation", operands, (*refs, act == "gelu"), prod.type) if act is not None
                   else Node("addmm", operands, refs, prod.type))
            if reshape is not None:
                new = reshape.replace(srcs=(new,))
        mapping[node] = new
    out = Graph(list(graph.inputs), [], [mapping[o] for o in graph.outputs],
                [(i, mapping[v]) for i, v in graph.writes])
    out.body = toposort([mapping[o] for o in graph.outputs] + [mapping[v] for _, v in graph.writes],
                        stop=set(graph.inputs))
    return out
