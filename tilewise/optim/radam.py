"""RAdam: Adam whose adaptive step is switched on, and rectified, once the variance estimate is reliable."""

from __future__ import annotations

from tilewise.ops.registry import call
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled,
    check_betas,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
)
from tilewise.tensor import Tensor


class RAdam(Optimizer):
    """torch.optim.RAdam: while the approximated SMA length ``rho_t`` is at most 5 the step is plain momentum
    (``p -= lr * m_hat``); after, ``p -= lr * m_hat * r_t * sqrt(1 - beta2**t) / (sqrt(v) + eps)`` with the
    rectification ``r_t``. With ``decoupled_weight_decay=True`` the decay applies to the parameter directly."""

    buffers = ("exp_avg", "exp_avg_sq")
    state_args = ("exp_avg", "exp_avg_sq", "step")
    hyper_args = ("betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize", "differentiable")

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False),
                          ("decoupled_weight_decay", False), ("capturable", False))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        check_lr(lr)
        check_non_negative(epsilon=eps)
        check_betas(betas)
        check_non_negative(weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable))

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _radam_update)


def _radam_update(params, grads, exp_avgs, exp_avg_sqs, steps, lr, betas, eps, weight_decay, decoupled, maximize,
                  differentiable) -> None:
    """One RAdam step of each parameter, torch's single-tensor algorithm op for op. torch picks the branch from
    the step's Python value; here both are computed and ``where`` picks, so no value goes to the host (the
    rectification is clamped at 0 where unused, so that neither branch holds a NaN a gradient could meet)."""
    beta1, beta2 = betas
    rho_inf = 2 / (1 - beta2) - 1
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        step = steps[k].double()
        if weight_decay != 0:
            if decoupled:
                p.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(p, alpha=weight_decay)
        exp_avg, exp_avg_sq = exp_avgs[k], exp_avg_sqs[k]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)).clamp(min=0) ** 0.5
        exp_avg_sq_sqrt = exp_avg_sq.sqrt()
        exp_avg_sq_sqrt = exp_avg_sq_sqrt.add(eps) if differentiable else exp_avg_sq_sqrt.add_(eps)
        adaptive_lr = (bias_correction2**0.5) / exp_avg_sq_sqrt
        momentum_step = bias_corrected_exp_avg * lr
        update = call("where", rho_t > 5.0, momentum_step * adaptive_lr * rect, momentum_step)
        add_scaled(p, update, -1.0)
