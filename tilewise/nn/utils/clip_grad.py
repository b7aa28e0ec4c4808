"""Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_), in place under ``no_grad``."""

from __future__ import annotations

from collections.abc import Iterable

from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.functions import stack
from tilewise.optim._foreach import compiled, use_compiled
from tilewise.tensor import Tensor, tensor


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p.grad for p in params if p.grad is not None]


@no_grad()
def get_total_norm(tensors: Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """The ``norm_type``-norm of all the tensors together, as if they were concatenated into one vector."""
    tensors = list(tensors)
    if not tensors:
        return tensor(0.0)
    norm_type = float(norm_type)
    total = stack([t.norm(norm_type).to(tensors[0].device) for t in tensors]).norm(norm_type)
    if error_if_nonfinite and not total.isfinite().item():
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                           "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")
    return total


@no_grad()
def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale all gradients so that their joint norm is at most ``max_norm``; return the norm before clipping.
    ``foreach`` (None: on CUDA) computes the norm and scales every gradient in one compiled program, a few
    kernels for all of them (see [Note: foreach updates] in ``optim/_foreach.py``).

    >>> import tilewise as tw
    >>> p = tw.nn.Parameter(tw.zeros(2)); p.grad = tw.tensor([3.0, 4.0])
    >>> tw.nn.utils.clip_grad_norm_([p], 1.0).item(), [round(v, 4) for v in p.grad.tolist()]
    (5.0, [0.6, 0.8])
    """
    grads = _grads(parameters)
    if not grads:
        return get_total_norm(grads, norm_type, error_if_nonfinite)
    if not error_if_nonfinite and use_compiled(foreach, grads) and len({g._device for g in grads}) == 1:
        key = (float(max_norm), float(norm_type), *[(g._shape, g._dtype) for g in grads])
        return compiled(_PROGRAMS, key, _clip_norm)(grads, float(max_norm), float(norm_type))
    return _clip_norm(grads, max_norm, norm_type, error_if_nonfinite)


_PROGRAMS: dict = {}  # compiled _clip_norm per gradient layout


def _clip_norm(grads: list[Tensor], max_norm: float, norm_type: float, error_if_nonfinite: bool = False) -> Tensor:
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    scale = (float(max_norm) / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.to(g.device))
    return total


@no_grad()
def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    for g in _grads(parameters):
        g.clamp_(-clip_value, clip_value)


@no_grad()
def clip_grads_with_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scale every gradient by ``min(max_norm / (total_norm + 1e-6), 1)``, the norm computed beforehand (e.g. by
    :func:`get_total_norm`, or across processes)."""
    grads = _grads(parameters)
    if not grads:
        return
    scale = (float(max_norm) / (total_norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.to(g.device))


def clip_grad_norm(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """The deprecated name of :func:`clip_grad_norm_`, with torch's warning."""
    import warnings

    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
                  FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
