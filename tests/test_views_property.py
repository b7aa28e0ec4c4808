"""Property tests for views: random chains of view operators applied to tilewise, numpy and torch.

Every step checks that tilewise's values equal numpy's, that its geometry (shape, stride, storage offset,
is_contiguous) equals torch's for the same chain, and that it shares storage (``data_ptr``, ``_base``)
exactly when torch's result does: ``reshape``/``flatten``/``contiguous`` copy only when strides forbid a
view. Invalid requests must fail in both frameworks. At the end of a chain, a write through the view
must land in the same elements of the root as it does in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilewise as tw

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Views:
    """The same view in three frameworks, plus the root each one is a view of."""

    ours: tw.Tensor
    theirs: torch.Tensor
    values: np.ndarray  # numpy's view (or, after a copy, numpy's copy)
    our_root: tw.Tensor
    their_root: torch.Tensor


def _start(shape) -> Views:
    data = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64).reshape(shape)
    if data.size:
        ours, theirs = tw.tensor(data), torch.tensor(data)
    else:  # torch.tensor(array) keeps numpy's strides for empty arrays; start from torch's own layout
        ours, theirs = tw.zeros(shape, dtype=tw.float64), torch.zeros(shape, dtype=torch.float64)
    return Views(ours, theirs, data.copy(), ours, theirs)


# ---------------------------------------------------------------------------- one step of a chain
# Each step draws its arguments from the current shape and returns (name, tilewise fn, torch fn, numpy fn);
# the numpy fn is None where numpy has no view with the same meaning (it is then derived from torch's values).

def _dim(draw, ndim):
    return draw(st.integers(-ndim, ndim - 1))


def _new_shape(draw, numel):
    """A random shape with ``numel`` elements, sometimes with one -1."""
    factors, n, p = [], numel, 2
    while n > 1:
        while n % p:
            p += 1
        factors.append(p)
        n //= p
    groups = draw(st.integers(1, max(len(factors), 1) + 1))
    shape = [1] * groups
    for f in factors:
        shape[draw(st.integers(0, groups - 1))] *= f
    if numel == 0:
        shape[draw(st.integers(0, groups - 1))] = 0
    if shape and draw(st.booleans()) and numel:
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return tuple(shape)


@st.composite
def view_step(draw, shape):
    ndim = len(shape)
    kinds = ["view", "reshape", "flatten", "unsqueeze", "squeeze", "contiguous", "expand", "as_strided"]
    if ndim:
        kinds += ["permute", "transpose", "select", "slice", "narrow", "unfold", "movedim"]
    if ndim >= 2:
        kinds += ["diagonal", "t"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("view", "reshape"):
        size = _new_shape(draw, int(np.prod(shape)))
        return (f"{kind}{size}", lambda x: getattr(x, kind)(size), lambda a: a.reshape(size))
    if kind == "flatten":
        start, end = (_dim(draw, max(ndim, 1)), _dim(draw, max(ndim, 1)))
        if ndim:
            start, end = sorted((start % ndim, end % ndim))
            if start == end:  # the no-op form has its own test below
                return ("contiguous()", lambda x: x.contiguous(), lambda a: a)
        return (f"flatten({start}, {end})", lambda x: x.flatten(start, end),
                lambda a: a.reshape(a.shape[:start] + (int(np.prod(a.shape[start:end + 1])),) + a.shape[end + 1:])
                if a.ndim else a.reshape(1))
    if kind == "unsqueeze":
        d = draw(st.integers(-ndim - 1, ndim))
        return (f"unsqueeze({d})", lambda x: x.unsqueeze(d), lambda a: np.expand_dims(a, d))
    if kind == "squeeze":
        if ndim and draw(st.booleans()):
            d = _dim(draw, ndim)
            return (f"squeeze({d})", lambda x: x.squeeze(d),
                    lambda a: a.squeeze(d) if a.shape[d] == 1 else a)
        return ("squeeze()", lambda x: x.squeeze(), lambda a: a.squeeze())
    if kind == "contiguous":
        return ("contiguous()", lambda x: x.contiguous(), lambda a: a)
    if kind == "expand":
        lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        size = lead + tuple(draw(st.integers(1, 3)) if s == 1 else (-1 if draw(st.booleans()) else s)
                            for s in shape)
        target = lead + tuple(s if w == -1 else w for s, w in zip(shape, size[len(lead):]))
        return (f"expand{size}", lambda x: x.expand(size), lambda a: np.broadcast_to(a, target))
    if kind == "as_strided":
        return _as_strided(draw, shape)
    if kind == "permute":
        perm = tuple(draw(st.permutations(range(ndim))))
        return (f"permute{perm}", lambda x: x.permute(*perm), lambda a: a.transpose(perm))
    if kind == "transpose":
        d0, d1 = _dim(draw, ndim), _dim(draw, ndim)
        return (f"transpose({d0}, {d1})", lambda x: x.transpose(d0, d1), lambda a: np.swapaxes(a, d0, d1))
    if kind == "t":
        return ("mT", lambda x: x.mT, lambda a: np.swapaxes(a, -1, -2))
    if kind == "movedim":
        src = tuple(draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1, max_size=ndim)))
        dst = tuple(draw(st.permutations(range(ndim)))[: len(src)])
        return (f"movedim({src}, {dst})", lambda x: x.movedim(src, dst), lambda a: np.moveaxis(a, src, dst))
    d = _dim(draw, ndim)
    n = shape[d]
    if kind == "select":
        if n == 0:
            return ("contiguous()", lambda x: x.contiguous(), lambda a: a)
        i = draw(st.integers(-n, n - 1))
        return (f"select({d}, {i})", lambda x: x.select(d, i), lambda a: np.take(a, i, axis=d))
    if kind == "slice":
        start = draw(st.none() | st.integers(-n - 1, n + 1))
        stop = draw(st.none() | st.integers(-n - 1, n + 1))
        step = draw(st.integers(1, 3))
        index = (slice(None),) * (d % ndim) + (slice(start, stop, step),)
        return (f"[{index}]", lambda x: x[index], lambda a: a[index])
    if kind == "narrow":
        start = draw(st.integers(0, n))
        length = draw(st.integers(0, n - start))
        return (f"narrow({d}, {start}, {length})", lambda x: x.narrow(d, start, length),
                lambda a: np.take(a, np.arange(start, start + length), axis=d))
    if kind == "unfold":
        size = draw(st.integers(0, n))
        step = draw(st.integers(1, 3))
        return (f"unfold({d}, {size}, {step})", lambda x: x.unfold(d, size, step), None)
    d1, d2 = draw(st.permutations(range(ndim)))[:2]
    offset = draw(st.integers(-3, 3))
    return (f"diagonal({offset}, {d1}, {d2})", lambda x: x.diagonal(offset, d1, d2),
            lambda a: np.diagonal(a, offset, d1, d2))


def _as_strided(draw, shape):
    """as_strided on the storage of the current view: sizes and strides that stay inside the root's storage."""
    ndim = draw(st.integers(0, 3))
    size = tuple(draw(st.integers(0, 3)) for _ in range(ndim))
    stride = tuple(draw(st.integers(0, 4)) for _ in range(ndim))
    offset = draw(st.none() | st.integers(0, 3))
    return (f"as_strided({size}, {stride}, {offset})", lambda x: x.as_strided(size, stride, offset), None)


# ---------------------------------------------------------------------------- checks

def _geometry(t) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous()


def _shares(t, root) -> bool:
    return t.untyped_storage().data_ptr() == root.untyped_storage().data_ptr()


def _apply(state: Views, step) -> Views | None:
    name, op, np_op = step
    try:
        theirs = op(state.theirs)
    except (RuntimeError, IndexError, ValueError) as torch_error:
        with pytest.raises((RuntimeError, IndexError, ValueError)):
            op(state.ours)
        assert str(torch_error)  # both refused the request
        return None
    ours = op(state.ours)
    views_root = _shares(theirs, state.their_root)
    assert _shares(ours, state.our_root) == views_root, f"{name}: tilewise copies when torch views (or vice versa)"
    assert _geometry(ours) == _geometry(theirs), f"{name}: geometry {_geometry(ours)} != torch {_geometry(theirs)}"
    if views_root:
        base = ours._base if ours._base is not None else ours
        assert base.untyped_storage() is state.our_root.untyped_storage()
    if views_root and theirs.numel():
        assert ours.data_ptr() - state.our_root.data_ptr() == theirs.data_ptr() - state.their_root.data_ptr()
    values = np_op(state.values) if np_op is not None else theirs.numpy()
    np.testing.assert_array_equal(ours.numpy(), values, err_msg=name)
    if views_root:
        return Views(ours, theirs, values, state.our_root, state.their_root)
    return Views(ours, theirs, np.array(values), ours, theirs)


def _overlaps_itself(t) -> bool:
    offsets = np.zeros((), dtype=np.int64)
    for n, stride in zip(t.shape, t.stride()):
        offsets = np.add.outer(offsets, np.arange(n) * stride)
    return np.unique(offsets).size < offsets.size


def _check_write_through(state: Views) -> None:
    """A write through a non-overlapping view changes the same root elements in both frameworks."""
    theirs = state.theirs
    if _overlaps_itself(theirs):
        return  # elements sharing memory (expand, unfold with step < size): which write lands is unspecified
    fill = np.arange(100, 100 + theirs.numel(), dtype=np.float64).reshape(tuple(theirs.shape))
    try:
        theirs.copy_(torch.tensor(fill))
    except RuntimeError:
        return  # torch refuses writes to internally overlapping memory (e.g. some as_strided views)
    state.ours.copy_(tw.tensor(fill))
    np.testing.assert_array_equal(state.our_root.numpy(), state.their_root.numpy())


shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).filter(lambda s: np.prod(s) <= 64)
nonempty_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


def _run_chain(data, shape, length):
    state = _start(shape)
    names = []
    for _ in range(length):
        step = data.draw(view_step(tuple(state.theirs.shape)))
        names.append(step[0])
        new = _apply(state, step)
        if new is not None:
            state = new
    _check_write_through(state)


@SETTINGS
@given(shape=nonempty_shapes, length=st.integers(1, 6), data=st.data())
def test_view_chains_match_numpy_and_torch(shape, length, data):
    _run_chain(data, tuple(shape), length)


@SETTINGS
@given(shape=shapes, length=st.integers(1, 4), data=st.data())
def test_view_chains_with_empty_and_scalar_shapes(shape, length, data):
    _run_chain(data, tuple(shape), length)


@settings(max_examples=100, deadline=None)
@given(shape=nonempty_shapes, data=st.data())
def test_view_gradients_scatter_back_like_torch(shape, data):
    """Backward of a view chain puts each gradient element back where the view read it from."""
    name, op, _ = data.draw(view_step(tuple(shape)))
    ours = tw.tensor(np.ones(shape), requires_grad=True)
    theirs = torch.tensor(np.ones(shape), requires_grad=True)
    try:
        out_theirs = op(theirs)
    except (RuntimeError, IndexError, ValueError):
        return
    out_ours = op(ours)
    weights = np.arange(out_theirs.numel(), dtype=np.float64).reshape(tuple(out_theirs.shape))
    (out_theirs * torch.tensor(weights)).sum().backward()
    (out_ours * tw.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy(), err_msg=name)


# as_strided's geometry counts from the start of the storage: over an input that is itself a transpose, a slice or an
# expansion, its gradient lands where the input reads those storage elements (an expanded input's shared among them)
AS_STRIDED_INPUTS = {
    "transposed": (lambda w: (w * 1).t(), ((3, 3), (1, 4), 1)),
    "transposed_all": (lambda w: (w * 1).t(), ((3, 4), (1, 3), 0)),
    "sliced": (lambda w: (w * 1)[1:], ((2, 3), (3, 1), 6)),
    "column": (lambda w: (w * 1)[:, 1], ((2,), (3,), 4)),
    "stepped_default_offset": (lambda w: (w * 1)[::2, ::2], ((2, 2), (1, 1), None)),
    "expanded": (lambda w: (w * 1)[:1].expand(3, 3), ((2, 2), (1, 1), 0)),
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED_INPUTS))
def test_as_strided_gradient_over_a_strided_input_matches_torch(name):
    make, (size, stride, offset) = AS_STRIDED_INPUTS[name]
    grads = []
    for lib in (torch, tw):
        w = lib.arange(12.0).reshape(4, 3).requires_grad_()
        out = make(w).as_strided(size, stride, offset)
        (out * lib.arange(float(out.numel())).reshape(out.shape)).sum().backward()
        grads.append(w.grad.numpy())
    np.testing.assert_array_equal(grads[1], grads[0])


def test_flatten_of_one_dim_returns_self():
    x = tw.ones(1).as_strided((1, 1), (0, 1))
    assert x.flatten(0, 0).stride() == torch.ones(1).as_strided((1, 1), (0, 1)).flatten(0, 0).stride() == (0, 1)
