"""Python idioms that scripts apply to tensors, answered as torch answers them."""

from __future__ import annotations

import pytest
import torch as real_torch

import tilewise

LIBRARIES = [real_torch, tilewise]


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_membership_asks_whether_any_element_equals(torch):
    tokens = torch.tensor([[5, 0, 7], [1, 2, 0]])
    assert 7 in tokens and 3 not in tokens and 0.0 in tokens.float()
    assert torch.tensor([1, 2, 0]) in tokens and torch.tensor(9) not in tokens
    with pytest.raises(RuntimeError, match=r"Tensor.__contains__ only supports Tensor or scalar, but you passed in "
                                           r"a <class 'str'>."):
        "a" in tokens  # noqa: B015


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_bernoulli_with_a_probability_draws_in_the_input_s_shape_and_dtype(torch):
    # the mask idiom: torch.bernoulli(x, p) / x.bernoulli(p), x's values unread
    assert torch.bernoulli(torch.full((2, 3), 0.9), 0.0).tolist() == [[0.0] * 3] * 2
    ones = torch.ones(4, dtype=torch.int64).bernoulli(p=1.0)
    assert ones.tolist() == [1] * 4 and ones.dtype == torch.int64
    draws = torch.zeros(1000).bernoulli(0.25, generator=torch.Generator().manual_seed(0))
    assert 0.2 < draws.mean().item() < 0.3
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\], but got p=2"):
        torch.bernoulli(torch.ones(3), 2.0)
