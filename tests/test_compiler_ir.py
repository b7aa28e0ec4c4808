"""The graph IR and the passes, one at a time: hash-consing, text form, the checker, each rewrite."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.compiler.capture import trace
from tilewise.compiler.errors import DataDependentError
from tilewise.compiler.ir import Graph, GraphError, Node, Ref, TensorType, format_graph, verify
from tilewise.compiler.lowering.fusion import partition
from tilewise.compiler.passes import PIPELINE, cse, dce, decompose, functionalize, run_pipeline, simplify
from tilewise.compiler.program import lower_program
from tilewise.compiler.targets import CUDA_TARGET
from tilewise.config import settings
from tilewise.device import cpu
from tilewise.ops.registry import OPS

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


def test_the_pipeline_checks_each_pass_when_verification_is_on(monkeypatch):
    def reads_a_stray_value(graph):  # a broken pass: its output reads a value the graph never defines
        stray = Node("input", (), (), graph.inputs[0].type, tag="stray")
        wrong = Node("neg", (stray,), (Ref(0),), stray.type)
        return Graph(graph.inputs, [*graph.body, wrong], [wrong])

    g = graph_of(lambda x: -x, tw.ones(3))
    monkeypatch.setattr(settings, "verify", True)
    with pytest.raises(GraphError, match="not defined before it.*after pass 'reads_a_stray_value'"):
        run_pipeline(g, (reads_a_stray_value,))
    monkeypatch.setattr(settings, "verify", False)  # the default outside the tests: no checks, no cost
    run_pipeline(g, (reads_a_stray_value,))


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


def test_a_composite_called_again_alike_is_decomposed_once(monkeypatch):
    """Capture runs a composite's decomposition only to learn its results' types and strides: a later call that
    looks alike (every layer of a model) reuses them, one that differs in strides or in a number is decomposed."""
    op = OPS["normalize"]
    calls = []

    def counted(*args):
        calls.append(args[0].stride())
        return decomposition(*args)

    decomposition = op.decomposition
    monkeypatch.setattr(op, "decomposition", counted)
    strides = []

    def fn(x, y):
        for a in (x, y.t(), x.t(), y, x):
            strides.append(F.normalize(a).stride())
        strides.append(F.normalize(x, eps=1e-3).stride())

    g = graph_of(fn, tw.ones(4, 6), tw.ones(4, 6))
    assert ops(g).count("normalize") == 5  # normalize(x) twice is one node
    assert calls == [(6, 1), (1, 6), (6, 1)]
    assert strides == [(6, 1), (1, 6), (1, 6), (6, 1), (6, 1), (6, 1)]


def test_a_composite_recorded_op_by_op_is_decomposed_once_more_for_each_call_alike(monkeypatch):
    """A decomposition that returns an argument (a layer norm's backward gives its gradient as the bias's) is recorded
    op by op: tried once to learn that, then run for the record; a later call alike is only run for the record."""
    op = OPS["_layer_norm_backward"]
    calls = []

    def counted(*args):
        calls.append(args[1].shape)
        return decomposition(*args)

    decomposition = op.decomposition
    monkeypatch.setattr(op, "decomposition", counted)
    norms = [tw.nn.LayerNorm(8) for _ in range(3)]

    def fn(x):
        x = x * 2  # every norm's input and gradient alike: traced values that require grad, row-major
        for norm in norms:
            x = norm(x)
        (x * x).sum().backward()

    g = graph_of(fn, tw.ones(2, 8, requires_grad=True))
    assert len(calls) == 4
    assert "_layer_norm_backward" not in ops(g)


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


def test_compile_log_says_where_the_time_of_a_compile_went(capsys):
    from tilewise._stages import Stages, stage

    settings.log.add("compile")
    try:
        tw.compile(lambda x: x.softmax(-1))(tw.ones(4, 3))
    finally:
        settings.log.discard("compile")
    err = capsys.readouterr().err
    assert "compiled <lambda> (variant 1) and ran it once" in err
    lines = err.splitlines()
    for name in ("trace", "passes", "fuse", "schedule", "render", "first run"):
        assert any(line.startswith(f"  {name}: ") and line.endswith(" s") for line in lines), (name, err)
    for p in PIPELINE:  # each pass, indented under "passes"
        assert any(line.startswith(f"    {p.__name__}: ") for line in lines), (p.__name__, err)

    with Stages() as stages:  # nested stages add up under their parent, listed where they start
        for _ in range(2):
            with stage("outer"), stage("inner"):
                pass
    assert list(stages.seconds) == [("outer",), ("outer", "inner")] and stages.counts[("outer", "inner")] == 2
    with stage("no compile timed"):  # outside a compile: nothing recorded, nothing fails
        pass
    assert "(2 times)" in stages.report("t")


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


@pytest.mark.parametrize("shape,read", [((4, 4), lambda z: z.t()), ((3, 3, 3), lambda z: z.permute(2, 0, 1)),
                                        ((2, 5, 5), lambda z: z.transpose(1, 2))],
                         ids=["transpose", "permute", "batched-transpose"])
def test_a_value_made_again_is_read_where_its_reader_is_computed(shape, read):
    """``z = x * 2`` is stored by its own kernel (its sum needs it) and cheap to make again where
    ``(y + 1) * z.t()`` reads it; made again from ``x`` by position it gave the reader ``z[i, j]`` where
    ``z[j, i]`` was meant (a square shape passes every size check). It is made again only where its reader's
    nest reads it in place, else loaded."""
    def f(x, y):
        z = x * 2
        return (y + 1) * read(z), z.sum()

    x = tw.arange(float(np.prod(shape))).reshape(shape)
    y = tw.rand(*shape)
    expected = f(x, y)
    got = tw.compile(f)(x, y)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-6)


def test_kernels_run_in_the_order_the_function_made_their_values():
    """``g = h.sum(0)`` is needed only by the second output; ordered from the outputs, it ran after the whole chain
    that makes the first (two library calls and 80 tanh later) and kept ``h`` stored until
    then, as a batch norm's weight gradient kept its float32 output gradient through a ResNet's backward. In the
    function's order it is summed by the kernel that makes ``h``."""
    def f(x, a, w1, w2):
        h = x * a  # read twice and wider than itself: not made again
        g = h.sum(0)
        y = h @ w1
        for _ in range(80):
            y = y.tanh() * 0.99
        return (y @ w2).sum(), g

    args = tw.randn(64, 32), tw.randn(64, 32), tw.randn(32, 48), tw.randn(48, 16)
    low = lower_program(run_pipeline(graph_of(f, *args)), CUDA_TARGET)
    kernels = [[o.type.shape for o in node.args[0].outputs] for node in low.fused.body if node.op == "fused"]
    assert [(64, 32), (32,)] in kernels or [(32,), (64, 32)] in kernels, kernels
    got, want = tw.compile(f)(*args), f(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-3)


def test_gradient_clipping_scales_each_gradient_inside_the_optimizers_update():
    """clip_grad_norm_ scales every gradient, then AdamW updates every parameter: in the function's order the
    scaling of the first parameters comes long before their update, with no library call in between, so they
    still run as one kernel (the update reads the unscaled gradient) rather than the scaling storing a copy of
    every gradient for the update to read back."""
    tw.manual_seed(0)
    model = tw.nn.Sequential(*[tw.nn.Linear(16, 16) for _ in range(40)])
    opt = tw.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        tw.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    low = lower_program(run_pipeline(graph_of(step, tw.randn(8, 16))), CUDA_TARGET)
    names = [re.sub(r"^k\d+_", "", n.args[0].name) for n in low.fused.body if n.op == "fused"]
    assert "mul" not in names and any(n.startswith("mul_lerp_addcmul") for n in names), names


def test_a_layer_norms_weight_gradient_is_summed_from_its_operands_not_from_a_stored_product():
    """A layer norm's backward (over the forward's saved ``x_hat`` and ``rstd``): ``float(dy) * x_hat`` is
    read only by the weight gradient's column sum, so that sum makes it from ``dy`` (bfloat16) and ``x_hat``
    instead of the row kernel storing it as float32, and the weight and bias gradients become one column nest
    of the row kernel: one pass over ``dy``."""
    def backward(dy, x_hat, rstd, w):
        g = dy.float() * w
        dx = rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return dx.bfloat16(), (dy.float() * x_hat).sum(0), dy.float().sum(0)

    args = tw.randn(256, 64).bfloat16(), tw.randn(256, 64), tw.rand(256, 1), tw.randn(64)
    graph = run_pipeline(graph_of(backward, *args))
    low = lower_program(graph, CUDA_TARGET)
    assert len(low.kernels) == 1
    (kernel,) = low.kernels.values()
    assert [n.reduce for n in kernel.nests] == [(1,), (0,)] and len(kernel.nests[1].reductions) == 2
    assert [v.type.dtype.name for v in kernel.values if v.type.shape == (256, 64) and v not in graph.inputs] \
        == ["bfloat16"]  # dx only: the float32 product is not stored


def test_a_layer_norms_backward_makes_x_hat_again_from_its_input_and_row_statistics():
    """The backward of ``layer_norm(x + r)`` needs ``x_hat = (h - mean) * rstd``, a float32 tensor, and the
    weight gradient's column sum reads it too. The step stores ``h`` anyway (here it returns it, as the
    residual stream's next add would read it); making ``x_hat`` again from ``h`` and two numbers per row
    reads 4 bytes an element, where storing ``h - mean`` or ``x_hat`` and reading it back costs 8 (a row's
    statistics are made once for many elements, not once per element). So the only full-size tensors stored
    are ``h`` and ``x.grad``, and the step matches eager."""
    w, b = tw.randn(64, requires_grad=True), tw.randn(64, requires_grad=True)

    def step(x, r, dy):
        h = x + r
        tw.nn.functional.layer_norm(h, (64,), w, b).backward(dy)
        return h.detach(), x.grad, w.grad, b.grad

    x, r, dy = tw.randn(128, 64, requires_grad=True), tw.randn(128, 64), tw.randn(128, 64)
    low = lower_program(run_pipeline(graph_of(step, x, r, dy)), CUDA_TARGET)
    stored = [f"{k.name}.{p.name}" for k in low.kernels.values() for p, v in zip(k.params, k.values)
              if p.written and v.type.shape == (128, 64)]
    assert len(stored) == 2, stored
    cstep = tw.compile(step)
    results = []
    for fn in (cstep, step):
        w.grad = b.grad = x.grad = None
        results.append(fn(x, r, dy))
    for got, expected in zip(*results):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- indexing rewrites

def _step_graph(fn, *args):
    """The pipeline's graph of ``fn`` run as a whole step (forward and ``backward``) on the CPU target."""
    return run_pipeline(graph_of(fn, *args))


def test_cross_entropy_gathers_its_row_statistics_not_the_log_softmax():
    """nll reads one log-probability per row: the gather moves below log_softmax's pointwise tail, onto the
    logits, and the backward's one-hot scatter becomes a select over an arange, so no (N, C) log-softmax or
    scattered gradient is materialised, and the step still matches eager."""
    tw.manual_seed(0)
    x = tw.randn(6, 50, requires_grad=True)
    y = tw.randint(0, 50, (6,))

    def step(x, y):
        loss = tw.nn.functional.cross_entropy(x, y)
        loss.backward()
        return loss.detach(), x.grad

    g = _step_graph(step, x, y)
    gathers = [n for n in g.body if n.op == "gather"]
    assert [n.srcs[0] for n in gathers] == [g.inputs[0]] and gathers[0].type.shape == (6, 1)
    assert not [n for n in g.body if n.op.startswith("scatter")]
    assert "arange" in ops(g)
    cstep = tw.compile(step)
    x.grad = None
    loss, grad = cstep(x, y)
    x.grad = None
    loss_e, grad_e = step(x, y)
    assert loss.item() == pytest.approx(loss_e.item(), rel=1e-6)
    assert abs(grad - grad_e).max().item() < 1e-6


def test_a_scatter_becomes_a_select_only_where_a_gather_checks_its_index():
    idx = tw.tensor([[1], [0], [3]])

    def scatter_only(base, src):
        return base.scatter(1, idx, src)

    def gathered_too(base, src):
        return base.scatter(1, idx, src) + base.gather(1, idx).sum()

    base, src = tw.randn(3, 4), tw.randn(3, 1)
    assert "scatter.src" in ops(run_pipeline(graph_of(scatter_only, base, src)))
    g = run_pipeline(graph_of(gathered_too, base, src))
    assert "scatter.src" not in ops(g) and "where.self" in ops(g)
    out = tw.compile(gathered_too)(base, src)
    assert np.array_equal(out.numpy(), gathered_too(base, src).numpy())


def test_scatter_add_and_value_as_selects():
    idx = tw.tensor([[2, 0], [1, 1]]).view(2, 1, 2)  # one index per (row, column): size 1 along dim 1

    def f(base, src):
        checked = base.gather(1, idx).sum()
        return base.scatter_add(1, idx, src) * 2 + base.scatter(1, idx, 7.0) + checked

    base, src = tw.randn(2, 3, 2), tw.randn(2, 1, 2)
    g = run_pipeline(graph_of(f, base, src))
    assert not [n for n in g.body if n.op.startswith("scatter")]
    np.testing.assert_allclose(tw.compile(f)(base, src).numpy(), f(base, src).numpy(), rtol=1e-6)


def test_gradients_of_an_unbind_sum_to_a_cat():
    """q, k, v = qkv.unbind(0) and slices of one dim: autograd's zero-filled view scatters, summed, become one
    cat when the views tile the buffer; views that leave a gap stay view scatters."""

    def unbound(qkv):
        q, k, v = qkv.unbind(0)
        (q * 2 + k.exp() + v.sin()).sum().backward()
        return qkv.grad

    def sliced(x):
        a, b, c = x[:, :2], x[:, 2:3], x[:, 3:]
        (a.exp().sum() + b.sum() * 3 + c.cos().sum()).backward()
        return x.grad

    def gap(x):
        (x[:, :2].exp().sum() + x[:, 3:].cos().sum()).backward()
        return x.grad

    for fn, shape, cat in ((unbound, (3, 4, 5), True), (sliced, (4, 5), True), (gap, (4, 5), False)):
        x = tw.randn(*shape, requires_grad=True)
        g = _step_graph(fn, x)
        assert ("cat" in ops(g)) is cat and ("view_scatter_add" not in ops(g)) is cat, fn.__name__
        x.grad = None
        got = tw.compile(fn)(x)
        x.grad = None
        np.testing.assert_allclose(got.numpy(), fn(x).numpy(), rtol=1e-6, err_msg=fn.__name__)


def test_a_scatter_into_zeros_reads_them_as_one_broadcast_element():
    def embedding_grad(idx, grad):
        return tw.zeros(5, 3).index_put((idx,), grad, True) * 2

    idx, grad = tw.tensor([0, 2, 0]), tw.randn(3, 3)
    g = run_pipeline(graph_of(embedding_grad, idx, grad))
    put = next(n for n in g.body if n.op == "index_put")
    assert put.srcs[0].op == "expand" and put.srcs[0].srcs[0].type.shape == ()
    np.testing.assert_allclose(tw.compile(embedding_grad)(idx, grad).numpy(), embedding_grad(idx, grad).numpy())


def test_index_index_put_and_cat_types_come_from_rules_that_agree_with_the_kernels():
    """Capture types advanced indexing, index_put and cat from their operands' shapes (the kernels would run on
    full-size stand-ins otherwise: an embedding gradient's 50304x768 index_put took a third of a second); each
    rule agrees with what the kernel makes, and what only the kernel can judge is left to it."""
    from tilewise.compiler import meta
    from tilewise.ops.registry import OPS

    rng = np.random.default_rng(0)
    x = tw.randn(5, 6, 7, 8)

    def idx(*shape):
        return tw.tensor(rng.integers(0, 5, shape))

    index, index_put, cat = OPS["index.Tensor"], OPS["index_put"], OPS["cat"]
    for indices in [(None, idx(3)), (idx(3),), (idx(2, 3), idx(3)), (idx(3), None, idx(3)), (None, idx(2, 1), idx(4)),
                    (idx(3), None, None, idx(3)), (None, None, None, idx(2)), (idx(1), idx(4), idx(4), idx(4))]:
        made = meta._run_on_zeros(index, (x, indices))
        assert meta._index(index, (x, indices), x.device) == TensorType(made.shape, made.dtype, x.device)
        values = tw.randn(*made.shape[-2:])
        assert meta._index(index_put, (x, indices, values, True), x.device).shape == x.shape
    assert meta._index(index_put, (x, (idx(3),), tw.randn(2, 2), False), x.device) is None  # the kernel raises
    assert meta._index(index, (x, (tw.tensor([True, False, True, False, True]),)), x.device) is None  # a mask
    for parts, dim in [((tw.randn(2, 3), tw.randn(4, 3).bfloat16()), 0), ((tw.randn(2, 3), tw.randn(2, 5).double()), 1),
                       ((tw.randn(0), tw.randn(2, 3)), 0)]:
        made = meta._run_on_zeros(cat, (parts, dim))
        assert meta._copy(cat, (parts, dim), x.device) == TensorType(made.shape, made.dtype, x.device)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match except in dimension 0"):  # torch's words
        meta._copy(cat, ((tw.randn(2, 3), tw.randn(2, 4)), 0), x.device)


def test_a_compile_pauses_the_cyclic_collector_and_restores_it():
    import gc

    from tilewise._stages import collector_paused

    seen = []

    def step(x):
        seen.append(gc.isenabled())  # traced: this runs during the compile
        return (x * 2).sum()

    assert gc.isenabled()
    tw.compile(step)(tw.ones(3))
    assert seen == [False] and gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a collector the user turned off stays off
    finally:
        gc.enable()


def test_a_negative_zero_constant_is_its_own_expression_and_keeps_its_sign_compiled():
    """Expressions are hash-consed, and -0.0 == 0.0 in Python: merged, a kernel compiled after another held the
    other zero's sign (``t * -0.0`` gave +0.0 once ``t * 0.0`` had been compiled in the process)."""
    from tilewise.ops.expr import Expr

    assert Expr("const", (), 0.0) is not Expr("const", (), -0.0)
    assert Expr("const", (), 0.5) is Expr("const", (), 0.5)
    x = tw.ones(4)
    positive = tw.compile(lambda t: t * 0.0)(x)
    negative = tw.compile(lambda t: t * -0.0)(x)
    assert not np.signbit(positive.numpy()).any() and np.signbit(negative.numpy()).all()
