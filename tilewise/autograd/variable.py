"""``Variable``: torch's legacy name for a tensor that records gradients, kept for what still reaches through it.

Code written for torch reaches the autograd engine as ``Variable._execution_engine`` (DistributedDataParallel
queues its end-of-backward callback there), and old code still calls ``Variable(t, requires_grad=True)``;
``isinstance(t, Variable)`` holds for every tensor, as in torch.
"""

from __future__ import annotations

import warnings

from tilewise.autograd.engine import ExecutionEngine
from tilewise.tensor import Tensor


class _VariableMeta(type):
    def __instancecheck__(cls, other) -> bool:
        return isinstance(other, Tensor)


class Variable(metaclass=_VariableMeta):
    _execution_engine = ExecutionEngine()

    def __new__(cls, data: Tensor, requires_grad: bool = False, volatile: bool | None = None) -> Tensor:
        if volatile is not None:
            warnings.warn("volatile was removed and now has no effect. Use `with tilewise.no_grad():` instead.",
                          UserWarning, stacklevel=2)
        return data.detach().requires_grad_(requires_grad)
