"""tilewise.distributions: torch's basic probability distributions (and the relaxed ones of ``relaxed.py``), their
constraints and KL divergences. See [Note: distributions] in ``distribution.py``."""

from tilewise.distributions import constraints
from tilewise.distributions.continuous import Beta, Exponential, Gamma, Laplace, Normal, Uniform
from tilewise.distributions.discrete import (
    Bernoulli,
    Binomial,
    Categorical,
    OneHotCategorical,
    OneHotCategoricalStraightThrough,
    Poisson,
)
from tilewise.distributions.distribution import Distribution, ExponentialFamily
from tilewise.distributions.kl import kl_divergence, register_kl
from tilewise.distributions.mixture import MixtureSameFamily
from tilewise.distributions.multivariate import (
    AffineTransform,
    Dirichlet,
    ExpTransform,
    Gumbel,
    Independent,
    LogNormal,
    MultivariateNormal,
    SigmoidTransform,
    TransformedDistribution,
)
from tilewise.distributions.relaxed import RelaxedBernoulli, RelaxedOneHotCategorical

__all__ = ["Distribution", "ExponentialFamily", "Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Beta",
           "Bernoulli", "Categorical", "OneHotCategorical", "OneHotCategoricalStraightThrough", "Poisson", "Binomial",
           "MultivariateNormal", "Dirichlet", "Independent", "MixtureSameFamily", "TransformedDistribution",
           "LogNormal", "ExpTransform", "AffineTransform", "SigmoidTransform", "Gumbel", "RelaxedOneHotCategorical",
           "RelaxedBernoulli",
           "kl_divergence", "register_kl", "constraints"]
