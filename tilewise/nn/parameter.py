"""Parameter: a plain tilewise Tensor marked as a module parameter.

[Note: parameters are tensors] The dispatcher tests ``type(x) is Tensor`` on its hot path, so a Tensor
subclass would fall off it. ``Parameter(data)`` therefore returns an ordinary Tensor that shares
``data``'s storage, requires grad and carries the flag ``_is_param``; ``isinstance(t, Parameter)`` reads
that flag. Optimizers update parameters in place under ``no_grad``, so the object a module holds, the
object an optimizer holds and the tensor that autograd accumulates into are one and the same.
"""

from __future__ import annotations

from types import MethodType

from tilewise.tensor import Tensor


class _ParameterMeta(type):
    def __instancecheck__(cls, obj) -> bool:  # a Tensor subclass's instance made a parameter keeps its class
        return (type(obj) is Tensor or isinstance(obj, Tensor)) and obj.__dict__.get("_is_param", False)


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


class _BufferMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return type(obj) is Tensor and obj.__dict__.get("_is_buffer", False)


class Buffer(metaclass=_BufferMeta):
    """A tensor that a Module registers as a buffer when assigned to one of its attributes (``persistent=False``:
    left out of the state dict), as torch.nn.Buffer.

    >>> import tilewise as tw
    >>> m = tw.nn.Module()
    >>> m.steps = tw.nn.Buffer(tw.zeros(()), persistent=False)
    >>> list(dict(m.named_buffers())), list(m.state_dict())
    (['steps'], [])
    """

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True) -> Tensor:
        if data is None:
            from tilewise.ops.creation import empty

            data = empty(0)
        buffer = data.detach().requires_grad_(data.requires_grad)
        buffer.persistent = persistent
        buffer._is_buffer = True
        return buffer


def is_parameter(obj) -> bool:
    return isinstance(obj, Parameter)


class _UninitializedMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return type(obj) is Tensor and obj.__dict__.get("_uninitialized") == cls._kind


def _uninitialized(kind: str, requires_grad: bool, device, dtype) -> Tensor:
    from tilewise.ops.creation import empty

    tensor = empty(0, device=device, dtype=dtype)
    tensor.requires_grad_(requires_grad)
    tensor._uninitialized = kind
    tensor.materialize = MethodType(_materialize, tensor)  # a bound method: deepcopy rebinds it to the copy
    return tensor


def _materialize(tensor: Tensor, shape, device=None, dtype=None) -> Tensor:
    """Give an uninitialized tensor its shape (uninitialized values) in place, so that whatever holds it — its
    module, an optimizer — holds the materialised tensor."""
    from tilewise.ops.creation import empty

    if isinstance(shape, int):
        shape = (shape,)
    made = empty(tuple(shape), device=device or tensor.device, dtype=dtype or tensor.dtype)
    tensor.data = made
    del tensor.__dict__["_uninitialized"]
    del tensor.__dict__["materialize"]
    return tensor


class UninitializedParameter(metaclass=_UninitializedMeta):
    """A parameter whose shape is not known yet (lazy modules): it holds no data until ``materialize(shape)``,
    which a lazy module calls at its first forward.

    >>> import tilewise as tw
    >>> p = tw.nn.UninitializedParameter()
    >>> isinstance(p, tw.nn.UninitializedParameter), isinstance(p, tw.nn.Parameter)
    (True, True)
    >>> p.materialize((2, 3)).shape, isinstance(p, tw.nn.UninitializedParameter)
    (tilewise.Size([2, 3]), False)
    """

    _kind = "parameter"

    def __new__(cls, requires_grad: bool = True, device=None, dtype=None) -> Tensor:
        param = _uninitialized(cls._kind, requires_grad, device, dtype)
        param._is_param = True
        return param


class UninitializedBuffer(metaclass=_UninitializedMeta):
    """A buffer whose shape is not known yet (a lazy module's running statistics)."""

    _kind = "buffer"

    def __new__(cls, requires_grad: bool = False, device=None, dtype=None) -> Tensor:
        return _uninitialized(cls._kind, requires_grad, device, dtype)


def is_lazy(obj) -> bool:
    """Whether obj is an uninitialized parameter or buffer."""
    return type(obj) is Tensor and "_uninitialized" in obj.__dict__
