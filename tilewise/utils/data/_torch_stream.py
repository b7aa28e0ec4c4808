"""torch's CPU random stream, for the draws that decide what a data pipeline reads.

[Note: sampler streams] A script that seeds a generator for its data (``DataLoader(shuffle=True,
generator=g)``, ``random_split(..., generator=g)``, ``WeightedRandomSampler(..., generator=g)``) expects the
same seed to give the same order, the same split and the same worker seeds wherever it runs, and a run moved
from torch to tilewise to read its samples in the order it read them before (a checkpointed epoch resumed,
a validation split kept apart). So the samplers, ``random_split`` and the DataLoader's worker seeds do not
draw from tilewise's Philox stream: they draw what torch's CPU generator draws. That generator is a Mersenne
Twister seeded with the low 32 bits of the seed (numpy's legacy ``RandomState(seed)`` seeds the same twister
the same way), giving 32-bit numbers, and 64-bit ones made of two (the first the high half). From it, torch's
CPU kernels take:

- ``randperm(n)`` (n < 2**32 / 20): a Fisher-Yates pass whose ``i``-th swap partner is ``i + x % (n - i)``
  for the next 32-bit ``x``;
- ``randint(0, n)`` (int64, n < 2**32): ``x % n`` for the next 32-bit ``x``, one per element;
- ``random_()`` of an int64 scalar (a base seed): the next 64-bit number modulo 2**63;
- ``multinomial`` of float64 weights: with replacement and more than one sample,
  ``u = (next 64-bit & (2**53 - 1)) / 2**53`` per sample and the first category whose normalised cumulative
  weight (left-to-right sums, divided by the total, the last set to 1) is at least ``u``; otherwise the
  ``num_samples`` largest of ``w / e``, with ``e = -log1p(-u)`` drawn so for every category in turn.

Each tilewise Generator gets its twister on first use, seeded from the generator's seed, and the twister goes
on from draw to draw as torch's does; every draw also moves the generator's Philox offset (one counter per four
32-bit numbers), so that ``manual_seed`` (which puts the offset back to 0) or any change of seed restarts the
twister from the seed. Restoring a saved state (``set_state``) restarts it as well. Tensor draws (``rand``,
dropout) are Philox's and do not move the twister, so a stream shared by both gives torch's orders only for
the sampler draws made before the first tensor draw differs: seed a generator for the data alone, as scripts
do. Permutations of 2**32 / 20 or more elements, which torch draws with 64-bit numbers, are tilewise's own
(Philox) permutations. Two known departures remain without replacement: numpy's ``log1p`` may round a key
differently in the last bit from torch's vectorised one (which only matters between two near-equal keys), and
categories of equal key (the zero weights drawn once the positive ones run out) come lowest index first, where
torch's ``topk`` orders them its own way.
"""

from __future__ import annotations

import weakref

import numpy as np

SMALL_PERMUTATION = 2**32 // 20  # torch's randperm swaps by 32-bit draws below this length
_DOUBLE_MANTISSA = (1 << 53) - 1


class TwisterStream:
    """torch's CPU generator seeded with ``seed``: 32-bit and 64-bit draws in torch's order."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.MT19937()
        self._bits.state = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)
        self.drawn = 0  # 32-bit numbers drawn so far

    def bits32(self, count: int) -> np.ndarray:
        self.drawn += count
        return self._bits.random_raw(count) if count else np.zeros(0, np.uint64)

    def bits64(self, count: int) -> np.ndarray:
        pairs = self.bits32(2 * count).reshape(count, 2)
        return (pairs[:, 0] << np.uint64(32)) | pairs[:, 1]

    def permutation(self, n: int) -> list[int]:
        partners = (np.arange(n - 1) + (self.bits32(max(n - 1, 0)) % np.arange(n, 1, -1, dtype=np.uint64))
                    .astype(np.int64)).tolist()
        order = list(range(n))
        for i, j in enumerate(partners):
            order[i], order[j] = order[j], order[i]
        return order

    def integers(self, high: int, count: int) -> list[int]:
        return (self.bits32(count) % np.uint64(high)).astype(np.int64).tolist()

    def uniforms(self, count: int) -> np.ndarray:
        return (self.bits64(count) & np.uint64(_DOUBLE_MANTISSA)).astype(np.float64) / float(1 << 53)


class _Entry:
    __slots__ = ("offset", "seed", "stream")

    def __init__(self, seed: int, offset: int) -> None:
        self.seed, self.offset, self.stream = seed, offset, TwisterStream(seed)


_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _generator(generator, op: str):
    from tilewise.ops.creation import Generator, default_generator
    from tilewise.ops.schema import bad_argument

    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise bad_argument(op, "generator", "tilewise.Generator or None", generator)
    return generator


def _draw(generator, op: str, draw):
    """``draw(stream)`` from the twister of ``generator`` (see [Note: sampler streams])."""
    generator = _generator(generator, op)
    seed, offset = generator.initial_seed(), generator.offset
    entry = _streams.get(generator)
    if entry is None or entry.seed != seed or offset < entry.offset:
        entry = _streams[generator] = _Entry(seed, offset)
    before = entry.stream.drawn
    result = draw(entry.stream)
    generator.claim(-(-(entry.stream.drawn - before) // 4))
    entry.offset = generator.offset
    return result


def randperm(n: int, generator=None) -> list[int]:
    """``torch.randperm(n, generator=generator).tolist()`` on the CPU."""
    if n >= SMALL_PERMUTATION:
        from tilewise.ops.creation import randperm as philox_randperm

        return philox_randperm(n, generator=generator).tolist()
    return _draw(generator, "randperm", lambda stream: stream.permutation(n))


def randint(high: int, count: int, generator=None) -> list[int]:
    """``torch.randint(high, (count,), generator=generator).tolist()`` on the CPU (``high`` < 2**32)."""
    return _draw(generator, "randint", lambda stream: stream.integers(high, count))


def random_seed(generator=None) -> int:
    """``torch.empty((), dtype=torch.int64).random_(generator=generator).item()``: a seed in [0, 2**63)."""
    return _draw(generator, "random_", lambda stream: int(stream.bits64(1)[0] % np.uint64(1 << 63)))


def multinomial(weights, num_samples: int, replacement: bool, generator=None) -> list[int]:
    """``torch.multinomial(weights, num_samples, replacement, generator=generator).tolist()`` for a 1-d float64
    tensor of weights on the CPU, refused as tilewise's ``multinomial`` refuses it."""
    from tilewise.ops.creation import check_multinomial, check_probabilities, refuse_entry_drawn_with_replacement

    check_multinomial(weights, num_samples, replacement)
    weights = weights._np()
    invalid = bool((weights < 0).any() or not np.isfinite(weights).all())
    if invalid and replacement and num_samples > 1:
        refuse_entry_drawn_with_replacement(weights)
    check_probabilities(invalid, not invalid and not weights.sum() > 0)
    if replacement and num_samples > 1:
        cumulative = np.cumsum(weights)
        cumulative /= cumulative[-1]
        cumulative[-1] = 1.0
        u = _draw(generator, "multinomial", lambda stream: stream.uniforms(num_samples))
        return np.searchsorted(cumulative, u, side="left").tolist()
    u = _draw(generator, "multinomial", lambda stream: stream.uniforms(len(weights)))
    with np.errstate(divide="ignore", invalid="ignore"):
        keys = weights / -np.log1p(-u)
    return np.argsort(-keys, kind="stable")[:num_samples].tolist()
