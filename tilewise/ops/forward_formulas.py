"""Tangent (forward-mode) rules that declarations name in ``fwd=``, besides the public operators themselves.

[Note: written tangent rules] Each rule is torch's ``result:`` line of derivatives.yaml where it has one, written
in tilewise operators (so a tangent is itself differentiable and traceable), and costs about one forward:
  - operators that pick input elements (sort, topk, cummax, max.dim, kthvalue, max pooling with indices) gather
    the tangent at the returned indices;
  - reductions whose outputs each read their own slice (amax, prod, logsumexp, norm) sum the tangent against the
    elementwise partial derivative of the output, the backward formula evaluated at a cotangent of ones;
  - losses sum the per-element partials against the tangents and then reduce as the loss does;
  - normalizations, attention and the recurrent cells differentiate their closed forms, reusing the saved
    statistics, log-sum-exp and gates where torch's rules do.
A rule reads ``<name>_t``, the tangent of each tensor argument (zeros where it has none).
"""

from __future__ import annotations

import math

from tilewise import strides as S
from tilewise.dtypes import int64
from tilewise.ops.creation import ones_like, zeros_like
from tilewise.ops.formulas import HELPERS, conj_if_complex, minmax_backward, norm_backward, prod_backward
from tilewise.ops.registry import OPS


def _reduced_dims(dim, ndim: int) -> tuple[int, ...]:
    return S.normalize_dims(dim if dim not in ((), []) else None, ndim)


def reduction_jvp(partial, self_t, dim, keepdim):
    """The tangent of a reduction whose every output reads only its own slice: ``sum(conj(d out / d x) * x_t)``
    over the reduced dims (the real part, for a real output of a complex input, is taken when it is attached)."""
    terms = conj_if_complex(partial) * self_t
    if terms.ndim == 0:
        return terms
    return terms.sum(_reduced_dims(dim, terms.ndim), keepdim=keepdim)


def amaxamin_jvp(self, self_t, result, dim, keepdim):
    """torch's: the mean of the tangents at the elements that attain the extremum."""
    return reduction_jvp(minmax_backward(ones_like(result), self, result, dim, keepdim), self_t, dim, keepdim)


def prod_jvp(self, self_t, result, dim, keepdim):
    """``sum_i x_t[i] * prod_{j != i} x[j]``, the products formed without division (zeros are exact)."""
    partial = prod_backward(ones_like(result), self.to(result.dtype), result, dim, keepdim)
    return reduction_jvp(partial, self_t.to(result.dtype), dim, keepdim)


def logsumexp_jvp(self, self_t, result, dim, keepdim):
    from tilewise.ops.formulas import grad_expanded

    return reduction_jvp((self - grad_expanded(result, self.shape, dim, keepdim)).exp(), self_t, dim, keepdim)


def norm_jvp(self, self_t, result, p, dim, keepdim):
    """torch's norm_jvp for every p: the tangent against ``d ||x|| / dx`` (zero where the norm is zero)."""
    if p == 0:
        return zeros_like(result)
    if p == "nuc" and dim is None:
        dim = (-2, -1)
    partial = norm_backward(ones_like(result), self, result, p, dim, keepdim)
    return reduction_jvp(partial, self_t, dim, keepdim)


def nansum_jvp(self, self_t, dim, keepdim):
    t = self_t.masked_fill(self.isnan(), 0)
    return t if t.ndim == 0 else t.sum(_reduced_dims(dim, t.ndim), keepdim=keepdim)


def cumprod_jvp(self, self_t, result, dim):
    """torch's cumprod_jvp: ``result * cumsum(x_t / x)`` before a slice's first zero; from it on, the cumprod of
    the input with the tangent in the zero's place (every later product holds the zero)."""
    x, t = self.to(result.dtype), self_t.to(result.dtype)
    if x.ndim == 0:
        return t
    gradient = (t / x).cumsum(dim) * result
    zeros = x == 0
    first_zero = zeros & (zeros.to(int64).cumsum(dim) == 1)
    after_zero = first_zero.to(int64).cumsum(dim) > 0
    replaced = t.where(first_zero, x).cumprod(dim)
    return replaced.where(after_zero, gradient)


def picked_jvp(self_t, dim, indices):
    """sort, topk, cummax, cummin: the tangent at the positions ``indices`` names along ``dim``."""
    return self_t if self_t.ndim == 0 else self_t.gather(dim, indices)


def selected_jvp(self_t, dim, indices, keepdim):
    """max.dim, min.dim, median.dim, kthvalue, mode: the tangent at the one index each slice returns."""
    if self_t.ndim == 0:
        return self_t
    d = S.normalize_dim(dim, self_t.ndim)
    if keepdim:
        return self_t.gather(d, indices)
    return self_t.gather(d, indices.unsqueeze(d)).squeeze(d)


def max_pool_jvp(input_t, indices, spatial: int):
    """Max pooling with indices: the tangent at each window's returned index (flattened over the spatial dims)."""
    plane = (*input_t.shape[:-spatial], math.prod(input_t.shape[-spatial:]))
    flat_indices = indices.reshape(*indices.shape[:-spatial], math.prod(indices.shape[-spatial:]))
    return input_t.reshape(plane).gather(-1, flat_indices).reshape(indices.shape)


def scatter_reduce_jvp(self_t, src_t, dim, index, self, src, reduce, include_self, result):
    """Each output element reads ``self`` at its position and the sources scattered to it: the tangent is the
    self tangent and the scattered source tangents, each times the partial derivative the backward gives at a
    cotangent of ones (so sum, mean, prod, amax and amin, ties shared, take one rule)."""
    from tilewise.ops.indexed import scatter_reduce_backward

    partial_self, partial_src = scatter_reduce_backward(ones_like(result), self, dim, index, src, reduce,
                                                        include_self, result)
    return (partial_self * self_t).scatter_add(dim, index, partial_src * src_t)


def loss_jvp(terms, reduction: str):
    """A loss's tangent from its per-element tangent terms, whose partials already carry the mean's 1 / n."""
    return terms if reduction == "none" else terms.sum()


def bce_with_logits_jvp(input_t, target_t, weight_t, pos_weight_t, input, target, weight, pos_weight, result,
                        reduction):
    partials = OPS["_binary_cross_entropy_with_logits_backward"](ones_like(result), input, target, weight,
                                                                 pos_weight, reduction)
    terms = None
    for partial, t in zip(partials, (input_t, target_t, weight_t, pos_weight_t)):
        if partial is not None and t is not None:
            terms = partial * t if terms is None else terms + partial * t
    return loss_jvp(terms, reduction)


def cross_entropy_jvp(input_t, target, target_t, weight, reduction, ignore_index, label_smoothing, loss, logp):
    """(the loss's tangent, the log-probabilities' tangent): the loss is linear in the log-probabilities and in
    a probability target, so its tangent is the input's (and target's) partials against their tangents, summed
    over the classes."""
    logp_t = input_t - (logp.exp() * input_t).sum(1, keepdim=True)
    ones = ones_like(loss)
    terms = OPS["_cross_entropy_backward"](ones, logp, target, weight, reduction, ignore_index,
                                           label_smoothing) * input_t
    if target.dtype.is_floating_point:
        terms = terms + OPS["_cross_entropy_target_backward"](ones, logp, target, weight, reduction,
                                                              label_smoothing) * target_t
    return loss_jvp(terms.sum(1), reduction), logp_t


def normalization_jvp(x, x_t, mean, rstd, dims, weight, weight_t, bias_t, dtype):
    """Layer, RMS and batch norm while normalizing with their own statistics: with xhat = (x - mean) * rstd
    (x * rstd without a mean), xhat_t = rstd * (c_t - xhat * mean(xhat * c_t)) where c_t is the tangent centered
    like x; then the affine map's tangent."""
    x_t = x_t.to(x.dtype)
    xhat = (x - mean) * rstd if mean is not None else x * rstd
    centered_t = x_t - x_t.mean(dims, keepdim=True) if mean is not None else x_t
    xhat_t = rstd * (centered_t - xhat * (xhat * centered_t).mean(dims, keepdim=True))
    return affine_jvp(xhat, xhat_t, weight, weight_t, bias_t).to(dtype)


def affine_jvp(xhat, xhat_t, weight, weight_t, bias_t):
    out = xhat_t * weight if weight is not None else xhat_t
    if weight is not None:
        out = out + xhat * weight_t
    return out + bias_t if bias_t is not None else out


def layer_norm_jvp(input, input_t, normalized_shape, weight, weight_t, bias_t, mean, rstd):
    from tilewise.ops.nn_functional import _trailing_dims, in_compute_dtype

    dims = _trailing_dims(input, len(normalized_shape))
    return normalization_jvp(in_compute_dtype(input), input_t, mean, rstd, dims, weight, weight_t, bias_t,
                             input.dtype)


def batch_norm_jvp(input, input_t, weight, weight_t, bias_t, running_mean, running_var, training, eps, mean, invstd):
    from tilewise.ops.nn_functional import _channel_shape, _non_channel_dims, in_compute_dtype

    x = in_compute_dtype(input)
    shape = _channel_shape(input)
    w = weight.reshape(shape) if weight is not None else None
    w_t = weight_t.reshape(shape) if weight is not None else None
    b_t = bias_t.reshape(shape) if bias_t is not None else None
    if training:
        return normalization_jvp(x, input_t, mean, invstd, _non_channel_dims(input), w, w_t, b_t, input.dtype)
    mean = running_mean.to(x.dtype).reshape(shape)
    invstd = (running_var.to(x.dtype).reshape(shape) + eps).rsqrt()
    return affine_jvp((x - mean) * invstd, input_t.to(x.dtype) * invstd, w, w_t, b_t).to(input.dtype)


def attention_jvp(query, key, value, bias, query_t, key_t, value_t, bias_t, scale, is_causal, lse, enable_gqa=False):
    """softmax(S) v with S = q k^T * scale + bias: P_t = P * (S_t - sum(P * S_t)), out_t = P_t v + P v_t; the
    probabilities recomputed from the saved log-sum-exp, as the backward does. With ``enable_gqa`` the key/value
    heads (and their tangents) are repeated up to the query's first."""
    from tilewise.dtypes import compute_dtype
    from tilewise.ops.nn_functional import _attention_scores, _causal_bias, _grouped_key_value

    work = compute_dtype(query.dtype)
    key, value = _grouped_key_value(query, key, value, enable_gqa)
    key_t, value_t = _grouped_key_value(query, key_t, value_t, enable_gqa)
    q, k, v = query.to(work), key.to(work), value.to(work)
    q_t, k_t, v_t = query_t.to(work), key_t.to(work), value_t.to(work)
    if is_causal:
        bias, bias_t = _causal_bias(q.shape[-2], k.shape[-2], work, query.device), None
    probs = (_attention_scores(q, k, bias, scale) - lse).exp()
    scores_t = (q_t.matmul(k.mT) + q.matmul(k_t.mT)) * scale
    if bias_t is not None:
        scores_t = scores_t + bias_t.to(work)
    scores_t = scores_t.masked_fill(probs == 0, 0.0)  # masked scores: -inf, whose tangent does not exist
    probs_t = probs * (scores_t - (probs * scores_t).sum(-1, keepdim=True))
    return (probs_t.matmul(v) + probs.matmul(v_t)).to(query.dtype), None


def _gates(t, k: int, chunks: int):
    size = t.shape[1] // chunks
    return t.narrow(1, k * size, size)


def lstm_cell_jvp(input_gates, hidden_gates, cx, input_gates_t, hidden_gates_t, cx_t):
    """(hy_t, cy_t) of cy = f c + i g, hy = o tanh(cy), the gates the sigmoid (i, f, o) and tanh (g) of
    input_gates + hidden_gates."""
    a = [_gates(input_gates, k, 4) + _gates(hidden_gates, k, 4) for k in range(4)]
    a_t = [_gates(input_gates_t, k, 4) + _gates(hidden_gates_t, k, 4) for k in range(4)]
    i, f, g, o = a[0].sigmoid(), a[1].sigmoid(), a[2].tanh(), a[3].sigmoid()
    i_t, f_t, o_t = (s * (1 - s) * t for s, t in ((i, a_t[0]), (f, a_t[1]), (o, a_t[3])))
    g_t = (1 - g * g) * a_t[2]
    cy = f * cx + i * g
    cy_t = f_t * cx + f * cx_t + i_t * g + i * g_t
    tanh_cy = cy.tanh()
    hy_t = o_t * tanh_cy + o * (1 - tanh_cy * tanh_cy) * cy_t
    return hy_t.to(input_gates.dtype), cy_t.to(cx.dtype)


def gru_cell_jvp(input_gates, hidden_gates, hx, input_gates_t, hidden_gates_t, hx_t):
    """h' = n + z (h - n) with r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z) and n = tanh(i_n + r h_n)."""
    i_r, i_z, i_n = (_gates(input_gates, k, 3) for k in range(3))
    h_r, h_z, h_n = (_gates(hidden_gates, k, 3) for k in range(3))
    it_r, it_z, it_n = (_gates(input_gates_t, k, 3) for k in range(3))
    ht_r, ht_z, ht_n = (_gates(hidden_gates_t, k, 3) for k in range(3))
    r, z = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    r_t, z_t = r * (1 - r) * (it_r + ht_r), z * (1 - z) * (it_z + ht_z)
    n_t = (1 - n * n) * (it_n + r_t * h_n + r * ht_n)
    return (n_t + z_t * (hx - n) + z * (hx_t - n_t)).to(hx.dtype)


def lstm_layer_jvp(input_gates, h0, c0, w_hh, input_gates_t, h0_t, c0_t, w_hh_t, result):
    """The layer's time loop run on tangents: each step's hidden projection ``h W^T`` and cell, differentiated
    at the saved cell states and hidden projections."""
    output, cells, projections = result[0], result[3], result[4]
    h_t, c_t = h0_t, c0_t
    outputs_t, cells_t, projections_t = [], [], []
    for step in range(input_gates.shape[0]):
        h_prev = h0 if step == 0 else output[step - 1]
        c_prev = c0 if step == 0 else cells[step - 1]
        projection_t = h_t.mm(w_hh.t()) + h_prev.mm(w_hh_t.t())
        h_t, c_t = lstm_cell_jvp(input_gates[step], projections[step], c_prev, input_gates_t[step], projection_t,
                                 c_t)
        outputs_t.append(h_t)
        cells_t.append(c_t)
        projections_t.append(projection_t)
    stack = OPS["stack"]
    return stack(outputs_t, 0), h_t, c_t, stack(cells_t, 0), stack(projections_t, 0)


def cross_map_lrn2d_jvp(input, input_t, result, size, alpha, beta, k):
    """The adjoint of the declared backward, torch's legacy CrossMapLRN2d one, which is not the derivative of its
    forward (see ``_cross_map_lrn2d_backward``): ``scale^-beta t - c (out / scale) W(x t)``, W its window
    reversed."""
    from tilewise.ops.nn_activations import _channel_window_sum, _cross_map_scale

    scale = _cross_map_scale(input, size, alpha, k)
    first = int(size - (size - 1) / 2)
    window = _channel_window_sum(input * input_t, first + 1 - size, first)
    return scale ** -beta * input_t - (2 * alpha * beta / size) * result / scale * window


HELPERS.update({name: obj for name, obj in globals().items() if name.endswith("_jvp") and callable(obj)})
