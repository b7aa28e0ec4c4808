"""Adam and AdamW (decoupled weight decay), with optional AMSGrad."""

from __future__ import annotations

from tilewise.ops.creation import zeros_like
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled_ratio,
    check_betas,
    check_implementation_flags,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
    in_dtype_of_lr,
    rounded_power,
)
from tilewise.tensor import Tensor


class Adam(Optimizer):
    """torch.optim.Adam: moment estimates with bias correction; ``weight_decay`` is added to the gradient
    (L2), or, with ``decoupled_weight_decay=True`` (AdamW), applied to the parameter directly."""

    backfilled_options = (("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
                          ("differentiable", False), ("decoupled_weight_decay", False), ("fused", None))
    number_state = ("step",)

    def __init__(self, params, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False) -> None:
        check_lr(lr)
        check_non_negative(epsilon=eps)
        check_betas(betas)
        check_non_negative(weight_decay=weight_decay)
        if not (all(isinstance(b, float) for b in betas[:2]) or all(isinstance(b, Tensor) for b in betas[:2])):
            raise ValueError(f"betas must be either both floats or both Tensors (got {type(betas[0]).__name__} and "
                             f"{type(betas[1]).__name__}: write (0.0, 0.99), not (0, 0.99))")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused,
                                      decoupled_weight_decay=decoupled_weight_decay))
        check_implementation_flags(fused, foreach, differentiable)

    def _state(self, p, amsgrad: bool) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if amsgrad:
                state["max_exp_avg_sq"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p, group["amsgrad"])

    @grad_mode_of_differentiable
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p, group["amsgrad"]) for p in params]
            tensors = (params, [p.grad for p in params], [s["exp_avg"] for s in states],
                       [s["exp_avg_sq"] for s in states],
                       [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else None, [s["step"] for s in states])
            hyper = (group["betas"], group["eps"], group["weight_decay"], group["decoupled_weight_decay"],
                     group["maximize"], group["differentiable"])
            self._update_group(k, group, _adam_update, tensors, hyper)
        return loss


def _adam_update(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, betas, eps, weight_decay,
                 decoupled, maximize, differentiable) -> None:
    """One Adam(W) step of each parameter, torch's single-tensor algorithm op for op; ``lr`` a number or a
    0-dim tensor. ``differentiable`` copies what autograd saves before the state is written over."""
    beta1, beta2 = betas
    decay = None  # ``1 - lr * weight_decay``, made at the first parameter's update (see _shared_decay)
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        steps[k].add_(1)
        if weight_decay != 0:
            if decoupled:
                decay = _shared_decay(lr, weight_decay) if decay is None else decay
                p.mul_(1 - lr * weight_decay if decay is _UNSHARED else decay)
            else:
                grad = grad.add(p, alpha=weight_decay)
        exp_avg, exp_avg_sq = exp_avgs[k], exp_avg_sqs[k]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if max_exp_avg_sqs is not None:
            highest = max_exp_avg_sqs[k].clone() if differentiable else max_exp_avg_sqs[k]
            max_exp_avg_sqs[k].copy_(highest.maximum(exp_avg_sq))
            exp_avg_sq = max_exp_avg_sqs[k]
        if differentiable:
            _differentiable_adam_update(p, exp_avg, exp_avg_sq, steps[k], lr, beta1, beta2, eps)
            continue
        step_size, bias_correction2_sqrt = _bias_corrections(steps[k], lr, beta1, beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        add_scaled_ratio(p, exp_avg, denom, -step_size)


def _differentiable_adam_update(p, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps) -> None:
    """The last part of a differentiable Adam step as torch writes it: the bias corrections from the step tensor in
    its own dtype (float32), folded into the denominator, and the first moment copied before autograd saves it."""
    step_size_neg = -(lr / (1 - rounded_power(beta1, step)))
    bias_correction2_sqrt = (1 - rounded_power(beta2, step)).sqrt()
    denom = (exp_avg_sq.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(eps / step_size_neg)
    p.addcdiv_(exp_avg.clone(), denom)


_UNSHARED = object()


def _shared_decay(lr: float | Tensor, weight_decay: float):
    """``1 - lr * weight_decay``, the same for every parameter of a group: made once (a tensor ``lr`` would make it
    with two operators per parameter, which a compiled step traces), unless ``lr`` requires grad (``_UNSHARED``),
    where each parameter's product keeps its own autograd node, as torch's loop makes it."""
    if isinstance(lr, Tensor) and lr.requires_grad:
        return _UNSHARED
    return 1 - lr * weight_decay


def _bias_corrections(step: Tensor, lr: float | Tensor, beta1: float | Tensor,
                      beta2: float | Tensor) -> tuple[Tensor, Tensor]:
    """``lr / (1 - beta1**step)`` and ``sqrt(1 - beta2**step)`` as 0-dim tensors, so that a compiled training
    step reads no value on the host. They are computed in float64, as torch computes them from the step's
    Python value, and round to the parameters' dtype where they meet them; where a beta or ``lr`` is a tensor,
    in its dtype, as torch's arithmetic with it is."""
    step = step.double()
    bias_correction1 = 1 - (rounded_power(beta1, step) if isinstance(beta1, Tensor) else beta1**step)
    bias_correction2 = 1 - (rounded_power(beta2, step) if isinstance(beta2, Tensor) else beta2**step)
    return lr / in_dtype_of_lr(lr, bias_correction1), bias_correction2.sqrt()


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * weight_decay`` before the Adam update).

    >>> import tilewise as tw
    >>> model = tw.nn.Linear(3, 1)
    >>> opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    >>> model(tw.ones(4, 3)).sum().backward(); opt.step(); opt.state_dict()["state"][0]["step"].item()
    1.0
    """

    forced_options = (("decoupled_weight_decay", True),)

    def __init__(self, params, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
