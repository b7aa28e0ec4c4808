"""Adam and AdamW (decoupled weight decay), with optional AMSGrad."""

from __future__ import annotations

from tilewise import dtypes
from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.creation import zeros, zeros_like
from tilewise.optim.optimizer import Optimizer
from tilewise.tensor import Tensor


class Adam(Optimizer):
    """torch.optim.Adam: moment estimates with bias correction; ``weight_decay`` is added to the gradient
    (L2), or, with ``decoupled_weight_decay=True`` (AdamW), applied to the parameter directly."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}; each must be in [0, 1)")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

    def _state(self, p, amsgrad: bool) -> dict:
        state = self.state[p]
        if not state:
            # on p's device: a compiled CUDA step reads no host tensor
            state["step"] = zeros((), dtype=dtypes.float32, device=p.device)
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if amsgrad:
                state["max_exp_avg_sq"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p, group["amsgrad"])

    @no_grad()
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                state = self._state(p, group["amsgrad"])
                state["step"].add_(1)
                if wd != 0:
                    if group["decoupled_weight_decay"]:
                        p.mul_(1 - lr * wd)
                    else:
                        grad = grad.add(p, alpha=wd)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).add_(grad * (1 - beta2) * grad)
                step_size, bias_correction2_sqrt = _bias_corrections(state["step"], lr, beta1, beta2)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"].copy_(state["max_exp_avg_sq"].maximum(exp_avg_sq))
                    exp_avg_sq = state["max_exp_avg_sq"]
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                p.add_(exp_avg * -step_size / denom)
        return loss


def _bias_corrections(step: Tensor, lr: float, beta1: float, beta2: float) -> tuple[Tensor, Tensor]:
    """``lr / (1 - beta1**step)`` and ``sqrt(1 - beta2**step)`` as 0-dim tensors, so that a compiled training
    step reads no value on the host. They are computed in float64, as torch computes them from the step's
    Python value, and round to the parameters' dtype where they meet them."""
    step = step.double()
    return lr / (1 - beta1**step), (1 - beta2**step).sqrt()


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * weight_decay`` before the Adam update).

    >>> import tilewise as tw
    >>> model = tw.nn.Linear(3, 1)
    >>> opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    >>> model(tw.ones(4, 3)).sum().backward(); opt.step(); opt.state_dict()["state"][0]["step"].item()
    1.0
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)
