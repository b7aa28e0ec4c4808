"""Continuous univariate distributions: Normal, Uniform, Exponential, Laplace, Gamma, Beta (as torch's)."""

from __future__ import annotations

import math

from tilewise.distributions import constraints
from tilewise.distributions.distribution import Distribution, ExponentialFamily, broadcast_all, host_generator
from tilewise.dtypes import finfo
from tilewise.ops.creation import rand, randn
from tilewise.ops.functions import igamma, xlogy
from tilewise.tensor import as_tensor, from_numpy


def _finfo(t):
    return finfo(t.dtype)


def _from_host(array, like):
    return from_numpy(array).to(dtype=like.dtype, device=like.device)


class Normal(ExponentialFamily):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Normal(self.loc.expand(batch_shape), self.scale.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.loc)
    mode = property(lambda self: self.loc)
    stddev = property(lambda self: self.scale)
    variance = property(lambda self: self.scale.pow(2))

    def rsample(self, sample_shape=()):
        eps = randn(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        log_scale = self.scale.log()
        return -((value - self.loc) ** 2) / (2 * self.variance) - log_scale - math.log(math.sqrt(2 * math.pi))

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + ((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)).erf())

    def icdf(self, value):
        return self.loc + self.scale * (2 * value - 1).erfinv() * math.sqrt(2)

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()


class Uniform(Distribution):
    arg_constraints = {"low": constraints.real, "high": constraints.real}
    has_rsample = True

    def __init__(self, low, high, validate_args=None) -> None:
        self.low, self.high = broadcast_all(low, high)
        super().__init__(self.low.shape, (), validate_args)
        if self._validate_args and not bool((self.low < self.high).all()):
            raise ValueError("Uniform is not defined when low>= high")

    @property
    def support(self):
        return constraints.interval(self.low, self.high)

    def expand(self, batch_shape, _instance=None):
        return Uniform(self.low.expand(batch_shape), self.high.expand(batch_shape), validate_args=False)

    mean = property(lambda self: (self.high + self.low) / 2)
    stddev = property(lambda self: (self.high - self.low) / 12**0.5)
    variance = property(lambda self: (self.high - self.low).pow(2) / 12)

    @property
    def mode(self):
        return self.high * float("nan")

    def rsample(self, sample_shape=()):
        u = rand(self._extended_shape(sample_shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        lb = (self.low <= value).to(self.low.dtype)
        ub = (self.high > value).to(self.low.dtype)
        return (lb * ub).log() - (self.high - self.low).log()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.low) / (self.high - self.low)).clamp(min=0, max=1)

    def icdf(self, value):
        return value * (self.high - self.low) + self.low

    def entropy(self):
        return (self.high - self.low).log()


class Exponential(ExponentialFamily):
    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, rate, validate_args=None) -> None:
        (self.rate,) = broadcast_all(rate)
        super().__init__(self.rate.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Exponential(self.rate.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.rate.reciprocal())
    mode = property(lambda self: self.rate * 0)
    stddev = property(lambda self: self.rate.reciprocal())
    variance = property(lambda self: self.rate.pow(-2))

    def rsample(self, sample_shape=()):
        u = rand(self._extended_shape(sample_shape), dtype=self.rate.dtype, device=self.rate.device)
        return -(-u).log1p() / self.rate  # -log(1 - u) is an Exp(1) draw, never -log(0)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - (-self.rate * value).exp()

    def icdf(self, value):
        return -(-value).log1p() / self.rate

    def entropy(self):
        return 1.0 - self.rate.log()


class Laplace(Distribution):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Laplace(self.loc.expand(batch_shape), self.scale.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.loc)
    mode = property(lambda self: self.loc)
    stddev = property(lambda self: 2**0.5 * self.scale)
    variance = property(lambda self: 2 * self.scale.pow(2))

    def rsample(self, sample_shape=()):
        eps = _finfo(self.loc).eps
        u = rand(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        u = u * (2 - eps) + (eps - 1)  # uniform on (eps - 1, 1), as torch draws it
        return self.loc - self.scale * u.sign() * (-u.abs()).log1p()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -(2 * self.scale).log() - (value - self.loc).abs() / self.scale

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 - 0.5 * (value - self.loc).sign() * (-(value - self.loc).abs() / self.scale).expm1()

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * term.sign() * (-2 * term.abs()).log1p()

    def entropy(self):
        return 1 + (2 * self.scale).log()


def _standard_gamma(concentration, sample_shape=()):
    shape = tuple(sample_shape) + tuple(concentration.shape)
    alpha = concentration.detach().cpu().numpy().astype("float64")
    draws = host_generator(concentration.device).standard_gamma(alpha, size=shape)
    tiny = float(_finfo(concentration).tiny)
    return _from_host(draws.clip(min=tiny), concentration)  # torch clamps to the smallest normal number too


def _no_concentration_gradient(name, concentration) -> None:
    if concentration.requires_grad:
        raise NotImplementedError(f"{name}.rsample: gradients with respect to the concentration are not "
                                  "supported (the sampler runs on the host); draw with .sample(), or use a "
                                  "concentration that does not require grad")


class Gamma(ExponentialFamily):
    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration, rate, validate_args=None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        super().__init__(self.concentration.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Gamma(self.concentration.expand(batch_shape), self.rate.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.concentration / self.rate)
    mode = property(lambda self: ((self.concentration - 1) / self.rate).clamp(min=0))
    variance = property(lambda self: self.concentration / self.rate.pow(2))

    def rsample(self, sample_shape=()):
        _no_concentration_gradient("Gamma", self.concentration)
        value = _standard_gamma(self.concentration.expand(self._batch_shape), sample_shape) / self.rate
        return value.clamp(min=float(_finfo(value).tiny))

    def log_prob(self, value):
        value = as_tensor(value, dtype=self.rate.dtype, device=self.rate.device)
        if self._validate_args:
            self._validate_sample(value)
        return (xlogy(self.concentration, self.rate) + xlogy(self.concentration - 1, value) - self.rate * value
                - self.concentration.lgamma())

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return igamma(self.concentration, self.rate * value)

    def entropy(self):
        c = self.concentration
        return c - self.rate.log() + c.lgamma() + (1.0 - c) * c.digamma()


class Beta(ExponentialFamily):
    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None) -> None:
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        super().__init__(self.concentration1.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Beta(self.concentration1.expand(batch_shape), self.concentration0.expand(batch_shape),
                    validate_args=False)

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self):
        return (self.concentration1 - 1) / (self.concentration1 + self.concentration0 - 2)

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        _no_concentration_gradient("Beta", self.concentration1)
        _no_concentration_gradient("Beta", self.concentration0)
        x = _standard_gamma(self.concentration1.expand(self._batch_shape), sample_shape)
        y = _standard_gamma(self.concentration0.expand(self._batch_shape), sample_shape)
        eps = float(_finfo(x).eps)
        return (x / (x + y)).clamp(min=eps, max=1 - eps)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a, b = self.concentration1, self.concentration0
        return xlogy(a - 1, value) + xlogy(b - 1, 1 - value) - (a.lgamma() + b.lgamma() - (a + b).lgamma())

    def entropy(self):
        a, b = self.concentration1, self.concentration0
        total = a + b
        log_beta = a.lgamma() + b.lgamma() - total.lgamma()
        return log_beta - (a - 1) * a.digamma() - (b - 1) * b.digamma() + (total - 2) * total.digamma()
