"""tilewise.compile returns what eager returns: outputs that alias the arguments, the tensors the function holds, or
each other stay aliases, so a write through one after the call lands where eager's would.

Every scenario runs three times — tilewise compiled, tilewise eager, torch eager — through the same code, with the
library passed in (``check`` of test_trust_guards.py); each writes through what the call returned and reads the
tensors that may share its memory, over several calls.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_trust_guards import check

import tilewise as tw


def _flag(lib, value: bool):
    return lib.tensor(float(value))


@pytest.mark.parametrize("view", ["slice", "transpose", "detach", "data"])
def test_a_returned_view_of_an_argument_aliases_it(view):
    take = {"slice": lambda x: x[:, 1:], "transpose": lambda x: x.t(), "detach": lambda x: x.detach(),
            "data": lambda x: x.data}[view]

    def scenario(lib, compile_):
        f = compile_(take)
        out = []
        for k in range(3):
            x = lib.arange(6.0).reshape(2, 3) + k
            r = f(x)
            r.mul_(-1)  # eager: through x's memory
            out += [x.clone(), r.clone()]
        return out

    check(scenario)


def test_a_view_of_an_argument_written_in_place_and_returned():
    def scenario(lib, compile_):
        def g(x):
            v = x[:2]
            v.mul_(3)
            return v

        f = compile_(g)
        out = []
        for k in range(3):
            x = lib.arange(4.0) + k
            r = f(x)
            r.add_(100)
            out += [x.clone(), r.clone(), lib.tensor(float(x._version))]
        return out

    check(scenario)


def test_a_returned_view_of_a_held_tensor_aliases_it():
    def scenario(lib, compile_):
        w = lib.ones(4)
        f = compile_(lambda x: (w[:2], x + w))
        out = []
        for _ in range(3):
            a, b = f(lib.ones(4))
            a.add_(1)  # eager: w changes, and the next call reads it
            out += [a.clone(), b, w.clone()]
        return out

    check(scenario)


def test_a_detached_held_tensor_is_detached_again_after_its_data_is_replaced():
    def scenario(lib, compile_):
        w = lib.ones(3, requires_grad=True)
        f = compile_(lambda x: (w.detach(), x * 2))
        out = []
        for k in range(3):
            a, b = f(lib.full((3,), float(k)))
            out += [a.clone(), b]
            w.data = lib.full((3,), float(k + 5))
        return out

    check(scenario)


def test_a_tensor_returned_twice_is_one_tensor():
    def scenario(lib, compile_):
        def g(x):
            y = x * 2
            return y, y

        f = compile_(g)
        out = []
        for k in range(3):
            a, b = f(lib.ones(3) + k)
            a.add_(1)
            out += [a.clone(), b.clone(), _flag(lib, a is b)]
        return out

    check(scenario)


@pytest.mark.parametrize("returned", ["with its view", "two views"])
def test_views_of_one_intermediate_share_its_memory(returned):
    def scenario(lib, compile_):
        def g(x):
            y = x * 2
            return (y, y[1:]) if returned == "with its view" else (y[:3], y[1:])

        f = compile_(g)
        out = []
        for k in range(3):
            a, b = f(lib.ones(4) + k)
            a.add_(10)
            out += [a.clone(), b.clone()]
        return out

    check(scenario)


VIEWS_OF_INTERMEDIATES = {
    "slice": lambda y: y[:, 1:3],
    "step": lambda y: y[::2],
    "row": lambda y: y[1],
    "transpose": lambda y: y.t(),
    "diagonal": lambda y: y.diagonal(),
    "expand": lambda y: y[:1].expand(3, -1),
}


def _layout(lib, t) -> list:
    """What eager says of a tensor's memory: its strides, storage offset and storage size."""
    return [lib.tensor(list(t.stride()) or [0]), lib.tensor(float(t.storage_offset())),
            lib.tensor(float(t.untyped_storage().nbytes()))]


@pytest.mark.parametrize("operand", ["row-major", "transposed"])
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("view", sorted(VIEWS_OF_INTERMEDIATES))
def test_a_returned_view_of_an_intermediate_is_eagers_view(view, requires_grad, operand):
    # eager returns a view over all of the intermediate's memory (a small slice keeps it all alive, as in torch)
    take = VIEWS_OF_INTERMEDIATES[view]

    def scenario(lib, compile_):
        w = lib.arange(1.0, 13.0).reshape(3, 4).requires_grad_(requires_grad)
        f = compile_(lambda x: take(x.t() * w.t() if operand == "transposed" else x * w))
        out = []
        for k in range(3):
            if requires_grad:
                w.grad = None
            r = f(lib.arange(12.0).reshape(3, 4) + k)
            out += [r.detach().clone(), *_layout(lib, r), _flag(lib, r.requires_grad)]
            if requires_grad:
                (r * lib.arange(float(r.numel())).reshape(r.shape)).sum().backward()
                out.append(w.grad.clone())
        return out

    check(scenario)


def test_two_views_of_one_intermediate_are_views_of_one_storage():
    def scenario(lib, compile_):
        f = compile_(lambda x: (lambda y: (y[:, :2], y[1:].t()))(x * 2))
        out = []
        for k in range(3):
            a, b = f(lib.arange(12.0).reshape(3, 4) + k)
            a[1, 1] = -1.0  # eager: b's element (1, 0) too
            out += [a.clone(), b.clone(), *_layout(lib, a), *_layout(lib, b),
                    _flag(lib, a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())]
        return out

    check(scenario)


def test_gradients_through_outputs_that_alias():
    weights = np.arange(4, dtype=np.float32)

    def scenario(lib, compile_):
        w = lib.tensor(weights, requires_grad=True)

        def g(x):
            y = x * w
            return y, y[1:], w[:2], x[2:]

        f = compile_(g)
        out = []
        for k in range(3):
            w.grad = None
            x = lib.full((4,), k + 1.0, requires_grad=True)
            a, b, c, d = f(x)
            ((a * 2).sum() + (b * 5).sum() + (c * 3).sum() + (d * 7).sum()).backward()
            out += [w.grad.clone(), x.grad.clone(), a.detach(), b.detach(), c.detach(), d.detach(),
                    _flag(lib, d.requires_grad), _flag(lib, c.requires_grad)]
        return out

    check(scenario)


def test_a_returned_view_of_a_sliced_argument_aliases_the_argument():
    # the slices are handed to the program as windows of their memory ([Note: sliced arguments]): what the call
    # returns must still be a view of the argument as given, its writes counted by the argument's version
    def scenario(lib, compile_):
        f = compile_(lambda x: (x[1:], x.detach(), x * 2))
        base = lib.arange(16.0)
        out = []
        for k in range(3):
            x = base[k * 2:k * 2 + 4]
            v, d, y = f(x)
            before = x._version
            v.mul_(-1)
            d.add_(100)
            out += [base.clone(), y, lib.tensor(float(x._version - before))]
        return out

    check(scenario)


def test_outputs_that_alias_under_inference_mode():
    def scenario(lib, compile_):
        f = compile_(lambda x: (x[:2], x * 2))
        out = []
        for _ in range(2):
            x = lib.arange(4.0)
            with lib.inference_mode():
                a, b = f(x)
            out += [a.clone(), b.clone(), _flag(lib, a.is_inference()), _flag(lib, b.is_inference()),
                    _flag(lib, x.is_inference())]
        return out

    check(scenario)


def test_returning_views_keeps_one_variant():
    f = tw.compile(lambda x: (x[1:], x.t(), x * 2))
    for k in range(4):
        x = tw.arange(6.0).reshape(2, 3) + k
        a, b, c = f(x)
        assert a._storage is x._storage and b._storage is x._storage
        np.testing.assert_array_equal(c.numpy(), x.numpy() * 2)
    assert len(f.variants) == 1


def test_a_returned_gradient_is_the_parameters_gradient():
    def scenario(lib, compile_):
        w = lib.arange(3.0, requires_grad=True)
        v = lib.ones(3, requires_grad=True)

        def g(x):
            (w * x).sum().backward()
            return (v * x).sum() * 2, w.grad, w.grad[1:]

        f = compile_(g)
        out = []
        for k in range(6):
            loss, grad, tail = f(lib.ones(3) * (k + 1))
            loss.backward()
            tail.add_(10)  # eager: through w.grad, which the next call accumulates into
            out += [grad.clone(), w.grad.clone(), v.grad.clone(), _flag(lib, grad is w.grad)]
            if k % 2 == 1:
                w.grad = None  # the next call makes a new gradient, the one after accumulates into it
        return out

    check(scenario)


def test_a_gradient_read_through_a_held_tensor_is_read_anew():
    # ``w`` itself meets no operator: only its ``.grad`` does, which the user replaces before each call
    def scenario(lib, compile_):
        w = lib.arange(3.0, requires_grad=True)
        f = compile_(lambda x: (w.grad, x * w.grad))
        out = []
        for k in range(3):
            w.grad = lib.full((3,), float(k))
            a, b = f(lib.ones(3))
            out += [a.clone(), b, _flag(lib, a is w.grad)]
        return out

    check(scenario)


def test_returned_optimizer_state_is_the_optimizers():
    def scenario(lib, compile_):
        m = lib.nn.Linear(2, 1)
        with lib.no_grad():
            m.weight.fill_(0.5)
            m.bias.fill_(0.1)
        opt = lib.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        def step(x):
            opt.zero_grad()
            m(x).sum().backward()
            opt.step()
            return opt.state[m.weight]["momentum_buffer"]

        f = compile_(step)
        out = []
        for _ in range(4):
            buffer = f(lib.ones(1, 2))
            out += [buffer.clone(), _flag(lib, buffer is opt.state[m.weight]["momentum_buffer"]),
                    m.weight.detach().clone()]
        return out

    check(scenario)


def test_a_tensor_returned_with_its_detached_alias():
    weights = np.arange(3, dtype=np.float32)

    def scenario(lib, compile_):
        w = lib.tensor(weights, requires_grad=True)

        def g(x):
            loss = (w * x).sum()
            return loss, loss.detach()

        f = compile_(g)
        out = []
        for _ in range(3):
            loss, detached = f(lib.ones(3))
            detached.add_(1)  # eager: loss's memory too
            out += [loss.detach().clone(), detached.clone()]
        return out

    check(scenario)


# Composites whose decomposition makes a tensor from host values (pdist's row pairs, quantile's positions): the
# compiled program records what the decomposition does, so a later pass re-tracing the op alone finds no tensor it
# cannot bind (these raised an AttributeError while the program was built).
_HOST_CONSTANTS = {
    "pdist": lambda lib, x: lib.nn.functional.pdist(x),
    "quantile": lambda lib, x: lib.quantile(x, 0.3, dim=0),
    "quantile_list": lambda lib, x: lib.quantile(x, lib.tensor([0.25, 0.5]), dim=1, keepdim=True),
    "nanquantile": lambda lib, x: lib.nanquantile(x, 0.7),
    "triu_gather": lambda lib, x: x[tuple(lib.triu_indices(5, 3, 1))],
    "combinations": lambda lib, x: lib.combinations(x[0], 2),
}


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("name", sorted(_HOST_CONSTANTS))
def test_composites_that_make_host_constants_compile(name, fullgraph):
    import torch

    fn = _HOST_CONSTANTS[name]
    x = np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32)
    plain = tw.compile(lambda t: fn(tw, t), fullgraph=fullgraph)(tw.tensor(x))  # no gradient: the op kept whole
    np.testing.assert_allclose(plain.numpy(), fn(torch, torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    ours = tw.tensor(x).requires_grad_()
    theirs = torch.tensor(x).requires_grad_()
    got = tw.compile(lambda t: fn(tw, t), fullgraph=fullgraph)(ours)
    expected = fn(torch, theirs)
    np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    got.sum().backward()
    expected.sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
