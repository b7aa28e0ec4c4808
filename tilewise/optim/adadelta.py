"""Adadelta: step sizes from running averages of squared gradients and of squared updates."""

from __future__ import annotations

from tilewise.optim.optimizer import Optimizer, add_scaled, check_lr, check_non_negative, grad_mode_of_differentiable
from tilewise.tensor import Tensor


class Adadelta(Optimizer):
    """torch.optim.Adadelta: ``v = rho * v + (1 - rho) * g²``; ``delta = sqrt(u + eps) / sqrt(v + eps) * g``;
    ``u = rho * u + (1 - rho) * delta²``; ``p -= lr * delta``.

    >>> import tilewise as tw
    >>> p = tw.nn.Parameter(tw.ones(2)); p.grad = tw.ones(2)
    >>> tw.optim.Adadelta([p]).step(); [round(v, 6) for v in p.tolist()]
    [0.996838, 0.996838]
    """

    buffers = ("square_avg", "acc_delta")
    state_args = ("square_avg", "acc_delta", "step")
    hyper_args = ("rho", "eps", "weight_decay", "maximize", "differentiable")

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False), ("capturable", False))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: bool | None = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False) -> None:
        check_lr(lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_non_negative(epsilon=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      capturable=capturable, foreach=foreach, differentiable=differentiable))

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _adadelta_update)


def _adadelta_update(params, grads, square_avgs, acc_deltas, steps, lr, rho, eps, weight_decay, maximize,
                     differentiable) -> None:
    """One Adadelta step of each parameter, torch's single-tensor algorithm op for op."""
    for k, p in enumerate(params):
        steps[k].add_(1)
        grad = -grads[k] if maximize else grads[k]
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        square_avg, acc_delta = square_avgs[k], acc_deltas[k]
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        if differentiable:  # out of place: autograd saves these intermediates
            delta = acc_delta.add(eps).sqrt().div(std).mul(grad)
        else:
            delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        add_scaled(p, delta, -lr)
