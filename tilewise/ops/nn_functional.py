"""torch.nn.functional's operators, part one: normalization, dropout, embedding, similarity and attention,
plus the helpers shared with ``nn_losses`` (losses) and ``nn_spatial`` (convolution, pooling, resampling).

[Note: nn.functional operators] Every operator is a composite over tilewise primitives (reductions,
pointwise, gather/scatter, views, matmul, Philox random), so every backend and the compiler get it from one
decomposition. Public operators keep torch.nn.functional's signatures and do the argument checking and shape
normalisation; where the composed backward would be wasteful or unstable, a private operator carries an
explicit derivative instead:
  * normalizations (layer, RMS, batch; group and instance reuse them) save their mean and reciprocal std
    and use the closed-form input gradient, one joint formula for input and weight;
  * attention saves its output and the per-row log-sum-exp, and backward recomputes the probabilities (as
    fused attention kernels do), so what is kept for backward stays linear in the sequence length;
  * embedding routes no gradient to ``padding_idx`` and accumulates rows with one index_put.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.dispatch import values_readable
from tilewise.dtypes import compute_dtype, finfo
from tilewise.layouts import in_format_of, suggest_memory_format
from tilewise.ops.batching_rules import attention_rule, batch_norm_rule, leading_batch_first_only
from tilewise.ops.movement import _index_errors_named, check_index_range
from tilewise.ops.registry import OPS, declare, public_function


def functional(schema: str, decomposition, grad: dict | None = None, **attrs):
    """A public operator of tilewise.nn.functional (a Tensor method only where torch has one), without ``out=`` unless
    told ``out=True``: torch's functions there are Python functions, or aten's without an out variant (``conv2d``)."""
    attrs.setdefault("method", False)
    attrs.setdefault("out", False)
    return declare(schema, "composite", decomposition=decomposition, grad=grad, functional=True, **attrs)


def private(schema: str, decomposition, grad: dict | None = None, **attrs):
    """An internal operator: the part of a functional op that carries its derivative, or a backward."""
    return declare(schema, "composite", decomposition=decomposition, grad=grad, public=False, method=False, **attrs)


def call_public(name: str, *args, **kwargs):
    return public_function(name)(*args, **kwargs)


def where(condition, a, b):
    return call_public("where", condition, a, b)


def in_compute_dtype(x):
    """x in the dtype its arithmetic runs in (float32 for half types)."""
    return x.to(compute_dtype(x.dtype))


def concrete_cpu(t) -> bool:
    """Whether t's values can be inspected cheaply for argument checks (not traced, not on an accelerator)."""
    return values_readable(t) and t.device.type == "cpu"


def int_tuple(value, n: int, name: str, op: str) -> tuple[int, ...]:
    if type(value) is tuple and len(value) == n:  # the common case (a module's stride, padding, dilation): as it is
        for v in value:  # (a loop rather than all(...): no generator to make)
            if type(v) is not int:
                break
        else:
            return value
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise RuntimeError(f"{op}: {name} must be an int or a tuple of {n} ints, got {list(values)}")
    return tuple(int(v) for v in values)


# ============================================================================ normalization

def _check_normalized_shape(op: str, input, normalized_shape, weight, bias=None) -> None:
    n = len(normalized_shape)
    if n == 0 or input.ndim < n or tuple(input.shape[input.ndim - n:]) != tuple(normalized_shape):
        raise RuntimeError(f"{op}: Given normalized_shape={list(normalized_shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, normalized_shape))}], but got input of size {list(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != tuple(normalized_shape):
            raise RuntimeError(f"{op}: Expected {name} to be of same shape as normalized_shape, but got {name} of "
                               f"shape {list(t.shape)} and normalized_shape = {list(normalized_shape)}")


def _trailing_dims(x, count: int) -> tuple[int, ...]:
    return tuple(range(x.ndim - count, x.ndim))


def _affine(xhat, weight, bias, dtype):
    out = xhat * weight if weight is not None else xhat
    out = out + bias if bias is not None else out
    return out.to(dtype)


def _statistics(x, dims, eps, centered: bool):
    """(mean, 1 / sqrt(var + eps)) over dims; RMS normalization (not centered) has no mean and var = mean(x^2)."""
    mean = x.mean(dims, keepdim=True) if centered else None
    deviation = x - mean if centered else x
    return mean, ((deviation * deviation).mean(dims, keepdim=True) + eps).rsqrt()


def _backward_statistics(x, dims, eps, mean, rstd):
    """The saved statistics; or, when the backward is itself differentiated (create_graph), the statistics
    recomputed from x, so the second derivative sees how they depend on x."""
    from tilewise._grad_mode import is_grad_enabled

    return _statistics(x, dims, eps, mean is not None) if is_grad_enabled() else (mean, rstd)


def _native_layer_norm(input, normalized_shape, weight, bias, eps):
    _check_normalized_shape("layer_norm", input, normalized_shape, weight, bias)
    x = in_compute_dtype(input).contiguous()  # torch's kernel: a contiguous result whatever the input's layout
    mean, rstd = _statistics(x, _trailing_dims(input, len(normalized_shape)), eps, True)
    return _affine((x - mean) * rstd, weight, bias, input.dtype), mean, rstd


def _fused_rms_norm(input, normalized_shape, weight, eps):
    _check_normalized_shape("rms_norm", input, normalized_shape, weight)
    x = in_compute_dtype(input)
    _, rstd = _statistics(x, _trailing_dims(input, len(normalized_shape)), eps, False)
    return in_format_of(_affine(x * rstd, weight, None, input.dtype), input), rstd


def _normalized_input_grad(grad_xhat, xhat, rstd, dims, centered: bool):
    """Gradient w.r.t. x of xhat = (x - mean(x)) * rstd (centered) or x * rstd (RMS), statistics over dims."""
    projection = xhat * (grad_xhat * xhat).mean(dims, keepdim=True)
    if centered:
        return rstd * (grad_xhat - grad_xhat.mean(dims, keepdim=True) - projection)
    return rstd * (grad_xhat - projection)


def _layer_norm_backward(grad, input, mean, rstd, weight, bias, normalized_ndim, eps):
    """Gradients for input, weight and bias (autograd sums the latter two to their shapes). ``bias`` is read
    only for whether it exists, but it is saved, as torch saves it: changing it in place before backward is an
    error there too."""
    dims = _trailing_dims(input, normalized_ndim)
    x = in_compute_dtype(input)
    mean, rstd = _backward_statistics(x, dims, eps, mean, rstd)
    xhat = (x - mean) * rstd if mean is not None else x * rstd
    g = grad.to(xhat.dtype)
    grad_input = _normalized_input_grad(g * weight if weight is not None else g, xhat, rstd, dims, mean is not None)
    # in the input's dtype here, where the cast joins the kernel that computes it, rather than as a cast of its own
    # after (autograd's); the weight's terms stay in the compute dtype until autograd has summed them
    return grad_input.to(input.dtype), (g * xhat if weight is not None else None), (grad if bias is not None else None)


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return OPS["native_layer_norm"](input, normalized_shape, weight, bias, eps)[0]


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    eps = finfo(compute_dtype(input.dtype)).eps if eps is None else eps
    return OPS["_fused_rms_norm"](input, normalized_shape, weight, eps)[0]


private("native_layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> "
        "(Tensor, Tensor, Tensor)", _native_layer_norm,
        {"input, weight, bias": "OPS['_layer_norm_backward'](grad, input, result[1], result[2], weight, bias, "
                                "len(normalized_shape), eps)"}, nondiff_outputs=(1, 2),
        fwd="layer_norm_jvp(input, input_t, normalized_shape, weight, weight_t, bias_t, result[1], result[2])",
        autocast={"cuda": "fp32"})
private("_fused_rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float eps) -> (Tensor, Tensor)",
        _fused_rms_norm,
        {"input, weight": "OPS['_layer_norm_backward'](grad, input, None, result[1], weight, None, "
                          "len(normalized_shape), eps)"},
        nondiff_outputs=(1,),
        fwd="layer_norm_jvp(input, input_t, normalized_shape, weight, weight_t, None, None, result[1])")
private("_layer_norm_backward(Tensor grad, Tensor input, Tensor? mean, Tensor rstd, Tensor? weight, Tensor? bias, "
        "int normalized_ndim, float eps) -> (Tensor, Tensor, Tensor)", _layer_norm_backward)
functional("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
           "float eps=1e-05) -> Tensor", _layer_norm, autocast={"cuda": "fp32"}, batch=leading_batch_first_only)
functional("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
           _rms_norm, autocast={"cuda": "fp32"})


def _channel_shape(input) -> tuple[int, ...]:
    return (1, input.shape[1]) + (1,) * (input.ndim - 2)


def _non_channel_dims(input) -> tuple[int, ...]:
    return (0, *range(2, input.ndim))


def _overwrite_untracked(dst, value) -> None:
    """Write ``value`` into ``dst`` without recording it or bumping its version, as torch's batch norm kernel
    updates the running statistics: a backward that saved them (a second forward through the same layer before
    the first's backward, as in siamese nets and GAN discriminators) must not find them changed."""
    from tilewise._grad_mode import no_grad

    with no_grad():
        OPS["_write_"](dst, value.to(dst.dtype))


def _update_running_stats(running_mean, running_var, mean, var, momentum, count):
    if running_mean is not None:
        batch_mean = mean.reshape(-1).to(running_mean.dtype)
        _overwrite_untracked(running_mean, batch_mean * momentum + running_mean * (1 - momentum))
    if running_var is not None:
        unbiased = (var.reshape(-1) * (count / max(count - 1, 1))).to(running_var.dtype)
        _overwrite_untracked(running_var, unbiased * momentum + running_var * (1 - momentum))


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    x = in_compute_dtype(input)
    stat_shape = _channel_shape(input)
    if training:
        dims = _non_channel_dims(input)
        mean = x.mean(dims, keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(dims, keepdim=True)
        count = math.prod(input.shape[d] for d in dims)  # per channel, also where there are no channels
        _update_running_stats(running_mean, running_var, mean, var, momentum, count)
    else:
        mean = running_mean.to(x.dtype).reshape(stat_shape)
        var = running_var.to(x.dtype).reshape(stat_shape)
        centered = x - mean
    invstd = (var + eps).rsqrt()
    w = weight.reshape(stat_shape) if weight is not None else None
    b = bias.reshape(stat_shape) if bias is not None else None
    return in_format_of(_affine(centered * invstd, w, b, input.dtype), input), mean, invstd


def _batch_norm_backward(grad, input, weight, running_mean, running_var, save_mean, save_invstd, training, eps):
    """torch's native_batch_norm_backward: from the batch statistics saved by the forward when training, from
    the running statistics otherwise."""
    dims = _non_channel_dims(input)
    x = in_compute_dtype(input)
    stat_shape = _channel_shape(input)
    if training:
        mean, invstd = _backward_statistics(x, dims, eps, save_mean, save_invstd)
    else:
        mean = running_mean.to(x.dtype).reshape(stat_shape)
        invstd = (running_var.to(x.dtype).reshape(stat_shape) + eps).rsqrt()
    g = grad.to(x.dtype)
    xhat = (x - mean) * invstd
    grad_xhat = g * weight.reshape(stat_shape) if weight is not None else g
    if training:
        grad_input = _normalized_input_grad(grad_xhat, xhat, invstd, dims, True)
    else:
        grad_input = grad_xhat * invstd
    # each gradient in its input's dtype, as torch's kernels write them: cast here, the casts join the kernels that
    # compute them (a bf16 input's float32 gradient cast by autograd afterwards was a kernel and a float32 pass more)
    grad_weight = (g * xhat).sum(dims).to(weight.dtype) if weight is not None else None
    return grad_input.to(input.dtype), grad_weight, g.sum(dims)


def _check_batch_norm(input, running_mean, running_var, weight, bias, training):
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected an input of shape (N, C, *), got {list(input.shape)}")
    channels = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise RuntimeError(f"batch_norm: {name} should contain {channels} elements (one per channel of input "
                               f"{list(input.shape)}), not {t.numel()} (shape {list(t.shape)})")
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError("batch_norm: running_mean must be defined in evaluation mode (training=False): pass "
                           "running_mean and running_var, or training=True to normalize with batch statistics")
    if training and input.numel() // max(channels, 1) == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(input.shape)}")


def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    _check_batch_norm(input, running_mean, running_var, weight, bias, training)
    return OPS["native_batch_norm"](input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    if input.ndim < 2:
        raise RuntimeError(f"group_norm: Expected at least 2 dimensions for input tensor but received {input.ndim}")
    if input.shape[1] % num_groups != 0:
        raise RuntimeError(f"group_norm: Expected number of channels in input to be divisible by num_groups, but got "
                           f"input of shape {list(input.shape)} and num_groups={num_groups}")
    channels = input.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise RuntimeError(f"group_norm: Expected {name} to be a vector of size equal to the number of channels "
                               f"in input ({channels}), but got {name} of shape {list(t.shape)}")
    grouped = input.reshape(input.shape[0], num_groups, math.prod(input.shape[1:]) // num_groups)
    normalized = _layer_norm(grouped, (grouped.shape[-1],), None, None, eps).reshape(input.shape)
    if input.device.type == "cpu":  # torch's CPU kernel keeps a channels-last input's format; its CUDA one does not
        normalized = normalized.contiguous(memory_format=suggest_memory_format(input))
    stat_shape = _channel_shape(input)
    return _affine(normalized, None if weight is None else weight.reshape(stat_shape),
                   None if bias is None else bias.reshape(stat_shape), input.dtype)


def _per_instance(t, batch: int):
    """``t`` once per instance, always a copy (torch's repeat): batch norm saves it, and the caller then writes
    the instances' mean back into ``t``."""
    return None if t is None else t.repeat(batch)


def _instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                   momentum=0.1, eps=1e-5):
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected an input of shape (N, C, *spatial), got {list(input.shape)}")
    if use_input_stats and S.numel(input.shape[2:]) == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(input.shape)}")
    from tilewise._grad_mode import no_grad

    batch, channels = input.shape[0], input.shape[1]
    as_channels = input.reshape(1, batch * channels, *input.shape[2:])
    mean, var = _per_instance(running_mean, batch), _per_instance(running_var, batch)
    out = _batch_norm(as_channels, mean, var, _per_instance(weight, batch), _per_instance(bias, batch),
                      use_input_stats, momentum, eps)
    with no_grad():
        for running, instances in ((running_mean, mean), (running_var, var)):
            if running is not None:
                running.copy_(instances.view(batch, channels).mean(0))
    return out.reshape(input.shape)


private("native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
        "bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)", _native_batch_norm,
        {"input, weight, bias": "OPS['_batch_norm_backward'](grad, input, weight, running_mean, running_var, "
                                "result[1], result[2], training, eps)",
         "running_mean": None, "running_var": None}, nondiff_outputs=(1, 2), batch=batch_norm_rule,
        fwd="batch_norm_jvp(input, input_t, weight, weight_t, bias_t, running_mean, running_var, training, eps, "
            "result[1], result[2])")
private("_batch_norm_backward(Tensor grad, Tensor input, Tensor? weight, Tensor? running_mean, Tensor? running_var, "
        "Tensor save_mean, Tensor save_invstd, bool training, float eps) -> (Tensor, Tensor, Tensor)",
        _batch_norm_backward)
functional("batch_norm(Tensor input, Tensor? running_mean, Tensor? running_var, Tensor? weight=None, "
           "Tensor? bias=None, bool training=False, float momentum=0.1, float eps=1e-05) -> Tensor", _batch_norm,
           function=False)
functional("group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
           "-> Tensor", _group_norm, autocast={"cuda": "fp32"})
functional("instance_norm(Tensor input, Tensor? running_mean=None, Tensor? running_var=None, Tensor? weight=None, "
           "Tensor? bias=None, bool use_input_stats=True, float momentum=0.1, float eps=1e-05) -> Tensor",
           _instance_norm, function=False)


def _normalize(input, p=2.0, dim=1, eps=1e-12):
    return input / input.norm(p, dim, keepdim=True).clamp(min=eps)


def _norm_clamped_without_grad(x, dim, eps):
    """||x|| clamped below at eps, where the clamp is invisible to autograd (torch clamps in place, no_grad)."""
    norm = x.norm(2, dim, keepdim=True)
    detached = norm.detach()
    return norm + (detached.clamp(min=eps) - detached)


def _cosine_similarity(x1, x2, dim=1, eps=1e-8):
    shape = S.broadcast_shapes(x1.shape, x2.shape, op="cosine_similarity")
    a, b = x1.expand(shape), x2.expand(shape)
    if not a.dtype.is_floating_point:
        a, b = a.float(), b.float()
    d = S.normalize_dim(dim, len(shape), "cosine_similarity")
    return ((a / _norm_clamped_without_grad(a, d, eps)) * (b / _norm_clamped_without_grad(b, d, eps))).sum(d)


functional("normalize(Tensor input, float p=2.0, int dim=1, float eps=1e-12) -> Tensor", _normalize,
           function=False, autocast={"cuda": "fp32"}, out=True)
functional("cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor", _cosine_similarity,
           autocast={"cuda": "fp32"})


# ============================================================================ dropout

def check_dropout_p(p: float, op: str) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")


def _apply_dropout(input, p, inplace, mask_shape):
    """input * mask / (1 - p) with mask ~ Bernoulli(1 - p) of mask_shape (broadcast over input), like torch."""
    from tilewise.ops.creation import full

    if p == 1.0:
        scale = full((), 0.0, dtype=input.dtype, device=input.device)
    else:
        keep = full(mask_shape, 1.0 - p, dtype=input.dtype, device=input.device).bernoulli()
        scale = keep / (1.0 - p)
    return input.mul_(scale) if inplace else input * scale


def _dropout(input, p=0.5, training=True, inplace=False):
    check_dropout_p(p, "dropout")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    return _apply_dropout(input, p, inplace, input.shape)


def _dropout1d(input, p=0.5, training=True, inplace=False):
    check_dropout_p(p, "dropout1d")
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that "
                           "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension, a "
                           "channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    return _channel_dropout(input, p, training, inplace, batched=input.ndim == 3)


def _dropout2d(input, p=0.5, training=True, inplace=False):
    """torch's dropout2d: a mask per (dim 0, dim 1) pair whatever the rank (a 3-D input is read as (N, C, L)), with
    its deprecation warnings for other ranks than 4."""
    check_dropout_p(p, "dropout2d")
    if input.ndim not in (3, 4):
        warn_at_caller(_FEATURE_DROPOUT_RANK.format(n=2, rank=input.ndim, kind="2 spatial dimensions",
                                                    ranks="3D or 4D"))
    if input.ndim == 3:
        warn_at_caller("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                       "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel dim. "
                       "This behavior will change in a future release to interpret the input as one without a batch "
                       "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise dropout behavior, please "
                       "switch to using dropout1d instead.")
    return _channel_dropout(input, p, training, inplace, batched=True)


def _dropout3d(input, p=0.5, training=True, inplace=False):
    check_dropout_p(p, "dropout3d")
    if input.ndim not in (4, 5):
        warn_at_caller(_FEATURE_DROPOUT_RANK.format(n=3, rank=input.ndim, kind="3 spatial dimensions",
                                                    ranks="4D or 5D"))
    return _channel_dropout(input, p, training, inplace, batched=input.ndim == 5)


_FEATURE_DROPOUT_RANK = ("dropout{n}d: Received a {rank}-D input to dropout{n}d, which is deprecated and will result "
                         "in an error in a future release. To retain the behavior and silence this warning, please use "
                         "dropout instead. Note that dropout{n}d exists to provide channel-wise dropout on inputs with "
                         "{kind}, a channel dimension, and an optional batch dimension (i.e. {ranks} inputs).")


def _channel_dropout(input, p, training, inplace, batched: bool):
    """Dropout of whole channels: one draw per (batch, channel) pair, or per channel (dim 0) of an unbatched input."""
    if not training or p == 0.0 or input.numel() == 0:
        return input
    lead = 2 if batched else 1
    if input.ndim + (not batched) < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return _apply_dropout(input, p, inplace, input.shape[:lead] + (1,) * (input.ndim - lead))


functional("dropout(Tensor input, float p=0.5, bool training=True, bool inplace=False) -> Tensor", _dropout)
for _n, _fn in ((1, _dropout1d), (2, _dropout2d), (3, _dropout3d)):
    functional(f"dropout{_n}d(Tensor input, float p=0.5, bool training=True, bool inplace=False) -> Tensor", _fn,
               function=False)


# ============================================================================ embedding

def _renorm_rows_(weight, indices, max_norm, norm_type):
    """torch's embedding_renorm_: rows read by indices whose norm exceeds max_norm are scaled down in place."""
    from tilewise._grad_mode import no_grad
    from tilewise.ops.creation import zeros

    with no_grad():
        used = zeros((weight.shape[0],), dtype=weight.dtype, device=weight.device)
        used = used.index_put((indices.reshape(-1),), _ones_like_indices(indices, weight), True) > 0
        norms = weight.norm(norm_type, 1)
        scale = where(used & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
        weight.mul_(scale.unsqueeze(1).to(weight.dtype))


def _ones_like_indices(indices, weight):
    from tilewise.ops.creation import ones

    return ones((indices.numel(),), dtype=weight.dtype, device=weight.device)


def _embedding_padding_index(padding_idx, num_weights: int):
    if padding_idx is None:
        return None
    if not -num_weights <= padding_idx < num_weights:
        raise AssertionError(f"Padding_idx must be within num_embeddings (embedding: a weight of {num_weights} rows "
                             f"got padding_idx={padding_idx}; valid: {-num_weights} to {num_weights - 1})")
    return padding_idx % num_weights


def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    if input.dtype.name not in ("int32", "int64"):
        raise RuntimeError(f"embedding: Expected tensor for argument #1 'indices' to have one of the following "
                           f"scalar types: Long, Int; but got {input.dtype} instead (convert with .long())")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: 'weight' must be 2-D (num_embeddings, embedding_dim), got {list(weight.shape)}")
    if sparse:
        raise NotImplementedError("embedding: sparse=True needs sparse gradients, which tilewise does not have; "
                                  "use sparse=False")
    _embedding_padding_index(padding_idx, weight.shape[0])
    check_index_range(input, weight.shape[0], 0, "embedding")
    if max_norm is not None:
        _renorm_rows_(weight, input, max_norm, norm_type)
    with _index_errors_named("embedding", negative_wraps=False):
        # torch's embedding selects rows by the flattened indices: its result is row-major whatever their order
        return weight[input if input.is_contiguous() else input.contiguous()]


def _embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    from tilewise.ops.creation import zeros

    flat = indices.reshape(-1)
    rows = grad.reshape(flat.shape[0], grad.shape[-1])
    padding_idx = _embedding_padding_index(padding_idx, num_weights)
    if padding_idx is not None:
        rows = where((flat != padding_idx).unsqueeze(1), rows, 0.0)
    if scale_grad_by_freq:
        counts = zeros((num_weights,), dtype=grad.dtype, device=grad.device)
        counts = counts.index_put((flat,), _ones_like_indices(flat, grad), True)
        rows = rows / counts[flat].unsqueeze(1)
    out = zeros((num_weights, grad.shape[-1]), dtype=grad.dtype, device=grad.device)
    return out.index_put((flat,), rows, True)


functional("embedding(Tensor input, Tensor weight, int? padding_idx=None, float? max_norm=None, float norm_type=2.0, "
           "bool scale_grad_by_freq=False, bool sparse=False) -> Tensor", _embedding,
           {"weight": "OPS['_embedding_backward'](grad, input, weight_shape[0], padding_idx, scale_grad_by_freq)",
            "input": None}, function=False, fwd="weight_t[input]", batch=leading_batch_first_only)
private("_embedding_backward(Tensor grad, Tensor indices, int num_weights, int? padding_idx, bool scale_grad_by_freq)"
        " -> Tensor", _embedding_backward)


# ============================================================================ attention

def _check_attention(query, key, value, attn_mask, dropout_p, enable_gqa) -> None:
    op = "scaled_dot_product_attention"
    if min(query.ndim, key.ndim, value.ndim) < 2:
        raise RuntimeError(f"{op}: query, key and value need at least 2 dims (..., L or S, E), got query "
                           f"{list(query.shape)}, key {list(key.shape)}, value {list(value.shape)}")
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"{op}: query and key must have the same head dimension (the last dim), but got query of "
                           f"shape {list(query.shape)} (E={query.shape[-1]}) and key of shape {list(key.shape)} "
                           f"(E={key.shape[-1]})")
    if key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"{op}: key and value must have the same sequence length (dim -2), but got key of shape "
                           f"{list(key.shape)} and value of shape {list(value.shape)}")
    if not (query.dtype is key.dtype is value.dtype):
        raise RuntimeError(f"{op}: Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if attn_mask is not None and attn_mask.dtype.name not in ("bool", "float32", query.dtype.name):
        raise RuntimeError(f"{op}: Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                           f"attn_mask.dtype: {attn_mask.dtype} and query.dtype: {query.dtype} instead.")
    check_dropout_p(dropout_p, op)
    if enable_gqa:
        _check_grouped_heads(query, key, value)


def _check_grouped_heads(query, key, value) -> None:
    """torch's ``enable_gqa``: key and value each have a number of heads (dim -3) that divides the query's (they
    may differ from each other); dim -3 must exist in all three, else torch's dim-out-of-range IndexError."""
    op = "scaled_dot_product_attention"
    for t in (query, key, value):
        S.normalize_dim(-3, t.ndim, op)
    heads = query.shape[-3]
    if key.shape[-3] and value.shape[-3] and not heads % key.shape[-3] and not heads % value.shape[-3]:
        return
    raise RuntimeError(f"{op}: Number of heads in key and value must divide the number of heads in query "
                       f"(enable_gqa=True): got query {list(query.shape)} ({heads} heads), key {list(key.shape)} "
                       f"({key.shape[-3]} heads), value {list(value.shape)} ({value.shape[-3]} heads)")


def _attention_bias(attn_mask, is_causal, target_len, source_len, dtype, device):
    """The additive float mask: 0 where attending is allowed, -inf where not, or the user's float mask."""
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
        from tilewise.ops.creation import arange

        attn_mask = arange(target_len, device=device).unsqueeze(1) >= arange(source_len, device=device).unsqueeze(0)
    if attn_mask is None:
        return None
    if attn_mask.dtype.name == "bool":
        return where(attn_mask, 0.0, float("-inf")).to(dtype)
    if not attn_mask.dtype.is_floating_point:
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask must be a bool or floating point tensor, got "
                           f"{attn_mask.dtype}")
    return attn_mask.to(dtype)


def _masked_causal_bias(attn_mask, target_len, source_len, dtype, device):
    """The additive mask of an attention mask and ``is_causal`` together: the mask's (a bool mask's 0 or -inf, a
    float mask's values) where the causal triangle allows the key, -inf where it does not."""
    from tilewise.ops.creation import arange

    causal = arange(target_len, device=device).unsqueeze(1) >= arange(source_len, device=device).unsqueeze(0)
    return where(causal, _attention_bias(attn_mask, False, target_len, source_len, dtype, device), float("-inf"))


def _repeat_heads(x, groups: int):
    """(..., H, S, E) -> (..., H * groups, S, E), each head repeated ``groups`` times in a row."""
    if groups == 1:
        return x
    lead, heads, tail = x.shape[:-3], x.shape[-3], x.shape[-2:]
    return x.unsqueeze(-3).expand(*lead, heads, groups, *tail).reshape(*lead, heads * groups, *tail)


def _grouped_key_value(query, key, value, enable_gqa: bool):
    """Key and value with their heads repeated up to the query's (``enable_gqa``: query head ``h`` reads key/value
    head ``h // (H_q / H_kv)``, torch's ``repeat_interleave`` order); else as they are."""
    if not enable_gqa:
        return key, value
    heads = query.shape[-3]
    return _repeat_heads(key, heads // key.shape[-3]), _repeat_heads(value, heads // value.shape[-3])


def _sum_heads(grad, heads: int):
    """The gradient of :func:`_repeat_heads` to ``heads`` heads: each group of repeated heads summed."""
    if grad.shape[-3] == heads:
        return grad
    lead, tail = grad.shape[:-3], grad.shape[-2:]
    return grad.reshape(*lead, heads, grad.shape[-3] // heads, *tail).sum(-3, keepdim=True).squeeze(-3)


def _attention_scores(query, key, bias, scale):
    scores = query.matmul(key.transpose(-2, -1)) * scale
    return scores + bias if bias is not None else scores


def _softmax_with_logsumexp(scores):
    """softmax over the last dim and its log-sum-exp; rows masked entirely get probabilities 0 (torch's
    safe softmax) and log-sum-exp +inf, so ``exp(scores - lse)`` recomputes them as 0 too."""
    peak = scores.detach().amax(-1, keepdim=True)
    peak = where(peak == float("-inf"), 0.0, peak)
    e = (scores - peak).exp()
    total = e.sum(-1, keepdim=True)
    empty = total == 0
    return e / where(empty, 1.0, total), where(empty, float("inf"), peak + total.log())


def _causal_bias(target_len, source_len, dtype, device):
    """The additive mask of ``is_causal``: query i sees keys 0..i (torch's top-left aligned lower triangle)."""
    return _attention_bias(None, True, target_len, source_len, dtype, device)


def _scaled_dot_product_attention_math(query, key, value, bias, scale, is_causal=False, enable_gqa=False):
    """Attention without dropout, the part carrying the derivative: ``softmax(q k^T * scale + mask) v`` in the
    compute dtype, the output in the inputs' dtype, and the log-sum-exp of each row (compute dtype) for the
    backward. With ``enable_gqa`` key and value may have fewer heads than the query (grouped-query attention),
    each read by a group of query heads. A backend may run it as one fused kernel (on CUDA: cuDNN's flash
    attention, which takes the key/value heads as they are, see ``backends/cuda/attention.py``); this
    decomposition is its meaning, and repeats the key/value heads."""
    work = compute_dtype(query.dtype)
    key, value = _grouped_key_value(query, key, value, enable_gqa)
    q, k, v = query.to(work), key.to(work), value.to(work)
    if is_causal:
        bias = _causal_bias(q.shape[-2], k.shape[-2], work, query.device)
    probs, logsumexp = _softmax_with_logsumexp(_attention_scores(q, k, bias, scale))
    return probs.matmul(v).to(query.dtype), logsumexp


def _scaled_dot_product_attention_backward(grad, query, key, value, bias, scale, is_causal, out, logsumexp,
                                           enable_gqa=False):
    from tilewise._grad_mode import is_grad_enabled

    work = compute_dtype(query.dtype)
    key_heads, value_heads = (key.shape[-3], value.shape[-3]) if enable_gqa else (None, None)
    key, value = _grouped_key_value(query, key, value, enable_gqa)
    q, k, v = query.to(work), key.to(work), value.to(work)
    grad, out = grad.to(work), out.to(work)
    if is_causal:
        bias = _causal_bias(q.shape[-2], k.shape[-2], work, query.device)
    scores = _attention_scores(q, k, bias, scale)
    if is_grad_enabled():  # differentiated again: the probabilities must depend on query and key
        probs = _softmax_with_logsumexp(scores)[0]
    else:
        probs = (scores - logsumexp).exp()
    grad_value = probs.transpose(-2, -1).matmul(grad)
    grad_scores = probs * (grad.matmul(v.transpose(-2, -1)) - (grad * out).sum(-1, keepdim=True))
    grad_query = grad_scores.matmul(k) * scale
    grad_key = grad_scores.transpose(-2, -1).matmul(q) * scale
    # each repeated head's gradient rounded to the inputs' dtype, then summed per group: what the gradient of a
    # head repeat written before the attention gives
    grad_key, grad_value = grad_key.to(key.dtype), grad_value.to(value.dtype)
    if enable_gqa:
        grad_key, grad_value = _sum_heads(grad_key, key_heads), _sum_heads(grad_value, value_heads)
    return grad_query.to(query.dtype), grad_key, grad_value, grad_scores if bias is not None and not is_causal else None


_NO_VIABLE_BACKEND = ("No viable backend for scaled_dot_product_attention was found. This is likely due to turning "
                      "off both the math kernel and the fused kernels.")


# The attention switches (``sdpa_kernel``, ``enable_*_sdp``) live with the backends that read them
# (``backends/flags.py``), which fill this slot when they load: ``sdp_enabled(kind)`` (see [Note: plug-in points])
ATTENTION_HOOKS = SimpleNamespace(sdp_enabled=None)


def _check_backend_enabled(device) -> None:
    """torch's refusal when the switches leave no kernel that runs on the device: on the CPU its math and flash
    kernels; on CUDA tilewise's cuDNN call or its decomposition, which stands for torch's math, flash and
    memory-efficient kernels."""
    enabled = ATTENTION_HOOKS.sdp_enabled
    if enabled is None:
        return
    kinds = ("math", "flash") if device.type == "cpu" else ("math", "flash", "mem_efficient", "cudnn")
    if not any(enabled(kind) for kind in kinds):
        raise RuntimeError(_NO_VIABLE_BACKEND)


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                  enable_gqa=False):
    _check_attention(query, key, value, attn_mask, dropout_p, enable_gqa)
    _check_backend_enabled(query.device)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    work = compute_dtype(query.dtype)
    layout = _output_layout(query, key, value, attn_mask, dropout_p, enable_gqa)
    if dropout_p > 0:
        key, value = _grouped_key_value(query, key, value, enable_gqa)
        q, k, v = query.to(work), key.to(work), value.to(work)
        bias = _attention_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], work, query.device)
        probs, _ = _softmax_with_logsumexp(_attention_scores(q, k, bias, scale))
        return _laid_out(_dropout(probs, dropout_p, True).matmul(v).to(query.dtype), query, layout)
    if is_causal and attn_mask is not None:
        if not _runs_cpu_flash_kernel(query, key, value, attn_mask, enable_gqa):
            raise RuntimeError("scaled_dot_product_attention: Explicit attn_mask should not be set when "
                               "is_causal=True")
        # torch's CPU flash kernel takes both: a key is seen where the mask and the causal triangle both allow it
        bias = _masked_causal_bias(attn_mask, query.shape[-2], key.shape[-2], work, query.device)
        is_causal = False
    else:
        bias = _attention_bias(attn_mask, False, query.shape[-2], key.shape[-2], work, query.device)
    out = OPS["_scaled_dot_product_attention_math"](query, key, value, bias, scale, is_causal, enable_gqa)[0]
    return _laid_out(out, query, layout)


def _output_layout(query, key, value, attn_mask, dropout_p: float, enable_gqa: bool) -> str | None:
    """[Note: attention's output layout] The memory order torch's kernel writes the output in, which code that
    calls ``.view`` on it depends on: "query" (laid out as the query is: a query of (B, L, H, E) storage,
    transposed to (B, H, L, E), gives an output that ``.transpose(1, 2).view(B, L, H * E)`` accepts; dense in the
    query's order where the query is not dense), "BLHD" ((B, L, H, E) storage whatever the query's), or None
    (contiguous). On the CPU the flash kernel lays it out as the query, the math kernel contiguous. On CUDA,
    cuDNN's and flash attention (torch's choice for float16/bfloat16, masks and dropout included) lay it out as
    the query, the memory-efficient kernel (float32) as BLHD, the math kernel contiguous; a float16/bfloat16 head
    dim that is no multiple of 8 is "padded" without an attention mask (torch pads it to one, and the output is
    the contiguous padded result with the padding sliced off) and contiguous with one."""
    if query.device.type == "cpu":
        return "query" if not dropout_p and _runs_cpu_flash_kernel(query, key, value, attn_mask, enable_gqa) else None
    if query.device.type != "cuda" or not (query.ndim == key.ndim == value.ndim == 4):
        return None
    if any(t.stride(-1) != 1 for t in (query, key, value)) or 0 in query.shape or 0 in key.shape:
        return None
    head_dim, dtype = query.shape[-1], query.dtype.name
    if head_dim != key.shape[-1]:
        return None
    if dtype in ("bfloat16", "float16"):
        if head_dim > 256 or value.shape[-1] != head_dim:
            return None
        if head_dim % 8 == 0:
            return "query"
        return "padded" if attn_mask is None else None
    if dtype == "float32":
        return "BLHD" if head_dim % 4 == 0 and value.shape[-1] % 4 == 0 else None
    return None


def _laid_out(out, query, layout: str | None):
    """``out`` in the memory order ``layout`` names (see [Note: attention's output layout])."""
    if layout == "query":
        return _laid_out_like(out, query)
    if layout == "BLHD":
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "padded":  # run on the head dim padded to a multiple of 8, the padding sliced off after
        size = out.shape[-1]
        return call_public("pad", out, (0, -size % 8)).narrow(-1, 0, size)
    return out.contiguous()


def _runs_cpu_flash_kernel(query, key, value, attn_mask, enable_gqa: bool) -> bool:
    """Whether torch runs its CPU flash kernel rather than its math kernel (dropout, other ranks, differing head
    dims or batch sizes, empty sequences, a last dim of stride other than 1, a 3-D mask or one that requires
    grad, a switched-off flash kernel): torch's conditions (sdp_utils_cpp.cpp, use_flash_attention_cpp), dropout
    checked by the caller."""
    if query.device.type != "cpu" or not (query.ndim == key.ndim == value.ndim == 4):
        return False
    if query.dtype.name not in ("float32", "float64", "bfloat16", "float16"):
        return False
    enabled = ATTENTION_HOOKS.sdp_enabled
    if enabled is not None and not enabled("flash"):
        return False
    (b, h, length, e), (kb, kh, source, ke), (vb, vh, _, ve) = query.shape, key.shape, value.shape
    heads_fit = h == kh == vh or (enable_gqa and kh == vh and kh and not h % kh)
    if not (b == kb == vb and heads_fit and e == ke == ve and length and source):
        return False
    if attn_mask is not None and not _flash_mask_fits(attn_mask, b, h, length, source):
        return False
    return all(t.stride(-1) == 1 for t in (query, key, value))


def _flash_mask_fits(mask, batch: int, heads: int, target: int, source: int) -> bool:
    shape = tuple(mask.shape)
    if mask.requires_grad or len(shape) not in (2, 4) or shape[-2] not in (1, target) or shape[-1] not in (1, source):
        return False
    return len(shape) == 2 or (shape[0] in (1, batch) and shape[1] in (1, heads))


def _laid_out_like(out, query):
    """``out`` (of the query's shape) with its dims in memory in the query's order (see [Note: attention's output
    layout]); a contiguous query costs nothing."""
    order = S.order_by_strides(query.stride())
    if order == list(range(query.ndim)):
        return out
    inverse = [order.index(d) for d in range(query.ndim)]
    return out.permute(order).contiguous().permute(inverse)


private("_scaled_dot_product_attention_math(Tensor query, Tensor key, Tensor value, Tensor? bias, float scale, "
        "bool is_causal=False, bool enable_gqa=False) -> (Tensor output, Tensor logsumexp)",
        _scaled_dot_product_attention_math,
        {"query, key, value, bias": "OPS['_scaled_dot_product_attention_backward'](grad, query, key, value, bias, "
                                    "scale, is_causal, result[0], result[1], enable_gqa)"}, nondiff_outputs=(1,),
        fwd="attention_jvp(query, key, value, bias, query_t, key_t, value_t, bias_t, scale, is_causal, result[1], "
            "enable_gqa)")
private("_scaled_dot_product_attention_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? bias, "
        "float scale, bool is_causal, Tensor out, Tensor logsumexp, bool enable_gqa=False) -> (Tensor, Tensor, "
        "Tensor, Tensor)",
        _scaled_dot_product_attention_backward)
# [Note: attention written in a given order] The CUDA target lets cuDNN write an attention's output, and its
# backward's gradients, in the memory order their readers permute them to (``compiler/lowering/
# attention_layouts.py``), so that MultiheadAttention's (L, N, E) output or a head-split projection's gradient
# needs no transposing copy. These variants carry that: each result is the operator's permuted to its order and
# laid out row-major; anywhere else the variant is the operator and a transposing copy. The ``_packed`` backward
# returns the three gradients joined by one ``cat`` (each reshaped to its piece), which cuDNN writes in place: the
# gradient of a packed (query, key, value) projection.
def _ordered(result, order):
    return result if result is None or list(order) == list(range(result.ndim)) else \
        result.permute(*order).contiguous()


def _attention_ordered(query, key, value, bias, scale, is_causal, enable_gqa, out_order):
    out, logsumexp = OPS["_scaled_dot_product_attention_math"](query, key, value, bias, scale, is_causal, enable_gqa)
    return _ordered(out, out_order), logsumexp


def _attention_backward_ordered(grad, query, key, value, bias, scale, is_causal, out, logsumexp, enable_gqa,
                                query_order, key_order, value_order):
    dq, dk, dv, dbias = OPS["_scaled_dot_product_attention_backward"](grad, query, key, value, bias, scale,
                                                                      is_causal, out, logsumexp, enable_gqa)
    return _ordered(dq, query_order), _ordered(dk, key_order), _ordered(dv, value_order), dbias


def _attention_backward_packed(grad, query, key, value, bias, scale, is_causal, out, logsumexp, enable_gqa,
                               query_order, key_order, value_order, query_piece, key_piece, value_piece, dim):
    grads = _attention_backward_ordered(grad, query, key, value, bias, scale, is_causal, out, logsumexp, enable_gqa,
                                        query_order, key_order, value_order)[:3]
    pieces = (query_piece, key_piece, value_piece)
    return OPS["cat"]([g.reshape(tuple(shape)) for g, shape in zip(grads, pieces)], dim)


private("_scaled_dot_product_attention_math_ordered(Tensor query, Tensor key, Tensor value, Tensor? bias, "
        "float scale, bool is_causal, bool enable_gqa, int[] out_order) -> (Tensor output, Tensor logsumexp)",
        _attention_ordered, differentiable=False)
private("_scaled_dot_product_attention_backward_ordered(Tensor grad, Tensor query, Tensor key, Tensor value, "
        "Tensor? bias, float scale, bool is_causal, Tensor out, Tensor logsumexp, bool enable_gqa, int[] query_order, "
        "int[] key_order, int[] value_order) -> (Tensor, Tensor, Tensor, Tensor)",
        _attention_backward_ordered, differentiable=False)
private("_scaled_dot_product_attention_backward_packed(Tensor grad, Tensor query, Tensor key, Tensor value, "
        "Tensor? bias, float scale, bool is_causal, Tensor out, Tensor logsumexp, bool enable_gqa, int[] query_order, "
        "int[] key_order, int[] value_order, int[] query_piece, int[] key_piece, int[] value_piece, int dim) -> Tensor",
        _attention_backward_packed, differentiable=False)


functional("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
           "float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor",
           _scaled_dot_product_attention, function=False, autocast="lower", batch=attention_rule)


# ---------------------------------------------------------------- one_hot

def _one_hot(self, num_classes=-1):
    from tilewise.ops.creation import arange

    if self.dtype.name != "int64":
        raise RuntimeError(f"one_hot(): expected an int64 (long) index tensor, got {self.dtype}")
    if self.numel() == 0 and num_classes < 0:
        raise RuntimeError("one_hot(): can not infer the number of classes from an empty tensor; pass num_classes")
    if self.numel() and (num_classes < 0 or values_readable(self)):
        low, high = int(self.amin()), int(self.amax())
        if low < 0:
            raise RuntimeError(f"one_hot(): class values must be non-negative, got {low}")
        if num_classes < 0:
            num_classes = high + 1
        elif high >= num_classes:
            raise RuntimeError(f"one_hot(): class values must be smaller than num_classes ({num_classes}), got {high}")
    return (self.unsqueeze(-1) == arange(num_classes, device=self.device)).long().contiguous()  # row-major, as torch's


declare("one_hot(Tensor self, int num_classes=-1) -> Tensor", "composite", decomposition=_one_hot, functional=True,
        function=False,
          method=False, differentiable=False,
          doc="int64 one-hot encoding in a new last dim (``num_classes=-1``: one more than the largest value).",
          out=False)
