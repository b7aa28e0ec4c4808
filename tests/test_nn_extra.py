"""The margin, likelihood, triplet and CTC losses, the extra activations and layers of tilewise.nn against torch.nn
(same weights, same inputs: outputs and gradients), torch's errors for bad arguments, and the distributions of
the random ones (rrelu, alpha dropout, Gumbel-softmax), whose draws differ from torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F  # noqa: N812 — torch's spelling


def _close(ours, theirs, rtol=1e-5, atol=1e-6, what=""):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy(), dtype=np.float64),
                               theirs.detach().numpy().astype(np.float64), rtol=rtol, atol=atol, err_msg=what,
                               equal_nan=True)


def _floats(shape, seed=0, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _ints(shape, high, seed=0, low=0):
    return np.random.default_rng(seed).integers(low, high, size=shape)


def _signs(shape, seed=0):
    return np.where(_floats(shape, seed) > 0, 1.0, -1.0).astype(np.float32)


# ---------------------------------------------------------------------------- loss modules

def _multilabel():
    return np.array([[3, 0, -1, 1], [1, 1, 2, -1], [-1, 0, 1, 2], [0, 1, 2, 3], [2, -1, -1, 0], [1, -1, 3, 3]])


# name -> (module factory, float inputs (with gradients), other inputs)
LOSSES = {
    "CosineEmbeddingLoss": (lambda nn: nn.CosineEmbeddingLoss(0.2), [(6, 4), (6, 4)], [_signs((6,))]),
    "HingeEmbeddingLoss-sum": (lambda nn: nn.HingeEmbeddingLoss(0.5, reduction="sum"), [(6, 4)], [_signs((6, 4))]),
    "MarginRankingLoss": (lambda nn: nn.MarginRankingLoss(0.1), [(6,), (6,)], [_signs((6,))]),
    "SoftMarginLoss-none": (lambda nn: nn.SoftMarginLoss(reduction="none"), [(6, 4)], [_signs((6, 4))]),
    "MultiMarginLoss": (lambda nn: nn.MultiMarginLoss(p=2, margin=0.8), [(6, 4)], [_ints((6,), 4)]),
    "MultiLabelMarginLoss": (lambda nn: nn.MultiLabelMarginLoss(), [(6, 4)], [_multilabel()]),
    "MultiLabelSoftMarginLoss": (lambda nn: nn.MultiLabelSoftMarginLoss(), [(6, 4)],
                                 [_ints((6, 4), 2).astype(np.float32)]),
    "PoissonNLLLoss-full": (lambda nn: nn.PoissonNLLLoss(full=True), [(6, 4)], [_floats((6, 4), 1, 0.0, 4.0)]),
    "GaussianNLLLoss": (lambda nn: nn.GaussianNLLLoss(full=True), [(6, 4), (6, 4)], [_floats((6, 1), 2, 0.1, 2.0)]),
    "TripletMarginLoss-swap": (lambda nn: nn.TripletMarginLoss(margin=0.5, p=1.0, swap=True), [(6, 4)] * 3, []),
    "TripletMarginWithDistanceLoss": (lambda nn: nn.TripletMarginWithDistanceLoss(margin=2.0), [(6, 4)] * 3, []),
    "NLLLoss2d": (lambda nn: nn.NLLLoss2d(), [(2, 4, 3, 3)], [_ints((2, 3, 3), 4)]),
}


@pytest.mark.filterwarnings("ignore:`NLLLoss2d` has been deprecated")
@pytest.mark.parametrize("name", LOSSES)
def test_loss_module_matches_torch(name):
    make, float_shapes, others = LOSSES[name]
    arrays = [_floats(s, seed=k) for k, s in enumerate(float_shapes)]
    ours = [tw.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = make(tw.nn)(*ours, *[tw.tensor(o) for o in others])
    ref = make(torch.nn)(*theirs, *[torch.tensor(o) for o in others])
    _close(out, ref, what="loss")
    grad = _floats(tuple(ref.shape), seed=7)
    out.backward(tw.tensor(grad))
    ref.backward(torch.tensor(grad))
    for k, (a, b) in enumerate(zip(ours, theirs)):
        _close(a.grad, b.grad, rtol=1e-4, atol=1e-5, what=f"grad of input {k}")


def test_multi_margin_loss_module_keeps_its_weight_as_a_buffer():
    weight = _floats((4,), 3, 0.5, 2.0)
    ours = tw.nn.MultiMarginLoss(weight=tw.tensor(weight))
    ref = torch.nn.MultiMarginLoss(weight=torch.tensor(weight))
    x, target = _floats((5, 4)), _ints((5,), 4)
    _close(ours(tw.tensor(x), tw.tensor(target)), ref(torch.tensor(x), torch.tensor(target)))
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]


def _ctc_case(seed, steps=12, batch=4, classes=6, longest=5):
    rng = np.random.default_rng(seed)
    log_probs = rng.standard_normal((steps, batch, classes)).astype(np.float32)
    log_probs = log_probs - np.log(np.exp(log_probs).sum(2, keepdims=True))
    targets = rng.integers(1, classes, size=(batch, longest))
    input_lengths = rng.integers(steps // 2, steps + 1, size=batch)
    target_lengths = rng.integers(0, longest + 1, size=batch)
    return log_probs, targets, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_module_matches_torch_through_log_softmax(reduction, zero_infinity):
    """The loss and the gradient of the logits (through log_softmax, as CTC is trained)."""
    log_probs, targets, input_lengths, target_lengths = _ctc_case(0)
    logits_ours = tw.tensor(log_probs, requires_grad=True)
    logits_ref = torch.tensor(log_probs, requires_grad=True)
    args = (targets, input_lengths, target_lengths)
    out = tw.nn.CTCLoss(blank=0, reduction=reduction, zero_infinity=zero_infinity)(
        logits_ours.log_softmax(2), *[tw.tensor(a) for a in args])
    ref = torch.nn.CTCLoss(blank=0, reduction=reduction, zero_infinity=zero_infinity)(
        logits_ref.log_softmax(2), *[torch.tensor(a) for a in args])
    _close(out, ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    _close(logits_ours.grad, logits_ref.grad, rtol=1e-4, atol=1e-5)


def test_ctc_loss_takes_concatenated_targets_and_length_lists():
    log_probs, targets, input_lengths, target_lengths = _ctc_case(1)
    flat = np.concatenate([t[:n] for t, n in zip(targets, target_lengths)])
    ours = F.ctc_loss(tw.tensor(log_probs), tw.tensor(flat), input_lengths.tolist(), target_lengths.tolist(),
                      reduction="none")
    ref = torch.nn.functional.ctc_loss(torch.tensor(log_probs), torch.tensor(flat), input_lengths.tolist(),
                                       target_lengths.tolist(), reduction="none")
    _close(ours, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- layers

LAYERS = {
    "RReLU-eval": (lambda nn: nn.RReLU(0.1, 0.4).eval(), [(3, 4)]),
    "AlphaDropout-eval": (lambda nn: nn.AlphaDropout(0.3).eval(), [(3, 4)]),
    "FeatureAlphaDropout-eval": (lambda nn: nn.FeatureAlphaDropout(0.3).eval(), [(2, 3, 4)]),
    "PairwiseDistance": (lambda nn: nn.PairwiseDistance(p=1.5, keepdim=True), [(3, 4), (3, 4)]),
    "LocalResponseNorm": (lambda nn: nn.LocalResponseNorm(3, alpha=0.1), [(2, 5, 3, 3)]),
    "CrossMapLRN2d": (lambda nn: nn.CrossMapLRN2d(3, alpha=0.1), [(2, 4, 3, 3)]),
    "ChannelShuffle": (lambda nn: nn.ChannelShuffle(2), [(2, 4, 3)]),
    "PReLU-per-channel": (lambda nn: nn.PReLU(3, 0.2), [(2, 3, 4)]),
    "Bilinear": (lambda nn: nn.Bilinear(3, 4, 2), [(5, 3), (5, 4)]),
    "Softmin": (lambda nn: nn.Softmin(1), [(3, 4)]),
}


def _matches_torch(layer, ref, arrays, what=""):
    ours_in = [tw.tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]
    out, ref_out = layer(*ours_in), ref(*theirs_in)
    _close(out, ref_out, what=f"{what} output")
    grad = _floats(tuple(ref_out.shape), seed=99)
    out.backward(tw.tensor(grad))
    ref_out.backward(torch.tensor(grad))
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        if b.grad is not None:
            _close(a.grad, b.grad, rtol=1e-4, atol=1e-5, what=f"{what} grad of input {k}")
    ours = dict(layer.named_parameters())
    for name, p in ref.named_parameters():
        _close(ours[name].grad, p.grad, rtol=1e-4, atol=1e-5, what=f"{what} grad of {name}")


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_torch(name):
    make, shapes = LAYERS[name]
    torch.manual_seed(0)
    ref = make(torch.nn)
    layer = make(tw.nn)
    layer.train(ref.training)
    layer.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
    _matches_torch(layer, ref, [_floats(s, seed=k) for k, s in enumerate(shapes)])
    assert repr(layer) == repr(ref)


def test_cross_map_lrn2d_keeps_torchs_window_on_many_channels():
    """torch's running window never drops channel 0, and its backward sums over a window of its own: both kept."""
    for size in (2, 3, 5):  # torch's backward fails for size 1
        ours, ref = tw.nn.CrossMapLRN2d(size, 0.5, 0.6), torch.nn.CrossMapLRN2d(size, 0.5, 0.6)
        _matches_torch(ours, ref, [_floats((2, 9, 2, 2))], what=f"size {size}")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_module_matches_torch(mode, padding_idx):
    torch.manual_seed(0)
    ref = torch.nn.EmbeddingBag(8, 3, mode=mode, padding_idx=padding_idx)
    ours = tw.nn.EmbeddingBag(8, 3, mode=mode, padding_idx=padding_idx)
    ours.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
    indices, offsets = _ints((11,), 8, seed=3), np.array([0, 2, 2, 7])
    out = ours(tw.tensor(indices), tw.tensor(offsets))
    expected = ref(torch.tensor(indices), torch.tensor(offsets))
    _close(out, expected)
    grad = _floats(tuple(expected.shape), seed=5)
    out.backward(tw.tensor(grad))
    expected.backward(torch.tensor(grad))
    _close(ours.weight.grad, ref.weight.grad)
    assert repr(ours) == repr(ref)


def test_embedding_bag_from_pretrained_and_per_sample_weights():
    weight = _floats((6, 3))
    ours = tw.nn.EmbeddingBag.from_pretrained(tw.tensor(weight), mode="sum")
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(weight), mode="sum")
    assert not ours.weight.requires_grad
    indices, offsets, per_sample = _ints((7,), 6), np.array([0, 3]), _floats((7,), 2)
    _close(ours(tw.tensor(indices), tw.tensor(offsets), tw.tensor(per_sample)),
           ref(torch.tensor(indices), torch.tensor(offsets), torch.tensor(per_sample)))


def test_adaptive_log_softmax_matches_torch():
    torch.manual_seed(0)
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(8, 12, [3, 7], div_value=2.0, head_bias=True)
    ours = tw.nn.AdaptiveLogSoftmaxWithLoss(8, 12, [3, 7], div_value=2.0, head_bias=True)
    ours.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
    x, target = _floats((9, 8)), _ints((9,), 12, seed=1)
    out, ref_out = ours(tw.tensor(x), tw.tensor(target)), ref(torch.tensor(x), torch.tensor(target))
    _close(out.output, ref_out.output)
    _close(out.loss, ref_out.loss)
    out.loss.backward()
    ref_out.loss.backward()
    ours_params = dict(ours.named_parameters())
    for name, p in ref.named_parameters():
        _close(ours_params[name].grad, p.grad, rtol=1e-4, atol=1e-6, what=name)
    _close(ours.log_prob(tw.tensor(x)), ref.log_prob(torch.tensor(x)))
    assert ours.predict(tw.tensor(x)).tolist() == ref.predict(torch.tensor(x)).tolist()
    single = ours(tw.tensor(x[0]), tw.tensor(target[0]))
    assert single.output.shape == ()
    with pytest.raises(RuntimeError, match="Target values should be in"):
        ours(tw.tensor(x), tw.tensor(np.full(9, 12)))
    with pytest.raises(ValueError, match="cutoffs should be a sequence"):
        tw.nn.AdaptiveLogSoftmaxWithLoss(8, 12, [7, 3])


# ---------------------------------------------------------------------------- in-place activations

@pytest.mark.parametrize("name,args", [("relu", ()), ("elu", (0.5,)), ("leaky_relu", (0.2,)),
                                       ("hardtanh", (-0.5, 0.5)), ("threshold", (0.1, -1.0)), ("celu", (0.7,)),
                                       ("selu", ())])
def test_inplace_activations_write_into_their_input(name, args):
    x = _floats((3, 4))
    ours, ref = tw.tensor(x), torch.tensor(x)
    out = getattr(F, name)(ours, *args, inplace=True)
    assert out is ours
    getattr(torch.nn.functional, name)(ref, *args, True)
    _close(ours, ref)
    again = tw.tensor(x)
    assert getattr(F, f"{name}_")(again, *args) is again
    _close(again, ref)
    untouched = tw.tensor(x)
    getattr(F, name)(untouched, *args)
    _close(untouched, torch.tensor(x))


# ---------------------------------------------------------------------------- errors

ERRORS = [
    ("multi_margin_loss", lambda m: ((m.zeros(3, 4), m.tensor([0, 1, 4])), {})),
    ("multi_margin_loss", lambda m: ((m.zeros(3, 4), m.tensor([0, 1])), {})),
    ("multi_margin_loss", lambda m: ((m.zeros(3, 4), m.tensor([0, 1, 1])), {"p": 3})),
    ("multi_margin_loss", lambda m: ((m.zeros(3, 0), m.tensor([0, 0, 0])), {})),
    ("multilabel_margin_loss", lambda m: ((m.zeros(3, 4), m.tensor([[0, 1, 5, 2]] * 3)), {})),
    ("multilabel_margin_loss", lambda m: ((m.zeros(3, 4), m.tensor([[0, 1, 2]] * 3)), {})),
    ("cosine_embedding_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), m.ones(1, 3)), {})),
    ("cosine_embedding_loss", lambda m: ((m.zeros(4), m.zeros(4), m.ones(3)), {})),
    ("margin_ranking_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), m.ones(4)), {})),
    ("gaussian_nll_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), m.ones(4)), {})),
    ("gaussian_nll_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), -m.ones(3, 4)), {})),
    ("triplet_margin_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), m.zeros(4)), {})),
    ("triplet_margin_loss", lambda m: ((m.zeros(3, 4), m.zeros(3, 4), m.zeros(3, 4)), {"margin": 0.0})),
    ("poisson_nll_loss", lambda m: ((m.zeros(3), m.zeros(3)), {"reduction": "average"})),
    ("pdist", lambda m: ((m.zeros(4),), {})),
    ("pdist", lambda m: ((m.zeros(3, 4),), {"p": -1.0})),
    ("ctc_loss", lambda m: ((m.zeros(5, 2, 4), m.ones(2, 3, dtype=m.long), m.tensor([5, 5]), m.tensor([3, 3])),
                            {"blank": 4})),
    ("ctc_loss", lambda m: ((m.zeros(5, 2, 4), m.ones(2, 3, dtype=m.long), m.tensor([6, 5]), m.tensor([3, 3])), {})),
    ("ctc_loss", lambda m: ((m.zeros(5, 2, 4), m.ones(2, 3, dtype=m.long), m.tensor([5]), m.tensor([3, 3])), {})),
    ("ctc_loss", lambda m: ((m.zeros(5, 2, 4), m.ones(2, 3, dtype=m.long), m.tensor([5, 5]), m.tensor([4, 3])), {})),
    ("glu", lambda m: ((m.zeros(3, 5),), {})),
    ("softshrink", lambda m: ((m.zeros(3),), {"lambd": -1.0})),
    ("rrelu", lambda m: ((m.zeros(3), 0.5, 0.2), {})),
    ("prelu", lambda m: ((m.zeros(3, 4), m.ones(3)), {})),
    ("channel_shuffle", lambda m: ((m.zeros(2, 4, 3), 3), {})),
    ("channel_shuffle", lambda m: ((m.zeros(2, 4), 2), {})),
    ("bilinear", lambda m: ((m.zeros(3, 4), m.zeros(2, 4), m.zeros(5, 4, 4)), {})),
    ("bilinear", lambda m: ((m.zeros(3, 4, dtype=m.float64), m.zeros(3, 4), m.zeros(5, 4, 4)), {})),
    ("local_response_norm", lambda m: ((m.zeros(3, 4), 2), {})),
    ("alpha_dropout", lambda m: ((m.zeros(3), 1.5), {})),
    ("feature_alpha_dropout", lambda m: ((m.zeros(3), 0.5, True), {})),
    ("embedding_bag", lambda m: ((m.tensor([1, 2]), m.zeros(4, 2), m.tensor([1])), {})),
    ("embedding_bag", lambda m: ((m.tensor([1, 2]), m.zeros(4, 2)), {})),
    ("embedding_bag", lambda m: ((m.tensor([1, 2]), m.zeros(4, 2), m.tensor([0])), {"mode": "median"})),
    ("embedding_bag", lambda m: ((m.tensor([1, 2]), m.zeros(4, 2), m.tensor([0])),
                                 {"mode": "mean", "per_sample_weights": m.ones(2)})),
]


@pytest.mark.parametrize("name,make", ERRORS, ids=[f"{n}-{k}" for k, (n, _) in enumerate(ERRORS)])
def test_bad_arguments_raise_torchs_error(name, make):
    args, kwargs = make(torch)
    with pytest.raises(Exception) as expected:
        getattr(torch.nn.functional, name)(*args, **kwargs)
    args, kwargs = make(tw)
    with pytest.raises(expected.type) as raised:
        getattr(F, name)(*args, **kwargs)
    first_words = " ".join(str(expected.value).replace("'", "").split()[:3])
    assert first_words in str(raised.value).replace("'", ""), f"torch: {expected.value!s}; tilewise: {raised.value!s}"


# ---------------------------------------------------------------------------- random operators

def test_rrelu_training_draws_slopes_between_its_bounds():
    tw.manual_seed(0)
    x = tw.tensor(np.concatenate([-np.ones(20000), np.ones(100)]).astype(np.float32), requires_grad=True)
    out = F.rrelu(x, 0.1, 0.3, training=True)
    slopes = -out.detach().numpy()[:20000]
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3
    assert abs(slopes.mean() - 0.2) < 0.005 and abs(slopes.std() - 0.2 / np.sqrt(12)) < 0.005
    np.testing.assert_array_equal(out.detach().numpy()[20000:], 1.0)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy()[:20000], slopes, rtol=1e-6)
    np.testing.assert_array_equal(x.grad.numpy()[20000:], 1.0)


def test_rrelu_module_is_random_only_while_training():
    layer = tw.nn.RReLU(0.1, 0.3)
    x = tw.tensor(-np.ones(1000, dtype=np.float32))
    assert len(set(layer(x).tolist())) > 100
    layer.eval()
    np.testing.assert_allclose(layer(x).numpy(), -0.2, rtol=1e-6)


def test_alpha_dropout_keeps_zero_mean_and_unit_variance():
    tw.manual_seed(0)
    x = tw.tensor(np.random.default_rng(0).standard_normal(200000).astype(np.float32))
    out = F.alpha_dropout(x, 0.2, training=True).numpy()
    assert abs(out.mean()) < 0.01 and abs(out.std() - 1) < 0.01
    alpha, p = 1.7580993408473766, 0.2
    a = 1 / np.sqrt((alpha ** 2 * p + 1) * (1 - p))
    dropped = np.isclose(out, -alpha * a * (1 - p))
    assert abs(dropped.mean() - p) < 0.005
    np.testing.assert_allclose(out[~dropped], x.numpy()[~dropped] * a + alpha * a * p, rtol=1e-5, atol=1e-6)


def test_feature_alpha_dropout_drops_whole_channels():
    tw.manual_seed(0)
    out = F.feature_alpha_dropout(tw.ones(64, 16, 5), 0.5, training=True).numpy()
    assert np.all(out == out[:, :, :1])
    assert 0.3 < np.isclose(out[:, :, 0], out.min()).mean() < 0.7


def test_gumbel_softmax_samples_follow_the_softmax():
    tw.manual_seed(0)
    logits = np.log(np.array([0.1, 0.2, 0.7], dtype=np.float32))
    draws = F.gumbel_softmax(tw.tensor(np.tile(logits, (20000, 1))), tau=0.5, hard=True)
    counts = draws.numpy().sum(0) / 20000
    np.testing.assert_allclose(counts, [0.1, 0.2, 0.7], atol=0.015)
    np.testing.assert_array_equal(draws.numpy().sum(1), 1.0)


def test_gumbel_softmax_hard_passes_the_soft_gradient():
    logits = tw.tensor(_floats((4, 5)), requires_grad=True)
    weights = tw.tensor(_floats((4, 5), seed=1))
    tw.manual_seed(3)
    (F.gumbel_softmax(logits, tau=0.7, hard=True) * weights).sum().backward()
    hard_grad = logits.grad.numpy().copy()
    logits.grad = None
    tw.manual_seed(3)
    soft = F.gumbel_softmax(logits, tau=0.7)
    (soft * weights).sum().backward()
    np.testing.assert_allclose(hard_grad, logits.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(soft.detach().numpy().sum(-1), 1.0, rtol=1e-6)


# ---------------------------------------------------------------------------- linear_cross_entropy

LINEAR_CROSS_ENTROPY = {
    "classes": ((6, 5), (4, 5), "class", {}),
    "bias-weight-smoothing-ignore": ((6, 5), (4, 5), "class", {"bias": True, "weight": True, "label_smoothing": 0.2,
                                                               "ignore_index": 2, "reduction": "sum"}),
    "k-dimensional": ((6, 5), (4, 3, 5), "class-k", {"bias": True, "reduction": "none"}),
    "probabilities": ((6, 5), (4, 5), "prob", {}),
    "unbatched": ((5,), (4, 5), "class", {"options": True}),
}


@pytest.mark.parametrize("name", LINEAR_CROSS_ENTROPY)
def test_linear_cross_entropy_matches_torch(name):
    input_shape, weight_shape, target_kind, options = LINEAR_CROSS_ENTROPY[name]
    batch = input_shape[:-1]
    target = {"class": _ints(batch, 4, seed=2), "class-k": _ints(batch + (3,), 4, seed=2),
              "prob": _floats(batch + (4,), seed=2, low=0.0, high=1.0)}[target_kind]
    arrays = {"input": _floats(input_shape), "linear_weight": _floats(weight_shape, seed=1)}
    if options.get("bias"):
        arrays["linear_bias"] = _floats(weight_shape[:-1], seed=3)
    results = []
    for lib, functional in ((tw, F), (torch, torch.nn.functional)):
        tensors = {k: lib.tensor(v, requires_grad=True) for k, v in arrays.items()}
        kwargs = {k: v for k, v in options.items() if k not in ("bias", "weight", "options")}
        if options.get("weight"):
            kwargs["weight"] = lib.tensor(_floats((4,), seed=4, low=0.5, high=2.0))
        if options.get("options"):
            kwargs["options"] = lib.nn.LinearCrossEntropyOptions()
        linear_bias = tensors.get("linear_bias")
        loss = functional.linear_cross_entropy(tensors["input"], tensors["linear_weight"], lib.tensor(target),
                                               linear_bias=linear_bias, **kwargs)
        loss.sum().backward()
        results.append((loss, {k: t.grad for k, t in tensors.items()}))
    (ours, ours_grads), (ref, ref_grads) = results
    _close(ours, ref, rtol=1e-5, atol=1e-6)
    for k in ref_grads:
        _close(ours_grads[k], ref_grads[k], rtol=1e-4, atol=1e-6, what=k)


def test_linear_cross_entropy_checks_like_torch():
    for lib, functional in ((torch, torch.nn.functional), (tw, F)):
        with pytest.raises(RuntimeError, match="expected equal input and linear_weight last dimensions"):
            functional.linear_cross_entropy(lib.zeros(2, 3), lib.zeros(4, 5), lib.tensor([0, 1]))
        with pytest.raises(RuntimeError, match="ignore_index cannot be specified"):
            functional.linear_cross_entropy(lib.zeros(2, 3), lib.zeros(4, 3), lib.zeros(2, 4), ignore_index=1)
        with pytest.raises(RuntimeError, match="requires batched input"):
            functional.linear_cross_entropy(lib.zeros(3), lib.zeros(4, 2, 3), lib.tensor(0))


@pytest.mark.parametrize("make", [lambda nn: nn.ReLU(inplace=True), lambda nn: nn.LeakyReLU(0.2, inplace=True),
                                  lambda nn: nn.ELU(0.5, inplace=True), lambda nn: nn.Hardtanh(-0.5, 0.5, True),
                                  lambda nn: nn.Threshold(0.1, 2.0, True), lambda nn: nn.SiLU(inplace=True),
                                  lambda nn: nn.RReLU(inplace=True).eval()])
def test_inplace_activation_modules_write_into_their_input_as_torch(make):
    x = _floats((3, 4))
    ours, ref = tw.tensor(x), torch.tensor(x)
    assert make(tw.nn)(ours) is ours
    make(torch.nn)(ref)
    _close(ours, ref)


# ---------------------------------------------------------------------------- multi_head_attention_forward

MHA_CASES = {
    "packed-weights": {},
    "packed-average-off": {"need_weights": True, "average_attn_weights": False},
    "sdpa-path-masks": {"need_weights": False, "attn_mask": "float2d", "key_padding_mask": True},
    "bool-3d-mask-bias-kv-zero-attn": {"attn_mask": "bool3d", "bias_kv": True, "add_zero_attn": True,
                                       "key_padding_mask": True},
    "separate-weights-kdim": {"separate": True},
    "static-kv": {"static": True, "need_weights": False},
    "unbatched": {"unbatched": True},
    "causal": {"attn_mask": "causal", "is_causal": True, "need_weights": False},
}


def _mha_arguments(lib, case, embed=8, heads=2, tgt=4, src=5, batch=3):
    def t(shape, seed, **kw):
        return lib.tensor(_floats(shape, seed=seed, low=-1, high=1), **kw)

    kdim = 6 if case.get("separate") else embed
    query = t((tgt, batch, embed), 0, requires_grad=True)
    key = t((src, batch, kdim), 1, requires_grad=True)
    value = t((src, batch, kdim), 2, requires_grad=True)
    weights = {"in_proj_weight": None if case.get("separate") else t((3 * embed, embed), 3, requires_grad=True),
               "in_proj_bias": t((3 * embed,), 4, requires_grad=True),
               "out_proj_weight": t((embed, embed), 5, requires_grad=True),
               "out_proj_bias": t((embed,), 6, requires_grad=True)}
    kwargs = {"need_weights": case.get("need_weights", True),
              "average_attn_weights": case.get("average_attn_weights", True)}
    if case.get("separate"):
        kwargs.update(use_separate_proj_weight=True, q_proj_weight=t((embed, embed), 7, requires_grad=True),
                      k_proj_weight=t((embed, kdim), 8, requires_grad=True),
                      v_proj_weight=t((embed, kdim), 9, requires_grad=True))
    bias_k = t((1, 1, embed), 10, requires_grad=True) if case.get("bias_kv") else None
    bias_v = t((1, 1, embed), 11, requires_grad=True) if case.get("bias_kv") else None
    if case.get("key_padding_mask"):
        kwargs["key_padding_mask"] = lib.tensor(np.array([[False] * (src - 1) + [True]] * batch))
    mask = case.get("attn_mask")
    if mask == "float2d":
        kwargs["attn_mask"] = t((tgt, src), 12)
    elif mask == "bool3d":
        kwargs["attn_mask"] = lib.tensor(_floats((batch * heads, tgt, src), seed=13) > 1.5)
    elif mask == "causal":
        kwargs["attn_mask"] = lib.tensor(np.triu(np.ones((tgt, src), dtype=bool), 1))
        kwargs["is_causal"] = True
    if case.get("static"):
        kwargs["static_k"] = t((batch * heads, src, embed // heads), 14, requires_grad=True)
        kwargs["static_v"] = t((batch * heads, src, embed // heads), 15, requires_grad=True)
    if case.get("unbatched"):
        query, key, value = (x.detach()[:, 0].requires_grad_() for x in (query, key, value))
    return (query, key, value, embed, heads, weights["in_proj_weight"], weights["in_proj_bias"], bias_k, bias_v,
            case.get("add_zero_attn", False), 0.0, weights["out_proj_weight"], weights["out_proj_bias"]), kwargs


@pytest.mark.parametrize("name", MHA_CASES)
def test_multi_head_attention_forward_matches_torch(name):
    results = []
    for lib, functional in ((tw, F), (torch, torch.nn.functional)):
        args, kwargs = _mha_arguments(lib, MHA_CASES[name])
        out, weights = functional.multi_head_attention_forward(*args, **kwargs)
        out.sum().backward()
        leaves = [a for a in (*args, *kwargs.values()) if isinstance(a, lib.Tensor) and a.requires_grad]
        results.append((out, weights, [a.grad for a in leaves]))
    (out, weights, grads), (ref, ref_weights, ref_grads) = results
    _close(out, ref, rtol=1e-4, atol=1e-5, what="output")
    assert (weights is None) == (ref_weights is None)
    if ref_weights is not None:
        _close(weights, ref_weights, rtol=1e-4, atol=1e-5, what="weights")
    for k, (a, b) in enumerate(zip(grads, ref_grads)):
        if b is None:  # an input the result does not depend on (key and value beside static ones)
            assert a is None or not a.numpy().any(), f"grad {k}: torch has none"
            continue
        _close(a, b, rtol=1e-4, atol=1e-5, what=f"grad {k}")
