"""torch.nn.functional's remaining activations and small layers: shrinkage and gating activations, prelu,
randomized leaky ReLU, alpha dropout, Gumbel-softmax, bilinear, local response normalization and channel
shuffle.

The shrinkage activations are pointwise primitives (one expression, fused like any other pointwise chain);
the rest are composites of primitives. The random ones (rrelu while training, alpha dropout, Gumbel-softmax)
draw from tilewise's Philox generator, so their values differ from torch's for the same seed while their
distributions and their deterministic paths (evaluation mode, p = 0) are torch's.
"""

from __future__ import annotations

import math
import warnings

from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.dtypes import c10_name, finfo, float32
from tilewise.layouts import in_format_of
from tilewise.ops import dtype_rules as R
from tilewise.ops.expr import where as expr_where
from tilewise.ops.nn_functional import call_public, check_dropout_p, functional, private, where
from tilewise.ops.pointwise import pointwise

# ---------------------------------------------------------------------------- shrinkage

def _check_lambda(lambd, dtype) -> None:
    """torch's range for softshrink's lambda: [0, the largest finite value of the input's dtype]."""
    top = float(finfo(dtype).max) if dtype.is_floating_point else float(finfo(float32).max)
    if not 0 <= lambd <= top:  # NaN is refused too, as torch's check refuses it
        raise RuntimeError(f"lambda must be in range [0, {top:g}] for input dtype {c10_name(dtype)}, but found "
                           f"{lambd:g}")


def _softshrink_expr(x, lambd):
    # torch's vectorised loop: NaN stays NaN, everything in [-lambd, lambd] becomes +0 (its scalar tail, x * 0,
    # keeps the sign of a zero input)
    return expr_where(x.gt(lambd), x - lambd, expr_where(x.lt(-lambd), x + lambd, expr_where(x.isnan(), x, 0)))


# torch's vectorised backward (what all but the shortest tensors take) passes no gradient to NaN
_OUTSIDE = "where((self < -lambd) | (self > lambd), grad, zeros_like(grad))"
pointwise("hardshrink(Tensor self, Scalar lambd=0.5) -> Tensor",
          lambda x, lambd: expr_where(x.ge(-lambd).logical_and(x.le(lambd)), 0, x), {"self": _OUTSIDE},
          R.floating_only, inplace=False, functional=True, check=R.half_scalars_fit,
          half_rounded={"cpu": ("self", "lambd"), "cuda": ("self", "lambd")})
pointwise("_softshrink(Tensor self, Scalar lambd) -> Tensor", _softshrink_expr, {"self": _OUTSIDE},
          R.floating_only, public=False, method=False, half_rounded={"cuda": ("self", "lambd")})


def _softshrink(input, lambd=0.5):
    _check_lambda(lambd, input.dtype)
    from tilewise.ops.registry import OPS

    return OPS["_softshrink"](input, lambd)


functional("softshrink(Tensor input, Scalar lambd=0.5) -> Tensor", _softshrink, function=False, out=True)
# torch's own definition (a Python function): its backward keeps tanh's output, not the input
functional("tanhshrink(Tensor input) -> Tensor", lambda input: input - input.tanh(), function=False)


# ---------------------------------------------------------------------------- gating, softmin, prelu

def _integers_refused(kernel: str, input) -> None:
    """torch has floating kernels only for these: integers and bools are NotImplementedError, its kernel named."""
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        device = "cuda" if input.device.type == "cuda" else "cpu"
        raise NotImplementedError(f'"{kernel}_{device}" not implemented for \'{c10_name(input.dtype)}\' (got a '
                                  f"{input.dtype.name} input)")


def _glu(input, dim=-1):
    _integers_refused("glu", input)
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    d = S.normalize_dim(dim, input.ndim, "glu")
    if input.shape[d] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {input.shape[d]}")
    first, second = input.chunk(2, d)
    return first * second.sigmoid()


def implicit_softmax_dim(op: str, ndim: int, stacklevel: int = 5) -> int:
    """torch's choice of dim for softmax called without one (with its deprecation warning, at the user's line)."""
    warn_at_caller(f"Implicit dimension choice for {op} has been deprecated. Change the call to include dim=X as an "
                   "argument.")
    return 0 if ndim in (0, 1, 3) else 1


def _softmin(input, dim=None, _stacklevel=3, dtype=None):
    dim = implicit_softmax_dim("softmin", input.ndim) if dim is None else dim
    if input.ndim == 0:  # softmax reduces a 0-d tensor over dim 0 as over one element
        S.normalize_dim(dim, 1, "softmin")
        return call_public("softmax", -input.reshape(1), 0, dtype).reshape(())
    return call_public("softmax", -input, dim, dtype)


def _prelu(input, weight):
    _integers_refused("prelu", input)
    if weight.ndim > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() != 1 and weight.numel() != channels:
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                           f"{weight.numel()} and channel size = {channels}.")
    if input.ndim == 0 and weight.numel() != 1:
        raise RuntimeError("Not allow zero-dim input tensor.")
    if input.ndim >= 2:
        weight = weight.reshape((1, -1) + (1,) * (input.ndim - 2))
    elif weight.ndim:
        weight = weight.reshape(())
    return where(input > 0, input, weight * input)


functional("glu(Tensor input, int dim=-1) -> Tensor", _glu, function=False)
functional("softmin(Tensor input, int? dim=None, int _stacklevel=3, ScalarType? dtype=None) -> Tensor", _softmin,
           function=False, autocast={"cuda": "fp32"})
functional("prelu(Tensor input, Tensor weight) -> Tensor", _prelu, method=True, autocast="lower")


# ---------------------------------------------------------------------------- randomized leaky ReLU

def _rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    if lower > upper:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    if not training:
        out = call_public("leaky_relu", input, (lower + upper) / 2)
    else:
        from tilewise.ops.creation import rand

        slope = rand(tuple(input.shape), dtype=input.dtype, device=input.device) * (upper - lower) + lower
        out = where(input <= 0, input * slope, input)
    return input.copy_(out) if inplace else out.contiguous()  # row-major, as torch's


functional("rrelu(Tensor input, float lower=0.125, float upper=0.3333333333333333, bool training=False, "
           "bool inplace=False) -> Tensor", _rrelu, function=False)


# ---------------------------------------------------------------------------- alpha dropout

_SELU_ALPHA = 1.7580993408473766  # -scale * alpha of SELU: the value SELU tends to at -inf


def _alpha_dropout_with_mask(input, p, inplace, mask_shape):
    """torch's alpha dropout: dropped elements take SELU's saturation value, then an affine map ``a * x + b``
    restores zero mean and unit variance."""
    from tilewise.ops.creation import full

    if p == 1.0:
        zero = full((), 0.0, dtype=input.dtype, device=input.device)
        return input.mul_(zero) if inplace else input * zero
    keep = full(mask_shape, 1.0 - p, dtype=input.dtype, device=input.device).bernoulli()
    a = 1.0 / math.sqrt((_SELU_ALPHA * _SELU_ALPHA * p + 1) * (1 - p))
    shift = (keep - 1) * (_SELU_ALPHA * a) + _SELU_ALPHA * a * p
    scale = keep * a
    return input.mul_(scale).add_(shift) if inplace else input * scale + shift


def _alpha_dropout(input, p=0.5, training=False, inplace=False):
    check_dropout_p(p, "alpha_dropout")
    if p == 0 or not training or input.numel() == 0:
        return input
    return _alpha_dropout_with_mask(input, p, inplace, tuple(input.shape))


def _feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    check_dropout_p(p, "feature_alpha_dropout")
    if p == 0 or not training or input.numel() == 0:
        return input
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return _alpha_dropout_with_mask(input, p, inplace, tuple(input.shape[:2]) + (1,) * (input.ndim - 2))


functional("alpha_dropout(Tensor input, float p=0.5, bool training=False, bool inplace=False) -> Tensor",
           _alpha_dropout, function=False)
functional("feature_alpha_dropout(Tensor input, float p=0.5, bool training=False, bool inplace=False) -> Tensor",
           _feature_alpha_dropout, function=False)


# ---------------------------------------------------------------------------- Gumbel-softmax

def _gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    """softmax((logits + g) / tau) with g ~ Gumbel(0, 1); ``hard`` returns the one-hot of its argmax, with the
    soft sample's gradient (the straight-through estimator)."""
    from tilewise.ops.creation import rand, zeros

    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=4)
    if not logits.dtype.is_floating_point:
        raise RuntimeError(f"Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {logits.dtype}")
    uniform = rand(tuple(logits.shape), dtype=logits.dtype, device=logits.device)
    gumbels = -(-uniform.log()).log()  # -log(Exponential(1)); u = 0 gives -inf, a class never drawn
    soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return soft
    index = soft.argmax(dim, keepdim=True)
    one_hot = zeros(tuple(logits.shape), dtype=logits.dtype, device=logits.device).scatter(dim, index, 1.0)
    return one_hot - soft.detach() + soft


functional("gumbel_softmax(Tensor logits, float tau=1.0, bool hard=False, float eps=1e-10, int dim=-1) -> Tensor",
           _gumbel_softmax, function=False)


# ---------------------------------------------------------------------------- bilinear

def _check_bilinear(input1, input2, weight, bias) -> None:
    if not (input1.dtype is input2.dtype is weight.dtype) or (bias is not None and bias.dtype is not weight.dtype):
        names = [f"{n}: {t.dtype}" for n, t in (("input1", input1), ("input2", input2), ("weight", weight),
                                                 ("bias", bias)) if t is not None]
        raise RuntimeError(f"All tensors must have the same dtype, got {', '.join(names)}")
    if input1.ndim != input2.ndim:
        raise RuntimeError(f"bilinear(): input dimensions do not match: got {input1.ndim} and {input2.ndim}")
    for d in range(input1.ndim - 1):
        if input1.shape[d] != input2.shape[d]:
            raise RuntimeError(f"bilinear(): input batch dimensions do not match at dim {d}: got "
                               f"{input1.shape[d]} and {input2.shape[d]}")
    # torch reads the weight's (out_features, in1_features, in2_features) by position, so a weight of another
    # rank fails where its first missing size is read, or past the checks (its words in each case)
    if input1.shape[-1] != _size(weight, 1):
        raise RuntimeError(f"bilinear(): input1 size does not match weight size: got {input1.shape[-1]} but "
                           f"expected {weight.shape[1]}")
    if input2.shape[-1] != _size(weight, 2):
        raise RuntimeError(f"bilinear(): input2 size does not match weight size: got {input2.shape[-1]} but "
                           f"expected {weight.shape[2]}")
    if bias is not None and _size(bias, 0) != weight.shape[0]:
        raise RuntimeError(f"bilinear(): bias size does not match weight size: got {bias.shape[0]} but expected "
                           f"{weight.shape[0]}")
    if weight.ndim != 3:
        raise RuntimeError("number of dimensions must match")


def _size(t, dim: int) -> int:
    """``t.size(dim)`` with torch's refusal of a dim ``t`` lacks."""
    if t.ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return t.shape[S.normalize_dim(dim, t.ndim)]


def _bilinear(input1, input2, weight, bias=None):
    """``y[..., o] = input1[...] @ weight[o] @ input2[...] + bias[o]``: one matmul against weight laid out as
    (in1, out * in2), then a product with input2 summed over in2."""
    _check_bilinear(input1, input2, weight, bias)
    out_features, in1, in2 = weight.shape
    left = input1.matmul(weight.permute(1, 0, 2).reshape(in1, out_features * in2))
    out = (left.unflatten(-1, (out_features, in2)) * input2.unsqueeze(-2)).sum(-1)
    return out + bias if bias is not None else out


functional("bilinear(Tensor input1, Tensor input2, Tensor weight, Tensor? bias=None) -> Tensor", _bilinear,
           autocast={"cuda": "promote"})


# ---------------------------------------------------------------------------- local response normalization

def _channel_window_sum(t, low: int, high: int):
    """Sum over channels c + low .. c + high (dim 1) at each channel c, zero beyond the ends."""
    from tilewise.ops.creation import zeros
    from tilewise.ops.registry import call

    shape = list(t.shape)
    channels = shape[1]
    before, after = max(0, -low), max(0, high)
    pad_before = zeros(tuple([shape[0], before] + shape[2:]), dtype=t.dtype, device=t.device)
    pad_after = zeros(tuple([shape[0], after] + shape[2:]), dtype=t.dtype, device=t.device)
    padded = call("cat", [pad_before, t, pad_after], 1)
    total = padded.narrow(1, before + low, channels)
    for offset in range(low + 1, high + 1):
        total = total + padded.narrow(1, before + offset, channels)
    return total


def _local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    if input.numel() == 0:
        return input
    window = _channel_window_sum(input * input, -(size // 2), (size - 1) // 2)
    return input / (window / size * alpha + k) ** beta


def _cross_map_scale(input, size, alpha, k):
    """torch's legacy CrossMapLRN2d denominator (before the power), quirk included: its running window adds the
    channel entering and removes the one leaving only from channel ``pre_pad + 1`` on, so channel 0 stays in
    every window."""
    from tilewise.dtypes import int64
    from tilewise.tensor import tensor

    channels = input.shape[1]
    pre_pad = int((size - 1) / 2 + 1)
    prefix = (input * input).cumsum(1)
    upper = tensor([min(c + pre_pad - 1, channels - 1) for c in range(channels)], dtype=int64, device=input.device)
    lower = tensor([max(c - pre_pad, 0) for c in range(channels)], dtype=int64, device=input.device)
    squares = prefix.index_select(1, upper) - (prefix.index_select(1, lower) - prefix.narrow(1, 0, 1))
    return squares * (alpha / size) + k


def _cross_map_lrn2d(input, size, alpha=1e-4, beta=0.75, k=1.0):
    if input.ndim != 4:
        raise ValueError(f"CrossMapLRN2d: Expected input to be 4D, got {input.ndim}D instead.")
    return input * _cross_map_scale(input, size, alpha, k) ** -beta


def _cross_map_lrn2d_backward(grad, input, output, size, alpha, beta, k):
    """torch's legacy backward, which is not the derivative of its forward: it sums ``grad * output / scale``
    over a window of its own (channels c - (size - (size - 1) / 2) onwards, size of them)."""
    scale = _cross_map_scale(input, size, alpha, k)
    first = int(size - (size - 1) / 2)
    ratio = _channel_window_sum(grad * output / scale, -first, size - 1 - first)
    return scale ** -beta * grad - (2 * alpha * beta / size) * input * ratio


def _local_response_norm_autocast_on_cpu(op, args) -> str | None:
    """torch's local_response_norm averages over channels with avg_pool3d (on its CPU autocast list) for inputs of
    4 or more dims, with avg_pool2d (not on it) for 3-d ones."""
    return "fp32" if args[0].ndim >= 4 else None


functional("local_response_norm(Tensor input, int size, float alpha=0.0001, float beta=0.75, float k=1.0) -> Tensor",
           _local_response_norm, function=False, autocast={"cuda": "fp32", "cpu": _local_response_norm_autocast_on_cpu})
private("_cross_map_lrn2d(Tensor input, int size, float alpha=0.0001, float beta=0.75, float k=1.0) -> Tensor",
        _cross_map_lrn2d, {"input": "OPS['_cross_map_lrn2d_backward'](grad, input, result, size, alpha, beta, k)"},
        autocast={"cuda": "fp32"},
        fwd="cross_map_lrn2d_jvp(input, input_t, result, size, alpha, beta, k)")
private("_cross_map_lrn2d_backward(Tensor grad, Tensor input, Tensor output, int size, float alpha, float beta, "
        "float k) -> Tensor", _cross_map_lrn2d_backward)


# ---------------------------------------------------------------------------- channel shuffle

def _channel_shuffle(input, groups):
    if input.ndim <= 2:
        raise RuntimeError(f"channel_shuffle expects input with > 2 dims, but got input with sizes "
                           f"{list(input.shape)}")
    if groups <= 0:
        raise RuntimeError(f"Number of groups to divide channels in must be positive. Value of groups:{groups}")
    channels = input.shape[1]
    if channels % groups:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {channels} channels and {groups} "
                           "groups.")
    batch, rest = input.shape[0], tuple(input.shape[2:])
    grouped = input.reshape((batch, groups, channels // groups) + rest)
    return in_format_of(grouped.transpose(1, 2).reshape(tuple(input.shape)), input)


functional("channel_shuffle(Tensor input, int groups) -> Tensor", _channel_shuffle)
functional("native_channel_shuffle(Tensor input, int groups) -> Tensor", _channel_shuffle)
