"""Samples for tilewise.nn.functional's margin, embedding, likelihood, triplet and CTC losses, distances, the
shrinkage and gating activations, prelu, bilinear, local response normalization, channel shuffle and
embedding_bag (compared with torch.nn.functional, forward and gradients).

Random operators (rrelu while training, alpha dropout, gumbel_softmax) are compared here only on their
deterministic paths (evaluation, p = 0); their distributions are tested in test_nn_extra.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from opinfo import OpInfo, Sample, T


@dataclass
class Fixed:
    """An integer tensor given by value (class lists, lengths, offsets: what random draws would rarely make)."""

    value: object


def signs(shape):
    """Targets of -1 and 1 (and no gradient), as the embedding and ranking losses take."""
    return T(shape, "ties", -1, 1, grad=False)


def indices(shape, high):
    return T(shape, "index", high=high)


def weights(shape):
    return T(shape, "positive", 0.2, 2.0, grad=False)


REDUCTIONS = ({}, {"reduction": "sum"}, {"reduction": "none"})


def _with_reductions(args, name=""):
    return [Sample(args, dict(r), name=f"{name}{r.get('reduction', 'mean')}") for r in REDUCTIONS]


def _cosine_embedding_loss():
    return _with_reductions((T((4, 5)), T((4, 5)), signs((4,)))) + [
        Sample((T((4, 5)), T((4, 5)), signs((4,))), {"margin": 0.3}, name="margin"),
        Sample((T((5,)), T((5,)), signs(())), {"reduction": "none"}, name="unbatched")]


def _hinge_embedding_loss():
    return _with_reductions((T((3, 4)), signs((3, 4)))) + [
        Sample((T((3, 4)), signs((4,))), {"margin": 0.5}, name="broadcast-margin")]


def _margin_ranking_loss():
    return _with_reductions((T((6,)), T((6,)), signs((6,)))) + [
        Sample((T((6,)), T((6,)), signs((6,))), {"margin": 0.4}, name="margin")]


def _soft_margin_loss():
    return _with_reductions((T((3, 4)), signs((3, 4))))


def _multi_margin_loss():
    n, c = 5, 4
    return _with_reductions((T((n, c)), indices((n,), c))) + [
        Sample((T((n, c)), indices((n,), c)), {"p": 2, "margin": 0.7}, name="p2"),
        Sample((T((n, c)), indices((n,), c)), {"weight": weights((c,)), "reduction": "none"}, name="weight"),
        Sample((T((c,)), indices((), c)), {"reduction": "none"}, name="unbatched")]


def _multilabel_targets(rows):
    """Class lists ended by -1 (a fixed sample: random lists would rarely hold an early -1)."""
    table = [[3, 0, -1, 1], [1, 1, 2, -1], [-1, 0, 1, 2], [0, 1, 2, 3], [2, -1, -1, 0]]
    return [table[k % len(table)] for k in range(rows)]


def _multilabel_margin_loss():
    return [Sample((T((5, 4)), Fixed(_multilabel_targets(5)))),
            Sample((T((5, 4)), Fixed(_multilabel_targets(5))), {"reduction": "none"}, name="none"),
            Sample((T((5, 4)), Fixed(_multilabel_targets(5))), {"reduction": "sum"}, name="sum"),
            Sample((T((4,)), Fixed([2, 0, -1, 3])), {"reduction": "none"}, name="unbatched")]




def _multilabel_soft_margin_loss():
    return _with_reductions((T((3, 4)), T((3, 4), "prob"))) + [
        Sample((T((3, 4)), T((3, 4), "prob")), {"weight": weights((4,))}, name="weight")]


def _poisson_nll_loss():
    return _with_reductions((T((3, 4)), T((3, 4), "positive", 0.0, 4.0))) + [
        Sample((T((3, 4)), T((3, 4), "positive", 0.0, 4.0)), {"full": True}, name="full"),
        Sample((T((3, 4), "positive"), T((3, 4), "positive", 0.0, 4.0)), {"log_input": False, "full": True},
               name="probabilities-full")]


def _gaussian_nll_loss():
    return _with_reductions((T((3, 4)), T((3, 4)), T((3, 4), "positive"))) + [
        Sample((T((3, 4)), T((3, 4)), T((3,), "positive")), {"full": True}, name="homoscedastic"),
        Sample((T((2, 3, 4)), T((2, 3, 4)), T((2, 1, 4), "positive")), name="broadcast-dim"),
        Sample((T((3, 4)), T((3, 4)), T((3, 4), "float", 0.0, 0.5)), {"eps": 0.2}, name="clamped")]


def _pairwise_distance():
    return [Sample((T((3, 4)), T((3, 4)))), Sample((T((3, 4)), T((4,)), 1.0), name="p1-broadcast"),
            Sample((T((2, 3, 4)), T((2, 3, 4)), 3.0, 1e-3, True), name="p3-keepdim"),
            Sample((T((3, 4)), T((3, 4)), float("inf")), name="inf")]


def _pdist():
    return [Sample((T((5, 3)),)), Sample((T((4, 3)), 1.0), name="p1"), Sample((T((4, 2)), 3.0), name="p3"),
            Sample((T((1, 3)),), name="one-row")]


def _triplet_margin_loss():
    a, p, n = T((4, 5)), T((4, 5)), T((4, 5))
    return _with_reductions((a, p, n)) + [
        Sample((a, p, n), {"margin": 0.5, "p": 1.0, "swap": True}, name="swap-p1"),
        Sample((T((5,)), T((5,)), T((5,))), {"reduction": "none"}, name="unbatched")]


def _triplet_margin_with_distance_loss():
    a, p, n = T((4, 5)), T((4, 5)), T((4, 5))
    return [Sample((a, p, n)), Sample((a, p, n), {"swap": True, "margin": 0.5, "reduction": "none"}, name="swap"),
            Sample((a, p, n), {"distance_function": _cosine_distance, "reduction": "sum"}, name="cosine")]


def _cosine_distance(x, y):
    import tilewise as tw

    module = tw if isinstance(x, tw.Tensor) else __import__("torch")
    return 1 - module.nn.functional.cosine_similarity(x, y)


def _log_probs(steps, batch, classes):
    return T((steps, batch, classes), "float", -3.0, 0.0)


def _ctc_loss():
    lengths = Fixed
    samples = []
    for reduction in ("mean", "sum", "none"):
        samples.append(Sample((_log_probs(6, 3, 5), indices((3, 4), 4), lengths([6, 5, 4]), lengths([3, 4, 0])),
                              {"reduction": reduction, "blank": 4}, name=f"padded-{reduction}"))
    samples += [
        Sample((_log_probs(6, 3, 5), Fixed([1, 2, 2, 3, 1]), lengths([6, 6, 2]), lengths([3, 1, 1])),
               name="concatenated"),
        Sample((_log_probs(5, 2, 4), Fixed([[1, 1, 2], [3, 3, 3]]), lengths([5, 3]), lengths([3, 3])),
               {"reduction": "none"}, name="infeasible"),
        Sample((_log_probs(5, 2, 4), Fixed([[1, 1, 2], [3, 3, 3]]), lengths([5, 3]), lengths([3, 3])),
               {"zero_infinity": True}, name="zero-infinity"),
        Sample((T((5, 6), "float", -3.0, 0.0), Fixed([2, 5]), lengths(5), lengths(2)), name="unbatched")]
    return samples


def _glu():
    return [Sample((T((3, 4)),)), Sample((T((4, 3, 2)), 0), name="dim0")]


def _shrink():
    return [Sample((T((3, 4)),)), Sample((T((3, 4), "ties", -2, 2), 1.0), name="at-lambda"),
            Sample((T((3, 4), "nan", grad=False), 0.25), name="nan")]  # torch's gradient at NaN: 0 or 1 by position


def _softmin():
    return [Sample((T((3, 4)), 1)), Sample((T((3, 4)), 0), {"dtype": None}, name="dim0"),
            Sample((T(()), -1), name="0d")]


def _prelu():
    return [Sample((T((2, 3, 4)), T((3,)))), Sample((T((2, 3)), T((1,))), name="shared"),
            Sample((T((5,)), T((1,))), name="1d"), Sample((T((2, 3, 2, 2)), T((3,))), name="4d")]


def _rrelu():
    return [Sample((T((3, 4)),)), Sample((T((3, 4)), 0.1, 0.3), name="bounds"),
            Sample((T((3, 4)), 0.2, 0.2, True), name="training-fixed-slope")]


def _deterministic_dropout(shape):
    return lambda: [Sample((T(shape), 0.0, True), name="p=0"), Sample((T(shape), 0.5, False), name="eval")]


def _bilinear():
    return [Sample((T((3, 4)), T((3, 5)), T((2, 4, 5)), T((2,)))),
            Sample((T((2, 3, 4)), T((2, 3, 5)), T((6, 4, 5))), name="no-bias-3d"),
            Sample((T((4,)), T((5,)), T((2, 4, 5)), T((2,))), name="unbatched")]


def _local_response_norm():
    return [Sample((T((2, 5, 3)), 3)), Sample((T((2, 6, 3, 2)), 2, 0.1, 0.5, 2.0), name="4d-even"),
            Sample((T((1, 4, 2, 2, 3)), 5, 1e-2), name="5d-wide")]


def _channel_shuffle():
    return [Sample((T((2, 6, 3)), 3)), Sample((T((1, 4, 2, 2)), 2), name="4d")]


def _embedding_bag():
    rows = T((7, 3))
    offsets = Fixed([0, 3, 3, 6])
    bag_input = Fixed([1, 2, 4, 4, 3, 0, 6, 6])
    samples = []
    for mode in ("sum", "mean", "max"):
        samples += [Sample((bag_input, rows, offsets), {"mode": mode}, name=f"{mode}"),
                    Sample((bag_input, rows, offsets), {"mode": mode, "padding_idx": 4, "include_last_offset": True},
                           name=f"{mode}-padding-last-offset"),
                    Sample((Fixed([[1, 2, 2], [0, 6, 5]]), rows), {"mode": mode, "padding_idx": 2},
                           name=f"{mode}-2d")]
    samples += [Sample((bag_input, rows, offsets), {"mode": "sum", "per_sample_weights": T((8,))},
                       name="per-sample-weights"),
                Sample((bag_input, rows, offsets), {"scale_grad_by_freq": True}, name="freq"),
                # input past the last offset: torch's max runs the last bag to the input's end
                Sample((bag_input, rows, Fixed([0, 3, 3, 5])), {"mode": "max", "include_last_offset": True},
                       name="max-past-last-offset")]
    return samples


def _aten_embedding_bag():
    """torch.embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
    include_last_offset, padding_idx): its four results (output, offset2bag, bag_size, max_indices)."""
    rows = T((7, 3))
    offsets = Fixed([0, 3, 3, 6])
    bag_input = Fixed([1, 2, 4, 4, 3, 0, 6, 6])
    samples = []
    for mode in range(3):
        samples += [Sample((rows, bag_input, offsets, False, mode), name=f"mode{mode}"),
                    Sample((rows, bag_input, Fixed([0, 3, 3, 6, 8]), False, mode, False, None, True, 4),
                           name=f"mode{mode}-padding-last-offset")]
    samples += [Sample((rows, bag_input, offsets, False, 0, False, T((8,))), name="mode0-per-sample-weights"),
                Sample((rows, bag_input, offsets, True, 1), name="mode1-freq")]
    return samples


@dataclass
class FixedTargetsOpInfo(OpInfo):
    """An operator of nn.functional (or of the top level, ``call="function"``) whose samples hold ``Fixed`` integer
    tensors: each framework receives them as its own int64 tensor."""

    def resolve(self, module, functional):
        fn = getattr(functional if self.call == "F" else module, self.name)

        def call(*args, **kwargs):
            device = next((a.device for a in (*args, *kwargs.values()) if isinstance(a, module.Tensor)), None)

            def convert(value):
                return module.tensor(value.value, dtype=module.int64, device=device) if isinstance(value, Fixed) \
                    else value

            return fn(*[convert(a) for a in args], **{k: convert(v) for k, v in kwargs.items()})

        return call


OPINFOS = [
    OpInfo("cosine_embedding_loss", _cosine_embedding_loss, call="F"),
    OpInfo("hinge_embedding_loss", _hinge_embedding_loss, call="F"),
    OpInfo("margin_ranking_loss", _margin_ranking_loss, call="F"),
    OpInfo("soft_margin_loss", _soft_margin_loss, call="F"),
    OpInfo("multi_margin_loss", _multi_margin_loss, call="F"),
    FixedTargetsOpInfo("multilabel_margin_loss", _multilabel_margin_loss, call="F"),
    OpInfo("multilabel_soft_margin_loss", _multilabel_soft_margin_loss, call="F"),
    OpInfo("poisson_nll_loss", _poisson_nll_loss, call="F"),
    OpInfo("gaussian_nll_loss", _gaussian_nll_loss, call="F"),
    OpInfo("pairwise_distance", _pairwise_distance, call="F"),
    OpInfo("pdist", _pdist, call="F"),
    OpInfo("triplet_margin_loss", _triplet_margin_loss, call="F"),
    OpInfo("triplet_margin_with_distance_loss", _triplet_margin_with_distance_loss, call="F"),
    FixedTargetsOpInfo("ctc_loss", _ctc_loss, call="F"),
    OpInfo("glu", _glu, call="F"),
    OpInfo("hardshrink", _shrink, call="F"),
    OpInfo("softshrink", _shrink, call="F", covers=("_softshrink",)),
    OpInfo("tanhshrink", lambda: [Sample((T((3, 4), "float", -4, 4),))], call="F"),
    OpInfo("softmin", _softmin, call="F"),
    OpInfo("prelu", _prelu, call="F"),
    OpInfo("rrelu", _rrelu, call="F"),
    OpInfo("alpha_dropout", _deterministic_dropout((3, 4)), call="F"),
    OpInfo("feature_alpha_dropout", _deterministic_dropout((2, 3, 4)), call="F"),
    OpInfo("bilinear", _bilinear, call="F"),
    OpInfo("local_response_norm", _local_response_norm, call="F"),
    OpInfo("channel_shuffle", _channel_shuffle, call="F"),
    OpInfo("native_channel_shuffle", _channel_shuffle, call="F", grad=False),  # torch has no derivative for it
    FixedTargetsOpInfo("embedding_bag", _embedding_bag, call="F"),
    FixedTargetsOpInfo("embedding_bag", _aten_embedding_bag, call="function"),
]
