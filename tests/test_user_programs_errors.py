"""The mistakes people make while porting a training script, answered as torch answers them: the same exception
type and the same words, so that the search a user makes for the message finds torch's advice."""

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch

import tilewise

LIBRARIES = [real_torch, tilewise]


def raised(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 — the point is which exception, compared below
        return type(error), str(error)
    return None, None


MISTAKES = {
    # a batch of numpy arrays stacked without converting them first
    "stack-numpy-arrays": lambda torch: torch.stack([np.zeros(2), np.ones(2)]),
    "cat-a-list-element": lambda torch: torch.cat([torch.ones(1), [1.0]]),
    "stack-none-element": lambda torch: torch.stack([torch.ones(1), None]),
    "foreach-second-list": lambda torch: torch._foreach_mul([torch.ones(1), torch.ones(1)], [torch.ones(1), None]),
    "foreach-mixed-list": lambda torch: torch._foreach_add([torch.ones(1), torch.ones(1)], [1.0, torch.ones(1)]),
    "foreach-first-list": lambda torch: torch._foreach_mul([torch.ones(1), 2], 2.0),
    "foreach-lerp-ends": lambda torch: torch._foreach_lerp_([torch.ones(1)], [2], 0.5),
    "foreach-norm": lambda torch: torch._foreach_norm([1]),
    "cat-a-tensor": lambda torch: torch.cat(torch.ones(2)),
    "stack-a-number": lambda torch: torch.stack(5),
    "stack-an-array": lambda torch: torch.stack(np.zeros(2)),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_sequence_of_tensors_holding_something_else_is_refused_in_torch_s_words(name):
    (ours, our_message), (theirs, their_message) = (raised(lambda lib=torch: MISTAKES[name](lib))
                                                    for torch in LIBRARIES[::-1])
    assert issubclass(ours, theirs) and our_message == their_message
