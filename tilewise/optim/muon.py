"""Muon: momentum SGD for 2-D weights whose update is orthogonalised by a Newton-Schulz iteration."""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise.ops.creation import zeros_like
from tilewise.optim.optimizer import Optimizer, add_scaled, grad_mode_of_differentiable
from tilewise.tensor import Tensor

EPS = 1e-7
DEFAULT_A, DEFAULT_B, DEFAULT_C = 3.4445, -4.7750, 2.0315  # the quintic's coefficients, from Keller Jordan's post
DEFAULT_NS_STEPS = 5


class Muon(Optimizer):
    """torch.optim.Muon: ``buf = lerp(buf, g, 1 - momentum)``; the update (Nesterov's ``lerp(g, buf, momentum)``
    or ``buf``) is brought near the nearest semi-orthogonal matrix by ``ns_steps`` Newton-Schulz iterations in
    bfloat16; ``p *= 1 - lr * weight_decay``; ``p -= adjusted_lr * update``. Only 2-D parameters."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
                 eps: float = EPS, ns_steps: int = DEFAULT_NS_STEPS, adjust_lr_fn: str | None = None) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ["original", "match_rms_adamw"]:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                      ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                                      adjust_lr_fn=adjust_lr_fn))
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only supports 2D parameters whereas we found a parameter with size: "
                                     f"{p.size()}")

    def _state(self, p: Tensor) -> dict:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like(p)
        return state

    def _init_param_state(self, p, group: dict) -> None:
        self._state(p)

    @grad_mode_of_differentiable
    def step(self, closure=None):
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            buffers = [self._state(p)["momentum_buffer"] for p in params]
            hyper = tuple(group[name] for name in ("weight_decay", "momentum", "nesterov", "ns_coefficients",
                                                    "ns_steps", "eps", "adjust_lr_fn"))
            self._update_group(k, group, _muon_update, (params, [p.grad for p in params], buffers), hyper)
        return loss


def _muon_update(params, grads, buffers, lr, weight_decay, momentum, nesterov, ns_coefficients, ns_steps, eps,
                 adjust_lr_fn) -> None:
    """One Muon step of each parameter, torch's single-tensor algorithm op for op."""
    for k, p in enumerate(params):
        grad = grads[k]
        if grad.ndim != 2:
            raise ValueError("Param gradient must be a 2D matrix")
        buffers[k].lerp_(grad, 1 - momentum)
        update = grad.lerp(buffers[k], momentum) if nesterov else buffers[k]
        update = _zeropower_via_newtonschulz(update, ns_coefficients, ns_steps, eps)
        adjusted_lr = _adjust_lr(lr, adjust_lr_fn, p.shape)
        p.mul_(1 - lr * weight_decay)
        add_scaled(p, update.to(p.dtype), -adjusted_lr)  # torch adds the bfloat16 update in the wider dtype


def _zeropower_via_newtonschulz(grad: Tensor, ns_coefficients, ns_steps: int, eps: float) -> Tensor:
    """``grad`` scaled to spectral norm at most 1, then ``ns_steps`` quintic Newton-Schulz iterations
    ``X <- a X + (b G + c G^2) X`` with ``G = X X^T``, in bfloat16 (on the wide side's transpose)."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    ortho = grad.to(dtypes.bfloat16)
    if tall:
        ortho = ortho.T
    norm = ortho.float().norm().to(dtypes.bfloat16)  # torch's bfloat16 norm: accumulated in float32, rounded once
    ortho = ortho / norm.clamp(min=eps)
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        gram_update = _addmm_rounded_once(gram, gram, gram, beta=b, alpha=c)
        ortho = _addmm_rounded_once(ortho, gram_update, ortho, beta=a)
    return ortho.T if tall else ortho


def _addmm_rounded_once(x: Tensor, m1: Tensor, m2: Tensor, beta: float, alpha: float = 1.0) -> Tensor:
    """``beta * x + alpha * (m1 @ m2)`` of bfloat16 matrices, accumulated in float32 and rounded to bfloat16 once,
    as torch's bfloat16 ``addmm`` rounds (rounding the product first changes the iteration's low bits)."""
    exact = x.float() * beta + (m1.float() @ m2.float()) * alpha
    return exact.to(dtypes.bfloat16)


def _adjust_lr(lr, adjust_lr_fn: str | None, shape) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, rows / cols))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, cols))
    else:
        ratio = 1.0
    return lr * ratio
