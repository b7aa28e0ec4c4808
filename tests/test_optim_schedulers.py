"""Every LR scheduler of tilewise.optim.lr_scheduler against torch's: the sequences of learning rates (and cycled
momenta) over many epochs, alone, chained and in sequence, with ``step(epoch)``, fractional epochs, ReduceLROnPlateau
in every mode, state-dict resume (from tilewise's state or torch's), the state dicts' keys, the warnings and the
constructor errors.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _lr_sequence(lib, make, steps=60, optimizer="SGD", **opt_kwargs):
    """(last lr, group lrs, group momenta) at each of ``steps`` epochs, with two param groups."""
    params = [lib.nn.Parameter(lib.zeros(1)) for _ in range(2)]
    groups = [{"params": [p], "lr": 0.1 * (k + 1)} for k, p in enumerate(params)]
    opt = getattr(lib.optim, optimizer)(groups, lr=0.1, **opt_kwargs)
    sched = make(opt, lib.optim.lr_scheduler)
    out = []
    for _ in range(steps):
        momenta = tuple(g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups)
        out.append((tuple(sched.get_last_lr()), tuple(g["lr"] for g in opt.param_groups), momenta))
        opt.step()
        sched.step()
    return out


SCHEDULES = {
    "MultiStepLR": lambda o, s: s.MultiStepLR(o, [3, 7, 7, 20], 0.5),
    "ConstantLR": lambda o, s: s.ConstantLR(o, 0.25, 6),
    "ExponentialLR": lambda o, s: s.ExponentialLR(o, 0.93),
    "PolynomialLR": lambda o, s: s.PolynomialLR(o, 25, 2.0),
    "MultiplicativeLR": lambda o, s: s.MultiplicativeLR(o, [lambda e: 0.97, lambda e: 0.9 + e / 1000]),
    "CosineAnnealingWarmRestarts": lambda o, s: s.CosineAnnealingWarmRestarts(o, 5, 2, 0.001),
    "CosineAnnealingWarmRestarts-T_mult1": lambda o, s: s.CosineAnnealingWarmRestarts(o, 7),
    "CyclicLR-triangular": lambda o, s: s.CyclicLR(o, 0.01, 0.1, step_size_up=4, step_size_down=6),
    "CyclicLR-triangular2": lambda o, s: s.CyclicLR(o, [0.01, 0.02], 0.1, step_size_up=5, mode="triangular2"),
    "CyclicLR-exp_range": lambda o, s: s.CyclicLR(o, 0.01, 0.1, step_size_up=3, mode="exp_range", gamma=0.95),
    "CyclicLR-scale_fn": lambda o, s: s.CyclicLR(o, 0.01, 0.1, step_size_up=3, scale_fn=lambda x: 0.9**x,
                                                 scale_mode="iterations", cycle_momentum=False),
    "ChainedScheduler": lambda o, s: s.ChainedScheduler([s.ConstantLR(o, 0.1, 4), s.ExponentialLR(o, 0.9),
                                                         s.MultiStepLR(o, [10, 20])]),
    "SequentialLR": lambda o, s: s.SequentialLR(o, [s.LinearLR(o, 0.1, 1, 5), s.ExponentialLR(o, 0.9),
                                                    s.PolynomialLR(o, 10)], [5, 15]),
    "SequentialLR-of-chained": lambda o, s: s.SequentialLR(o, [s.ConstantLR(o, 0.5, 3), s.StepLR(o, 4),
                                                               s.CosineAnnealingLR(o, 8)], [6, 20]),
    "OneCycleLR": lambda o, s: s.OneCycleLR(o, [1.0, 2.0], epochs=6, steps_per_epoch=10),
    "CosineAnnealingLR": lambda o, s: s.CosineAnnealingLR(o, 9, 0.01),
    "LinearLR": lambda o, s: s.LinearLR(o, 0.3, 0.9, 11),
    "StepLR": lambda o, s: s.StepLR(o, 4, 0.7),
    "LambdaLR": lambda o, s: s.LambdaLR(o, lambda e: 1 / (1 + e)),
}


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("optimizer,kwargs", [("SGD", {"momentum": 0.9}), ("Adam", {})], ids=["SGD", "Adam"])
def test_scheduler_sequence_equals_torchs(name, optimizer, kwargs):
    ours = _lr_sequence(tw, SCHEDULES[name], optimizer=optimizer, **kwargs)
    theirs = _lr_sequence(torch, SCHEDULES[name], optimizer=optimizer, **kwargs)
    assert ours == theirs


def _with_epochs(lib, make, epochs):
    opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1, momentum=0.9)
    sched = make(opt, lib.optim.lr_scheduler)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # step(epoch) is deprecated, in both
        for epoch in epochs:
            opt.step()
            sched.step(epoch)
            out.append(sched.get_last_lr()[0])
    return out


@pytest.mark.parametrize("name", ["StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
                                  "PolynomialLR", "CosineAnnealingLR", "LambdaLR"])
def test_step_with_an_epoch_takes_the_closed_form_as_torch(name):
    epochs = [3, 4, 10, 2, 2, 17, 30, 0, 5]
    assert _with_epochs(tw, SCHEDULES[name], epochs) == _with_epochs(torch, SCHEDULES[name], epochs)


@pytest.mark.parametrize("t_mult", [1, 2, 3])
def test_cosine_warm_restarts_with_fractional_epochs_equals_torch(t_mult):
    """The per-batch use: ``step(epoch + i / iters)``, restarts landing inside epochs, and jumps back."""
    def make(o, s):
        return s.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=t_mult, eta_min=0.01)

    epochs = [e + i / 7 for e in range(12) for i in range(7)] + [2.5, 0.0, 40.25, 13.0]
    assert _with_epochs(tw, make, epochs) == _with_epochs(torch, make, epochs)


PLATEAU = [dict(), dict(mode="max"), dict(threshold_mode="abs", threshold=0.05), dict(mode="max", threshold_mode="abs"),
           dict(patience=2, cooldown=3, factor=0.5), dict(min_lr=[0.05, 0.001], factor=0.3, patience=1),
           dict(min_lr=0.02, patience=0, eps=0.01), dict(factor=0.5, patience=1, threshold=0.2)]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=[str(k) for k in PLATEAU])
def test_reduce_on_plateau_equals_torch(kwargs):
    rng = np.random.default_rng(0)
    metrics = np.concatenate([np.linspace(1, 0.5, 10), 0.5 + 0.01 * rng.standard_normal(30),
                              np.linspace(0.5, 0.8, 10)]).tolist()

    def lrs(lib):
        opt = lib.optim.SGD([{"params": [lib.nn.Parameter(lib.zeros(1))], "lr": 0.1},
                             {"params": [lib.nn.Parameter(lib.zeros(1))], "lr": 0.01}])
        sched = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
        out = []
        for k, m in enumerate(metrics):
            opt.step()
            sched.step(lib.tensor(m) if k % 2 else m)  # a 0-dim tensor or a number
            out.append((tuple(sched.get_last_lr()), sched.num_bad_epochs, sched.cooldown_counter, sched.best))
        return out

    assert lrs(tw) == lrs(torch)


@pytest.mark.parametrize("source", ["tilewise", "torch"])
def test_reduce_on_plateau_state_dict_resumes(source):
    metrics = [1.0, 0.9, 0.9, 0.95, 0.9, 0.91, 0.92, 0.5, 0.6, 0.6, 0.6, 0.6, 0.7, 0.7]
    kwargs = dict(mode="min", patience=1, cooldown=1, factor=0.5, threshold=0.01, threshold_mode="abs", min_lr=0.02)

    def run(lib, metrics, state=None):
        opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
        sched = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
        if state is not None:
            sched.load_state_dict(state[1])
            opt.load_state_dict(state[0])
        lrs = []
        for m in metrics:
            opt.step()
            sched.step(m)
            lrs.append(sched.get_last_lr()[0])
        return lrs, (opt.state_dict(), sched.state_dict())

    straight, _ = run(torch, metrics)
    first, state = run(tw if source == "tilewise" else torch, metrics[:6])
    rest, _ = run(tw, metrics[6:], state)
    assert first + rest == straight


def test_reduce_on_plateau_errors_match_torch():
    for lib in (tw, torch):
        opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
        plateau = lib.optim.lr_scheduler.ReduceLROnPlateau
        with pytest.raises(ValueError, match="Factor should be < 1.0."):
            plateau(opt, factor=1.0)
        with pytest.raises(ValueError, match="mode middle is unknown!"):
            plateau(opt, mode="middle")
        with pytest.raises(ValueError, match="threshold mode both is unknown!"):
            plateau(opt, threshold_mode="both")
        with pytest.raises(ValueError, match="expected 1 min_lrs, got 2"):
            plateau(opt, min_lr=[0.1, 0.2])
        s = lib.optim.lr_scheduler
        with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
            s.SequentialLR(opt, [s.StepLR(opt, 2), plateau(opt)], [3])


RESUMABLE = ["StepLR", "ExponentialLR", "CosineAnnealingWarmRestarts", "CyclicLR-triangular2", "OneCycleLR",
             "SequentialLR", "ChainedScheduler", "LambdaLR", "PolynomialLR", "CosineAnnealingLR"]


@pytest.mark.parametrize("source", ["tilewise", "torch"])
@pytest.mark.parametrize("name", RESUMABLE)
def test_scheduler_state_dict_resumes_the_sequence(name, source):
    """Save the optimizer's and the scheduler's state mid-way (from tilewise, or from torch), load both into a new
    pair, and the rest of the sequence is the uninterrupted one."""
    make = SCHEDULES[name]
    straight = _lr_sequence(torch, make, steps=40, optimizer="SGD", momentum=0.9)

    lib = tw if source == "tilewise" else torch
    params = [lib.nn.Parameter(lib.zeros(1)) for _ in range(2)]
    opt = lib.optim.SGD([{"params": [p], "lr": 0.1 * (k + 1)} for k, p in enumerate(params)], lr=0.1, momentum=0.9)
    sched = make(opt, lib.optim.lr_scheduler)
    for _ in range(17):
        opt.step()
        sched.step()
    opt_state, sched_state = opt.state_dict(), sched.state_dict()

    params = [tw.nn.Parameter(tw.zeros(1)) for _ in range(2)]
    opt = tw.optim.SGD([{"params": [p], "lr": 0.1 * (k + 1)} for k, p in enumerate(params)], lr=0.1, momentum=0.9)
    sched = make(opt, tw.optim.lr_scheduler)
    sched.load_state_dict(sched_state)
    opt.load_state_dict(opt_state)
    rest = []
    for _ in range(17, 40):
        momenta = tuple(g.get("momentum") for g in opt.param_groups)
        rest.append((tuple(sched.get_last_lr()), tuple(g["lr"] for g in opt.param_groups), momenta))
        opt.step()
        sched.step()
    assert rest == straight[17:]


def test_scheduler_state_dict_has_torchs_keys():
    for name in ["StepLR", "OneCycleLR", "CyclicLR-exp_range", "CosineAnnealingWarmRestarts", "SequentialLR",
                 "MultiplicativeLR"]:
        keys = []
        for lib in (tw, torch):
            opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1)), lib.nn.Parameter(lib.zeros(1))], lr=0.1,
                                momentum=0.9)
            opt = lib.optim.SGD([{"params": [p]} for g in opt.param_groups for p in g["params"]], lr=0.1,
                                momentum=0.9)
            sched = SCHEDULES[name](opt, lib.optim.lr_scheduler)
            opt.step()
            sched.step()
            keys.append(sorted(sched.state_dict()))
        assert keys[0] == keys[1], name
    plateau = [sorted(lib.optim.lr_scheduler.ReduceLROnPlateau(lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))]))
                      .state_dict()) for lib in (tw, torch)]
    assert plateau[0] == plateau[1]


def _warnings_of(lib, actions) -> list[str]:
    opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
    sched = lib.optim.lr_scheduler.StepLR(opt, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actions(opt, sched)
    return [str(w.message).split(".")[0] for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("case", ["scheduler-first", "in-order", "optimizer-step-replaced", "get_lr", "epoch"])
def test_scheduler_warnings_are_torchs(case):
    def replace_step(opt, sched):
        opt.step = lambda closure=None: None
        opt.step()
        sched.step()

    actions = {
        "scheduler-first": lambda opt, sched: (sched.step(), opt.step()),
        "in-order": lambda opt, sched: (opt.step(), sched.step(), opt.step(), sched.step()),
        "optimizer-step-replaced": replace_step,
        "get_lr": lambda opt, sched: sched.get_lr(),
        "epoch": lambda opt, sched: (opt.step(), sched.step(3)),
    }[case]
    ours, theirs = _warnings_of(tw, actions), _warnings_of(torch, actions)
    assert ours == theirs
    assert bool(ours) == (case != "in-order")


def test_scheduler_constructor_errors_match_torch():
    cases = [
        (lambda o, s: s.CosineAnnealingWarmRestarts(o, T_0=0), ValueError),
        (lambda o, s: s.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=0), ValueError),
        (lambda o, s: s.ConstantLR(o, factor=1.5), ValueError),
        (lambda o, s: s.LinearLR(o, start_factor=0), ValueError),
        (lambda o, s: s.CyclicLR(o, 0.1, 1.0, mode="square"), ValueError),
        (lambda o, s: s.OneCycleLR(o, 1.0), ValueError),
        (lambda o, s: s.OneCycleLR(o, 1.0, total_steps=10, pct_start=1), ValueError),
        (lambda o, s: s.MultiplicativeLR(o, 0.9), TypeError),
        (lambda o, s: s.LambdaLR(o, [lambda e: 1.0, lambda e: 1.0]), ValueError),
        (lambda o, s: s.StepLR(o, 2, last_epoch=3), KeyError),
        (lambda o, s: s.SequentialLR(o, [s.StepLR(o, 2)], [3]), ValueError),
        (lambda o, s: s.ChainedScheduler([]), ValueError),
        (lambda o, s: s.StepLR(object(), 2), TypeError),
    ]
    for make, error in cases:
        messages = []
        for lib in (tw, torch):
            opt = lib.optim.Adagrad([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
            with pytest.raises(error) as info:
                make(opt, lib.optim.lr_scheduler)
            messages.append(str(info.value).split("\n")[0])
        assert messages[0] == messages[1]


def test_resuming_with_last_epoch_continues_from_the_saved_epoch():
    """``last_epoch=k`` with the optimizer's ``initial_lr`` in place (as after loading its state dict) starts at
    epoch k+1, as torch's does."""
    def five_steps(opt, sched):
        lrs = []
        for _ in range(5):
            opt.step()
            sched.step()
            lrs.append(sched.get_last_lr()[0])
        return lrs

    seqs = []
    for lib in (tw, torch):
        opt = lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
        opt.param_groups[0]["initial_lr"] = 0.1
        opt.param_groups[0]["lr"] = 0.05
        schedules = lib.optim.lr_scheduler
        first = five_steps(opt, schedules.ExponentialLR(opt, 0.9, last_epoch=4))
        seqs.append(first + five_steps(opt, schedules.StepLR(opt, 3, 0.5, last_epoch=7)))
    assert seqs[0] == seqs[1]


def _checkpoint_through_a_file(source, target, state, tmp_path):
    path = tmp_path / "checkpoint.pt"
    source.save(state, path)
    return tw.load(path) if target is tw else torch.load(path, weights_only=True)


@pytest.mark.parametrize("direction", ["torch-to-tilewise", "tilewise-to-torch"])
@pytest.mark.parametrize("name", ["MultiStepLR", "OneCycleLR", "CyclicLR-exp_range", "SequentialLR",
                                  "ChainedScheduler", "CosineAnnealingWarmRestarts"])
def test_a_scheduler_checkpoint_written_by_one_library_continues_in_the_other(name, direction, tmp_path):
    """``save({"optimizer": ..., "scheduler": ...})`` by one library, ``load`` and ``load_state_dict`` by the other
    (torch's default ``weights_only`` load included), and the rest of the sequence is the uninterrupted one."""
    source, target = (torch, tw) if direction == "torch-to-tilewise" else (tw, torch)
    make = SCHEDULES[name]
    straight = _lr_sequence(torch, make, steps=30, optimizer="SGD", momentum=0.9)

    def pair(lib):
        params = [lib.nn.Parameter(lib.zeros(1)) for _ in range(2)]
        groups = [{"params": [p], "lr": 0.1 * (k + 1)} for k, p in enumerate(params)]
        opt = lib.optim.SGD(groups, lr=0.1, momentum=0.9)
        return opt, make(opt, lib.optim.lr_scheduler)

    opt, sched = pair(source)
    for _ in range(12):
        opt.step()
        sched.step()
    saved = _checkpoint_through_a_file(source, target, {"optimizer": opt.state_dict(),
                                                        "scheduler": sched.state_dict()}, tmp_path)
    opt, sched = pair(target)
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["scheduler"])
    rest = []
    for _ in range(12, 30):
        momenta = tuple(g.get("momentum") for g in opt.param_groups)
        rest.append((tuple(sched.get_last_lr()), tuple(g["lr"] for g in opt.param_groups), momenta))
        opt.step()
        sched.step()
    assert rest == straight[12:]
