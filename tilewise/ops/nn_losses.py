"""Losses of torch.nn.functional, with torch's definitions of reductions, class weights, ignore_index and
label smoothing.

Elementwise losses (mse, l1, smooth_l1, huber, kl_div, binary_cross_entropy_with_logits) compose pointwise
primitives and a reduction, and differentiate through them. Three losses carry explicit derivatives, on private
operators, saving what torch saves: nll_loss (its input, target, weight and total weight; the gradient is
``-weight[t]`` at each target's class), cross_entropy, whose input gradient is
``softmax(x) * sum(q) - q`` for the weighted, smoothed target distribution q, computed from the
log-probabilities the forward returns beside the loss and backward keeps, as torch keeps log_softmax's
output (so the logits may change in place after the loss; probability targets get their gradient too), and
binary_cross_entropy, with torch's clamped closed form that stays finite at probabilities 0 and 1.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.ops.nn_functional import call_public, concrete_cpu, functional, in_compute_dtype, private, where
from tilewise.ops.registry import OPS

_REDUCTIONS = ("none", "mean", "sum")


def _reduction_mode(op: str, reduction: str, size_average=None, reduce=None) -> str:
    if size_average is not None or reduce is not None:
        reduction = "none" if reduce is False else ("sum" if size_average is False else "mean")
        warn_at_caller(f"size_average and reduce args will be deprecated, please use reduction='{reduction}' "
                       "instead.")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction ({op}: expected 'none', 'mean' or 'sum')")
    return reduction


def _reduce(loss, reduction: str):
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


def _broadcast_pair(op: str, input, target):
    if tuple(target.shape) != tuple(input.shape):
        warn_at_caller(f"Using a target size ({target.shape!r}) that is different to the input size "
                       f"({input.shape!r}). This will likely lead to incorrect results due to broadcasting. "
                       "Please ensure they have the same size.")
    shape = S.broadcast_shapes(input.shape, target.shape, op=op)
    return input.expand(shape), target.expand(shape)


def _elementwise_loss(op: str, loss_of_difference, mean_over_weight: bool):
    """A loss of (input - target) per element; an optional per-element weight divides 'mean' by its sum
    (mse, l1) or, for huber, by the element count, as torch does. ``loss_of_difference`` takes the broadcast
    input and target."""
    def loss_fn(input, target, reduction, weight):
        a, b = _broadcast_pair(op, input, target)
        loss = loss_of_difference(a, b)
        if weight is None:
            return _reduce(loss, reduction)
        if tuple(weight.shape) != tuple(input.shape):
            raise ValueError(f"Weights and input must have the same size. ({op}: got weight {list(weight.shape)} "
                             f"and input {list(input.shape)})")
        loss = loss * weight
        if reduction == "mean" and mean_over_weight:
            return loss.sum() / weight.sum()
        return _reduce(loss, reduction)

    return loss_fn


def _saving_input_and_target(kind: str, parameter: float = 0.0):
    """The per-element loss of (input - target) by ``_pointwise_loss``, which saves input and target as torch's
    mse_loss, huber_loss and smooth_l1_loss do (changing either in place before backward is an error there).
    Their kernels compute in the promoted dtype, so a bool target (or input) counts as 0 and 1 rather than failing
    as bool subtraction does (a promoted dtype that is not floating point, integers or two bools, is refused as
    torch's kernels refuse it); huber's result has input's dtype, as torch writes it into a tensor like input."""
    def loss(a, b):
        common = dtypes.promote_types(a.dtype, b.dtype)
        if kind == "huber" and common != a.dtype and not a.dtype.is_floating_point:
            raise RuntimeError(f"result type {dtypes.c10_name(common)} can't be cast to the desired output type "
                               f"{dtypes.c10_name(a.dtype)} (huber_loss: the result takes input's dtype, so input "
                               f"must be floating point, but it is {a.dtype})")
        if not common.is_floating_point:  # torch's mse, huber and smooth_l1 kernels are floating-point only
            raise NotImplementedError(f"\"{kind}_{a.device.type}\" not implemented for '{dtypes.c10_name(common)}'")
        out = OPS["_pointwise_loss"](a.to(common) if a.dtype == dtypes.bool_ else a,
                                     b.to(common) if b.dtype == dtypes.bool_ else b, kind, parameter)
        return out.to(a.dtype) if kind == "huber" and a.dtype.is_floating_point else out

    return loss


def _pointwise_loss_forward(input, target, kind, parameter):
    d = input - target
    if kind == "mse":
        return d * d
    size = d.abs()
    if kind == "huber":
        return where(size < parameter, d * d * 0.5, (size - 0.5 * parameter) * parameter)
    return where(size < parameter, d * d * (0.5 / parameter), size - 0.5 * parameter)  # smooth_l1, beta > 0


def _pointwise_loss_backward(grad, input, target, kind, parameter):
    """(input, target) gradients: torch's mse/huber/smooth_l1 backward, ``dl/dd`` of d = input - target."""
    d = input - target
    if kind == "mse":
        slope = 2 * d
    elif kind == "huber":
        slope = d.clamp(-parameter, parameter)
    else:
        slope = (d / parameter).clamp(-1.0, 1.0)
    g = grad * slope
    return g, -g


private("_pointwise_loss(Tensor input, Tensor target, str kind, float parameter) -> Tensor", _pointwise_loss_forward,
        {"input, target": "OPS['_pointwise_loss_backward'](grad, input, target, kind, parameter)"},
        fwd="auto_element_wise")
private("_pointwise_loss_backward(Tensor grad, Tensor input, Tensor target, str kind, float parameter) -> "
        "(Tensor, Tensor)", _pointwise_loss_backward)

def _squared_difference(a, b):
    d = a - b
    return d * d


_mse = _elementwise_loss("mse_loss", _squared_difference, True)
_l1 = _elementwise_loss("l1_loss", lambda a, b: (a - b).abs(), True)


def _mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _reduction_mode("mse_loss", reduction, size_average, reduce)
    if weight is None:  # torch's native mse_loss; with a weight, torch composes it as below
        return _elementwise_loss("mse_loss", _saving_input_and_target("mse"), True)(input, target, reduction, None)
    return _mse(input, target, reduction, weight)


def _l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    return _l1(input, target, _reduction_mode("l1_loss", reduction, size_average, reduce), weight)


def _smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    reduction = _reduction_mode("smooth_l1_loss", reduction, size_average, reduce)
    if beta < 0:
        raise RuntimeError(f"smooth_l1_loss does not support negative values for beta. (got beta={beta})")
    if beta == 0.0:
        return _l1(input, target, reduction, None)
    return _elementwise_loss("smooth_l1_loss", _saving_input_and_target("smooth_l1", beta), True)(
        input, target, reduction, None)


def _huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    reduction = _reduction_mode("huber_loss", reduction)
    if delta <= 0:
        raise RuntimeError(f"huber_loss does not support non-positive values for delta. (got delta={delta})")
    return _elementwise_loss("huber_loss", _saving_input_and_target("huber", delta), False)(input, target, reduction,
                                                                                            weight)


def _unweighted_in_float32_on_cpu(op, args) -> str | None:
    """torch's mse_loss and l1_loss call their listed aten operator only without ``weight``; with one,
    torch.nn.functional computes the loss from unlisted operators, in the given dtypes."""
    return "fp32" if args[op.param_names().index("weight")] is None else None


WEIGHTED_LOSS_AUTOCAST = {"cuda": "fp32", "cpu": _unweighted_in_float32_on_cpu}

functional("mse_loss(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, str reduction='mean', "
           "Tensor? weight=None) -> Tensor", _mse_loss, function=False, autocast=WEIGHTED_LOSS_AUTOCAST)
functional("l1_loss(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, str reduction='mean', "
           "Tensor? weight=None) -> Tensor", _l1_loss, function=False, autocast=WEIGHTED_LOSS_AUTOCAST)
functional("smooth_l1_loss(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, "
           "str reduction='mean', float beta=1.0) -> Tensor", _smooth_l1_loss, function=False, autocast="fp32")
functional("huber_loss(Tensor input, Tensor target, str reduction='mean', float delta=1.0, Tensor? weight=None) "
           "-> Tensor", _huber_loss, function=False, autocast="fp32")


# ---------------------------------------------------------------------------- class losses

def _class_layout(input, target, reduction: str):
    """Class-index targets: (input with classes at dim 1 and a batch dim, int64 target, whether unbatched), with
    torch's checks in torch's order (``nll_loss_nd``'s, then its kernels')."""
    if input.ndim == 0:
        raise ValueError("Expected 1 or more dimensions (got 0)")
    if input.ndim != 1 and (target.shape[0] if target.ndim else 0) != input.shape[0]:
        got = target.shape[0] if target.ndim else "a 0-dimensional target"
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size ({got}).")
    if input.ndim <= 2 and target.ndim > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if input.ndim == 1 and target.ndim == 1 and target.shape[0] != 1:
        raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: {target.shape[0]}")
    if input.ndim > 2 and tuple(target.shape[1:]) != tuple(input.shape[2:]):
        raise RuntimeError(f"Expected target size {[input.shape[0], *input.shape[2:]]}, got {list(target.shape)}")
    if target.dtype not in (dtypes.int64, dtypes.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {dtypes.c10_name(target.dtype)}")
    if target.dtype is dtypes.uint8 and input.ndim > 2 and (reduction == "none" or target.numel() > 0):
        raise RuntimeError("expected scalar type Long but found Byte")  # torch's 2-d kernel, which takes int64 only
    if input.ndim == 1:
        return input.unsqueeze(0), target.long().reshape(1), True
    return input, target.long(), False


def _check_class_weight(op: str, weight, classes: int, dtype=None) -> None:
    """The weight holds one number per class; beside a target of class indices (``dtype``, the input's), of the
    input's dtype, as torch's nll kernels take it (class probabilities promote with the weight instead)."""
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != classes):
        raise RuntimeError(f"{op}: weight tensor should be defined either for all {classes} classes or no classes "
                           f"but got weight tensor of shape: {list(weight.shape)}")
    if weight is not None and dtype is not None and weight.dtype != dtype:
        raise RuntimeError(f"expected scalar type {dtypes.c10_name(dtype)} but found {dtypes.c10_name(weight.dtype)}")


def _check_class_range(op: str, target, classes: int, ignore_index: int) -> None:
    if not concrete_cpu(target) or target.numel() == 0:
        return
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bad.any():
        value = int(target[bad].reshape(-1)[0].item())
        raise IndexError(f"Target {value} is out of bounds. ({op}: target class index {value} is out of bounds for "
                         f"input with C={classes} classes; valid class indices are 0..{classes - 1}, or "
                         f"ignore_index={ignore_index})")


def _nll_terms(logp, target, weight, ignore_index):
    """Per element: -weight[t] * logp[t] (0 where t == ignore_index), and the weight weight[t] it counts with."""
    valid = target != ignore_index
    safe = where(valid, target, 0)
    picked = logp.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = where(valid, weight[safe], 0.0) if weight is not None else valid.to(logp.dtype)
    return where(valid, -picked * w, 0.0), w


def _class_loss_reduction(loss, w, reduction: str):
    if reduction == "mean":
        return loss.sum() / w.sum()
    return loss.sum() if reduction == "sum" else loss.contiguous()  # torch's kernels write 'none' row-major


def _nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _reduction_mode("nll_loss", reduction, size_average, reduce)
    input, target, unbatched = _class_layout(input, target, reduction)
    _check_class_weight("nll_loss", weight, input.shape[1], input.dtype)
    _check_class_range("nll_loss", target, input.shape[1], ignore_index)
    loss = OPS["_nll_loss"](input, target, weight, reduction, ignore_index)[0]
    return loss.squeeze(0) if unbatched and reduction == "none" else loss


def _nll_loss_forward(input, target, weight, reduction, ignore_index):
    """(the loss, the total weight of the targets counted), as torch's nll_loss_forward."""
    loss, counted = _nll_terms(input, target, weight, ignore_index)
    return _class_loss_reduction(loss, counted, reduction), counted.sum()


def _nll_loss_backward(grad, input, target, weight, reduction, ignore_index, total_weight):
    """``-grad * weight[t]`` at each target's class (divided by the total weight for 'mean'), zero elsewhere."""
    x = in_compute_dtype(input)
    q, _, _ = _target_distribution(x, target, weight, ignore_index, 0.0)
    return (_scaled_loss_grad(grad, reduction, total_weight.to(x.dtype), x.dtype) * -q).to(input.dtype)


def _class_weight_view(weight, like):
    return None if weight is None else weight.reshape((-1,) + (1,) * (like.ndim - 2)).to(like.dtype)


def _smoothed(target, label_smoothing: float, classes: int):
    return target * (1 - label_smoothing) + label_smoothing / classes if label_smoothing > 0 else target


def _cross_entropy_loss(input, target, weight, reduction, ignore_index, label_smoothing):
    """(the loss, log_softmax(input) over the classes): backward reads the log-probabilities, not the input."""
    logp = input.log_softmax(1)
    classes = input.shape[1]
    w = _class_weight_view(weight, logp)
    if target.dtype.is_floating_point:
        q = _smoothed(target, label_smoothing, classes)
        loss = -(logp * (q * w if w is not None else q)).sum(1)
        return loss.sum() / (input.numel() / classes) if reduction == "mean" else _reduce(loss, reduction), logp
    loss, counted = _nll_terms(logp, target, weight, ignore_index)
    if label_smoothing > 0:
        uniform = -(logp * w).sum(1) if w is not None else -logp.sum(1)
        uniform = where(target != ignore_index, uniform, 0.0)
        loss = loss * (1 - label_smoothing) + uniform * (label_smoothing / classes)
    return _class_loss_reduction(loss, counted, reduction), logp


def _target_distribution(x, target, weight, ignore_index, label_smoothing):
    """(q, the sum of q over the classes, the divisor of the 'mean' reduction), with per-element loss
    ``-sum_k q_k log softmax(x)_k``. For class indices the sum is known without summing q over the row: the
    target class holds ``counted * (1 - label_smoothing)`` and the smoothing spreads ``label_smoothing / C``
    of each class weight. The target class's share is written as a comparison with the class positions, not
    scattered into zeros: a pointwise expression that the kernel consuming q computes as it goes, where a
    scatter would be a matrix of x's size in memory. A scatter would check the indices; the forward (the
    gather of the loss) has checked these same targets."""
    from tilewise.ops.creation import arange

    classes = x.shape[1]
    w = _class_weight_view(weight, x)
    if target.dtype.is_floating_point:
        q = _smoothed(target.to(x.dtype), label_smoothing, classes)
        q = q * w if w is not None else q
        return q, q.sum(1, keepdim=True), x.numel() / classes
    valid = (target != ignore_index).to(x.dtype)
    safe = where(target != ignore_index, target, 0)
    counted = weight[safe].to(x.dtype) * valid if weight is not None else valid
    kept = counted * (1 - label_smoothing) if label_smoothing > 0 else counted
    narrow = dtypes.int32 if classes < 2**31 else dtypes.int64  # positions computed in kernels: 32-bit arithmetic
    positions = arange(classes, dtype=narrow, device=x.device).view((classes,) + (1,) * (x.ndim - 2))
    q = where(positions == safe.unsqueeze(1), kept.unsqueeze(1), 0.0)
    total = kept
    if label_smoothing > 0:
        uniform = valid.unsqueeze(1) * (label_smoothing / classes)
        q = q + (uniform * w if w is not None else uniform)
        spread = weight.to(x.dtype).sum() if weight is not None else classes
        total = total + valid * (label_smoothing / classes) * spread
    return q, total.unsqueeze(1), counted.sum()


def _scaled_loss_grad(grad, reduction: str, divisor, dtype):
    g = grad.to(dtype)
    if reduction == "none":
        return g.unsqueeze(1)
    return g / divisor if reduction == "mean" else g


def _cross_entropy_backward(grad, logp, target, weight, reduction, ignore_index, label_smoothing):
    """The input gradient from the saved log-probabilities: ``exp(logp) * sum(q) - q``, scaled by the reduction."""
    x = in_compute_dtype(logp)
    q, total, divisor = _target_distribution(x, target, weight, ignore_index, label_smoothing)
    return _scaled_loss_grad(grad, reduction, divisor, x.dtype) * (x.exp() * total - q)


def _cross_entropy_target_backward(grad, logp, target, weight, reduction, label_smoothing):
    x = in_compute_dtype(logp)
    w = _class_weight_view(weight, x)
    d = x * -(1 - label_smoothing)
    g = _scaled_loss_grad(grad, reduction, x.numel() / x.shape[1], x.dtype)
    return g * (d * w if w is not None else d)



def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                   label_smoothing=0.0):
    op = "cross_entropy"
    reduction = _reduction_mode(op, reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if tuple(target.shape) == tuple(input.shape):
        if not target.dtype.is_floating_point:
            raise RuntimeError(f"Expected floating point type for target with class probabilities, got "
                               f"{dtypes.c10_name(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        if input.ndim == 0:
            raise IndexError("Dimension specified as 1 but tensor has no dimensions")
        unbatched = input.ndim == 1
        if unbatched:
            input, target = input.unsqueeze(0), target.unsqueeze(0)
        if label_smoothing > 0:  # smoothed before the loss, as torch does: the loss keeps the smoothed copy
            target, label_smoothing = _smoothed(target, label_smoothing, input.shape[1]), 0.0
    else:
        input, target, unbatched = _class_layout(input, target, reduction)
        _check_class_range(op, target, input.shape[1], ignore_index)
    _check_class_weight(op, weight, input.shape[1], None if target.dtype.is_floating_point else input.dtype)
    loss = OPS["_cross_entropy_loss"](input, target, weight, reduction, ignore_index, label_smoothing)[0]
    return loss.squeeze(0) if unbatched and reduction == "none" else loss


private("_nll_loss(Tensor input, Tensor target, Tensor? weight, str reduction, int ignore_index) -> (Tensor, Tensor)",
        _nll_loss_forward,
        {"input": "OPS['_nll_loss_backward'](grad, input, target, weight, reduction, ignore_index, result[1])",
         "target": None, "weight": None}, nondiff_outputs=(1,),
        fwd="(OPS['_nll_loss'](input_t, target, weight, reduction, ignore_index)[0], None)")
private("_nll_loss_backward(Tensor grad, Tensor input, Tensor target, Tensor? weight, str reduction, "
        "int ignore_index, Tensor total_weight) -> Tensor", _nll_loss_backward)
functional("nll_loss(Tensor input, Tensor target, Tensor? weight=None, bool? size_average=None, "
           "int ignore_index=-100, bool? reduce=None, str reduction='mean') -> Tensor", _nll_loss, function=False,
           autocast="fp32")
functional("cross_entropy(Tensor input, Tensor target, Tensor? weight=None, bool? size_average=None, "
           "int ignore_index=-100, bool? reduce=None, str reduction='mean', float label_smoothing=0.0) -> Tensor",
           _cross_entropy, function=False, autocast="fp32")
private("_cross_entropy_loss(Tensor input, Tensor target, Tensor? weight, str reduction, int ignore_index, "
        "float label_smoothing) -> (Tensor, Tensor)", _cross_entropy_loss,
        {"input": "cross_entropy_input_grad(grad, output_grads, result[1], target, weight, reduction, ignore_index, "
                  "label_smoothing)",
         "target": "OPS['_cross_entropy_target_backward'](grad, result[1], target, weight, reduction, "
                   "label_smoothing)",
         "weight": None},
        fwd="cross_entropy_jvp(input_t, target, target_t, weight, reduction, ignore_index, label_smoothing, "
            "result[0], result[1])")
private("_cross_entropy_backward(Tensor grad, Tensor logp, Tensor target, Tensor? weight, str reduction, "
        "int ignore_index, float label_smoothing) -> Tensor", _cross_entropy_backward)
private("_cross_entropy_target_backward(Tensor grad, Tensor logp, Tensor target, Tensor? weight, str reduction, "
        "float label_smoothing) -> Tensor", _cross_entropy_target_backward)


# ---------------------------------------------------------------------------- binary and divergence losses

def _binary_cross_entropy_loss(input, target, weight, reduction):
    loss = (target - 1) * (-input).log1p().clamp(min=-100) - target * input.log().clamp(min=-100)
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    op = "binary_cross_entropy"
    reduction = _reduction_mode(op, reduction, size_average, reduce)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({target.shape!r}) that is different to the input size "
                         f"({input.shape!r}) is deprecated. Please ensure they have the same size. ({op})")
    if target.dtype != input.dtype:  # torch.full((n,), 1) as a label is int64: DCGAN passes dtype= for this
        raise RuntimeError(f"{op}: Found dtype {dtypes.c10_name(target.dtype)} but expected "
                           f"{dtypes.c10_name(input.dtype)}: target must have input's dtype ({input.dtype}), but "
                           f"it is {target.dtype}; convert it with target.to(input.dtype)")
    if concrete_cpu(input) and input.numel() and not bool(((input >= 0) & (input <= 1)).all()):
        raise RuntimeError(f"{op}: all elements of input should be between 0 and 1 (input holds probabilities; for "
                           "logits use binary_cross_entropy_with_logits)")
    if weight is not None:  # torch scales the loss in place: the result keeps input's dtype
        weight = weight.expand(S.broadcast_shapes(target.shape, weight.shape, op=op)).to(input.dtype)
    return OPS["_binary_cross_entropy"](input, target, weight, reduction)


_BCE_SCALE = "(1 if weight is None else weight) / (input.numel() if reduction == 'mean' else 1)"
private("_binary_cross_entropy(Tensor input, Tensor target, Tensor? weight, str reduction) -> Tensor",
        _binary_cross_entropy_loss,
        {"input": f"grad * (input - target) / clamp((1 - input) * input, min=1e-12) * {_BCE_SCALE}",
         "target": f"grad * (log1p(-input) - log(input)) * {_BCE_SCALE}", "weight": None},
        fwd=f"loss_jvp((input_t * (input - target) / clamp((1 - input) * input, min=1e-12) + target_t * "
            f"(log1p(-input) - log(input))) * {_BCE_SCALE}, reduction)")
functional("binary_cross_entropy(Tensor input, Tensor target, Tensor? weight=None, bool? size_average=None, "
           "bool? reduce=None, str reduction='mean') -> Tensor", _binary_cross_entropy, function=False,
           autocast={"cuda": "banned", "cpu": "fp32"})


def _binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                      pos_weight=None):
    reduction = _reduction_mode("binary_cross_entropy_with_logits", reduction, size_average, reduce)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"binary_cross_entropy_with_logits: Target size ({list(target.shape)}) must be the same as "
                         f"input size ({list(input.shape)})")
    if not (target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == dtypes.bool_):
        # torch computes (1 - target).mul_(input) in target's dtype; bool targets fail in the subtraction itself
        raise RuntimeError(f"binary_cross_entropy_with_logits: result type {dtypes.c10_name(input.dtype)} can't be "
                           f"cast to the desired output type {dtypes.c10_name(target.dtype)}: the target must be "
                           f"floating point (probabilities), but it is {target.dtype}; convert it with "
                           "target.to(input.dtype)")
    return OPS["_binary_cross_entropy_with_logits"](input, target, weight, pos_weight, reduction)


def _bce_with_logits_loss(input, target, weight, pos_weight, reduction):
    log_sigmoid = call_public("logsigmoid", input)
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sigmoid
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _bce_with_logits_backward(grad, input, target, weight, pos_weight, reduction):
    """Gradients for input, target, weight and pos_weight from the saved operands, as torch's backward: with
    p = pos_weight * target, d/dinput = (1 + p - target) * sigmoid(input) - p, d/dtarget = -input -
    (pos_weight - 1) * logsigmoid(input)."""
    scale = grad / input.numel() if reduction == "mean" else grad
    log_sigmoid = call_public("logsigmoid", input)
    if pos_weight is not None:
        weighted = pos_weight * target
        grad_input = (1 + weighted - target) * input.sigmoid() - weighted
        grad_target = -input - (pos_weight - 1) * log_sigmoid
        grad_pos_weight = -target * log_sigmoid
    else:
        grad_input, grad_target, grad_pos_weight = input.sigmoid() - target, -input, None
    unweighted = (1 - target) * input - (log_sigmoid * ((pos_weight - 1) * target + 1) if pos_weight is not None
                                         else log_sigmoid)
    if weight is not None:
        grad_input, grad_target = grad_input * weight, grad_target * weight
        grad_pos_weight = grad_pos_weight * weight if grad_pos_weight is not None else None
    return (scale * grad_input, scale * grad_target, scale * unweighted if weight is not None else None,
            scale * grad_pos_weight if grad_pos_weight is not None else None)


private("_binary_cross_entropy_with_logits(Tensor input, Tensor target, Tensor? weight, Tensor? pos_weight, "
        "str reduction) -> Tensor", _bce_with_logits_loss,
        {"input, target, weight, pos_weight": "OPS['_binary_cross_entropy_with_logits_backward'](grad, input, "
                                              "target, weight, pos_weight, reduction)"},
        fwd="bce_with_logits_jvp(input_t, target_t, weight_t, pos_weight_t, input, target, weight, pos_weight, "
            "result, reduction)")
private("_binary_cross_entropy_with_logits_backward(Tensor grad, Tensor input, Tensor target, Tensor? weight, "
        "Tensor? pos_weight, str reduction) -> (Tensor, Tensor, Tensor, Tensor)", _bce_with_logits_backward)
functional("binary_cross_entropy_with_logits(Tensor input, Tensor target, Tensor? weight=None, "
           "bool? size_average=None, bool? reduce=None, str reduction='mean', Tensor? pos_weight=None) -> Tensor",
           _binary_cross_entropy_with_logits, function=False, autocast="fp32")


def _kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    if not (input.dtype.is_floating_point or input.dtype.is_complex) or \
            not (target.dtype.is_floating_point or target.dtype.is_complex):
        raise RuntimeError(f"kl_div: Integral inputs not supported. (got input {input.dtype} and target "
                           f"{target.dtype}; kl_div takes log-probabilities and probabilities in a floating dtype)")
    if reduction == "batchmean" and size_average is None and reduce is None:
        mode = "batchmean"
    else:
        mode = _reduction_mode("kl_div", reduction, size_average, reduce)
    if mode == "mean":
        warn_at_caller("reduction: 'mean' divides the total loss by both the batch size and the support size."
                       "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                       "'mean' will be changed to behave the same as 'batchmean' in the next major release.")
    if log_target:
        loss = target.exp() * (target - input)
    else:
        loss = target * where(target == 0, 1.0, target).log() - target * input
    if mode == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, mode)


functional("kl_div(Tensor input, Tensor target, bool? size_average=None, bool? reduce=None, str reduction='mean', "
           "bool log_target=False) -> Tensor", _kl_div, function=False, autocast="fp32")
