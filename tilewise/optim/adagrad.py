"""Adagrad: per-coordinate step sizes from the sum of squared gradients so far."""

from __future__ import annotations

from tilewise.ops.creation import full_like
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled_ratio,
    check_implementation_flags,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
    in_dtype_of_lr,
)
from tilewise.tensor import Tensor


class Adagrad(Optimizer):
    """torch.optim.Adagrad: ``sum += g * g``; ``p -= lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum) + eps)``.
    Its state exists from construction (``sum`` starts at ``initial_accumulator_value``), as in torch."""

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False), ("fused", None))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, fused: bool | None = None) -> None:
        check_lr(lr)
        check_non_negative(lr_decay=lr_decay, weight_decay=weight_decay,
                           initial_accumulator_value=initial_accumulator_value, epsilon=eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, fused=fused))
        check_implementation_flags(fused, foreach, differentiable)
        for group in self.param_groups:
            for p in group["params"]:
                self._state(p, group)

    def _state(self, p, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            state["sum"] = full_like(p, group["initial_accumulator_value"])
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p, group) for p in params]
            tensors = (params, [p.grad for p in params], [s["sum"] for s in states], [s["step"] for s in states])
            hyper = (group["lr_decay"], group["weight_decay"], group["eps"], group["maximize"], group["differentiable"])
            self._update_group(k, group, _adagrad_update, tensors, hyper)
        return loss


def _adagrad_update(params, grads, sums, steps, lr, lr_decay, weight_decay, eps, maximize, differentiable) -> None:
    """One Adagrad step of each parameter, torch's single-tensor algorithm op for op; the decayed learning rate
    is a float64 expression of the step tensor (see [Note: optimizers])."""
    for k, p in enumerate(params):
        steps[k].add_(1)
        grad = -grads[k] if maximize else grads[k]
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        clr = lr / in_dtype_of_lr(lr, 1 + (steps[k].double() - 1) * lr_decay)
        sums[k].addcmul_(grad, grad, value=1)
        std = sums[k].sqrt().add(eps) if differentiable else sums[k].sqrt().add_(eps)
        add_scaled_ratio(p, grad, std, -clr)
