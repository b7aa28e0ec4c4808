"""optim.swa_utils (AveragedModel, SWALR, update_bn, the averaging functions) and the nn.init leftovers (dirac_,
orthogonal_, sparse_, the deprecated names), compared with torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _models(seed: int = 0):
    """The same small model with batch norm in both libraries, with the same weights."""
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    ours = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.BatchNorm1d(4), tw.nn.Linear(4, 2))
    _set_weights(ours, theirs, np.random.default_rng(seed))
    return ours, theirs


def _set_weights(ours, theirs, rng) -> None:
    with torch.no_grad():
        for p, q in zip(theirs.parameters(), ours.parameters()):
            values = rng.standard_normal(tuple(p.shape)).astype(np.float32)
            p.copy_(torch.tensor(values))
            q.data.copy_(tw.tensor(values))
        for b, c in zip(theirs.buffers(), ours.buffers()):
            if b.is_floating_point():
                values = rng.random(tuple(b.shape)).astype(np.float32) + 0.5
                b.copy_(torch.tensor(values))
                c.copy_(tw.tensor(values))


def _assert_same_state(ours, theirs, rtol=1e-6):
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        np.testing.assert_allclose(ours_state[key].numpy(), value.numpy(), rtol=rtol, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("averaging", ["swa", "ema", "ema_multi", "swa_multi", "custom"])
@pytest.mark.parametrize("use_buffers", [False, True], ids=["params", "buffers"])
def test_averaged_model_follows_torch(averaging, use_buffers):
    ours, theirs = _models()
    averaged = []
    for lib, model in ((tw, ours), (torch, theirs)):
        swa = lib.optim.swa_utils
        kwargs = {"swa": {}, "ema": {"avg_fn": swa.get_ema_avg_fn(0.8)},
                  "ema_multi": {"multi_avg_fn": swa.get_ema_multi_avg_fn(0.8)},
                  "swa_multi": {"multi_avg_fn": swa.get_swa_multi_avg_fn()},
                  "custom": {"avg_fn": lambda a, m, n: (a * n + m * 2) / (n + 2)}}[averaging]
        averaged.append(swa.AveragedModel(model, use_buffers=use_buffers, **kwargs))
    rng = np.random.default_rng(1)
    if averaging == "swa_multi" and use_buffers:  # batch norm's integer count meets addcdiv: both refuse
        for average, model in zip(averaged, (ours, theirs)):
            average.update_parameters(model)
            with pytest.raises(RuntimeError):
                average.update_parameters(model)
        return
    for _ in range(4):
        _set_weights(ours, theirs, rng)
        averaged[0].update_parameters(ours)
        averaged[1].update_parameters(theirs)
        _assert_same_state(averaged[0], averaged[1])
    x = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    averaged[0].eval(), averaged[1].eval()
    np.testing.assert_allclose(averaged[0](tw.tensor(x)).detach().numpy(),
                               averaged[1](torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_averaged_model_refusals_and_decay_checks():
    model = tw.nn.Linear(2, 2)
    swa = tw.optim.swa_utils
    with pytest.raises(AssertionError, match="Only one of avg_fn and multi_avg_fn"):
        swa.AveragedModel(model, avg_fn=swa.get_ema_avg_fn(), multi_avg_fn=swa.get_ema_multi_avg_fn())
    for make in (swa.get_ema_avg_fn, swa.get_ema_multi_avg_fn):
        with pytest.raises(ValueError, match=r"Invalid decay value 1.5 provided. Please provide a value in \[0,1\]"):
            make(1.5)
    copy = swa.AveragedModel(model)
    assert copy.module is not model and copy.n_averaged.dtype is tw.int64 and copy.n_averaged.item() == 0


def test_update_bn_recomputes_statistics_as_torch():
    ours, theirs = _models()
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((8, 3)).astype(np.float32) * 2 + 1 for _ in range(3)]
    ours.eval(), theirs.eval()
    tw.optim.swa_utils.update_bn([(tw.tensor(b), 0) for b in batches], ours)
    torch.optim.swa_utils.update_bn([(torch.tensor(b), 0) for b in batches], theirs)
    _assert_same_state(ours, theirs, rtol=1e-5)
    assert not ours.training and ours[1].momentum == 0.1
    tw.optim.swa_utils.update_bn([tw.tensor(batches[0])], tw.nn.Linear(3, 1))  # nothing to update


@pytest.mark.parametrize("strategy,epochs", [("cos", 3), ("linear", 4), ("cos", 0)])
def test_swalr_learning_rates_follow_torch(strategy, epochs):
    lrs = []
    for lib in (tw, torch):
        params = [lib.nn.Parameter(lib.zeros(2)), lib.nn.Parameter(lib.zeros(1))]
        opt = lib.optim.SGD([{"params": params[:1]}, {"params": params[1:], "lr": 0.3}], lr=0.1)
        sched = lib.optim.swa_utils.SWALR(opt, swa_lr=[0.05, 0.01], anneal_epochs=epochs, anneal_strategy=strategy)
        seen = [sched.get_last_lr()]
        for _ in range(6):
            opt.step()
            sched.step()
            seen.append(sched.get_last_lr())
        lrs.append(seen)
        state = sched.state_dict()
        assert "anneal_func" not in state and state["_anneal_strategy"] == strategy
    np.testing.assert_allclose(np.array(lrs[0]), np.array(lrs[1]), rtol=1e-15)


def test_swalr_refusals_match_torch():
    for bad, kwargs in ((ValueError, dict(anneal_strategy="exp")), (ValueError, dict(anneal_epochs=-1)),
                        (ValueError, dict(swa_lr=[0.1, 0.2]))):
        messages = []
        for lib in (tw, torch):
            opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
            with pytest.raises(bad) as info:
                lib.optim.swa_utils.SWALR(opt, **{"swa_lr": 0.05, **kwargs})
            messages.append(str(info.value))
        assert messages[0] == messages[1]


# ---------------------------------------------------------------------------- nn.init


@pytest.mark.parametrize("shape,groups", [((4, 4, 3), 1), ((6, 4, 3, 3), 2), ((4, 6, 3, 2, 5), 1), ((3, 2, 1, 1), 3)])
def test_dirac_matches_torch(shape, groups):
    ours = tw.nn.init.dirac_(tw.empty(shape, requires_grad=True), groups)
    theirs = torch.nn.init.dirac_(torch.empty(shape, requires_grad=True), groups)
    np.testing.assert_array_equal(ours.detach().numpy(), theirs.detach().numpy())
    assert ours.requires_grad and ours.is_leaf


@pytest.mark.parametrize("fn,args,shape", [("dirac_", (), (2, 3)), ("dirac_", (2,), (3, 2, 3)),
                                           ("orthogonal_", (), (3,)), ("sparse_", (0.5,), (2, 3, 4))])
def test_init_errors_match_torch(fn, args, shape):
    messages = []
    for lib in (tw, torch):
        with pytest.raises(ValueError) as info:
            getattr(lib.nn.init, fn)(lib.empty(shape), *args)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("shape,gain", [((3, 5), 1.0), ((6, 2), 2.0), ((4, 2, 3, 3), 0.5), ((5, 5), 1.0)])
def test_orthogonal_gives_orthonormal_rows_or_columns(shape, gain):
    t = tw.nn.init.orthogonal_(tw.empty(shape), gain=gain)
    flat = t.numpy().reshape(shape[0], -1)
    small = flat @ flat.T if flat.shape[0] <= flat.shape[1] else flat.T @ flat
    np.testing.assert_allclose(small, gain**2 * np.eye(len(small)), atol=1e-5)
    again = tw.nn.init.orthogonal_(tw.empty(shape), generator=tw.Generator().manual_seed(0))
    same = tw.nn.init.orthogonal_(tw.empty(shape), generator=tw.Generator().manual_seed(0))
    assert np.array_equal(again.numpy(), same.numpy())
    assert tw.nn.init.orthogonal_(tw.empty(0, 3)).shape == (0, 3)


def test_sparse_zeroes_the_same_count_per_column_as_torch():
    ours = tw.nn.init.sparse_(tw.empty(20, 7), sparsity=0.3, std=0.5)
    theirs = torch.nn.init.sparse_(torch.empty(20, 7), sparsity=0.3, std=0.5)
    np.testing.assert_array_equal((ours.numpy() == 0).sum(0), (theirs.numpy() == 0).sum(0))
    kept = ours.numpy()[ours.numpy() != 0]
    assert 0.3 < kept.std() < 0.7


@pytest.mark.parametrize("name,args", [("uniform", ()), ("normal", ()), ("constant", (0.5,)), ("eye", ()),
                                       ("xavier_uniform", ()), ("xavier_normal", ()), ("kaiming_uniform", ()),
                                       ("kaiming_normal", ()), ("orthogonal", ()), ("sparse", (0.5,))])
def test_deprecated_names_warn_as_torch_and_still_initialise(name, args):
    messages = []
    for lib in (tw, torch):
        t = lib.zeros(4, 4)
        with pytest.warns(FutureWarning) as record:
            out = getattr(lib.nn.init, name)(t, *args)
        assert out is t and getattr(lib.nn.init, name).__name__ == name
        messages.append(str(record[0].message))
    assert messages[0] == messages[1]


def test_deprecated_dirac_warns_and_matches_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ours = tw.nn.init.dirac(tw.empty(2, 2, 3))
        theirs = torch.nn.init.dirac(torch.empty(2, 2, 3))
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
