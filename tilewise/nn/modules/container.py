"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict (torch's semantics)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping

from tilewise.nn.modules.module import Module
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
        items = modules.items() if hasattr(modules, "items") else modules
        for key, module in items:
            self[key] = module


class ParameterList(Module):
    """A list of parameters, each registered (plain tensors are wrapped as Parameters)."""

    def __init__(self, values: Iterable[Tensor] | None = None) -> None:
        super().__init__()
        for value in values or ():
            self.append(value)

    def __getitem__(self, idx: int) -> Tensor:
        return self._parameters[str(_index(idx, len(self), "ParameterList"))]

    def __setitem__(self, idx: int, value: Tensor) -> None:
        self.register_parameter(str(_index(idx, len(self), "ParameterList")), _as_parameter(value))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self._parameters.values())

    def append(self, value: Tensor) -> ParameterList:
        self.register_parameter(str(len(self)), _as_parameter(value))
        return self

    def extend(self, values: Iterable[Tensor]) -> ParameterList:
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): Parameter containing: [{p.dtype} of size {'x'.join(map(str, p.shape))}]"
                         for k, p in self._parameters.items())


class ParameterDict(Module):
    """An ordered dict of parameters, registered under their keys."""

    def __init__(self, parameters=None) -> None:
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Tensor:
        return self._parameters[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        self.register_parameter(key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def __contains__(self, key: str) -> bool:
        return key in self._parameters

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()

    def update(self, parameters) -> None:
        items = parameters.items() if hasattr(parameters, "items") else parameters
        for key, value in items:
            self[key] = value


def _as_parameter(value: Tensor) -> Tensor:
    return value if isinstance(value, Parameter) else Parameter(value)
