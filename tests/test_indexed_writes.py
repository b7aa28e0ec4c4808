"""Indexed writes with a source of another dtype, and bool masks given to index_put: torch's results and errors
(and addmv's, which refuses two dtypes as they do).

torch refuses an ``index_put`` (and ``x[index] = value`` with a tensor index) whose values have another dtype,
except one bool mask with a one-element value (its ``masked_fill`` path, which converts); basic indexing copies
and converts; every scatter refuses a ``src`` of another dtype before any other check; ``index_put`` takes bool
masks as the positions they select.
"""

from __future__ import annotations

import pytest
import torch

import tilewise as tw

M = [True, False, True, False, False]


def _set(t, shape, key, value):
    x = t.zeros(*shape)
    x[key(t)] = value(t)
    return x


CASES = {
    "slice, float64 value": lambda t: _set(t, (5,), lambda t: slice(0, 2), lambda t: t.ones(2, dtype=t.float64)),
    "slice on a tensor that needs grad": lambda t: (lambda x: (x.__setitem__(slice(0, 2), t.ones(2, dtype=t.float64)),
                                                               x.detach())[1])(t.zeros(5, requires_grad=True).clone()),
    "mask, two float64 values": lambda t: _set(t, (5,), lambda t: t.tensor(M), lambda t: t.ones(2, dtype=t.float64)),
    "mask, 0-dim float64 value": lambda t: _set(t, (5,), lambda t: t.tensor(M),
                                                lambda t: t.tensor(2.0, dtype=t.float64)),
    "mask, one float64 value": lambda t: _set(t, (5,), lambda t: t.tensor(M),
                                              lambda t: t.tensor([2.0], dtype=t.float64)),
    "mask and int, one value": lambda t: _set(t, (2, 3), lambda t: (t.tensor([True, False]), 0),
                                              lambda t: t.tensor([2.0], dtype=t.float64)),
    "slice and mask, one value": lambda t: _set(t, (3, 2), lambda t: (slice(None), t.tensor([True, False])),
                                                lambda t: t.tensor([2.0], dtype=t.float64)),
    "mask into int32, float value": lambda t: (lambda x: (x.__setitem__(t.tensor(M), t.tensor(2.7, dtype=t.float64)),
                                                          x)[1])(t.zeros(5, dtype=t.int32)),
    "index, 0-dim float64 value": lambda t: _set(t, (5,), lambda t: t.tensor([0, 1]),
                                                 lambda t: t.tensor(2.0, dtype=t.float64)),
    "index, int64 values": lambda t: _set(t, (5,), lambda t: t.tensor([0, 1]), lambda t: t.ones(2, dtype=t.int64)),
    "list index, float64 values": lambda t: _set(t, (5,), lambda t: [0, 1], lambda t: t.ones(2, dtype=t.float64)),
    "slice and index, float64": lambda t: _set(t, (2, 3), lambda t: (slice(None), t.tensor([0, 1])),
                                               lambda t: t.ones(2, 2, dtype=t.float64)),
    "index, Python number": lambda t: _set(t, (5,), lambda t: t.tensor([0, 1]), lambda t: 2),
    "index_put, mask, one value": lambda t: t.zeros(5).index_put((t.tensor(M),), t.tensor([2.0], dtype=t.float64)),
    "index_put, mask, two values": lambda t: t.zeros(5).index_put((t.tensor(M),), t.tensor([2.0, 3.0])),
    "index_put_, mask, accumulate": lambda t: t.ones(5).index_put_((t.tensor(M),), t.tensor([2.0, 3.0]),
                                                                    accumulate=True),
    "index_put, mask, accumulate, float64": lambda t: t.ones(5).index_put_(
        (t.tensor(M),), t.tensor([2.0], dtype=t.float64), accumulate=True),
    "index_put, 2-d mask": lambda t: t.zeros(2, 3).index_put((t.tensor([[True, False, True], [False, False, True]]),),
                                                            t.tensor([1.0, 2.0, 3.0])),
    "index_put, mask of the wrong length": lambda t: t.zeros(5).index_put((t.tensor([True, False]),), t.tensor(2.0)),
    "index_put, index, float64": lambda t: t.zeros(5).index_put((t.tensor([0, 1]),), t.tensor(2.0, dtype=t.float64)),
    "getitem, 2-d mask of the wrong shape": lambda t: t.zeros(2, 3)[t.tensor([[True, False], [True, True]])],
    "getitem, slice and mask of the wrong length": lambda t: t.zeros(2, 3)[:, t.tensor([True, False])],
    "scatter_add, float64 src": lambda t: t.zeros(5).scatter_add(0, t.tensor([0, 1]), t.ones(2, dtype=t.float64)),
    "scatter_add_, float16 src": lambda t: t.zeros(5).scatter_add_(0, t.tensor([0]), t.ones(1, dtype=t.float16)),
    "scatter, 0-dim float64 src": lambda t: t.zeros(5).scatter(0, t.tensor([0]), t.tensor(1.0, dtype=t.float64)),
    "scatter_reduce, float64 src": lambda t: t.zeros(5).scatter_reduce(0, t.tensor([0, 1]), t.ones(2, dtype=t.float64),
                                                                       "sum"),
    "scatter_add, int32 index and float64 src": lambda t: t.zeros(5).scatter_add(0, t.tensor([0], dtype=t.int32),
                                                                                  t.ones(1, dtype=t.float64)),
    "scatter, Python number": lambda t: t.zeros(5).scatter(0, t.tensor([0]), 2.0),
    # addmv, another product that refuses two dtypes, after its shape checks
    "addmv, bfloat16 vec": lambda t: t.addmv(t.zeros(2), t.ones(2, 3), t.ones(3, dtype=t.bfloat16)),
    "addmv, float64 self": lambda t: t.addmv(t.zeros(2, dtype=t.float64), t.ones(2, 3), t.ones(3)),
    "addmv, wrong vec size and dtype": lambda t: t.addmv(t.zeros(5), t.ones(2, 3), t.ones(3, dtype=t.float64)),
    "addmv, 0-dim self, wrong vec size": lambda t: t.addmv(t.zeros(()), t.ones(2, 3), t.ones(4)),
    "addmv, one-element self": lambda t: t.addmv(t.ones(1), t.ones(2, 3), t.ones(3)),
    "addmv, 3-d self": lambda t: t.addmv(t.zeros(2, 2, 2), t.ones(2, 3), t.ones(3)),
}


def _outcome(fn, t):
    try:
        out = fn(t)
    except Exception as exc:  # noqa: BLE001 -- compared with torch's
        return type(exc).__name__, str(exc)
    return "ok", str(out.dtype).split(".")[-1], out.tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_indexed_writes_match_torch(case):
    assert _outcome(CASES[case], tw) == _outcome(CASES[case], torch)


def test_index_put_with_a_mask_differentiates_as_torch():
    def run(t):
        x = t.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
        v = t.tensor([10.0, 20.0], requires_grad=True)
        out = x.index_put((t.tensor(M),), v)
        (out * t.arange(5.0)).sum().backward()
        return out.tolist(), x.grad.tolist(), v.grad.tolist()

    assert run(tw) == run(torch)
