"""NAdam: Adam with Nesterov momentum, its momentum schedule decayed by ``momentum_decay``."""

from __future__ import annotations

from tilewise.ops.creation import ones
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


class NAdam(Optimizer):
    """torch.optim.NAdam: ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``; the update mixes the
    gradient and the first moment with weights from the running product of the ``mu_t``. With
    ``decoupled_weight_decay=True`` the decay applies to the parameter directly (NAdamW)."""

    buffers = ("exp_avg", "exp_avg_sq")
    state_args = ("exp_avg", "exp_avg_sq", "mu_product", "step")
    hyper_args = ("betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "maximize",
                  "differentiable")

    backfilled_options = (("maximize", False), ("foreach", None), ("capturable", False), ("differentiable", False),
                          ("decoupled_weight_decay", False))
    number_state = ("step", "mu_product")

    def __init__(self, params, lr: float | Tensor = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False) -> None:
        check_lr(lr)
        check_non_negative(epsilon=eps)
        check_betas(betas)
        check_non_negative(weight_decay=weight_decay, momentum_decay=momentum_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable))

    def _more_state(self, state: dict, p, group: dict) -> None:
        # torch keeps the product in its scalar dtype (float32): it rounds there at every step
        state["mu_product"] = ones((), dtype=state["step"].dtype, device=p.device)

    def _init_param_state(self, p, group: dict) -> None:
        self._buffered_state(p, group)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        return self._step_groups(closure, _nadam_update)


def _nadam_update(params, grads, exp_avgs, exp_avg_sqs, mu_products, steps, lr, betas, eps, weight_decay,
                  momentum_decay, decoupled, maximize, differentiable) -> None:
    """One NAdam step of each parameter, torch's single-tensor algorithm op for op; what torch computes from the
    step's Python value is a float64 expression of the step tensor (see [Note: optimizers])."""
    beta1, beta2 = betas
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        mu_product = mu_products[k]
        steps[k].add_(1)
        step = steps[k].double()
        bias_correction2 = 1 - beta2**step
        if weight_decay != 0:
            if decoupled:
                p.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(p, alpha=weight_decay)
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
        mu_product.mul_(mu.to(mu_product.dtype))  # torch multiplies by the Python number in the product's dtype
        exp_avg, exp_avg_sq = exp_avgs[k], exp_avg_sqs[k]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = exp_avg_sq.div(bias_correction2).sqrt()
        if differentiable:
            _differentiable_nadam_update(p, grad, exp_avg, denom.add(eps), mu_product, mu, mu_next, lr)
            continue
        denom.add_(eps)
        product = mu_product.double()
        add_scaled_ratio(p, grad, denom, -lr * in_dtype_of_lr(lr, 1.0 - mu) / in_dtype_of_lr(lr, 1.0 - product))
        add_scaled_ratio(p, exp_avg, denom,
                         (-lr * in_dtype_of_lr(lr, mu_next)) / in_dtype_of_lr(lr, 1.0 - product * mu_next))


def _differentiable_nadam_update(p, grad, exp_avg, denom, mu_product, mu, mu_next, lr) -> None:
    """The last part of a differentiable NAdam step as torch writes it, so that autograd records it: the step sizes
    are tensors of the momentum product's dtype (torch's Python numbers meet the float32 product there) that scale
    the gradient and the first moment out of place."""
    dtype = mu_product.dtype
    mu_product_next = mu_product * mu_next.to(dtype)
    # torch's ``number / tensor`` is ``tensor.reciprocal() * number``
    p.addcdiv_(grad * ((1.0 - mu_product).reciprocal() * (-lr * (1.0 - mu)).to(dtype)), denom)
    p.addcdiv_(exp_avg * ((1.0 - mu_product_next).reciprocal() * (-lr * mu_next).to(dtype)), denom)
