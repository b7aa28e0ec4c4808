"""View operators: declared by their stride arithmetic; they never run a kernel on any device.

A view's ``view`` rule maps the input geometry ``(shape, strides, offset)`` and the op's arguments to the
output geometry. Every strided view that selects a subset of elements (select, slice, diagonal, unfold,
as_strided) shares one backward primitive, ``view_scatter_add``: replay the same geometry on a zero
tensor of the input's shape and add the gradient into it.

[Note: view geometry cache] A rule's answer depends on the input's shape and strides and the op's arguments
only, its offset aside, which every rule but as_strided's moves by a fixed amount. A program asks the same few
questions over and over (a model's ``view(b, t, h, d)``, ``transpose(1, 2)``, ``narrow`` of one qkv projection,
every step), and a rule costs a microsecond of Python (normalising dims, inferring a -1, torch's stride
algorithm) where the lookup costs a fifth of that. So answers are kept per (op, shape, strides, arguments) as
(shape, strides, offset delta); an error is raised anew on each call, never kept. The table is cleared when it
fills, so that a program of ever-changing shapes does not grow it without bound.
"""

from __future__ import annotations

from tilewise import dispatch
from tilewise import strides as S
from tilewise.dispatch import STATE
from tilewise.dtypes import as_dtype
from tilewise.ops.batching_rules import view_scatter_add_rule, view_scatter_rule
from tilewise.ops.formulas import HELPERS
from tilewise.ops.inplace import INFERENCE, NO_GRAD, REGENERATE, watch_view
from tilewise.ops.registry import OPS, declare
from tilewise.tensor import Tensor
from tilewise.tensortypes import type_name

_GEOMETRY: dict[tuple, tuple] = {}  # (op, shape, strides, arguments) -> (shape, strides, offset delta)
GEOMETRY_LIMIT = 4096  # answers kept before the table is cleared (see [Note: view geometry cache])


def apply_view(op, args: tuple) -> Tensor:
    x = args[0]
    if op.attrs.get("geometry_cached"):
        key = (op, x._shape, x._strides, args[1:])
        try:
            found = _GEOMETRY.get(key)
        except TypeError:  # an argument that is no hashable value: the rule answers for this call alone
            found = key = None
        if found is None:
            found = cached_geometry(op, x, args, key)
        shape, strides, delta = found
        return make_view(x, shape, strides, x._offset + delta, x._dtype)
    dtype, (shape, strides, offset) = view_output(op, args)
    if op.name == "as_strided" and x._storage is not None:
        _check_in_storage(shape, strides, offset, x)
    return make_view(x, tuple(shape), tuple(strides), offset, dtype)


def cached_geometry(op, x: Tensor, args: tuple, key: tuple | None) -> tuple:
    """The rule's answer for ``x`` at offset 0, as (shape, strides, offset delta), kept under ``key``."""
    shape, strides, delta = op.view(x._shape, x._strides, 0, *args[1:])
    found = (tuple(shape), tuple(strides), delta)
    if key is not None:
        if len(_GEOMETRY) >= GEOMETRY_LIMIT:
            _GEOMETRY.clear()
        _GEOMETRY[key] = found
    return found


def make_view(x: Tensor, shape: tuple, strides: tuple, offset: int, dtype) -> Tensor:
    """A view of ``x`` with this geometry, tracked as a view of ``x``'s base."""
    storage = x._storage
    out = Tensor._make(storage, shape, strides, offset, dtype, x._device)
    base = x._base
    # an inference tensor's views are not tracked as views, as in torch (nothing can record through them)
    if storage is None or not storage.inference:
        out._base = x if base is None else base
    out._trace = x._trace
    if x._untracked:
        out.__dict__["_untracked"] = True
    meta = x._view_meta
    if meta is not None or STATE.grad_enabled is False or x._requires_grad or base is not None and base._requires_grad:
        _watch_view_of(x, out, meta)
    return out


def _watch_view_of(x: Tensor, out: Tensor, meta: tuple | None) -> None:
    """A view of a watched view is watched alike; one made under no_grad or inference mode is watched as such, whether
    or not its base requires grad now (it requires grad through its base alone: no grad_fn, no gradient of its own;
    see ``Tensor.requires_grad``); any other view of a tensor that requires grad is made afresh from its base if its
    memory is written before autograd takes it (torch's view regeneration; see [Note: watched views] in
    ops/inplace.py)."""
    if STATE.grad_enabled is False:
        if out._base is None:  # a view of an inference tensor is no view, as in torch
            return
        made_in_inference = STATE.inference or (meta is not None and meta[1] == INFERENCE)
        watch_view(out, INFERENCE if made_in_inference else NO_GRAD)
    elif meta is not None:
        watch_view(out, meta[1])
    elif STATE.grad_enabled is not False:  # on, or recording this view (``dispatch.GRAD_OFF_FOR_RECORDING``)
        watch_view(out, REGENERATE)


def view_output(op, args: tuple) -> tuple:
    """The dtype and the geometry ``(shape, strides, offset)`` of a view's result."""
    x = args[0]
    reinterpret = op.attrs.get("view_dtype")  # view_as_real/complex, view.dtype: the same bytes as another dtype
    if reinterpret is None:
        return x._dtype, op.view(x._shape, x._strides, x._offset, *args[1:])
    dtype = reinterpret(*args)
    if op.attrs.get("regroups_bytes"):
        return dtype, op.view(x._shape, x._strides, x._offset, x._dtype, dtype)
    return dtype, op.view(x._shape, x._strides, x._offset, *args[1:])


def _check_in_storage(shape, strides, offset, x: Tensor) -> None:
    """as_strided is the one view whose geometry is chosen by the caller: it must stay inside the storage."""
    needed = S.storage_span(shape, strides, offset)
    storage = x._storage
    if needed * x._dtype.itemsize > storage.numel * storage.dtype.itemsize:  # a real view of complex storage: bytes
        raise RuntimeError(f"as_strided: sizes {list(shape)}, strides {list(strides)}, storage offset {offset} need a "
                           f"storage of {needed} elements, but the storage has {x._storage.numel}; valid views stay "
                           "inside the storage")


def view_geometry(op_name: str, shape: tuple, *args) -> tuple:
    """Geometry of a view applied to a contiguous tensor of ``shape`` (used by view backward formulas)."""
    return OPS[op_name].view(tuple(shape), S.contiguous_strides(shape), 0, *args)


def view(schema: str, rule, grad: str, **attrs):
    """A view declared by its stride rule; its answers are kept (see [Note: view geometry cache]) unless
    ``geometry_cached=False`` (a rule whose offset is not relative to the input's)."""
    attrs.setdefault("geometry_cached", True)
    return declare(schema, "view", view=rule, grad={"self": grad}, **attrs)


# ---------------------------------------------------------------- geometry rules

def _view(shape, strides, offset, size):
    new_shape = S.infer_size(size, S.numel(shape), "view")
    new_strides = S.view_strides(shape, strides, new_shape)
    if new_strides is None:
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one dimension "
                           "spans across two contiguous subspaces). Use .reshape(...) instead.")
    return new_shape, new_strides, offset


def _permute(shape, strides, offset, dims):
    dims = S.check_permutation(dims, len(shape))
    return S.permuted(shape, dims), S.permuted(strides, dims), offset


def _transpose(shape, strides, offset, dim0, dim1):
    n = len(shape)
    d0, d1 = S.normalize_dim(dim0, n, "transpose"), S.normalize_dim(dim1, n, "transpose")
    if n == 0:  # dims 0 and -1 name the one place of a 0-dim tensor
        return shape, strides, offset
    order = list(range(n))
    order[d0], order[d1] = order[d1], order[d0]
    return S.permuted(shape, order), S.permuted(strides, order), offset


def _t(shape, strides, offset):
    if len(shape) > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {len(shape)}D; use transpose or mT")
    return tuple(reversed(shape)), tuple(reversed(strides)), offset


def _expand(shape, strides, offset, size, implicit=False):
    lead = len(size) - len(shape)
    for k, w in enumerate(size):
        if w == -1 and k < lead:
            raise RuntimeError(f"The expanded size of the tensor (-1) isn't allowed in a leading, non-existing "
                               f"dimension {k}")
        if w < -1:  # torch's words for a size that is neither kept nor matched
            have = shape[k - lead] if k >= lead else 1
            raise RuntimeError(f"The expanded size of the tensor ({w}) must match the existing size ({have}) at "
                               f"non-singleton dimension {k}.  Target sizes: {list(size)}.  Tensor sizes: "
                               f"{list(shape)}")
    target = S.expanded_shape(shape, size)
    return target, S.expand_strides(shape, strides, size), offset


def _squeeze(shape, strides, offset, dim=None):
    dims = S.normalize_dims(dim, len(shape), "squeeze") if dim is not None else tuple(range(len(shape)))
    keep = [k for k in range(len(shape)) if not (k in dims and shape[k] == 1)]
    return tuple(shape[k] for k in keep), tuple(strides[k] for k in keep), offset


def _unsqueeze(shape, strides, offset, dim):
    d = S.normalize_dim(dim, len(shape) + 1, "unsqueeze")
    inner = strides[d] * shape[d] if d < len(shape) else 1
    return shape[:d] + (1,) + shape[d:], strides[:d] + (inner,) + strides[d:], offset


def _select(shape, strides, offset, dim, index):
    if not shape:
        raise IndexError("select() cannot be applied to a 0-dim tensor")
    d = S.normalize_dim(dim, len(shape), "select")
    if not -shape[d] <= index < shape[d]:
        raise IndexError(f"index {index} is out of bounds for dimension {d} with size {shape[d]}")
    index += shape[d] if index < 0 else 0
    return shape[:d] + shape[d + 1:], strides[:d] + strides[d + 1:], offset + index * strides[d]


def _slice(shape, strides, offset, dim=0, start=None, end=None, step=1):
    d = S.normalize_dim(dim, len(shape), "slice")
    if step <= 0:
        raise ValueError(f"slice step must be positive, got {step}")
    n = shape[d]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    length = max(0, (end - start + step - 1) // step)
    new_shape = shape[:d] + (length,) + shape[d + 1:]
    new_strides = strides[:d] + (strides[d] * step,) + strides[d + 1:]
    return new_shape, new_strides, offset + start * strides[d]


def _as_strided(shape, strides, offset, size, stride, storage_offset=None):
    if len(size) != len(stride):
        raise RuntimeError(f"as_strided: mismatch in length of strides ({len(stride)}) and shape ({len(size)})")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"as_strided: negative strides are not supported, got {list(stride)}")
    return tuple(size), tuple(stride), offset if storage_offset is None else storage_offset


def _diagonal(shape, strides, offset, diag_offset=0, dim1=0, dim2=1):
    n = len(shape)
    d1, d2 = S.normalize_dim(dim1, n, "diagonal"), S.normalize_dim(dim2, n, "diagonal")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if diag_offset >= 0:
        length = max(min(shape[d1], shape[d2] - diag_offset), 0)
        start = offset + diag_offset * strides[d2] if length else offset
    else:
        length = max(min(shape[d1] + diag_offset, shape[d2]), 0)
        start = offset - diag_offset * strides[d1] if length else offset
    keep = [k for k in range(n) if k not in (d1, d2)]
    return (tuple(shape[k] for k in keep) + (length,), tuple(strides[k] for k in keep) + (strides[d1] + strides[d2],),
            start)


def _unfold(shape, strides, offset, dimension, size, step):
    d = S.normalize_dim(dimension, max(len(shape), 1), "unfold")
    max_size = shape[d] if shape else 1  # a 0-d tensor unfolds as one element
    if size > max_size:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {max_size} but size is {size} "
                           f"(unfold of a tensor of shape {list(shape)})")
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0 (unfold)")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0 (unfold)")
    if not shape:
        return (size,), (1,), offset
    count = (shape[d] - size) // step + 1
    return (shape[:d] + (count,) + shape[d + 1:] + (size,), strides[:d] + (strides[d] * step,) + strides[d + 1:] +
            (strides[d],), offset)


def _view_dtype(shape, strides, offset, source, target):
    """torch's view(dtype): the same bytes read as ``target``; with another element size the last dimension
    regroups its bytes, so it must be dense and every other stride and the offset must fall on whole elements."""
    if source.itemsize == target.itemsize:
        return shape, strides, offset
    what = f"to view {source.name} as {target.name} (different element sizes)"
    if not shape:
        raise RuntimeError(f"view.dtype: self.dim() cannot be 0 {what}")
    if strides[-1] != 1:
        raise RuntimeError(f"view.dtype: self.stride(-1) must be 1 {what}, but got {strides[-1]}")
    if target.itemsize > source.itemsize:
        ratio = target.itemsize // source.itemsize
        for name, value in (("size(-1)", shape[-1]), *((f"stride({d})", s) for d, s in enumerate(strides[:-1])),
                            ("storage_offset()", offset)):
            if value % ratio:
                raise RuntimeError(f"view.dtype: self.{name} must be divisible by {ratio} {what}, but got {value}")
        return (shape[:-1] + (shape[-1] // ratio,), tuple(s // ratio for s in strides[:-1]) + (1,), offset // ratio)
    ratio = source.itemsize // target.itemsize
    return shape[:-1] + (shape[-1] * ratio,), tuple(s * ratio for s in strides[:-1]) + (1,), offset * ratio


def _target_dtype(x: Tensor, dtype):
    target = as_dtype(dtype)
    if (x._dtype.is_complex or target.is_complex) and target is not x._dtype:
        raise RuntimeError(f"view.dtype: a complex tensor cannot be viewed as another dtype here (got {x._dtype.name} "
                           f"-> {target.name}); use view_as_real / view_as_complex")
    return target


# ---------------------------------------------------------------- declarations

view("view(Tensor(a) self, int[] size) -> Tensor(a)", _view, "grad.reshape(self_shape)")
declare("view.dtype(Tensor(a) self, ScalarType dtype) -> Tensor(a)", "view", view=_view_dtype,
        view_dtype=_target_dtype, regroups_bytes=True, compiles=False)
view("permute(Tensor(a) self, int[] dims) -> Tensor(a)", _permute, "grad.permute(inverse_permutation(dims))")
view("transpose(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", _transpose, "grad.transpose(dim0, dim1)",
     aliases=("swapaxes", "swapdims"))
view("t(Tensor(a) self) -> Tensor(a)", _t, "grad.t()")
def _expand_check(op, args) -> None:
    """torch's refusal of fewer sizes than dims, which names the tensor's legacy type."""
    self, size = args[0], args[1]
    if len(size) < self.ndim:
        raise RuntimeError(f"expand({type_name(self.dtype, self.device.type)}{{{list(self.shape)}}}, size="
                           f"{list(size)}): the number of sizes provided ({len(size)}) must be greater or equal to the "
                           f"number of dimensions in the tensor ({self.ndim})")


view("expand(Tensor(a) self, int[] size, *, bool implicit=False) -> Tensor(a)", _expand,
     "grad.sum_to_size(self_shape)", check=_expand_check)
view("squeeze(Tensor(a) self, int[]? dim=None) -> Tensor(a)", _squeeze, "grad.reshape(self_shape)")
view("unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", _unsqueeze, "grad.squeeze(dim)")
view("select(Tensor(a) self, int dim, int index) -> Tensor(a)", _select,
     "view_backward(grad, 'select', self_shape, dim, index)")
view("slice(Tensor(a) self, int dim=0, int? start=None, int? end=None, int step=1) -> Tensor(a)", _slice,
     "view_backward(grad, 'slice', self_shape, dim, start, end, step)", method=False)
view("as_strided(Tensor(a) self, int[] size, int[] stride, int? storage_offset=None) -> Tensor(a)", _as_strided,
     "as_strided_backward(grad, self_geometry, size, stride, storage_offset)", geometry_cached=False)
view("diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)", _diagonal,
     "view_backward(grad, 'diagonal', self_shape, offset, dim1, dim2)")
view("unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)", _unfold,
     "view_backward(grad, 'unfold', self_shape, dimension, size, step)")

def strided_read(grad, view_shape, view_strides, view_offset):
    """The (shape, strides, offset) view of ``grad`` laid out contiguously. as_strided's offset counts from the
    start of the storage, so a contiguous ``grad`` that starts further in (a slice of a larger gradient, as
    cat's backward hands out) shifts it by its own offset."""
    grad = grad.contiguous()
    return grad.as_strided(view_shape, view_strides, view_offset + grad.storage_offset())


HELPERS.update(strided_read=strided_read)
declare("view_scatter_add(Tensor grad, int[] input_shape, int[] view_shape, int[] view_strides, int view_offset)"
        " -> Tensor", "index",
        grad={"grad": "strided_read(grad, view_shape, view_strides, view_offset)"}, fwd="auto_linear", method=False,
        doc="Zeros of input_shape, with ``grad`` added at the elements a (view_shape, view_strides, view_offset) "
            "view of a contiguous tensor would read: the backward of every strided view.", batch=view_scatter_add_rule)
def _view_inside(op, args) -> None:
    """view_scatter writes through the view's geometry into a copy of ``self``: every element it addresses must be
    one of ``self``'s (a view that reads the bytes as another dtype is scattered into its base seen in that dtype)."""
    self, _, shape, strides, offset = args[:5]
    if not S.numel(shape):
        return
    lowest = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    highest = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    if lowest < 0 or highest >= S.numel(self.shape):
        raise RuntimeError(f"view_scatter: a view of shape {list(shape)}, strides {list(strides)} and offset "
                           f"{offset} reaches outside the {S.numel(self.shape)} elements of self")


declare("view_scatter(Tensor self, Tensor src, int[] view_shape, int[] view_strides, int view_offset) -> Tensor",
        "index", check=_view_inside,
        grad={"self": "view_scatter(grad, zeros(src_shape, dtype=grad.dtype, device=grad.device), view_shape, "
                      "view_strides, view_offset)",
              "src": "strided_read(grad, view_shape, view_strides, view_offset)"},
        fwd="auto_linear", method=False,
        doc="A copy of contiguous ``self`` with the elements a strided view selects replaced by "
            "``src``: how an in-place write through a view is recorded on its base.", batch=view_scatter_rule)

dispatch.register_view_applier(apply_view)
