"""Behaviour pinned against torch where the op table's forward/backward comparison cannot say it: results
whose order torch leaves open."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

# ---------------------------------------------------------------------------- topk(sorted=False)

@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "float16"])
def test_unsorted_topk_selects_the_same_elements_as_torch(dtype, largest):
    """torch documents only that sorted=True sorts the k results: with sorted=False their order is open, so the
    values must match as a set and each index must point at its value (ties may pick other positions)."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        shape = tuple(int(n) for n in rng.integers(1, 8, size=rng.integers(1, 4)))
        dim = int(rng.integers(-len(shape), len(shape)))
        k = int(rng.integers(0, shape[dim] + 1))
        data = rng.integers(-3, 4, size=shape) if trial % 2 else rng.standard_normal(shape)
        data = data.astype(dtype)
        if dtype.startswith("float") and trial % 3 == 0:
            data.flat[int(rng.integers(0, data.size))] = np.nan
        values, indices = tw.topk(tw.from_numpy(data), k, dim, largest, sorted=False)
        expected = torch.topk(torch.from_numpy(data), k, dim, largest, sorted=False).values.numpy()
        np.testing.assert_array_equal(np.sort(values.numpy(), dim), np.sort(expected, dim))
        np.testing.assert_array_equal(np.take_along_axis(data, indices.numpy(), dim), values.numpy())
        picked = np.sort(np.moveaxis(indices.numpy(), dim, -1), -1)
        assert (np.diff(picked, axis=-1) > 0).all()  # k distinct positions
