"""tilewise.nn.utils.stateless: the older spelling of ``tilewise.func.functional_call``, kept (with torch's
FutureWarning) so that code written against it runs."""

from __future__ import annotations

import warnings

__all__ = ["functional_call"]


def functional_call(module, parameters_and_buffers, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):
    """``tilewise.func.functional_call`` of one dict of parameters and buffers."""
    warnings.warn("`torch.nn.utils.stateless.functional_call` is deprecated as of PyTorch 2.0 and will be removed in "
                  "a future version of PyTorch. Please use `torch.func.functional_call` instead which is a drop-in "
                  "replacement.", FutureWarning, stacklevel=2)
    from tilewise.func import functional_call as call

    return call(module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict)
