"""torch.utils.data._utils.pin_memory's ``pin_memory``: a batch's tensors copied into page-locked memory."""

from tilewise.utils.data._pin_memory import pin_memory

__all__ = ["pin_memory"]
