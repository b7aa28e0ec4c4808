"""tilewise.distributions against torch.distributions: the same parameters give the same log_prob, entropy,
moments, cdf/icdf and KL divergences, with the same gradients; draws have the right shapes and moments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

RNG = np.random.default_rng(0)
POS = RNG.random((3, 4)) + 0.5
POS2 = RNG.random((3, 4)) + 0.5
REAL = RNG.standard_normal((3, 4))
PROBS = RNG.random((3, 4)) * 0.8 + 0.1
SIMPLEX = RNG.random((3, 5)) + 0.1
SIMPLEX = SIMPLEX / SIMPLEX.sum(-1, keepdims=True)
A = RNG.standard_normal((3, 3))
COV = A @ A.T + 3 * np.eye(3)


# name -> (constructor args as numpy (positional), kwargs, values for log_prob, which methods to compare)
CASES = {
    "Normal": ((REAL, POS), {}, REAL * 2, ("mean", "variance", "stddev", "entropy", "cdf", "icdf")),
    "Uniform": ((REAL - 1, REAL + 1), {}, REAL, ("mean", "variance", "entropy", "cdf", "icdf")),
    "Exponential": ((POS,), {}, POS2, ("mean", "variance", "entropy", "cdf", "icdf")),
    "Laplace": ((REAL, POS), {}, REAL * 2, ("mean", "variance", "entropy", "cdf", "icdf")),
    "LogNormal": ((REAL, POS), {}, POS2, ("mean", "variance", "entropy")),
    "Gamma": ((POS, POS2), {}, POS2, ("mean", "variance", "entropy", "cdf")),
    "Beta": ((POS, POS2), {}, PROBS, ("mean", "variance", "entropy")),
    "Bernoulli": ((), {"probs": PROBS}, np.round(PROBS), ("mean", "variance", "entropy")),
    "Bernoulli-logits": ((), {"logits": REAL}, np.round(PROBS), ("mean", "variance", "entropy")),
    "Categorical": ((), {"probs": SIMPLEX}, np.array([0, 4, 2]), ("entropy",)),
    "Categorical-logits": ((), {"logits": REAL}, np.array([[0], [3], [1]]), ("entropy",)),
    "OneHotCategorical": ((), {"probs": SIMPLEX}, np.eye(5)[[1, 0, 3]], ("mean", "variance", "entropy")),
    "Poisson": ((POS * 3,), {}, np.floor(POS2 * 4), ("mean", "variance")),
    "Binomial": ((), {"total_count": 10, "probs": PROBS}, np.floor(PROBS * 10), ("mean", "variance", "entropy")),
    "Dirichlet": ((SIMPLEX * 7,), {}, SIMPLEX, ("mean", "variance", "entropy")),
    "MultivariateNormal": ((REAL[:, :3],), {"covariance_matrix": COV}, REAL[:, 1:], ("mean", "variance", "entropy")),
    "MultivariateNormal-tril": ((REAL[:, :3],), {"scale_tril": np.linalg.cholesky(COV)}, REAL[:, 1:],
                                ("entropy",)),
    "Chi2": ((POS * 3,), {}, POS2, ("mean", "variance", "entropy", "cdf")),
    "StudentT": ((POS * 3 + 2, REAL, POS2), {}, REAL * 2, ("mean", "variance", "entropy")),
    "StudentT-heavy": ((POS * 2,), {}, REAL * 2, ("mean", "variance", "entropy", "mode")),
    "Cauchy": ((REAL, POS), {}, REAL * 2, ("mean", "variance", "entropy", "cdf", "icdf")),
    "HalfNormal": ((POS,), {}, POS2, ("mean", "variance", "entropy", "cdf", "icdf")),
    "HalfCauchy": ((POS,), {}, POS2, ("mean", "variance", "entropy", "cdf", "icdf")),
    "Weibull": ((POS, POS2 + 0.5), {}, POS2, ("mean", "variance", "entropy", "mode", "cdf", "icdf")),
    "Pareto": ((POS, POS2 * 3), {}, POS + POS2, ("mean", "variance", "entropy", "mode", "cdf", "icdf")),
    "Geometric": ((), {"probs": PROBS}, np.floor(POS2 * 4), ("mean", "variance", "entropy", "mode")),
    "Geometric-logits": ((), {"logits": REAL}, np.floor(POS2 * 4), ("mean", "variance", "entropy")),
    "Multinomial": ((), {"total_count": 4, "probs": SIMPLEX}, np.array([[1, 0, 2, 1, 0], [0, 0, 0, 4, 0],
                                                                       [1, 1, 1, 0, 1]]),
                    ("mean", "variance", "entropy")),
    "NegativeBinomial": ((POS * 3,), {"probs": PROBS}, np.floor(POS2 * 4), ("mean", "variance", "mode")),
    "NegativeBinomial-logits": ((POS * 3,), {"logits": REAL}, np.floor(POS2 * 4), ("mean", "variance")),
    "ContinuousBernoulli": ((), {"probs": np.where(PROBS > 0.6, 0.5004, PROBS)}, PROBS[::-1].copy(),
                            ("mean", "variance", "entropy", "cdf", "icdf")),
    "ContinuousBernoulli-logits": ((), {"logits": REAL}, PROBS, ("mean", "variance", "entropy", "cdf", "icdf")),
    "InverseGamma": ((POS * 2 + 1.5, POS2), {}, POS2, ("mean", "variance", "entropy", "mode")),
    "LogisticNormal": ((REAL, POS), {}, SIMPLEX, ()),
    "Kumaraswamy": ((POS + 1, POS2 + 1), {}, PROBS, ("mean", "variance", "entropy", "mode", "cdf", "icdf")),
    "LowRankMultivariateNormal": ((REAL, POS2[:, :, None] * REAL[::-1, :, None], POS + 0.5), {}, REAL * 2,
                                  ("mean", "variance", "entropy", "covariance_matrix", "precision_matrix",
                                   "scale_tril")),
}
INTEGER_VALUES = {"Categorical", "Categorical-logits"}


def _build(lib, name, grad: bool):
    args, kwargs, _, _ = CASES[name]

    def tensor(a):
        if isinstance(a, int | float):
            return a
        t = (torch.tensor if lib is torch else tw.tensor)(np.asarray(a, dtype=np.float64))
        return t.requires_grad_() if grad else t

    made = [tensor(a) for a in args] + [tensor(v) for v in kwargs.values()]
    cls = getattr(lib.distributions, name.split("-")[0])
    dist = cls(*made[:len(args)], **dict(zip(kwargs, made[len(args):])))
    return dist, [m for m in made if not isinstance(m, int | float)]


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t.detach().numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_log_prob_moments_and_gradients_match_torch(name):
    values = CASES[name][2]
    ours, our_params = _build(tw, name, grad=True)
    theirs, their_params = _build(torch, name, grad=True)
    assert tuple(ours.batch_shape) == tuple(theirs.batch_shape)
    assert tuple(ours.event_shape) == tuple(theirs.event_shape)
    dtype = np.int64 if name in INTEGER_VALUES else np.float64
    lp = ours.log_prob(tw.tensor(values.astype(dtype)))
    ref = theirs.log_prob(torch.tensor(values.astype(dtype)))
    np.testing.assert_allclose(_np(lp), _np(ref), rtol=1e-6, atol=1e-8)
    for method in CASES[name][3]:
        if method in ("cdf", "icdf"):
            arg = values if method == "cdf" else np.clip(PROBS, 0.05, 0.95)
            got, want = getattr(ours, method)(tw.tensor(arg)), getattr(theirs, method)(torch.tensor(arg))
        elif method == "entropy":
            got, want = ours.entropy(), theirs.entropy()
        else:
            got, want = getattr(ours, method), getattr(theirs, method)
        np.testing.assert_allclose(_np(got), _np(want), rtol=1e-6, atol=1e-8, err_msg=f"{name}.{method}")
    if our_params:
        total = lp.sum() + (ours.entropy().sum() if "entropy" in CASES[name][3] else 0)
        ref_total = ref.sum() + (theirs.entropy().sum() if "entropy" in CASES[name][3] else 0)
        grads = tw.autograd.grad(total, our_params, allow_unused=True)
        ref_grads = torch.autograd.grad(ref_total, their_params, allow_unused=True)
        for g, r in zip(grads, ref_grads):
            if r is None:
                continue
            np.testing.assert_allclose(_np(g), _np(r), rtol=1e-5, atol=1e-8, err_msg=f"{name} gradient")


KL_PAIRS = ["Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Beta", "Bernoulli", "Categorical",
            "OneHotCategorical", "Poisson", "Dirichlet", "MultivariateNormal", "LogNormal", "Chi2", "Geometric",
            "HalfNormal", "Pareto", "Cauchy"]


@pytest.mark.parametrize("name", KL_PAIRS)
def test_kl_divergence_matches_torch(name):
    p, _ = _build(tw, name, grad=False)
    q = _shifted(tw, name)
    tp, _ = _build(torch, name, grad=False)
    tq = _shifted(torch, name)
    np.testing.assert_allclose(_np(tw.distributions.kl_divergence(p, q)),
                               _np(torch.distributions.kl_divergence(tp, tq)), rtol=1e-6, atol=1e-8)


def _shifted(lib, name):
    """A second distribution of the same family with other parameters (wider for Uniform)."""
    t = torch.tensor if lib is torch else tw.tensor
    dists = lib.distributions
    f = np.float64
    return {
        "Normal": lambda: dists.Normal(t(REAL[::-1].astype(f)), t(POS2)),
        "Uniform": lambda: dists.Uniform(t(REAL - 2), t(REAL + 3)),
        "Exponential": lambda: dists.Exponential(t(POS2)),
        "Laplace": lambda: dists.Laplace(t(REAL[::-1].astype(f)), t(POS2)),
        "Gamma": lambda: dists.Gamma(t(POS2), t(POS)),
        "Beta": lambda: dists.Beta(t(POS2), t(POS)),
        "Bernoulli": lambda: dists.Bernoulli(probs=t(PROBS[::-1].astype(f))),
        "Categorical": lambda: dists.Categorical(probs=t(SIMPLEX[::-1].astype(f))),
        "OneHotCategorical": lambda: dists.OneHotCategorical(probs=t(SIMPLEX[::-1].astype(f))),
        "Poisson": lambda: dists.Poisson(t(POS2)),
        "Dirichlet": lambda: dists.Dirichlet(t(SIMPLEX[::-1].astype(f) * 3)),
        "MultivariateNormal": lambda: dists.MultivariateNormal(t(REAL[:, 1:].astype(f)), t(COV + np.eye(3))),
        "LogNormal": lambda: dists.LogNormal(t(REAL[::-1].astype(f)), t(POS2)),
        "Chi2": lambda: dists.Chi2(t(POS2)),
        "Geometric": lambda: dists.Geometric(probs=t(PROBS[::-1].astype(f))),
        "HalfNormal": lambda: dists.HalfNormal(t(POS2)),
        "Pareto": lambda: dists.Pareto(t(POS[::-1].astype(f)), t(POS)),  # where p's scale is below q's: inf
        "Cauchy": lambda: dists.Cauchy(t(REAL[::-1].astype(f)), t(POS2)),
    }[name]()


@pytest.mark.parametrize("name", ["Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Beta", "Bernoulli",
                                  "Categorical", "Poisson", "Binomial", "Dirichlet", "MultivariateNormal",
                                  "LogNormal", "OneHotCategorical", "Chi2", "StudentT", "HalfNormal", "Weibull",
                                  "Pareto", "Geometric", "Multinomial", "NegativeBinomial", "ContinuousBernoulli",
                                  "Kumaraswamy", "LowRankMultivariateNormal"])
def test_draws_have_the_shape_and_moments_of_torchs(name):
    ours, _ = _build(tw, name, grad=False)
    theirs, _ = _build(torch, name, grad=False)
    tw.manual_seed(0)
    draws = ours.sample((20000,))
    assert tuple(draws.shape) == tuple(theirs.sample((20000,)).shape)
    assert draws.dtype.name == str(theirs.sample().dtype).removeprefix("torch.")
    mean = _np(draws).astype(np.float64).mean(0)
    if name.startswith("Categorical"):
        counts = np.stack([(_np(draws) == k).mean(0) for k in range(SIMPLEX.shape[-1])], -1)
        np.testing.assert_allclose(counts, _np(theirs.probs), atol=0.02)
        return
    expected = _np(theirs.mean)
    spread = np.sqrt(_np(theirs.variance) / 20000)
    assert np.all(np.abs(mean - expected) < 6 * spread + 1e-3), f"{name}: mean {mean} vs {expected}"
    tw.manual_seed(0)
    assert np.array_equal(_np(ours.sample((20000,))), _np(draws)), "manual_seed must reproduce the draws"


def test_rsample_carries_gradients_to_the_parameters():
    loc = tw.tensor([0.5, -1.0], requires_grad=True)
    scale = tw.tensor([1.0, 2.0], requires_grad=True)
    x = tw.distributions.Normal(loc, scale).rsample((1000,))
    gl, gs = tw.autograd.grad(x.sum(), [loc, scale])
    assert gl.tolist() == [1000.0, 1000.0]
    eps = (x.detach() - loc.detach()) / scale.detach()
    np.testing.assert_allclose(_np(gs), _np(eps.sum(0)), rtol=1e-5)
    with pytest.raises(NotImplementedError, match="concentration"):
        tw.distributions.Gamma(tw.tensor(2.0, requires_grad=True), tw.tensor(1.0)).rsample()


def test_validation_errors_match_torch():
    with pytest.raises(ValueError, match=r"Expected parameter scale .* to satisfy the constraint "
                                         r"GreaterThan\(lower_bound=0.0\)"):
        tw.distributions.Normal(tw.tensor([0.0]), tw.tensor([-1.0]))
    with pytest.raises(ValueError, match="Either `probs` or `logits` must be specified, but not both."):
        tw.distributions.Bernoulli(probs=tw.tensor(0.5), logits=tw.tensor(0.0))
    with pytest.raises(ValueError, match="Expected value argument .* to be within the support"):
        tw.distributions.Exponential(tw.tensor([1.0])).log_prob(tw.tensor([-1.0]))
    tw.distributions.Normal(tw.tensor([0.0]), tw.tensor([-1.0]), validate_args=False)  # no check when asked
    with pytest.raises(NotImplementedError, match="No KL"):
        tw.distributions.kl_divergence(tw.distributions.Normal(0.0, 1.0), tw.distributions.Exponential(1.0))


def test_register_kl_picks_the_most_specific_pair():
    class MyNormal(tw.distributions.Normal):
        pass

    @tw.distributions.register_kl(MyNormal, tw.distributions.Normal)
    def _kl(p, q):
        return tw.tensor(42.0)

    p = MyNormal(tw.tensor(0.0), tw.tensor(1.0))
    assert float(tw.distributions.kl_divergence(p, tw.distributions.Normal(0.0, 1.0))) == 42.0
    assert float(tw.distributions.kl_divergence(tw.distributions.Normal(0.0, 1.0),
                                                tw.distributions.Normal(0.0, 1.0))) == 0.0


def test_independent_sums_the_reinterpreted_dims():
    base = tw.distributions.Normal(tw.tensor(REAL), tw.tensor(POS))
    ind = tw.distributions.Independent(base, 1)
    tbase = torch.distributions.Normal(torch.tensor(REAL), torch.tensor(POS))
    tind = torch.distributions.Independent(tbase, 1)
    assert tuple(ind.batch_shape) == (3,) and tuple(ind.event_shape) == (4,)
    np.testing.assert_allclose(_np(ind.log_prob(tw.tensor(REAL * 2))), _np(tind.log_prob(torch.tensor(REAL * 2))))
    np.testing.assert_allclose(_np(ind.entropy()), _np(tind.entropy()))
