"""Programs that reach for ``torch.distributions`` beyond its basic distributions, run under torch and under
tilewise (``import tilewise as torch``) from the same weights and noise: a soft actor-critic policy whose actions are
a tanh-squashed Gaussian (``TransformedDistribution`` with ``TanhTransform(cache_size=1)``), and the transforms such
programs compose (``distributions.transforms``). Below the program, the failures it met, each reduced to a test.
"""
# ruff: noqa: N806 — the programs keep the scripts' names (F, D, T)

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A soft actor-critic update, as the compact published implementations write it: a Gaussian policy head (mean and a
# clamped log-std), actions squashed by tanh through TransformedDistribution with a cached TanhTransform, the log
# probability summed over action dims, twin Q networks and a Polyak-averaged target through torch._foreach_lerp_,
# a learned temperature. The reparametrisation noise comes from numpy so both runs see the same draws.

def sac_update(torch, init, batches, noise):
    nn, F, D = torch.nn, torch.nn.functional, torch.distributions

    class Actor(nn.Module):
        def __init__(self, obs=4, act=2, hidden=16):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU())
            self.mu, self.log_std = nn.Linear(hidden, act), nn.Linear(hidden, act)

        def forward(self, obs, eps):
            h = self.body(obs)
            mu, log_std = self.mu(h), self.log_std(h).clamp(-5, 2)
            dist = D.TransformedDistribution(D.Normal(mu, log_std.exp()), [D.TanhTransform(cache_size=1)])
            action = dist.transforms[0](mu + log_std.exp() * eps)  # what dist.rsample() does with this noise
            return action, dist.log_prob(action).sum(-1)

    class Critic(nn.Module):
        def __init__(self, obs=4, act=2, hidden=16):
            super().__init__()
            self.q1 = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), nn.Linear(hidden, 1))
            self.q2 = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), nn.Linear(hidden, 1))

        def forward(self, obs, act):
            x = torch.cat([obs, act], -1)
            return self.q1(x), self.q2(x)

    actor, critic = Actor(), Critic()
    models = nn.ModuleDict({"actor": actor, "critic": critic})
    record = {"init": initial_state(torch, models, init), "q_loss": [], "pi_loss": [], "alpha": [], "grads": []}
    target = Critic()
    target.load_state_dict(critic.state_dict())
    target.requires_grad_(False)
    log_alpha = torch.zeros(1, requires_grad=True)
    pi_opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    q_opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    a_opt = torch.optim.Adam([log_alpha], lr=3e-3)
    for (obs, act, rew, nxt, done), (eps_next, eps) in zip(batches, noise):
        obs, act, rew, nxt, done = (torch.from_numpy(a) for a in (obs, act, rew, nxt, done))
        with torch.no_grad():
            next_action, next_logp = actor(nxt, torch.from_numpy(eps_next))
            q1_t, q2_t = target(nxt, next_action)
            backup = rew + 0.99 * (1 - done) * (torch.min(q1_t, q2_t).squeeze(-1) - log_alpha.exp() * next_logp)
        q1, q2 = critic(obs, act)
        q_loss = F.mse_loss(q1.squeeze(-1), backup) + F.mse_loss(q2.squeeze(-1), backup)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()

        critic.requires_grad_(False)
        action, logp = actor(obs, torch.from_numpy(eps))
        q_pi = torch.min(*critic(obs, action)).squeeze(-1)
        pi_loss = (log_alpha.exp().detach() * logp - q_pi).mean()
        pi_opt.zero_grad()
        pi_loss.backward()
        pi_opt.step()
        critic.requires_grad_(True)

        alpha_loss = -(log_alpha * (logp.detach() - 2.0)).mean()
        a_opt.zero_grad()
        alpha_loss.backward()
        a_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(critic.parameters()), 0.005)
        record["q_loss"].append(q_loss.item())
        record["pi_loss"].append(pi_loss.item())
        record["alpha"].append(log_alpha.exp().item())
        record["grads"].append(gradients(actor))
    record["target"] = {k: numpy_of(v) for k, v in target.state_dict().items()}
    return record


def transitions(rng, steps=4, batch=8):
    def one():
        return (rng.standard_normal((batch, 4)).astype(np.float32), rng.uniform(-1, 1, (batch, 2)).astype(np.float32),
                rng.standard_normal(batch).astype(np.float32), rng.standard_normal((batch, 4)).astype(np.float32),
                (rng.random(batch) < 0.2).astype(np.float32))
    return [one() for _ in range(steps)]


def test_soft_actor_critic_with_a_tanh_squashed_gaussian_policy_trains_like_torch():
    rng = np.random.default_rng(0)
    noise = [(rng.standard_normal((8, 2)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32))
             for _ in range(4)]
    ours, theirs = run_both(sac_update, transitions(rng), noise)
    assert_same(ours, theirs, rtol=5e-4, atol=5e-5)


# ----------------------------------------------------------------------------------------------------------------------
# Failures the program met, reduced.

X = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
SIMPLEX = np.abs(np.c_[X, X[:, :1] + 1]) / np.abs(np.c_[X, X[:, :1] + 1]).sum(-1, keepdims=True)


def _transform(torch, name):
    T = torch.distributions.transforms
    return {
        "exp": lambda: T.ExpTransform(),
        "tanh": lambda: T.TanhTransform(),
        "sigmoid": lambda: T.SigmoidTransform(),
        "softplus": lambda: T.SoftplusTransform(),
        "power": lambda: T.PowerTransform(torch.tensor(2.5)),
        "affine-event": lambda: T.AffineTransform(torch.tensor([0.5, 1.0, -1.0, 2.0]), torch.tensor(
            [2.0, -0.5, 1.5, 3.0]), event_dim=1),
        "stick-breaking": lambda: T.StickBreakingTransform(),
        "compose": lambda: T.ComposeTransform([T.AffineTransform(0.5, 2.0), T.TanhTransform()]),
        "independent": lambda: T.IndependentTransform(T.SigmoidTransform(), 1),
        "reshape": lambda: T.ReshapeTransform((4,), (2, 2)),
        "inverse-exp": lambda: T.ExpTransform().inv,
    }[name]()


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "softplus", "power", "affine-event", "stick-breaking",
                                  "compose", "independent", "reshape", "inverse-exp"])
def test_transforms_map_invert_and_give_the_log_det_torch_gives(name):
    def run(torch):
        t = _transform(torch, name)
        x = torch.tensor(np.abs(X) if name in ("power", "inverse-exp") else X, requires_grad=True)
        y = t(x)
        logdet = t.log_abs_det_jacobian(x, y)
        (y.sum() + logdet.sum()).backward()
        shapes = (tuple(t.forward_shape((3, 4))),
                  t.domain.event_dim, t.codomain.event_dim, t.bijective)
        return {"y": numpy_of(y), "x": numpy_of(t.inv(y)), "logdet": numpy_of(logdet), "grad": numpy_of(x.grad),
                "shapes": shapes}

    ours, theirs = (run(torch) for torch in LIBRARIES[::-1])
    assert ours.pop("shapes") == theirs.pop("shapes")
    assert_same(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_cached_tanh_transform_scores_its_own_saturated_samples_as_torch():
    # atanh(tanh(20)) is infinite in float32: only the cached pre-image gives a finite log-probability
    for cache_size in (0, 1):
        values = []
        for torch in LIBRARIES:
            D = torch.distributions
            dist = D.TransformedDistribution(D.Normal(torch.zeros(2), torch.ones(2)),
                                             [D.TanhTransform(cache_size=cache_size)])
            x = torch.tensor([0.5, 20.0])
            values.append(numpy_of(dist.log_prob(dist.transforms[0](x))))
        np.testing.assert_allclose(values[0], values[1], rtol=1e-6)


@pytest.mark.parametrize("case", ["stick-breaking", "softmax", "reshape", "broadcasting-affine", "compose-coupled"])
def test_a_transformed_distribution_takes_torch_s_batch_and_event_shapes(case):
    def run(torch):
        D = torch.distributions
        base, transforms, value = {
            "stick-breaking": (D.Normal(torch.zeros(3, 4), 1.0), [D.StickBreakingTransform()], SIMPLEX),
            "softmax": (D.Normal(torch.zeros(3, 4), 1.0), D.transforms.SoftmaxTransform(), None),
            "reshape": (D.Normal(torch.zeros(3, 4), 1.0), [D.ReshapeTransform((4,), (2, 2))], X.reshape(3, 2, 2)),
            "broadcasting-affine": (D.Normal(0.0, 1.0), [D.AffineTransform(torch.zeros(3), torch.ones(3) * 2)],
                                    X[0, :3]),
            "compose-coupled": (D.Normal(torch.zeros(3, 4), 1.0),
                                [D.ComposeTransform([D.ExpTransform(), D.transforms.IndependentTransform(
                                    D.AffineTransform(0.0, 2.0), 1)])], np.abs(X)),
        }[case]
        dist = D.TransformedDistribution(base, transforms)
        out = {"shapes": (tuple(dist.batch_shape), tuple(dist.event_shape), type(dist.base_dist).__name__,
                          dist.support.event_dim),
               "sample": tuple(dist.sample((2,)).shape)}
        if value is not None:
            out["log_prob"] = numpy_of(dist.log_prob(torch.tensor(value.astype(np.float32))))
        out["expanded"] = tuple(dist.expand((5,) + tuple(dist.batch_shape)).batch_shape)
        return out

    ours, theirs = (run(torch) for torch in (tilewise, real_torch))
    for key in ("shapes", "sample", "expanded"):
        assert ours.pop(key) == theirs.pop(key), key
    assert_same(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_decreasing_transform_keeps_cdf_and_icdf_increasing_as_torch():
    def run(torch):
        D = torch.distributions
        dist = D.TransformedDistribution(D.Normal(torch.tensor([0.0, 1.0]), 2.0), [D.AffineTransform(1.0, -3.0)])
        return numpy_of(dist.cdf(torch.tensor([0.5, -2.0]))), numpy_of(dist.icdf(torch.tensor([0.2, 0.9])))

    assert_same(run(tilewise), run(real_torch), rtol=1e-6)


def test_transforms_are_the_ones_torch_names_and_compare_as_torch():
    for torch in LIBRARIES:
        D = torch.distributions
        t = D.TanhTransform()
        assert t.inv is t.inv and t.inv.inv is t and t == D.TanhTransform() and t != D.ExpTransform()
        assert D.AffineTransform(0.0, 2.0) == D.AffineTransform(0.0, 2.0) != D.AffineTransform(0.0, 3.0)
        assert D.transforms.identity_transform.parts == [] and D.TanhTransform().with_cache(1)._cache_size == 1
        with pytest.raises(ValueError, match="cache_size must be 0 or 1"):
            D.ExpTransform(cache_size=2)
        with pytest.raises(ValueError, match="transforms must be a Transform or list"):
            D.TransformedDistribution(D.Normal(0.0, 1.0), (D.ExpTransform(),))
        with pytest.raises(ValueError, match="Please use either .domain.event_dim or .codomain.event_dim"):
            D.ReshapeTransform((4,), (2, 2)).event_dim  # noqa: B018


def test_kl_of_transformed_distributions_compares_the_transforms_parameters_as_torch():
    # transforms of one kind but other parameters were taken for equal: Weibulls of other scales had KL 0
    for torch in LIBRARIES:
        D = torch.distributions
        with pytest.raises(NotImplementedError):
            D.kl_divergence(D.Weibull(torch.tensor([1.0]), torch.tensor([2.0])),
                            D.Weibull(torch.tensor([1.5]), torch.tensor([2.0])))
    values = []
    for torch in LIBRARIES:
        D = torch.distributions
        p = D.TransformedDistribution(D.Normal(0.0, 1.0), [D.AffineTransform(0.0, 2.0)])
        q = D.TransformedDistribution(D.Normal(1.0, 1.5), [D.AffineTransform(0.0, 2.0)])
        g = D.kl_divergence(D.Gumbel(torch.tensor([1.3]), torch.tensor([2.0])),
                            D.Gumbel(torch.tensor([1.0]), torch.tensor([3.0])))
        values.append((numpy_of(D.kl_divergence(p, q)), numpy_of(g)))
    assert_same(values[1], values[0], rtol=1e-6)


def _constraint(torch, name):
    C = torch.distributions.constraints
    return {"positive": C.positive, "real": C.real, "unit_interval": C.unit_interval, "interval": C.interval(-1.0, 2.0),
            "greater_than": C.greater_than(2.0), "nonnegative": C.nonnegative, "less_than": C.less_than(1.5),
            "real_vector": C.real_vector, "half_open_interval": C.half_open_interval(0.0, 3.0), "simplex": C.simplex,
            "lower_cholesky": C.lower_cholesky, "positive_definite": C.positive_definite}[name]


@pytest.mark.parametrize("name", ["positive", "real", "unit_interval", "interval", "greater_than", "nonnegative",
                                  "less_than", "real_vector", "half_open_interval", "simplex", "lower_cholesky",
                                  "positive_definite"])
@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
def test_biject_to_and_transform_to_map_reals_into_a_constraint_as_torch(name, registry):
    def run(torch):
        try:
            transform = getattr(torch.distributions, registry)(_constraint(torch, name))
        except NotImplementedError as error:
            return str(error)
        x = torch.tensor(X[:, :3] if name in ("lower_cholesky", "positive_definite") else X)
        y = transform(x)
        out = {"y": numpy_of(y), "inside": bool(_constraint(torch, name).check(y).all())}
        if name not in ("lower_cholesky", "positive_definite", "simplex") or registry == "biject_to":
            out["logdet"] = numpy_of(transform.log_abs_det_jacobian(x, y))
        return out

    ours, theirs = run(tilewise), run(real_torch)
    if isinstance(theirs, str):
        assert ours == theirs
        return
    assert ours.pop("inside") == theirs.pop("inside")
    assert_same(ours, theirs, rtol=1e-5, atol=1e-6)


def test_an_unconstrained_parameter_optimised_through_transform_to_gets_torch_s_gradient():
    grads = []
    for torch in LIBRARIES:
        D = torch.distributions
        raw = torch.zeros(3, requires_grad=True)
        scale = D.transform_to(D.Normal.arg_constraints["scale"])(raw)
        D.Normal(0.0, scale).log_prob(torch.tensor([0.5, 1.0, 2.0])).sum().backward()
        grads.append(numpy_of(raw.grad))
    assert_same(grads[1], grads[0], rtol=1e-6)


def test_a_dependent_support_is_a_property_and_a_constraint_as_torch():
    for torch in LIBRARIES:
        C = torch.distributions.constraints

        class Shifted(torch.distributions.Distribution):
            def __init__(self, low):
                self.low = low
                super().__init__((), (), validate_args=False)

            @C.dependent_property(is_discrete=False, event_dim=0)
            def support(self):
                return C.greater_than(self.low)  # noqa: B023 — read while this iteration runs

        assert C.is_dependent(Shifted.support) and Shifted.support.event_dim == 0
        assert repr(Shifted(2.0).support) == "GreaterThan(lower_bound=2.0)"
        with pytest.raises(ValueError, match="Cannot determine validity of dependent constraint"):
            C.dependent.check(torch.ones(1))
        with pytest.raises(NotImplementedError, match=".event_dim cannot be determined statically"):
            C.dependent.event_dim  # noqa: B018
