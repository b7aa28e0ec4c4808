"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict (torch's semantics)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping

from tilewise.nn.modules.module import Module, _addindent
from tilewise.nn.parameter import Parameter
from tilewise.tensor import Tensor


def _index(idx: int, size: int, what: str) -> int:
    idx = operator.index(idx)
    if not -size <= idx < size:
        raise IndexError(f"index {idx} is out of range for {what} of length {size}")
    return idx % size


class Sequential(Module):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``; also accepts one OrderedDict of names.

    >>> import tilewise as tw
    >>> net = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.ReLU(), tw.nn.Linear(4, 1))
    >>> net(tw.ones(2, 3)).shape, len(net), type(net[1]).__name__
    (tilewise.Size([2, 1]), 3, 'ReLU')
    """

    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[_index(idx, len(self), "Sequential")]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[_index(idx, len(self), "Sequential")]
        setattr(self, key, module)

    def __delitem__(self, idx) -> None:
        keys = list(self._modules)
        for key in keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self), "Sequential")]]:
            del self._modules[key]
        self._renumber()

    def _renumber(self) -> None:
        items = list(self._modules.values())
        self._modules.clear()
        for k, module in enumerate(items):
            self._modules[str(k)] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __add__(self, other: Sequential) -> Sequential:
        return Sequential(*self, *other)

    def __mul__(self, times: int) -> Sequential:
        """The modules repeated ``times`` times (the same module objects, as in torch)."""
        if not isinstance(times, int):
            raise TypeError(f"unsupported operand type(s) for *: {type(self)} and {type(times)}")
        if times <= 0:
            raise ValueError(f"Non-positive multiplication factor {times} for {type(self)}")
        return Sequential(*(list(self) * times))

    def __rmul__(self, times: int) -> Sequential:
        return self.__mul__(times)

    def __imul__(self, times: int) -> Sequential:
        repeated = self * times
        self._modules.clear()
        return self.extend(repeated)

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for k, m in enumerate(items):
            self.add_module(str(k), m)
        return self

    def extend(self, modules: Iterable[Module]) -> Sequential:
        for module in modules:
            self.append(module)
        return self

    def pop(self, idx: int) -> Module:
        module = self[idx]
        del self[idx]
        return module


class ModuleList(Module):
    """A list of submodules that registers each one (so its parameters are found)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self), "ModuleList"))]

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(str(_index(idx, len(self), "ModuleList")), module)

    def __delitem__(self, idx) -> None:
        keys = list(self._modules)
        for key in keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self), "ModuleList")]]:
            del self._modules[key]
        items = list(self._modules.values())
        self._modules.clear()
        for k, module in enumerate(items):
            self._modules[str(k)] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self, *other])

    def __repr__(self) -> str:
        """torch's: a run of children that print alike is one line, ``(first-last): n x child``."""
        if not self._modules:
            return self._get_name() + "()"
        runs: list[list] = []  # [first index, last index, text]
        for k, module in enumerate(self):
            text = repr(module)
            if runs and runs[-1][2] == text:
                runs[-1][1] = k
            else:
                runs.append([k, k, text])
        lines = [_addindent(f"({first}): {text}" if first == last else f"({first}-{last}): {last - first + 1} x {text}",
                            2) for first, last, text in runs]
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for k, m in enumerate(items):
            self.add_module(str(k), m)

    def pop(self, idx: int = -1) -> Module:
        module = self[idx]
        del self[idx]
        return module


class ModuleDict(Module):
    """An ordered dict of submodules, registered under their keys."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def update(self, modules) -> None:
        if not isinstance(modules, Iterable):
            raise TypeError(f"ModuleDict.update should be called with an iterable of key/value pairs, but got "
                            f"{type(modules).__name__}")
        pairs = modules.items() if isinstance(modules, (Mapping, ModuleDict)) else _pairs(modules, "ModuleDict")
        for key, module in pairs:
            self[key] = module


class ParameterList(Module):
    """A list of parameters, each registered under its index (tensors are made Parameters; other objects are kept
    as plain attributes, as torch keeps them)."""

    def __init__(self, values: Iterable | None = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList(self[k] for k in range(*idx.indices(len(self))))
        return getattr(self, str(_index(idx, len(self), "ParameterList")))

    def __setitem__(self, idx: int, value) -> None:
        setattr(self, str(_index(idx, len(self), "ParameterList")), _as_parameter(value))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator:
        return iter([self[k] for k in range(len(self))])

    def __iadd__(self, values: Iterable) -> ParameterList:
        return self.extend(values)

    def append(self, value) -> ParameterList:
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable) -> ParameterList:
        if not isinstance(values, Iterable) or isinstance(values, Tensor):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got {type(values).__name__}")
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {_describe(p, str(p.dtype) if isinstance(p, Tensor) else '')}"
                         for k, p in enumerate(self))


class ParameterDict(Module):
    """An ordered dict of parameters registered under their (string) keys, with dict's methods. As in torch, a
    plain dict given to the constructor or ``update`` is taken in sorted key order (an OrderedDict, a
    ParameterDict or a sequence of pairs keeps its order)."""

    def __init__(self, parameters=None) -> None:
        super().__init__()
        self._keys: dict[str, None] = {}
        if parameters is not None:
            self.update(parameters)

    @staticmethod
    def _attribute(key) -> str:
        if not isinstance(key, str):
            raise TypeError(f"Index given to ParameterDict cannot be used as a key as it is not a string (type is "
                            f"'{type(key).__name__}').")
        return key

    def __getitem__(self, key: str):
        return getattr(self, self._attribute(key))

    def __setitem__(self, key: str, value) -> None:
        attribute = self._attribute(key)
        self._keys[key] = None
        setattr(self, attribute, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, self._attribute(key))

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._keys))

    def __contains__(self, key) -> bool:
        return key in self._keys

    def keys(self):
        return self._keys.keys()

    def values(self):
        return (self[k] for k in self._keys)

    def items(self):
        return ((k, self[k]) for k in self._keys)

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def setdefault(self, key: str, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: str):
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple:
        if not self._keys:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(self._keys))
        return key, self.pop(key)

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def copy(self) -> ParameterDict:
        return ParameterDict(OrderedDict((k, self[k]) for k in self._keys))

    def fromkeys(self, keys: Iterable[str], default=None) -> ParameterDict:
        return ParameterDict((k, default) for k in keys)

    def update(self, parameters) -> None:
        if not isinstance(parameters, Iterable):
            raise TypeError(f"ParametersDict.update should be called with an iterable of key/value pairs, but got "
                            f"{type(parameters).__name__}")
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = list(parameters.items())
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        else:
            pairs = _pairs(parameters, "ParameterDict")
        for key, value in pairs:
            self[key] = value

    def __or__(self, other: ParameterDict) -> ParameterDict:
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other: ParameterDict) -> ParameterDict:
        merged = other.copy()
        merged.update(self)
        return merged

    def __ior__(self, other: ParameterDict) -> ParameterDict:
        self.update(other)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {_describe(p, p.type() if isinstance(p, Tensor) else '')}"
                         for k, p in self.items())


def _pairs(sequence, container: str) -> list[tuple]:
    """A sequence of (key, value) pairs, checked as torch checks a container's update."""
    pairs = []
    for j, pair in enumerate(sequence):
        if not isinstance(pair, Iterable):
            raise TypeError(f"{container} update sequence element #{j} should be Iterable; is {type(pair).__name__}")
        pair = tuple(pair)
        if len(pair) != 2:
            raise ValueError(f"{container} update sequence element #{j} has length {len(pair)}; 2 is required")
        pairs.append(pair)
    return pairs


def _describe(value, type_name: str) -> str:
    """torch's line for one entry of a parameter container."""
    if not isinstance(value, Tensor):
        return f"Object of type: {type(value).__name__}"
    kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
    device = f" ({value.device})" if value.device.type != "cpu" else ""
    return f"{kind} containing: [{type_name} of size {'x'.join(map(str, value.shape))}{device}]"


def _as_parameter(value):
    """Tensors become Parameters; anything else is kept as it is."""
    return Parameter(value) if isinstance(value, Tensor) and not isinstance(value, Parameter) else value
