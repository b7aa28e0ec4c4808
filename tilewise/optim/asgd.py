"""ASGD: stochastic gradient descent with a decaying step size and a running (Polyak) average of the iterates."""

from __future__ import annotations

from tilewise.ops.creation import full, ones
from tilewise.ops.registry import call
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
    rounded_power,
)
from tilewise.tensor import Tensor


class ASGD(Optimizer):
    """torch.optim.ASGD: ``p *= 1 - lambd * eta``; ``p -= eta * g``; ``ax`` averages ``p`` from step ``t0`` on;
    then ``eta = lr / (1 + lambd * lr * step) ** alpha`` and ``mu = 1 / max(1, step - t0)``. ``eta`` and
    ``mu`` are 0-dim tensors of the state, as in torch."""

    buffers = ("ax",)
    state_args = ("ax", "mu", "eta", "step")
    hyper_args = ("lambd", "alpha", "t0", "weight_decay", "maximize")

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False), ("capturable", False))
    number_state = ("step", "eta", "mu")

    def __init__(self, params, lr: float | Tensor = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: float = 0, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        check_lr(lr)
        check_non_negative(weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize, differentiable=differentiable,
                                      capturable=capturable))

    def _more_state(self, state: dict, p, group: dict) -> None:
        lr = group["lr"]
        lr = lr.detach().reshape(()).to(device=p.device, dtype=state["step"].dtype) if isinstance(lr, Tensor) else lr
        state["eta"] = lr.clone() if isinstance(lr, Tensor) else full((), lr, dtype=state["step"].dtype,
                                                                         device=p.device)
        state["mu"] = ones((), dtype=state["step"].dtype, device=p.device)

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _asgd_update)


def _asgd_update(params, grads, axs, mus, etas, steps, lr, lambd, alpha, t0, weight_decay, maximize) -> None:
    """One ASGD step of each parameter, torch's single-tensor algorithm op for op. torch reads ``eta`` and
    ``mu`` back as Python numbers; here they stay tensors (see [Note: optimizers]): ``eta`` as the float64 of its
    float32 value, and the averaging's ``mu == 1`` branch as a ``where``."""
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        eta = etas[k].double()
        p.mul_(1 - lambd * eta)
        add_scaled(p, grad, -eta)
        ax, mu = axs[k], mus[k]
        ax.copy_(call("where", mu == 1, p, ax + (p - ax) * mu))
        step = steps[k].double()
        if isinstance(lr, Tensor):  # torch's arithmetic with a tensor lr stays in its dtype
            decay = 1 + lambd * lr * step.to(lr.dtype)
            etas[k].copy_(lr / rounded_power(decay, full((), alpha, dtype=lr.dtype, device=lr.device)))
        else:
            etas[k].copy_(lr / (1 + lambd * lr * step) ** alpha)
        mus[k].copy_(1 / (step - t0).clamp(min=1))
