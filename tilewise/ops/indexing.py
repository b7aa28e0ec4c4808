"""Indexing: ``x[...]`` reads and writes, gather/scatter, and the advanced-indexing primitives.

Basic indexing (ints, slices, None, Ellipsis) is a chain of views. Any tensor or list index makes it
advanced: the basic part is applied as views first, then one ``index`` primitive gathers with numpy's
(= torch's) broadcasting rules. ``x[i] = v`` writes through ``index_put_``, so autograd sees one in-place
operator on ``x`` whichever kind of index was used.
"""

from __future__ import annotations

from numbers import Number

from tilewise import strides as S
from tilewise.dtypes import c10_name, checked_scalar, type_meta_name
from tilewise.layouts import contiguous_format
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import dynamic_shape, shift_dims
from tilewise.ops.batching_rules import index_put_rule, index_rule
from tilewise.ops.inplace import read_only_error, shares_read_only_array
from tilewise.ops.registry import call, declare
from tilewise.tensor import Tensor

declare("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", "index", dtype=R.first_input,
        check=lambda op, args: check_index_tensor_dtypes(args[1], "index"),
        grad={"self": "index_put(zeros(self_shape, dtype=grad.dtype, device=grad.device), indices, grad, True)",
              "indices": None}, fwd="auto_linear", method=False, batch=index_rule)
declare("index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor", "index",
        dtype=R.first_input, check=lambda op, args: check_index_put_dtypes(*args),
        grad={"self": "grad if accumulate else "
                      "index_put(grad, indices, zeros((), dtype=grad.dtype, device=grad.device), False)",
              "values": "grad[indices_tuple(indices)]", "indices": None}, fwd="auto_linear", inplace=True,
        autocast={"cuda": "promote"}, batch=index_put_rule, out=False)
declare("gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", "index",
        dtype=R.first_input, grad={"self": "zeros_like(self).scatter_add(dim, index, grad)", "index": None},
        fwd="auto_linear", batch=shift_dims)
def check_scatter_src(op, args: tuple) -> None:
    """Every scatter's first check (its ``check=``), in torch's words whichever scatter it is."""
    self, src = args[0], args[3]
    if isinstance(src, Tensor) and src.dtype is not self.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")


declare("scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", "index", dtype=R.first_input,
        check=check_scatter_src,
        grad={"self": "grad.scatter(dim, index, 0)", "src": "grad.gather(dim, index)", "index": None},
        fwd="auto_linear", inplace=True, batch=shift_dims)
declare("scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor", "index", dtype=R.first_input,
        grad={"self": "grad.scatter(dim, index, 0)", "index": None}, fwd="self_t.scatter(dim, index, 0)",
        inplace=True, batch=shift_dims)
declare("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", "index", dtype=R.first_input,
        check=check_scatter_src,
        grad={"self": "grad", "src": "grad.gather(dim, index)", "index": None}, fwd="auto_linear", inplace=True,
        autocast={"cuda": "promote"}, batch=shift_dims)
declare("nonzero(Tensor self) -> Tensor", "index", differentiable=False,
        doc="Positions of non-zero elements, one row of coordinates each (data-dependent shape).", batch=dynamic_shape)


def _nonzero_static(self, size, fill_value=-1):
    """nonzero's indices in a fixed shape ``[size, ndim]``: truncated, or padded with ``fill_value`` rows."""
    from tilewise.ops.creation import full

    if size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    found = self.nonzero()
    if found.shape[0] >= size:
        return found[:size].clone(memory_format=contiguous_format)  # row-major, as torch's (nonzero's is not)
    padding = full((size - found.shape[0], self.ndim), fill_value, dtype=found.dtype, device=found.device)
    return call("cat", [found, padding]).contiguous()


declare("nonzero_static(Tensor self, *, int size, int fill_value=-1) -> Tensor", "composite",
        decomposition=_nonzero_static, differentiable=False)
declare("masked_fill(Tensor self, Tensor mask, Tensor value) -> Tensor", "composite",
        decomposition=lambda self, mask, value: _masked_fill(self, mask, value), inplace=True, out=False)


def _masked_fill(self, mask, value):
    from tilewise.ops.registry import OVERLOADS

    if type(mask) is not Tensor:
        raise RuntimeError(f"masked_fill: expected a bool mask tensor, got {type(mask)}")
    if mask.dtype.name != "bool":  # a byte mask too (Transformer-XL's): torch's words, its dtype as C++ names it
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{type_meta_name(mask.dtype)}")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    if isinstance(value, Tensor):
        value = value.to(self.dtype)
    elif isinstance(value, Number):
        value = checked_scalar(value, self.dtype, "masked_fill")
    where = OVERLOADS["where"][0]
    out = where(mask, value, self)
    out = out if out.dtype is self.dtype else out.to(self.dtype)
    return out.contiguous()  # torch fills a row-major clone of self, whatever self's and the mask's orders


GATHER_INDEX_DTYPES = ("int32", "int64")


def nonempty_shape(shape: tuple) -> tuple:
    """torch's view of a 0-dim tensor in gather and scatter: one dim of one element."""
    return tuple(shape) or (1,)


def check_gather_shapes(self, dim, index, op, src=None) -> int:
    """gather/scatter's checks of dims, sizes and dtypes (what the compiler can check before values exist); the
    normalised dim. torch's rule: a 0-dim tensor counts as one dim of size 1; an empty index is not checked;
    the index is no larger than ``self`` along every dim but ``dim`` (and, for a scatter, no larger than ``src``
    along every dim)."""
    d = S.normalize_dim(dim, max(self.ndim, 1), op)
    if index.numel() == 0:
        return d
    if index.dtype.name not in GATHER_INDEX_DTYPES:
        raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index, got {index.dtype}")
    self_shape, index_shape = nonempty_shape(self.shape), nonempty_shape(index.shape)
    if len(index_shape) != len(self_shape):
        noun = "input" if op == "gather" else "self"
        raise RuntimeError(f"Index tensor must have the same number of dimensions as {noun} tensor")
    too_large = any(n > m for k, (n, m) in enumerate(zip(index_shape, self_shape)) if k != d)
    src_shape = getattr(src, "shape", None)
    if too_large and op == "gather":
        k = next(k for k, (n, m) in enumerate(zip(index_shape, self_shape)) if k != d and n > m)
        raise RuntimeError(f"Size does not match at dimension {k} expected index {list(index.shape)} to be "
                           f"no larger than self {list(self.shape)} apart from dimension {d}")
    if src_shape is not None:
        too_large = too_large or any(n > m for n, m in zip(index_shape, nonempty_shape(src_shape)))
        if len(nonempty_shape(src_shape)) != len(index_shape):
            raise RuntimeError("Index tensor must have the same number of dimensions as src tensor")
    if too_large:
        also = f" and to be no larger size than src {list(src_shape)}" if src_shape is not None else ""
        raise RuntimeError(f"Expected index {list(index.shape)} to be no larger than self {list(self.shape)} "
                           f"apart from dimension {d}{also}")
    return d


def mask_error(mask: Tensor, x: Tensor, first: int) -> IndexError | None:
    """torch's error for a bool mask indexing ``x`` from dim ``first`` whose shape does not match, or None."""
    for j, n in enumerate(mask.shape):
        if first + j >= x.ndim or n != x.shape[first + j]:
            return IndexError(f"The shape of the mask {list(mask.shape)} at index {j} does not match the shape of "
                              f"the indexed tensor {list(x.shape)} at index {first + j}")
    return None


def mask_positions(self: Tensor, indices) -> tuple:
    """``index_put``'s indices with each bool mask replaced by the positions it selects (one index tensor per dim
    it covers), as torch expands them."""
    if not any(isinstance(t, Tensor) and t.dtype.name in ("bool", "uint8") for t in indices):
        return tuple(indices)
    out, dim = [], 0
    for t in indices:
        if isinstance(t, Tensor) and t.dtype.name in ("bool", "uint8") and t.ndim:
            error = mask_error(t, self, dim)
            if error is not None:
                raise error
            out.extend(t.nonzero().unbind(1))
            dim += t.ndim
        else:
            out.append(t)
            dim += 1
    return tuple(out)


INDEX_TENSOR_DTYPES = ("int64", "int32", "uint8", "bool")


def check_index_tensor_dtypes(indices, op: str) -> None:
    """Advanced indexing takes long, int, byte (a mask) or bool index tensors; torch raises IndexError for others."""
    for k, t in enumerate(indices or ()):
        if isinstance(t, Tensor) and t.dtype.name not in INDEX_TENSOR_DTYPES:
            raise IndexError(f"{op}: tensors used as indices must be long, int, byte or bool tensors, got "
                             f"{t.dtype.name} for dimension {k}")


def check_index_put_dtypes(self: Tensor, indices, values, accumulate: bool = False) -> None:
    """index_put's ``check=`` (and setitem's, on the index as written), torch's rule: the index tensors are long,
    int, byte or bool; ``values`` has ``self``'s dtype, except where one bool mask and a one-element value make
    the write a ``masked_fill`` (which converts the value)."""
    check_index_tensor_dtypes(indices, "index_put")
    if not isinstance(values, Tensor) or values.dtype is self.dtype:
        return
    masked_fill = (not accumulate and len(indices) == 1 and isinstance(indices[0], Tensor)
                   and indices[0].dtype.name == "bool" and values.numel() == 1)
    if not masked_fill:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{c10_name(self.dtype)} for the destination and {c10_name(values.dtype)} for the source.")


def _zero_dim_mask(t) -> bool:
    return isinstance(t, Tensor) and t.ndim == 0 and t.dtype.name in ("bool", "uint8")


def has_zero_dim_mask(indices) -> bool:
    return isinstance(indices, (tuple, list)) and any(_zero_dim_mask(t) for t in indices)


def zero_dim_mask_positions(self: Tensor, indices, values, accumulate: bool) -> tuple:
    """index_put's ``(indices, values)`` for indices holding a 0-dim mask, which indexes as it does in ``x[mask]``:
    a new dim of size 1 (True) or 0 (False) that consumes none of ``self``'s. The indices become the coordinates of
    the elements so indexed (as ``x[mask] = v`` writes), which no kernel sees a 0-dim mask in. torch's
    ``masked_fill`` path (one mask, a one-element value, no accumulation) converts the value's dtype and refuses
    a byte mask."""
    if not accumulate and len(indices) == 1 and isinstance(values, Tensor) and values.numel() == 1:
        if indices[0].dtype.name == "uint8":
            raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype unsigned char")
        if values.dtype is not self.dtype:
            values = values.to(self.dtype)
    return _full_indices(self, tuple(slice(None) if t is None else t for t in indices)), values


# ---------------------------------------------------------------------------- __getitem__ / __setitem__

def _is_advanced(item) -> bool:
    """Inside an index tuple a tuple is a sequence of indices, as a list is (``x[(0, 1),]``)."""
    return isinstance(item, (Tensor, list, tuple)) or (hasattr(item, "__array__") and not isinstance(item, Number))


def _dims_consumed(item) -> int:
    """How many dims of the tensor an index item uses up: a mask its own number (none for a 0-d one, which adds a
    dim as ``True`` does), None, ``...`` and a bool none, anything else one."""
    if item is None or item is Ellipsis or isinstance(item, bool):
        return 0
    if isinstance(item, Tensor) and item.dtype.name in ("bool", "uint8"):
        return item.ndim
    return 1


def _expand_ellipsis(items: tuple, ndim: int) -> tuple:
    consumed = sum(_dims_consumed(it) for it in items)
    if sum(it is Ellipsis for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    out = []
    for it in items:
        if it is Ellipsis:
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(it)
    if not any(it is Ellipsis for it in items):
        out.extend([slice(None)] * (ndim - consumed))
    return tuple(out)


def _to_index_tensor(item, device):
    from tilewise.tensor import tensor

    if isinstance(item, Tensor):
        t = item
    else:
        t = tensor(item)
        if t.dtype.is_floating_point:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if t.dtype.is_floating_point:
        raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {t.dtype}")
    return t.to(device) if t.device != device and t.ndim > 0 else t


def parse_index(x: Tensor, item):
    """Apply the basic part of an index as views; return (view, per-dim advanced indices or None)."""
    items = item if isinstance(item, tuple) else (item,)
    items = _expand_ellipsis(items, x.ndim)
    out = x
    dim = 0  # position in the partly indexed view
    src = 0  # the dimension of x that the current item indexes (for error messages)
    advanced: list = []
    for it in items:
        src += _dims_consumed(it) if isinstance(it, Tensor) and it.dtype.name in ("bool", "uint8") else (
            0 if it is None or isinstance(it, bool) else 1)
        if it is None:
            out = out.unsqueeze(dim)
            advanced.append(None)
            dim += 1
        elif isinstance(it, bool):
            out = out.unsqueeze(dim)
            if not it:
                out = _slice(out, dim, 0, 0)
            advanced.append(None)
            dim += 1
        elif isinstance(it, slice):
            if it.step is not None and it.step <= 0:
                raise ValueError("step must be greater than zero")
            if it != slice(None):
                out = _slice(out, dim, _int(it.start), _int(it.stop), _int(it.step) or 1)
            advanced.append(None)
            dim += 1
        elif isinstance(it, Tensor) and it.ndim == 0 and not it.dtype.is_floating_point and it.dtype.name not in (
                "bool", "uint8"):
            out = _select(out, dim, int(it.item()), x, src - 1)
        elif isinstance(it, int) or (hasattr(it, "__index__") and not _is_advanced(it)):
            out = _select(out, dim, it.__index__(), x, src - 1)
        elif _is_advanced(it):
            t = _to_index_tensor(it, x.device)
            if t.dtype.name in ("bool", "uint8"):
                error = mask_error(t, out, dim)
                if error is not None:
                    raise error
                for nz in t.nonzero().unbind(1) if t.ndim else (t.reshape(1).nonzero().reshape(-1),):
                    advanced.append(nz)
                dim += max(t.ndim, 1)
                if t.ndim == 0:
                    out = out.unsqueeze(dim - 1)
            else:
                advanced.append(t)
                dim += 1
        else:
            raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and long or bool tensors are "
                             f"valid indices, got {type(it).__name__}")
    if all(a is None for a in advanced):
        return out, None
    return out, advanced + [None] * (out.ndim - len(advanced))


def _select(view: Tensor, dim: int, index: int, x: Tensor, src_dim: int) -> Tensor:
    size = view.shape[dim]
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension {src_dim} with size {x.shape[src_dim]}")
    return view.select(dim, index)


def _slice(x, dim, start, end, step=1):
    from tilewise.ops.registry import OPS

    return OPS["slice"](x, dim, start, end, step)


def _int(v):
    if v is None:
        return None
    return v.__index__()


def getitem(x: Tensor, item):
    from tilewise.ops.registry import OPS

    view, advanced = parse_index(x, item)
    if advanced is None:
        return view if view is not x else x.view(x.shape)  # x[...] is a new view, as in torch
    return OPS["index.Tensor"](view, _trim(advanced))


def _trim(advanced: list) -> tuple:
    while advanced and advanced[-1] is None:
        advanced = advanced[:-1]
    return tuple(advanced)


def setitem(x: Tensor, item, value) -> None:
    from tilewise.dispatch import STATE

    if isinstance(value, Number):
        value = checked_scalar(value, x.dtype, "setitem")
    if shares_read_only_array(x):
        raise read_only_error("setitem", x)
    needs_graph = STATE.grad_enabled and (x.requires_grad or (isinstance(value, Tensor) and value.requires_grad))
    view, advanced = parse_index(x, item)
    if advanced is None and _same_view(view, value):
        return  # `x[i] += 1` already wrote through the view; Python's setitem afterwards has nothing to do
    if advanced is None and not needs_graph and x._trace is None:
        if isinstance(value, Tensor):
            value = value.to(x.dtype, x.device) if value.dtype is not x.dtype or value.device != x.device else value
        view.copy_(value)
        return
    if isinstance(value, Tensor) and value.dtype is not x.dtype:
        if advanced is not None:  # torch's index_put rule, judged on the tensor indices as written
            key = item if isinstance(item, tuple) else (item,)
            check_index_put_dtypes(x, [k for k in key if _is_advanced(k) or isinstance(k, Tensor)], value, False)
        value = value.to(x.dtype)  # basic indexing copies into the view, converting, as torch's does
    x.index_put_(_full_indices(x, item), _as_value(value, x), False)


def _same_view(view: Tensor, value) -> bool:
    return (isinstance(value, Tensor) and value._storage is view._storage and value._shape == view._shape
            and value._strides == view._strides and value._offset == view._offset and value._storage is not None)


def _as_value(value, x: Tensor):
    from tilewise.tensor import tensor

    if isinstance(value, Tensor):
        return value
    return tensor(value, dtype=x.dtype, device=x.device)


def _full_indices(x: Tensor, item) -> tuple:
    """Rewrite any index as advanced indices over every dim of x, so one index_put_ covers basic indexing too:
    index a tensor of element positions the same way, then split the positions into coordinates."""
    from tilewise.ops.creation import arange

    covered = getitem(arange(x.numel(), device=x.device).view(x.shape), item)
    coords = []
    for size in reversed(x.shape):
        coords.append(covered % size)
        covered = covered // size
    return tuple(reversed(coords))
