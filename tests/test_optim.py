"""Optimizers and LR schedulers against torch: same weights, same data, same trajectory to float32 rounding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.optim import lr_scheduler as tw_sched

STEPS = 50

OPTIMIZERS = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, maximize=False)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.3, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
]


def _mlp(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Linear(8, 16), lib.nn.Tanh(), lib.nn.Linear(16, 4))


def _copy_weights_from(model, ref) -> None:
    model.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})


def _paired_models():
    """A torch MLP and a tilewise MLP holding the same weights (copied through DLPack)."""
    ref = _mlp(torch)
    model = _mlp(tw)
    _copy_weights_from(model, ref)
    return model, ref


def _data(steps: int = STEPS):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((steps, 16, 8)).astype(np.float32),
            rng.standard_normal((steps, 16, 4)).astype(np.float32))


def _train(lib, model, optimizer, xs, ys, start=0, stop=STEPS, scheduler=None) -> list[float]:
    losses = []
    for i in range(start, stop):
        loss = ((model(lib.tensor(xs[i])) - lib.tensor(ys[i])) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses


def _assert_same_params(model, ref, atol=2e-6):
    ours = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(ours[name].detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=atol,
                                   err_msg=name)


@pytest.mark.parametrize("name,kwargs", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_optimizer_matches_torch(name, kwargs):
    model, ref = _paired_models()
    xs, ys = _data()
    ours = _train(tw, model, getattr(tw.optim, name)(model.parameters(), **kwargs), xs, ys)
    theirs = _train(torch, ref, getattr(torch.optim, name)(ref.parameters(), **kwargs), xs, ys)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    _assert_same_params(model, ref)


@pytest.mark.parametrize("kwargs", [dict(lr=0.01), dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True),
                                    dict(lr=0.01, maximize=True, foreach=None, fused=True)],
                         ids=["plain", "amsgrad", "maximize-fused"])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_foreach_adam_compiles_the_group_and_matches_torch_and_the_loop(name, kwargs):
    """foreach=True: every parameter of a group updated by one compiled program (C here), the same numbers as
    the per-parameter loop and torch; the learning rate a scheduler sets is a run-time value (no recompile)."""
    kwargs = {"foreach": True, **kwargs}
    model, ref = _paired_models()
    loop_model = _mlp(tw)
    _copy_weights_from(loop_model, ref)
    xs, ys = _data(8)
    opt = getattr(tw.optim, name)(model.parameters(), **kwargs)
    loop_opt = getattr(tw.optim, name)(loop_model.parameters(), **{**kwargs, "foreach": False, "fused": False})
    torch_opt = getattr(torch.optim, name)(ref.parameters(), **{**kwargs, "foreach": False, "fused": None})
    scheds = [tw_sched.StepLR(opt, 2, 0.5), tw_sched.StepLR(loop_opt, 2, 0.5), torch.optim.lr_scheduler.StepLR(
        torch_opt, 2, 0.5)]
    ours = _train(tw, model, opt, xs, ys, stop=8, scheduler=scheds[0])
    loop = _train(tw, loop_model, loop_opt, xs, ys, stop=8, scheduler=scheds[1])
    theirs = _train(torch, ref, torch_opt, xs, ys, stop=8, scheduler=scheds[2])
    assert ours == loop
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    _assert_same_params(model, ref)
    (program,) = opt._programs.values()
    assert len(program.variants) == 1 and program.eager_reason is None


def test_foreach_clip_grad_norm_matches_the_loop():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(shape).astype(np.float32) for shape in [(7, 3), (5,), (4, 4, 2)]]
    results = []
    for foreach in (False, True):
        params = [tw.nn.Parameter(tw.zeros(g.shape)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = tw.from_numpy(g.copy())
        norms = [tw.nn.utils.clip_grad_norm_(params, 1.5, foreach=foreach).item() for _ in range(2)]
        results.append((norms, [p.grad.numpy() for p in params]))
    (loop_norms, loop_grads), (norms, clipped) = results
    np.testing.assert_allclose(norms, loop_norms, rtol=1e-6)  # the sums may add in another order
    assert norms[1] == pytest.approx(1.5, rel=1e-5)
    for a, b in zip(clipped, loop_grads):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_param_groups_with_their_own_hyperparameters_match_torch():
    model, ref = _paired_models()
    xs, ys = _data()

    def groups(m):
        return [{"params": m[0].parameters(), "lr": 0.02}, {"params": m[2].parameters(), "weight_decay": 0.5}]

    _train(tw, model, tw.optim.AdamW(groups(model), lr=0.01), xs, ys)
    _train(torch, ref, torch.optim.AdamW(groups(ref), lr=0.01), xs, ys)
    _assert_same_params(model, ref)


@pytest.mark.parametrize("name,kwargs", [OPTIMIZERS[1], OPTIMIZERS[4], OPTIMIZERS[8], OPTIMIZERS[10]],
                         ids=["SGD", "Adam", "RMSprop", "Adagrad"])
def test_state_dict_resume_through_a_checkpoint_continues_the_same_trajectory(name, kwargs):
    xs, ys = _data()
    model, _ = _paired_models()
    straight = _train(tw, model, getattr(tw.optim, name)(model.parameters(), **kwargs), xs, ys)

    model, _ = _paired_models()
    opt = getattr(tw.optim, name)(model.parameters(), **kwargs)
    first = _train(tw, model, opt, xs, ys, stop=20)
    buf = io.BytesIO()
    tw.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    saved = tw.load(buf)
    resumed_model, _ = _paired_models()
    resumed_model.load_state_dict(saved["model"])
    resumed_opt = getattr(tw.optim, name)(resumed_model.parameters(), **kwargs)
    resumed_opt.load_state_dict(saved["optimizer"])
    rest = _train(tw, resumed_model, resumed_opt, xs, ys, start=20)
    assert first + rest == straight


def test_state_dict_layout_matches_torch():
    model, ref = _paired_models()
    xs, ys = _data(3)
    opt = tw.optim.Adam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    _train(tw, model, opt, xs, ys, stop=3)
    _train(torch, ref, ref_opt, xs, ys, stop=3)
    ours, theirs = opt.state_dict(), ref_opt.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    assert ours["state"][0].keys() == theirs["state"][0].keys()
    assert ours["param_groups"][0]["params"] == theirs["param_groups"][0]["params"]
    assert set(ours["param_groups"][0]) <= set(theirs["param_groups"][0])
    assert ours["state"][0]["step"].item() == theirs["state"][0]["step"].item() == 3


def test_a_torch_optimizer_state_dict_resumes_in_tilewise():
    xs, ys = _data()
    model, ref = _paired_models()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, amsgrad=True)
    _train(torch, ref, ref_opt, xs, ys, stop=10)
    _copy_weights_from(model, ref)
    opt = tw.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    opt.load_state_dict(ref_opt.state_dict())
    ours = _train(tw, model, opt, xs, ys, start=10)
    theirs = _train(torch, ref, ref_opt, xs, ys, start=10)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    _assert_same_params(model, ref)


def test_optimizer_errors_are_clear():
    p = tw.nn.Parameter(tw.zeros(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        tw.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        tw.optim.Adam([p], lr=-1.0)
    with pytest.raises(ValueError, match="more than one parameter group"):
        tw.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        tw.optim.SGD([p * 2], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        tw.optim.SGD([p], lr=0.1, nesterov=True)
    opt = tw.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})


def test_zero_grad_sets_to_none_or_zeroes_in_place():
    p = tw.nn.Parameter(tw.ones(3))
    opt = tw.optim.SGD([p], lr=0.1)
    (p * 2).sum().backward()
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and p.grad.tolist() == [0.0, 0.0, 0.0]
    opt.zero_grad()
    assert p.grad is None


def test_step_with_closure_returns_the_loss():
    p = tw.nn.Parameter(tw.tensor([1.0, 2.0]))
    opt = tw.optim.SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 5.0
    np.testing.assert_allclose(p.detach().numpy(), [0.8, 1.6], rtol=1e-6)


# ---------------------------------------------------------------------------- schedulers

def _lr_sequence(lib, make, steps=40, optimizer="SGD", **opt_kwargs):
    p = lib.nn.Parameter(lib.zeros(1))
    opt = getattr(lib.optim, optimizer)([p], lr=0.1, **opt_kwargs)
    sched = make(opt, lib.optim.lr_scheduler)
    lrs, momenta = [], []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        group = opt.param_groups[0]
        momenta.append(group["betas"][0] if "betas" in group else group.get("momentum"))
        opt.step()
        sched.step()
    return lrs, momenta


SCHEDULES = {
    "StepLR": lambda o, s: s.StepLR(o, step_size=7, gamma=0.5),
    "CosineAnnealingLR": lambda o, s: s.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
    "LambdaLR": lambda o, s: s.LambdaLR(o, lambda epoch: 0.95**epoch),
    "LinearLR": lambda o, s: s.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=8),
    "OneCycleLR": lambda o, s: s.OneCycleLR(o, max_lr=1.0, total_steps=41),
    "OneCycleLR-three-phase-linear": lambda o, s: s.OneCycleLR(o, max_lr=[0.5], total_steps=41, three_phase=True,
                                                               anneal_strategy="linear"),
    "SequentialLR": lambda o, s: s.SequentialLR(o, [s.LinearLR(o, 0.1, 1.0, 5), s.CosineAnnealingLR(o, 20)], [5]),
    "SequentialLR-three": lambda o, s: s.SequentialLR(o, [s.StepLR(o, 3), s.LambdaLR(o, lambda e: 1 / (e + 1)),
                                                          s.CosineAnnealingLR(o, 5)], [6, 12]),
}


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("optimizer,kwargs", [("SGD", {"momentum": 0.9}), ("Adam", {})], ids=["SGD", "Adam"])
def test_scheduler_lr_sequence_matches_torch(name, optimizer, kwargs):
    ours = _lr_sequence(tw, SCHEDULES[name], optimizer=optimizer, **kwargs)
    theirs = _lr_sequence(torch, SCHEDULES[name], optimizer=optimizer, **kwargs)
    assert ours == theirs


def test_scheduler_state_dict_round_trip_continues_the_sequence():
    p = tw.nn.Parameter(tw.zeros(1))
    opt = tw.optim.SGD([p], lr=0.1)
    sched = tw_sched.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        opt.step()
        sched.step()
    state = sched.state_dict()
    expected = [sched.get_last_lr()[0]]
    for _ in range(3):
        opt.step()
        sched.step()
        expected.append(sched.get_last_lr()[0])

    opt2 = tw.optim.SGD([tw.nn.Parameter(tw.zeros(1))], lr=0.1)
    sched2 = tw_sched.CosineAnnealingLR(opt2, T_max=10)
    sched2.load_state_dict(state)
    opt2.param_groups[0]["lr"] = state["_last_lr"][0]
    got = [sched2.get_last_lr()[0]]
    for _ in range(3):
        opt2.step()
        sched2.step()
        got.append(sched2.get_last_lr()[0])
    assert got == expected


def test_one_cycle_rejects_stepping_past_total_steps():
    opt = tw.optim.SGD([tw.nn.Parameter(tw.zeros(1))], lr=0.1, momentum=0.9)
    sched = tw_sched.OneCycleLR(opt, max_lr=1.0, total_steps=3)
    for _ in range(3):
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="Tried to step 4 times"):
        sched.step()


@pytest.mark.parametrize("name,extra", [("Adam", {}), ("AdamW", {}), ("RMSprop", {"momentum": 0.9}),
                                        ("SGD", {"momentum": 0.9}), ("SGD", {"momentum": 0.9, "nesterov": True}),
                                        ("SGD", {"momentum": 0.9, "dampening": 0.5}), ("SGD", {})])
def test_init_state_creates_what_a_first_step_would_and_changes_no_result(name, extra):
    """``init_state`` (what tilewise.compile calls before tracing a training step) makes the zero state a first
    step would make; later steps are the same, to the bit, as with the state made lazily. SGD's momentum buffer
    starts as the first gradient: without dampening a zero buffer gives it (``0 * momentum + g``); with
    dampening (``(1 - dampening) * g`` would follow) and without momentum nothing is made."""
    kwargs = {"lr": 0.1, **extra}
    tw.manual_seed(0)
    params = [[tw.randn(3, 4).requires_grad_(), tw.randn(4).requires_grad_()] for _ in range(2)]
    for a, b in zip(*params):
        b.data.copy_(a.data)
    lazy, early = (getattr(tw.optim, name)(p, **kwargs) for p in params)
    early.init_state()
    made = 0 if name == "SGD" and (extra.get("dampening") or not extra.get("momentum")) else 2
    assert len(early.state) == made
    for step in range(3):
        for p, opt in zip(params, (lazy, early)):
            loss = (p[0].sum(0) * p[1]).square().sum() + step
            loss.backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(*params):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_loading_an_optimizers_live_state_shares_it_as_torchs_does():
    """torch's load_state_dict keeps the loaded tensors where they already have the parameter's device and dtype
    (and ``step`` as loaded): an optimizer loading another's ``state_dict()`` shares its state, and both stepping
    then move the same buffers. Cast or moved tensors are new."""
    import torch

    results = []
    for lib in (torch, tw):
        p = lib.nn.Parameter(lib.ones(3))
        first = lib.optim.Adam([p], lr=0.1)
        p.grad = lib.ones(3)
        first.step()
        q = lib.nn.Parameter(lib.ones(3))
        second = lib.optim.Adam([q], lr=0.1)
        second.load_state_dict(first.state_dict())
        shared = second.state[q]["exp_avg"] is first.state[p]["exp_avg"]
        same_step = second.state[q]["step"] is first.state[p]["step"]
        q.grad = lib.full((3,), 2.0)
        second.step()
        first.step()
        r = lib.nn.Parameter(lib.ones(3, dtype=lib.float64))
        third = lib.optim.Adam([r], lr=0.1)
        third.load_state_dict(first.state_dict())
        cast = third.state[r]["exp_avg"]
        results.append((shared, same_step, first.state[p]["exp_avg"].tolist(), p.tolist(), q.tolist(),
                        str(cast.dtype).split(".")[-1], cast is first.state[p]["exp_avg"]))
    assert results[0] == results[1]


def test_sgd_buffers_made_before_the_first_step_keep_a_gradients_signed_zeros_as_torch():
    """torch's first momentum buffer is a copy of the gradient; the buffer ``init_state`` makes for a compiled step
    must give the same bits from ``buf * momentum + g``, signed zeros and NaN included (a -0.0 gradient on a -0.0
    parameter leaves it +0.0 in torch)."""
    import torch

    values = [-0.0, 0.0, -0.0, 1.5, float("nan"), float("-inf")]
    grads = [-0.0, -0.0, 0.0, -2.0, 1.0, 3.0]
    theirs = torch.nn.Parameter(torch.tensor(values))
    theirs.grad = torch.tensor(grads)
    torch.optim.SGD([theirs], lr=0.1, momentum=0.9).step()
    ours = tw.nn.Parameter(tw.tensor(values))
    opt = tw.optim.SGD([ours], lr=0.1, momentum=0.9)
    opt.init_state()
    ours.grad = tw.tensor(grads)
    opt.step()
    np.testing.assert_array_equal(np.signbit(ours.detach().numpy()), np.signbit(theirs.detach().numpy()))
    np.testing.assert_array_equal(ours.detach().numpy(), theirs.detach().numpy())
    np.testing.assert_array_equal(np.signbit(opt.state[ours]["momentum_buffer"].numpy()), np.signbit(grads))
