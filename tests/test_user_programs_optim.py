"""Optimizers as people write and print them: a Lion optimizer subclassing ``torch.optim.Optimizer`` (defaults,
per-parameter state, a closure, ``@torch.no_grad()`` step) with parameter groups and a scheduler, run under torch
and tilewise from the same weights and batches; and the optimizers' printed form, which scripts log."""

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, initial_state, numpy_of, run_both

import tilewise


def lion_training(torch, init, batches):
    nn = torch.nn

    class Lion(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
            if not 0.0 <= lr:
                raise ValueError(f"Invalid learning rate: {lr}")
            super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    p.data.mul_(1 - group["lr"] * group["weight_decay"])
                    state = self.state[p]
                    if len(state) == 0:
                        state["exp_avg"] = torch.zeros_like(p)
                    exp_avg = state["exp_avg"]
                    beta1, beta2 = group["betas"]
                    update = exp_avg * beta1 + p.grad * (1 - beta1)
                    p.add_(torch.sign(update), alpha=-group["lr"])
                    exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
            return loss

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return self.b(nn.functional.gelu(self.a(x), approximate="tanh")) * self.scale

    model = Net()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": []}
    opt = Lion([{"params": model.a.parameters()}, {"params": model.b.parameters(), "lr": 3e-3}], lr=1e-3,
               weight_decay=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)

        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)  # noqa: B023 — called within this iteration
            loss.backward()
            return loss

        record["loss"].append(opt.step(closure).item())
        sched.step()
        record["lr"].append([g["lr"] for g in opt.param_groups])
    record["weights"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["printed"] = repr(opt)
    return record


def test_a_custom_optimizer_subclass_with_groups_a_closure_and_a_scheduler_trains_like_torch():
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 2, 6)) for _ in range(4)]
    ours, theirs = run_both(lion_training, batches)
    assert ours.pop("printed") == theirs.pop("printed")
    assert_same(ours, theirs)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_optimizers_print_their_groups_as_torch(name):
    def printed(torch):
        first, second = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
        return repr(getattr(torch.optim, name)([{"params": [first]}, {"params": [second], "lr": 1.0}], lr=0.1))

    assert printed(tilewise) == printed(real_torch)
