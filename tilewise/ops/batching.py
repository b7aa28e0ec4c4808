"""Batching rules: how each operator runs on tensors batched by ``tilewise.func.vmap``.

[Note: batched tensors] Inside ``vmap`` a batched tensor is an ordinary ``Tensor`` object with the
*logical* (per-example) shape, strides, dtype and device and no storage of its own; ``t._vmap`` holds
``(level, physical)``, where ``physical`` has the batch as its dim 0 (vmap moves ``in_dim`` there once,
a view). Keeping the batch at dim 0 makes every rule shorter: a rule never tracks where the batch went.
Because a batched tensor *is* a Tensor, everything above the dispatcher's Vmap key treats it as one
example: Python code reads its logical shape, and autograd records per-example nodes on it, so that
``autograd.grad`` called inside vmap returns per-example gradients (the Vmap key sits below Autograd).
The Vmap key (``batch``) unwraps the arguments batched at the innermost level present, runs the
operator's rule on the physical tensors with that level removed from ``STATE.vmap``, and wraps the
outputs again. Nested vmap is the same step repeated: a physical tensor may itself be batched at an
outer level, and its operators go through the key again.

A rule is ``rule(op, args, batched, size)``: ``args`` the bound arguments with batched tensors replaced
by their physical tensors, ``batched[k]`` whether argument k was batched (a tuple of flags for a tensor
list), ``size`` the batch size; it returns the physical outputs, each with the batch at dim 0. Rules are
declared once per operator, next to its declaration (``declare(..., batch=rule)``; the written-out ones
are in ``ops/batching_rules.py``), or derived from its kind (``KIND_RULES``): pointwise operators
broadcast the batch dim; reductions, scans and views shift their dim arguments (a view replays its own
stride arithmetic on one example's geometry, so every view, ``as_strided`` included, has one rule);
random operators follow vmap's ``randomness``; creation operators take no tensor. Composites run their
decomposition on the batched tensors, each primitive batching in turn; a composite's rule may instead
check its arguments first (``Decompose``: batch norm refuses unbatched running statistics as torch does)
or batch them (``DecomposeBatched``: ``select_scatter`` writes an example into a copy of ``self``, which
must be batched for that). A decomposition that reads values in Python (``.item()``, a data-dependent
size) loops over the examples instead, as does an operator without a rule (``loop``), with torch's
one-time performance warning; ``tests/test_op_rules.py`` lists the operators that loop. Operators whose
output shape depends on the values (``nonzero``) are refused in torch's words.

While autograd records an op (grad mode ``GRAD_OFF_FOR_RECORDING``), its rule runs the physical
operators with grad mode on, so that a tensor from outside vmap that requires grad (a parameter) still
gets its gradient when the caller differentiates vmap's result: both levels record, as in torch. A
composite without a derivative of its own is decomposed by autograd before the Vmap key sees it, so its
rule (a check, or a single physical call where only the input is batched) applies only when nothing
records; its decomposition batches either way.
"""

from __future__ import annotations

import functools
import warnings

from tilewise import dispatch
from tilewise import strides as S
from tilewise.dispatch import GRAD_OFF_FOR_RECORDING, NOT_BATCHED, STATE
from tilewise.tensor import VMAP_HOOKS, Tensor


class Level:
    """One active vmap: its depth (1 outermost), batch size and randomness mode."""

    __slots__ = ("depth", "size", "randomness")

    def __init__(self, depth: int, size: int, randomness: str):
        self.depth, self.size, self.randomness = depth, size, randomness

    def __repr__(self) -> str:
        return f"Level(depth={self.depth}, size={self.size}, randomness={self.randomness!r})"


# ---------------------------------------------------------------- wrapping

def wrap(physical: Tensor, level: Level) -> Tensor:
    """The batched tensor whose examples are ``physical``'s slices along dim 0."""
    t = Tensor._make(None, physical._shape[1:], physical._strides[1:], physical._offset, physical._dtype,
                     physical._device)
    t._vmap = (level, physical)
    return t


def physical_of(t: Tensor, level: Level) -> Tensor | None:
    """``t``'s physical tensor when it is batched at ``level``, else None."""
    batched = t._vmap
    return batched[1] if batched is not None and batched[0] is level else None


def _detach(t: Tensor) -> Tensor:
    level, physical = t._vmap
    return wrap(physical.detach(), level)


VMAP_HOOKS.detach = _detach


# ---------------------------------------------------------------- the Vmap key

def batch(op, args: tuple):
    """The dispatcher's Vmap key (see [Note: batched tensors])."""
    level = _innermost_level(op, args)
    if level is None:
        if op.kind != "random":
            return NOT_BATCHED
        level = STATE.vmap[-1]  # a random op batches over the vmap it runs in, batched arguments or not
    rule = rule_of(op)
    if rule is decompose:
        return _decompose_or_loop(op, args, level)
    if rule is random_rule:
        rule = functools.partial(random_rule, level=level)
    physical, batched = _unwrap(op, args, level)
    stack, grad = STATE.vmap, STATE.grad_enabled
    STATE.vmap = stack[:level.depth - 1]
    if grad is GRAD_OFF_FOR_RECORDING:
        STATE.grad_enabled = True
    try:
        out = (rule or loop)(op, physical, batched, level.size)
    finally:
        STATE.vmap, STATE.grad_enabled = stack, grad
    if isinstance(out, _Unbatched):
        return out.value
    if out is Decompose:
        return _decompose_or_loop(op, args, level)
    if isinstance(out, DecomposeBatched):
        return op.decomposition(*_wrap_arguments(op, out.args, level))
    if op.schema.params and op.schema.params[0].mutated and not op.schema.returns[0].name:
        return args[0]  # an in-place primitive returns the tensor it wrote, the batched one
    return _wrap_outputs(out, level)


def _decompose_or_loop(op, args: tuple, level: Level):
    """A composite runs its decomposition on the batched tensors; one whose decomposition reads values in Python
    (a data-dependent size or check) loops over the examples instead, as torch falls back for an operator
    without a rule."""
    try:
        return op.decomposition(*args)  # on the batched tensors themselves: each primitive batches
    except RuntimeError as exc:
        if not str(exc).startswith(DATA_DEPENDENT_ERRORS):
            raise
    physical, batched = _unwrap(op, args, level)
    stack = STATE.vmap
    STATE.vmap = stack[:level.depth - 1]
    try:
        out = loop(op, physical, batched, level.size)
    finally:
        STATE.vmap = stack
    return _wrap_outputs(out, level)


# a decomposition that reads values in Python; one that writes a batched value into an unbatched argument (a
# running statistic) is refused as torch refuses it, not looped, which would write into it once per example
DATA_DEPENDENT_ERRORS = ("vmap: It looks like", "vmap: We do not support batching operators that can output dynamic")


class _Unbatched:
    """A rule's result that does not depend on the example (randomness='same'): returned as it is."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value



def _innermost_level(op, args: tuple) -> Level | None:
    found = None
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a._vmap is not None and (found is None or a._vmap[0].depth > found.depth):
            found = a._vmap[0]
    for k in op.list_idx:
        for a in args[k]:
            if type(a) is Tensor and a._vmap is not None and (found is None or a._vmap[0].depth > found.depth):
                found = a._vmap[0]
    return found


def _unwrap(op, args: tuple, level: Level) -> tuple[list, list]:
    physical, batched = list(args), [False] * len(args)
    for k in op.tensor_idx:
        a = args[k]
        p = physical_of(a, level) if type(a) is Tensor else None
        if p is not None:
            physical[k], batched[k] = p, True
    for k in op.list_idx:
        items = [physical_of(a, level) if type(a) is Tensor else None for a in args[k]]
        physical[k] = [a if p is None else p for a, p in zip(args[k], items)]
        batched[k] = tuple(p is not None for p in items)
    return physical, batched


def _wrap_outputs(out, level: Level):
    if type(out) is Tensor:
        return _wrap_output(out, level)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap_output(o, level) if type(o) is Tensor else o for o in out)
    return out


def _wrap_output(out: Tensor, level: Level) -> Tensor:
    """An output that a rule's physical call gave without the batch (one that does not depend on the values,
    like lstsq's empty residuals) is the same for every example: expanded to the batch (a view)."""
    if not out._shape or out._shape[0] != level.size:
        out = out.unsqueeze(0).expand((level.size, *out._shape))
    return wrap(out, level)


def rule_of(op):
    """The operator's batching rule: its own (``batch=`` in its declaration), else the one its kind implies,
    else None (the loop over the batch)."""
    rule = op.attrs.get("batch")
    if rule is not None:
        return rule
    return KIND_RULES.get(op.kind)


def has_batching_rule(op) -> bool:
    """Whether ``op`` batches without looping over the examples (``tests/test_op_rules.py`` asks)."""
    rule = rule_of(op)
    return rule is not None and rule is not loop and (rule is not decompose or op.decomposition is not None)


# ---------------------------------------------------------------- helpers for rules

def logical_rank(t: Tensor, batched: bool) -> int:
    return t.ndim - 1 if batched else t.ndim


def batched_everywhere(t: Tensor, batched: bool, size: int) -> Tensor:
    """``t`` with the batch at dim 0: itself when batched, else expanded (a view) to ``size`` copies."""
    return t if batched else t.unsqueeze(0).expand((size, *t._shape))


def pad_to_rank(t: Tensor, rank: int) -> Tensor:
    """A physical tensor with size-1 dims inserted after the batch dim, to ``rank`` logical dims, so that it
    broadcasts against unbatched tensors of that rank as its examples would."""
    for _ in range(rank - (t.ndim - 1)):
        t = t.unsqueeze(1)
    return t


def shifted_dim(dim: int, rank: int, name: str) -> int:
    """A logical dim as a physical one: checked against the logical rank (torch's message), one further on."""
    return S.normalize_dim(dim, rank, name) + 1


def shifted_dims(dims, rank: int, name: str):
    if isinstance(dims, int):
        return shifted_dim(dims, rank, name)
    return type(dims)(shifted_dim(d, rank, name) for d in dims)


def call(op, args) -> object:
    return dispatch.call(op, tuple(args))


def call_named(name: str, *args, **kwargs):
    from tilewise.ops.registry import call as registry_call

    return registry_call(name, *args, **kwargs)


# ---------------------------------------------------------------- rules by kind

def broadcast(op, args, batched, size):
    """Pointwise: each batched operand gets size-1 dims after its batch dim up to the widest operand's rank,
    so broadcasting lines up the examples. A 0-dim example joins type promotion as a 0-dim tensor would
    (torch's rule for dimensionless operands): cast to the dtype the logical call computes in."""
    tensors = [k for k in op.tensor_idx if type(args[k]) is Tensor]
    ranks = {k: logical_rank(args[k], batched[k]) for k in tensors}
    rank = max(ranks.values())
    args = list(args)
    names = op.param_names()
    scalars = [k for k in tensors if batched[k] and ranks[k] == 0 and names[k] != "condition"]
    if scalars and len({args[k]._dtype for k in tensors}) > 1:
        target = _logical_dtype(op, args, batched)
        for k in scalars:
            args[k] = args[k].to(target)
    for k in tensors:
        if batched[k]:
            args[k] = pad_to_rank(args[k], rank)
    return call(op, args)


def _logical_dtype(op, args, batched):
    """The dtype a pointwise op computes in for its logical operands (a batched operand of dim 0 promotes as a
    0-dim tensor), from its dtype rule on stand-ins of the logical shapes."""
    stand_ins = list(args)
    for k in op.tensor_idx:
        if batched[k]:
            stand_ins[k] = args[k][0]
    out, compute = op.dtype_rule(op, stand_ins)
    return compute if out.name == "bool" else out


def reduce_dims(op, args, batched, size):
    """Reductions: the logical ``dim`` (None: all of them) moved one further; a 0-dim example is reduced
    along a size-1 dim added for it."""
    x = args[0]
    rank = x.ndim - 1
    names = op.param_names()
    args = list(args)
    k = names.index("dim")
    dim = args[k]
    keepdim = args[names.index("keepdim")] if "keepdim" in names else False
    if rank == 0:
        if dim is not None:
            S.normalize_dims(dim, 0, op.name)
        args[0] = x.unsqueeze(1)
        args[k] = 1 if dim is None or isinstance(dim, int) else (1,)
        if "keepdim" in names:
            args[names.index("keepdim")] = False
        return call(op, args)
    if dim is None:
        if op.schema.params[k].is_list:
            args[k] = tuple(range(1, rank + 1))
            return call(op, args)
        args[0] = x.reshape(x._shape[0], -1)  # argmax/argmin over all dims: of the flattened example
        args[k] = 1
        if "keepdim" in names:
            args[names.index("keepdim")] = False
        out = call(op, args)
        return out.reshape((out._shape[0],) + (1,) * rank) if keepdim else out
    args[k] = shifted_dims(dim, rank, op.name)
    return call(op, args)


def view_geometry(op, args, batched, size):
    """Views: the op's own stride arithmetic on one example's geometry; the batch dim keeps its stride. The
    physical view is an ``as_strided`` of the physical tensor, so errors name the logical shapes."""
    x = args[0]
    if op.attrs.get("view_dtype") is not None:
        return call(op, args)  # view_as_real/complex change the trailing dims only
    shape, strides, offset = op.view(x._shape[1:], x._strides[1:], x._offset, *args[1:])
    from tilewise.ops.registry import OPS

    return OPS["as_strided"](x, (x._shape[0], *shape), (x._strides[0], *strides), offset)


def decompose(op, args, batched, size):
    """Composites: the decomposition runs on the batched tensors (``batch`` calls it before unwrapping)."""
    raise AssertionError("decompose is handled by batch()")


def apply_directly(op, args, batched, size):
    """Operators on one tensor that treat leading dims as a batch already (casts, copies, layer_norm): the
    physical call is the batched result."""
    return call(op, args)


def apply_batched(op, args, batched, size):
    """Operators over several tensors with shared leading batch dims (linalg solvers, attention): every
    tensor argument is given the batch dim, then one physical call."""
    return call(op, apply_batched_args(op, args, batched, size))


DIM_PARAMS = ("dim", "dims", "dim0", "dim1", "dim2", "dimension")


def shift_dims(op, args, batched, size):
    """Operators whose dim arguments name dims of their first tensor (softmax, cumsum, sort, gather, cat, flip):
    every tensor argument gets the batch dim, and every dim argument moves one further."""
    first = op.tensor_idx[0] if op.tensor_idx else None
    if first is not None:
        rank = logical_rank(args[first], batched[first])
    else:
        k = op.list_idx[0]
        rank = logical_rank(args[k][0], batched[k][0])
    args = apply_batched_args(op, args, batched, size)
    for k, name in enumerate(op.param_names()):
        if name in DIM_PARAMS and args[k] is not None:
            args[k] = shifted_dims(args[k], max(rank, 1), op.name)
    if rank == 0 and first is not None and len(op.tensor_idx) == 1:
        return _on_scalar_examples(op, args, first)
    return call(op, args)


def _on_scalar_examples(op, args: list, k: int):
    """A 0-dim example has no dim 1 to work along: its physical tensor gets one of size 1 for the call."""
    args[k] = args[k].unsqueeze(1)
    out = call(op, args)
    if type(out) is Tensor:
        return out.squeeze(1)
    return type(out)(o.squeeze(1) if type(o) is Tensor else o for o in out)


def apply_batched_args(op, args, batched, size) -> list:
    args = list(args)
    for k in op.tensor_idx:
        if type(args[k]) is Tensor:
            args[k] = batched_everywhere(args[k], batched[k], size)
    for k in op.list_idx:
        args[k] = [batched_everywhere(a, b, size) if type(a) is Tensor else a for a, b in zip(args[k], batched[k])]
    return args


_WARNED: set[str] = set()


def loop(op, args, batched, size):
    """No rule: one call per example, stacked. torch warns once per operator; so does this."""
    if op.full_name not in _WARNED:
        _WARNED.add(op.full_name)
        warnings.warn(f"There is a performance drop because we have not yet implemented the batching rule for "
                      f"{op.full_name}. Please file us an issue on GitHub so that we can prioritize its "
                      "implementation.", UserWarning, stacklevel=4)
    if size == 0:
        raise RuntimeError(f"vmap: {op.full_name} has no batching rule, and a batch of size 0 has no example to "
                           "run it on one by one")
    results = [call(op, _example(op, args, batched, b)) for b in range(size)]
    first = results[0]
    if type(first) is Tensor:
        return call_named("stack", results)
    return tuple(call_named("stack", [r[i] for r in results]) if type(o) is Tensor else o
                 for i, o in enumerate(first))


def _example(op, args, batched, b: int) -> list:
    args = list(args)
    for k in op.tensor_idx:
        if batched[k]:
            args[k] = args[k].select(0, b)
    for k in op.list_idx:
        args[k] = [a.select(0, b) if flag else a for a, flag in zip(args[k], batched[k])]
    return args


def dynamic_shape(op, args, batched, size):
    """Operators whose output shape depends on the values: torch refuses them under vmap."""
    raise RuntimeError(f"vmap: We do not support batching operators that can output dynamic shape. Attempted to "
                       f"vmap over aten::{op.name}. Please file an issue at https://github.com/pytorch/pytorch/issues "
                       "if you need this feature.")


# ---------------------------------------------------------------- random operators

RANDOM_ERROR = ("vmap: called random operation while in randomness error mode. Please either use the 'same' or "
                "'different' randomness flags on vmap or perform the randomness operation out of vmap")


def random_rule(op, args, batched, size, *, level: Level):
    """randomness='error' refuses; 'same' draws one tensor for every example (and refuses a batched input, as
    torch does); 'different' draws one per example: sized ops draw the batch at once, ops on a tensor draw on
    its batched form."""
    mode = level.randomness
    if mode == "error":
        raise RuntimeError(RANDOM_ERROR)
    any_batched = any(b is True for b in batched)
    if mode == "same":
        if any_batched:
            raise RuntimeError("vmap: Vmap does not currently support same randomness with a batched tensor input. "
                               "Please file an issue with functorch")
        return _Unbatched(call(op, args))
    names = op.param_names()
    args = list(args)
    if "size" in names:
        k = names.index("size")
        args[k] = (size, *args[k])
        return call(op, args)
    if op.name in ("bernoulli", "poisson", "binomial"):  # one independent draw per element
        rank = max(args[k]._shape.__len__() - (1 if batched[k] is True else 0) for k in op.tensor_idx)
        for k in op.tensor_idx:
            args[k] = pad_to_rank(batched_everywhere(args[k], batched[k] is True, size), rank)
        return call(op, args)
    if op.name == "multinomial":
        p = batched_everywhere(args[0], batched[0], size)
        args[0] = p.reshape(-1, p._shape[-1])
        out = call(op, args)
        return out.reshape((*p._shape[:-1], out._shape[-1]))
    return loop(op, args, batched, size)


def no_tensor_inputs(op, args, batched, size):
    """Creation operators take sizes, not tensors: nothing of theirs is ever batched."""
    raise AssertionError(f"{op.name} has no tensor argument to batch")


KIND_RULES = {
    "custom": loop,  # an operator registered at run time loops unless it was given batch=
    "creation": no_tensor_inputs,
    "random": random_rule,
    "pointwise": broadcast,
    "reduction": reduce_dims,
    "view": view_geometry,
    "composite": decompose,
    "scan": shift_dims,
}


dispatch.register_batcher(batch)


# ---------------------------------------------------------------- composites: checks before the decomposition

class Decompose:
    """A rule's answer that the operator is better run as its decomposition for these arguments."""


class DecomposeBatched:
    """A rule's answer: run the decomposition on these physical arguments, every tensor batched."""

    def __init__(self, args: list):
        self.args = args


def _wrap_arguments(op, args: list, level: Level) -> list:
    args = list(args)
    for k in op.tensor_idx:
        if type(args[k]) is Tensor:
            args[k] = wrap(args[k], level)
    for k in op.list_idx:
        args[k] = [wrap(a, level) if type(a) is Tensor else a for a in args[k]]
    return args


def batched_then_decompose(op, args, batched, size):
    """Composites that write an example into a fresh copy of one argument (``clone`` then ``copy_``): with every
    tensor argument batched the copy is batched too, and the decomposition batches."""
    return DecomposeBatched(apply_batched_args(op, args, batched, size))
