"""Autograd semantics against torch: graph structure, accumulation, higher order, grad modes, hooks,
custom Functions, the version-counter guard, in-place writes through views, and checkpointing."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.utils.checkpoint import checkpoint


def both(array, requires_grad=True):
    """The same float64 data as a tilewise and a torch tensor."""
    array = np.asarray(array, dtype=np.float64)
    return (tw.tensor(array, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad))


def close(a, b, **kw):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12, **kw)


# ---------------------------------------------------------------------------- leaves and graph structure

def test_leaf_and_non_leaf():
    x = tw.ones(2, requires_grad=True)
    y = x * 2
    assert x.is_leaf and x.grad_fn is None and x.requires_grad
    assert not y.is_leaf and y.requires_grad
    c = tw.ones(2)
    assert c.is_leaf and not c.requires_grad and (c * 2).is_leaf
    y.sum().backward()
    assert x.grad is not None and y.grad is None  # non-leaf grads are not kept unless retain_grad()


def test_grad_fn_names_and_next_functions_match_torch():
    graphs = []
    for lib in (tw, torch):
        x = lib.ones(2, 2, requires_grad=True)
        w = lib.ones(2, 2, requires_grad=True)
        loss = ((x * 2) @ w).exp().sum()
        graphs.append(_describe(loss.grad_fn))
    assert graphs[0] == graphs[1]
    assert graphs[0][0] == "SumBackward0"


def _describe(node, depth=0):
    """(name, children) of a graph, children as (description, output_nr) pairs."""
    if node is None:
        return None
    name = node.name().removeprefix("torch::autograd::")
    return (name, tuple((_describe(n, depth + 1), nr) for n, nr in node.next_functions))


def test_mul_by_scalar_edge_is_none_and_leaf_is_accumulate_grad():
    x = tw.ones(3, requires_grad=True)
    nodes = (x * 2).grad_fn.next_functions
    assert nodes[0][0].name() == "AccumulateGrad" and nodes[0][0].variable is x
    assert nodes[1] == (None, 0)
    assert (x * 3).grad_fn.next_functions[0][0] is nodes[0][0]  # one AccumulateGrad per leaf


def test_grad_accumulates_across_backward_calls():
    (x, tx) = both([1.0, 2.0, 3.0])
    for t in (x, tx):
        (t * t).sum().backward()
        (t * 3).sum().backward()
    close(x.grad, tx.grad)
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0, 9.0])
    x.grad = None
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0, 1.0])


def _clones_during(fn) -> int:
    """How many clone ops ``fn`` dispatches."""
    from tilewise import dispatch

    seen, run = [], dispatch.run

    def counting(op, args):
        seen.append(op.name)
        return run(op, args)

    dispatch.run = counting
    try:
        fn()
    finally:
        dispatch.run = run
    return seen.count("clone")


def test_a_gradient_only_the_engine_holds_becomes_grad_without_a_copy():
    w, tw_ = both(np.arange(12.0).reshape(4, 3))
    x = np.linspace(-1, 1, 20).reshape(5, 4)
    assert _clones_during(lambda: (tw.tensor(x) @ w).sum().backward()) == 0
    (torch.tensor(x) @ tw_).sum().backward()
    close(w.grad, tw_.grad)
    before = w.grad.numpy().copy()
    assert _clones_during(lambda: (tw.tensor(x) @ w).sum().backward()) == 0  # the second one adds
    np.testing.assert_allclose(w.grad.numpy(), 2 * before)


def test_a_gradient_held_elsewhere_is_copied_into_grad():
    # add hands the same gradient tensor to both leaves: each .grad must be its own memory
    a, b = both([1.0, 2.0])[0], both([3.0, 4.0])[0]
    (a + b).sum().backward()
    a.grad.mul_(10)
    np.testing.assert_allclose(b.grad.numpy(), [1.0, 1.0])
    # a gradient the caller passed in and still holds
    c = both([1.0, 2.0])[0]
    g = tw.tensor([5.0, 6.0], dtype=tw.float64)
    (c + 0).backward(g)
    g.mul_(0)
    np.testing.assert_allclose(c.grad.numpy(), [5.0, 6.0])
    # a gradient that is a view, or lies apart from its parameter's layout (here a transpose)
    w = both(np.ones((3, 2)))[0]
    (tw.ones(4, 3, dtype=tw.float64) @ w.t().t()).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((3, 2), 4.0))


def test_backward_with_gradient_for_non_scalar():
    x, tx = both([[1.0, 2.0], [3.0, 4.0]])
    g = [[1.0, -1.0], [0.5, 2.0]]
    (x.exp() * x).backward(gradient=tw.tensor(g, dtype=tw.float64))
    (tx.exp() * tx).backward(gradient=torch.tensor(g, dtype=torch.float64))
    close(x.grad, tx.grad)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape.*\[3\].*\[2, 2\]"):
        (x * 2).backward(tw.ones(3, dtype=tw.float64))


def test_retain_graph():
    x, tx = both([1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    ty = (tx.exp() * tx).sum()
    ty.backward(retain_graph=True)
    ty.backward()
    close(x.grad, tx.grad)
    for out in (y, ty):
        with pytest.raises(RuntimeError, match="^Trying to backward through the graph a second time"):
            out.backward()


# ---------------------------------------------------------------------------- autograd.grad

def test_autograd_grad_does_not_touch_dot_grad():
    x = tw.tensor([1.0, 2.0], requires_grad=True)
    (g,) = tw.autograd.grad((x * x).sum(), x)
    assert x.grad is None
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


def test_third_order_derivative_matches_torch():
    results = []
    for lib in (tw, torch):
        x = lib.tensor([0.7, -1.3], dtype=lib.float64, requires_grad=True)
        y = (x.sin() * x ** 3).sum()
        (g1,) = lib.autograd.grad(y, x, create_graph=True)
        (g2,) = lib.autograd.grad(g1.sum(), x, create_graph=True)
        (g3,) = lib.autograd.grad(g2.sum(), x)
        assert g1.requires_grad and g2.requires_grad and not g3.requires_grad
        results.append([g.detach().numpy() for g in (g1, g2, g3)])
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10)


def test_create_graph_backward_gives_differentiable_grad():
    x = tw.tensor([2.0], requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    assert x.grad.requires_grad  # 3x^2 with its own graph
    (g2,) = tw.autograd.grad(x.grad.sum(), x)
    np.testing.assert_allclose(g2.numpy(), [12.0])


def test_allow_unused():
    x = tw.ones(2, requires_grad=True)
    unused = tw.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="The differentiated Tensor at index 1 appears to not have been used in the "
                                           "graph.*allow_unused=True"):
        tw.autograd.grad((x * 2).sum(), [x, unused])
    gx, gu = tw.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
    assert gu is None
    np.testing.assert_allclose(gx.numpy(), [2.0, 2.0])
    _, gu = tw.autograd.grad((x * 2).sum(), [x, unused], materialize_grads=True)
    np.testing.assert_allclose(gu.numpy(), np.zeros(3))


def test_grad_of_input_that_does_not_require_grad():
    x = tw.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        tw.autograd.grad((x * 2).sum(), tw.ones(2))


# ---------------------------------------------------------------------------- grad modes

@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "set_grad_enabled"])
def test_grad_disabling_modes_as_context_and_decorator(mode):
    x = tw.ones(2, requires_grad=True)
    ctx = {"no_grad": tw.no_grad, "inference_mode": tw.inference_mode,
           "set_grad_enabled": lambda: tw.set_grad_enabled(False)}[mode]
    with ctx():
        assert not tw.is_grad_enabled()
        assert not (x * 2).requires_grad
    assert tw.is_grad_enabled()

    @ctx()
    def f(t):
        return t * 2

    assert not f(x).requires_grad
    assert tw.is_grad_enabled()


def test_enable_grad_inside_no_grad_and_as_decorator():
    x = tw.ones(2, requires_grad=True)

    @tw.enable_grad()
    def f(t):
        return t * 2

    with tw.no_grad():
        with tw.enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
        assert f(x).requires_grad
    assert tw.is_grad_enabled()


def test_no_grad_and_enable_grad_decorate_without_parentheses_as_in_torch():
    def outcome(lib):
        @lib.no_grad
        def off(t):
            return (t * 2).requires_grad, lib.is_grad_enabled()

        @lib.enable_grad
        def on(t):
            return (t * 2).requires_grad, lib.is_grad_enabled()

        x = lib.ones(2, requires_grad=True)
        with lib.no_grad():
            inside = on(x)
        return off(x), inside, lib.is_grad_enabled(), off.__name__, on.__name__

    assert outcome(tw) == outcome(torch)


def test_set_grad_enabled_as_function_and_restores_on_error():
    tw.set_grad_enabled(False)
    try:
        assert not tw.is_grad_enabled()
    finally:
        tw.set_grad_enabled(True)
    assert tw.is_grad_enabled()
    with pytest.raises(ValueError), tw.no_grad():
        raise ValueError
    assert tw.is_grad_enabled()


def test_inference_mode_false_keeps_grad():
    x = tw.ones(2, requires_grad=True)
    with tw.inference_mode(False):
        assert (x * 2).requires_grad


def test_no_grad_results_are_leaves_without_history():
    x = tw.ones(2, requires_grad=True)
    with tw.no_grad():
        y = x * 2
    assert y.is_leaf and y.grad_fn is None and not y.requires_grad


# ---------------------------------------------------------------------------- detach

def test_detach_shares_storage_and_cuts_history():
    x = tw.ones(3, requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    assert d.data_ptr() == y.data_ptr()
    with tw.no_grad():
        d[0] = 7.0
    assert y[0].item() == 7.0
    assert (d * x).grad_fn.next_functions[0] == (None, 0)


def test_detach_in_place():
    x = tw.ones(3, requires_grad=True)
    y = x * 2
    assert y.detach_() is y
    assert y.grad_fn is None and not y.requires_grad and y.is_leaf


@pytest.mark.parametrize("make", ["plain", "of_history", "no_grad"])
def test_detach_in_place_refuses_a_view_as_torch(make):
    def view(lib):
        base = lib.ones(4, requires_grad=make != "plain")
        if make == "no_grad":
            with lib.no_grad():
                return base[:2]
        return base[:2]
    with pytest.raises(RuntimeError, match="Can't detach views in-place") as expected:
        view(torch).detach_()
    with pytest.raises(RuntimeError, match=r"Can't detach views in-place. Use detach\(\) instead."):
        view(tw).detach_()
    assert str(expected.value).startswith("Can't detach views in-place. Use detach() instead.")


@pytest.mark.parametrize("owner", ["module", "optimizer"])
def test_zero_grad_in_place_keeps_gradients_that_are_views_as_torch(owner):
    """Gradients that are views of one flat buffer (as DDP's bucket views) are zeroed in place, not detached."""
    results = []
    for lib in (torch, tw):
        model = lib.nn.Linear(3, 2)
        flat = lib.arange(8, dtype=lib.float32)
        model.weight.grad, model.bias.grad = flat[:6].view(2, 3), flat[6:]
        if owner == "module":
            model.zero_grad(set_to_none=False)
        else:
            lib.optim.SGD(model.parameters(), lr=0.1).zero_grad(set_to_none=False)
        assert model.weight.grad._base is flat
        results.append(flat.numpy().copy())
    np.testing.assert_array_equal(*results)


# ---------------------------------------------------------------------------- hooks and retain_grad

def test_tensor_hooks_match_torch():
    results = []
    for lib in (tw, torch):
        x = lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64, requires_grad=True)
        seen = []
        x.register_hook(lambda g: g * 2)
        y = x * 3
        y.register_hook(lambda g, seen=seen: seen.append(g.clone()))  # observing hook: returns None, grad unchanged
        y.register_hook(lambda g: g + 1)
        y.retain_grad()
        (y * y).sum().backward()
        results.append((x.grad.numpy(), y.grad.numpy(), seen[0].numpy()))
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs)


def test_hook_handle_remove():
    x = tw.ones(2, requires_grad=True)
    handle = x.register_hook(lambda g: g * 10)
    (x * 1).sum().backward()
    handle.remove()
    x.grad = None
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_hook_on_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        tw.ones(2).register_hook(lambda g: g)


def test_retain_grad():
    x = tw.ones(2, requires_grad=True)
    y = x * 3
    z = y * y
    y.retain_grad()
    assert y.retains_grad and not z.retains_grad
    z.sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [6.0, 6.0])
    assert z.grad is None
    x.retain_grad()  # a no-op on leaves, like torch
    assert x.grad is not None


# ---------------------------------------------------------------------------- custom Function

class ScaledProduct(tw.autograd.Function):
    """out = a * b * k, plus a non-differentiable argmax; k is a plain number."""

    calls: list = []

    @staticmethod
    def forward(ctx, a, b, k):
        ctx.save_for_backward(a, b)
        ctx.k = k
        index = a.argmax()
        ctx.mark_non_differentiable(index)
        return a * b * k, index

    @staticmethod
    def backward(ctx, grad, grad_index):
        a, b = ctx.saved_tensors
        ScaledProduct.calls.append(ctx.needs_input_grad)
        ga = grad * b * ctx.k if ctx.needs_input_grad[0] else None
        gb = grad * a * ctx.k if ctx.needs_input_grad[1] else None
        return ga, gb, None


def test_custom_function():
    ScaledProduct.calls.clear()
    a = tw.tensor([1.0, 5.0, 2.0], requires_grad=True)
    b = tw.tensor([3.0, 4.0, 5.0])
    out, index = ScaledProduct.apply(a, b, 2.0)
    assert out.grad_fn.name() == "ScaledProductBackward"
    assert out.requires_grad and not index.requires_grad and index.item() == 1
    nexts = out.grad_fn.next_functions
    assert len(nexts) == 2 and nexts[0][0].name() == "AccumulateGrad" and nexts[1] == (None, 0)  # tensors only
    out.sum().backward()
    assert ScaledProduct.calls == [(True, False, False)]
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 8.0, 10.0])
    assert b.grad is None


def test_custom_function_backward_contract_errors():
    class TooFew(tw.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            return x * scale

        @staticmethod
        def backward(ctx, grad):
            return grad

    class WrongShape(TooFew):
        @staticmethod
        def backward(ctx, grad):
            return tw.ones(5), None

    x = tw.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"TooFewBackward returned an incorrect number of gradients \(expected 2, "
                                           r"got 1\)"):
        TooFew.apply(x, 2.0).sum().backward()
    with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[5\] but expected shape compatible "
                                           r"with \[3\]"):
        WrongShape.apply(x, 2.0).sum().backward()


@pytest.mark.parametrize("extra", ["none", "tensor"])
def test_custom_function_backward_may_return_trailing_nones_beyond_its_inputs_as_in_torch(extra):
    def outcome(lib):
        class Twice(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2, None, (grad if extra == "tensor" else None)

        x = lib.ones(3, requires_grad=True)
        try:
            Twice.apply(x).sum().backward()
        except RuntimeError as error:
            return str(error).split(":")[0]
        return x.grad.tolist()

    assert outcome(tw) == outcome(torch)


def test_custom_function_with_separate_setup_context_matches_torch():
    """torch 2's style: forward takes no ctx; setup_context(ctx, inputs, output) sees every input, keywords and
    defaults included, positionally."""
    def outcome(lib):
        seen = []

        class Scale(lib.autograd.Function):
            @staticmethod
            def forward(x, w, k=2.0):
                return x * w * k, x.argmax()

            @staticmethod
            def setup_context(ctx, inputs, output):
                x, w, k = inputs
                seen.append((len(inputs), k, isinstance(output, tuple)))
                ctx.save_for_backward(x, w)
                ctx.k = k
                ctx.mark_non_differentiable(output[1])

            @staticmethod
            def backward(ctx, grad, grad_index):
                x, w = ctx.saved_tensors
                return grad * w * ctx.k, grad * x * ctx.k, None

        x = lib.tensor([1.0, 3.0, 2.0], requires_grad=True)
        w = lib.tensor([0.5, 1.0, 2.0], requires_grad=True)
        out, index = Scale.apply(x, w=w)
        out.sum().backward()
        return seen, out.tolist(), index.requires_grad, x.grad.tolist(), w.grad.tolist()

    assert outcome(tw) == outcome(torch)


def test_custom_function_without_grad_is_plain_call():
    out, _ = ScaledProduct.apply(tw.ones(2), tw.ones(2), 3.0)
    assert out.grad_fn is None and not out.requires_grad
    x = tw.ones(2, requires_grad=True)
    with tw.no_grad():
        out, _ = ScaledProduct.apply(x, x, 3.0)
    assert out.grad_fn is None


def test_custom_function_saved_tensor_version_check():
    a = tw.tensor([1.0, 2.0], requires_grad=True)
    b = tw.tensor([3.0, 4.0])
    out, _ = ScaledProduct.apply(a, b, 1.0)
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*version 1; expected version 0"):
        out.sum().backward()


def test_custom_function_composes_with_builtin_ops_and_higher_order():
    class Cube(tw.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x

    x = tw.tensor([2.0], requires_grad=True)
    y = Cube.apply(x.exp()).sum()
    (g,) = tw.autograd.grad(y, x, create_graph=True)
    np.testing.assert_allclose(g.item(), 3 * np.exp(6.0), rtol=1e-5)
    (g2,) = tw.autograd.grad(g, x)  # backward formula ran with grad on: differentiable
    np.testing.assert_allclose(g2.item(), 9 * np.exp(6.0), rtol=1e-5)


# ---------------------------------------------------------------------------- in-place and versions

def test_modified_saved_tensor_error_names_versions():
    messages = []
    for lib in (tw, torch):
        a = lib.ones(3, requires_grad=True)
        b = a.exp()
        c = b.exp()  # saves b (as its result... and exp's result)
        b.add_(1)
        with pytest.raises(RuntimeError) as err:
            c.sum().backward()
        messages.append(str(err.value))
    ours, theirs = (m.split(" Hint:")[0] for m in messages)
    assert theirs.replace("torch.FloatTensor", "tilewise.float32") == ours, (ours, theirs)
    assert ours.endswith("[tilewise.float32 [3]], which is output 0 of Exp, is at version 1; expected version 0 "
                         "instead.")


def test_version_counter_shared_by_views():
    x = tw.zeros(4)
    v = x[1:3]
    assert x._version == v._version == 0
    v.add_(1)
    assert x._version == v._version == 1
    x.mul_(2)
    assert v._version == 2
    assert x.detach()._version == 2


def test_leaf_in_place_error():
    x = tw.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="add_: a leaf Variable that requires grad is being used in an in-place"):
        x.add_(1)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x[0] = 3.0
    with tw.no_grad():
        x.add_(1)  # allowed without grad recording, like torch
    np.testing.assert_allclose(x.detach().numpy(), [2.0, 2.0])


def test_in_place_on_non_leaf_records_history():
    x, tx = both([1.0, 2.0, 3.0])
    for t in (x, tx):
        y = t * 2
        y.mul_(3)
        y.exp_()
        y.sum().backward()
    close(x.grad, tx.grad)


def test_in_place_through_view_gradients_match_torch():
    data = np.arange(9.0).reshape(3, 3) / 4
    grads = []
    for lib in (tw, torch):
        x = lib.tensor(data, requires_grad=True)
        y = x * 2
        y[:, 1] += 1
        y[0].mul_(y[2].detach().clone())
        y[1:, ::2].exp_()
        (y * y).sum().backward()
        grads.append(x.grad)
    close(*grads)


def test_in_place_on_view_of_leaf_is_an_error():
    x = tw.ones(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="view of a leaf Variable that requires grad"):
        x[0].add_(1)


def test_only_values_needed_for_required_grads_are_saved():
    x, tx = both([0.5, 1.5])
    for lib, t in ((tw, x), (torch, tx)):
        y = t * 1
        c = lib.tensor([2.0, 3.0], dtype=lib.float64)
        z = y * c  # c needs no grad, so y is not saved and may change afterwards
        y.add_(1)
        (z * z).sum().backward()
    close(x.grad, tx.grad)


def test_in_place_on_saved_output_is_caught():
    for lib in (tw, torch):
        x = lib.tensor([0.5, 1.5], requires_grad=True)
        y = x.exp()
        z = y * 1
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (z * y).sum().backward()


# ---------------------------------------------------------------------------- checkpointing

W_DATA = np.random.default_rng(0).standard_normal((4, 4))


def _block(x, w, refs=None):
    h = (x @ w).tanh()
    if refs is not None:
        refs.append(weakref.ref(h.untyped_storage()))
    keep = (tw.rand_like(h) > 0.5).to(h.dtype)  # a dropout-style mask: must match on recomputation
    return (h * keep * 2).exp().sum(1)


def _run_block(mode):
    w = tw.tensor(W_DATA, requires_grad=True)
    x = tw.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
    tw.manual_seed(123)
    if mode is None:
        y = _block(x, w)
    else:
        y = checkpoint(_block, x, w, use_reentrant=mode)
    tw.manual_seed(999)  # the RNG moves on before backward; recomputation must replay the forward's state
    (y * tw.tensor([1.0, -2.0, 0.5], dtype=y.dtype)).sum().backward()
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_matches_plain_gradients(use_reentrant):
    expected = _run_block(None)
    actual = _run_block(use_reentrant)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-12)


def test_checkpoint_captured_parameter_and_autograd_grad():
    w = tw.tensor(W_DATA, requires_grad=True)
    x = tw.tensor(np.ones((2, 4)), requires_grad=True)
    fn = lambda t: (t @ w).sin()  # noqa: E731 — w is captured, not an argument
    tw.manual_seed(0)
    expected = tw.autograd.grad(fn(x).sum(), [x, w])
    tw.manual_seed(0)
    actual = tw.autograd.grad(checkpoint(fn, x, use_reentrant=False).sum(), [x, w])
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-12)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_frees_activations(use_reentrant):
    w = tw.tensor(W_DATA, requires_grad=True)
    x = tw.tensor(np.ones((3, 4)), requires_grad=True)
    plain_refs, ckpt_refs = [], []
    plain = _block(x, w, plain_refs)
    ckpt = checkpoint(_block, x, w, ckpt_refs, use_reentrant=use_reentrant)
    gc.collect()
    assert plain_refs[0]() is not None  # saved for backward by the plain graph
    assert ckpt_refs[0]() is None  # the checkpointed segment kept nothing
    (plain.sum() + ckpt.sum()).backward()
    assert w.grad is not None


def test_checkpoint_saves_only_handles():
    from tilewise.autograd.graph import SavedTensor

    x = tw.ones(3, 4, dtype=tw.float64, requires_grad=True)
    w = tw.tensor(W_DATA, requires_grad=True)
    y = checkpoint(lambda a: (a @ w).tanh().exp(), x, use_reentrant=False)
    saved = [v for v in y.grad_fn.saved.values() if isinstance(v, SavedTensor)]
    assert saved and all(isinstance(s.tensor, int) for s in saved)


def test_checkpoint_retain_graph_recomputes_twice():
    x = tw.tensor([0.3, 0.6], requires_grad=True)
    y = checkpoint(lambda t: (t.exp() * t).sum(), x, use_reentrant=False)
    y.backward(retain_graph=True)
    y.backward()
    e = np.exp([0.3, 0.6]) * (1 + np.array([0.3, 0.6]))
    np.testing.assert_allclose(x.grad.numpy(), 2 * e, rtol=1e-6)


def test_checkpoint_under_no_grad_is_plain_call():
    x = tw.ones(2, requires_grad=True)
    with tw.no_grad():
        y = checkpoint(lambda t: t * 2, x, use_reentrant=False)
    assert not y.requires_grad


def test_checkpoint_reentrant_rejects_kwargs():
    with pytest.raises(ValueError, match="keyword arguments"):
        checkpoint(lambda t, scale: t * scale, tw.ones(2, requires_grad=True), scale=2.0, use_reentrant=True)
    y = checkpoint(lambda t, scale: t * scale, tw.ones(2, requires_grad=True), scale=2.0, use_reentrant=False)
    np.testing.assert_allclose(y.detach().numpy(), [2.0, 2.0])


@pytest.mark.parametrize("which", ["checkpoint", "checkpoint_sequential"])
def test_checkpoint_without_use_reentrant_warns_and_is_reentrant_as_torchs(which):
    """Left out, ``use_reentrant`` is True in torch, with a warning: a block whose input needs no grad then gives
    its parameters no gradient, and keyword arguments are refused."""
    import torch
    import torch.utils.checkpoint as torch_checkpoint

    from tilewise.utils import checkpoint as tw_checkpoint

    def run(lib, module):
        lib.manual_seed(0)
        layer = lib.nn.Linear(3, 2)
        x = lib.ones(4, 3)  # needs no grad: the reentrant form leaves the layer's weight without a gradient
        with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
            if which == "checkpoint":
                out = module.checkpoint(layer, x)
            else:
                out = module.checkpoint_sequential(lib.nn.Sequential(layer, lib.nn.Tanh()), 2, x)
        return layer.weight.grad is None, out.requires_grad

    assert run(tw, tw_checkpoint) == run(torch, torch_checkpoint)


# ---------------------------------------------------------------------------- end-of-backward callbacks

def _callback_order(lib) -> list:
    """What a leaf's post-accumulate hook queues, and when it runs, on one backward pass."""
    engine = lib.autograd.Variable._execution_engine
    order = []

    def queue_nested():
        order.append("second")
        engine.queue_callback(lambda: order.append("queued by a callback"))

    def hook(p):
        order.append(("accumulated", p.grad.tolist()))
        engine.queue_callback(lambda: order.append(("first", p.grad.tolist())))
        engine.queue_callback(queue_nested)

    x = lib.ones(2, requires_grad=True)
    x.register_post_accumulate_grad_hook(hook)
    (x * 3).sum().backward()
    order.append("returned")
    return order


def test_queued_callbacks_run_at_the_end_of_backward_in_order():
    assert _callback_order(tw) == _callback_order(torch)


@pytest.mark.parametrize("lib", [tw, torch], ids=["tilewise", "torch"])
def test_queue_callback_outside_backward_is_an_error(lib):
    with pytest.raises(RuntimeError, match="Final callbacks can only be installed during backward pass"):
        lib.autograd.Variable._execution_engine.queue_callback(lambda: None)


@pytest.mark.parametrize("lib", [tw, torch], ids=["tilewise", "torch"])
def test_a_failing_callback_raises_from_backward_and_the_next_backward_is_clean(lib):
    def fail():
        raise ValueError("from the callback")

    engine = lib.autograd.Variable._execution_engine
    x = lib.ones(2, requires_grad=True)
    handle = x.register_post_accumulate_grad_hook(lambda p: engine.queue_callback(fail))
    with pytest.raises(ValueError, match="from the callback"):
        (x * 2).sum().backward()
    handle.remove()
    (x * 2).sum().backward()  # the failed pass's callbacks are gone
    assert x.grad.tolist() == [4.0, 4.0]
    with pytest.raises(RuntimeError, match="Final callbacks"):
        engine.queue_callback(lambda: None)


def test_callbacks_queued_in_autograd_grad_run_before_it_returns():
    def run(lib):
        order = []
        x = lib.ones(2, requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: lib.autograd.Variable._execution_engine.queue_callback(lambda: order.append("cb")))
        (g,) = lib.autograd.grad(y.sum(), x)
        order.append(g.tolist())
        return order

    assert run(tw) == run(torch)


def test_variable_is_torchs_legacy_alias():
    for lib in (tw, torch):
        v = lib.autograd.Variable(lib.ones(2), requires_grad=True)
        assert v.requires_grad and v.is_leaf and isinstance(lib.ones(1), lib.autograd.Variable)


@pytest.mark.parametrize("lib", [tw, torch], ids=["tilewise", "torch"])
def test_queue_callback_belongs_to_the_thread_running_backward(lib):
    import threading

    engine = lib.autograd.Variable._execution_engine
    errors = []

    def from_another_thread():
        try:
            engine.queue_callback(lambda: None)
        except RuntimeError as error:
            errors.append(str(error))

    def hook(p):
        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join()

    x = lib.ones(2, requires_grad=True)
    x.register_post_accumulate_grad_hook(hook)
    (x * 2).sum().backward()
    assert errors == ["Final callbacks can only be installed during backward pass."]


@pytest.mark.parametrize("name", ["relu_", "sigmoid_", "tanh_", "exp_"])
def test_an_in_place_operator_that_saves_its_result_saves_the_written_tensor(name):
    """torch's in-place activations save ``self`` once written: no copy of the output is held for backward, and
    writing ``self`` again before backward is refused, as torch refuses it."""
    import torch

    for lib in (tw, torch):
        x = lib.tensor([-1.0, 0.5, 2.0], requires_grad=True)
        y = x * 2
        getattr(y, name)()
        if lib is tw:
            assert y.grad_fn.saved["result"].tensor._storage is y._storage
        (y * y).sum().backward()
        if lib is tw:
            ours = x.grad.tolist()
        else:
            np.testing.assert_allclose(ours, x.grad.tolist(), rtol=1e-6, atol=1e-6)
    for lib in (tw, torch):
        x = lib.tensor([-1.0, 0.5, 2.0], requires_grad=True)
        y = x * 2
        getattr(y, name)()
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_copying_a_tensor_into_another_leaves_its_saved_result_alone():
    """``buf.copy_(y)`` writes ``y``'s values into ``buf``; ``y``'s node keeps ``y``: changing ``buf`` afterwards does
    not touch ``y``'s backward (as in torch)."""
    import torch

    grads = []
    for lib in (tw, torch):
        x = lib.tensor([0.5, 1.0, 2.0], requires_grad=True)
        y = x.exp()
        buf = lib.zeros(3)
        buf.copy_(y)
        buf.add_(1)
        y.sum().backward()
        grads.append(x.grad.tolist())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)


def test_a_custom_functions_node_is_of_its_own_backward_class_as_in_torch():
    """torch makes a class ``<Name>Backward`` (a BackwardCFunction) for each Function subclass, its
    ``_backward_cls``: a node's type, name and repr say which function made it."""
    import re

    def run(lib):
        class MyFn(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        class Other(MyFn):
            pass

        x = lib.ones(2, requires_grad=True)
        node, other = MyFn.apply(x).grad_fn, Other.apply(x).grad_fn
        cls = type(node)
        return (cls.__name__, cls.__qualname__, node.name(), type(other).__name__, cls is type(MyFn.apply(x).grad_fn),
                cls is MyFn._backward_cls, cls._forward_cls is MyFn, cls is not type(other),
                isinstance(node, lib.autograd.function.BackwardCFunction), isinstance(node, lib.autograd.graph.Node),
                re.sub(r"0x[0-9a-f]+", "ADDRESS", repr(node)).replace("tilewise", "torch"),
                repr(MyFn.apply(x)).replace("tilewise", "torch"))

    assert run(tw) == run(torch)
