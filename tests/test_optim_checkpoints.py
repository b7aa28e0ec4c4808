"""tilewise.optim as a training script uses it around checkpoints and hand edits: a checkpoint file written by
``torch.save`` (optimizer, GradScaler) loads with ``tilewise.load`` and training continues as torch's does, and
the reverse through torch's default ``weights_only`` load; hyperparameters edited in ``param_groups`` between
steps apply at the next step, in the loop, compiled foreach and fused updates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

SHAPES = [(4, 3), (3,)]
CHECKPOINTED = [
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
]


def _gradients(steps: int):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype("float32") for s in SHAPES]
    grads = [[rng.standard_normal(s).astype("float32") for s in SHAPES] for _ in range(steps)]
    return init, grads


def _train(lib, opt, params, scaler, grads, start, stop):
    """Steps ``start`` to ``stop`` with gradients that depend on the parameters, through a GradScaler that
    skips step 2 (an inf gradient) and so changes its scale."""
    for t in range(start, stop):
        opt.zero_grad()
        scaler.scale(lib.ones(()))
        for p, g in zip(params, grads[t]):
            p.grad = lib.tensor(g) * (p.detach() + 1) * scaler.get_scale()
        if t == 2:
            params[0].grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()


def _fresh(lib, name, kwargs, values):
    params = [lib.nn.Parameter(lib.tensor(np.array(v, dtype="float32"))) for v in values]
    groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": kwargs["lr"] / 2}]
    opt = getattr(lib.optim, name)(groups, **kwargs)
    return params, opt, lib.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)


def _values(params):
    return [np.asarray(p.detach().numpy()).copy() for p in params]


@pytest.mark.parametrize("direction", ["torch-to-tilewise", "tilewise-to-torch"])
@pytest.mark.parametrize("name,kwargs", CHECKPOINTED, ids=[f"{n}-{k}" for k, (n, _) in enumerate(CHECKPOINTED)])
def test_a_checkpoint_file_of_one_library_resumes_training_in_the_other(name, kwargs, direction, tmp_path):
    """``save({"params", "optimizer", "scaler"})`` mid-run by one library; the other loads the file (torch with
    its default ``weights_only=True``), rebuilds its optimizer with other group lrs, loads both state dicts and
    continues; its parameters follow the run that was never interrupted."""
    source, target = (torch, tw) if direction == "torch-to-tilewise" else (tw, torch)
    init, grads = _gradients(8)
    params, opt, scaler = _fresh(source, name, kwargs, init)
    _train(source, opt, params, scaler, grads, 0, 4)
    path = tmp_path / "checkpoint.pt"
    source.save({"params": [p.detach() for p in params], "optimizer": opt.state_dict(),
                 "scaler": scaler.state_dict()}, path)
    _train(source, opt, params, scaler, grads, 4, 8)
    assert scaler.get_scale() == 32.0  # 8, halved at the inf, doubled after each two good steps

    saved = tw.load(path) if target is tw else torch.load(path, weights_only=True)
    resumed, opt, scaler = _fresh(target, name, dict(kwargs, lr=0.5), [p.numpy() for p in saved["params"]])
    opt.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    assert [g["lr"] for g in opt.param_groups] == [kwargs["lr"], kwargs["lr"] / 2]
    _train(target, opt, resumed, scaler, grads, 4, 8)
    for ours, theirs in zip(_values(resumed), _values(params)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    assert scaler.get_scale() == saved["scaler"]["scale"] * 4  # doubled after each two good steps


EDITS = [("SGD", dict(lr=0.1, momentum=0.9)), ("SGD", dict(lr=0.1, momentum=0.9, foreach=True)),
         ("Adam", dict(lr=0.1)), ("Adam", dict(lr=0.1, foreach=True)), ("AdamW", dict(lr=0.1, fused=True)),
         ("RMSprop", dict(lr=0.1, momentum=0.5)), ("Adagrad", dict(lr=0.1))]


@pytest.mark.parametrize("name,kwargs", EDITS, ids=[f"{n}-{k}" for k, (n, _) in enumerate(EDITS)])
def test_hyperparameters_edited_in_param_groups_apply_at_the_next_step(name, kwargs):
    """``opt.param_groups[0]["lr"] = x`` (and momentum, betas, weight_decay) between steps, as warm-up code and
    hand-written schedules do; a compiled update must read the new values, not the ones it was traced with."""
    def run(lib):
        p = lib.nn.Parameter(lib.tensor([1.0, -1.0, 0.5]))
        options = {k: v for k, v in kwargs.items() if lib is tw or k not in ("foreach", "fused")}
        opt = getattr(lib.optim, name)([p], **options)
        group = opt.param_groups[0]
        out = []
        for t in range(6):
            if t == 2:
                group["lr"] = 0.5
            if t == 3:
                group.update({k: v for k, v in (("momentum", 0.1), ("betas", (0.5, 0.6))) if k in group})
            if t == 4:
                group["weight_decay"] = 0.2
            p.grad = lib.tensor([1.0, -2.0, 0.5]) * (t + 1)
            opt.step()
            out.append(np.asarray(p.detach().numpy()).copy())
        return out

    np.testing.assert_allclose(np.array(run(tw)), np.array(run(torch)), rtol=1e-6, atol=1e-6)


def test_cycled_momentum_needs_an_optimizer_with_momentum_as_in_torch():
    """CyclicLR and OneCycleLR cycle ``momentum`` (or Adam's ``betas``) by default; on an optimizer with neither
    both refuse, with torch's message, and ``cycle_momentum=False`` lets them run."""
    messages = []
    for lib in (tw, torch):
        schedules = lib.optim.lr_scheduler
        opt = lib.optim.Adagrad([lib.nn.Parameter(lib.zeros(1))], lr=0.1)
        caught = []
        for make, args in ((schedules.CyclicLR, (0.01, 0.1)), (schedules.OneCycleLR, (1.0, 10))):
            with pytest.raises(ValueError) as info:
                make(opt, *args)
            caught.append(str(info.value))
        schedules.CyclicLR(opt, 0.01, 0.1, cycle_momentum=False)
        schedules.OneCycleLR(opt, 1.0, 10, cycle_momentum=False)
        messages.append(caught)
    assert messages[0] == messages[1]
    assert "momentum" in messages[0][0] and "momentum" in messages[0][1]
