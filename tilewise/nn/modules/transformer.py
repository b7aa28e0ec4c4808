"""Attention and the Transformer: MultiheadAttention, TransformerEncoderLayer/Encoder,
TransformerDecoderLayer/Decoder and Transformer.

Parameter names, shapes, initialisation and mask conventions are torch's, so a state dict moves between
the two frameworks unchanged. Boolean masks mean "True = may not attend"; float masks are added to the
attention scores. When the caller does not ask for the attention weights the product runs through
``F.scaled_dot_product_attention`` (the fused kernel on devices that have one); otherwise the weights are
computed explicitly and returned.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable

from tilewise.amp.autocast_mode import is_autocast_enabled
from tilewise.backends import mha as _mha_backend
from tilewise.dispatch import STATE
from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn import init
from tilewise.nn.modules.activation import GELU, ReLU
from tilewise.nn.modules.container import ModuleList
from tilewise.nn.modules.dropout import Dropout
from tilewise.nn.modules.linear import Linear, NonDynamicallyQuantizableLinear
from tilewise.nn.modules.module import Module
from tilewise.nn.modules.normalization import LayerNorm
from tilewise.nn.parameter import Parameter
from tilewise.ops.creation import arange, empty, zeros
from tilewise.tensor import Tensor


def _additive(mask: Tensor | None, dtype) -> Tensor | None:
    """A boolean "may not attend" mask as 0 / -inf; float masks pass through."""
    if mask is None or mask.dtype.is_floating_point:
        return mask
    return zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def causal_mask(size: int, device=None, dtype=None) -> Tensor:
    """The float mask that stops position i attending to j > i: 0 on and below the diagonal, -inf above.

    >>> causal_mask(3).tolist()[0]
    [0.0, -inf, -inf]
    """
    rows = arange(size, device=device).unsqueeze(1)
    cols = arange(size, device=device).unsqueeze(0)
    return _additive(cols > rows, dtype or empty(0).dtype)


class MultiheadAttention(Module):
    """Multi-head attention with torch's parameters (``in_proj_weight``, ``in_proj_bias``, ``out_proj``)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim % num_heads:  # torch asserts this
            raise AssertionError(f"embed_dim must be divisible by num_heads (MultiheadAttention: embed_dim "
                                 f"{embed_dim}, num_heads {num_heads})")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        factory = {"device": device, "dtype": dtype}
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = Parameter(empty(1, 1, embed_dim, **factory))
            self.bias_v = Parameter(empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def _split_heads(self, x: Tensor) -> Tensor:
        n, length, _ = x.shape
        return x.view(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _check_mask_shapes(self, attn_mask, key_padding_mask, n: int, tgt: int, src: int, unbatched: bool) -> None:
        """torch's checks, with its exception types: a mask of the wrong shape would otherwise broadcast or fail
        deep inside the attention with a message about some other operation."""
        for name, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if mask is not None and mask.dtype.name != "bool" and not mask.dtype.is_floating_point:
                raise AssertionError(f"only bool and floating types of {name} are supported (MultiheadAttention: "
                                     f"got {mask.dtype})")
        if attn_mask is not None:
            if attn_mask.dim() not in (2, 3):
                kind = "unbatched (2-D)" if unbatched else "batched (3-D)"
                raise AssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found "
                                     f"{attn_mask.dim()}-D tensor instead (MultiheadAttention: a 2-D mask is (query "
                                     f"length {tgt}, key length {src}), a 3-D one (batch * heads, {tgt}, {src}))")
            expected = (tgt, src) if attn_mask.dim() == 2 else (n * self.num_heads, tgt, src)
            if tuple(attn_mask.shape) != expected:
                raise RuntimeError(f"The shape of the {attn_mask.dim()}D attn_mask is {attn_mask.shape}, but should "
                                   f"be {expected}. (MultiheadAttention with {self.num_heads} heads, query length "
                                   f"{tgt}, key length {src}, batch {n})")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (n, src):
            shape = tuple(key_padding_mask.shape[1:] if unbatched else key_padding_mask.shape)
            raise AssertionError(f"expecting key_padding_mask shape of {(src,) if unbatched else (n, src)}, but got "
                                 f"{shape} (MultiheadAttention: one entry per key, key length {src})")

    def _merged_mask(self, attn_mask, key_padding_mask, is_causal: bool, n: int, tgt: int, src: int,
                     dtype) -> Tensor | None:
        if is_causal and attn_mask is None:
            attn_mask = causal_mask(tgt, dtype=dtype)
        mask = _additive(attn_mask, dtype)
        if mask is not None and mask.dim() == 3:  # (N * heads, L, S)
            mask = mask.view(n, self.num_heads, tgt, src)
        padding = _additive(key_padding_mask, dtype)
        if padding is not None:
            padding = padding.view(n, 1, 1, src)
            mask = padding if mask is None else mask + padding
        return mask

    def _takes_fast_path(self, query: Tensor, key: Tensor, value: Tensor, attn_mask, key_padding_mask) -> bool:
        """[Note: MultiheadAttention's two paths] torch runs batch-first self-attention in inference through one
        fused kernel (torch._native_multi_head_attention), whose output is batch-major and contiguous, and
        everything else through F.multi_head_attention_forward, sequence-major, whose batch-first output is a
        transposed view: code that calls ``.view`` on the output works on one and not the other, so the choice
        is torch's, condition for condition (float masks, odd head counts, extra key/value rows, autocast and
        gradients all take the general path)."""
        if any(m is not None and m.dtype.is_floating_point for m in (attn_mask, key_padding_mask)):
            return False
        if not (_mha_backend.get_fastpath_enabled() and query.dim() == 3 and query is key and key is value):
            return False
        if self.in_proj_weight is None or query.dtype is not self.in_proj_weight.dtype or (
                self.in_proj_bias is not None and query.dtype is not self.in_proj_bias.dtype):
            return False
        if self.training or self.num_heads % 2 or not self.batch_first or self.bias_k is not None:
            return False
        if self.bias_v is not None or self.add_zero_attn or is_autocast_enabled():
            return False
        tensors = (query, self.in_proj_weight, self.in_proj_bias, self.out_proj.weight, self.out_proj.bias)
        return not (STATE.grad_enabled and any(t is not None and t.requires_grad for t in tensors))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        unbatched = query.dim() == 2
        if query.dim() in (2, 3) and key.dim() == query.dim():
            n = 1 if unbatched else query.shape[0 if self.batch_first else 1]
            seq = 0 if unbatched or not self.batch_first else 1
            self._check_mask_shapes(attn_mask, None if key_padding_mask is None else (
                key_padding_mask.unsqueeze(0) if unbatched else key_padding_mask), n, query.shape[seq],
                key.shape[seq], unbatched)
        if self._takes_fast_path(query, key, value, attn_mask, key_padding_mask):
            return self._fused_forward(query, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                                       is_causal)
        batch_first = self.batch_first and query.dim() == 3
        if batch_first:  # transposed so that query, key and value that were one tensor still are (torch's way)
            if key is value and query is key:
                query = key = value = query.transpose(1, 0)
            elif key is value:
                query, key = query.transpose(1, 0), key.transpose(1, 0)
                value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.bias_k,
            self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=separate, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        return (out.transpose(1, 0) if batch_first else out), weights

    def _fused_forward(self, query: Tensor, key_padding_mask, need_weights: bool, attn_mask,
                       average_attn_weights: bool, is_causal: bool) -> tuple[Tensor, Tensor | None]:
        """Batch-first self-attention, batch-major throughout (see [Note: MultiheadAttention's two paths])."""
        n, tgt, _ = query.shape
        q, k, v = (self._split_heads(t) for t in self._project(query, query, query))
        mask = self._merged_mask(attn_mask, key_padding_mask, is_causal, n, tgt, tgt, q.dtype)
        weights = None
        if need_weights:
            scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if mask is not None:
                scores = scores + mask
            weights = F.softmax(scores, -1)
            heads = weights.matmul(v)
            if average_attn_weights:
                weights = weights.mean(1)
        else:
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # the projection's weight and bias, not its module (as torch's): its hooks and a swap of its class
        # (convert_to_float8_training) leave attention as it is
        out = F.linear(heads.transpose(1, 2).reshape(n, tgt, self.embed_dim), self.out_proj.weight, self.out_proj.bias)
        return out, weights


def _activation(activation: str | Callable) -> Callable:
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu or a callable, not {activation!r}")


def _relu_or_gelu(activation: Callable) -> int:
    """torch's ``activation_relu_or_gelu``: 1 for relu, 2 for gelu, 0 for anything else."""
    if activation is F.relu or isinstance(activation, ReLU):
        return 1
    if activation is F.gelu or isinstance(activation, GELU):
        return 2
    return 0


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual connection and LayerNorm (post-norm by
    default, pre-norm with ``norm_first=True``), as torch.nn.TransformerEncoderLayer."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            **factory)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)
        self.activation_relu_or_gelu = _relu_or_gelu(self.activation)

    def _self_attention(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        src_mask, src_key_padding_mask = _canonical_masks(src, src_mask, src_key_padding_mask, "src_mask",
                                                          "src_key_padding_mask")
        x = src
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._self_attention(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward(x))


class TransformerEncoder(Module):
    """``num_layers`` independent copies of ``encoder_layer``, applied in order, then an optional norm.

    [Note: the encoder's nested-tensor path] In inference with a key padding mask, torch packs the batch into a
    nested tensor of the unpadded sequences and pads the result back with zeros, when ``enable_nested_tensor`` and
    its conditions hold (``use_nested_tensor``, decided here as torch decides it, with its warning). The values
    at the kept positions are those of the padded computation, so tilewise computes that and writes the zeros.
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = self.use_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check
        why_not = _why_not_nested(encoder_layer)
        if enable_nested_tensor and why_not:
            warnings.warn(f"enable_nested_tensor is True, but self.use_nested_tensor is False because {why_not}",
                          stacklevel=2)
            self.use_nested_tensor = False

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        mask, src_key_padding_mask = _canonical_masks(src, mask, src_key_padding_mask, "mask", "src_key_padding_mask")
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        if self._pads_with_zeros(src, mask, src_key_padding_mask):
            padded = src_key_padding_mask if src_key_padding_mask.dtype.name == "bool" else src_key_padding_mask != 0
            x = x.masked_fill(padded.unsqueeze(-1), 0.0)
        return self.norm(x) if self.norm is not None else x

    def _pads_with_zeros(self, src: Tensor, mask, padding) -> bool:
        """Whether torch takes its nested-tensor path (see [Note: the encoder's nested-tensor path])."""
        if not (_mha_backend.get_fastpath_enabled() and getattr(self, "use_nested_tensor", False)):
            return False
        first = self.layers[0]
        if first.training or src.dim() != 3 or padding is None or mask is not None or is_autocast_enabled():
            return False
        if padding.dtype.name != "bool" and not padding.dtype.is_floating_point:
            return False
        kept = padding.logical_not() if padding.dtype.name == "bool" else padding == 0
        if getattr(self, "mask_check", True) and not _left_aligned(kept):
            return False
        attn = first.self_attn
        tensors = (src, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight, attn.out_proj.bias,
                   first.norm1.weight, first.norm1.bias, first.norm2.weight, first.norm2.bias, first.linear1.weight,
                   first.linear1.bias, first.linear2.weight, first.linear2.bias)
        return not (STATE.grad_enabled and any(t is not None and t.requires_grad for t in tensors))


def _canonical_masks(src: Tensor, mask, padding, mask_name: str, padding_name: str):
    """The attention mask and the key padding mask as torch's encoder and encoder layer take them before running
    (``F._canonical_mask``): a bool mask made the additive float mask of ``src``'s dtype, with torch's deprecation
    warning where the padding mask's type differs from the mask's; the layers and attention inside then see masks of
    one type."""
    from tilewise.ops.nn_multi_head_attention import _additive_mask

    padding = _additive_mask(padding, padding_name, mask, mask_name, src.dtype)
    return _additive_mask(mask, mask_name, None, "", src.dtype), padding


def _left_aligned(kept: Tensor) -> bool:
    """Every row's kept positions come first (torch._nested_tensor_from_mask_left_aligned)."""
    return bool((kept[:, 1:] <= kept[:, :-1]).all()) if kept.shape[-1] > 1 else True


def _why_not_nested(layer) -> str:
    """torch's reason for not using nested tensors with ``layer``, or "" (TransformerEncoder.__init__)."""
    name = "encoder_layer"
    if not isinstance(layer, TransformerEncoderLayer):
        return f"{name} was not TransformerEncoderLayer"
    if layer.norm_first:
        return f"{name}.norm_first was True"
    if not layer.self_attn.batch_first:
        return f"{name}.self_attn.batch_first was not True(use batch_first for better inference performance)"
    if not layer.self_attn._qkv_same_embed_dim:
        return f"{name}.self_attn._qkv_same_embed_dim was not True"
    if layer.self_attn.in_proj_bias is None:
        return f"{name}.self_attn was passed bias=False"
    if not layer.activation_relu_or_gelu:
        return f"{name}.activation_relu_or_gelu was not True"
    if layer.norm1.eps != layer.norm2.eps:
        return f"{name}.norm1.eps was not equal to {name}.norm2.eps"
    if layer.self_attn.num_heads % 2 == 1:
        return f"{name}.self_attn.num_heads is odd"
    return ""


class TransformerDecoderLayer(Module):
    """Self-attention, attention over the encoder's output (``memory``) and a feed-forward block, each with a
    residual connection and LayerNorm (post-norm by default, pre-norm with ``norm_first=True``), as
    torch.nn.TransformerDecoderLayer."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            **factory)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, **factory)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def _self_attention(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _memory_attention(self, x: Tensor, memory: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out, _ = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                     need_weights=False, is_causal=is_causal)
        return self.dropout2(out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._memory_attention(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal)
            return x + self._feed_forward(self.norm3(x))
        x = self.norm1(x + self._self_attention(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._memory_attention(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._feed_forward(x))


def _is_causal_mask(mask: Tensor | None, is_causal: bool | None, size: int) -> bool:
    """torch's _detect_is_causal_mask: the hint as given, or (None) whether the mask is the causal one."""
    if is_causal is not None or mask is None:
        return bool(is_causal)
    causal = causal_mask(size, device=mask.device, dtype=mask.dtype if mask.dtype.is_floating_point else None)
    if tuple(mask.shape) != tuple(causal.shape):
        return False
    if not mask.dtype.is_floating_point:
        causal = causal != 0
    return bool((mask == causal).all())


class TransformerDecoder(Module):
    """``num_layers`` independent copies of ``decoder_layer``, applied in order, then an optional norm."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        batch_first = self.layers[0].self_attn.batch_first if self.num_layers else False
        length = tgt.shape[1] if batch_first and tgt.dim() == 3 else tgt.shape[0]
        tgt_is_causal = _is_causal_mask(tgt_mask, tgt_is_causal, length)
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """An encoder-decoder Transformer with torch's structure, parameter names and initialisation (Xavier-uniform
    for every parameter of more than one dim), so a torch state dict loads unchanged.

    >>> import tilewise as tw
    >>> model = tw.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
    ...                           dim_feedforward=16, batch_first=True)
    >>> model(tw.ones(2, 5, 8), tw.ones(2, 3, 8)).shape
    tilewise.Size([2, 3, 8])
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation: str | Callable = "relu",
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                      bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(TransformerEncoderLayer(*layer_args, **factory), num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(TransformerDecoderLayer(*layer_args, **factory), num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory))
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """The float mask that stops position i attending to j > i: 0 on and below the diagonal, -inf above."""
        return causal_mask(sz, device=device, dtype=dtype)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch_dim = 0 if self.batch_first else 1
        if src.dim() == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=bool(src_is_causal))
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)
