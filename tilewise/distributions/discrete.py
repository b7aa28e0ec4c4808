"""Discrete distributions: Bernoulli, Categorical, OneHotCategorical, Poisson, Binomial (as torch's)."""

from __future__ import annotations

from tilewise.distributions import constraints
from tilewise.distributions.distribution import Distribution, ExponentialFamily, broadcast_all, host_generator
from tilewise.dtypes import finfo
from tilewise.ops.creation import arange, eye
from tilewise.ops.functions import bernoulli, multinomial, xlogy
from tilewise.tensor import from_numpy


def clamp_probs(probs):
    eps = finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary: bool = False):
    clamped = clamp_probs(probs)
    return clamped.log() - (-clamped).log1p() if is_binary else clamped.log()


def logits_to_probs(logits, is_binary: bool = False):
    from tilewise.nn.functional import softmax

    return logits.sigmoid() if is_binary else softmax(logits, dim=-1)


def _one_of(probs, logits):
    if (probs is None) == (logits is None):
        raise ValueError("Either `probs` or `logits` must be specified, but not both.")


class _ProbsOrLogits:
    """``probs`` and ``logits`` computed from whichever was given, once (as torch's lazy_property): under
    enable_grad, so that one first read inside ``sample``'s no_grad still carries the parameters' gradient."""

    is_binary = False

    @property
    def probs(self):
        if "probs" not in self.__dict__:
            from tilewise.autograd import enable_grad

            with enable_grad():
                self.__dict__["probs"] = logits_to_probs(self.__dict__["logits"], self.is_binary)
        return self.__dict__["probs"]

    @property
    def logits(self):
        if "logits" not in self.__dict__:
            from tilewise.autograd import enable_grad

            with enable_grad():
                self.__dict__["logits"] = probs_to_logits(self.__dict__["probs"], self.is_binary)
        return self.__dict__["logits"]

    @property
    def param_shape(self):
        return self.__dict__.get("probs", self.__dict__.get("logits")).shape


class Bernoulli(_ProbsOrLogits, ExponentialFamily):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True
    is_binary = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        _one_of(probs, logits)
        if probs is not None:
            (self.__dict__["probs"],) = broadcast_all(probs)
        else:
            (self.__dict__["logits"],) = broadcast_all(logits)
        super().__init__(self.param_shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        if "probs" in self.__dict__:
            return Bernoulli(probs=self.probs.expand(batch_shape), validate_args=False)
        return Bernoulli(logits=self.logits.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.probs)
    variance = property(lambda self: self.probs * (1 - self.probs))

    @property
    def mode(self):
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        return mode.masked_fill(self.probs == 0.5, float("nan"))

    def sample(self, sample_shape=()):
        from tilewise.autograd import no_grad

        with no_grad():
            return bernoulli(self.probs.expand(self._extended_shape(sample_shape)))

    def log_prob(self, value):
        from tilewise.nn.functional import binary_cross_entropy_with_logits

        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        from tilewise.nn.functional import binary_cross_entropy_with_logits

        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand: bool = True):
        values = arange(2, dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values


class Categorical(_ProbsOrLogits, Distribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        _one_of(probs, logits)
        if probs is not None:
            if probs.dim() < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.__dict__["probs"] = probs / probs.sum(-1, keepdim=True)
        else:
            if logits.dim() < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.__dict__["logits"] = logits - logits.logsumexp(dim=-1, keepdim=True)
        shape = self.param_shape
        self._num_events = shape[-1]
        super().__init__(shape[:-1], (), validate_args)

    @property
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    def expand(self, batch_shape, _instance=None):
        shape = tuple(batch_shape) + (self._num_events,)
        if "probs" in self.__dict__:
            return Categorical(probs=self.probs.expand(shape), validate_args=False)
        return Categorical(logits=self.logits.expand(shape), validate_args=False)

    @property
    def mean(self):
        return self.probs.new_full(self._extended_shape(), float("nan"))

    @property
    def variance(self):
        return self.probs.new_full(self._extended_shape(), float("nan"))

    @property
    def mode(self):
        return self.probs.argmax(-1)

    def sample(self, sample_shape=()):
        from tilewise.autograd import no_grad

        sample_shape = tuple(sample_shape)
        n = 1
        for s in sample_shape:
            n *= s
        with no_grad():
            probs_2d = self.probs.reshape(-1, self._num_events)
            draws = multinomial(probs_2d, n, replacement=True).t()
            return draws.reshape(self._extended_shape(sample_shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        value, log_pmf = _broadcast_pair(value, self.logits)
        return log_pmf.gather(-1, value[..., :1]).squeeze(-1)

    def entropy(self):
        logits = self.logits.clamp(min=finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True):
        values = arange(self._num_events, device=self.probs.device).reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values


def _broadcast_pair(value, log_pmf):
    """``value`` (..., 1) and ``log_pmf`` (..., K) broadcast over their leading dims, as torch does."""
    from tilewise.distributions.distribution import broadcast_shape

    lead = broadcast_shape(tuple(value.shape[:-1]), tuple(log_pmf.shape[:-1]))
    return value.expand(*lead, 1), log_pmf.expand(*lead, log_pmf.shape[-1])


class OneHotCategorical(Distribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    support = constraints.one_hot
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        self._categorical = Categorical(probs, logits, validate_args=validate_args)
        shape = self._categorical.param_shape
        super().__init__(shape[:-1], shape[-1:], validate_args=False)
        self._validate_args = self._categorical._validate_args

    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)
    param_shape = property(lambda self: self._categorical.param_shape)
    mean = property(lambda self: self._categorical.probs)
    variance = property(lambda self: self._categorical.probs * (1 - self._categorical.probs))

    @property
    def mode(self):
        from tilewise.nn.functional import one_hot

        return one_hot(self._categorical.mode, self._event_shape[-1]).to(self.probs.dtype)

    def expand(self, batch_shape, _instance=None):
        shape = tuple(batch_shape) + tuple(self._event_shape)
        return OneHotCategorical(probs=self.probs.expand(shape), validate_args=False)

    def sample(self, sample_shape=()):
        from tilewise.nn.functional import one_hot

        indices = self._categorical.sample(sample_shape)
        return one_hot(indices, self._event_shape[-1]).to(self.probs.dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._categorical.log_prob(value.max(-1)[1])

    def entropy(self):
        return self._categorical.entropy()

    def enumerate_support(self, expand: bool = True):
        n = self._event_shape[0]
        values = eye(n, dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape((n,) + (1,) * len(self._batch_shape) + (n,))
        return values.expand((n,) + tuple(self._batch_shape) + (n,)) if expand else values


class OneHotCategoricalStraightThrough(OneHotCategorical):
    """One-hot draws whose gradient is that of the probabilities (the straight-through estimator)."""

    has_rsample = True

    def rsample(self, sample_shape=()):
        samples = self.sample(sample_shape)
        probs = self._categorical.probs
        return samples + (probs - probs.detach())


class Poisson(ExponentialFamily):
    arg_constraints = {"rate": constraints.nonnegative}
    support = constraints.nonnegative_integer

    def __init__(self, rate, validate_args=None) -> None:
        (self.rate,) = broadcast_all(rate)
        super().__init__(self.rate.shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        return Poisson(self.rate.expand(batch_shape), validate_args=False)

    mean = property(lambda self: self.rate)
    mode = property(lambda self: self.rate.floor())
    variance = property(lambda self: self.rate)

    def sample(self, sample_shape=()):
        rate = self.rate.detach().cpu().numpy().astype("float64")
        shape = tuple(self._extended_shape(sample_shape))
        draws = host_generator(self.rate.device).poisson(rate, size=shape)
        return from_numpy(draws).to(dtype=self.rate.dtype, device=self.rate.device)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        rate, value = broadcast_all(self.rate, value)
        return xlogy(value, rate) - rate - (value + 1).lgamma()


def _clamp_by_zero(x):
    return (x.clamp(min=0) + x - x.clamp(max=0)) / 2


class Binomial(_ProbsOrLogits, Distribution):
    arg_constraints = {"total_count": constraints.nonnegative_integer, "probs": constraints.unit_interval,
                       "logits": constraints.real}
    has_enumerate_support = True
    is_binary = True

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None) -> None:
        _one_of(probs, logits)
        if probs is not None:
            self.total_count, self.__dict__["probs"] = broadcast_all(total_count, probs)
            self.total_count = self.total_count.type_as(self.__dict__["probs"])
        else:
            self.total_count, self.__dict__["logits"] = broadcast_all(total_count, logits)
            self.total_count = self.total_count.type_as(self.__dict__["logits"])
        super().__init__(self.param_shape, (), validate_args)

    @property
    def support(self):
        return constraints.integer_interval(0, self.total_count)

    def expand(self, batch_shape, _instance=None):
        if "probs" in self.__dict__:
            return Binomial(self.total_count.expand(batch_shape), probs=self.probs.expand(batch_shape),
                            validate_args=False)
        return Binomial(self.total_count.expand(batch_shape), logits=self.logits.expand(batch_shape),
                        validate_args=False)

    mean = property(lambda self: self.total_count * self.probs)
    mode = property(lambda self: ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count))
    variance = property(lambda self: self.total_count * self.probs * (1 - self.probs))

    def sample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        n = self.total_count.detach().cpu().numpy().astype("int64")
        p = self.probs.detach().cpu().numpy().astype("float64")
        draws = host_generator(self.probs.device).binomial(n, p, size=shape)
        return from_numpy(draws).to(dtype=self.probs.dtype, device=self.probs.device)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        n, logits = self.total_count, self.logits
        log_factorial_n = (n + 1).lgamma()
        log_factorial_k = (value + 1).lgamma()
        log_factorial_nmk = (n - value + 1).lgamma()
        normalize = n * _clamp_by_zero(logits) + n * (-logits.abs()).exp().log1p() - log_factorial_n
        return value * logits - log_factorial_k - log_factorial_nmk - normalize

    def entropy(self):
        n = int(self.total_count.max())
        if not bool((self.total_count == n).all()):
            raise NotImplementedError("Inhomogeneous total count not supported by `entropy`.")
        support = self.enumerate_support(False)
        log_prob = self.log_prob(support)
        return -(log_prob.exp() * log_prob).sum(0)

    def enumerate_support(self, expand: bool = True):
        n = int(self.total_count.max())
        if not bool((self.total_count == n).all()):
            raise NotImplementedError("Inhomogeneous total count not supported by `enumerate_support`.")
        values = arange(1 + n, dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
