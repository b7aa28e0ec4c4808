"""A module with some parameters and buffers swapped for given tensors while a block runs (torch's
``nn.utils.stateless``), which ``func.functional_call`` is built on.

Tied weights (one Parameter reachable under several names, as an embedding shared with the output layer) stay
tied by default: a value given under one name replaces every name of that parameter, and two different values
for names of one parameter are an error; ``tie_weights=False`` swaps only the names given.
"""

from __future__ import annotations

from contextlib import contextmanager


def _owner(module, name: str):
    """The submodule holding dotted ``name``, and the name's last part."""
    *path, leaf = name.split(".")
    for part in path:
        module = module._modules[part]
    return module, leaf


def _tied_names(module) -> dict[str, list[str]]:
    """Each name of a parameter or buffer -> every name of that same tensor."""
    by_tensor: dict[int, list[str]] = {}
    for named in (module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)):
        for name, t in named:
            by_tensor.setdefault(id(t), []).append(name)
    return {name: names for names in by_tensor.values() for name in names}


def _expand_ties(module, values: dict) -> dict:
    tied = _tied_names(module)
    expanded = dict(values)
    for name, value in values.items():
        for other in tied.get(name, ()):
            if other in values and values[other] is not value:
                names = sorted(n for n in tied[name] if n in values)
                raise ValueError(f"functional_call got multiple values for keys {names}, which are tied. Consider "
                                 "using tie_weights=False")
            expanded[other] = value
    return expanded


def _check_strict(module, values: dict) -> None:
    known = list(_tied_names(module))
    unexpected = sorted(k for k in values if k not in known)
    missing = sorted(k for k in known if k not in values)
    if unexpected or missing:
        lines = []
        if unexpected:
            lines.append("Unexpected key(s): " + ", ".join(f"'{k}'" for k in unexpected) + ".")
        if missing:
            lines.append("Missing key(s): " + ", ".join(f"'{k}'" for k in missing) + ".")
        raise RuntimeError(f"Error(s) in reparametrizing for {type(module).__name__}:\n\t" + "\n\t".join(lines))


@contextmanager
def reparametrized(module, values: dict, *, tie_weights: bool = True, strict: bool = False):
    if tie_weights:
        values = _expand_ties(module, values)
    if strict:
        _check_strict(module, values)
    swapped = []
    try:
        for name, value in values.items():
            try:
                owner, leaf = _owner(module, name)
            except KeyError:
                continue  # a name the module does not have (allowed unless strict)
            for store in (owner._parameters, owner._buffers):
                if leaf in store:
                    swapped.append((store, leaf, store[leaf]))
                    store[leaf] = value
                    break
        yield module
    finally:
        for store, leaf, old in reversed(swapped):
            store[leaf] = old
