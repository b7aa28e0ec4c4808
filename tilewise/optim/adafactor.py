"""Adafactor: Adam-like steps whose second moment of a matrix is kept factored, as a row and a column vector."""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise.ops.creation import zeros, zeros_like
from tilewise.ops.registry import call
from tilewise.optim.optimizer import Optimizer, add_scaled, grad_mode_of_differentiable
from tilewise.tensor import Tensor


class Adafactor(Optimizer):
    """torch.optim.Adafactor: for a gradient of two or more dimensions, running means of its squared rows and
    columns (``row_var``, ``col_var``) stand in for Adam's second moment, their outer product over the row
    mean; a vector keeps a full ``variance``. The step is relative to the parameter's RMS, and the update's
    RMS is clipped to ``d``."""

    state_args = ("row_var", "col_var", "variance", "step")
    hyper_args = ("beta2_decay", "eps", "d", "weight_decay", "maximize")

    backfilled_options = (("foreach", None),)
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0, weight_decay: float = 0.0, *,
                 foreach: bool | None = None, maximize: bool = False) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        super().__init__(params, dict(lr=lr, beta2_decay=beta2_decay, eps=eps, d=d, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize))

    def _buffered_state(self, p: Tensor, group: dict) -> dict:
        """torch's layout: ``step``, then ``row_var`` and ``col_var`` (the gradient's shape with its last,
        resp. second-to-last, size 1) for a matrix or more, ``variance`` for a vector."""
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            if p.dim() > 1:
                state["row_var"] = zeros((*p.shape[:-1], 1), dtype=p.dtype, device=p.device)
                state["col_var"] = zeros((*p.shape[:-2], 1, p.shape[-1]), dtype=p.dtype, device=p.device)
            else:
                state["variance"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        for group in self.param_groups:
            if any(p.grad is not None and p.is_complex() for p in group["params"]):
                raise RuntimeError("Adafactor does not support complex parameters")
        return self._step_groups(closure, _adafactor_update)


def _adafactor_update(params, grads, row_vars, col_vars, variances, steps, lr, beta2_decay, eps, d, weight_decay,
                      maximize) -> None:
    """One Adafactor step of each parameter, torch's single-tensor algorithm op for op. torch reads the step,
    the parameter's norm and the update's norm back as Python numbers; here they are float64 tensor expressions
    of the same values (see [Note: optimizers])."""
    eps1, eps2 = eps
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        eps1_k = dtypes.finfo(p.dtype).eps if eps1 is None else eps1
        steps[k].add_(1)
        step = steps[k].double()
        one_minus_beta2_t = step ** beta2_decay
        scale = (p.norm(2).double() / math.sqrt(p.numel())).clamp(min=eps2)  # before the weight decay
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)
        if grad.dim() > 1:
            row_mean = grad.norm(dim=-1, keepdim=True).square_().div_(grad.size(-1))
            row_vars[k].lerp_(row_mean, one_minus_beta2_t.to(p.dtype))
            col_mean = grad.norm(dim=-2, keepdim=True).square_().div_(grad.size(-2))
            col_vars[k].lerp_(col_mean, one_minus_beta2_t.to(p.dtype))
            var_estimate = row_vars[k] @ col_vars[k]
            var_estimate.div_(row_vars[k].mean(dim=-2, keepdim=True).clamp_(min=eps1_k))
        else:
            variances[k].lerp_(grad * grad, one_minus_beta2_t.to(p.dtype))
            var_estimate = variances[k].clone()
        update = var_estimate.clamp_(min=eps1_k * eps1_k).rsqrt_()
        update.mul_(grad)
        denom = (update.norm(2).double() / (math.sqrt(update.numel()) * d)).clamp(min=1.0)
        add_scaled(p, update, _step_size(scale, step, lr, denom))


def _step_size(scale: Tensor, step: Tensor, lr, denom: Tensor) -> Tensor:
    """``-alpha / denom`` with ``alpha = scale * min(lr, 1 / sqrt(step))``, float64 as torch's Python numbers; where a
    tensor ``lr`` is the smaller, torch's arithmetic with it stays in its dtype."""
    rho = 1 / step ** 0.5
    if not isinstance(lr, Tensor):
        return -(scale * rho.clamp(max=lr)) / denom
    with_lr = -(scale.to(lr.dtype) * lr) / denom.to(lr.dtype)
    return call("where", rho < lr, -(scale * rho) / denom, with_lr.double())
