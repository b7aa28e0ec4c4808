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
