"""Result types of operator calls, without running them: what capture needs to build a node.

[Note: meta functions] Pointwise, reduction, view, matmul, creation, random and copy operators get their
result shape and dtype from the same rules the eager kernels use (the operator's dtype rule, broadcasting,
``reduction_dims``, view rules), as do gather/scatter, advanced indexing, cat and operators that declare
their own (``meta=``, a function of the arguments giving shape and dtype: ``_scaled_mm``). Operators without
such a rule (scans, sorts, boolean masks, anything new) are run by the CPU backend on stand-ins of their inputs'
types, once filled with zeros and once with ones: when the two results' shapes differ, the shape depends on
the values (``repeat_interleave`` by a tensor, ``nonzero``) and capture refuses the operator with a
``DataDependentError``. What that run finds is kept per signature (operator, argument shapes, dtypes and
values), since it costs a full-size CPU computation.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from tilewise import strides as S
from tilewise.compiler.errors import data_dependent_error
from tilewise.compiler.ir import TensorType
from tilewise.device import cpu
from tilewise.dispatch import STATE
from tilewise.dtypes import get_default_dtype, int64
from tilewise.ops.views import view_output
from tilewise.tensor import TRACE_HOOKS, Tensor, from_array

DATA_DEPENDENT_OPS = frozenset({"nonzero"})


class Stand:
    """Shape and dtype of a graph value, in the attributes operator rules read from a Tensor argument."""

    def __init__(self, ty: TensorType):
        self._shape = self.shape = ty.shape
        self._dtype = self.dtype = ty.dtype
        self._device = self.device = ty.device
        self.ndim = len(ty.shape)


def reduction_dims(op, args: tuple) -> tuple[tuple[int, ...], bool]:
    """The dims a reduction call reduces and its keepdim flag (the eager CPU backend's rule)."""
    x = args[0]
    names = op.param_names()
    dim = args[1] if len(args) > 1 and names[1] == "dim" else None
    keepdim = bool(args[names.index("keepdim")]) if "keepdim" in names else False
    if x.ndim == 0:
        return (), keepdim
    if isinstance(dim, tuple) and len(dim) == 0 and op.reduce == "add":
        return tuple(range(x.ndim)), keepdim
    return S.normalize_dims(dim, x.ndim, op.name), keepdim


def infer(op, args: tuple, device) -> TensorType | tuple:
    """The result type(s) of ``op`` on ``args`` (tensors may be trace tensors; only metadata is read)."""
    declared = op.attrs.get("meta")  # (args) -> (shape, dtype): an operator's own result rule
    if declared is not None:
        shape, dtype = declared(args)
        return TensorType(tuple(shape), dtype, device)
    rule = _RULES.get(op.kind)
    if rule is not None:
        out = rule(op, args, device)
        if out is not None:
            return out
    return run_on_zeros(op, args, device)


def _pointwise(op, args, device):
    out_dtype, _ = op.dtype_rule(op, args)
    shapes = [args[k]._shape for k in op.tensor_idx if type(args[k]) is Tensor]
    if not shapes:
        return TensorType((), out_dtype, device)
    shape = shapes[0]
    if type(shape) is not tuple or shapes.count(shape) != len(shapes):  # else the operands' one shape, the usual
        shape = S.broadcast_shapes(*shapes, op=op.name)
    return TensorType(shape, out_dtype, device)


def _reduction(op, args, device):
    x = args[0]
    dims, keepdim = reduction_dims(op, args)
    shape = S.reduced_shape(x._shape, dims, keepdim) if x.ndim else x._shape
    if op.reduce is not None:
        return TensorType(shape, op.dtype_rule(op, args)[0], device)
    if op.name in ("argmax", "argmin"):
        if args[1] is None:
            shape = (1,) * x.ndim if keepdim else ()
        return TensorType(shape, int64, device)
    if len(op.schema.returns) == 2:  # max.dim / min.dim: values and indices
        return (TensorType(shape, x._dtype, device), TensorType(shape, int64, device))
    return None


def _view(op, args, device):
    dtype, (shape, _, _) = view_output(op, args)
    return TensorType(tuple(shape), dtype, device)


def _matmul(op, args, device):
    a, b = args[0], args[1]
    out_dtype, _ = op.dtype_rule(op, args)
    if op.name == "mm" and a.ndim == 2 and b.ndim == 2 and a._shape[1] == b._shape[0]:
        return TensorType((a._shape[0], b._shape[1]), out_dtype, device)
    if op.name == "bmm" and a.ndim == 3 and b.ndim == 3 and a._shape[0] == b._shape[0] and a._shape[2] == b._shape[1]:
        return TensorType((a._shape[0], a._shape[1], b._shape[2]), out_dtype, device)
    return None  # malformed: let the CPU kernel raise its own error


def _arg(op, args, name, default=None):
    names = op.param_names()
    return args[names.index(name)] if name in names else default


def _created_shape(op, args) -> tuple[int, ...] | None:
    name = op.name
    if "size" in op.param_names():
        return tuple(_arg(op, args, "size"))
    if name == "arange":
        start, end, step = args[0], args[1], args[2]
        return (max(int(math.ceil((end - start) / step)), 0),)
    if name == "linspace":
        return (args[2],)
    if name == "eye":
        return (args[0], args[1] if args[1] is not None else args[0])
    if name == "randperm":
        return (args[0],)
    return None


def _creation(op, args, device):
    shape = _created_shape(op, args)
    if shape is None:
        return None
    dtype = _arg(op, args, "dtype") or (int64 if op.name in ("randint", "randperm") else get_default_dtype())
    return TensorType(shape, dtype, device)


def _random(op, args, device):
    if op.name in ("bernoulli", "poisson"):
        return TensorType(args[0]._shape, args[0]._dtype, device)
    if op.name == "binomial":
        op.dtype_rule(op, args)
        return TensorType(S.broadcast_shapes(args[0]._shape, args[1]._shape, op="binomial"), args[0]._dtype, device)
    if op.name == "multinomial":
        return TensorType(args[0]._shape[:-1] + (args[1],), int64, device)
    return _creation(op, args, device)


def _copy(op, args, device):
    x = args[0]
    if op.name == "_to_copy":
        return TensorType(x._shape, args[1] or x._dtype, args[2] or x._device)
    if op.name in ("clone", "_write_"):
        return TensorType(x._shape, x._dtype, x._device)
    if op.name == "cat":
        from tilewise.ops.movement import check_cat

        parts, d, dtype = check_cat(args[0], args[1])
        shape = list(parts[0]._shape)
        shape[d] = sum(t._shape[d] for t in parts)
        return TensorType(tuple(shape), dtype, device)
    return None


def _index(op, args, device):
    """gather/scatter and the backward of a view: their result types follow from their operands' shapes (the
    kernels' own dim and dtype checks run here too), so the CPU kernel need not run on full-size stand-ins."""
    from tilewise.ops.indexing import check_gather_shapes

    name = op.name
    if name == "gather":
        check_gather_shapes(args[0], args[1], args[2], name)
        return TensorType(args[2]._shape, args[0]._dtype, device)
    if name in ("scatter", "scatter_add") and type(args[2]) is Tensor:
        check_gather_shapes(args[0], args[1], args[2], name, args[3] if type(args[3]) is Tensor else None)
        return TensorType(args[0]._shape, args[0]._dtype, device)
    if name == "view_scatter_add":
        return TensorType(tuple(args[1]), args[0]._dtype, device)
    if op.full_name == "index.Tensor":
        shape = _indexed_shape(args[0], args[1])
        return TensorType(shape, args[0]._dtype, device) if shape is not None else None
    if name == "index_put" and isinstance(args[2], Tensor):
        shape = _indexed_shape(args[0], args[1])
        try:
            fits = shape is not None and S.broadcast_shapes(args[2]._shape, shape, op="index_put") == shape
        except (RuntimeError, ValueError):
            fits = False
        # else the kernel's own checks say what is wrong
        return TensorType(args[0]._shape, args[0]._dtype, device) if fits else None
    return None


def _indexed_shape(x, indices) -> tuple[int, ...] | None:
    """The shape of ``x[indices]`` for integer index tensors (``_strides.advanced_index_dims``, the rule the
    CUDA kernel uses); None for what only the kernel can judge (masks, other index dtypes, too many indices,
    index shapes that do not broadcast)."""
    if not isinstance(indices, (tuple, list)) or len(indices) > x.ndim:
        return None
    dims, shapes = [], []
    for d, idx in enumerate(indices):
        if idx is None:
            continue
        if not isinstance(idx, Tensor) or idx._dtype.name not in ("int64", "int32"):
            return None
        dims.append(d)
        shapes.append(idx._shape)
    if not dims:
        return None
    try:
        before, joined, after = S.advanced_index_dims(x.ndim, dims, shapes)
    except RuntimeError:
        return None
    return (*(x._shape[d] for d in before), *joined, *(x._shape[d] for d in after))


def _custom(op, args, device):
    """A custom operator's fake implementation (``tilewise.library``), called on the trace tensors: only the
    types of what it returns are read, so the operators it calls to make them are dead code the graph drops."""
    out = op.attrs["fake"](args)
    if isinstance(out, (tuple, list)):
        return tuple(TensorType(o._shape, o._dtype, device) if o is not None else None for o in out)
    return TensorType(out._shape, out._dtype, device)


_RULES = {"custom": _custom, "pointwise": _pointwise, "reduction": _reduction, "view": _view, "matmul": _matmul,
          "creation": _creation, "random": _random, "copy": _copy, "index": _index}


# ---------------------------------------------------------------------------- the general fallback

def _zeros_like_meta(t: Tensor) -> Tensor:
    return from_array(np.zeros(t._shape, dtype=t._dtype.np), t._dtype)


_inferred: dict = {}  # (op, the arguments' types and values) -> result types found by run_on_zeros


def _signature(op, args: tuple):
    def part(a):
        if type(a) is Tensor:
            return (a._shape, a._dtype)
        if isinstance(a, (tuple, list)):
            return (type(a), tuple(part(x) for x in a))
        return (type(a), a)

    try:
        key = (op.full_name, tuple(part(a) for a in args))
        hash(key)
        return key
    except TypeError:
        return None


def run_on_zeros(op, args: tuple, device) -> TensorType | tuple:
    """Run the CPU kernel on zero-filled stand-ins and read the result types (remembered per signature: the
    same call in every layer of a model, or in the next compile, is not run again)."""
    key = _signature(op, args)
    found = _inferred.get(key) if key is not None else None
    if found is None:
        found = _run_on_zeros(op, args)
        if key is not None:
            _inferred[key] = found
    if isinstance(found, tuple):
        return tuple(TensorType(o.shape, o.dtype, device) if o is not None else None for o in found)
    return TensorType(found.shape, found.dtype, device)


def _run_on_zeros(op, args: tuple) -> TensorType | tuple:
    from tilewise.backends.cpu import run as cpu_run

    def stand_in(a):
        if type(a) is Tensor:
            return _zeros_like_meta(a)
        if isinstance(a, tuple) and any(type(x) is Tensor for x in a):
            return tuple(_zeros_like_meta(x) if type(x) is Tensor else x for x in a)
        return a

    with suspended():
        out = cpu_run(op, tuple(stand_in(a) for a in args), cpu)
        ones = _run_on_ones(op, args, cpu_run)
        if ones is not None and _shapes(out) != _shapes(ones):
            raise data_dependent_error(f"{op.name}() (its result's shape depends on tensor values)")
    if isinstance(out, (tuple, list)):
        return tuple(TensorType(o._shape, o._dtype, cpu) if o is not None else None for o in out)
    return TensorType(out._shape, out._dtype, cpu)


def _shapes(out) -> tuple | None:
    if out is None:
        return None
    return tuple(o._shape if o is not None else None for o in out) if isinstance(out, (tuple, list)) else out._shape


def _run_on_ones(op, args: tuple, cpu_run):
    """The same call on one-filled stand-ins; None when they are not valid inputs (e.g. out-of-range indices)."""
    def stand_in(a):
        if type(a) is Tensor:
            return from_array(np.ones(a._shape, dtype=a._dtype.np), a._dtype)
        if isinstance(a, tuple) and any(type(x) is Tensor for x in a):
            return tuple(stand_in(x) for x in a)
        return a

    try:
        return cpu_run(op, tuple(stand_in(a) for a in args), cpu)
    except (RuntimeError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def suspended():
    """Run real kernels for a moment (used to learn result types from stand-in inputs)."""
    depth, STATE.trace_depth = STATE.trace_depth, 0
    try:
        yield
    finally:
        STATE.trace_depth = depth


TRACE_HOOKS.untraced = suspended  # see tilewise/_plugins.py
