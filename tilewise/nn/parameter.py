"""Parameter: a plain tilewise Tensor marked as a module parameter.

[Note: parameters are tensors] The dispatcher tests ``type(x) is Tensor`` on its hot path, so a Tensor
subclass would fall off it. ``Parameter(data)`` therefore returns an ordinary Tensor that shares
``data``'s storage, requires grad and carries the flag ``_is_param``; ``isinstance(t, Parameter)`` reads
that flag. Optimizers update parameters in place under ``no_grad``, so the object a module holds, the
object an optimizer holds and the tensor that autograd accumulates into are one and the same.
"""

from __future__ import annotations

from tilewise.tensor import Tensor


class _ParameterMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return type(obj) is Tensor and obj.__dict__.get("_is_param", False)


class Parameter(metaclass=_ParameterMeta):
    """A tensor that a Module registers as a parameter.

    >>> import tilewise as tw
    >>> p = tw.nn.Parameter(tw.zeros(2))
    >>> isinstance(p, tw.nn.Parameter), p.requires_grad, p.is_leaf
    (True, True, True)
    """

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Tensor:
        if data is None:
            from tilewise.ops.creation import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(): expected a Tensor, got {type(data).__name__}")
        param = data.detach()
        param.requires_grad_(requires_grad)
        param._is_param = True
        return param


def is_parameter(obj) -> bool:
    return isinstance(obj, Parameter)
