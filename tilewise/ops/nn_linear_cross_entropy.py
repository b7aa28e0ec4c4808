"""torch.nn.functional.linear_cross_entropy: cross entropy of a linear projection's logits, ``cross_entropy(
linear(input, linear_weight, linear_bias), target, ...)``, with torch's argument checks. torch's ``options`` pick a
chunked kernel that never holds all logits at once; here they are accepted and the reference composition runs
(the values are the same), so the function is a composition of two operators rather than an operator itself.
"""

from __future__ import annotations

import warnings
from math import prod

from tilewise.ops.nn_functional import call_public


def _check_shapes(input, linear_weight, linear_bias) -> None:
    if input.ndim < 1 or input.ndim > 2:
        raise RuntimeError(f"expected input with dimensionality 1 or 2, got {input.ndim}")
    if linear_weight.ndim < 2:
        raise RuntimeError(f"expected linear_weight with dimensionality at least 2, got {linear_weight.ndim}")
    if input.shape[-1] != linear_weight.shape[-1]:
        raise RuntimeError(f"expected equal input and linear_weight last dimensions (in_features), got "
                           f"{input.shape[-1]} and {linear_weight.shape[-1]}, respectively")
    expected_bias = tuple(linear_weight.shape[:-1])
    if linear_bias is not None and tuple(linear_bias.shape) != expected_bias:
        raise RuntimeError(f"expected linear_bias shape {expected_bias}, got {tuple(linear_bias.shape)}")
    if linear_weight.ndim > 2 and input.ndim == 1:
        raise RuntimeError(f"K-dimensional loss defined by linear_weight shape {tuple(linear_weight.shape)} requires "
                           f"batched input, (N, {input.shape[-1]}), got unbatched input with shape "
                           f"{tuple(input.shape)}")


def _logits(input, linear_weight, linear_bias):
    """(*batch, classes, *out_features): one matmul against the weight flattened to (classes * out, in)."""
    classes, out_features = linear_weight.shape[0], tuple(linear_weight.shape[1:-1])
    flat = linear_weight.reshape(classes * prod(out_features), linear_weight.shape[-1])
    logits = call_public("linear", input, flat).reshape(tuple(input.shape[:-1]) + (classes,) + out_features)
    return logits + linear_bias if linear_bias is not None else logits


def _warn_unused_options(options, out_features, reduction, label_smoothing, target) -> None:
    if options is None:
        return
    if out_features or reduction not in {"mean", "sum", "none"} or label_smoothing != 0.0 or \
            target.dtype.name != "int64":
        warnings.warn("linear_cross_entropy: ``options`` ignored; chunked path needs reduction in "
                      "{'mean','sum','none'}, label_smoothing == 0, target.dtype == int64, out_features == (). Got "
                      f"reduction={reduction!r}, label_smoothing={label_smoothing}, target.dtype={target.dtype}, "
                      f"out_features={tuple(out_features)}.", stacklevel=3)


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction: str = "mean",
                         ignore_index: int | None = None, label_smoothing: float = 0.0, options=None):
    """Cross entropy of ``linear(input, linear_weight, linear_bias)`` (classes at dim 0 of the weight, further
    output dims before in_features for a K-dimensional loss).

    >>> import tilewise as tw
    >>> import tilewise.nn.functional as F
    >>> round(F.linear_cross_entropy(tw.ones(2, 3), tw.zeros(4, 3), tw.tensor([0, 3])).item(), 4)
    1.3863
    """
    _check_shapes(input, linear_weight, linear_bias)
    out_features = tuple(linear_weight.shape[1:-1])
    logits_shape = tuple(input.shape[:-1]) + (linear_weight.shape[0],) + out_features
    if tuple(target.shape) == logits_shape and ignore_index is not None:
        raise RuntimeError("ignore_index cannot be specified when target contains probabilities")
    _warn_unused_options(options, out_features, reduction, label_smoothing, target)
    logits = _logits(input, linear_weight, linear_bias)
    return call_public("cross_entropy", logits, target, weight, None, -100 if ignore_index is None else ignore_index,
                       None, reduction, label_smoothing)
