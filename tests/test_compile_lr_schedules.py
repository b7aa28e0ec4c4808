"""A compiled training step under a learning-rate schedule: the program reads each group's rate at run time, so a
new rate at every step neither recompiles nor runs eagerly past the recompile limit, and the steps equal eager
ones. Optimizers whose own ``step`` reads the rate as a number keep being compiled per rate, and stay correct."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from compiled_steps import classifier_step

import tilewise as tw

OPTIMIZERS = {
    "adamw": lambda params: tw.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "sgd": lambda params: tw.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: tw.optim.Adam(params, lr=1e-2),
    "rmsprop": lambda params: tw.optim.RMSprop(params, lr=1e-2),
}


def _train(compiled: bool, make_opt, schedule, steps: int = 24):
    tw.manual_seed(0)
    x, y = tw.randn(64, 20), tw.randint(0, 3, (64,))
    model = tw.nn.Sequential(tw.nn.Linear(20, 32), tw.nn.ReLU(), tw.nn.Linear(32, 3))
    opt = make_opt(model.parameters())
    scheduler = schedule(opt)
    step = classifier_step(model, opt, tw.nn.functional.cross_entropy)
    f = tw.compile(step) if compiled else step
    losses = []
    for k in range(steps):
        losses.append(float(f(x, y)))
        scheduler(k)
    return np.array(losses), [p.detach().numpy().copy() for p in model.parameters()], f


def _cosine(opt):
    sched = tw.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    return lambda k: sched.step()


def _set_by_hand(opt):
    """nanoGPT's loop: warm-up then cosine decay, written into every param group at each step."""
    def set_lr(k):
        lr = 1e-2 * min(1.0, (k + 1) / 5) * (0.5 + 0.5 * np.cos(np.pi * k / 24))
        for group in opt.param_groups:
            group["lr"] = lr
    return set_lr


@pytest.mark.parametrize("schedule", [_cosine, _set_by_hand], ids=["CosineAnnealingLR", "param_group-lr"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_compiled_step_under_a_schedule_compiles_once_and_trains_as_eager(name, schedule):
    eager_losses, eager_params, _ = _train(False, OPTIMIZERS[name], schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the recompile limit's warning fails the test
        losses, params, f = _train(True, OPTIMIZERS[name], schedule)
    assert len(f.variants) <= 2  # (a first step that makes SGD's momentum buffers, then the steady step)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(params, eager_params):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class _PlainSGD(tw.optim.Optimizer):
    """An optimizer written outside tilewise: its step reads the rate as a number."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        with tw.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])


def test_an_optimizer_reading_the_rate_as_a_number_is_compiled_per_rate_and_stays_correct():
    make = lambda params: _PlainSGD(params, lr=0.1)  # noqa: E731
    halve = lambda opt: (lambda k: [g.update(lr=g["lr"] * 0.5) for g in opt.param_groups])  # noqa: E731
    eager_losses, eager_params, _ = _train(False, make, halve, steps=4)
    losses, params, f = _train(True, make, halve, steps=4)
    assert len(f.variants) == 4
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    for got, want in zip(params, eager_params):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_other_hyperparameters_are_still_compiled_by_value():
    def make(params):
        return tw.optim.Adam(params, lr=1e-2, betas=(0.9, 0.99))

    def change_betas(opt):
        def change(k):
            for group in opt.param_groups:
                group["betas"] = (0.9 - 0.1 * (k % 2), 0.99)
        return change

    eager_losses, eager_params, _ = _train(False, make, change_betas, steps=5)
    losses, params, f = _train(True, make, change_betas, steps=5)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(params, eager_params):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_on_the_gpu_a_scheduled_rate_reaches_the_replayed_graph():
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    tw.manual_seed(0)
    x, y = tw.randn(64, 20, device="cuda"), tw.randint(0, 3, (64,), device="cuda")

    def train(compiled):
        tw.manual_seed(1)
        model = tw.nn.Sequential(tw.nn.Linear(20, 32), tw.nn.ReLU(), tw.nn.Linear(32, 3)).cuda()
        opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
        sched = tw.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-2, total_steps=30, cycle_momentum=False)
        step = classifier_step(model, opt, tw.nn.functional.cross_entropy)
        f = tw.compile(step) if compiled else step
        losses = []
        for _ in range(30):
            losses.append(float(f(x, y)))
            sched.step()
        return np.array(losses), f

    eager, _ = train(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled, f = train(True)
    assert len(f.variants) <= 2
    np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)
