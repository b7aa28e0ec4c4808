"""torch.special's normal-distribution, entropy and scaled functions (ndtr, ndtri, log_ndtr, erfcx, entr, i0e,
i1e, xlog1py) against torch over wide ranges: tails, the branch switches, NaN, +-inf, signed zeros, 0-d and
empty tensors, every dtype torch has a kernel for, gradients, and torch's errors for the dtypes it has none for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -1e-300, 1e-30, 1.0, -1.0, 0.5]
RANGES = {"ndtr": (-45, 12), "ndtri": (-0.1, 1.1), "log_ndtr": (-1e3, 40), "erfcx": (-30, 1e4), "entr": (-1, 50),
          "i0e": (-800, 800), "i1e": (-800, 800), "i1": (-50, 50)}
EXTRA = {"ndtri": [np.logspace(-300, -1e-9, 400), 1 - np.logspace(-16, -1, 100)], "erfcx": [np.linspace(4.5, 5.5, 101)],
         "log_ndtr": [-np.logspace(-3, 150, 200)], "i0e": [np.linspace(14, 16, 101)], "i1e": [np.linspace(14, 16, 101)]}
HALF_KERNELS = ("ndtr", "entr", "i0e", "i1e", "i1")
RTOL = {"float64": 1e-12, "float32": 4e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
# where torch's kernel itself rounds its way to the value, an absolute floor: ndtr's 1 + erf(x) cancels (torch's
# float32 erf reaches -1 sooner than libm's), erfcx of a negative x is torch's 2 exp(x^2) with x^2 rounded
ATOL = {"ndtr": {"float32": 6e-8, "float64": 1e-16}}
RTOL_OF = {("erfcx", "float64"): 1e-13, ("erfcx", "float32"): 3e-6}


def _inputs(name, dtype):
    lo, hi = RANGES[name]
    parts = [np.linspace(lo, hi, 4001), np.linspace(-6, 6, 501), EDGES] + EXTRA.get(name, [])
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
    if dtype in ("float16", "bfloat16"):
        x = np.clip(x, -6e4, 6e4)
    return x


def _both(name, x, dtype):
    want = getattr(torch.special, name)(torch.from_numpy(x).to(getattr(torch, dtype)))
    got = getattr(tw.special, name)(tw.tensor(x).to(getattr(tw, dtype)))
    return want, got


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(RANGES))
def test_values_match_torch_over_wide_ranges(name, dtype):
    x = _inputs(name, dtype)
    if dtype in ("float16", "bfloat16") and name not in HALF_KERNELS:
        with pytest.raises(NotImplementedError) as theirs:
            getattr(torch.special, name)(torch.from_numpy(x).to(getattr(torch, dtype)))
        with pytest.raises(NotImplementedError) as ours:
            getattr(tw.special, name)(tw.tensor(x).to(getattr(tw, dtype)))
        assert str(ours.value) == str(theirs.value)
        return
    want, got = _both(name, x, dtype)
    assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
    w, g = want.double().numpy(), got.double().numpy()
    assert np.array_equal(np.isnan(w), np.isnan(g))
    infinite = np.isinf(w)
    assert np.array_equal(w[infinite], g[infinite])
    np.testing.assert_allclose(g[~np.isnan(w)], w[~np.isnan(w)], rtol=RTOL_OF.get((name, dtype), RTOL[dtype]),
                               atol=ATOL.get(name, {}).get(dtype, 0.0))


@pytest.mark.parametrize("name", sorted(RANGES))
def test_gradients_match_torch(name):
    lo, hi = {"ndtr": (-8, 8), "ndtri": (0.001, 0.999), "log_ndtr": (-50, 10), "erfcx": (-5, 20), "entr": (0.01, 5),
              "i0e": (-40, 40), "i1e": (-40, 40), "i1": (-30, 30)}[name]
    x = np.linspace(lo, hi, 301)
    if name not in ("ndtri", "entr"):
        x = np.concatenate([x, [0.0, -0.0, 1e-20]])
    grads = []
    for lib in (torch, tw):
        t = lib.tensor(x, requires_grad=True)
        y = getattr(lib.special, name)(t)
        y.backward(lib.ones_like(y))
        grads.append(t.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-11 if name == "erfcx" else 1e-12, atol=1e-300)


def test_entr_and_xlog1py_at_their_edges():
    x = np.array([-1.0, 0.0, 2.0, np.nan, np.inf])
    a, b = np.array([0.0, 0.0, 1.5, -2.0, 0.0, np.nan, 1.0]), np.array([-1.0, -2.0, 0.5, 3.0, np.nan, 1.0, -1.0])
    out = []
    for lib in (torch, tw):
        t = lib.tensor(x, requires_grad=True)
        lib.special.entr(t).sum().backward()
        ta, tb = lib.tensor(a, requires_grad=True), lib.tensor(b, requires_grad=True)
        y = lib.special.xlog1py(ta, tb)
        y.sum().backward()
        out.append([lib.special.entr(lib.tensor(x)).numpy(), t.grad.numpy(), y.detach().numpy(), ta.grad.numpy(),
                    tb.grad.numpy(), lib.special.xlog1py(2, lib.tensor([0.5])).numpy(),
                    lib.special.xlog1py(lib.tensor([0.5]), 2).numpy()])
    for ours, theirs in zip(*out[::-1]):
        np.testing.assert_allclose(ours, theirs, rtol=2e-7)


@pytest.mark.parametrize("name", ["ndtr", "ndtri", "log_ndtr", "erfcx", "entr", "i0e", "i1e", "i1"])
def test_dtypes_shapes_and_errors(name):
    for value in (np.float32(0.25), np.zeros((0, 3), np.float32), np.array([1, 2]), np.array([True]),
                  np.array([1 + 1j], np.complex64)):
        results = []
        for lib in (torch, tw):
            try:
                y = getattr(lib.special, name)(lib.tensor(value))
                results.append((str(y.dtype).split(".")[-1], tuple(y.shape), y.stride()))
            except NotImplementedError as e:
                results.append(str(e))
        assert results[0] == results[1]


def test_aliases_of_top_level_operators():
    x = np.linspace(-2, 2, 9)
    for name in ("log1p", "expm1", "exp2", "sinc", "i0", "erf", "erfc"):
        arg = np.abs(x) if name == "log1p" else x
        np.testing.assert_allclose(getattr(tw.special, name)(tw.tensor(arg)).numpy(),
                                   getattr(torch.special, name)(torch.tensor(arg)).numpy(), rtol=1e-13)
    np.testing.assert_array_equal(tw.special.round(tw.tensor(x * 3.3), decimals=1).numpy(),
                                  torch.special.round(torch.tensor(x * 3.3), decimals=1).numpy())
