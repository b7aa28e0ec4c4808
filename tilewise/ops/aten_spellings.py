"""torch-level spellings of nn.functional operators: ``torch.embedding``, ``torch.kl_div``, ``torch.batch_norm``,
``torch.convolution``, ``torch.alpha_dropout``, ``torch.relu_``, ...

[Note: torch-level spellings] torch exposes its ATen operators at the top level with ATen's signatures, which
differ from torch.nn.functional's: reductions are an int enum (0 none, 1 mean, 2 sum; any other value leaves
the loss unreduced, as ATen's ``apply_loss_reduction`` does), arguments come in another order
(``torch.embedding(weight, indices)``, ``torch.batch_norm(input, weight, bias, running_mean, ...)``), modes are
ints (``torch.grid_sampler(input, grid, 0, 0, False)``) and dropout's switch is ``train``. These are not
operators: each function translates its arguments and calls the nn.functional operator declared in ``ops/``,
so derivatives, autocast, every backend and the compiler come from that one declaration.
"""

from __future__ import annotations

from tilewise.ops.registry import public_function


def _f(name: str):
    return public_function(name)


def reduction_name(op: str, reduction) -> str:
    """ATen's int reduction as nn.functional's string."""
    if type(reduction) is not int:
        raise TypeError(f"{op}(): argument 'reduction' must be int (0 none, 1 mean, 2 sum), not "
                        f"{type(reduction).__name__}")
    return {1: "mean", 2: "sum"}.get(reduction, "none")


# ---------------------------------------------------------------------------- dropout

def alpha_dropout(input, p: float, train: bool):
    return _f("alpha_dropout")(input, p, train)


def alpha_dropout_(input, p: float, train: bool):
    return _f("alpha_dropout")(input, p, train, inplace=True)


def feature_alpha_dropout(input, p: float, train: bool):
    return _f("feature_alpha_dropout")(input, p, train)


def feature_alpha_dropout_(input, p: float, train: bool):
    return _f("feature_alpha_dropout")(input, p, train, inplace=True)


def _feature_dropout(input, p: float, train: bool, inplace: bool):
    """Dropout of whole channels: one draw per (sample, channel) of an input of at least 2 dims."""
    from tilewise.ops.nn_functional import _apply_dropout, check_dropout_p

    check_dropout_p(p, "feature_dropout")
    if not train or p == 0.0 or input.numel() == 0:
        return input
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return _apply_dropout(input, p, inplace, tuple(input.shape[:2]) + (1,) * (input.ndim - 2))


def feature_dropout(input, p: float, train: bool):
    return _feature_dropout(input, p, train, False)


def feature_dropout_(input, p: float, train: bool):
    return _feature_dropout(input, p, train, True)


def dropout_(input, p: float, train: bool):
    return _f("dropout")(input, p, train, inplace=True)


def rrelu(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, generator=None):
    _no_generator("rrelu", generator)
    return _f("rrelu")(input, lower, upper, training)


def rrelu_(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, generator=None):
    _no_generator("rrelu_", generator)
    return _f("rrelu")(input, lower, upper, training, inplace=True)


def _no_generator(op: str, generator) -> None:
    if generator is not None:
        raise NotImplementedError(f"{op}: a generator argument is not supported; rrelu draws from the default "
                                  "generator (seed it with tilewise.manual_seed)")


# ---------------------------------------------------------------------------- normalization and embedding

def batch_norm(input, weight, bias, running_mean, running_var, training: bool, momentum: float, eps: float,
               cudnn_enabled: bool):
    return _f("batch_norm")(input, running_mean, running_var, weight, bias, training, momentum, eps)


def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats: bool, momentum: float,
                  eps: float, cudnn_enabled: bool):
    return _f("instance_norm")(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def embedding(weight, indices, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False):
    """ATen's embedding: a negative ``padding_idx`` means none (nn.functional has already made it positive)."""
    return _f("embedding")(indices, weight, padding_idx if padding_idx >= 0 else None, None, 2.0,
                           scale_grad_by_freq, sparse)


def embedding_renorm_(input, indices, max_norm: float, norm_type: float):
    """Scale the rows of ``input`` that ``indices`` reads whose norm exceeds ``max_norm`` down to it, in place."""
    from tilewise.ops.nn_functional import _renorm_rows_

    _renorm_rows_(input, indices, max_norm, norm_type)
    return input


def norm_except_dim(v, pow: float = 2, dim: int = 0):  # noqa: A002 — ATen's name
    """The ``pow``-norm over every dim but ``dim``, kept as size 1 (weight normalization's norm); the norm of all
    of ``v`` for dim -1."""
    if dim == -1:
        return v.norm(pow)
    if not -v.ndim <= dim < v.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-v.ndim}, {v.ndim - 1}], but got "
                         f"{dim})")
    dim %= v.ndim
    # torch's steps, whose views give the size-1 dims torch's strides
    if dim == 0:
        return v.contiguous().view(v.shape[0], -1).norm(pow, 1).view(v.shape[0], *(1,) * (v.ndim - 1))
    if dim == v.ndim - 1:
        return v.contiguous().view(-1, v.shape[-1]).norm(pow, 0).view(*(1,) * (v.ndim - 1), v.shape[-1])
    return norm_except_dim(v.transpose(0, dim), pow, 0).transpose(0, dim)


# ---------------------------------------------------------------------------- losses

def kl_div(input, target, reduction: int = 1, *, log_target: bool = False):
    loss = _f("kl_div")(input, target, reduction="none", log_target=log_target)
    mode = reduction_name("kl_div", reduction)
    return loss.mean() if mode == "mean" else loss.sum() if mode == "sum" else loss


def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction: int = 1):
    return _f("binary_cross_entropy_with_logits")(
        input, target, weight, reduction=reduction_name("binary_cross_entropy_with_logits", reduction),
        pos_weight=pos_weight)


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0, reduction: int = 1):
    return _f("cosine_embedding_loss")(input1, input2, target, margin,
                                       reduction=reduction_name("cosine_embedding_loss", reduction))


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, reduction: int = 1):
    return _f("margin_ranking_loss")(input1, input2, target, margin,
                                     reduction=reduction_name("margin_ranking_loss", reduction))


def hinge_embedding_loss(input, target, margin: float = 1.0, reduction: int = 1):
    return _f("hinge_embedding_loss")(input, target, margin,
                                      reduction=reduction_name("hinge_embedding_loss", reduction))


def poisson_nll_loss(input, target, log_input: bool, full: bool, eps: float, reduction: int):
    return _f("poisson_nll_loss")(input, target, log_input, full, eps=eps,
                                  reduction=reduction_name("poisson_nll_loss", reduction))


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6,
                        swap: bool = False, reduction: int = 1):
    return _f("triplet_margin_loss")(anchor, positive, negative, margin, p, eps, swap,
                                     reduction=reduction_name("triplet_margin_loss", reduction))


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: int = 1,
             zero_infinity: bool = False):
    return _f("ctc_loss")(log_probs, targets, input_lengths, target_lengths, blank,
                          reduction_name("ctc_loss", reduction), zero_infinity)


# ---------------------------------------------------------------------------- padding, convolution, sampling

def constant_pad_nd(input, pad, value=0):
    return _f("pad")(input, list(pad), "constant", value)


def convolution(input, weight, bias, stride, padding, dilation, transposed: bool, output_padding, groups: int):
    """conv{1,2,3}d or conv_transpose{1,2,3}d, by the weight's number of spatial dims."""
    spatial = weight.ndim - 2
    if spatial not in (1, 2, 3):
        raise RuntimeError(f"convolution: expected a 3-D, 4-D or 5-D weight (out_channels, in_channels / groups, "
                           f"*kernel), got {list(weight.shape)}")
    if transposed:
        return _f(f"conv_transpose{spatial}d")(input, weight, bias, stride, padding, output_padding, groups,
                                               dilation)
    return _f(f"conv{spatial}d")(input, weight, bias, stride, padding, dilation, groups)


def affine_grid_generator(theta, size, align_corners: bool):
    return _f("affine_grid")(theta, list(size), align_corners)


_INTERPOLATION = ("bilinear", "nearest", "bicubic")
_PADDING = ("zeros", "border", "reflection")


def grid_sampler(input, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    if not 0 <= interpolation_mode < len(_INTERPOLATION):
        raise ValueError(f"grid_sampler: interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), got "
                         f"{interpolation_mode}")
    if not 0 <= padding_mode < len(_PADDING):
        raise ValueError(f"grid_sampler: padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got "
                         f"{padding_mode}")
    return _f("grid_sample")(input, grid, _INTERPOLATION[interpolation_mode], _PADDING[padding_mode], align_corners)


def _grid_sampler_nd(spatial: int):
    def sampler(input, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
        if input.ndim != spatial + 2 or grid.ndim != spatial + 2:
            raise RuntimeError(f"grid_sampler(): expected {spatial + 2}D input and grid with same number of "
                               f"dimensions, but got input with sizes {list(input.shape)} and grid with sizes "
                               f"{list(grid.shape)}")
        return grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)

    sampler.__name__ = sampler.__qualname__ = f"grid_sampler_{spatial}d"
    return sampler


grid_sampler_2d = _grid_sampler_nd(2)
grid_sampler_3d = _grid_sampler_nd(3)


# ---------------------------------------------------------------------------- recurrent cells

def _cell_projections(op: str, input, hx, w_ih, w_hh, b_ih, b_hh, gates: int):
    """The input and hidden projections of one step, checked as torch checks them."""
    hidden = hx.shape[-1] if hx.ndim else 0
    for name, w, inner in (("weight_ih", w_ih, input.shape[-1] if input.ndim else 0), ("weight_hh", w_hh, hidden)):
        if w.ndim != 2 or w.shape[0] != gates * hidden or w.shape[1] != inner:
            raise RuntimeError(f"{op}: {name} must have shape [{gates} * hidden_size, {inner}] = "
                               f"[{gates * hidden}, {inner}], but got {list(w.shape)}")
    linear = _f("linear")
    return linear(input, w_ih, b_ih), linear(hx, w_hh, b_hh)


def lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """One LSTM step: ``hx`` is ``[h, c]``; returns ``(h', c')``."""
    from tilewise.ops.registry import OPS

    h, c = hx
    input_gates, hidden_gates = _cell_projections("lstm_cell", input, h, w_ih, w_hh, b_ih, b_hh, 4)
    return OPS["_lstm_cell"](input_gates, hidden_gates, c)


def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """One GRU step (torch's: the reset gate scales the hidden projection with its bias)."""
    from tilewise.ops.registry import OPS

    input_gates, hidden_gates = _cell_projections("gru_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 3)
    return OPS["_gru_cell"](input_gates, hidden_gates, hx)


def rnn_tanh_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    input_gates, hidden_gates = _cell_projections("rnn_tanh_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 1)
    return (input_gates + hidden_gates).tanh()


def rnn_relu_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    input_gates, hidden_gates = _cell_projections("rnn_relu_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 1)
    return (input_gates + hidden_gates).relu()


def _inplace_activation(name: str):
    """torch.relu_(x) and friends: the activation operator's in-place form, as nn.functional.relu_."""
    from tilewise.ops.inplace import make_inplace

    return make_inplace(public_function(name), name)


SPELLINGS = (
    alpha_dropout, alpha_dropout_, feature_alpha_dropout, feature_alpha_dropout_, feature_dropout, feature_dropout_,
    dropout_, rrelu, rrelu_, batch_norm, instance_norm, embedding, embedding_renorm_, norm_except_dim, kl_div,
    binary_cross_entropy_with_logits, cosine_embedding_loss, margin_ranking_loss, hinge_embedding_loss,
    poisson_nll_loss, triplet_margin_loss, ctc_loss, constant_pad_nd, convolution, affine_grid_generator,
    grid_sampler, grid_sampler_2d, grid_sampler_3d, lstm_cell, gru_cell, rnn_tanh_cell, rnn_relu_cell)


def spellings() -> dict:
    """The functions to export at the top level, by name (called once every operator is declared)."""
    from tilewise.ops.nn_embedding_bag import embedding_bag  # ATen's signature and 4 results

    found = {fn.__name__: fn for fn in (*SPELLINGS, embedding_bag)}
    found.update({f"{name}_": _inplace_activation(name) for name in ("relu", "selu", "celu", "threshold")})
    return found
