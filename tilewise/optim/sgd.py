"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

from __future__ import annotations

from tilewise.ops.creation import full_like
from tilewise.optim.optimizer import (
    Optimizer,
    add_scaled,
    as_fused_runs_it,
    check_fused,
    check_implementation_flags,
    check_lr,
    check_non_negative,
    grad_mode_of_differentiable,
)
from tilewise.tensor import Tensor


class SGD(Optimizer):
    """torch.optim.SGD: ``buf = momentum * buf + (1 - dampening) * g``; ``p -= lr * (g + momentum * buf if
    nesterov else buf)``, where ``g`` includes ``weight_decay * p``. The momentum buffer starts as the first
    gradient, so a first step with ``foreach``/``fused`` runs as the loop, which creates it. Without dampening
    a buffer of -0.0 gives that first gradient bit for bit too (``-0.0 * momentum + 1 * g`` is ``g``, signed zeros
    and NaN included, where +0.0 would turn a -0.0 gradient into +0.0), so ``init_state`` (what
    ``tilewise.compile`` calls before tracing a training step) creates such buffers then: a compiled step traces
    once, not once without buffers and again with them (a compiled ResNet-50's second step took 2-3.6 s more).

    >>> import tilewise as tw
    >>> p = tw.nn.Parameter(tw.ones(2)); p.grad = tw.ones(2)
    >>> tw.optim.SGD([p], lr=0.5).step(); p.tolist()
    [0.5, 0.5]
    """

    _loops_when_differentiable = True

    backfilled_options = (("nesterov", False), ("maximize", False), ("foreach", None), ("differentiable", False),
                          ("fused", False))

    def __init__(self, params, lr: float | Tensor = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None) -> None:
        check_lr(lr)
        check_non_negative(momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))
        check_implementation_flags(fused, foreach, differentiable)

    def _init_param_state(self, p: Tensor, group: dict) -> None:
        # with dampening the first step's buffer is the gradient itself, not (1 - dampening) * g: made lazily
        if group["momentum"] != 0 and group["dampening"] == 0:
            self.state[p]["momentum_buffer"] = full_like(p, complex(-0.0, -0.0) if p.is_complex() else -0.0)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in params]
            hyper = (group["weight_decay"], group["momentum"], group["dampening"], group["nesterov"],
                     group["maximize"])
            if group["momentum"] == 0:
                self._update_group(k, group, _sgd_update, (params, grads, None), hyper)
                continue
            buffers = [self.state[p].get("momentum_buffer") for p in params]
            if any(buf is None for buf in buffers):  # the first step makes the buffers: the loop does it
                if group["fused"]:
                    check_fused(params)
                as_fused_runs_it(group, _sgd_update, params, 3)(params, grads, buffers, group["lr"], *hyper)
                for p, buf in zip(params, buffers):
                    self.state[p]["momentum_buffer"] = buf
            else:
                self._update_group(k, group, _sgd_update, (params, grads, buffers), hyper)
        return loss


def _sgd_update(params, grads, buffers, lr, weight_decay, momentum, dampening, nesterov, maximize) -> None:
    """One SGD step of each parameter, torch's single-tensor algorithm op for op; a missing momentum buffer is
    created (written into ``buffers``) from the gradient."""
    for k, p in enumerate(params):
        grad = -grads[k] if maximize else grads[k]
        if weight_decay != 0:
            grad = grad.add(p, alpha=weight_decay)
        if momentum != 0:
            buf = buffers[k]
            if buf is None:
                buf = buffers[k] = grad.detach().clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        add_scaled(p, grad, -lr)
