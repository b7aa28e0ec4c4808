"""Rprop: resilient backpropagation, per-coordinate step sizes driven by the sign of the gradient alone."""

from __future__ import annotations

from tilewise.ops.creation import full_like, zeros_like
from tilewise.ops.registry import call
from tilewise.optim.optimizer import Optimizer, check_lr, grad_mode_of_differentiable
from tilewise.tensor import Tensor


class Rprop(Optimizer):
    """torch.optim.Rprop: where the gradient keeps its sign the step size grows by ``etas[1]``, where it flips
    the step shrinks by ``etas[0]`` (within ``step_sizes``) and that coordinate waits one step;
    ``p -= sign(g) * step_size``."""

    state_args = ("prev", "step_size", "step")
    hyper_args = ("etas", "step_sizes", "maximize", "differentiable")

    backfilled_options = (("foreach", None), ("maximize", False), ("differentiable", False), ("capturable", False))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False) -> None:
        check_lr(lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, dict(lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, capturable=capturable))

    def _more_state(self, state: dict, p, group: dict) -> None:
        lr = group["lr"]
        lr = lr.item() if isinstance(lr, Tensor) else lr
        state["prev"] = zeros_like(p)
        # a complex parameter's real and imaginary parts each start at the rate (its real view's two numbers)
        state["step_size"] = full_like(p, complex(lr, lr) if p.is_complex() else lr)

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _rprop_update)


def _rprop_update(params, grads, prevs, step_sizes, steps, lr, etas, step_sizes_range, maximize,
                  differentiable) -> None:
    """One Rprop step of each parameter, torch's single-tensor algorithm op for op (its masked assignments as
    ``where``s, which give the same values since both etas are positive)."""
    etaminus, etaplus = etas
    step_size_min, step_size_max = step_sizes_range
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        prev, step_size = prevs[k], step_sizes[k]
        sign = grad.mul(prev.clone() if differentiable else prev).sign()
        sign = call("where", sign > 0, etaplus, sign)
        sign = call("where", sign < 0, etaminus, sign)
        sign = call("where", sign == 0, 1.0, sign)
        step_size.mul_(sign).clamp_(step_size_min, step_size_max)
        grad = call("where", sign == etaminus, 0.0, grad)
        p.addcmul_(grad.sign(), step_size, value=-1)
        prev.copy_(grad)
