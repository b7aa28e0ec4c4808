"""Distributions derived from the basic ones, as torch's: Chi2 (a Gamma), StudentT (a Normal over a Chi2), Cauchy,
the folded HalfNormal and HalfCauchy, Weibull and Pareto (transformed Exponentials), Geometric (Bernoulli trials
until a success), Multinomial (counts of Categorical draws), NegativeBinomial (a Gamma-Poisson mixture),
ContinuousBernoulli, InverseGamma (1 / Gamma), LogisticNormal (a stick-broken Normal) and Kumaraswamy. Where torch
builds one as a transformed distribution (HalfNormal = |Normal|, Weibull = scale * Exp(1) ** (1 / k), Pareto =
scale * exp(Exp(alpha))), so does this module, so that shapes, draws and supports follow the transforms'."""

from __future__ import annotations

import math
from numbers import Number

from tilewise.distributions import constraints
from tilewise.distributions.continuous import Exponential, Gamma, Normal
from tilewise.distributions.discrete import Binomial, Categorical, _one_of, _ProbsOrLogits, clamp_probs
from tilewise.distributions.distribution import Distribution, ExponentialFamily, broadcast_all
from tilewise.distributions.multivariate import _EULER, TransformedDistribution
from tilewise.distributions.transforms import (
    AbsTransform,
    AffineTransform,
    ExpTransform,
    PowerTransform,
    StickBreakingTransform,
)
from tilewise.dtypes import finfo
from tilewise.ops.creation import full, ones_like, rand, randn, zeros_like
from tilewise.ops.functions import where
from tilewise.tensor import as_tensor, tensor


def _no_grad():
    from tilewise.autograd import no_grad

    return no_grad()


class Chi2(Gamma):
    arg_constraints = {"df": constraints.positive}

    def __init__(self, df, validate_args=None) -> None:
        super().__init__(0.5 * df, 0.5, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return Chi2(self.df.expand(batch_shape), validate_args=False)

    @property
    def df(self):
        return self.concentration * 2


class StudentT(Distribution):
    arg_constraints = {"df": constraints.positive, "loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, df, loc=0.0, scale=1.0, validate_args=None) -> None:
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df)
        super().__init__(self.df.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        new = StudentT(self.df.expand(batch_shape), self.loc.expand(batch_shape), self.scale.expand(batch_shape),
                       validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.loc.masked_fill(self.df <= 1, float("nan"))

    mode = property(lambda self: self.loc)

    @property
    def variance(self):
        df = self.df
        finite = self.scale.pow(2) * df / (df - 2)
        return where(df > 2, finite, where(df > 1, math.inf, math.nan))

    def rsample(self, sample_shape=()):
        x = randn(self._extended_shape(sample_shape), dtype=self.df.dtype, device=self.df.device)
        z = self._chi2.rsample(sample_shape)
        return self.loc + self.scale * (x * (z / self.df).rsqrt())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (self.scale.log() + 0.5 * self.df.log() + 0.5 * math.log(math.pi) + (0.5 * self.df).lgamma()
             - (0.5 * (self.df + 1.0)).lgamma())
        return -0.5 * (self.df + 1.0) * (y**2.0 / self.df).log1p() - z

    def entropy(self):
        lbeta = (0.5 * self.df).lgamma() + math.lgamma(0.5) - (0.5 * (self.df + 1)).lgamma()
        return (self.scale.log() + 0.5 * (self.df + 1) * ((0.5 * (self.df + 1)).digamma() - (0.5 * self.df).digamma())
                + 0.5 * self.df.log() + lbeta)


class Cauchy(Distribution):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        batch_shape = () if isinstance(loc, Number) and isinstance(scale, Number) else self.loc.shape
        super().__init__(batch_shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        new = Cauchy(self.loc.expand(batch_shape), self.scale.expand(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: full(self._extended_shape(), math.nan, dtype=self.loc.dtype, device=self.loc.device))
    mode = property(lambda self: self.loc)
    variance = property(lambda self: full(self._extended_shape(), math.inf, dtype=self.loc.dtype,
                                          device=self.loc.device))

    def rsample(self, sample_shape=()):
        u = rand(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (math.pi * (u - 0.5)).tan() * self.scale  # a standard Cauchy draw by inversion

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -math.log(math.pi) - self.scale.log() - (((value - self.loc) / self.scale) ** 2).log1p()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.loc) / self.scale).atan() / math.pi + 0.5

    def icdf(self, value):
        return (math.pi * (value - 0.5)).tan() * self.scale + self.loc

    def entropy(self):
        return math.log(4 * math.pi) + self.scale.log()


class _Folded(TransformedDistribution):
    """|X| of a distribution symmetric about 0 (HalfNormal, HalfCauchy): twice its density on the nonnegatives."""

    arg_constraints = {"scale": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    scale = property(lambda self: self.base_dist.scale)
    mode = property(lambda self: zeros_like(self.scale))

    def expand(self, batch_shape, _instance=None):
        new = type(self)(self.scale.expand(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = as_tensor(value, dtype=self.scale.dtype, device=self.scale.device)
        return where(value >= 0, self.base_dist.log_prob(value) + math.log(2), -math.inf)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 2 * self.base_dist.cdf(value) - 1

    def icdf(self, prob):
        return self.base_dist.icdf((prob + 1) / 2)

    def entropy(self):
        return self.base_dist.entropy() - math.log(2)


class HalfNormal(_Folded):
    def __init__(self, scale, validate_args=None) -> None:
        super().__init__(Normal(0, scale, validate_args=False), AbsTransform(), validate_args=validate_args)

    mean = property(lambda self: self.scale * math.sqrt(2 / math.pi))
    variance = property(lambda self: self.scale.pow(2) * (1 - 2 / math.pi))


class HalfCauchy(_Folded):
    def __init__(self, scale, validate_args=None) -> None:
        super().__init__(Cauchy(0, scale, validate_args=False), AbsTransform(), validate_args=validate_args)

    mean = property(lambda self: full(self._extended_shape(), math.inf, dtype=self.scale.dtype,
                                      device=self.scale.device))
    variance = property(lambda self: self.base_dist.variance)


class Weibull(TransformedDistribution):
    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive

    def __init__(self, scale, concentration, validate_args=None) -> None:
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self.concentration_reciprocal = self.concentration.reciprocal()
        transforms = [PowerTransform(exponent=self.concentration_reciprocal), AffineTransform(loc=0, scale=self.scale)]
        super().__init__(Exponential(ones_like(self.scale), validate_args=validate_args), transforms,
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = Weibull(self.scale.expand(batch_shape), self.concentration.expand(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: self.scale * (1 + self.concentration_reciprocal).lgamma().exp())
    mode = property(lambda self: self.scale * ((self.concentration - 1) / self.concentration)
                    ** self.concentration.reciprocal())

    @property
    def variance(self):
        k = self.concentration_reciprocal
        return self.scale.pow(2) * ((1 + 2 * k).lgamma().exp() - (2 * (1 + k).lgamma()).exp())

    def entropy(self):
        k = self.concentration_reciprocal
        return _EULER * (1 - k) + (self.scale * k).log() + 1


class Pareto(TransformedDistribution):
    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}

    def __init__(self, scale, alpha, validate_args=None) -> None:
        self.scale, self.alpha = broadcast_all(scale, alpha)
        super().__init__(Exponential(self.alpha, validate_args=validate_args),
                         [ExpTransform(), AffineTransform(loc=0, scale=self.scale)], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = Pareto(self.scale.expand(batch_shape), self.alpha.expand(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def support(self):
        return constraints.greater_than_eq(self.scale)

    @property
    def mean(self):
        a = self.alpha.clamp(min=1)
        return a * self.scale / (a - 1)

    mode = property(lambda self: self.scale)

    @property
    def variance(self):
        a = self.alpha.clamp(min=2)
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    def entropy(self):
        return (self.scale / self.alpha).log() + (1 + self.alpha.reciprocal())


class Geometric(_ProbsOrLogits, Distribution):
    """The number of failures before the first success of Bernoulli(probs) trials."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.nonnegative_integer
    is_binary = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        _one_of(probs, logits)
        given = probs if probs is not None else logits
        (self.__dict__["probs" if probs is not None else "logits"],) = broadcast_all(given)
        super().__init__(() if isinstance(given, Number) else given.shape, (), validate_args)
        if self._validate_args and probs is not None:
            value = self.probs
            valid = value > 0
            if not bool(valid.all()):
                raise ValueError(f"Expected parameter probs ({type(value).__name__} of shape {tuple(value.shape)}) of "
                                 f"distribution {self!r} to be positive but found invalid values:\n{value[~valid]}")

    def expand(self, batch_shape, _instance=None):
        key = "probs" if "probs" in self.__dict__ else "logits"
        new = Geometric(**{key: self.__dict__[key].expand(batch_shape)}, validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: 1.0 / self.probs - 1.0)
    mode = property(lambda self: zeros_like(self.probs))
    variance = property(lambda self: (1.0 / self.probs - 1.0) / self.probs)

    def sample(self, sample_shape=()):
        tiny = finfo(self.probs.dtype).tiny
        with _no_grad():
            u = rand(self._extended_shape(sample_shape), dtype=self.probs.dtype, device=self.probs.device)
            return (u.clamp(min=tiny).log() / (-self.probs).log1p()).floor()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value, probs = broadcast_all(value, self.probs)
        probs = probs.masked_fill((probs == 1) & (value == 0), 0)  # 0 * log(0) is 0: a sure success at once
        return value * (-probs).log1p() + self.probs.log()

    def entropy(self):
        from tilewise.nn.functional import binary_cross_entropy_with_logits

        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none") / self.probs


class Multinomial(Distribution):
    """Counts of ``total_count`` draws from a Categorical(probs or logits), over its last dim."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}

    def __init__(self, total_count: int = 1, probs=None, logits=None, validate_args=None) -> None:
        if not isinstance(total_count, int):
            raise NotImplementedError("inhomogeneous total_count is not supported")
        self.total_count = total_count
        self._categorical = Categorical(probs=probs, logits=logits)
        self._binomial = Binomial(total_count=total_count, probs=self.probs)
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:], validate_args)

    def expand(self, batch_shape, _instance=None):
        new = Multinomial.__new__(Multinomial)
        new.total_count = self.total_count
        new._categorical = self._categorical.expand(batch_shape)
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def support(self):
        return constraints.multinomial(self.total_count)

    logits = property(lambda self: self._categorical.logits)
    probs = property(lambda self: self._categorical.probs)
    param_shape = property(lambda self: self._categorical.param_shape)
    mean = property(lambda self: self.probs * self.total_count)
    variance = property(lambda self: self.total_count * self.probs * (1 - self.probs))

    def sample(self, sample_shape=()):
        samples = self._categorical.sample((self.total_count,) + tuple(sample_shape))
        order = list(range(samples.dim()))
        order.append(order.pop(0))
        samples = samples.permute(*order)
        counts = samples.new_zeros(self._extended_shape(sample_shape))
        counts.scatter_add_(-1, samples, ones_like(samples))
        return counts.type_as(self.probs)

    def entropy(self):
        n = tensor(self.total_count)
        term1 = n * self._categorical.entropy() - (n + 1).lgamma()
        support = self._binomial.enumerate_support(expand=False)[1:]
        binomial_probs = self._binomial.log_prob(support).exp()
        return term1 + (binomial_probs * (support + 1).lgamma()).sum([0, -1])

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_factorial_n = (value.sum(-1) + 1).lgamma()
        log_factorial_xs = (value + 1).lgamma().sum(-1)
        logits = logits.masked_fill((value == 0) & (logits == -math.inf), 0)
        return log_factorial_n - log_factorial_xs + (logits * value).sum(-1)


class NegativeBinomial(_ProbsOrLogits, Distribution):
    """The number of successes before ``total_count`` failures of Bernoulli(probs) trials: a Poisson whose rate is
    Gamma(total_count, exp(-logits)) distributed."""

    arg_constraints = {"total_count": constraints.greater_than_eq(0),
                       "probs": constraints.half_open_interval(0.0, 1.0), "logits": constraints.real}
    support = constraints.nonnegative_integer
    is_binary = True

    def __init__(self, total_count, probs=None, logits=None, validate_args=None) -> None:
        _one_of(probs, logits)
        key = "probs" if probs is not None else "logits"
        self.total_count, self.__dict__[key] = broadcast_all(total_count, probs if probs is not None else logits)
        self.total_count = self.total_count.type_as(self.__dict__[key])
        super().__init__(self.param_shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        key = "probs" if "probs" in self.__dict__ else "logits"
        new = NegativeBinomial(self.total_count.expand(batch_shape), **{key: self.__dict__[key].expand(batch_shape)},
                               validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: self.total_count * self.logits.exp())
    mode = property(lambda self: ((self.total_count - 1) * self.logits.exp()).floor().clamp(min=0.0))
    variance = property(lambda self: self.mean / (-self.logits).sigmoid())

    def sample(self, sample_shape=()):
        from tilewise.ops.functions import poisson

        with _no_grad():
            rate = Gamma(self.total_count, (-self.logits).exp(), validate_args=False).sample(sample_shape)
            return poisson(rate)

    def log_prob(self, value):
        from tilewise.nn.functional import logsigmoid

        if self._validate_args:
            self._validate_sample(value)
        log_unnormalized = self.total_count * logsigmoid(-self.logits) + value * logsigmoid(self.logits)
        log_normalization = (-(self.total_count + value).lgamma() + (1.0 + value).lgamma()
                             + self.total_count.lgamma())
        log_normalization = log_normalization.masked_fill(self.total_count + value == 0.0, 0.0)
        return log_unnormalized - log_normalization


class ContinuousBernoulli(_ProbsOrLogits, ExponentialFamily):
    """The continuous relaxation of a Bernoulli on [0, 1] (Loaiza-Ganem & Cunningham), normalised; near probs = 1/2
    (inside ``lims``) its normaliser, moments and cdf switch to torch's Taylor expansions."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    has_rsample = True
    is_binary = True

    def __init__(self, probs=None, logits=None, lims=(0.499, 0.501), validate_args=None) -> None:
        _one_of(probs, logits)
        given = probs if probs is not None else logits
        (param,) = broadcast_all(given)
        if probs is not None:
            if validate_args is not None and not bool(constraints.unit_interval.check(param).all()):
                raise ValueError("The parameter probs has invalid values")
            param = clamp_probs(param)
        self.__dict__["probs" if probs is not None else "logits"] = param
        self._lims = lims
        super().__init__(() if isinstance(given, Number) else param.shape, (), validate_args)

    @property
    def probs(self):
        if "probs" not in self.__dict__:
            self.__dict__["probs"] = clamp_probs(_ProbsOrLogits.probs.fget(self))
        return self.__dict__["probs"]

    def expand(self, batch_shape, _instance=None):
        key = "probs" if "probs" in self.__dict__ else "logits"
        new = ContinuousBernoulli(**{key: self.__dict__[key].expand(batch_shape)}, lims=self._lims,
                                  validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _outside_unstable_region(self):
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self):
        return where(self._outside_unstable_region(), self.probs, self._lims[0] * ones_like(self.probs))

    def _cont_bern_log_norm(self):
        cut = self._cut_probs()
        below_half = where(cut <= 0.5, cut, zeros_like(cut))
        above_half = where(cut >= 0.5, cut, ones_like(cut))
        log_norm = ((-cut).log1p() - cut.log()).abs().log() - where(cut <= 0.5, (-2.0 * below_half).log1p(),
                                                                       (2.0 * above_half - 1.0).log())
        x = (self.probs - 0.5).pow(2)
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return where(self._outside_unstable_region(), log_norm, taylor)

    @property
    def mean(self):
        cut = self._cut_probs()
        mus = cut / (2.0 * cut - 1.0) + 1.0 / ((-cut).log1p() - cut.log())
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x.pow(2)) * x
        return where(self._outside_unstable_region(), mus, taylor)

    @property
    def variance(self):
        cut = self._cut_probs()
        variances = cut * (cut - 1.0) / (1.0 - 2.0 * cut).pow(2) + 1.0 / ((-cut).log1p() - cut.log()).pow(2)
        x = (self.probs - 0.5).pow(2)
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return where(self._outside_unstable_region(), variances, taylor)

    def rsample(self, sample_shape=()):
        u = rand(self._extended_shape(sample_shape), dtype=self.probs.dtype, device=self.probs.device)
        return self.icdf(u)

    def log_prob(self, value):
        from tilewise.nn.functional import binary_cross_entropy_with_logits

        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none") + self._cont_bern_log_norm()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        cut = self._cut_probs()
        cdfs = (cut.pow(value) * (1.0 - cut).pow(1.0 - value) + cut - 1.0) / (2.0 * cut - 1.0)
        unbounded = where(self._outside_unstable_region(), cdfs, value)
        return where(value <= 0.0, zeros_like(value), where(value >= 1.0, ones_like(value), unbounded))

    def icdf(self, value):
        cut = self._cut_probs()
        inverted = ((-cut + value * (2.0 * cut - 1.0)).log1p() - (-cut).log1p()) / (cut.log() - (-cut).log1p())
        return where(self._outside_unstable_region(), inverted, value)

    def entropy(self):
        log_probs0, log_probs1 = (-self.probs).log1p(), self.probs.log()
        return self.mean * (log_probs0 - log_probs1) - self._cont_bern_log_norm() - log_probs0


class InverseGamma(TransformedDistribution):
    """1 / X of a Gamma(concentration, rate) X."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, concentration, rate, validate_args=None) -> None:
        base_dist = Gamma(concentration, rate, validate_args=validate_args)
        super().__init__(base_dist, PowerTransform(-base_dist.rate.new_ones(())), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = InverseGamma(self.concentration.expand(batch_shape), self.rate.expand(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    concentration = property(lambda self: self.base_dist.concentration)
    rate = property(lambda self: self.base_dist.rate)
    mode = property(lambda self: self.rate / (self.concentration + 1))

    @property
    def mean(self):
        return where(self.concentration > 1, self.rate / (self.concentration - 1), math.inf)

    @property
    def variance(self):
        c = self.concentration
        return where(c > 2, self.rate.square() / ((c - 1).square() * (c - 2)), math.inf)

    def entropy(self):
        c = self.concentration
        return c + self.rate.log() + c.lgamma() - (1 + c) * c.digamma()


class LogisticNormal(TransformedDistribution):
    """A point of the simplex by stick breaking of a Normal's draw (of one coordinate fewer)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None) -> None:
        base_dist = Normal(loc, scale, validate_args=validate_args)
        if not base_dist.batch_shape:
            base_dist = base_dist.expand([1])
        super().__init__(base_dist, StickBreakingTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        shape = tuple(batch_shape) + (self.loc.shape[-1],)
        new = LogisticNormal(self.loc.expand(shape), self.scale.expand(shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    loc = property(lambda self: self.base_dist.base_dist.loc)
    scale = property(lambda self: self.base_dist.base_dist.scale)


def _kumaraswamy_moments(a, b, n):
    arg1 = 1 + n / a
    return b * (arg1.lgamma() + b.lgamma() - (arg1 + b).lgamma()).exp()


class Kumaraswamy(TransformedDistribution):
    """``(1 - U ** (1 / b)) ** (1 / a)`` of a uniform U: a Beta-like distribution on (0, 1) with a closed-form cdf."""

    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None) -> None:
        from tilewise.distributions.continuous import Uniform

        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        base_dist = Uniform(zeros_like(self.concentration0), ones_like(self.concentration0),
                            validate_args=validate_args)
        transforms = [PowerTransform(exponent=self.concentration0.reciprocal()), AffineTransform(loc=1.0, scale=-1.0),
                      PowerTransform(exponent=self.concentration1.reciprocal())]
        super().__init__(base_dist, transforms, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = Kumaraswamy(self.concentration1.expand(batch_shape), self.concentration0.expand(batch_shape),
                          validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: _kumaraswamy_moments(self.concentration1, self.concentration0, 1))
    variance = property(lambda self: _kumaraswamy_moments(self.concentration1, self.concentration0, 2)
                        - self.mean.pow(2))

    @property
    def mode(self):
        a, b = self.concentration1, self.concentration0
        log_mode = b.reciprocal() * (-b).log1p() - (-b * a).log1p()  # torch's expression, kept as it is
        return log_mode.masked_fill((b < 1) | (a < 1), math.nan).exp()

    def entropy(self):
        t1, t0 = 1 - self.concentration1.reciprocal(), 1 - self.concentration0.reciprocal()
        h0 = (self.concentration0 + 1).digamma() + _EULER
        return t0 + t1 * h0 - self.concentration1.log() - self.concentration0.log()


__all__ = ["Cauchy", "Chi2", "ContinuousBernoulli", "Geometric", "HalfCauchy", "HalfNormal", "InverseGamma",
           "Kumaraswamy", "LogisticNormal", "Multinomial", "NegativeBinomial", "Pareto", "StudentT", "Weibull"]

