"""torch names added together: poisson and binomial samplers, igamma/igammac's gradients and errors, Gamma.cdf,
torch.embedding_bag's arguments, Tensor.chalf.

[Note: testing the samplers by their laws] tilewise's generator is Philox, torch's CPU generator a Mersenne twister,
so the same seed gives other samples: poisson and binomial are compared with torch on everything but the draws
(dtypes, shapes, edge values, errors, gradients) and tested by their laws: for fixed seeds, a chi-square
goodness-of-fit statistic over the exact probabilities (bins of expected count >= 20, the tail pooled) must stay
below df + 6 sqrt(2 df), and the sample mean within 6 standard errors of the law's mean. Each case covers one
branch of the samplers (product of uniforms and PTRS; inversion and BTRS, with p above and below 1/2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tilewise as tw

N = 100_000


def _chi_square(samples: np.ndarray, log_pmf, support: range) -> tuple[float, int]:
    """(statistic, degrees of freedom) with bins of expected count >= 20 and both tails pooled."""
    probs = np.array([math.exp(log_pmf(k)) for k in support])
    counts = np.array([np.count_nonzero(samples == k) for k in support], dtype=float)
    keep = probs * samples.size >= 20
    expected = np.append(probs[keep] * samples.size, samples.size * (1 - probs[keep].sum()))
    observed = np.append(counts[keep], samples.size - counts[keep].sum())
    if expected[-1] < 20:  # a negligible pooled tail: fold it into the last bin
        expected[-2] += expected[-1]
        observed[-2] += observed[-1]
        expected, observed = expected[:-1], observed[:-1]
    return float(((observed - expected) ** 2 / expected).sum()), expected.size - 1


def _fits(samples: np.ndarray, log_pmf, support: range, mean: float, variance: float) -> None:
    statistic, df = _chi_square(samples, log_pmf, support)
    assert statistic < df + 6 * math.sqrt(2 * df), (statistic, df)
    assert abs(samples.mean() - mean) < 6 * math.sqrt(variance / samples.size), (samples.mean(), mean)


@pytest.mark.parametrize("rate", [0.7, 4.0, 9.5, 10.5, 40.0, 1000.0])
def test_poisson_follows_its_law(rate):
    tw.manual_seed(11)
    samples = tw.poisson(tw.full((N,), rate, dtype=tw.float64)).numpy()
    assert np.array_equal(samples, np.floor(samples)) and samples.min() >= 0

    def log_pmf(k):
        return k * math.log(rate) - rate - math.lgamma(k + 1)

    spread = int(10 * math.sqrt(rate)) + 10
    _fits(samples, log_pmf, range(max(0, int(rate) - spread), int(rate) + spread), rate, rate)


@pytest.mark.parametrize("count, prob", [(5, 0.3), (30, 0.2), (12, 0.9), (100, 0.5), (1000, 0.85), (2000, 0.01)])
def test_binomial_follows_its_law(count, prob):
    tw.manual_seed(12)
    samples = tw.binomial(tw.full((N,), float(count)), tw.full((N,), prob)).numpy()
    assert samples.min() >= 0 and samples.max() <= count

    def log_pmf(k):
        return (math.lgamma(count + 1) - math.lgamma(k + 1) - math.lgamma(count - k + 1) + k * math.log(prob)
                + (count - k) * math.log1p(-prob))

    _fits(samples, log_pmf, range(count + 1), count * prob, count * prob * (1 - prob))


def test_samples_follow_the_seed_and_the_generator():
    rates = tw.tensor([0.5, 3.0, 25.0, 400.0] * 8)
    tw.manual_seed(3)
    first = tw.poisson(rates)
    again = tw.poisson(rates)
    tw.manual_seed(3)
    assert tw.equal(tw.poisson(rates), first) and not tw.equal(again, first)
    g = tw.Generator().manual_seed(3)
    assert tw.equal(tw.poisson(rates, generator=g), first)
    g.manual_seed(5)
    counts, probs = tw.tensor([4.0, 50.0, 300.0] * 8), tw.tensor([0.2, 0.7, 0.5] * 8)
    drawn = tw.binomial(counts, probs, g)
    g.manual_seed(5)
    assert tw.equal(tw.binomial(counts, probs, generator=g), drawn)


def _same_outcome(make):
    """Both libraries' results agree in dtype and shape (and values, for deterministic edge cases), or both raise
    the same type of error with torch's message."""
    try:
        expected = make(torch)
    except Exception as error:  # noqa: BLE001 — whatever torch raises, tilewise raises too
        with pytest.raises(type(error)) as ours:
            make(tw)
        assert str(error).split(" (")[0] in str(ours.value)
        return None
    got = make(tw)
    assert str(got.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1]
    assert tuple(got.shape) == tuple(expected.shape)
    return got, expected


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int64", "bool"])
def test_poisson_and_binomial_dtypes(dtype):
    _same_outcome(lambda lib: lib.poisson(lib.ones(2, 3, dtype=getattr(lib, dtype))))
    _same_outcome(lambda lib: lib.binomial(lib.ones(2, 3, dtype=getattr(lib, dtype)) * 3,
                                           lib.ones(2, 3, dtype=getattr(lib, dtype))))


@pytest.mark.parametrize("make", [
    lambda lib: lib.binomial(lib.ones(2), lib.ones(2, dtype=lib.float64)),
    lambda lib: lib.binomial(lib.ones(2), lib.ones(3)),
    lambda lib: lib.binomial(lib.ones(2), lib.ones(2, dtype=lib.int64)),
    lambda lib: lib.binomial(lib.ones(3), lib.full((2, 3), 0.5)),
    lambda lib: lib.poisson(lib.tensor([1.0, -1.0])),
    lambda lib: lib.poisson(lib.tensor([float("nan")])),
    lambda lib: lib.poisson(lib.empty(0, 2)),
    lambda lib: lib.poisson(lib.tensor(2.0)),
], ids=["dtypes", "shapes", "integer-prob", "broadcast", "negative-rate", "nan-rate", "empty", "0-dim"])
def test_poisson_and_binomial_arguments(make):
    _same_outcome(make)


def test_edge_values_are_torchs():
    rates = [0.0, float("inf")]
    got, expected = _same_outcome(lambda lib: lib.poisson(lib.tensor(rates)))
    assert got.tolist() == expected.tolist()
    counts = [-1.0, 2.0, 2.0, 0.0, 3.0, 3.0, 2.0]
    probs = [0.5, 1.5, -0.1, 0.5, 0.0, 1.0, float("nan")]
    got, expected = _same_outcome(lambda lib: lib.binomial(lib.tensor(counts), lib.tensor(probs)))
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_nan_count_gives_nan():
    """torch's CPU sampler never returns for a NaN count; tilewise's sample is NaN."""
    assert math.isnan(tw.binomial(tw.tensor([float("nan")]), tw.tensor([0.5])).item())


def test_poisson_gradient_is_zero_and_binomial_refuses_one():
    for lib in (torch, tw):
        rates = lib.tensor([1.0, 20.0], requires_grad=True)
        out = lib.poisson(rates)
        assert out.requires_grad and out.grad_fn.name() == "PoissonBackward0"
        out.sum().backward()
        assert rates.grad.tolist() == [0.0, 0.0]
        with lib.no_grad():
            assert not lib.poisson(rates).requires_grad
        prob = lib.tensor([0.5, 0.2], requires_grad=True)
        out = lib.binomial(lib.tensor([3.0, 4.0]), prob)
        assert out.requires_grad
        with pytest.raises(RuntimeError, match="derivative for aten::binomial is not implemented"):
            out.sum().backward()


def test_forward_mode_of_the_samplers():
    import torch.autograd.forward_ad as torch_fwad

    import tilewise.autograd.forward_ad as fwad

    for lib, ad in ((torch, torch_fwad), (tw, fwad)):
        with ad.dual_level():
            tangent = ad.unpack_dual(lib.poisson(ad.make_dual(lib.ones(2), lib.ones(2)))).tangent
            assert tangent is None or not tangent.numpy().any()
            with pytest.raises(NotImplementedError, match="forward AD with aten::binomial"):
                lib.binomial(ad.make_dual(lib.ones(2), lib.ones(2)), lib.full((2,), 0.5))


def test_samplers_under_vmap_and_compile():
    from tilewise.func import vmap

    rates = tw.full((3, 4), 5.0)
    assert vmap(tw.poisson, randomness="different")(rates).shape == (3, 4)
    assert vmap(lambda c: tw.binomial(c, tw.full((4,), 0.5)), randomness="different")(rates).shape == (3, 4)
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(tw.poisson)(rates)
    compiled = tw.compile(lambda r: tw.poisson(r) * 2)
    tw.manual_seed(4)
    got = compiled(tw.full((16,), 3.0))
    tw.manual_seed(4)
    assert tw.equal(got, tw.poisson(tw.full((16,), 3.0)) * 2)


@pytest.mark.cuda
def test_samplers_on_cuda_are_the_cpus():
    rates, probs = tw.tensor([0.5, 30.0, 400.0] * 5), tw.tensor([0.1, 0.6, 0.5] * 5)
    tw.manual_seed(9)
    cpu = tw.poisson(rates), tw.binomial(rates.floor(), probs)
    tw.manual_seed(9)
    cuda = tw.poisson(rates.cuda()), tw.binomial(rates.floor().cuda(), probs.cuda())
    assert all(c.device.type == "cuda" and tw.equal(c.cpu(), h) for c, h in zip(cuda, cpu))


# ---------------------------------------------------------------- igamma, igammac


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_igamma_gradient_for_self_is_refused_as_torch_refuses_it(name):
    for lib in (torch, tw):
        a = lib.tensor([0.5, 2.0], requires_grad=True)
        out = getattr(lib, name)(a, lib.tensor([0.3, 3.0]))
        assert out.grad_fn.name() == f"{name.capitalize()}Backward0"
        with pytest.raises(NotImplementedError, match=f"the derivative for '{name}: input' is not implemented."):
            out.sum().backward()


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_igamma_edge_values_and_errors_are_torchs(name):
    a = [0.0, -1.0, float("nan"), float("inf"), 1.0, 1.0, 0.0, 0.0, float("inf"), 1.0, 1e-3, 500.0]
    x = [1.0, 1.0, 1.0, 1.0, 0.0, float("inf"), 0.0, -1.0, 0.0, float("nan"), 1e-3, 510.0]
    for first, second in ((a, x), (x, a)):
        got, expected = _same_outcome(lambda lib, first=first, second=second: getattr(lib, name)(
            lib.tensor(first, dtype=lib.float64), lib.tensor(second, dtype=lib.float64)))
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-7, equal_nan=True)
    for dtype in ("int64", "bool"):
        _same_outcome(lambda lib, dtype=dtype: getattr(lib, name)(lib.ones(2, dtype=getattr(lib, dtype)),
                                                                  lib.ones(2, dtype=getattr(lib, dtype))))
    _same_outcome(lambda lib: getattr(lib, name)(lib.ones(2, dtype=lib.int64), lib.ones(2)))
    _same_outcome(lambda lib: getattr(lib.ones(3), f"{name}_")(lib.ones(3, dtype=lib.float64)))


def test_igamma_is_accurate_where_a_is_near_x_and_large():
    """For large a and x near a the prefactor is taken through log1p (see [Note: incomplete gamma]); the values
    agree with torch's asymptotic series to its accuracy there (a few 1e-5 relative in the tails, where tilewise's
    agree with 50-digit values to 1e-12), and P + Q = 1."""
    rng = np.random.default_rng(0)
    a = rng.uniform(1e3, 1e6, 200)
    x = a * rng.uniform(0.97, 1.03, 200)
    for name in ("igamma", "igammac"):
        expected = getattr(torch, name)(torch.tensor(a), torch.tensor(x)).numpy()
        got = getattr(tw, name)(tw.tensor(a), tw.tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=3e-5, atol=1e-12)
    total = tw.igamma(tw.tensor(a), tw.tensor(x)) + tw.igammac(tw.tensor(a), tw.tensor(x))
    np.testing.assert_allclose(total.numpy(), 1.0, rtol=1e-14)


def test_gamma_cdf_is_igamma():
    concentration, rate, value = [2.0, 3.0, 0.5], [1.0, 0.5, 2.0], [1.0, 2.0, 0.1]
    expected = torch.distributions.Gamma(torch.tensor(concentration), torch.tensor(rate)).cdf(torch.tensor(value))
    got = tw.distributions.Gamma(tw.tensor(concentration), tw.tensor(rate)).cdf(tw.tensor(value))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)


# ---------------------------------------------------------------- torch.embedding_bag


@pytest.mark.parametrize("make", [
    lambda lib, w, i, o: lib.embedding_bag(w, i, o, False, 3),
    lambda lib, w, i, o: lib.embedding_bag(w, i, o, False, -1),
    lambda lib, w, i, o: lib.embedding_bag(w, i, o, False, "sum"),
    lambda lib, w, i, o: lib.embedding_bag(w, i, o, False, 1, False, lib.ones(8)),
    lambda lib, w, i, o: lib.embedding_bag(w, i, None, False, 0),
    lambda lib, w, i, o: lib.embedding_bag(w, i, o, False, 1, False, None, False, 10),
], ids=["mode-3", "mode-negative", "mode-string", "weights-with-mean", "no-offsets", "padding-out-of-range"])
def test_embedding_bag_refusals_are_torchs(make):
    def run(lib):
        weight = lib.ones(10, 3)
        return make(lib, weight, lib.tensor([1, 2, 4, 5, 4, 3, 9, 9]), lib.tensor([0, 4, 4]))

    with pytest.raises(Exception) as theirs:
        run(torch)
    with pytest.raises(type(theirs.value)) as ours:
        run(tw)
    assert str(theirs.value).split(" (")[0] in str(ours.value)


def test_embedding_bag_index_dtypes_are_the_promoted_ones():
    for index, offsets in (("int32", "int32"), ("int32", "int64")):
        for mode in range(3):
            def run(lib, mode=mode, index=index, offsets=offsets):
                return lib.embedding_bag(lib.ones(10, 3), lib.tensor([1, 2, 4], dtype=getattr(lib, index)),
                                         lib.tensor([0, 1], dtype=getattr(lib, offsets)), False, mode)

            assert [str(t.dtype).split(".")[-1] for t in run(tw)] == [str(t.dtype).split(".")[-1] for t in run(torch)]


# ---------------------------------------------------------------- torch.lstm, gru, rnn_tanh, rnn_relu


def _as_tilewise(t):
    return tw.from_numpy(t.detach().numpy().copy()).requires_grad_(t.requires_grad)


def _layers(kind: str, **options):
    if kind == "lstm":
        return torch.nn.LSTM(3, 4, **options)
    if kind == "gru":
        return torch.nn.GRU(3, 4, **options)
    return torch.nn.RNN(3, 4, nonlinearity=kind.removeprefix("rnn_"), **options)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("bias, bidirectional, batch_first", [(True, False, False), (False, True, False),
                                                              (True, True, True)])
def test_recurrent_functions_match_torch(kind, bias, bidirectional, batch_first):
    torch.manual_seed(0)
    layers = _layers(kind, num_layers=2, bias=bias, bidirectional=bidirectional, batch_first=batch_first)
    params = [p.detach().clone().requires_grad_() for p in layers._flat_weights]
    x = torch.randn(5, 2, 3, requires_grad=True)
    states, batch = 2 * (2 if bidirectional else 1), 5 if batch_first else 2
    hx = (torch.randn(states, batch, 4), torch.randn(states, batch, 4)) if kind == "lstm" else torch.randn(states,
                                                                                                          batch, 4)
    ours_params, ours_x = [_as_tilewise(p) for p in params], _as_tilewise(x)
    ours_hx = tuple(_as_tilewise(h) for h in hx) if kind == "lstm" else _as_tilewise(hx)
    expected = getattr(torch, kind)(x, hx, params, bias, 2, 0.0, False, bidirectional, batch_first)
    got = getattr(tw, kind)(ours_x, ours_hx, ours_params, bias, 2, 0.0, False, bidirectional, batch_first)
    assert len(got) == len(expected) == (3 if kind == "lstm" else 2)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    sum(t.sum() for t in expected).backward()
    sum(t.sum() for t in got).backward()
    for a, b in zip([*ours_params, ours_x], [*params, x]):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)
    if batch_first:
        return
    packed = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), [5, 3])
    expected = getattr(torch, kind)(packed.data, packed.batch_sizes, hx, params, bias, 2, 0.0, False, bidirectional)
    got = getattr(tw, kind)(_as_tilewise(packed.data), tw.from_numpy(packed.batch_sizes.numpy()), ours_hx,
                            ours_params, bias, 2, 0.0, False, bidirectional)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_lstm_function_with_projections():
    torch.manual_seed(1)
    layers = torch.nn.LSTM(3, 6, proj_size=2)
    x, hx = torch.randn(5, 2, 3), (torch.randn(1, 2, 2), torch.randn(1, 2, 6))
    expected = torch.lstm(x, hx, layers._flat_weights, True, 1, 0.0, False, False, False)
    got = tw.lstm(_as_tilewise(x), tuple(_as_tilewise(h) for h in hx), [_as_tilewise(p) for p in layers._flat_weights],
                  True, 1, 0.0, False, False, False)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params, num_layers, states", [(3, 1, 1), (4, 2, 1), (4, 1, 2)],
                         ids=["parameters", "layers", "states"])
def test_recurrent_function_refusals_are_torchs(params, num_layers, states):
    torch.manual_seed(2)
    weights = torch.nn.GRU(3, 4)._flat_weights[:params]
    x, h = torch.randn(5, 2, 3), torch.zeros(states, 2, 4)
    with pytest.raises(RuntimeError) as theirs:
        torch.gru(x, h, weights, True, num_layers, 0.0, False, False, False)
    with pytest.raises(RuntimeError, match=str(theirs.value)):
        tw.gru(_as_tilewise(x), _as_tilewise(h), [_as_tilewise(w) for w in weights], True, num_layers, 0.0, False,
               False, False)


def test_recurrent_function_refuses_states_of_another_batch():
    """torch's kernel reads past states of a smaller batch (it can crash); tilewise refuses them."""
    weights = [_as_tilewise(w) for w in torch.nn.LSTM(3, 4)._flat_weights]
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 5, 4\), got \[1, 2, 4\]"):
        tw.lstm(tw.randn(5, 2, 3), (tw.zeros(1, 2, 4), tw.zeros(1, 2, 4)), weights, True, 1, 0.0, False, False, True)


# ---------------------------------------------------------------- chalf


def test_chalf_names_the_missing_dtype():
    with pytest.raises(TypeError, match="no complex32"):
        tw.ones(2).chalf()
    with pytest.raises(AttributeError, match="no complex32"):
        tw.chalf  # noqa: B018 — the attribute's refusal is what is tested
    with pytest.raises(TypeError, match="no complex32"):
        tw.ones(2, dtype="complex32")
