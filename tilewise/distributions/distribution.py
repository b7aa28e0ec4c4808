"""The base class of probability distributions, as torch's ``distributions.Distribution``.

[Note: distributions] A distribution holds broadcast parameter tensors and knows its ``batch_shape`` (independent
distributions side by side) and ``event_shape`` (the shape of one draw). ``sample`` draws without gradient;
``rsample`` (where ``has_rsample``) draws by reparametrisation so gradients reach the parameters. Parameters
are checked against ``arg_constraints`` and values given to ``log_prob`` against ``support`` when argument
validation is on (the default, as torch's ``__debug__``), with torch's messages. Draws that tensor operators
cannot express exactly (gamma, Poisson, binomial) are made on the host by numpy's generator, seeded from
tilewise's generator so that ``manual_seed`` reproduces them, then moved to the parameters' device.
"""

from __future__ import annotations

import warnings

import numpy as np

from tilewise.distributions import constraints
from tilewise.dtypes import get_default_dtype
from tilewise.ops.creation import randint
from tilewise.tensor import Size, Tensor, tensor

_VALIDATE = [True]


def _size(shape) -> tuple[int, ...]:
    return Size(tuple(shape))


def broadcast_all(*values):
    """The arguments as tensors of one broadcast shape (numbers take the dtype of the first tensor)."""
    like = next((v for v in values if isinstance(v, Tensor)), None)
    if like is None:
        tensors = [tensor(float(v), dtype=get_default_dtype()) for v in values]
    else:
        tensors = [v if isinstance(v, Tensor) else tensor(float(v), dtype=like.dtype, device=like.device)
                   for v in values]
    shape = broadcast_shape(*(tuple(t.shape) for t in tensors))
    return tuple(t.expand(shape) for t in tensors)


def broadcast_shape(*shapes) -> tuple[int, ...]:
    """numpy's and torch's broadcasting of shapes, with torch's error."""
    out: list[int] = []
    for shape in shapes:
        shape = tuple(shape)
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        for i, size in enumerate(shape, len(out) - len(shape)):
            if out[i] == 1:
                out[i] = size
            elif size not in (1, out[i]):
                raise RuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape.  Mismatch is "
                                   f"between arg 0 and arg {shapes.index(shape)}: {tuple(shapes[0])} vs {shape}")
    return tuple(out)


def host_generator(device) -> np.random.Generator:
    """A numpy generator seeded by two draws from tilewise's generator (so ``manual_seed`` reproduces it)."""
    seeds = randint(0, 2**31 - 1, (2,)).tolist()
    return np.random.default_rng(seeds)


class Distribution:
    has_rsample = False
    has_enumerate_support = False
    arg_constraints: dict = {}
    support = None

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        if value not in (True, False):
            raise ValueError
        _VALIDATE[0] = value

    def __init__(self, batch_shape=(), event_shape=(), validate_args: bool | None = None) -> None:
        self._batch_shape, self._event_shape = _size(batch_shape), _size(event_shape)
        self._validate_args = _VALIDATE[0] if validate_args is None else validate_args
        if self._validate_args:
            for param, constraint in self.arg_constraints.items():
                if param not in self.__dict__:
                    continue  # given the other way (logits for probs), computed when first read
                value = getattr(self, param)
                if not bool(constraint.check(value).all()):
                    raise ValueError(f"Expected parameter {param} ({type(value).__name__} of shape "
                                     f"{tuple(value.shape)}) of distribution {self!r} to satisfy the constraint "
                                     f"{constraint!r}, but found invalid values:\n{value}")

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def expand(self, batch_shape, _instance=None):
        raise NotImplementedError(f"{type(self).__name__}.expand is not implemented")

    @property
    def mean(self):
        raise NotImplementedError

    @property
    def mode(self):
        raise NotImplementedError(f"{type(self)} does not implement mode")

    @property
    def variance(self):
        raise NotImplementedError

    @property
    def stddev(self):
        return self.variance.sqrt()

    def sample(self, sample_shape=()):
        from tilewise.autograd import no_grad

        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        raise NotImplementedError

    def sample_n(self, n: int):
        warnings.warn("`sample_n(n)` will be deprecated. Use `sample((n,))` instead.", FutureWarning, stacklevel=2)
        return self.sample((n,))

    def log_prob(self, value):
        raise NotImplementedError

    def cdf(self, value):
        raise NotImplementedError

    def icdf(self, value):
        raise NotImplementedError

    def entropy(self):
        raise NotImplementedError

    def perplexity(self):
        return self.entropy().exp()

    def enumerate_support(self, expand: bool = True):
        raise NotImplementedError

    def _extended_shape(self, sample_shape=()):
        return _size(tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape))

    def _validate_sample(self, value) -> None:
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        event_dim = len(self._event_shape)
        if tuple(value.shape[value.dim() - event_dim:]) != tuple(self._event_shape):
            raise ValueError(f"The right-most size of value must match event_shape: {value.shape} vs "
                             f"{self._event_shape}.")
        actual, expected = value.shape, self._batch_shape + self._event_shape
        for i, j in zip(reversed(actual), reversed(expected)):
            if i != 1 and j != 1 and i != j:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {actual} vs {expected}.")
        support = self.support
        if support is not None and not bool(support.check(value).all()):
            raise ValueError(f"Expected value argument ({type(value).__name__} of shape {tuple(value.shape)}) to be "
                             f"within the support ({support!r}) of the distribution {self!r}, but found invalid "
                             f"values:\n{value}")

    def __repr__(self) -> str:
        names = [k for k in self.arg_constraints if k in self.__dict__]
        args = ", ".join(f"{p}: {self.__dict__[p] if self.__dict__[p].numel() == 1 else self.__dict__[p].size()}"
                         for p in names)
        return f"{type(self).__name__}({args})"


class ExponentialFamily(Distribution):
    """Marker base, as torch's (its Bregman-divergence entropy is not used here)."""


__all__ = ["Distribution", "ExponentialFamily", "broadcast_all", "constraints"]
