"""RMSprop, optionally centered and with momentum."""

from __future__ import annotations

from tilewise.ops.creation import zeros_like
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled,
    add_scaled_ratio,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
)
from tilewise.tensor import Tensor


class RMSprop(Optimizer):
    """torch.optim.RMSprop: divide the gradient by a running RMS of recent gradients (less its running mean
    when ``centered``), with optional momentum on the result."""

    backfilled_options = (("momentum", 0), ("centered", False), ("foreach", None), ("maximize", False),
                          ("differentiable", False), ("capturable", False))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False) -> None:
        check_lr(lr)
        check_non_negative(epsilon=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                                      weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _state(self, p, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            state["square_avg"] = zeros_like(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p, group) for p in params]
            tensors = (params, [p.grad for p in params], [s["square_avg"] for s in states],
                       [s["grad_avg"] for s in states] if group["centered"] else None,
                       [s["momentum_buffer"] for s in states] if group["momentum"] > 0 else None,
                       [s["step"] for s in states])
            hyper = (group["alpha"], group["eps"], group["weight_decay"], group["momentum"], group["maximize"],
                     group["differentiable"])
            self._update_group(k, group, _rmsprop_update, tensors, hyper)
        return loss


def _rmsprop_update(params, grads, square_avgs, grad_avgs, momentum_buffers, steps, lr, alpha, eps, weight_decay,
                    momentum, maximize, differentiable) -> None:
    """One RMSprop step of each parameter, torch's single-tensor algorithm op for op."""
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        square_avg = square_avgs[k]
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if grad_avgs is not None:
            grad_avg = grad_avgs[k]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add(eps) if differentiable else avg.add_(eps)  # sqrt's result is saved for its backward
        if momentum_buffers is not None:
            buf = momentum_buffers[k]
            buf.mul_(momentum).addcdiv_(grad, avg)
            add_scaled(p, buf, -lr)
        else:
            add_scaled_ratio(p, grad, avg, -lr)
