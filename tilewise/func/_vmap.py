"""vmap: a function over one example, mapped over a batch, with torch.func.vmap's arguments and errors.

[Note: vmap] ``vmap(f, in_dims, out_dims)(*args)`` moves each mapped input's ``in_dim`` to the front (a view)
and wraps it as a batched tensor of a new level (see [Note: batched tensors] in ``ops/batching.py``); ``f``
then runs once, on tensors of the per-example shape, and every operator it calls runs its batching rule
on the whole batch. The outputs are unwrapped with the batch moved to ``out_dims``; an output that does
not depend on a mapped input is expanded to the batch (a view). ``in_dims`` and ``out_dims`` are pytree
prefixes of the arguments and outputs (tuples, lists, dicts; an int stands for a whole subtree), checked
with torch's messages. ``chunk_size`` runs ``f`` on slices of the batch in turn and concatenates; the
results are those of one call, for less memory at a time. ``randomness`` decides what a random operator
does inside: 'error' refuses, 'same' draws one value for every example, 'different' one per example.
"""

from __future__ import annotations

import functools

from tilewise.dispatch import STATE
from tilewise.func._pytree import TreeSpec, tree_flatten, tree_unflatten
from tilewise.ops.batching import Level, physical_of, wrap
from tilewise.ops.creation import get_rng_state, set_rng_state
from tilewise.tensor import Tensor

RANDOMNESS = ("error", "different", "same")


def vmap(func, in_dims=0, out_dims=0, randomness: str = "error", *, chunk_size: int | None = None):
    """torch.func.vmap: ``func`` mapped over dim ``in_dims`` of its inputs.

    >>> import tilewise as tw
    >>> from tilewise.func import vmap
    >>> x, y = tw.ones(5, 3), tw.ones(5, 3)
    >>> vmap(tw.dot)(x, y).shape
    tilewise.Size([5])
    """
    if randomness not in RANDOMNESS:
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return _vmap_call(func, in_dims, out_dims, randomness, chunk_size, args, kwargs)

    return wrapped


# ---------------------------------------------------------------- pytrees

def broadcast_prefix(prefix, tree, spec: TreeSpec | None = None) -> list | None:
    """One entry of ``prefix`` per leaf of ``tree`` (an int or None in ``prefix`` stands for its whole subtree),
    or None when ``prefix`` is not a prefix of ``tree``'s structure."""
    if spec is None:
        spec = tree_flatten(tree)[1]
    if prefix is None or isinstance(prefix, int) or spec.kind is None:
        if isinstance(prefix, (tuple, list, dict)) and spec.kind is None:
            return None
        return [prefix] * spec.num_leaves
    same_kind = type(prefix) is spec.kind or type(prefix) is spec.context  # a named tuple's class is its context
    if not same_kind and not (issubclass(spec.kind, (tuple, list)) and type(prefix) in (tuple, list)):
        return None
    if spec.kind is dict:
        if sorted(prefix) != sorted(spec.context):
            return None
        parts = [broadcast_prefix(prefix[k], None, c) for k, c in zip(spec.context, spec.children)]
    else:
        if len(prefix) != len(spec.children):
            return None
        parts = [broadcast_prefix(p, None, c) for p, c in zip(prefix, spec.children)]
    if any(p is None for p in parts):
        return None
    return [d for p in parts for d in p]


# ---------------------------------------------------------------- one call

def _name(func) -> str:
    return getattr(func, "__name__", repr(func))


def _vmap_call(func, in_dims, out_dims, randomness, chunk_size, args, kwargs):
    where = f"vmap({_name(func)}, in_dims={in_dims}, ...)(<inputs>)"
    leaves, dims, spec = _flat_inputs(where, func, in_dims, args)
    size = _batch_size(leaves, dims)
    if chunk_size is None or chunk_size >= size:
        return _run(func, leaves, dims, spec, kwargs, out_dims, randomness, size)
    state = get_rng_state() if randomness == "same" else None  # every chunk draws what the first draws
    chunks = []
    for start in range(0, size, chunk_size):
        n = min(chunk_size, size - start)
        part = [x.narrow(d, start, n) if d is not None else x for x, d in zip(leaves, dims)]
        if state is not None:
            set_rng_state(state)
        chunks.append(_run(func, part, dims, spec, kwargs, out_dims, randomness, n))
    return _concat_chunks(func, chunks, out_dims)


def _flat_inputs(where: str, func, in_dims, args: tuple):
    if not isinstance(in_dims, int) and not isinstance(in_dims, tuple):
        raise ValueError(f"{where}: expected `in_dims` to be int or a (potentially nested) tuple matching the "
                         f"structure of inputs, got: {type(in_dims)}.")
    if not args:
        raise ValueError(f"vmap({_name(func)})(<inputs>): got no inputs. Maybe you forgot to add inputs, or you are "
                         "trying to vmap over a function with no inputs. The latter is unsupported.")
    leaves, spec = tree_flatten(tuple(args))
    dims = broadcast_prefix(in_dims, None, spec)
    if dims is None:
        in_spec = tree_flatten(in_dims)[1]
        raise ValueError(f"{where}: in_dims is not compatible with the structure of `inputs`. in_dims has structure "
                         f"{in_spec} but inputs has structure {spec}.")
    for x, d in zip(leaves, dims):
        if d is None:
            continue
        if not isinstance(d, int) or isinstance(d, bool):
            raise ValueError(f"{where}: Got in_dim={d} for an input but in_dim must be either an integer dimension "
                             "or None.")
        if not isinstance(x, Tensor):
            raise ValueError(f"{where}: Got in_dim={d} for an input but the input is of type {type(x)}. We cannot "
                             "vmap over non-Tensor arguments, please use None as the respective in_dim")
        if not -x.ndim <= d < x.ndim:
            raise ValueError(f"{where}: Got in_dim={d} for some input, but that input is a Tensor of dimensionality "
                             f"{x.ndim} so expected in_dim to satisfy -{x.ndim} <= in_dim < {x.ndim}.")
    return leaves, [None if d is None else d % x.ndim for x, d in zip(leaves, dims)], spec


def _batch_size(leaves: list, dims: list) -> int:
    sizes = [x.shape[d] for x, d in zip(leaves, dims) if d is not None]
    if not sizes:
        raise ValueError("vmap: Expected at least one Tensor to vmap over")
    if any(s != sizes[0] for s in sizes):
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sizes} for the mapped dimension")
    return sizes[0]


def _run(func, leaves, dims, spec, kwargs, out_dims, randomness, size):
    stack = STATE.vmap
    level = Level(len(stack) + 1, size, randomness)
    batched = [x if d is None else wrap(x.movedim(d, 0), level) for x, d in zip(leaves, dims)]
    STATE.vmap = (*stack, level)
    try:
        out = func(*tree_unflatten(batched, spec), **kwargs)
    finally:
        STATE.vmap = stack
    return _unwrap_outputs(func, out, out_dims, level)


def _unwrap_outputs(func, out, out_dims, level: Level):
    if not (out_dims is None or isinstance(out_dims, (int, tuple, list, dict))) or isinstance(out_dims, bool):
        raise ValueError(f"vmap({_name(func)}, ..., out_dims={out_dims}): `out_dims` must be an int, None or a python "
                         "collection of ints representing where in the outputs the vmapped dimension should appear.")
    leaves, spec = tree_flatten(out)
    dims = broadcast_prefix(out_dims, None, spec)
    if dims is None:
        raise ValueError(f"vmap({_name(func)}, ..., out_dims={out_dims})(<inputs>): out_dims is not compatible with "
                         f"the structure of `outputs`. out_dims has structure {tree_flatten(out_dims)[1]} but outputs "
                         f"has structure {spec}.")
    return tree_unflatten([_unwrap_one(func, x, d, level) for x, d in zip(leaves, dims)], spec)


def _unwrap_one(func, x, out_dim, level: Level):
    if out_dim is None:
        if isinstance(x, Tensor) and physical_of(x, level) is not None:
            raise ValueError(f"vmap({_name(func)}, ...): `{_name(func)}` can not return a BatchedTensor when out_dim "
                             "is None")
        return x
    if not isinstance(x, Tensor):
        raise ValueError(f"vmap({_name(func)}, ...): `{_name(func)}` must only return Tensors, got type {type(x)}. "
                         "Did you mean to set out_dims= to None for output?")
    physical = physical_of(x, level)
    if physical is None:
        physical = x.unsqueeze(0).expand((level.size, *x.shape))
    return physical.movedim(0, out_dim)


def _concat_chunks(func, chunks: list, out_dims):
    from tilewise.ops.registry import call

    flat = [tree_flatten(c)[0] for c in chunks]
    spec = tree_flatten(chunks[0])[1]
    dims = broadcast_prefix(out_dims, None, spec)
    joined = [parts[0] if d is None else call("cat", list(parts), d) for d, parts in zip(dims, zip(*flat))]
    return tree_unflatten(joined, spec)
