"""Legacy tensor types: ``tilewise.FloatTensor``, ``tilewise.LongTensor``, ``tilewise.cuda.FloatTensor``, ...

[Note: legacy tensor types] torch keeps one class per (dtype, device type) from before tensors carried a
dtype. Code still calls them as constructors (``LongTensor([1, 2])``, ``FloatTensor(2, 3)``), tests with them
(``isinstance(t, torch.LongTensor)``) and names them in ``t.type()`` strings. Here each is a class whose
metaclass answers ``isinstance`` by the tensor's dtype and device type and whose call builds an ordinary
``Tensor``: there is one tensor class, and these are predicates and factories over it, as in torch (where
``issubclass(torch.LongTensor, torch.Tensor)`` is False too).

>>> import tilewise as tw
>>> isinstance(tw.LongTensor([1, 2]), tw.LongTensor), tw.FloatTensor(2, 3).shape, tw.ones(2).type()
(True, tilewise.Size([2, 3]), 'tilewise.FloatTensor')
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.device import as_device, set_default_device
from tilewise.dtypes import DType
from tilewise.tensor import FACTORIES, Size, Tensor, tensor

_LEGACY_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
                 "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


# in type strings only: torch names complex tensors so but has no classes of those names
_COMPLEX_NAMES = {"complex64": "ComplexFloat", "complex128": "ComplexDouble", "complex32": "ComplexHalf"}


def type_name(dtype: DType, device_type: str) -> str:
    """``t.type()``'s string: 'tilewise.FloatTensor', 'tilewise.cuda.LongTensor', 'tilewise.ComplexFloatTensor',
    ..."""
    stem = _LEGACY_NAMES.get(dtype.name) or _COMPLEX_NAMES.get(dtype.name) or dtype.name.capitalize()
    return f"tilewise.{'cuda.' if device_type == 'cuda' else ''}{stem}Tensor"


class TensorType(type):
    """The metaclass of the legacy tensor types (torch's ``torch.tensortype``)."""

    dtype: DType
    device_type: str

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and obj.device.type == cls.device_type

    def __repr__(cls) -> str:
        return f"<class '{type_name(cls.dtype, cls.device_type)}'>"

    def __call__(cls, *args, device=None) -> Tensor:
        device = _device_for(cls, device)
        if len(args) == 1 and isinstance(args[0], Tensor):
            return _alias(cls, args[0])
        sizes = _sizes(args) if args else (0,)
        if sizes is not None:
            return FACTORIES.empty(sizes, dtype=cls.dtype, device=device)
        if len(args) > 1:
            bad = next(a for a in args if not isinstance(a, int))
            raise TypeError(f"{cls.__name__}(): expected sizes (ints) or one sequence of data, but got "
                            f"{type(bad).__name__} {bad!r} among the arguments")
        return tensor(args[0], dtype=cls.dtype, device=device)


def _device_for(cls: TensorType, device):
    target = as_device(device if device is not None else cls.device_type)
    if target.type != cls.device_type:
        raise RuntimeError(f"legacy constructor expects device type: {cls.device_type} but device type: "
                           f"{target.type} was passed")
    return target


def _sizes(args: tuple) -> tuple | None:
    """The sizes of ``LongTensor(2, 3)`` or ``LongTensor(Size([2, 3]))``; None for data."""
    if len(args) == 1 and isinstance(args[0], Size):
        return tuple(args[0])
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args) and (len(args) > 1 or
                                                                             not isinstance(args[0], (list, tuple))):
        return tuple(args)
    return None


def _alias(cls: TensorType, other: Tensor) -> Tensor:
    if other.dtype is not cls.dtype or other.device.type != cls.device_type:
        raise TypeError(f"{cls.__name__}(): expected a tensor of dtype {cls.dtype.name} on {cls.device_type} (got "
                        f"dtype {other.dtype.name} on {other.device}); convert it with .to(...) first")
    return other.detach()


def _make(dtype: DType, device_type: str) -> TensorType:
    name = type_name(dtype, device_type).rsplit(".", 1)[1]
    module = "tilewise.cuda" if device_type == "cuda" else "tilewise"
    return TensorType(name, (), {"dtype": dtype, "device_type": device_type, "is_cuda": device_type == "cuda",
                                 "__module__": module, "__doc__": f"{dtype.name} tensors on {device_type}"})


CPU_TYPES = {dtypes.from_name(name): _make(dtypes.from_name(name), "cpu") for name in _LEGACY_NAMES}
CUDA_TYPES = {dtype: _make(dtype, "cuda") for dtype in CPU_TYPES}
BY_NAME = {cls.__name__: cls for cls in CPU_TYPES.values()}


def from_type_string(name: str):
    """'torch.LongTensor', 'tilewise.cuda.FloatTensor' -> (dtype, device type), or None when not a type name."""
    stem = name.removeprefix("torch.").removeprefix("tilewise.")
    device_type = "cuda" if stem.startswith("cuda.") else "cpu"
    cls = BY_NAME.get(stem.removeprefix("cuda."))
    return None if cls is None else (cls.dtype, device_type)


def convert(t: Tensor, target) -> Tensor:
    """``t.type(target)`` for a legacy type, a type string or a dtype."""
    if isinstance(target, TensorType):
        return t.to(as_device(target.device_type) if t.device.type != target.device_type else t.device, target.dtype)
    if isinstance(target, str):
        parsed = from_type_string(target)
        if parsed is not None:
            dtype, device_type = parsed
            return t.to(as_device(device_type) if t.device.type != device_type else t.device, dtype)
    return t.to(dtypes.as_dtype(target))


def tensor_type(self: Tensor, dtype=None):
    """'tilewise.FloatTensor' (torch's legacy type name); with a dtype, a legacy type or its name: converted."""
    if dtype is None:
        return type_name(self._dtype, self._device.type)
    return convert(self, dtype)


tensor_type.__name__ = tensor_type.__qualname__ = "type"
Tensor.type = tensor_type  # see [Note: methods from above] in tensor.py


def typename(obj, /) -> str:
    """A readable type name: ``t.type()`` for a tensor ('tilewise.FloatTensor'), else module and qualified name
    (torch.typename)."""
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", "") or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        qualname, module = type(obj).__qualname__, type(obj).__module__
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def set_default_tensor_type(t, /) -> None:
    """Deprecated in torch: the default floating dtype (and, for a cuda type, the default device) from a legacy
    type or its name ('tilewise.DoubleTensor'; torch's 'torch.DoubleTensor' spelling is accepted too)."""
    import warnings

    warnings.warn("set_default_tensor_type() is deprecated as of PyTorch 2.1, please use set_default_dtype() and "
                  "set_default_device() as alternatives.", UserWarning, stacklevel=2)
    if isinstance(t, str):
        parsed = from_type_string(t)
        if parsed is None:
            raise TypeError(f"set_default_tensor_type: unknown tensor type {t!r}; valid: "
                            f"{', '.join('tilewise.' + n for n in BY_NAME)}")
        dtype, device_type = parsed
    elif isinstance(t, TensorType):
        dtype, device_type = t.dtype, t.device_type
    else:
        raise TypeError("invalid type object: only floating-point types are supported as the default type")
    if not dtype.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the default type tilewise.{dtype.name}")
    dtypes.set_default_dtype(dtype)
    set_default_device(device_type)
