"""torch.nn.functional.multi_head_attention_forward: the whole of torch's MultiheadAttention forward as a function
of its weights (in-projection, extra key/value bias rows, zero attention, static keys/values, masks, attention,
out-projection), with torch's shape conventions (sequence first) and checks.

It composes operators (linear, softmax, matmul, scaled_dot_product_attention, dropout) the way torch's Python
does, so it is a function rather than an operator; without ``need_weights`` it runs through
scaled_dot_product_attention, otherwise the weights are computed explicitly and returned.
"""

from __future__ import annotations

import math

from tilewise._warnings import warn_at_caller
from tilewise.ops.nn_functional import call_public


def _check_shapes(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """Whether the inputs are batched (3-D), after torch's checks of their dims."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError(f"For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                                 f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise AssertionError(f"For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but "
                                 f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise AssertionError(f"For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but "
                                 f"found {attn_mask.ndim}-D tensor instead")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                                 f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D but "
                                 f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None:
            if attn_mask.ndim not in (2, 3):
                raise AssertionError(f"For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                                     f"but found {attn_mask.ndim}-D tensor instead")
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.ndim == 3 and tuple(attn_mask.shape) != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got {tuple(attn_mask.shape)}")
        return False
    raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D query "
                         "tensor")


def _additive_mask(mask, name: str, other, other_name: str, dtype):
    """A bool mask as 0 / -inf in ``dtype``; a float mask as it is (torch's _canonical_mask)."""
    if mask is None:
        return None
    if mask.dtype.name != "bool" and not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    if other is not None and mask.dtype is not other.dtype:
        warn_at_caller(f"Support for mismatched {name} and {other_name} is deprecated. Use same type for both "
                       "instead.")
    if mask.dtype.is_floating_point:
        return mask
    from tilewise.ops.creation import zeros

    return zeros(tuple(mask.shape), dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def _pad_last(t):
    """One more column of zeros at the end of the last dim (an extra key nobody is masked from)."""
    from tilewise.ops.creation import zeros
    from tilewise.ops.registry import call

    return call("cat", [t, zeros(tuple(t.shape[:-1]) + (1,), dtype=t.dtype, device=t.device)], -1)


def _project(query, key, value, in_proj_weight, in_proj_bias, separate):
    """The in-projections of query, key and value, as torch's ``_in_projection_packed`` makes them: self-attention
    (query, key and value one tensor) as one linear whose (L, N, 3E) result is split into three contiguous (L, N, E)
    blocks, a shared key and value as one linear of the last 2E rows, anything else as three."""
    if separate is not None:
        for name, w in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), separate):
            if w is None:
                raise AssertionError(f"use_separate_proj_weight is True but {name} is None")
        biases = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
        return tuple(call_public("linear", x, w, b) for x, w, b in zip((query, key, value), separate, biases))
    if in_proj_weight is None:
        raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
    embed = query.shape[-1]
    if key is value and query is key:
        return _split_packed(call_public("linear", query, in_proj_weight, in_proj_bias), 3, embed)
    if key is value:
        w_q, w_kv = in_proj_weight.split([embed, 2 * embed])
        b_q, b_kv = (None, None) if in_proj_bias is None else in_proj_bias.split([embed, 2 * embed])
        k, v = _split_packed(call_public("linear", key, w_kv, b_kv), 2, embed)
        return call_public("linear", query, w_q, b_q), k, v
    weights = in_proj_weight.chunk(3)
    biases = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
    return tuple(call_public("linear", x, w, b) for x, w, b in zip((query, key, value), weights, biases))


def _split_packed(proj, parts: int, embed: int):
    """(..., parts * E) -> ``parts`` (..., E) views. torch copies them into one buffer of (parts, ..., E) first, for
    the reshapes that follow; the attention below takes each as it lies, and the other paths' reshapes copy where
    they must (the same values either way: these tensors are never handed out)."""
    proj = proj.unflatten(-1, (parts, embed))
    return tuple(proj.select(-2, k) for k in range(parts))


def _check_attn_mask(attn_mask, bsz, num_heads, tgt_len, src_len):
    if attn_mask is None:
        return None
    if attn_mask.ndim == 2:
        if tuple(attn_mask.shape) != (tgt_len, src_len):
            raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but should be "
                               f"{(tgt_len, src_len)}.")
        return attn_mask.unsqueeze(0)
    if attn_mask.ndim == 3:
        if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but should be "
                               f"{(bsz * num_heads, tgt_len, src_len)}.")
        return attn_mask
    raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")


def _static(given, projected, bsz, num_heads, head_dim, name):
    if given is None:
        return projected.reshape(projected.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    if given.shape[0] != bsz * num_heads:
        raise AssertionError(f"expecting {name}.size(0) of {bsz * num_heads}, but got {given.shape[0]}")
    if given.shape[2] != head_dim:
        raise AssertionError(f"expecting {name}.size(2) of {head_dim}, but got {given.shape[2]}")
    return given


def multi_head_attention_forward(query, key, value, embed_dim_to_check: int, num_heads: int, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn: bool, dropout_p: float,
                                 out_proj_weight, out_proj_bias, training: bool = True, key_padding_mask=None,
                                 need_weights: bool = True, attn_mask=None, use_separate_proj_weight: bool = False,
                                 q_proj_weight=None, k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights: bool = True, is_causal: bool = False):
    """Multi-head attention of (L, N, E) queries over (S, N, E) keys and values; returns the (L, N, E) output and
    the attention weights (averaged over heads unless ``average_attn_weights=False``) or None."""
    from tilewise.ops.creation import zeros
    from tilewise.ops.registry import call

    batched = _check_shapes(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = _additive_mask(key_padding_mask, "key_padding_mask", attn_mask, "attn_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None
    else:
        attn_mask = _additive_mask(attn_mask, "attn_mask", None, "", query.dtype)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight and tuple(key.shape[:2]) != tuple(value.shape[:2]):
        raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                             f"{tuple(value.shape[:2])}")
    if not use_separate_proj_weight and tuple(key.shape) != tuple(value.shape):
        raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}")
    separate = (q_proj_weight, k_proj_weight, v_proj_weight) if use_separate_proj_weight else None
    q, k, v = _project(query, key, value, in_proj_weight, in_proj_bias, separate)
    attn_mask = _check_attn_mask(attn_mask, bsz, num_heads, tgt_len, src_len)

    if bias_k is not None and bias_v is not None:
        if static_k is not None:
            raise AssertionError("bias cannot be added to static key.")
        if static_v is not None:
            raise AssertionError("bias cannot be added to static value.")
        k = call("cat", [k, bias_k.repeat(1, bsz, 1)])
        v = call("cat", [v, bias_v.repeat(1, bsz, 1)])
        attn_mask = None if attn_mask is None else _pad_last(attn_mask)
        key_padding_mask = None if key_padding_mask is None else _pad_last(key_padding_mask)
    elif bias_k is not None:
        raise AssertionError("bias_k is set but bias_v is None")
    elif bias_v is not None:
        raise AssertionError("bias_v is set but bias_k is None")

    # without static keys/values, extra zero rows or weights, the heads go to the attention as views of the
    # (L, N, E) projections, however those lie; otherwise as torch has them, (N * heads, L, head dim)
    as_views = static_k is None and static_v is None and not add_zero_attn and not need_weights
    if as_views:
        src_len = k.shape[0]
    else:
        q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
        k = _static(static_k, k, bsz, num_heads, head_dim, "static_k")
        v = _static(static_v, v, bsz, num_heads, head_dim, "static_v")
        if add_zero_attn:
            zero = zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype, device=k.device)
            k, v = call("cat", [k, zero], 1), call("cat", [v, zero], 1)
            attn_mask = None if attn_mask is None else _pad_last(attn_mask)
            key_padding_mask = None if key_padding_mask is None else _pad_last(key_padding_mask)
        src_len = k.shape[1]

    if key_padding_mask is not None:
        for dim, size in enumerate((bsz, src_len)):
            if key_padding_mask.shape[dim] != size:
                raise AssertionError(f"Expected key_padded_mask.shape[{dim}] to be {size}, but got "
                                     f"{key_padding_mask.shape[dim]}")
        padding = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(bsz, num_heads, 1, src_len)
        padding = padding.reshape(bsz * num_heads, 1, src_len)
        attn_mask = padding if attn_mask is None else attn_mask + padding
    if not training:
        dropout_p = 0.0

    if need_weights:
        if is_causal and attn_mask is None:
            raise AssertionError("FIXME: is_causal not implemented for need_weights")
        scores = (q * math.sqrt(1.0 / float(q.shape[-1]))).matmul(k.transpose(-2, -1))
        weights = call_public("softmax", scores + attn_mask if attn_mask is not None else scores, -1)
        if dropout_p > 0.0:
            weights = call_public("dropout", weights, dropout_p)
        out = weights.matmul(v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = call_public("linear", out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)
        weights = weights.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(1)
        return (out, weights) if batched else (out.squeeze(1), weights.squeeze(0))

    if attn_mask is not None:
        attn_mask = attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 and attn_mask.ndim == 3 else \
            attn_mask.reshape(bsz, num_heads, -1, src_len)
    if as_views:  # (L, N, E) -> (N, heads, L, head dim)
        q, k, v = (t.unflatten(-1, (num_heads, head_dim)).permute(1, 2, 0, 3) for t in (q, k, v))
    else:
        q = q.reshape(bsz, num_heads, tgt_len, head_dim)
        k = k.reshape(bsz, num_heads, src_len, head_dim)
        v = v.reshape(bsz, num_heads, src_len, head_dim)
    out = call_public("scaled_dot_product_attention", q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = call_public("linear", out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)
    return (out if batched else out.squeeze(1)), None
