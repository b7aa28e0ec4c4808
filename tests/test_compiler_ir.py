"""The graph IR and the passes, one at a time: hash-consing, text form, the checker, each rewrite."""

from __future__ import annotations

import re

import pytest

import tilewise as tw
from tilewise.compiler.capture import DataDependentError, trace
from tilewise.compiler.ir import Graph, GraphError, Node, Ref, TensorType, format_graph, verify
from tilewise.compiler.passes import PIPELINE, cse, dce, decompose, functionalize, run_pipeline, simplify
from tilewise.compiler.passes.fusion import partition
from tilewise.config import settings
from tilewise.device import cpu

F32 = TensorType((4, 4), tw.float32, cpu)


def graph_of(fn, *args) -> Graph:
    return trace(fn, args, {}).graph


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.body]


def test_nodes_are_hash_consed():
    x = Node("input", (), (), F32, tag="x")
    a = Node("add", (x,), (Ref(0), 1.0, 1), F32)
    assert Node("add", (x,), (Ref(0), 1.0, 1), F32) is a
    assert Node("add", (x,), (Ref(0), 1, 1), F32) is not a  # 1 and 1.0 promote differently
    assert Node("input", (), (), F32, tag="y") is not x


def test_random_draws_stay_distinct():
    g = graph_of(lambda x: x + tw.rand(4, 4) - tw.rand(4, 4), tw.ones(4, 4))
    assert ops(g).count("uniform") == 2


def test_text_form():
    text = format_graph(graph_of(lambda x: (x.relu() * 0.5 + 1.0).sum(1), tw.ones(4, 4)))
    assert "%0 = input(x) : f32[4,4] cpu" in text
    assert "%2 = mul(%1, 0.5) : f32[4,4] cpu" in text
    assert "%3 = add(%2, 1.0) : f32[4,4] cpu" in text
    assert re.search(r"%4 = sum\(%3, \(1,\)\) : f32\[4\] cpu", text)
    assert "return (%4)" in text


def test_verify_rejects_malformed_graphs():
    x = Node("input", (), (), F32, tag="x")
    y = Node("input", (), (), F32, tag="y")
    a = Node("neg", (y,), (Ref(0),), F32)
    with pytest.raises(GraphError, match="not defined before it"):
        verify(Graph([x], [a], [a]))
    bad = Node("add", (x, x), (Ref(0), Ref(1), 1), TensorType((4, 5), tw.float32, cpu))
    with pytest.raises(GraphError, match="broadcast shape"):
        verify(Graph([x], [bad], [bad]))
    half = Node("neg", (x,), (Ref(0),), TensorType((4, 4), tw.float16, cpu))
    with pytest.raises(GraphError, match="write-back"):
        verify(Graph([x], [half], [], [(x, half)]))


def test_functionalize_turns_writes_into_values_and_write_backs():
    def f(x):
        x.mul_(2)
        x[0] = 1.0
        return x + 1

    g = graph_of(f, tw.ones(3, 3))
    assert "_write_" in ops(g) and g.writes
    g = functionalize(g)
    verify(g)
    assert "_write_" not in ops(g)
    assert g.writes[0][0] is g.inputs[0]


def test_decompose_expands_composites_to_primitives():
    g = graph_of(lambda x: x.softmax(-1), tw.ones(4, 4))
    assert ops(g) == ["softmax"]
    g = dce(decompose(g))
    assert ops(g) == ["amax", "sub", "exp", "sum", "div"]


def test_simplify_identities_and_constant_folding():
    def f(x):
        one = tw.ones(4, 4)
        return (x * 1 + 0) * (one * 3 - 1).exp().log() + x.t().t() - 0

    g = dce(simplify(functionalize(graph_of(f, tw.ones(4, 4)))))
    assert ops(g) == ["full", "mul", "add"]
    assert g.body[0].args[1] == pytest.approx(2.0)


def test_cse_merges_what_rewrites_made_equal():
    g = graph_of(lambda x: (x * 1).exp() + x.exp(), tw.ones(4, 4))
    assert ops(g).count("exp") == 2
    g = dce(cse(simplify(g)))
    assert ops(g).count("exp") == 1


def test_dce_drops_dead_code():
    def f(x):
        x.exp()
        return x + 1

    g = graph_of(f, tw.ones(2))
    assert "exp" in ops(g) and "exp" not in ops(dce(g))


def test_pipeline_logs_every_pass(capsys):
    settings.log.add("graph")
    try:
        run_pipeline(graph_of(lambda x: x.softmax(0), tw.ones(3)))
    finally:
        settings.log.discard("graph")
    err = capsys.readouterr().err
    for p in PIPELINE:
        assert f"after {p.__name__}" in err


def test_captured_parameters_become_named_inputs():
    layer = tw.nn.Linear(3, 2)
    names = {id(p): n for n, p in layer.named_parameters()}
    g = trace(layer.forward, (tw.ones(5, 3),), {}, names=names).graph
    assert [n.tag for n in g.inputs] == ["input", "weight", "bias", "d_out0"]  # d_out0: the output gradient


def test_data_dependent_operations_are_refused():
    with pytest.raises(DataDependentError, match="nonzero"):
        graph_of(lambda x: x.nonzero(), tw.ones(3))
    with pytest.raises(DataDependentError, match="item"):
        graph_of(lambda x: x * x.sum().item(), tw.ones(3))


def test_fusion_groups_softmax_forward_and_backward():
    x = tw.randn(8, 16, requires_grad=True)

    def f(x):
        y = x.softmax(-1)
        return tw.autograd.grad([y], [x], [tw.ones(8, 16)])

    groups = partition(run_pipeline(graph_of(f, x)))
    assert len(groups) == 1
    assert groups[0].shape == (8, 16) and groups[0].reduce == (1,)
