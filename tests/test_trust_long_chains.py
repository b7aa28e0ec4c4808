"""Long chains of operators: every graph walk of autograd and the compiler is iterative, so depth is bounded by
memory and time, not by Python's recursion limit (which nothing here raises).

Compiling a chain of about 250 pointwise operators used to raise RecursionError (expression splicing, kernel
IR, rendering and printing all recursed once per operator). The fast tests use chains of 2,000 operators,
eight times that; the slow ones the 10,000 of the issue, and print how long each took.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.compiler.capture import trace
from tilewise.compiler.ir import format_graph
from tilewise.compiler.passes import run_pipeline
from tilewise.config import settings
from tilewise.ops.expr import Expr, render_shared, render_text, substitute, toposort
from tilewise.profiler import explain as explain_module

LIMIT = sys.getrecursionlimit()


@pytest.fixture(autouse=True)
def recursion_limit_untouched():
    yield
    assert sys.getrecursionlimit() == LIMIT


def chain(x, ops: int):
    """``ops`` pointwise operators, alternating an affine step and a saturating one (values stay in range)."""
    for k in range(ops // 2):
        x = (x * 0.9 + 0.05) if k % 2 else (x + 0.5).tanh()
    return x


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- expressions

def test_expression_walks_take_any_depth():
    depth = 20_000
    x = Expr("input", (), 0)
    e = x
    for _ in range(depth):
        e = (e + 1.0).tanh()
    nodes = toposort(e)
    assert len(nodes) == 2 * depth + 2 and nodes[0] is x and nodes[-1] is e
    text = render_text(e)
    assert text.startswith("tanh(add(tanh(") and text.count("tanh(") == depth
    assert render_text(substitute(e, {id(x): Expr("input", (), 1)})).count("x1") == 1


def test_shared_subexpressions_print_once():
    """A tree print of a DAG doubles with every level that reuses its operand."""
    e = Expr("input", (), 0)
    for _ in range(60):
        e = e * e + 1.0
    shared, (text,) = render_shared([e])
    assert len(shared) == 59 and len(text) < 100 and sum(len(t) for _, t in shared) < 60 * 100


# ---------------------------------------------------------------------------- eager autograd

def test_eager_backward_through_10000_operators():
    started = time.perf_counter()
    x = tw.linspace(-2, 2, 16, requires_grad=True)
    chain(x, 10_000).sum().backward()
    seconds = time.perf_counter() - started
    reference = torch.linspace(-2, 2, 16, requires_grad=True)
    chain(reference, 10_000).sum().backward()
    close(x.grad.numpy(), reference.grad.numpy())
    print(f"\neager forward and backward of 10,000 operators: {seconds:.2f} s")


def test_double_backward_through_a_long_chain():
    x = tw.linspace(-2, 2, 8, requires_grad=True)
    (g,) = tw.autograd.grad(chain(x, 2000).sum(), x, create_graph=True)
    g.sum().backward()
    reference = torch.linspace(-2, 2, 8, requires_grad=True)
    (rg,) = torch.autograd.grad(chain(reference, 2000).sum(), reference, create_graph=True)
    rg.sum().backward()
    close(x.grad.numpy(), reference.grad.numpy(), 1e-4)


# ---------------------------------------------------------------------------- the compiler

def _compile_and_check(ops: int, backward: bool) -> float:
    x = tw.linspace(-2, 2, 16)

    def forward(x):
        return chain(x, ops)

    def step(x):
        loss = chain(x, ops).sum()
        loss.backward()
        return loss

    started = time.perf_counter()
    if backward:
        leaf = x.clone().requires_grad_(True)
        tw.compile(step)(leaf)
        got = leaf.grad.numpy()
        eager = x.clone().requires_grad_(True)
        step(eager)
        want = eager.grad.numpy()
    else:
        got = tw.compile(forward)(x).numpy()
        want = forward(x).numpy()
    seconds = time.perf_counter() - started
    close(got, want)
    return seconds


def test_compile_a_2000_operator_chain():
    _compile_and_check(2000, backward=False)


def test_compile_a_2000_operator_chain_with_its_backward():
    _compile_and_check(2000, backward=True)


@pytest.mark.slow
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
def test_compile_a_10000_operator_chain(backward):
    seconds = _compile_and_check(10_000, backward)
    print(f"\ncompile (C target) of a 10,000-operator chain, {'with' if backward else 'without'} its backward, "
          f"first call included: {seconds:.1f} s")


def test_long_sums_and_gathers_pass_the_indexing_rewrites():
    """``simplify_indexing`` looked through chains of additions and pushed gathers down pointwise chains by
    recursion."""
    def sums(x, y):
        for _ in range(2000):
            x = x + y
        return x

    def gathered(x, m, index):
        return (chain(x, 2000) * m).gather(1, index)

    x, y, m = tw.randn(4, 6), tw.randn(4, 6), tw.randn(4, 1)
    index = tw.tensor([[0], [3], [5], [1]])
    close(tw.compile(sums)(x, y).numpy(), sums(x, y).numpy(), 1e-4)
    close(tw.compile(gathered)(x, m, index).numpy(), gathered(x, m, index).numpy())


# ---------------------------------------------------------------------------- printing and explain

def test_the_graph_printer_and_the_logs_of_a_long_chain(capsys, monkeypatch):
    x = tw.randn(8)
    graph = trace(lambda x: chain(x, 2000), (x,), {}).graph
    assert format_graph(graph).count("\n") > 2000
    assert format_graph(run_pipeline(graph)).count("\n") > 2000
    monkeypatch.setattr(settings, "log", {"graph", "fusion", "kernels"})
    tw.compile(lambda x: chain(x, 2000))(x)
    assert capsys.readouterr().err.count("tanh") > 3000


def test_explain_a_long_chain():
    sections = dict(explain_module.explain(lambda x: chain(x, 2000), tw.randn(8), target="c", repeats=1,
                                           roofline_size=1 << 20, name="a chain of 2000 operators"))
    assert sections["generated C"].count("tanhf") >= 500
    assert any(title.endswith(": IR") and text.count("tanh") >= 500 for title, text in sections.items())
    assert "largest difference from eager" in sections["run"]
