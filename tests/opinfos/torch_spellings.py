"""Samples for the torch-level spellings of nn.functional operators (``torch.embedding(weight, indices)``,
``torch.kl_div(input, target, 1)``, ``torch.batch_norm(...)``, ``torch.convolution(...)``, ...), called as
``tw.<name>`` and ``torch.<name>`` with ATen's signatures: int reductions, reordered arguments, int modes.

Random ones (the dropouts, rrelu while training) are compared on their deterministic paths; their masks are
tested in test_torch_spellings.py.
"""

from __future__ import annotations

from opinfo import OpInfo, Sample, T

from opinfos.nn import class_targets, stats
from opinfos.nn_extra import Fixed, indices, signs, weights


class FixedArgsOpInfo(OpInfo):
    """A torch-level function whose samples hold ``Fixed`` integer tensors (lengths, targets)."""

    def resolve(self, module, functional):
        fn = getattr(module, self.name)

        def call(*args, **kwargs):
            def convert(value):
                return module.tensor(value.value, dtype=module.int64) if isinstance(value, Fixed) else value

            return fn(*[convert(a) for a in args], **{k: convert(v) for k, v in kwargs.items()})

        return call


def _int_reductions(args, extra=()):
    """One sample per ATen reduction: 0 none, 1 mean, 2 sum, and an out-of-range value (unreduced, as ATen)."""
    return [Sample((*args, *extra, r), name=f"reduction{r}") for r in (0, 1, 2, 5)]


def _deterministic(shape):
    return lambda: [Sample((T(shape), 0.0, True), name="p=0"), Sample((T(shape), 0.5, False), name="eval")]


def _batch_norm():
    return [Sample((T((4, 3, 5)), T((3,)), T((3,)), *stats(3), True, 0.1, 1e-5, False), name="train"),
            Sample((T((2, 3, 4, 5)), None, None, *stats(3), False, 0.1, 1e-3, True), name="eval-no-affine"),
            Sample((T((6, 3)), T((3,)), None, None, None, True, 0.1, 1e-5, True), name="train-no-stats")]


def _instance_norm():
    return [Sample((T((2, 3, 5)), None, None, None, None, True, 0.1, 1e-5, False)),
            Sample((T((2, 3, 4, 5)), T((3,)), T((3,)), *stats(3), True, 0.1, 1e-5, False), name="running-stats")]


def _embedding():
    return [Sample((T((5, 4)), class_targets((2, 3), 5))),
            Sample((T((5, 4)), class_targets((7,), 5), 1), name="padding_idx"),
            Sample((T((5, 4)), class_targets((7,), 5), -1, True), name="freq")]


def _kl_div():
    return _int_reductions((T((3, 4)), T((3, 4), "prob"))) + [
        Sample((T((3, 4)), T((3, 4)), 2), {"log_target": True}, name="log-target")]


def _bce_with_logits():
    return _int_reductions((T((3, 4)), T((3, 4), "prob")), (None, None)) + [
        Sample((T((3, 4)), T((3, 4), "prob"), weights((3, 4)), weights((4,)), 2), name="weights")]


def _poisson_nll_loss():
    target = T((3, 4), "positive", 0.0, 4.0)
    return [Sample((T((3, 4)), target, True, False, 1e-8, r), name=f"reduction{r}") for r in (0, 1, 2)] + [
        Sample((T((3, 4), "positive"), target, False, True, 1e-8, 1), name="probabilities-full")]


def _triplet_margin_loss():
    a, p, n = T((4, 5)), T((4, 5)), T((4, 5))
    return _int_reductions((a, p, n), (1.0, 2.0, 1e-6, False)) + [
        Sample((a, p, n, 0.5, 1.0, 1e-6, True, 1), name="swap-p1")]


def _ctc_loss():
    lengths = Fixed
    return [Sample((T((6, 3, 5), "float", -3.0, 0.0), indices((3, 4), 4), lengths([6, 5, 4]), lengths([3, 4, 2]), 4,
                    r), name=f"padded-{name}") for r, name in enumerate(("none", "mean", "sum"))] + [
        Sample((T((5, 2, 4), "float", -3.0, 0.0), Fixed([[1, 1, 2], [3, 3, 3]]), lengths([5, 3]), lengths([3, 3]),
                0, 1, True), name="zero-infinity")]


def _constant_pad_nd():
    return [Sample((T((2, 3)), [1, 2])), Sample((T((2, 3, 4)), [1, 0, 2, 1], 2.5), name="value"),
            Sample((T((2, 3)), [1, -1]), name="negative")]


def _convolution():
    return [Sample((T((2, 3, 7)), T((4, 3, 3)), T((4,)), [1], [1], [1], False, [0], 1), name="1d"),
            Sample((T((1, 4, 6, 5)), T((6, 2, 3, 2)), None, [2, 1], [1, 0], [1, 2], False, [0, 0], 2), name="2d"),
            Sample((T((1, 2, 4, 4, 3)), T((2, 2, 2, 2, 2)), T((2,)), [1, 1, 1], [0, 1, 0], [1, 1, 1], False,
                    [0, 0, 0], 1), name="3d"),
            Sample((T((2, 4, 5)), T((4, 3, 3)), T((3,)), [2], [1], [1], True, [1], 1), name="transposed-1d"),
            Sample((T((1, 4, 3, 4)), T((4, 1, 3, 3)), None, [2, 2], [0, 1], [1, 1], True, [1, 0], 2),
                   name="transposed-2d")]


def _grid_sampler(spatial):
    def samples():
        if spatial == 2:
            image, grid = T((2, 3, 4, 5)), T((2, 6, 7, 2), "float", -1.3, 1.3)
        else:
            image, grid = T((2, 2, 3, 4, 5)), T((2, 3, 4, 2, 3), "float", -1.3, 1.3)
        out = [Sample((image, grid, 0, 0, False)), Sample((image, grid, 0, 1, True), name="border-align"),
               Sample((image, grid, 0, 2, False), name="reflection")]
        if spatial == 2:
            out.append(Sample((image, grid, 2, 0, True), name="bicubic"))
        return out

    return samples


def _norm_except_dim():
    return [Sample((T((3, 4, 5)),)), Sample((T((3, 4, 5)), 2, 1), name="dim1"),
            Sample((T((3, 4, 5)), 3, 2), name="last-p3"), Sample((T((3, 4)), 2, -1), name="whole"),
            Sample((T((5,)), 2, 0), name="1d")]


OPINFOS = [
    OpInfo("alpha_dropout", _deterministic((3, 4))),
    OpInfo("feature_alpha_dropout", _deterministic((2, 3, 4))),
    OpInfo("feature_dropout", _deterministic((2, 3, 4))),
    OpInfo("rrelu", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 0.1, 0.3), name="bounds"),
                             Sample((T((3, 4)), 0.2, 0.2, True), name="training-fixed-slope")]),
    OpInfo("batch_norm", _batch_norm),
    OpInfo("instance_norm", _instance_norm),
    OpInfo("embedding", _embedding),
    OpInfo("kl_div", _kl_div),
    OpInfo("binary_cross_entropy_with_logits", _bce_with_logits),
    OpInfo("cosine_embedding_loss", lambda: _int_reductions((T((4, 5)), T((4, 5)), signs((4,))), (0.3,))),
    OpInfo("margin_ranking_loss", lambda: _int_reductions((T((6,)), T((6,)), signs((6,))), (0.4,))),
    OpInfo("hinge_embedding_loss", lambda: _int_reductions((T((3, 4)), signs((3, 4))), (0.5,))),
    OpInfo("poisson_nll_loss", _poisson_nll_loss),
    OpInfo("triplet_margin_loss", _triplet_margin_loss),
    FixedArgsOpInfo("ctc_loss", _ctc_loss, dtypes=("float64",)),
    OpInfo("constant_pad_nd", _constant_pad_nd),
    OpInfo("convolution", _convolution),
    OpInfo("affine_grid_generator", lambda: [Sample((T((2, 2, 3)), (2, 3, 4, 5), False)),
                                             Sample((T((1, 3, 4)), (1, 1, 2, 3, 4), True), name="3d-align")]),
    OpInfo("grid_sampler", _grid_sampler(2)),
    OpInfo("grid_sampler_2d", _grid_sampler(2)),
    OpInfo("grid_sampler_3d", _grid_sampler(3)),
    OpInfo("norm_except_dim", _norm_except_dim),
]


def _cell(gates):
    def samples():
        out = [Sample((T((3, 4)), T((3, 5)), T((gates * 5, 4)), T((gates * 5, 5)), T((gates * 5,)), T((gates * 5,)))),
               Sample((T((2, 4)), T((2, 5)), T((gates * 5, 4)), T((gates * 5, 5))), name="no-bias")]
        if gates == 4:  # the LSTM's state is [h, c]
            out = [Sample((s.args[0], [s.args[1], T(s.args[1].shape)], *s.args[2:]), name=s.name) for s in out]
        return out

    return samples


OPINFOS += [
    OpInfo("lstm_cell", _cell(4)),
    OpInfo("gru_cell", _cell(3)),
    OpInfo("rnn_tanh_cell", _cell(1)),
    OpInfo("rnn_relu_cell", _cell(1)),
]
