"""Errors and warnings of the torch-namespace products, distances, norms and statistics, beside torch's (their
values and gradients are in the operator table, tests/opinfos/torch_math.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

ERRORS = [
    "fw.mv(fw.ones(3, 4), fw.ones(3))", "fw.mv(fw.ones(4), fw.ones(4))", "fw.mv(fw.ones(3, 4), fw.ones(4, 1))",
    "fw.mv(fw.ones(3, 4), fw.ones(4, dtype=fw.float64))",
    "fw.vdot(fw.ones(4), fw.ones(3))", "fw.vdot(fw.ones(2, 2), fw.ones(2, 2))",
    "fw.vdot(fw.ones(4), fw.ones(4, dtype=fw.float64))",
    "fw.tensordot(fw.ones(3, 4), fw.ones(3, 4), 1)", "fw.tensordot(fw.ones(3, 4), fw.ones(3, 4), 3)",
    "fw.tensordot(fw.ones(3, 4), fw.ones(3, 4), -1)", "fw.tensordot(fw.ones(3, 4), fw.ones(3, 4), ([0, 1], [0]))",
    "fw.chain_matmul()", "fw.chain_matmul(fw.ones(2), fw.ones(2))",
    "fw.dist(fw.arange(3), fw.arange(3))",
    "fw.cdist(fw.ones(3), fw.ones(3))", "fw.cdist(fw.ones(3, 4), fw.ones(2, 5))", "fw.cdist(fw.ones(3, 4), "
    "fw.ones(3, 4), -1.0)", "fw.cdist(fw.ones(3, 4, dtype=fw.int64), fw.ones(3, 4, dtype=fw.int64))",
    "fw.cdist(fw.ones(3, 4), fw.ones(3, 4), compute_mode='foo')",
    "fw.renorm(fw.ones(4), 2, 0, 1.0)", "fw.renorm(fw.ones(3, 4), -1, 0, 1.0)", "fw.renorm(fw.ones(3, 4), 2, 0, -1.0)",
    "fw.renorm(fw.ones(3, 4), 2, 2, 1.0)",
    "fw.frobenius_norm(fw.ones(3, 4), [0, 1, 1])", "fw.nuclear_norm(fw.ones(4))",
    "fw.cov(fw.ones(2, 3, 4))", "fw.cov(fw.ones(2, dtype=fw.bool))",
    "fw.cov(fw.ones(3, 5), fweights=fw.ones(5))", "fw.cov(fw.ones(3, 5), fweights=fw.ones(2, dtype=fw.int64))",
    "fw.cov(fw.ones(3, 5), fweights=fw.ones(1, 5, dtype=fw.int64))",
    "fw.cov(fw.ones(3, 5), fweights=-fw.ones(5, dtype=fw.int64))", "fw.cov(fw.ones(3, 5), aweights=-fw.ones(5))",
    "fw.cov(fw.ones(3, 5), aweights=fw.ones(5, dtype=fw.int64))",
    "fw.cov(fw.ones(3, 5), fweights=fw.zeros(5, dtype=fw.int64))",
    "fw.corrcoef(fw.ones(2, 3, 4))",
    "fw.mode(fw.ones(0))", "fw.mode(fw.ones(0, 3), 0)", "fw.mode(fw.ones(0, 0), 0)", "fw.mode(fw.ones(3, 4), 2)",
    "fw.histogram(fw.arange(3), 2)", "fw.histogram(fw.ones(6), 0)", "fw.histogram(fw.ones(6), 3, range=(2., 1.))",
    "fw.histogram(fw.tensor([float('nan'), 1.]), 3)", "fw.histogram(fw.tensor([float('inf'), 1.]), 3)",
    "fw.histogram(fw.ones(6), 3, weight=fw.ones(5))", "fw.histogramdd(fw.ones(5), bins=3)",
    "fw.histogramdd(fw.ones(5, 2), bins=[2, 2], weight=fw.ones(4))",
    "fw.gradient(fw.ones(2, 4), spacing=[2., 3., 4.])", "fw.gradient(fw.ones(2, 4), edge_order=3)",
    "fw.gradient(fw.ones(2, 4), edge_order=2)", "fw.gradient(fw.ones(2, 4), dim=(0, 0))",
    "fw.split_with_sizes(fw.ones(3, 4), [1, 1])", "fw.split_with_sizes(fw.ones(3, 4), [-1, 4])",
]


@pytest.mark.parametrize("code", ERRORS)
def test_errors_match_torch(code):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as expected:
            eval(code, {"fw": torch})
        with pytest.raises(type(expected.value)):
            eval(code, {"fw": tw})


def test_deprecated_spellings_warn():
    with pytest.warns(UserWarning, match="chain_matmul is deprecated"):
        tw.chain_matmul(tw.ones(2, 2), tw.ones(2, 2))
    with pytest.warns(UserWarning, match="nuclear_norm is deprecated"):
        tw.nuclear_norm(tw.ones(2, 2))


def test_cov_without_degrees_of_freedom_warns_and_divides_by_zero():
    x = np.arange(15, dtype=np.float32).reshape(3, 5) % 4
    with pytest.warns(UserWarning, match="degrees of freedom is <= 0"):
        actual = tw.cov(tw.tensor(x), correction=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.cov(torch.tensor(x), correction=5)
    np.testing.assert_array_equal(actual.numpy(), expected.numpy())
    with pytest.warns(UserWarning, match="degrees of freedom"):
        tw.cov(tw.tensor(x), fweights=tw.ones(5, dtype=tw.int64), correction=5)


def test_mode_of_empty_slices_and_integers():
    for shape, dim in [((2, 0), 0), ((0, 3), 1)]:
        values, indices = tw.mode(tw.ones(shape), dim)
        expected = torch.mode(torch.ones(shape), dim)
        assert tuple(values.shape) == tuple(expected.values.shape) and indices.dtype == tw.int64
    x = np.array([[3, 1, 3, 1, 2], [5, 5, 4, 4, 4]])
    values, indices = tw.mode(tw.tensor(x))
    expected = torch.mode(torch.tensor(x))
    assert values.tolist() == expected.values.tolist() and indices.tolist() == expected.indices.tolist()


def test_split_with_sizes_gives_views():
    x = tw.arange(6.0)
    first, second = x.split_with_sizes([2, 4])
    first.mul_(10)
    assert x.tolist()[:2] == [0.0, 10.0] and second.tolist() == [2.0, 3.0, 4.0, 5.0]


def test_as_strided_scatter_gradient_of_self_is_zero_where_src_was_written():
    g = np.arange(1.0, 7.0, dtype=np.float32)
    a, src = tw.zeros(6, requires_grad=True), tw.zeros(2, 2, requires_grad=True)
    tw.as_strided_scatter(a, src, (2, 2), (3, 1)).backward(tw.tensor(g))
    ta, tsrc = torch.zeros(6, requires_grad=True), torch.zeros(2, 2, requires_grad=True)
    out = ta.clone()
    out.as_strided((2, 2), (3, 1)).copy_(tsrc)  # the scatter composed: torch's own backward of it
    out.backward(torch.tensor(g))
    np.testing.assert_array_equal(a.grad.numpy(), ta.grad.numpy())
    np.testing.assert_array_equal(src.grad.numpy(), tsrc.grad.numpy())


def test_as_strided_scatter_and_nonzero_static_errors():
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="expected src to have a size equal to the slice of self"):
            fw.as_strided_scatter(fw.zeros(6), fw.ones(3), (2, 2), (3, 1))
        with pytest.raises(RuntimeError, match="'size' must be an non-negative integer"):
            fw.nonzero_static(fw.ones(3), size=-1)
    assert tuple(tw.nonzero_static(tw.tensor(3.0), size=2).shape) == (2, 0)


def test_gradient_of_integers_and_0_dim():
    for spacing in (1, 2):
        ours = tw.gradient(tw.arange(5) ** 2, spacing=spacing)
        theirs = torch.gradient(torch.arange(5) ** 2, spacing=spacing)
        assert ours[0].dtype.name == str(theirs[0].dtype).removeprefix("torch.")
        np.testing.assert_array_equal(ours[0].numpy(), theirs[0].numpy())
    assert tw.gradient(tw.tensor(3.0)) == () == torch.gradient(torch.tensor(3.0))
