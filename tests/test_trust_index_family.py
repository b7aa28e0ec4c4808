"""The index family against torch: gather, scatter (tensor and number sources, ``reduce=``), scatter_add,
scatter_reduce, take_along_dim, index_select, index_add, index_copy, index_fill, index_reduce, put, take,
masked_select, masked_scatter, embedding and advanced indexing.

Each case runs in torch and in tilewise: a result is compared (values, shape, dtype and, where a float input
requires grad, the gradients of a weighted sum of the result), an error by its exact exception type and torch's
words (torch's operator prefix, such as ``index_add_():``, dropped). The tables cover what torch does with a
0-dim self, index or source (one element along one dim), indices out of range or negative, and index dtypes.
Gather and scatter also run compiled, where a bad index must raise as it does eagerly.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


class Maker:
    """Builds a case's tensors in one library, on one device; remembers the float leaves that require grad."""

    def __init__(self, lib, device: str = "cpu"):
        self.lib, self.device, self.leaves = lib, device, []

    def f(self, values, grad: bool = True):
        x = self.lib.tensor(values, dtype=self.lib.float64, device=self.device)
        if grad:
            x.requires_grad_(True)
            self.leaves.append(x)
        return x

    def i(self, values, dtype: str = "int64"):
        return self.lib.tensor(values, dtype=getattr(self.lib, dtype), device=self.device)

    def b(self, values):
        return self.lib.tensor(values, dtype=self.lib.bool, device=self.device)


def _outcome(case, lib, device: str = "cpu", compiled: bool = False):
    """(result as numpy, gradients as numpy) or the exception the case raised."""
    m = Maker(lib, device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if compiled:
                out = tw.compile(lambda: case(m))()
            else:
                out = case(m)
            if out.requires_grad:
                weights = lib.arange(1, out.numel() + 1, dtype=out.dtype, device=out.device).reshape(out.shape)
                (out * weights).sum().backward()
            values = np.asarray(out.detach().cpu().tolist())  # a device-side bounds error surfaces here
            grads = [None if x.grad is None else np.asarray(x.grad.cpu().tolist()) for x in m.leaves]
            return (values, list(out.shape), str(out.dtype).split(".")[-1], grads)
    except Exception as exc:  # noqa: BLE001 — the exception is the outcome compared
        return exc


def _torch_words(exc: Exception) -> str:
    """torch's message, first line, without its operator prefix or final full stop."""
    first = str(exc).splitlines()[0]
    return re.sub(r"^(torch\.)?\w+\(\): ", "", first).rstrip(".")


def check_like_torch(case, words: str | None = None, device: str = "cpu", compiled: bool = False) -> None:
    expected, got = _outcome(case, torch), _outcome(case, tw, device, compiled)
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), f"torch raised {type(expected).__name__}: {expected}; tilewise gave {got}"
        assert type(got) is type(expected), f"{type(got).__name__}: {got}\n(torch: {type(expected).__name__})"
        wanted = words if words is not None else _torch_words(expected)
        assert wanted in str(got), f"{wanted!r} not in {str(got)!r}"
        return
    if isinstance(got, Exception):
        raise AssertionError(f"torch gave {expected[0].tolist()}; tilewise raised {type(got).__name__}: {got}")
    (want, want_shape, want_dtype, want_grads), (have, have_shape, have_dtype, have_grads) = expected, got
    assert (have_shape, have_dtype) == (want_shape, want_dtype)
    np.testing.assert_allclose(have, want, rtol=1e-12, atol=0)
    assert len(have_grads) == len(want_grads)
    for have_grad, want_grad in zip(have_grads, want_grads):
        assert (have_grad is None) == (want_grad is None)
        if want_grad is not None:
            np.testing.assert_allclose(have_grad, want_grad, rtol=1e-12, atol=0)


REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")

# ---------------------------------------------------------------------------- 0-dim operands

ZERO_DIM = {
    "gather 0-d self, 0-d index": lambda m: m.f(3.0).gather(0, m.i(0)),
    "gather 0-d self, dim -1": lambda m: m.f(3.0).gather(-1, m.i(0)),
    "gather 0-d self, 1-d index": lambda m: m.f(3.0).gather(0, m.i([0, 0])),
    "gather 1-d self, 0-d index": lambda m: m.f([3.0, 4.0]).gather(0, m.i(1)),
    "gather 0-d self, empty index": lambda m: m.f(3.0).gather(0, m.i([])),
    "scatter number into 0-d": lambda m: m.f(3.0).scatter(0, m.i(0), 5.0),
    "scatter 0-d src into 0-d": lambda m: m.f(3.0).scatter(0, m.i(0), m.f(7.0)),
    "scatter 1-d src into 0-d": lambda m: m.f(3.0).scatter(0, m.i(0), m.f([7.0])),
    "scatter 1-d index and src into 0-d": lambda m: m.f(3.0).scatter(0, m.i([0]), m.f([7.0])),
    "scatter 0-d index into 1-d": lambda m: m.f([3.0, 4.0]).scatter(0, m.i(1), m.f(7.0)),
    "scatter 0-d index, 1-d src into 1-d": lambda m: m.f([3.0, 4.0]).scatter(0, m.i(1), m.f([7.0, 8.0])),
    # torch has no derivative for scatter(..., value, reduce=): compared without one
    "scatter number, reduce=add, 0-d": lambda m: m.f(3.0, False).scatter(0, m.i(0), 2.0, reduce="add"),
    "scatter number, reduce=multiply, 0-d": lambda m: m.f(3.0, False).scatter(0, m.i(0), 2.0, reduce="multiply"),
    "scatter src, reduce=add, 0-d": lambda m: m.f(3.0, grad=False).scatter(0, m.i(0), m.f(7.0, False), reduce="add"),
    "scatter src, reduce=multiply, 0-d":
        lambda m: m.f(3.0, grad=False).scatter(0, m.i(0), m.f(7.0, False), reduce="multiply"),
    "scatter_add 0-d": lambda m: m.f(3.0).scatter_add(0, m.i(0), m.f(7.0)),
    "scatter_add 0-d index into 1-d": lambda m: m.f([3.0, 4.0]).scatter_add(0, m.i(1), m.f([7.0])),
    **{f"scatter_reduce {r} 0-d include_self={s}":
       (lambda m, r=r, s=s: m.f(3.0).scatter_reduce(0, m.i(0), m.f(7.0), r, include_self=s))
       for r in REDUCTIONS for s in (True, False)},
    "scatter_reduce amax 0-d index into 1-d": lambda m: m.f([3.0, 4.0]).scatter_reduce(0, m.i(1), m.f([7.0]), "amax"),
    "take_along_dim 0-d, no dim": lambda m: tw_or_torch(m).take_along_dim(m.f(3.0), m.i(0)),
    "take_along_dim 0-d, 1-d index, no dim": lambda m: tw_or_torch(m).take_along_dim(m.f(3.0), m.i([0])),
    "take_along_dim 0-d, dim 0": lambda m: tw_or_torch(m).take_along_dim(m.f(3.0), m.i(0), 0),
    "index_select 0-d": lambda m: m.f(3.0).index_select(0, m.i(0)),
    "index_select 0-d, 1-d index": lambda m: m.f(3.0).index_select(0, m.i([0])),
    "index_select 1-d, 0-d index": lambda m: m.f([3.0, 4.0]).index_select(0, m.i(1)),
    "index_add 0-d": lambda m: m.f(3.0).index_add(0, m.i(0), m.f(7.0), alpha=2),
    "index_add 0-d self, 1-d source": lambda m: m.f(3.0).index_add(0, m.i([0]), m.f([7.0])),
    "index_add 1-d self, 0-d source": lambda m: m.f([3.0, 4.0]).index_add(0, m.i(1), m.f(7.0)),
    "index_copy 0-d": lambda m: m.f(3.0).index_copy(0, m.i(0), m.f(7.0)),
    "index_copy 0-d self, 1-d source": lambda m: m.f(3.0).index_copy(0, m.i([0]), m.f([7.0])),
    "index_copy 1-d self, 0-d source": lambda m: m.f([3.0, 4.0]).index_copy(0, m.i(1), m.f(7.0)),
    "index_fill 0-d": lambda m: m.f(3.0).index_fill(0, m.i(0), 7.0),
    "index_fill 0-d, negative": lambda m: m.f(3.0).index_fill(0, m.i(-1), 7.0),
    "index_fill 0-d, tensor value": lambda m: m.f(3.0).index_fill(0, m.i(0), m.f(7.0, grad=False)),
    **{f"index_reduce {r} 0-d include_self={s}":
       (lambda m, r=r, s=s: m.f(3.0, grad=False).index_reduce(0, m.i(0), m.f(7.0, grad=False), r, include_self=s))
       for r in REDUCTIONS[1:] for s in (True, False)},
    "index_reduce 0-d self, 1-d index": lambda m: m.f(3.0, False).index_reduce(0, m.i([0]), m.f(7.0, False), "amax"),
    "index_reduce 0-d self, 1-d source": lambda m: m.f(3.0, False).index_reduce(0, m.i(0), m.f([7.0], False), "amax"),
    "index_reduce 1-d self, 0-d source": lambda m: m.f([3.0, 4.0], False).index_reduce(0, m.i(1), m.f(7.0, False),
                                                                                        "amax"),
    "put 0-d": lambda m: m.f(3.0).put(m.i(0), m.f(7.0)),
    "put 0-d, accumulate": lambda m: m.f(3.0).put(m.i(-1), m.f(7.0), accumulate=True),
    "put_ 0-d": lambda m: m.f(3.0, grad=False).put_(m.i(0), m.f(7.0, grad=False)),
    "take 0-d": lambda m: m.f(3.0).take(m.i(0)),
    "take 0-d, negative": lambda m: m.f(3.0).take(m.i(-1)),
    "take 1-d, 0-d index": lambda m: m.f([3.0, 4.0]).take(m.i(1)),
    "masked_select 0-d, True": lambda m: m.f(3.0).masked_select(m.b(True)),
    "masked_select 0-d, False": lambda m: m.f(3.0).masked_select(m.b(False)),
    "masked_select 0-d self, 1-d mask": lambda m: m.f(3.0).masked_select(m.b([True, False])),
    "masked_select 1-d self, 0-d mask": lambda m: m.f([3.0, 4.0]).masked_select(m.b(True)),
    "masked_scatter 0-d": lambda m: m.f(3.0).masked_scatter(m.b(True), m.f(7.0)),
    "masked_scatter 0-d, longer source": lambda m: m.f(3.0).masked_scatter(m.b(True), m.f([7.0, 8.0])),
    "masked_scatter 0-d, False": lambda m: m.f(3.0).masked_scatter(m.b(False), m.f(7.0)),
    "masked_scatter 0-d self, 1-d mask": lambda m: m.f(3.0).masked_scatter(m.b([True, False]), m.f([7.0, 8.0])),
    "masked_scatter short source": lambda m: m.f([3.0, 4.0]).masked_scatter(m.b(True), m.f(7.0)),
    "masked_scatter 0-d, empty source": lambda m: m.f(3.0).masked_scatter(m.b(True), m.f([])),
    "embedding 0-d index": lambda m: nn_functional(m).embedding(m.i(1), m.f([[1.0, 2.0], [3.0, 4.0]])),
}


def tw_or_torch(m: Maker):
    return m.lib


def nn_functional(m: Maker):
    return m.lib.nn.functional


# A source with more dims than a 0-dim index: the gradient gathered for it is 0-dim, which torch's engine (and
# ours) refuses to fit to the source's shape, with RuntimeError.
REFUSED_GRADIENTS = {"scatter 1-d src into 0-d": "gradient for 'src' has shape []",
                     "scatter 0-d index, 1-d src into 1-d": "gradient for 'src' has shape []",
                     "scatter_add 0-d index into 1-d": "gradient for 'src' has shape []"}


@pytest.mark.parametrize("name", list(ZERO_DIM))
def test_zero_dim_operands_like_torch(name):
    check_like_torch(ZERO_DIM[name], REFUSED_GRADIENTS.get(name))


def test_sum_to_size_with_more_dims_than_the_tensor_raises_like_torch():
    for lib in (torch, tw):
        with pytest.raises(RuntimeError, match=r"size \{?\[1\]\}? is not expandable to size \{?\[\]\}?"):
            lib.tensor(3.0).sum_to_size(1)


# ---------------------------------------------------------------------------- indices out of range, negative

OUT_OF_RANGE = {
    "gather 5": lambda m: m.f([1.0, 2.0]).gather(0, m.i([5])),
    "gather -1": lambda m: m.f([1.0, 2.0]).gather(0, m.i([-1])),
    "gather 0-d, 1": lambda m: m.f(3.0).gather(0, m.i(1)),
    "gather 0-d, -1": lambda m: m.f(3.0).gather(0, m.i(-1)),
    "gather 2-d": lambda m: m.f([[1.0, 2.0, 3.0]]).gather(1, m.i([[0, 3]])),
    "scatter 5": lambda m: m.f([1.0, 2.0]).scatter(0, m.i([5]), 1.0),
    "scatter -1": lambda m: m.f([1.0, 2.0]).scatter(0, m.i([-1]), m.f([1.0])),
    "scatter 0-d, 1": lambda m: m.f(3.0).scatter(0, m.i(1), 1.0),
    "scatter reduce=add 4": lambda m: m.f([3.0]).scatter(0, m.i([4]), 2.0, reduce="add"),
    "scatter_add 5": lambda m: m.f([1.0, 2.0]).scatter_add(0, m.i([5]), m.f([1.0])),
    "scatter_add -1": lambda m: m.f([1.0, 2.0]).scatter_add(0, m.i([-1]), m.f([1.0])),
    **{f"scatter_reduce {r} 5": (lambda m, r=r: m.f([1.0, 2.0]).scatter_reduce(0, m.i([5]), m.f([1.0]), r))
       for r in REDUCTIONS},
    "scatter_reduce -1, include_self=False":
        lambda m: m.f([1.0, 2.0]).scatter_reduce(0, m.i([-1]), m.f([1.0]), "sum", include_self=False),
    "take_along_dim 5, no dim": lambda m: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0]), m.i([5])),
    "take_along_dim -1, no dim": lambda m: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0]), m.i([-1])),
    "take_along_dim wraps along a dim": lambda m: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0, 3.0]),
                                                                                 m.i([5, -1, 7, -4]), 0),
    "take_along_dim wraps along dim 1": lambda m: tw_or_torch(m).take_along_dim(m.f([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
                                                                                 m.i([[5], [-2]]), 1),
    "take_along_dim empty dim": lambda m: tw_or_torch(m).take_along_dim(m.f([]), m.i([0]), 0),
    "take_along_dim empty dim, empty index": lambda m: tw_or_torch(m).take_along_dim(m.f([]), m.i([]), 0),
    "index_select 5": lambda m: m.f([1.0, 2.0]).index_select(0, m.i([5])),
    "index_select -1": lambda m: m.f([1.0, 2.0]).index_select(0, m.i([-1])),
    "index_select 0-d, 1": lambda m: m.f(3.0).index_select(0, m.i(1)),
    "index_add 5": lambda m: m.f([1.0, 2.0]).index_add(0, m.i([5]), m.f([1.0])),
    "index_add -1": lambda m: m.f([1.0, 2.0]).index_add(0, m.i([-1]), m.f([1.0])),
    "index_add 0-d, 1": lambda m: m.f(3.0).index_add(0, m.i(1), m.f(7.0)),
    "index_copy 5": lambda m: m.f([1.0, 2.0]).index_copy(0, m.i([5]), m.f([1.0])),
    "index_copy -1": lambda m: m.f([1.0, 2.0]).index_copy(0, m.i([-1]), m.f([1.0])),
    "index_copy 0-d, 1": lambda m: m.f(3.0).index_copy(0, m.i(1), m.f(7.0)),
    "index_fill 5": lambda m: m.f([1.0, 2.0]).index_fill(0, m.i([5]), 1.0),
    "index_fill -1 wraps": lambda m: m.f([1.0, 2.0]).index_fill(0, m.i([-1]), 9.0),
    "index_fill -3": lambda m: m.f([1.0, 2.0]).index_fill(0, m.i([-3]), 9.0),
    "index_fill 0-d, 1": lambda m: m.f(3.0).index_fill(0, m.i(1), 7.0),
    "index_reduce 5": lambda m: m.f([1.0, 2.0], False).index_reduce(0, m.i([5]), m.f([1.0], False), "prod"),
    "index_reduce -1": lambda m: m.f([1.0, 2.0], False).index_reduce(0, m.i([-1]), m.f([1.0], False), "amax"),
    "index_reduce 0-d, 1": lambda m: m.f(3.0, False).index_reduce(0, m.i(1), m.f(7.0, False), "amax"),
    "put 5": lambda m: m.f([1.0, 2.0]).put(m.i([5]), m.f([1.0])),
    "put -1 wraps": lambda m: m.f([1.0, 2.0]).put(m.i([-1]), m.f([9.0])),
    "put -3": lambda m: m.f([1.0, 2.0]).put(m.i([-3]), m.f([1.0])),
    "put 5, accumulate": lambda m: m.f([1.0, 2.0]).put(m.i([5]), m.f([1.0]), accumulate=True),
    "put 0-d, 1": lambda m: m.f(3.0).put(m.i(1), m.f(7.0)),
    "take 5": lambda m: m.f([1.0, 2.0]).take(m.i([5])),
    "take -1 wraps": lambda m: m.f([1.0, 2.0]).take(m.i([-1])),
    "take -3": lambda m: m.f([1.0, 2.0]).take(m.i([-3])),
    "take 0-d, 1": lambda m: m.f(3.0).take(m.i(1)),
    "x[index] 5": lambda m: m.f([1.0, 2.0])[m.i([5])],
    "x[index] -3": lambda m: m.f([1.0, 2.0])[m.i([-3])],
    "index_put 5": lambda m: m.f([1.0, 2.0]).index_put((m.i([5]),), m.f(1.0)),
    "index_put -3, accumulate": lambda m: m.f([1.0, 2.0]).index_put((m.i([-3]),), m.f(1.0), accumulate=True),
    "embedding 5": lambda m: nn_functional(m).embedding(m.i([5]), m.f([[1.0], [2.0]])),
    "embedding -1": lambda m: nn_functional(m).embedding(m.i([-1]), m.f([[1.0], [2.0]])),
}


@pytest.mark.parametrize("name", list(OUT_OF_RANGE))
def test_out_of_range_and_negative_indices_like_torch(name):
    check_like_torch(OUT_OF_RANGE[name])


# ---------------------------------------------------------------------------- index dtypes and shapes

def _with_index_dtype(dtype: str):
    def make(m: Maker, values):
        return m.f(values) if dtype == "float32" else m.i(values, dtype)
    return make


INDEX_DTYPES = ("int64", "int32", "int16", "uint8", "float32")
CALLS_BY_INDEX = {
    "gather": lambda m, ix: m.f([1.0, 2.0]).gather(0, ix(m, [1])),
    "scatter": lambda m, ix: m.f([1.0, 2.0]).scatter(0, ix(m, [1]), 5.0),
    "scatter_add": lambda m, ix: m.f([1.0, 2.0]).scatter_add(0, ix(m, [1]), m.f([5.0])),
    "scatter_reduce": lambda m, ix: m.f([1.0, 2.0]).scatter_reduce(0, ix(m, [1]), m.f([5.0]), "amax"),
    "take_along_dim": lambda m, ix: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0]), ix(m, [1]), 0),
    "take_along_dim no dim": lambda m, ix: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0]), ix(m, [1])),
    "index_select": lambda m, ix: m.f([1.0, 2.0]).index_select(0, ix(m, [1])),
    "index_add": lambda m, ix: m.f([1.0, 2.0]).index_add(0, ix(m, [1]), m.f([5.0])),
    "index_copy": lambda m, ix: m.f([1.0, 2.0]).index_copy(0, ix(m, [1]), m.f([5.0])),
    "index_fill": lambda m, ix: m.f([1.0, 2.0]).index_fill(0, ix(m, [1]), 5.0),
    "index_reduce": lambda m, ix: m.f([1.0, 2.0], False).index_reduce(0, ix(m, [1]), m.f([5.0], False), "prod"),
    "put": lambda m, ix: m.f([1.0, 2.0]).put(ix(m, [1]), m.f([5.0])),
    "take": lambda m, ix: m.f([1.0, 2.0]).take(ix(m, [1])),
    "embedding": lambda m, ix: nn_functional(m).embedding(ix(m, [1]), m.f([[1.0], [2.0]])),
    "index_put": lambda m, ix: m.f([1.0, 2.0]).index_put((ix(m, [1]),), m.f(5.0)),
    "x[index]": lambda m, ix: m.f([1.0, 2.0])[ix(m, [1])],
}
EMBEDDING_WORDS = "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int"


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("op", list(CALLS_BY_INDEX))
def test_index_dtypes_like_torch(op, dtype):
    words = EMBEDDING_WORDS if op == "embedding" else None
    check_like_torch(lambda m: CALLS_BY_INDEX[op](m, _with_index_dtype(dtype)), words)


SHAPES = {
    "gather empty index of another rank": lambda m: m.f([[1.0, 2.0]]).gather(0, m.i([])),
    "gather empty float index": lambda m: m.f([[1.0, 2.0]]).gather(0, m.f([], grad=False)),
    "gather 2-d self, 0-d index": lambda m: m.f([[1.0, 2.0]]).gather(0, m.i(0)),
    "gather 0-d self, dim 1": lambda m: m.f(3.0).gather(1, m.i(0)),
    "scatter empty index": lambda m: m.f([[1.0, 2.0]]).scatter(0, m.i([]), 1.0),
    "scatter 0-d src, index of 2": lambda m: m.f([1.0, 2.0]).scatter(0, m.i([0, 1]), m.f(7.0)),
    "scatter 0-d src, index of 1": lambda m: m.f([1.0, 2.0]).scatter(0, m.i([1]), m.f(7.0)),
    "scatter 2-d, 0-d src": lambda m: m.f([[1.0, 2.0]]).scatter(0, m.i([[0]]), m.f(7.0)),
    "scatter 0-d, index of 2": lambda m: m.f(1.0).scatter(0, m.i([0, 0]), 7.0),
    "scatter 0-d, dim 1": lambda m: m.f(3.0).scatter(1, m.i(0), 7.0),
    "take_along_dim ranks differ": lambda m: tw_or_torch(m).take_along_dim(m.f([1.0, 2.0]), m.i([[1]]), 0),
    "index_select 2-d index": lambda m: m.f([1.0, 2.0]).index_select(0, m.i([[1]])),
    "index_select 0-d, dim 1": lambda m: m.f(3.0).index_select(1, m.i(0)),
    "index_fill 2-d index": lambda m: m.f([1.0, 2.0]).index_fill(0, m.i([[1]]), 1.0),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_index_shapes_like_torch(name):
    check_like_torch(SHAPES[name])


# ---------------------------------------------------------------------------- compiled gather and scatter

COMPILED = {name: ZERO_DIM[name] for name in ZERO_DIM if name.startswith(("gather", "scatter"))}
COMPILED.update({name: OUT_OF_RANGE[name] for name in OUT_OF_RANGE if name.startswith(("gather", "scatter"))})


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_gather_and_scatter_like_torch(name):
    """A compiled function gives eager's outcome: the same result, or torch's exception for a bad index."""
    check_like_torch(COMPILED[name], REFUSED_GRADIENTS.get(name), compiled=True)


def test_compiled_gather_raises_for_a_bad_index_after_a_good_call():
    """The compiled program, already built for the shape, still checks the index values of every call."""
    fn = tw.compile(lambda x, i: x.gather(0, i) * 2)
    x = tw.tensor([3.0, 4.0])
    assert fn(x, tw.tensor([1])).tolist() == [8.0]
    for bad in ([2], [-1]):
        with pytest.raises(RuntimeError, match=rf"^index {bad[0]} is out of bounds for dimension 0"):
            fn(x, tw.tensor(bad))


# ---------------------------------------------------------------------------- the CUDA backend's checks

CUDA_CASES = {**{f"0-d {k}": v for k, v in ZERO_DIM.items() if k.startswith(("gather", "scatter", "index_select"))},
              **{f"range {k}": v for k, v in OUT_OF_RANGE.items()
                 if k.startswith(("gather", "scatter", "index_select", "index_add", "take", "embedding"))},
              **{f"dtype {op} {d}": (lambda m, op=op, d=d: CALLS_BY_INDEX[op](m, _with_index_dtype(d)))
                 for op in ("gather", "scatter", "scatter_add", "index_select") for d in INDEX_DTYPES}}


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(CUDA_CASES))
def test_cuda_index_family_like_torch(name):
    """Host checks raise at once, device-side bounds errors at the download: both with torch's type."""
    words = None if "range" not in name else REFUSED_GRADIENTS.get(name.removeprefix("0-d "), "")
    words = REFUSED_GRADIENTS.get(name.removeprefix("0-d "), words)
    check_like_torch(CUDA_CASES[name], words, device="cuda")
