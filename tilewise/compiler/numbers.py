"""Dynamic numbers: Python ints and floats a compiled function reads at run time instead of baking them in.

[Note: dynamic numbers] A number passed to a compiled function (a loss scale, a temperature, a step count) is at
first a constant of the trace, guarded by value, as torch's first call specialises it. When a later call fails no
guard but a number argument's value, that argument is made *dynamic* for the function (torch's automatic dynamic):
the next trace hands the function a ``DynamicNumber`` in its place, and the variant guards only its type.

A ``DynamicNumber`` knows its value at this call and the graph value it stands for (a 0-dim float64 or int64
tensor: a leaf is a graph input made from the argument on every call, ``number_tensor``). Python arithmetic on it
follows Python's rules — ``+ - * /``, negation and ``abs`` are recorded in float64 (int64 for ints; ``/`` of ints
gives a float), so ``scale * 2`` stays dynamic. Beside a tensor, as an operand of ``add``, ``sub``, ``rsub``,
``mul``, ``div`` and ``rdiv``, it becomes a 0-dim tensor of the dtype the operator computes in, where that gives
the operator the same result dtype, compute dtype and rounding as the Python number (``resolve``): a float beside a
float16 tensor gives float16, computed in float32, as ``x * 0.1`` does. Everywhere else — ``float()``, ``int()``,
``bool()``, comparisons, ``//``, ``%``, ``**``, hashing, printing, a shape, an index, ``range``, a Scalar or int
argument of an operator (``alpha``, ``clamp``'s bounds, dropout's ``p``), math functions — its value is taken and
the leaves it came from are *specialised*: the variant guards them by value, and the function never makes them
dynamic again (torch guards such uses the same way). A trace that fails with a dynamic number in play is recorded
again with the numbers as given, so an operator that refuses a tensor where it took a number costs one more trace,
never a wrong answer. A number divided by a dynamic leaf guards that leaf as nonzero (a zero then recompiles and
raises ``ZeroDivisionError`` as Python does).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import numpy as np

from tilewise import dtypes
from tilewise.compiler.capture import Source
from tilewise.device import Device
from tilewise.dispatch import register_number_resolver
from tilewise.tensor import Tensor, from_array

# operators whose Tensor operands may be a dynamic number (their lowering reads a 0-dim tensor as it reads a number)
RUNTIME_OPERATORS = frozenset({"add", "sub", "rsub", "mul", "div", "rdiv"})
INT64_RANGE = (-(2 ** 63), 2 ** 63)


def number_tensor(value, dtype, device: Device) -> Tensor:
    """The 0-dim tensor a dynamic number's graph input reads: float64 for a float, int64 for an int."""
    t = from_array(np.asarray(value, dtype=dtype.np), dtype)
    return t if device.type == "cpu" else t.to(device)


def admits(value, kind: type) -> bool:
    """Whether a call's ``value`` fits a dynamic leaf traced as ``kind`` (int or float; bools are never dynamic)."""
    if type(value) is not kind:
        return False
    return kind is float or INT64_RANGE[0] <= value < INT64_RANGE[1]


@dataclass
class NumberTrace:
    """The dynamic numbers of one trace: their leaves, where their tensors live, and what had to be specialised."""

    device: Device
    leaves: dict[int, DynamicNumber] = field(default_factory=dict)  # flat argument index -> its number
    sources: dict[int, object] = field(default_factory=dict)  # id(base tensor) -> its capture Source
    specialised: set[int] = field(default_factory=set)  # leaves whose value the trace used
    nonzero: set[int] = field(default_factory=set)  # leaves a number was divided by

    def leaf(self, index: int, value, label: str) -> DynamicNumber:
        kind = type(value)
        dtype = dtypes.float64 if kind is float else dtypes.int64
        base = number_tensor(value, dtype, self.device)
        self.sources[id(base)] = Source("number", label, index=index, obj=functools.partial(
            number_tensor, dtype=dtype, device=self.device))
        number = DynamicNumber(self, value, base, frozenset((index,)), index)
        self.leaves[index] = number
        return number

    def concrete(self, tree):
        """``tree`` (a function's result) with every dynamic number in it replaced by its value (specialised)."""
        if type(tree) is DynamicNumber:
            return tree._tw_concrete()
        if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
            items = [self.concrete(item) for item in tree]
            return items if type(tree) is list else type(tree)(items)
        if isinstance(tree, dict):
            return {k: self.concrete(v) for k, v in tree.items()}
        return tree


def _specialising(name: str):
    """A dunder that needs the number's value: the value's own, with the number's leaves specialised."""
    def method(self, *args):
        return getattr(self._tw_concrete(), name)(*[_plain(a) for a in args])

    method.__name__ = name
    return method


def _plain(value):
    return value._tw_concrete() if type(value) is DynamicNumber else value


class DynamicNumber:
    """A Python int or float of a compiled function's arguments, read at run time (see [Note: dynamic numbers])."""

    __slots__ = ("trace", "value", "tensor", "leaves", "index")

    def __init__(self, trace: NumberTrace, value, tensor: Tensor, leaves: frozenset, index: int | None = None):
        self.trace = trace
        self.value = value  # the value at this call
        self.tensor = tensor  # 0-dim float64 or int64: the graph value it stands for
        self.leaves = leaves  # the argument leaves it was computed from
        self.index = index  # the argument leaf it is, or None for a value computed from some

    @property
    def __class__(self):  # isinstance(n, float) holds as for the number it stands for (type() tells them apart)
        return type(self.value)

    def _tw_concrete(self):
        """The value, for a use that needs it: the leaves it came from are guarded by value from now on."""
        self.trace.specialised |= self.leaves
        return self.value

    # ------------------------------------------------------------------ arithmetic, kept dynamic
    def _binary(self, other, fn, swapped: bool = False, true_division: bool = False):
        if type(other) is not DynamicNumber and type(other) not in (int, float, bool):
            return NotImplemented
        left, right = (other, self) if swapped else (self, other)
        value = fn(_value(left), _value(right))  # Python's result (and its errors: ZeroDivisionError)
        if type(value) not in (int, float) or (type(value) is int and not INT64_RANGE[0] <= value < INT64_RANGE[1]):
            return self._specialised_result(value, other)
        if true_division and not self._divisor_guarded(right):
            return self._specialised_result(value, other)
        dtype = dtypes.float64 if type(value) is float else dtypes.int64
        if true_division and type(left) is not DynamicNumber:  # ``2 / n`` divides, as Python does (a number over a
            left = _constant(left, dtype, self.tensor._device)  # tensor would multiply by its reciprocal)
        tensor = fn(_operand(left, dtype), _operand(right, dtype))
        leaves = self.leaves | (other.leaves if type(other) is DynamicNumber else frozenset())
        return DynamicNumber(self.trace, value, tensor, leaves)

    def _divisor_guarded(self, divisor) -> bool:
        """A dynamic divisor must be a leaf, guarded nonzero (a derived one is specialised instead)."""
        if type(divisor) is not DynamicNumber:
            return True
        if divisor.index is None:
            return False
        self.trace.nonzero.add(divisor.index)
        return True

    def _specialised_result(self, value, other):
        self._tw_concrete()
        _plain(other)
        return value

    def __add__(self, other):
        return self._binary(other, operator.add)

    def __radd__(self, other):
        return self._binary(other, operator.add, swapped=True)

    def __sub__(self, other):
        return self._binary(other, operator.sub)

    def __rsub__(self, other):
        return self._binary(other, operator.sub, swapped=True)

    def __mul__(self, other):
        return self._binary(other, operator.mul)

    def __rmul__(self, other):
        return self._binary(other, operator.mul, swapped=True)

    def __truediv__(self, other):
        return self._binary(other, operator.truediv, true_division=True)

    def __rtruediv__(self, other):
        return self._binary(other, operator.truediv, swapped=True, true_division=True)

    def __neg__(self):
        return DynamicNumber(self.trace, -self.value, -self.tensor, self.leaves)

    def __pos__(self):
        return self

    def __abs__(self):
        return DynamicNumber(self.trace, abs(self.value), self.tensor.abs(), self.leaves)

    # ------------------------------------------------------------------ uses that need the value
    def __float__(self):
        return float(self._tw_concrete())

    def __int__(self):
        return int(self._tw_concrete())

    def __index__(self):
        value = self._tw_concrete()
        return operator.index(value)  # a float raises Python's TypeError

    def __bool__(self):
        return bool(self._tw_concrete())

    def __hash__(self):
        return hash(self._tw_concrete())

    def __repr__(self):
        return repr(self._tw_concrete())

    def __format__(self, spec):
        return format(self._tw_concrete(), spec)

    def __getattr__(self, name):  # real, imag, is_integer(), ...: the value's (an attribute it lacks is an error)
        if name.startswith("_") or not hasattr(self.value, name):
            raise AttributeError(f"'{type(self.value).__name__}' object has no attribute '{name}'")
        return getattr(self._tw_concrete(), name)

    __str__ = __repr__
    __complex__ = _specialising("__complex__")
    __round__ = _specialising("__round__")
    __trunc__ = _specialising("__trunc__")
    __floor__ = _specialising("__floor__")
    __ceil__ = _specialising("__ceil__")
    __lt__ = _specialising("__lt__")
    __le__ = _specialising("__le__")
    __gt__ = _specialising("__gt__")
    __ge__ = _specialising("__ge__")
    __eq__ = _specialising("__eq__")
    __ne__ = _specialising("__ne__")
    __floordiv__ = _specialising("__floordiv__")
    __rfloordiv__ = _specialising("__rfloordiv__")
    __mod__ = _specialising("__mod__")
    __rmod__ = _specialising("__rmod__")
    __divmod__ = _specialising("__divmod__")
    __rdivmod__ = _specialising("__rdivmod__")
    __pow__ = _specialising("__pow__")
    __rpow__ = _specialising("__rpow__")
    __and__ = _specialising("__and__")
    __rand__ = _specialising("__rand__")
    __or__ = _specialising("__or__")
    __ror__ = _specialising("__ror__")
    __xor__ = _specialising("__xor__")
    __rxor__ = _specialising("__rxor__")
    __lshift__ = _specialising("__lshift__")
    __rlshift__ = _specialising("__rlshift__")
    __rshift__ = _specialising("__rshift__")
    __rrshift__ = _specialising("__rrshift__")
    __invert__ = _specialising("__invert__")


def _value(x):
    return x.value if type(x) is DynamicNumber else x


def _constant(value, dtype, device) -> Tensor:
    from tilewise.ops.creation import full

    return full((), value, dtype=dtype, device=device)


def _operand(x, dtype):
    """An operand of number arithmetic in ``dtype`` (float64 or int64): a number's tensor, or a Python number."""
    if type(x) is DynamicNumber:
        return x.tensor if x.tensor._dtype is dtype else x.tensor.to(dtype)
    if type(x) is Tensor:
        return x
    return float(x) if dtype is dtypes.float64 else int(x)


# ---------------------------------------------------------------------------- beside tensors

def resolve(op, args: tuple) -> tuple:
    """An operator's arguments with each dynamic number replaced: by a 0-dim tensor where the operator reads it as
    it would read the number (see [Note: dynamic numbers]), else by its value (specialised)."""
    tensor_positions = set(op.tensor_idx)
    out = list(args)
    for k, a in enumerate(args):
        if isinstance(a, (tuple, list)):  # a list of tensors (stack, cat): its numbers are values
            out[k] = type(a)(_plain(x) for x in a) if any(type(x) is DynamicNumber for x in a) else a
            continue
        if type(a) is not DynamicNumber:
            continue
        replacement = _as_operand(op, args, k) if k in tensor_positions else None
        out[k] = replacement if replacement is not None else a._tw_concrete()
    return tuple(out)


def _as_operand(op, args: tuple, k: int) -> Tensor | None:
    number = args[k]
    if op.name not in RUNTIME_OPERATORS or op.kind != "pointwise" or "rounding_mode" in op.param_names() and \
            args[op.param_names().index("rounding_mode")] is not None:
        return None
    others = [args[j] for j in op.tensor_idx if j != k]
    if any(type(o) is DynamicNumber for o in others) or not all(type(o) is Tensor for o in others):
        return None
    if any(o._device != number.tensor._device for o in others):
        return None
    concrete = list(args)
    concrete[k] = number.value
    try:
        out, compute = op.dtype_rule(op, tuple(concrete))
    except Exception:  # noqa: BLE001 — the operator refuses the number: let it say so with the value
        return None
    dtype = compute if compute.is_floating_point else dtypes.int64
    if compute.is_complex or compute.category < dtypes.INT:
        return None
    stand = Tensor._make(None, (), (), 0, dtype, number.tensor._device)
    trial = list(args)
    trial[k] = stand
    if op.dtype_rule(op, tuple(trial)) != (out, compute):
        return None
    return number.tensor if number.tensor._dtype is dtype else number.tensor.to(dtype)


def resolve_call(op, args: tuple) -> tuple:
    """The dispatcher's hook while a trace has dynamic numbers: ``resolve`` where the call has some."""
    for a in args:
        if type(a) is DynamicNumber or isinstance(a, (tuple, list)) and any(type(x) is DynamicNumber for x in a):
            return resolve(op, args)
    return args


register_number_resolver(resolve_call)


# ---------------------------------------------------------------------------- the arguments of a traced call

def substituted(args: tuple, kwargs: dict, numbers: dict[int, DynamicNumber]) -> tuple[tuple, dict, list]:
    """The arguments with the leaves in ``numbers`` (flat positions, as ``capture.flatten`` counts them) replaced by
    their dynamic numbers, and what to undo after the trace: lists and dicts are changed in place (the function may
    keep them or change them itself, as it would the caller's own), tuples are rebuilt."""
    undo: list = []
    new_args, position = _put(list(args), numbers, 0, undo)
    new_kwargs, _ = _put(kwargs, numbers, position, undo)
    return tuple(new_args), new_kwargs, undo


def undone(undo: list) -> None:
    """Put the numbers ``substituted`` replaced back where the function left their stand-ins."""
    for container, key, old, new in reversed(undo):
        if container.get(key, None) is new if isinstance(container, dict) else \
                key < len(container) and container[key] is new:
            container[key] = old


def _put(tree, numbers: dict, position: int, undo: list):
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        items = []
        for item in tree:
            item, position = _put(item, numbers, position, undo)
            items.append(item)
        if isinstance(tree, list):
            for k, (old, new) in enumerate(zip(tree, items)):
                if new is not old:
                    tree[k] = new
                    undo.append((tree, k, old, new))
            return tree, position
        if all(a is b for a, b in zip(tree, items)):
            return tree, position
        return type(tree)(items), position
    if isinstance(tree, dict):
        values, position = _put(list(tree.values()), numbers, position, [])
        for key, new in zip(list(tree), values):
            old = tree[key]
            if new is not old:
                tree[key] = new
                undo.append((tree, key, old, new))
        return tree, position
    number = numbers.get(position)
    return (number if number is not None else tree), position + 1
