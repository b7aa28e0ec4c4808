"""Nested Python containers of tensors (tuples, lists, dicts, named tuples) as a flat list and a spec that rebuilds
them: what function transforms need to take and return the structures torch.func takes (a dict of parameters,
a tuple of outputs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeSpec:
    kind: type | None  # None: a leaf
    context: object = None  # dict keys, or the named tuple's class
    children: tuple = ()

    def __repr__(self) -> str:
        if self.kind is None:
            return "*"
        children = ",\n  ".join(map(repr, self.children))  # torch's TreeSpec repr, which error messages show
        return f"TreeSpec({self.kind.__name__}, {self.context}, [{children}])"

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind is None else sum(c.num_leaves for c in self.children)


LEAF = TreeSpec(None)


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def tree_flatten(tree) -> tuple[list, TreeSpec]:
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves: list) -> TreeSpec:
    if isinstance(tree, dict):
        keys = tuple(tree)
        return TreeSpec(dict, keys, tuple(_flatten(tree[k], leaves) for k in keys))
    if _is_namedtuple(tree):
        return TreeSpec(tuple, type(tree), tuple(_flatten(v, leaves) for v in tree))
    if isinstance(tree, (tuple, list)):
        return TreeSpec(type(tree), None, tuple(_flatten(v, leaves) for v in tree))
    leaves.append(tree)
    return LEAF


def tree_unflatten(leaves, spec: TreeSpec):
    it = iter(leaves)
    return _unflatten(it, spec)


def _unflatten(it, spec: TreeSpec):
    if spec.kind is None:
        return next(it)
    children = [_unflatten(it, c) for c in spec.children]
    if spec.kind is dict:
        return dict(zip(spec.context, children))
    if spec.context is not None:  # a named tuple
        return spec.context(*children)
    return spec.kind(children)


def tree_map(fn, tree):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([fn(leaf) for leaf in leaves], spec)
