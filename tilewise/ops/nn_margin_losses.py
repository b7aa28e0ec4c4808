"""Losses of torch.nn.functional beyond the classification and regression ones of ``nn_losses``: margin and
embedding losses, Poisson and Gaussian likelihoods, triplet losses, and the distances they build on
(pairwise_distance, pdist).

Each is a composite of pointwise primitives, gathers and reductions written as torch defines it (aten's
Loss.cpp and LossMultiMargin.cpp, or torch.nn.functional's Python), so autograd differentiates it with
torch's results: where torch's loop keeps a term only when ``z > 0``, the composite masks with ``z > 0``
too, so the gradient at the kink is torch's. Per-sample loops of aten (multi_margin_loss,
multilabel_margin_loss) become one comparison of every class with every target class.
"""

from __future__ import annotations

import math

from tilewise import strides as S
from tilewise.dtypes import c10_name
from tilewise.ops.nn_functional import call_public, concrete_cpu, functional, private, where
from tilewise.ops.nn_losses import _reduce, _reduction_mode

_COSINE_EPSILON = 1e-12  # aten's EPSILON in cosine_embedding_loss


def _zero_where_not_positive(z):
    """``max(z, 0)`` with gradient 1 only where ``z > 0`` (aten's ``clamp_min_(0)`` and its ``if (z > 0)``)."""
    return where(z > 0, z, 0.0)


# ---------------------------------------------------------------------------- embedding and ranking losses

def _cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("cosine_embedding_loss", reduction, size_average, reduce)
    if target.ndim not in (0, 1):
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if target.ndim == 1 and (input1.ndim != 2 or input2.ndim != 2):
        raise RuntimeError(f"1D target tensor expects 2D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    if target.ndim == 0 and (input1.ndim != 1 or input2.ndim != 1):
        raise RuntimeError(f"0D target tensor expects 1D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    dim = target.ndim
    products = (input1 * input2).sum(dim)
    squares1 = (input1 * input1).sum(dim) + _COSINE_EPSILON
    squares2 = (input2 * input2).sum(dim) + _COSINE_EPSILON
    cos = products / (squares1 * squares2).sqrt()
    loss = where(target == 1, 1 - cos, 0.0) + where(target == -1, (cos - margin).clamp(min=0), 0.0)
    return _reduce(loss, reduction)


def _hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("hinge_embedding_loss", reduction, size_average, reduce)
    below_margin = (margin - input).clamp(min=0)
    loss = where(target != 1, below_margin, 0.0) + where(target != -1, input, 0.0)
    return _reduce(loss, reduction)


def _margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("margin_ranking_loss", reduction, size_average, reduce)
    if not input1.ndim == input2.ndim == target.ndim:
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
                           f"input1: {list(input1.shape)}, input2: {list(input2.shape)}, target: "
                           f"{list(target.shape)} ")
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0), reduction)


def _soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("soft_margin_loss", reduction, size_average, reduce)
    from tilewise.ops.registry import OPS

    return _reduce(OPS["_soft_margin"](input, target), reduction)


# log(1 + exp(-input * target)) per element, its derivative written out so that backward keeps input and target
# (as torch's does: changing either in place before backward is an error)
private("_soft_margin(Tensor input, Tensor target) -> Tensor", lambda input, target: (-(input * target)).exp().log1p(),
        {"input": "grad * -target * sigmoid(-(input * target))",
         "target": "grad * -input * sigmoid(-(input * target))"},
        fwd="auto_element_wise")


functional("cosine_embedding_loss(Tensor input1, Tensor input2, Tensor target, float margin=0.0, "
           "bool? size_average=None, bool? reduce=None, str reduction='mean') -> Tensor", _cosine_embedding_loss,
           function=False, autocast="fp32")
functional("hinge_embedding_loss(Tensor input, Tensor target, float margin=1.0, bool? size_average=None, "
           "bool? reduce=None, str reduction='mean') -> Tensor", _hinge_embedding_loss, function=False,
           autocast="fp32")
functional("margin_ranking_loss(Tensor input1, Tensor input2, Tensor target, float margin=0.0, "
           "bool? size_average=None, bool? reduce=None, str reduction='mean') -> Tensor", _margin_ranking_loss,
           function=False, autocast="fp32")
functional("soft_margin_loss(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, "
           "str reduction='mean') -> Tensor", _soft_margin_loss, function=False, autocast="fp32")


# ---------------------------------------------------------------------------- multi-class margin losses

def _require_long_target(target) -> None:
    if target.dtype.name != "int64":
        found = c10_name(target.dtype)
        raise RuntimeError(f"expected scalar type Long but found {found} (the target holds class indices: int64)")


def _frames_and_classes(input) -> tuple[int, int]:
    """(the number of samples, the number of classes) of a (C,) or (N, C) input (a 0-d input: one class)."""
    if not ((input.ndim == 2 and input.shape[1] != 0) or (input.ndim == 1 and input.shape[0] != 0)
            or input.ndim == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(input.shape)}")
    return (1 if input.ndim <= 1 else input.shape[0]), (1 if input.ndim == 0 else input.shape[-1])


def _check_targets_in_range(target, low: int, classes: int, message: str) -> None:
    if concrete_cpu(target) and target.numel() and bool(((target < low) | (target >= classes)).any()):
        raise RuntimeError(message)


def _class_positions(classes: int, device):
    from tilewise.ops.creation import arange

    return arange(classes, device=device)


def _multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                       reduction="mean"):
    op = "multi_margin_loss"
    reduction = _reduction_mode(op, reduction, size_average, reduce)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.ndim != 1:
        raise ValueError("weight must be one-dimensional")
    frames, classes = _frames_and_classes(input)
    if target.ndim > 1 or target.numel() != frames:
        raise RuntimeError(f"{op}: target tensor should be 1-D with size equal to the number of input samples "
                           f"(batch size). Expected target size [{frames}], but got {list(target.shape)}. Input has "
                           f"shape {list(input.shape)}.")
    if weight is not None and weight.numel() != classes:
        raise RuntimeError(f"inconsistent weight size, expected {classes} but got {list(weight.shape)}")
    _require_long_target(target)
    _check_targets_in_range(target, 0, classes, "target out of range")
    x = input.reshape(frames, classes)
    t = target.reshape(frames, 1)
    # the gather keeps the target (as torch does) where it was checked; an unchecked one is kept in bounds
    safe = t if concrete_cpu(target) else t.clamp(0, classes - 1)
    z = margin - x.gather(1, safe) + x
    z = where(_class_positions(classes, x.device) != t, _zero_where_not_positive(z), 0.0)
    terms = z * z if p == 2 else z
    if weight is not None:
        terms = terms * weight.reshape(-1)[safe].to(terms.dtype)
    loss = terms.sum(1) / classes
    if reduction == "none":
        return loss if target.ndim > 0 else loss.reshape(())
    return _reduce(loss, reduction)


def _multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("multilabel_margin_loss", reduction, size_average, reduce)
    frames, classes = _frames_and_classes(input)
    expected = (frames, classes) if input.ndim == 2 else None
    if (expected is not None and tuple(target.shape) != expected) or \
            (expected is None and (target.ndim > 1 or target.numel() != classes)):
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(input.shape)}")
    _require_long_target(target)
    _check_targets_in_range(target, -1, classes, "argument #2 'target' is out of range")
    x = input.reshape(frames, classes)
    t = target.reshape(frames, classes)
    # the targets of a sample are those before its first -1
    listed = (t < 0).long().cumsum(1) == 0
    safe = where(listed, t, 0).clamp(0, classes - 1)
    is_target = ((safe.unsqueeze(2) == _class_positions(classes, x.device)) & listed.unsqueeze(2)).any(1)
    z = 1 - x.gather(1, safe).unsqueeze(2) + x.unsqueeze(1)  # [sample, listed target j, class d]
    counted = listed.unsqueeze(2) & ~is_target.unsqueeze(1)
    loss = where(counted, _zero_where_not_positive(z), 0.0).sum((1, 2)) / classes
    if reduction == "none":
        return loss if target.ndim > 1 else loss.reshape(())
    return _reduce(loss, reduction)


def _multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction_mode("multilabel_soft_margin_loss", reduction, size_average, reduce)
    logsigmoid = call_public("logsigmoid", input)
    loss = -(target * logsigmoid + (1 - target) * call_public("logsigmoid", -input))
    if weight is not None:
        loss = loss * weight
    class_dim = input.ndim - 1
    loss = loss.sum(class_dim) / input.shape[class_dim]
    return _reduce(loss, reduction)


functional("multi_margin_loss(Tensor input, Tensor target, int p=1, float margin=1.0, Tensor? weight=None, "
           "bool? size_average=None, bool? reduce=None, str reduction='mean') -> Tensor", _multi_margin_loss,
           function=False, autocast="fp32")
functional("multilabel_margin_loss(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, "
           "str reduction='mean') -> Tensor", _multilabel_margin_loss, function=False, autocast="fp32")
functional("multilabel_soft_margin_loss(Tensor input, Tensor target, Tensor? weight=None, bool? size_average=None, "
           "bool? reduce=None, str reduction='mean') -> Tensor", _multilabel_soft_margin_loss, function=False,
           autocast={"cuda": "fp32"})


# ---------------------------------------------------------------------------- likelihoods

def _poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                      reduction="mean"):
    reduction = _reduction_mode("poisson_nll_loss", reduction, size_average, reduce)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        stirling = target * target.log() - target + 0.5 * (2 * math.pi * target).log()
        loss = loss + stirling.masked_fill(target <= 1, 0.0)
    return _reduce(loss, reduction)


def _homoscedastic_var(input, var):
    """var shaped to broadcast against input, as torch accepts it: input's shape, input's shape without its last
    dim, or input's shape with one dim of size 1."""
    if tuple(var.shape) == tuple(input.shape):
        return var
    if tuple(input.shape[:-1]) == tuple(var.shape):
        return var.unsqueeze(-1)
    if input.ndim == var.ndim and sum(v for i, v in zip(input.shape, var.shape) if i != v) == 1:
        return var
    raise ValueError("var is of incorrect size")


def _clamped_without_grad(t, low: float):
    """``t`` clamped below at ``low`` where the clamp is invisible to autograd: torch clamps a clone in place under
    no_grad, so the gradient reaches var even where it was clamped, while forward AD (which no_grad does not stop)
    sees the clamp and zeroes the tangent there."""
    from tilewise._grad_mode import no_grad

    clamped = t.clone()
    with no_grad():
        clamped.clamp_(min=low)
    return clamped


def _gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    from tilewise.ops.creation import full as full_of

    if not hasattr(var, "shape"):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = full_of(tuple(input.shape), float(var), dtype=input.dtype, device=input.device)
    elif concrete_cpu(var) and var.numel() and bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    var = _homoscedastic_var(input, var)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not valid")
    var = _clamped_without_grad(var, eps)
    loss = 0.5 * (var.log() + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


functional("poisson_nll_loss(Tensor input, Tensor target, bool log_input=True, bool full=False, "
           "bool? size_average=None, float eps=1e-08, bool? reduce=None, str reduction='mean') -> Tensor",
           _poisson_nll_loss, function=False, autocast="fp32")
functional("gaussian_nll_loss(Tensor input, Tensor target, Tensor var, bool full=False, float eps=1e-06, "
           "str reduction='mean') -> Tensor", _gaussian_nll_loss, function=False, autocast={"cuda": "fp32"})
functional("gaussian_nll_loss.float(Tensor input, Tensor target, float var, bool full=False, float eps=1e-06, "
           "str reduction='mean') -> Tensor", _gaussian_nll_loss, function=False, autocast={"cuda": "fp32"})


# ---------------------------------------------------------------------------- distances and triplet loss

def _pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    S.broadcast_shapes(x1.shape, x2.shape, op="pairwise_distance")
    innermost = max(x1.ndim, x2.ndim) - 1
    return (x1 - x2 + eps).norm(p, innermost, keepdim)


def _pdist(input, p=2.0):
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    if not input.dtype.is_floating_point:
        raise RuntimeError("pdist only supports floating-point dtypes")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    first, second = _row_pairs(input.shape[0], input.device)
    return (input[first] - input[second]).norm(p, 1)


def _row_pairs(rows: int, device):
    """The row indices (i, j), i < j, in row-major order (pdist's output order); known from the shape alone."""
    from itertools import combinations

    from tilewise.dtypes import int64
    from tilewise.tensor import tensor

    pairs = list(combinations(range(rows), 2))
    first = tensor([i for i, _ in pairs], dtype=int64, device=device)
    second = tensor([j for _, j in pairs], dtype=int64, device=device)
    return first, second


def _check_triplet(anchor, positive, negative, margin) -> None:
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    if not anchor.ndim == positive.ndim == negative.ndim:
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative "
                           f"{negative.ndim}D inputs")


def triplet_loss(anchor, positive, negative, distance, margin, swap, reduction):
    """``max(d(a, p) - d(a, n) + margin, 0)``, with ``d(a, n)`` replaced by ``min(d(a, n), d(p, n))`` for swap."""
    dist_pos = distance(anchor, positive)
    dist_neg = distance(anchor, negative)
    if swap:
        dist_neg = call_public("minimum", dist_neg, distance(positive, negative))
    return _reduce((margin + dist_pos - dist_neg).clamp(min=0), reduction)


def _triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False, size_average=None,
                         reduce=None, reduction="mean"):
    reduction = _reduction_mode("triplet_margin_loss", reduction, size_average, reduce)
    _check_triplet(anchor, positive, negative, margin)
    return triplet_loss(anchor, positive, negative, lambda a, b: _pairwise_distance(a, b, p, eps), margin, swap,
                        reduction)


functional("pairwise_distance(Tensor x1, Tensor x2, float p=2.0, float eps=1e-06, bool keepdim=False) -> Tensor",
           _pairwise_distance, autocast={"cuda": "fp32"})
functional("pdist(Tensor input, float p=2.0) -> Tensor", _pdist, autocast={"cuda": "fp32"})
functional("triplet_margin_loss(Tensor anchor, Tensor positive, Tensor negative, float margin=1.0, float p=2.0, "
           "float eps=1e-06, bool swap=False, bool? size_average=None, bool? reduce=None, str reduction='mean') "
           "-> Tensor", _triplet_margin_loss, function=False, autocast="fp32")


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin: float = 1.0,
                                      swap: bool = False, reduction: str = "mean"):
    """The triplet loss under any distance (a Python callable, so a function over operators, not an operator).

    >>> import tilewise as tw
    >>> import tilewise.nn.functional as F
    >>> a = tw.zeros(2, 3)
    >>> F.triplet_margin_with_distance_loss(a, a, a + 1, distance_function=lambda x, y: (x - y).abs().sum(-1))
    tensor(0.)
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    _check_triplet(anchor, positive, negative, margin)
    distance = distance_function if distance_function is not None else call_public_pairwise_distance
    return triplet_loss(anchor, positive, negative, distance, margin, swap, reduction)


def call_public_pairwise_distance(x1, x2):
    return call_public("pairwise_distance", x1, x2)
