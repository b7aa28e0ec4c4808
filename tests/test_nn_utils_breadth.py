"""nn.utils beyond clipping: weight and spectral normalisation, batch-norm folding, skip_init, clip helpers,
each against torch given the same weights."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _copy_params(ours, theirs):
    for (name, p), (tname, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname
        p.data = tw.from_numpy(q.detach().numpy().copy())
    for (name, b), (tname, c) in zip(ours.named_buffers(), theirs.named_buffers()):
        assert name == tname
        b.copy_(tw.from_numpy(c.detach().numpy().copy()))


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_matches_torch_forward_backward_and_removal(dim):
    ours, theirs = tw.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(3, 4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = torch.nn.utils.weight_norm(theirs, dim=dim)
        with pytest.warns(FutureWarning):
            ours = tw.nn.utils.weight_norm(ours, dim=dim)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _copy_params(ours, theirs)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    out, ref = ours(tw.from_numpy(x)), theirs(torch.from_numpy(x))
    _close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        _close(p.grad, q.grad, 1e-4)
    with pytest.raises(RuntimeError, match="Cannot register two weight_norm hooks"):
        tw.nn.utils.weight_norm(ours, dim=dim)
    tw.nn.utils.remove_weight_norm(ours)
    torch.nn.utils.remove_weight_norm(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    _close(ours.weight, theirs.weight)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found"):
        tw.nn.utils.remove_weight_norm(ours)


@pytest.mark.parametrize("layer", ["linear", "conv_transpose"])
def test_spectral_norm_power_iteration_matches_torch(layer):
    if layer == "linear":
        ours, theirs = tw.nn.Linear(5, 7), torch.nn.Linear(5, 7)
    else:
        if not hasattr(tw.nn, "ConvTranspose2d"):
            pytest.skip("ConvTranspose2d is not in this build")
        ours, theirs = tw.nn.ConvTranspose2d(4, 3, 3), torch.nn.ConvTranspose2d(4, 3, 3)
    theirs = torch.nn.utils.spectral_norm(theirs, n_power_iterations=2)
    ours = tw.nn.utils.spectral_norm(ours, n_power_iterations=2)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _copy_params(ours, theirs)  # the random u and v too
    shape = (3, 5) if layer == "linear" else (2, 4, 5, 5)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for _ in range(3):  # the buffers move in place at every training forward
        out, ref = ours(tw.from_numpy(x)), theirs(torch.from_numpy(x))
        _close(out, ref, 1e-4)
        _close(ours.weight_u, theirs.weight_u, 1e-4)
    out.sum().backward()
    ref.sum().backward()
    _close(ours.weight_orig.grad, theirs.weight_orig.grad, 1e-4)
    ours.eval()
    theirs.eval()
    u = ours.weight_u.numpy().copy()
    _close(ours(tw.from_numpy(x)), theirs(torch.from_numpy(x)), 1e-4)
    assert np.array_equal(u, ours.weight_u.numpy())  # no power iteration in eval mode
    tw.nn.utils.remove_spectral_norm(ours)
    torch.nn.utils.remove_spectral_norm(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    _close(ours.weight, theirs.weight, 1e-4)


def test_spectral_norm_rejects_what_torch_rejects():
    with pytest.raises(ValueError, match="Expected n_power_iterations to be positive"):
        tw.nn.utils.spectral_norm(tw.nn.Linear(2, 2), n_power_iterations=0)
    m = tw.nn.utils.spectral_norm(tw.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="Cannot register two spectral_norm hooks"):
        tw.nn.utils.spectral_norm(m)


def test_fusing_batch_norm_into_conv_and_linear_matches_torch():
    rng = np.random.default_rng(2)
    conv, bn = torch.nn.Conv2d(3, 4, 3).eval(), torch.nn.BatchNorm2d(4).eval()
    bn.running_mean.copy_(torch.from_numpy(rng.standard_normal(4).astype(np.float32)))
    bn.running_var.copy_(torch.from_numpy(rng.random(4).astype(np.float32) + 0.5))
    tconv, tbn = tw.nn.Conv2d(3, 4, 3).eval(), tw.nn.BatchNorm2d(4).eval()
    _copy_params(tconv, conv)
    _copy_params(tbn, bn)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    fused = tw.nn.utils.fuse_conv_bn_eval(tconv, tbn)
    _close(fused(tw.from_numpy(x)), torch.nn.utils.fuse_conv_bn_eval(conv, bn)(torch.from_numpy(x)))
    _close(fused(tw.from_numpy(x)), tbn(tconv(tw.from_numpy(x))))
    lin, bn1 = torch.nn.Linear(5, 4).eval(), torch.nn.BatchNorm1d(4).eval()
    bn1.running_var.fill_(2.0)
    tlin, tbn1 = tw.nn.Linear(5, 4).eval(), tw.nn.BatchNorm1d(4).eval()
    _copy_params(tlin, lin)
    _copy_params(tbn1, bn1)
    y = rng.standard_normal((3, 5)).astype(np.float32)
    _close(tw.nn.utils.fuse_linear_bn_eval(tlin, tbn1)(tw.from_numpy(y)),
           torch.nn.utils.fuse_linear_bn_eval(lin, bn1)(torch.from_numpy(y)))
    with pytest.raises(AssertionError, match="Fusion only for eval!"):
        tw.nn.utils.fuse_conv_bn_eval(tconv.train(), tbn)


def test_skip_init_draws_no_random_numbers():
    tw.manual_seed(0)
    m = tw.nn.utils.skip_init(tw.nn.Linear, 5, 3)
    after = tw.rand(3)
    tw.manual_seed(0)
    assert tw.equal(after, tw.rand(3)) if hasattr(tw, "equal") else after.tolist() == tw.rand(3).tolist()
    assert m.weight.shape == (3, 5) and m.weight.requires_grad
    tw.manual_seed(1)
    lin = tw.nn.Linear(5, 3)  # initialisers work again afterwards
    assert float(lin.weight.abs().sum()) > 0
    with pytest.raises(RuntimeError, match="Expected a Module"):
        tw.nn.utils.skip_init(int)


def test_clip_grads_with_a_norm_computed_beforehand_matches_torch():
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,))]
    ours = [tw.nn.Parameter(tw.zeros(*g.shape)) for g in grads]
    theirs = [torch.nn.Parameter(torch.zeros(*g.shape)) for g in grads]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = tw.from_numpy(g.copy()), torch.from_numpy(g.copy())
    norm = tw.nn.utils.get_total_norm([p.grad for p in ours])
    tw.nn.utils.clip_grads_with_norm_(ours, 1.0, norm)
    torch.nn.utils.clip_grads_with_norm_(theirs, 1.0, torch.nn.utils.get_total_norm([q.grad for q in theirs]))
    for p, q in zip(ours, theirs):
        _close(p.grad, q.grad)
    with pytest.warns(FutureWarning, match="clip_grad_norm_"):
        tw.nn.utils.clip_grad_norm(ours, 0.5)


# ---------------------------------------------------------------- nn.utils.parametrize and parametrizations

class _Double:
    """A parametrization for either framework: doubles its input; torch's module class is made per framework."""

    @staticmethod
    def make(fw, with_inverse=True, shape_change=False):
        class Double(fw.nn.Module):
            def forward(self, x):
                return (x * 2).sum(0) if shape_change else x * 2

        if with_inverse:
            Double.right_inverse = lambda self, a: a / 2
        return Double()


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value).replace("torch", "tilewise").replace("Parameter containing", "")


@pytest.mark.parametrize("case", ["no_such_tensor", "shape_change", "remove_missing", "leave_sequence",
                                  "second_shape_change", "no_right_inverse"])
def test_parametrize_errors_match_torch(case):
    def attempt(fw):
        P = fw.nn.utils.parametrize  # noqa: N806
        layer = fw.nn.Linear(3, 3)
        if case == "no_such_tensor":
            return lambda: P.register_parametrization(layer, "nope", _Double.make(fw))
        if case == "shape_change":
            return lambda: P.register_parametrization(layer, "weight", _Double.make(fw, shape_change=True))
        if case == "remove_missing":
            return lambda: P.remove_parametrizations(layer, "weight")
        if case == "leave_sequence":
            fw.nn.utils.parametrizations.weight_norm(layer)
            return lambda: P.remove_parametrizations(layer, "weight", leave_parametrized=False)
        P.register_parametrization(layer, "weight", _Double.make(fw))
        if case == "second_shape_change":
            return lambda: P.register_parametrization(layer, "weight", _Double.make(fw, shape_change=True))
        P.register_parametrization(layer, "weight", _Double.make(fw, with_inverse=False))

        def assign():
            layer.weight = fw.ones(3, 3)
        return assign

    ours, theirs = _error(attempt(tw)), _error(attempt(torch))
    assert ours[0] is theirs[0]
    if case not in ("no_such_tensor", "remove_missing"):  # these print the module, whose repr differs
        assert ours[1] == theirs[1]


def test_parametrized_module_class_keys_and_removal_match_torch():
    def build(fw):
        layer = fw.nn.Linear(3, 3)
        fw.nn.utils.parametrize.register_parametrization(layer, "weight", _Double.make(fw))
        fw.nn.utils.parametrize.register_parametrization(layer, "bias", _Double.make(fw))
        return layer

    ours, theirs = build(tw), build(torch)
    assert type(ours).__name__ == type(theirs).__name__ == "ParametrizedLinear"
    assert tw.nn.utils.parametrize.type_before_parametrizations(ours) is tw.nn.Linear
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours.load_state_dict({k: tw.from_numpy(v.numpy().copy()) for k, v in theirs.state_dict().items()})
    _close(ours.weight, theirs.weight)
    copy = __import__("copy").deepcopy(ours)
    _close(copy.weight, ours.weight)
    with pytest.raises(RuntimeError, match="only supported through state_dict"):
        __import__("pickle").dumps(ours)
    for fw, layer in ((tw, ours), (torch, theirs)):
        fw.nn.utils.parametrize.remove_parametrizations(layer, "weight")
        fw.nn.utils.parametrize.remove_parametrizations(layer, "bias", leave_parametrized=False)
    assert type(ours) is tw.nn.Linear
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    _close(ours.weight, theirs.weight)
    _close(ours.bias, theirs.bias)


def test_cached_parametrization_is_computed_once():
    calls = []

    class Counted(tw.nn.Module):
        def forward(self, x):
            calls.append(1)
            return x + 1

    layer = tw.nn.utils.parametrize.register_parametrization(tw.nn.Linear(2, 2), "weight", Counted())
    calls.clear()
    with tw.nn.utils.parametrize.cached():
        first, second = layer.weight, layer.weight
    assert first is second and len(calls) == 1
    layer.weight, layer.weight  # noqa: B018 — each read evaluates again outside the context
    assert len(calls) == 3


def test_weight_norm_parametrization_loads_the_older_state_dict_keys_as_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = torch.nn.utils.weight_norm(torch.nn.Linear(4, 3))
    old_state = old.state_dict()
    assert set(old_state) == {"bias", "weight_g", "weight_v"}
    theirs = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3))
    ours = tw.nn.utils.parametrizations.weight_norm(tw.nn.Linear(4, 3))
    theirs.load_state_dict(old_state)
    given = {k: tw.from_numpy(v.numpy().copy()) for k, v in old_state.items()}
    ours.load_state_dict(given)
    assert set(given) == {"bias", "weight_g", "weight_v"}, "load_state_dict changed the caller's dict"
    _close(ours.weight, theirs.weight)
    _close(ours.weight, old.weight)


def test_load_state_dict_pre_hook_sees_the_module_and_its_prefix():
    seen = []
    outer = tw.nn.Sequential(tw.nn.Linear(2, 2))
    outer[0].register_load_state_dict_pre_hook(lambda module, state, prefix, *rest: seen.append((module, prefix)))
    outer.load_state_dict(outer.state_dict())
    assert seen == [(outer[0], "0.")]


def test_spectral_norm_parametrization_power_iteration_matches_torch_in_train_and_eval():
    theirs = torch.nn.utils.parametrizations.spectral_norm(torch.nn.ConvTranspose2d(3, 4, 3), n_power_iterations=2)
    ours = tw.nn.utils.parametrizations.spectral_norm(tw.nn.ConvTranspose2d(3, 4, 3), n_power_iterations=2)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tw.from_numpy(v.numpy().copy()) for k, v in theirs.state_dict().items()})
    for training in (True, True, False):
        ours.train(training)
        theirs.train(training)
        _close(ours.weight, theirs.weight)
        _close(ours.parametrizations.weight[0]._u, theirs.parametrizations.weight[0]._u)
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\] but got 2"):
        tw.nn.utils.parametrizations.spectral_norm(tw.nn.Linear(2, 2), dim=2)


@pytest.mark.parametrize("shape,mapping", [((4, 4), None), ((3, 5), None), ((5, 3), "cayley"), ((4, 4), "householder")])
def test_orthogonal_parametrization_matches_torch_given_its_state(shape, mapping):
    theirs = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(shape[1], shape[0]), orthogonal_map=mapping)
    ours = tw.nn.utils.parametrizations.orthogonal(tw.nn.Linear(shape[1], shape[0]), orthogonal_map=mapping)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tw.from_numpy(v.numpy().copy()) for k, v in theirs.state_dict().items()})
    _close(ours.weight, theirs.weight)
    x = np.random.default_rng(0).standard_normal((2, shape[1])).astype(np.float32)
    ours(tw.from_numpy(x)).square().sum().backward()
    theirs(torch.from_numpy(x)).square().sum().backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        _close(p.grad, q.grad, tol=1e-4)
    with pytest.raises(ValueError, match="orthogonal_map has to be one of"):
        tw.nn.utils.parametrizations.orthogonal(tw.nn.Linear(2, 2), orthogonal_map="qr")
