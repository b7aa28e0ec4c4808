"""Adamax: Adam with the infinity norm of past gradients in place of their second moment."""

from __future__ import annotations

from tilewise.ops.registry import call
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled_ratio,
    check_betas,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
    in_dtype_of_lr,
)
from tilewise.tensor import Tensor


class Adamax(Optimizer):
    """torch.optim.Adamax: ``m = lerp(m, g, 1 - beta1)``; ``u = max(beta2 * u, |g| + eps)``;
    ``p -= lr / (1 - beta1**step) * m / u``."""

    buffers = ("exp_avg", "exp_inf")
    state_args = ("exp_avg", "exp_inf", "step")
    hyper_args = ("betas", "eps", "weight_decay", "maximize", "differentiable")

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False), ("capturable", False))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        check_lr(lr)
        check_non_negative(epsilon=eps)
        check_betas(betas)
        check_non_negative(weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, capturable=capturable))

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _adamax_update)


def _adamax_update(params, grads, exp_avgs, exp_infs, steps, lr, betas, eps, weight_decay, maximize,
                   differentiable) -> None:
    """One Adamax step of each parameter, torch's single-tensor algorithm op for op; the bias correction is a
    float64 expression of the step tensor (see [Note: optimizers])."""
    beta1, beta2 = betas
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        exp_avg, exp_inf = exp_avgs[k], exp_infs[k]
        exp_avg.lerp_(grad, 1 - beta1)
        if differentiable:  # maximum saves its inputs, and one of them is about to be written over
            exp_inf.copy_(call("stack", [exp_inf.mul_(beta2), grad.abs().add_(eps)]).amax(0))
        else:
            exp_inf.copy_(exp_inf.mul_(beta2).maximum(grad.abs().add_(eps)))
        clr = lr / in_dtype_of_lr(lr, 1 - beta1 ** steps[k].double())
        add_scaled_ratio(p, exp_avg, exp_inf, -clr)
