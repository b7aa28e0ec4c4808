"""In-place operators that record, written straight into their target (see [Note: in-place writes]).

A backend that can write a pointwise result into a given tensor (CUDA's kernels) is offered an in-place op's
target even when autograd records the op, as long as the node keeps no copy of what the target held before
(``relu_`` saves its result, ``mul_`` saves ``self``): the target becomes the node's output, written by one kernel,
and its saved result takes the version the write gave it. The CPU backend has no such kernels, so these tests
give it one (a result computed as usual and copied into the target) and compare gradients, versions and errors
with torch's, whose in-place operators work this way.
"""

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.device import BACKENDS
from tilewise.tensor import Tensor


@pytest.fixture
def written():
    """The CPU backend made to write pointwise results into in-place targets; yields the ops it wrote."""
    cpu = BACKENDS["cpu"]
    ops = []

    def run_into(op, args, device, out):
        result = cpu.run(op, args, device)
        if type(result) is not Tensor or result._shape != out._shape or result._dtype is not out._dtype:
            return None
        out._np()[...] = result._np()
        ops.append(op.name)
        return out

    original = cpu.run_into
    cpu.run_into = run_into
    try:
        yield ops
    finally:
        cpu.run_into = original


def _run(lib, scenario):
    lib.manual_seed(0)
    a = lib.tensor([[1.0, -2.0, 3.0], [-0.5, 0.25, -4.0]], requires_grad=True)
    w = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
    out = scenario(lib, a, w)
    out.backward()
    return out.detach().numpy().copy(), a.grad.numpy().copy(), None if w.grad is None else w.grad.numpy().copy()


def _relu(lib, a, w):
    y = (a * w).relu_()
    assert y._version == 1
    return (y * y).sum()


def _sigmoid_tanh(lib, a, w):
    y = (a * w).sigmoid_()
    z = (a + w).tanh_()
    return (y * z).sum()


def _add_into_constant(lib, a, w):  # the target needs no gradient, the other operand does
    y = lib.zeros(2, 3)
    y.add_(a * w, alpha=2.0)
    return (y * y).sum()


def _clamp_chain(lib, a, w):
    y = (a * 3).clamp_(min=-2.0, max=4.0).relu_()
    return (y * w).sum()


def _view_target(lib, a, w):  # a view's history is rebased through its base: written as before
    y = a * w
    y[:, 1:].relu_()
    return (y * y).sum()


def _activation_modules(lib, a, w):
    net = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.ReLU(inplace=True), lib.nn.Linear(4, 3),
                            lib.nn.LeakyReLU(0.1, inplace=True))
    with lib.no_grad():
        for p in net.parameters():
            p.copy_(lib.linspace(-1.0, 1.0, p.numel()).view(p.shape))
    return (net(a) * w).sum()


@pytest.mark.parametrize("scenario", [_relu, _sigmoid_tanh, _add_into_constant, _clamp_chain, _view_target,
                                      _activation_modules], ids=lambda f: f.__name__.strip("_"))
def test_recorded_in_place_ops_written_directly_match_torch(written, scenario):
    want = _run(torch, scenario)
    got = _run(tw, scenario)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    if scenario is not _view_target:
        assert written, "no in-place op was written into its target"


def test_the_target_becomes_the_output_and_its_saved_result(written):
    a = tw.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = a * 2
    storage = y._storage
    y.relu_()
    assert written == ["relu"] and y._storage is storage
    assert y.grad_fn.name().startswith("Relu")
    y.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 0.0, 2.0])


def test_a_later_write_to_the_saved_result_is_refused_at_backward_as_torch_refuses_it(written):
    def run(lib):
        a = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
        y = (a * 2).relu_()
        y.mul_(3)
        y.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(torch)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(tw)


def test_saved_tensor_hooks_see_a_temporary_as_before(written):
    packed = []

    def pack(t):
        packed.append(t)
        return t

    a = tw.tensor([1.0, -2.0, 3.0], requires_grad=True)
    with tw.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = (a * 2).relu_()
    y.sum().backward()
    assert "relu" not in written  # the hooks may hold the saved value: the op computes a temporary, as before
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 0.0, 2.0])


def test_a_leaf_that_requires_grad_is_still_refused(written):
    a = tw.tensor([1.0, -2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        a.relu_()
    assert not written


def test_a_result_written_in_place_is_recorded_only_when_it_becomes_a_new_nodes_output():
    """Where no input with a derivative requires grad (or the result is not floating), the target would keep its
    old history under the new values: the op then computes a temporary and the write is recorded as before."""
    from tilewise.autograd.graph import _RECIPES, _Recipe, _takes_a_node
    from tilewise.ops.registry import OVERLOADS

    op = OVERLOADS["where"][0]
    recipe = _RECIPES.get(op) or _Recipe(op)
    cond, x = tw.tensor([True, False]), tw.ones(2)
    assert not _takes_a_node(recipe, (cond, x, tw.zeros(2)), x)
    assert _takes_a_node(recipe, (cond, x, tw.zeros(2, requires_grad=True)), x)
    assert not _takes_a_node(recipe, (cond, x, tw.zeros(2, requires_grad=True)), tw.ones(2, dtype=tw.int64))


def test_a_call_refused_while_recording_leaves_the_target_unwritten_as_torch(written):
    """An inference tensor the node would save is refused when recording: the target keeps its values."""
    def run(lib):
        with lib.inference_mode():
            frozen = lib.tensor([2.0, 3.0])
        w = lib.tensor([1.0, 1.0], requires_grad=True)
        x = w * 1
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            x.addcmul_(frozen, w)
        return x.detach().numpy().copy()

    np.testing.assert_array_equal(run(tw), run(torch))
    assert not written
