"""Samples for tilewise.nn.functional's normalization, dropout, embedding, loss, attention, convolution, pooling
and resampling operators (compared with torch.nn.functional, forward and gradients).

Dropout is compared here only where it is deterministic (p=0, eval); its random masks are tested in
test_nn_functional.py.
"""

from __future__ import annotations

import torch
from opinfo import OpInfo, Sample, T


def stats(channels):
    """Running mean and variance buffers (no gradient; the variance positive)."""
    return T((channels,), grad=False), T((channels,), "positive", grad=False)


def class_targets(shape, classes):
    return T(shape, "index", high=classes)


def weights(shape):
    return T(shape, "positive", 0.2, 2.0, grad=False)


def _layer_norm():
    return [Sample((T((2, 3, 4)), (4,))),
            Sample((T((2, 3, 4)), (3, 4), T((3, 4)), T((3, 4))), name="affine"),
            Sample((T((5, 6)), (6,), T((6,))), {"eps": 1e-3}, name="weight-only")]


def _rms_norm():
    return [Sample((T((2, 3, 4)), (4,))), Sample((T((2, 3, 4)), (3, 4), T((3, 4))), name="weight"),
            Sample((T((5, 6)), (6,), None, 1e-3), name="eps")]


def _batch_norm():
    return [Sample((T((4, 3, 5)), *stats(3), T((3,)), T((3,)), True), name="train"),
            Sample((T((2, 3, 4, 5)), *stats(3), T((3,)), T((3,)), True, 0.3, 1e-3), name="train-4d"),
            Sample((T((4, 3, 5)), *stats(3), T((3,)), T((3,)), False), name="eval"),
            Sample((T((6, 3)), None, None, None, None, True), name="train-no-stats")]


def _group_norm():
    return [Sample((T((2, 6, 4, 3)), 3, T((6,)), T((6,)))), Sample((T((2, 4, 5)), 2), name="no-affine"),
            Sample((T((0, 4, 5)), 2, T((4,)), T((4,))), name="empty-batch"),
            Sample((T((3, 4, 5)), 4, T((4,)), None, 1e-3), name="per-channel")]


def _instance_norm():
    return [Sample((T((2, 3, 5)),)),
            Sample((T((2, 3, 4, 5)), *stats(3), T((3,)), T((3,))), name="running-stats"),
            Sample((T((2, 3, 4)), *stats(3), None, None, False), name="eval")]


def _deterministic_dropout(shape):
    return lambda: [Sample((T(shape), 0.0), name="p=0"), Sample((T(shape), 0.5, False), name="eval")]


def _embedding():
    return [Sample((class_targets((2, 3), 5), T((5, 4)))),
            Sample((class_targets((7,), 5), T((5, 4)), 1), name="padding_idx"),
            Sample((class_targets((7,), 5), T((5, 4)), -2), {"scale_grad_by_freq": True}, name="freq"),
            Sample((class_targets((2, 4), 6), T((6, 3), "float", -3, 3)), {"max_norm": 1.0}, name="max_norm")]


def _cross_entropy():
    n, c = 6, 5
    return [Sample((T((n, c)), class_targets((n,), c))),
            Sample((T((n, c)), class_targets((n,), c)), {"weight": weights((c,))}, name="weight"),
            Sample((T((n, c)), class_targets((n,), c)), {"ignore_index": 1, "reduction": "sum"}, name="ignore-sum"),
            Sample((T((n, c)), class_targets((n,), c)), {"weight": weights((c,)), "ignore_index": 2,
                                                         "reduction": "none"}, name="ignore-none"),
            Sample((T((n, c)), class_targets((n,), c)), {"label_smoothing": 0.2}, name="smoothing"),
            Sample((T((n, c)), class_targets((n,), c)), {"weight": weights((c,)), "ignore_index": 0,
                                                         "label_smoothing": 0.3}, name="smoothing-weight-ignore"),
            Sample((T((2, c, 3, 2)), class_targets((2, 3, 2), c)), {"weight": weights((c,)),
                                                                    "label_smoothing": 0.1}, name="spatial"),
            Sample((T((2, c, 3)), class_targets((2, 3), c)), {"reduction": "none", "ignore_index": 3},
                   name="spatial-none"),
            Sample((T((c,)), class_targets((), c)), name="unbatched"),
            Sample((T((n, c)), T((n, c), "prob")), name="probabilities"),
            Sample((T((n, c)), T((n, c), "prob")), {"weight": weights((c,)), "label_smoothing": 0.25},
                   name="probabilities-weight-smoothing"),
            Sample((T((2, c, 3)), T((2, c, 3), "prob")), {"reduction": "none"}, name="probabilities-spatial")]


def _nll_loss():
    n, c = 6, 5
    return [Sample((T((n, c)), class_targets((n,), c))),
            Sample((T((n, c)), class_targets((n,), c), weights((c,))), {"ignore_index": 1}, name="weight-ignore"),
            Sample((T((n, c)), class_targets((n,), c)), {"reduction": "none"}, name="none"),
            Sample((T((2, c, 3, 2)), class_targets((2, 3, 2), c)), {"reduction": "sum"}, name="spatial"),
            Sample((T((c,)), class_targets((), c)), name="unbatched")]


def _elementwise_loss(weighted=True):
    samples = [Sample((T((3, 4)), T((3, 4)))), Sample((T((3, 4)), T((3, 4))), {"reduction": "sum"}, name="sum"),
               Sample((T((2, 3, 4)), T((2, 3, 4))), {"reduction": "none"}, name="none")]
    if weighted:
        samples += [Sample((T((3, 4)), T((3, 4))), {"weight": weights((3, 4))}, name="weight-mean"),
                    Sample((T((3, 4)), T((3, 4))), {"weight": weights((3, 4)), "reduction": "none"},
                           name="weight-none")]
    return samples


def _smooth_l1_loss():
    return _elementwise_loss(weighted=False) + [
        Sample((T((3, 4)), T((3, 4))), {"beta": 0.5}, name="beta"),
        Sample((T((3, 4)), T((3, 4))), {"beta": 0.0, "reduction": "sum"}, name="beta=0")]


def _huber_loss():
    return _elementwise_loss() + [Sample((T((3, 4)), T((3, 4))), {"delta": 0.7}, name="delta")]


def _binary_cross_entropy():
    return [Sample((T((3, 4), "prob"), T((3, 4), "prob"))),
            Sample((T((3, 4), "prob"), T((3, 4), "prob"), weights((4,))), {"reduction": "sum"}, name="weight"),
            Sample((T((2, 3), "prob"), T((2, 3), "prob")), {"reduction": "none"}, name="none")]


def _binary_cross_entropy_with_logits():
    return [Sample((T((3, 4)), T((3, 4), "prob"))),
            Sample((T((3, 4)), T((3, 4), "prob")), {"pos_weight": weights((4,)), "weight": weights((3, 4))},
                   name="weights"),
            Sample((T((3, 4), "float", -30, 30), T((3, 4), "prob")), {"pos_weight": weights((4,)),
                                                                      "reduction": "none"}, name="large-logits")]


def _kl_div():
    return [Sample((T((3, 4)), T((3, 4), "prob")), {"reduction": "batchmean"}),
            Sample((T((3, 4)), T((3, 4), "prob")), {"reduction": "sum"}, name="sum"),
            Sample((T((3, 4)), T((3, 4))), {"reduction": "none", "log_target": True}, name="log-target"),
            Sample((T((3, 4)), T((3, 4), "prob")), name="mean")]


def _attention():
    q, k, v = T((2, 3, 4, 8)), T((2, 3, 5, 8)), T((2, 3, 5, 6))
    return [Sample((q, k, v)),
            Sample((q, k, v), {"attn_mask": T((4, 5), "bool", grad=False)}, name="bool-mask"),
            Sample((q, k, v), {"attn_mask": T((2, 1, 4, 5))}, name="float-mask"),
            Sample((T((2, 3, 5, 8)), T((2, 3, 5, 8)), T((2, 3, 5, 6))), {"is_causal": True}, name="causal"),
            Sample((T((2, 3, 4, 8)), T((2, 3, 6, 8)), T((2, 3, 6, 8))), {"is_causal": True, "scale": 0.3},
                   name="causal-rectangular-scale"),
            Sample((T((1, 4, 3, 8)), T((1, 2, 5, 8)), T((1, 2, 5, 8))), {"enable_gqa": True}, name="gqa"),
            Sample((T((2, 6, 5, 8)), T((2, 2, 5, 8)), T((2, 3, 5, 6))), {"enable_gqa": True, "is_causal": True},
                   name="gqa-key-value-heads-differ-causal"),
            Sample((T((2, 4, 3, 8)), T((1, 1, 5, 8)), T((1, 2, 5, 8))), {"enable_gqa": True, "attn_mask": T((3, 5))},
                   name="gqa-broadcast-batch-mask"),
            Sample((T((4, 3, 8)), T((2, 5, 8)), T((2, 5, 8))), {"enable_gqa": True, "scale": 0.2}, name="gqa-3d"),
            Sample((T((4, 8)), T((5, 8)), T((5, 3))), name="2d")]


def _conv1d():
    return [Sample((T((2, 4, 9)), T((6, 4, 3)), T((6,)))),
            Sample((T((2, 4, 9)), T((6, 2, 3)), None, 2, 1, 2, 2), name="stride-pad-dilation-groups"),
            Sample((T((2, 4, 9)), T((6, 4, 4))), {"padding": "same"}, name="same-even-kernel"),
            Sample((T((4, 9)), T((6, 4, 3)), T((6,))), {"padding": "valid"}, name="unbatched")]


def _conv2d():
    return [Sample((T((2, 4, 7, 6)), T((6, 4, 3, 3)), T((6,)))),
            Sample((T((2, 4, 7, 6)), T((6, 2, 3, 2)), T((6,)), (2, 1), (1, 2), (2, 1), 2),
                   name="stride-pad-dilation-groups"),
            Sample((T((1, 4, 6, 5)), T((4, 1, 2, 3))), {"padding": "same", "dilation": (2, 1), "groups": 4},
                   name="same-depthwise"),
            Sample((T((4, 6, 5)), T((3, 4, 1, 1))), {"stride": 2}, name="unbatched-1x1")]


def _max_pool2d():
    x = T((2, 3, 7, 6), "distinct")
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, (3, 2), (2, 1), (1, 0), (2, 1), True), name="dilation-ceil"),
            Sample((x, 3, 2), {"ceil_mode": True, "return_indices": True}, name="indices"),
            Sample((T((3, 5, 5), "distinct"), 2, 1), name="unbatched")]


def _max_pool2d_with_indices():
    x = T((2, 3, 7, 6), "nan")
    return [Sample((T((2, 3, 7, 6), "distinct"), 3, 2, 1, 1, True)), Sample((x, 2), name="nan"),
            Sample((x, 3, 1, 1), name="nan-overlapping-pad"), Sample((x, 3, 2, 1, 1, True), name="nan-ceil"),
            Sample((T((2, 3, 7, 6), "ties", -2, 0), 3, 2, 1), name="ties-pad"),
            Sample((T((0, 3, 7, 6)), 3, 2, 1), name="empty-batch")]


def _avg_pool2d():
    x = T((2, 3, 7, 6))
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, 3, 2, 1), {"count_include_pad": False, "ceil_mode": True}, name="exclude-pad-ceil"),
            Sample((x, (3, 2), (2, 2), (1, 1), True), name="ceil-include-pad"),
            Sample((x, 3, 2, 1), {"divisor_override": 5}, name="divisor"),
            Sample((T((3, 5, 5)), 2), name="unbatched"), Sample((T((0, 3, 5, 5)), 2), name="empty-batch")]


def _avg_pool2d_int64():
    """torch's CPU kernel averages int64 windows in integer arithmetic, rounding toward zero."""
    x = T((2, 3, 7, 6), "int", -9, 9)
    return [Sample((x, 2)), Sample((x, 3, 2, 1), {"count_include_pad": False, "ceil_mode": True}, name="exclude-pad"),
            Sample((x, 3, 2, 1), {"divisor_override": 4}, name="divisor")]


def _adaptive_avg_pool2d():
    x = T((2, 3, 7, 5))
    return [Sample((x, (3, 2))), Sample((x, 1), name="global"), Sample((x, (7, 5)), name="identity"),
            Sample((x, (None, 3)), name="none"), Sample((T((2, 3, 7, 5), "nan"), (3, 2)), name="nan-inf"),
            Sample((x, (9, 8)), name="upsample"), Sample((T((3, 6, 4)), 2), name="unbatched")]


def _interpolate():
    return [Sample((T((2, 3, 4, 5)),), {"size": (7, 9)}),
            Sample((T((2, 3, 4, 5)),), {"scale_factor": 2}, name="x2"),
            Sample((T((2, 3, 6, 5)),), {"scale_factor": (1.5, 0.7)}, name="fractional"),
            Sample((T((2, 3, 6, 5)),), {"scale_factor": 1.7, "recompute_scale_factor": True}, name="recompute"),
            Sample((T((2, 3, 5)),), {"size": 8}, name="3d"),
            Sample((T((1, 2, 3, 4, 5)),), {"scale_factor": (1.5, 0.5, 2.2)}, name="5d"),
            # sizes twice and once the input's from scale factors that are not 2 and 1: torch's 2-D kernel goes by
            # the sizes, its 1-D and 3-D kernels by the factors (and their backward by the sizes: no gradient here)
            Sample((T((2, 3, 3, 5)),), {"scale_factor": (2.33, 1.1)}, name="scale-not-size-ratio"),
            Sample((T((2, 3, 3), grad=False),), {"scale_factor": 2.33}, name="scale-not-size-ratio-1d"),
            Sample((T((1, 2, 3, 2, 5), grad=False),), {"scale_factor": (2.33, 1.0, 1.1)},
                   name="scale-not-size-ratio-3d"),
            *_interpolating_modes()]


def _interpolating_modes():
    return [Sample((T((2, 3, 5)),), {"size": 8, "mode": "linear"}, name="linear"),
            Sample((T((2, 3, 6)),), {"scale_factor": 0.6, "mode": "linear", "align_corners": True},
                   name="linear-align-down"),
            Sample((T((2, 3, 4, 5)),), {"size": (7, 3), "mode": "bilinear"}, name="bilinear"),
            Sample((T((2, 3, 4, 5)),), {"scale_factor": (1.5, 2.3), "mode": "bilinear", "align_corners": True},
                   name="bilinear-align-scale"),
            Sample((T((1, 2, 3, 4, 5)),), {"size": (5, 2, 7), "mode": "trilinear"}, name="trilinear"),
            Sample((T((1, 2, 3, 4, 2)),), {"scale_factor": 1.7, "mode": "trilinear", "align_corners": True},
                   name="trilinear-align"),
            Sample((T((2, 3, 4, 5)),), {"size": (9, 3), "mode": "bicubic"}, name="bicubic"),
            Sample((T((2, 3, 4, 5)),), {"scale_factor": 1.6, "mode": "bicubic", "align_corners": True},
                   name="bicubic-align"),
            Sample((T((2, 3, 7, 5)),), {"size": (3, 4), "mode": "area"}, name="area"),
            Sample((T((2, 3, 7)),), {"scale_factor": 0.5, "mode": "area"}, name="area-1d"),
            Sample((T((2, 3, 5, 4)),), {"size": (8, 3), "mode": "nearest-exact"}, name="nearest-exact"),
            Sample((T((1, 2, 3, 4, 5)),), {"scale_factor": 1.5, "mode": "nearest-exact"}, name="nearest-exact-3d"),
            *_antialiasing_modes()]


def _antialiasing_modes():
    """Antialiased resampling (4-D only): down in one dim, up in the other, a dim left unchanged, align_corners."""
    return [Sample((T((2, 3, 9, 5)),), {"size": (4, 7), "mode": "bilinear", "antialias": True},
                   name="bilinear-antialias"),
            Sample((T((2, 3, 9, 5)),), {"scale_factor": (0.4, 1.0), "mode": "bilinear", "antialias": True,
                                        "align_corners": True}, name="bilinear-antialias-align-scale"),
            Sample((T((1, 2, 11, 6)),), {"size": (3, 8), "mode": "bicubic", "antialias": True},
                   name="bicubic-antialias"),
            Sample((T((1, 2, 11, 6)),), {"scale_factor": 0.45, "mode": "bicubic", "antialias": True,
                                        "recompute_scale_factor": True, "align_corners": True},
                   name="bicubic-antialias-align-recompute"),
            *([Sample((T((1, 2, 12, 5)),), {"size": (5, 9), "mode": "lanczos", "antialias": True}, name="lanczos")]
              if _torch_has_lanczos() else [])]


def _torch_has_lanczos() -> bool:
    """torch 2.13 added lanczos resampling: an older torch (as on some GPU hosts) cannot check it."""
    try:
        torch.nn.functional.interpolate(torch.zeros(1, 1, 4, 4), size=(2, 2), mode="lanczos", antialias=True)
    except (ValueError, NotImplementedError):
        return False
    return True


OPINFOS = [
    OpInfo("layer_norm", _layer_norm, call="F", covers=("native_layer_norm", "_layer_norm_backward")),
    OpInfo("rms_norm", _rms_norm, call="F", covers=("_fused_rms_norm",)),
    OpInfo("batch_norm", _batch_norm, call="F", covers=("native_batch_norm", "_batch_norm_backward")),
    OpInfo("group_norm", _group_norm, call="F"),
    OpInfo("instance_norm", _instance_norm, call="F"),
    OpInfo("normalize", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1.0, 0), name="p=1-dim0")], call="F"),
    OpInfo("cosine_similarity", lambda: [Sample((T((3, 4)), T((3, 4)))),
                                         Sample((T((2, 3, 4)), T((3, 4)), -1), name="broadcast")], call="F"),
    OpInfo("dropout", _deterministic_dropout((3, 4)), call="F"),
    OpInfo("dropout1d", _deterministic_dropout((2, 3, 4)), call="F"),
    OpInfo("dropout2d", _deterministic_dropout((2, 3, 4, 5)), call="F"),
    OpInfo("dropout3d", _deterministic_dropout((2, 3, 2, 2, 2)), call="F"),
    OpInfo("embedding", _embedding, call="F", covers=("_embedding_backward",)),
    OpInfo("cross_entropy", _cross_entropy, call="F",
           covers=("_cross_entropy_loss", "_cross_entropy_backward", "_cross_entropy_target_backward")),
    OpInfo("nll_loss", _nll_loss, call="F"),
    OpInfo("mse_loss", _elementwise_loss, call="F"),
    OpInfo("l1_loss", _elementwise_loss, call="F"),
    OpInfo("smooth_l1_loss", _smooth_l1_loss, call="F"),
    OpInfo("huber_loss", _huber_loss, call="F"),
    OpInfo("binary_cross_entropy", _binary_cross_entropy, call="F", covers=("_binary_cross_entropy",)),
    OpInfo("binary_cross_entropy_with_logits", _binary_cross_entropy_with_logits, call="F"),
    OpInfo("kl_div", _kl_div, call="F"),
    OpInfo("scaled_dot_product_attention", _attention, call="F",
           covers=("_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward")),
    OpInfo("conv1d", _conv1d, call="F", covers=("conv1d.padding",)),
    OpInfo("conv2d", _conv2d, call="F", covers=("conv2d.padding",)),
    OpInfo("max_pool2d", _max_pool2d, call="F"),
    OpInfo("max_pool2d_with_indices", _max_pool2d_with_indices, call="F"),
    OpInfo("avg_pool2d", _avg_pool2d, call="F"),
    OpInfo("avg_pool2d", _avg_pool2d_int64, call="F", dtypes=("int64",), torch_on_cpu=True),
    OpInfo("adaptive_avg_pool2d", _adaptive_avg_pool2d, call="F"),
    OpInfo("interpolate", _interpolate, call="F", torch_on_cpu=True),  # torch 2.13's CUDA nearest kernel goes by sizes
    OpInfo("pixel_shuffle", lambda: [Sample((T((2, 8, 3, 4)), 2)), Sample((T((9, 2, 3)), 3), name="unbatched")],
           call="F"),
    OpInfo("pixel_unshuffle", lambda: [Sample((T((2, 2, 4, 6)), 2)), Sample((T((3, 6, 3)), 3), name="unbatched"),
                                       Sample((T((2, 1, 1, 4, 2)), 2), name="5d")], call="F"),
]


# ---------------------------------------------------------------- recurrent cells (ops/nn_recurrent.py)

def _lstm_cell_reference(torch, nnf):
    def cell(input_gates, hidden_gates, cx):
        i, f, g, o = (input_gates + hidden_gates).chunk(4, 1)
        cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
        return o.sigmoid() * cy.tanh(), cy

    return cell


def _gru_cell_reference(torch, nnf):
    def cell(input_gates, hidden_gates, hx):
        ir, iz, in_ = input_gates.chunk(3, 1)
        hr, hz, hn = hidden_gates.chunk(3, 1)
        r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
        n = (in_ + r * hn).tanh()
        return n + z * (hx - n)

    return cell


def _lstm_layer_reference(torch, nnf):
    """The layer as torch's LSTMCell arithmetic step by step, with what the operator saves (every cell state and
    hidden projection) as outputs of their own."""
    cell = _lstm_cell_reference(torch, nnf)

    def layer(input_gates, h0, c0, w_hh):
        h, c, outputs, cells, hidden = h0, c0, [], [], []
        for t in range(input_gates.shape[0]):
            hidden.append(h @ w_hh.t())
            h, c = cell(input_gates[t], hidden[-1], c)
            outputs.append(h)
            cells.append(c)
        return torch.stack(outputs), h, c, torch.stack(cells), torch.stack(hidden)

    return layer


OPINFOS += [
    # the gradient of every output, cs and hidden_gates included (they are differentiable for second derivatives)
    OpInfo("_lstm_layer", lambda: [Sample((T((4, 3, 8)), T((3, 2)), T((3, 2)), T((8, 2), low=-1, high=1))),
                                   Sample((T((1, 2, 4)), T((2, 1)), T((2, 1)), T((4, 1))), name="one step")],
           reference=_lstm_layer_reference, covers=("_lstm_layer_backward",)),
    OpInfo("_lstm_cell", lambda: [Sample((T((3, 8)), T((3, 8)), T((3, 2)))), Sample((T((1, 4)), T((1, 4)), T((1, 1))),
                                                                                    name="one")],
           reference=_lstm_cell_reference, covers=("_lstm_cell_backward",)),
    OpInfo("_gru_cell", lambda: [Sample((T((3, 6)), T((3, 6)), T((3, 2)))), Sample((T((2, 3)), T((2, 3)), T((2, 1))),
                                                                                   name="one")],
           reference=_gru_cell_reference, covers=("_gru_cell_backward",)),
    # W_hh gets its gradient elsewhere (one product over all steps): no gradient flows to it from here
    OpInfo("_rnn_hidden_projection", lambda: [Sample((T((3, 4)), T((8, 4), grad=False)))],
           reference=lambda torch, nnf: lambda h, w: h @ w.t()),
    OpInfo("_split_steps", lambda: [Sample((T((6, 4)), [3, 2, 1])), Sample((T((4, 2)), [2, 2]), name="even")],
           reference=lambda torch, nnf: lambda x, sizes: tuple(torch.split(x, sizes, 0))),
]
