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
