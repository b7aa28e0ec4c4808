"""One flat vector from many parameters, and back (torch.nn.utils.convert_parameters)."""

from __future__ import annotations

from collections.abc import Iterable

from tilewise.ops.functions import cat
from tilewise.tensor import Tensor
from tilewise.tensortypes import typename


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """Concatenate the flattened parameters (differentiably) into one 1-D tensor.

    >>> import tilewise as tw
    >>> tw.nn.utils.parameters_to_vector(tw.nn.Linear(3, 2).parameters()).shape
    tilewise.Size([8])
    """
    device = None
    pieces = []
    for param in parameters:
        device = _same_device(param, device)
        pieces.append(param.view(-1))
    return cat(pieces)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Make each parameter's data the next slice of ``vec`` (a view of it, as torch's ``param.data =``), in
    order; elements of ``vec`` past the last parameter are left unused, as in torch."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected tilewise.Tensor, but got: {typename(vec)}")
    device = None
    offset = 0
    for param in parameters:
        device = _same_device(param, device)
        n = param.numel()
        param.data = vec[offset:offset + n].view_as(param).data
        offset += n


def _same_device(param: Tensor, device):
    if device is None:
        return param.device
    if param.device != device:
        raise TypeError("Found two parameters on different devices, this is currently not supported.")
    return device
