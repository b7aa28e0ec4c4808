"""The relaxed (Concrete / Gumbel-softmax) distributions, as torch's: ``ExpRelaxedCategorical`` and
``RelaxedOneHotCategorical`` over the simplex, ``LogitRelaxedBernoulli`` and ``RelaxedBernoulli`` over the unit
interval; their draws are reparametrised (Gumbel noise from uniforms, divided by the temperature)."""

from __future__ import annotations

from numbers import Number

from tilewise.distributions import constraints
from tilewise.distributions.discrete import Categorical, _ProbsOrLogits, clamp_probs
from tilewise.distributions.distribution import Distribution, broadcast_all
from tilewise.distributions.multivariate import TransformedDistribution
from tilewise.distributions.transforms import ExpTransform, SigmoidTransform
from tilewise.ops.creation import full_like, rand


class ExpRelaxedCategorical(Distribution):
    """The logarithm of a RelaxedOneHotCategorical draw: scores ``(logits + gumbels) / temperature``, normalised in
    log space."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None) -> None:
        self._categorical = Categorical(probs, logits)
        self.temperature = temperature
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:], validate_args)

    def expand(self, batch_shape, _instance=None):
        shape = tuple(batch_shape) + tuple(self._event_shape)
        if "probs" in self._categorical.__dict__:
            return ExpRelaxedCategorical(self.temperature, probs=self.probs.expand(shape), validate_args=False)
        return ExpRelaxedCategorical(self.temperature, logits=self.logits.expand(shape), validate_args=False)

    param_shape = property(lambda self: self._categorical.param_shape)
    logits = property(lambda self: self._categorical.logits)
    probs = property(lambda self: self._categorical.probs)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        uniforms = clamp_probs(rand(shape, dtype=self.logits.dtype, device=self.logits.device))
        gumbels = -((-(uniforms.log())).log())
        scores = (self.logits + gumbels) / self.temperature
        return scores - scores.logsumexp(dim=-1, keepdim=True)

    def log_prob(self, value):
        K = self._categorical._num_events  # noqa: N806 — the number of categories, as the formula names it
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_scale = full_like(self.temperature, float(K)).lgamma() - self.temperature.log().mul(-(K - 1))
        score = logits - value.mul(self.temperature)
        score = (score - score.logsumexp(dim=-1, keepdim=True)).sum(-1)
        return score + log_scale


class _Relaxed(TransformedDistribution):
    """A relaxed distribution: its base (of scores or logits) transformed, whose parameters are the base's."""

    has_rsample = True

    def expand(self, batch_shape, _instance=None):
        base = self.base_dist.expand(batch_shape)
        return type(self)(base.temperature, logits=base.logits, validate_args=False)

    temperature = property(lambda self: self.base_dist.temperature)
    logits = property(lambda self: self.base_dist.logits)
    probs = property(lambda self: self.base_dist.probs)


class RelaxedOneHotCategorical(_Relaxed):
    """A point of the simplex that approaches a one-hot draw of ``Categorical(probs)`` as the temperature falls."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.simplex

    def __init__(self, temperature, probs=None, logits=None, validate_args=None) -> None:
        base_dist = ExpRelaxedCategorical(temperature, probs, logits, validate_args=validate_args)
        super().__init__(base_dist, ExpTransform(), validate_args=validate_args)


class LogitRelaxedBernoulli(_ProbsOrLogits, Distribution):
    """The logit of a RelaxedBernoulli draw: ``(logistic noise + logits) / temperature``."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.real
    is_binary = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None) -> None:
        self.temperature = temperature
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        name, param = ("probs", probs) if probs is not None else ("logits", logits)
        (self.__dict__[name],) = broadcast_all(param)
        super().__init__(() if isinstance(param, Number) else self.param_shape, (), validate_args)

    def expand(self, batch_shape, _instance=None):
        if "probs" in self.__dict__:
            return LogitRelaxedBernoulli(self.temperature, probs=self.probs.expand(batch_shape), validate_args=False)
        return LogitRelaxedBernoulli(self.temperature, logits=self.logits.expand(batch_shape), validate_args=False)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        probs = clamp_probs(self.probs.expand(shape))
        uniforms = clamp_probs(rand(shape, dtype=probs.dtype, device=probs.device))
        return (uniforms.log() - (-uniforms).log1p() + probs.log() - (-probs).log1p()) / self.temperature

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        diff = logits - value.mul(self.temperature)
        return self.temperature.log() + diff - 2 * diff.exp().log1p()


class RelaxedBernoulli(_Relaxed):
    """A point of (0, 1) that approaches a ``Bernoulli(probs)`` draw as the temperature falls."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval

    def __init__(self, temperature, probs=None, logits=None, validate_args=None) -> None:
        base_dist = LogitRelaxedBernoulli(temperature, probs, logits)
        super().__init__(base_dist, SigmoidTransform(), validate_args=validate_args)
