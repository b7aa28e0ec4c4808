"""One flat vector from many parameters, and back."""

from __future__ import annotations

from collections.abc import Iterable

from tilewise.autograd.grad_mode import no_grad
from tilewise.ops.functions import cat
from tilewise.tensor import Tensor


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """Concatenate the flattened parameters (differentiably) into one 1-D tensor."""
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of ``vec`` into the parameters, in order."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected a Tensor, but got: {type(vec).__name__}")
    offset = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[offset:offset + n].view_as(p))
            offset += n
    if offset != vec.numel():
        raise RuntimeError(f"vector_to_parameters: the vector has {vec.numel()} elements, the parameters {offset}")
