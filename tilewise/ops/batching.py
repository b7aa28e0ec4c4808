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
declared once per operator, next to its declaration (``declare(..., batch=rule)``), or derived from its
kind: pointwise operators broadcast the batch dim; reductions, views and random operators shift or extend
their dim and size arguments; composites run their decomposition on the batched tensors (each primitive
has a rule). An operator with neither loops over the batch (``loop``) after a one-time warning in
torch's words; ``tests/test_op_rules.py`` lists those that may.

While autograd records an op (grad mode ``GRAD_OFF_FOR_RECORDING``), its rule runs the physical
operators with grad mode on, so that a tensor from outside vmap that requires grad (a parameter) still
gets its gradient when the caller differentiates vmap's result: both levels record, as in torch.
"""

from __future__ import annotations

import functools
import math
import warnings

from tilewise import dispatch
from tilewise import strides as S
from tilewise.dispatch import GRAD_OFF_FOR_RECORDING, NOT_BATCHED, STATE
from tilewise.dtypes import int64
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
    if out is _Decompose:
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
    if op.name == "bernoulli":
        args[0] = batched_everywhere(args[0], batched[0], size)
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
    "creation": no_tensor_inputs,
    "random": random_rule,
    "pointwise": broadcast,
    "reduction": reduce_dims,
    "view": view_geometry,
    "composite": decompose,
    "scan": shift_dims,
}


dispatch.register_batcher(batch)


# ---------------------------------------------------------------- rules written out (declared with their ops)

def matrix_product(op, args, batched, size):
    """mm and bmm: an operand batched on one side only is folded into the rows of a single product when it is
    the left one (one GEMM for the whole batch, the common case of a per-example input times a weight);
    otherwise both get the batch and the product is a bmm over batch times the op's own batch."""
    a, b = args[0], args[1]
    from tilewise.ops.registry import OPS

    if batched[0] and not batched[1]:
        out = call(op, [a.reshape(-1, a._shape[-1]), b] if op.name == "mm" else
                   [a.reshape(-1, *a._shape[-2:]), b.unsqueeze(0).expand((size, *b._shape)).reshape(-1, *b._shape[1:])])
        return out.reshape((size, *a._shape[1:-1], out._shape[-1]))
    a, b = batched_everywhere(a, batched[0], size), batched_everywhere(b, batched[1], size)
    if op.name == "mm":
        return OPS["bmm"](a, b)
    out = OPS["bmm"](a.reshape(-1, *a._shape[-2:]), b.reshape(-1, *b._shape[-2:]))
    return out.reshape((size, a._shape[1], *out._shape[1:]))


INPLACE_ERROR = ("vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a Tensor `other` "
                 "in extra_args that has more elements than `self`. This happened due to `other` being vmapped over "
                 "but `self` not being vmapped over in a vmap. Please try to use out-of-place operators instead of "
                 "inplace arithmetic. If said operator is being called inside the PyTorch framework, please file a "
                 "bug report instead.")


def write_into(op, args, batched, size):
    """_write_, the one write every in-place op ends in: a batched target takes each example's value; an
    unbatched one cannot hold several (torch's error)."""
    if not batched[0]:
        raise RuntimeError(INPLACE_ERROR)
    self, src = args
    return call(op, [self, src if batched[1] else src.unsqueeze(0).expand(self._shape)])


def _batch_index(size: int, rank: int, like: Tensor) -> Tensor:
    from tilewise.ops.registry import call as registry_call

    index = registry_call("arange", 0, size, dtype=int64, device=like.device)
    return index.reshape((size,) + (1,) * rank)


def _index_layout(indices) -> tuple[int, bool]:
    """(position of the first index tensor, whether the index tensors are adjacent): torch places the indexed
    dims where the first index is when they are adjacent, else in front."""
    where = [k for k, i in enumerate(indices) if i is not None]
    return where[0], where == list(range(where[0], where[-1] + 1))


def _expanded_masks(indices: list, batched: list) -> tuple[list, list]:
    """Boolean masks as the index tensors of their true elements (an unbatched mask has fixed positions)."""
    out, flags = [], []
    for i, b in zip(indices, batched):
        if i is not None and i._dtype.name in ("bool", "uint8"):
            if b:
                raise RuntimeError("vmap: We do not support batching operators that can output dynamic shape. "
                                   "Attempted to vmap over aten::index with a batched boolean mask. Please file an "
                                   "issue at https://github.com/pytorch/pytorch/issues if you need this feature.")
            parts = i.nonzero().unbind(1)
            out.extend(parts)
            flags.extend([False] * len(parts))
        else:
            out.append(i)
            flags.append(b)
    return out, flags


def _physical_indices(indices, flags, size, like):
    """The logical index tensors with the batch index in front; every index broadcasts to (batch, *shape)."""
    rank = max((i.ndim - (1 if b else 0) for i, b in zip(indices, flags) if i is not None), default=0)
    phys = [_batch_index(size, rank, like)]
    for i, b in zip(indices, flags):
        phys.append(pad_to_rank(i, rank) if (i is not None and b) else i)
    return phys, rank


def _index_permutation(first: int, adjacent: bool, rank: int, total: int) -> list | None:
    """Physical indexing puts (batch, *index dims) in front; the logical result puts the index dims at
    ``first`` when they are adjacent: the permutation from one to the other, or None when it is the identity."""
    if not adjacent or first == 0:
        return None
    rest = list(range(1 + rank, total))
    return [0, *rest[:first], *range(1, 1 + rank), *rest[first:]]


def index_rule(op, args, batched, size):
    """Advanced indexing ``x[i, j]`` per example: the batch becomes one more index (``arange(batch)``) in front,
    so one gather serves the whole batch; the index dims are then moved where torch puts them."""
    x = batched_everywhere(args[0], batched[0], size)
    indices, flags = _expanded_masks(list(args[1]), list(batched[1]))
    first, adjacent = _index_layout(indices)
    phys, rank = _physical_indices(indices, flags, size, x)
    out = call(op, [x, phys])
    order = _index_permutation(first, adjacent, rank, out.ndim)
    return out if order is None else out.permute(order)


def index_put_rule(op, args, batched, size):
    """``x[i, j] = v`` per example, the same way: the values are laid out as the physical indexing reads."""
    x, values = batched_everywhere(args[0], batched[0], size), args[2]
    if not batched[0] and any(batched[1]) or not batched[0] and batched[2]:
        x = x.clone()  # the expanded target must become a tensor of its own before the batch writes into it
    indices, flags = _expanded_masks(list(args[1]), list(batched[1]))
    first, adjacent = _index_layout(indices)
    phys, rank = _physical_indices(indices, flags, size, x)
    indexed = _indexed_shape(x._shape[1:], indices, flags, first, adjacent)
    if type(values) is not Tensor:
        return call(op, [x, phys, values, *args[3:]])
    v = pad_to_rank(values, len(indexed)) if batched[2] else values
    v = v.expand((size, *indexed)) if batched[2] else v.expand(indexed).unsqueeze(0).expand((size, *indexed))
    order = _index_permutation(first, adjacent, rank, 1 + len(indexed))
    if order is not None:
        inverse = [order.index(k) for k in range(len(order))]
        v = v.permute(inverse)
    return call(op, [x, phys, v, *args[3:]])


def _indexed_shape(shape, indices, flags, first: int, adjacent: bool) -> tuple:
    index_shape = S.broadcast_shapes(*[i._shape[1:] if b else i._shape for i, b in zip(indices, flags)
                                       if i is not None])
    rest = [shape[k] for k in range(len(shape)) if k >= len(indices) or indices[k] is None]
    if adjacent:
        return (*rest[:first], *index_shape, *rest[first:])
    return (*index_shape, *rest)


def view_scatter_add_rule(op, args, batched, size):
    """The backward of a strided view: the view's geometry on a contiguous input of one example, repeated at
    one example's numel apart."""
    grad, input_shape, view_shape, view_strides, offset = args
    n = math.prod(input_shape)
    return call(op, [grad, (size, *input_shape), (size, *view_shape), (n, *view_strides), offset])


def view_scatter_rule(op, args, batched, size):
    self, src, view_shape, view_strides, offset = args
    self = batched_everywhere(self, batched[0], size).contiguous()
    src = batched_everywhere(src, batched[1], size)
    n = math.prod(self._shape[1:])
    return call(op, [self, src, (size, *view_shape), (n, *view_strides), offset])


def searchsorted_rule(op, args, batched, size):
    """searchsorted: a 1-dim sorted sequence per example searches all of that example's values, so the values
    are flattened per example; a sequence with leading dims pairs them with the values' as it would."""
    seq, values = batched_everywhere(args[0], batched[0], size), batched_everywhere(args[1], batched[1], size)
    rest = list(args[2:])
    sorter_k = op.param_names().index("sorter")
    if type(rest[sorter_k - 2]) is Tensor:
        rest[sorter_k - 2] = batched_everywhere(rest[sorter_k - 2], batched[sorter_k], size)
    if seq.ndim == 2 and values.ndim != 2:
        out = call(op, [seq, values.reshape(size, -1), *rest])
        return out.reshape(values._shape)
    return call(op, [seq, values, *rest])


def leading_batch_first_only(op, args, batched, size):
    """Operators that treat the leading dims of their first tensor as a batch while their other tensors (a
    weight, a bias) apply to every element: direct when only the first is batched, else the decomposition."""
    if any(batched[k] for k in op.tensor_idx[1:]) or any(any(batched[k]) for k in op.list_idx):
        return _Decompose
    return call(op, args)


class _Decompose:
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


def attention_rule(op, args, batched, size):
    """scaled_dot_product_attention over (..., L, E): query, key and value all get the batch in front and
    size-1 dims up to one rank, then their leading dims are expanded alike; a batched mask is given the same
    size-1 dims, an unbatched one broadcasts against the scores from the right as it would per example."""
    rank = max(logical_rank(args[k], batched[k]) for k in range(3))
    args = list(args)
    qkv = [pad_to_rank(batched_everywhere(args[k], batched[k], size), rank) for k in range(3)]
    lead = S.broadcast_shapes(*(t._shape[:-2] for t in qkv))
    args[:3] = [t.expand((*lead, *t._shape[-2:])) for t in qkv]
    m = op.param_names().index("attn_mask")
    if type(args[m]) is Tensor and batched[m]:
        args[m] = pad_to_rank(args[m], rank)
    return call(op, args)


def stack_rule(op, args, batched, size):
    """stack: every tensor gets the batch; the new dim is counted among one example's dims plus one."""
    tensors = args[0]
    rank = logical_rank(tensors[0], batched[0][0])
    tensors = [batched_everywhere(t, b, size) for t, b in zip(tensors, batched[0])]
    return call(op, [tensors, S.normalize_dim(args[1], rank + 1, op.name) + 1])


def index_select_rule(op, args, batched, size):
    """index_select with one index for every example: the batched input is selected from along the shifted dim;
    a batched index runs the decomposition (advanced indexing, which batches)."""
    if batched[2]:
        return _Decompose
    x = args[0]
    return call(op, [x, shifted_dim(args[1], max(x.ndim - 1, 1), op.name), args[2]])


BATCH_NORM_ERROR = ("Batch norm got a batched tensor as input while the running_mean or running_var, which will be "
                    "updated in place, were not batched.\nIf you are using a module and do not need eval mode, please "
                    "set `track_running_stats` to be False.If you are using a prebuilt module and do not need eval "
                    "mode, please see the functorch website for resources on how to patch your module to work with "
                    "vmap")


def batch_norm_rule(op, args, batched, size):
    """Batch norm normalises each example over its own batch (the decomposition, on the batched tensors); in
    training it would also write every example's statistics into one unbatched running mean: torch refuses."""
    names = op.param_names()
    stats = (names.index("running_mean"), names.index("running_var"))
    if args[names.index("training")] and batched[0] and any(type(args[k]) is Tensor and not batched[k]
                                                             for k in stats):
        raise RuntimeError(BATCH_NORM_ERROR)
    return _Decompose


def convolution_rule(op, args, batched, size):
    """Convolutions with one weight for every example: the batch joins the images' own batch dim (one call over
    batch x N images); an example without a batch dim of its own (C, *spatial) is one image of the batch."""
    if any(batched[k] for k in op.tensor_idx[1:]):
        return _Decompose
    x = args[0]
    spatial = int(op.name.rstrip("d")[-1])
    if x.ndim - 1 == spatial + 1:
        return call(op, args)
    out = call(op, [x.reshape(-1, *x._shape[2:]), *args[1:]])
    return out.reshape((size, x._shape[1], *out._shape[1:]))
