"""tilewise.distributions: torch's basic probability distributions, their constraints and KL divergences.
See [Note: distributions] in ``distribution.py``."""

from tilewise.distributions import constraints
from tilewise.distributions.continuous import Beta, Exponential, Gamma, Laplace, Normal, Uniform
from tilewise.distributions.discrete import Bernoulli, Binomial, Categorical, OneHotCategorical, Poisson
from tilewise.distributions.distribution import Distribution, ExponentialFamily
from tilewise.distributions.kl import kl_divergence, register_kl
from tilewise.distributions.multivariate import (
    AffineTransform,
    Dirichlet,
    ExpTransform,
    Independent,
    LogNormal,
    MultivariateNormal,
    TransformedDistribution,
)

__all__ = ["Distribution", "ExponentialFamily", "Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Beta",
           "Bernoulli", "Categorical", "OneHotCategorical", "Poisson", "Binomial", "MultivariateNormal", "Dirichlet",
           "Independent", "TransformedDistribution", "LogNormal", "ExpTransform", "AffineTransform",
           "kl_divergence", "register_kl", "constraints"]
