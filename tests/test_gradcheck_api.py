"""``tilewise.autograd.gradcheck`` / ``gradgradcheck`` against torch's: the same verdicts, errors and warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.autograd.gradcheck import GradcheckError


def _wrong_backward(lib):
    class Twice(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3  # should be 2

    return Twice.apply


def _inputs(lib):
    rng = np.random.default_rng(0)
    return (lib.tensor(rng.standard_normal((3, 2)), requires_grad=True),
            lib.tensor(rng.standard_normal(2), requires_grad=True))


@pytest.mark.parametrize("fast_mode", [False, True])
def test_verdicts_match_torch(fast_mode):
    def f(a, b):
        return (a * b).sin(), a.sum(0) * b

    for lib in (tw, torch):
        assert lib.autograd.gradcheck(f, _inputs(lib), fast_mode=fast_mode)
        assert lib.autograd.gradgradcheck(f, _inputs(lib), fast_mode=fast_mode)
        bad = _wrong_backward(lib)
        x = lib.tensor(np.arange(3.0), requires_grad=True)
        assert lib.autograd.gradcheck(bad, (x,), raise_exception=False, fast_mode=fast_mode) is False


def test_a_wrong_backward_raises_with_both_jacobians():
    x = tw.tensor(np.arange(2.0), requires_grad=True)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0") as ours:
        tw.autograd.gradcheck(_wrong_backward(tw), (x,))
    assert isinstance(ours.value, RuntimeError)
    assert "numerical:" in str(ours.value) and "analytical:" in str(ours.value)
    with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
        torch.autograd.gradcheck(_wrong_backward(torch), (torch.tensor(np.arange(2.0), requires_grad=True),))


def test_errors_and_the_single_precision_warning_match_torch():
    for lib in (tw, torch):
        with pytest.raises(ValueError, match="none of them have requires_grad=True"):
            lib.autograd.gradcheck(lambda a: a * 2, (lib.ones(2, dtype=lib.float64),))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert lib.autograd.gradcheck(lambda a: a * 2, (lib.ones(3, requires_grad=True),), eps=1e-3, atol=1e-2)
        assert any("Input #0 requires gradient and is not a double precision" in str(w.message) for w in caught)


@pytest.mark.cuda
def test_on_cuda_tensors():
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    a, b = (t.detach().to("cuda").requires_grad_() for t in _inputs(tw))
    assert tw.autograd.gradcheck(lambda a, b: (a * b).tanh().sum(1), (a, b))
