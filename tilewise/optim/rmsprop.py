"""RMSprop (optionally centered, with momentum) and Adagrad."""

from __future__ import annotations

from tilewise import dtypes
from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.creation import full_like, zeros, zeros_like
from tilewise.optim.optimizer import Optimizer


class RMSprop(Optimizer):
    """torch.optim.RMSprop: divide the gradient by a running RMS of recent gradients."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 momentum: float = 0.0, centered: bool = False, *, maximize: bool = False) -> None:
        for name, value in (("learning rate", lr), ("epsilon value", eps), ("momentum value", momentum),
                            ("weight_decay value", weight_decay), ("alpha value", alpha)):
            if value < 0.0:
                raise ValueError(f"Invalid {name}: {value}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize))

    def _state(self, p, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = zeros((), dtype=dtypes.float32)
            state["square_avg"] = zeros_like(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p, group)

    @no_grad()
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for group in self.param_groups:
            lr, alpha, eps, momentum = group["lr"], group["alpha"], group["eps"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                state = self._state(p, group)
                state["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                square_avg = state["square_avg"]
                square_avg.mul_(alpha).add_(grad * (1 - alpha) * grad)
                if group["centered"]:
                    grad_avg = state["grad_avg"]
                    grad_avg.lerp_(grad, 1 - alpha)
                    avg = (square_avg - grad_avg * grad_avg).sqrt()
                else:
                    avg = square_avg.sqrt()
                avg = avg.add_(eps)
                if momentum > 0:
                    buf = state["momentum_buffer"]
                    buf.mul_(momentum).add_(grad / avg)
                    p.add_(buf, alpha=-lr)
                else:
                    p.add_(grad * -lr / avg)
        return loss


class Adagrad(Optimizer):
    """torch.optim.Adagrad: per-coordinate step sizes from the sum of squared gradients so far."""

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False) -> None:
        for name, value in (("learning rate", lr), ("lr_decay", lr_decay), ("weight_decay value", weight_decay),
                            ("initial_accumulator_value", initial_accumulator_value), ("epsilon value", eps)):
            if value < 0.0:
                raise ValueError(f"Invalid {name}: {value}")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, maximize=maximize))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["step"] = zeros((), dtype=dtypes.float32)
                self.state[p]["sum"] = full_like(p, group["initial_accumulator_value"])

    @no_grad()
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                state["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                clr = group["lr"] / (1 + (state["step"].double() - 1) * group["lr_decay"])  # no host read: compilable
                state["sum"].add_(grad * grad)
                std = state["sum"].sqrt().add_(group["eps"])
                p.add_(grad * -clr / std)
        return loss
