"""tilewise.distributions: torch's basic probability distributions (and the relaxed ones of ``relaxed.py``), their
constraints, transforms and KL divergences. See [Note: distributions] in ``distribution.py``."""

from tilewise.distributions import constraints, transforms
from tilewise.distributions.constraint_registry import biject_to, transform_to
from tilewise.distributions.continuous import Beta, Exponential, Gamma, Laplace, Normal, Uniform
from tilewise.distributions.derived import (
    Cauchy,
    Chi2,
    ContinuousBernoulli,
    Geometric,
    HalfCauchy,
    HalfNormal,
    InverseGamma,
    Kumaraswamy,
    LogisticNormal,
    Multinomial,
    NegativeBinomial,
    Pareto,
    StudentT,
    Weibull,
)
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
    Dirichlet,
    Gumbel,
    Independent,
    LogNormal,
    LowRankMultivariateNormal,
    MultivariateNormal,
    TransformedDistribution,
)
from tilewise.distributions.relaxed import RelaxedBernoulli, RelaxedOneHotCategorical
from tilewise.distributions.transforms import (
    AbsTransform,
    AffineTransform,
    ComposeTransform,
    CumulativeDistributionTransform,
    ExpTransform,
    IndependentTransform,
    LowerCholeskyTransform,
    PositiveDefiniteTransform,
    PowerTransform,
    ReshapeTransform,
    SigmoidTransform,
    SoftmaxTransform,
    SoftplusTransform,
    StickBreakingTransform,
    TanhTransform,
    Transform,
    identity_transform,
)

__all__ = ["Distribution", "ExponentialFamily", "Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Beta",
           "Bernoulli", "Categorical", "OneHotCategorical", "OneHotCategoricalStraightThrough", "Poisson", "Binomial",
           "MultivariateNormal", "Dirichlet", "Independent", "MixtureSameFamily", "TransformedDistribution",
           "LogNormal", "ExpTransform", "AffineTransform", "SigmoidTransform", "Gumbel", "RelaxedOneHotCategorical",
           "RelaxedBernoulli", "Chi2", "StudentT", "Cauchy", "HalfNormal", "HalfCauchy", "Weibull", "Pareto",
           "Geometric", "Multinomial", "NegativeBinomial", "ContinuousBernoulli",
           "InverseGamma", "LogisticNormal", "Kumaraswamy", "LowRankMultivariateNormal",
           "Transform", "ComposeTransform", "IndependentTransform", "ReshapeTransform", "PowerTransform",
           "SoftplusTransform", "TanhTransform", "AbsTransform", "SoftmaxTransform", "StickBreakingTransform",
           "LowerCholeskyTransform", "PositiveDefiniteTransform", "CumulativeDistributionTransform",
           "identity_transform", "transforms", "biject_to", "transform_to",
           "kl_divergence", "register_kl", "constraints"]
