"""Data movement: concatenation, flips, padding, repetition, index-based selection and updates, triangles,
diagonals, splits and grids.

[Note: movement ops] Only ``cat``, ``flip`` and the index expansion of ``repeat_interleave`` are primitives
(each needs a kernel that moves whole blocks); everything else composes views, ``cat``, and the indexing
primitives of ``ops/indexing.py`` (``index``, ``index_put``, ``gather``, ``scatter``, ``view_scatter``), so
gradients, in-place variants and every backend come from those. take, index_add and index_copy carry torch's
derivative instead, to save what torch saves (the index, and the input or source it reads for its shape), so
that changing those in place before backward is the error it is in torch. The composites validate what the
user passed and name themselves in errors; index bounds are checked by the indexing kernel and reported under
the composite's name.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from numbers import Number

from tilewise import strides as S
from tilewise._warnings import warn_once
from tilewise.dispatch import values_readable
from tilewise.dtypes import bool_, c10_name, checked_scalar, int64, result_type
from tilewise.layouts import contiguous_format, suggest_memory_format
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import dynamic_shape, shift_dims
from tilewise.ops.batching_rules import cat_rule, index_select_rule, stack_rule
from tilewise.ops.formulas import HELPERS
from tilewise.ops.registry import OPS, declare
from tilewise.ops.shape import tensor_split_at
from tilewise.tensor import Tensor


def composite(schema: str, decomposition, **attrs):
    return declare(schema, "composite", decomposition=decomposition, **attrs)


def _check_tensors(tensors, op: str) -> tuple:
    if not tensors:  # torch: cat raises ValueError, the stacks RuntimeError, each in its own words
        if op == "cat":
            raise ValueError("torch.cat(): expected a non-empty list of Tensors")
        raise RuntimeError(f"{op} expects a non-empty TensorList")
    for k, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {k} in argument 0, but got {type(t).__name__} ({op}(): "
                            f"expected a sequence of Tensors, but element {k} is {type(t).__name__} {t!r})")
    return tuple(tensors)


class _IndexNaming(threading.local):
    """The composite an indexing primitive runs under, for the errors a device kernel finds after the call has
    returned (exception rewriting cannot reach those): the CUDA indexing kernels read it at launch. A
    thread-local rather than an argument because the primitives' schemas are torch's and carry no name."""

    op: str | None = None
    negative_wraps = True  # False: the composite refuses negative indices (torch's index_select, embedding)


INDEX_NAMING = _IndexNaming()


def is_bounds_error(exc: Exception) -> bool:
    """Whether ``exc`` is an indexing kernel's report of an index out of range (gather and scatter raise
    RuntimeError for it, as torch does; the other indexing primitives IndexError)."""
    return " is out of bounds for dimension " in str(exc)


@contextmanager
def _index_errors_named(op: str, negative_wraps: bool = True):
    """Report a bounds error of the indexing primitive a composite runs under the composite's own name, both
    when the kernel raises at once (CPU) and when a device kernel finds it later (see ``INDEX_NAMING``)."""
    outer = INDEX_NAMING.op, INDEX_NAMING.negative_wraps
    INDEX_NAMING.op, INDEX_NAMING.negative_wraps = op, negative_wraps
    try:
        yield
    except (IndexError, RuntimeError) as exc:
        if not isinstance(exc, IndexError) and not is_bounds_error(exc):
            raise
        raise type(exc)(f"{op}(): {str(exc).partition(': ')[2] or exc}") from None
    finally:
        INDEX_NAMING.op, INDEX_NAMING.negative_wraps = outer


# ---------------------------------------------------------------- cat, stack


def check_cat(tensors, dim: int) -> tuple[tuple, int, object]:
    """The tensors cat really joins, the normalised dim and the result dtype; raises for mismatched shapes.
    torch's legacy rule: 1-D empty tensors are left out of any cat."""
    tensors = _check_tensors(tensors, "cat")
    for k, t in enumerate(tensors):
        if not t._shape:
            raise RuntimeError(f"zero-dimensional tensor (at position {k}) cannot be concatenated")
    joined = [(k, t) for k, t in enumerate(tensors) if t.shape != (0,)] or [(0, tensors[0])]
    first, ref = joined[0]
    d = S.normalize_dim(dim, ref.ndim, "cat")
    for k, t in joined:
        if t.ndim != ref.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} and {t.ndim}")
        if t.shape[:d] != ref.shape[:d] or t.shape[d + 1:] != ref.shape[d + 1:]:
            i = next(i for i in range(ref.ndim) if i != d and t.shape[i] != ref.shape[i])
            raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size {ref.shape[i]} but "
                               f"got size {t.shape[i]} for tensor number {k} in the list.")
    return tuple(t for _, t in joined), d, result_type(*tensors)


def cat_memory_format(tensors) -> str:
    """The format of cat's result, as torch chooses it: the format every input suggests, else contiguous."""
    found = None
    for t in tensors:
        name = S.suggest_memory_format(t.shape, t.stride())
        if name == "contiguous_format" or found not in (None, name):
            return "contiguous_format"
        found = name
    return found or "contiguous_format"


def _cat_dtype(op, args):
    from tilewise.dtypes import compute_dtype

    out = result_type(*_check_tensors(args[0], "cat"))
    return out, compute_dtype(out)


def cat_backward(grad, tensors_shape, dim: int) -> tuple:
    """Each input's slice of the gradient (an empty one for the 1-D empty inputs cat leaves out)."""
    from tilewise.ops.creation import zeros

    d = S.normalize_dim(dim, grad.ndim, "cat")
    pieces, start = [], 0
    for shape in tensors_shape:
        if tuple(shape) == (0,):
            pieces.append(zeros(shape, dtype=grad.dtype, device=grad.device))
            continue
        pieces.append(grad.narrow(d, start, shape[d]))
        start += shape[d]
    return tuple(pieces)


HELPERS.update(cat_backward=cat_backward)


def _stack(tensors, dim=0):
    tensors = _check_tensors(tensors, "stack")
    first = tensors[0].shape
    for k, t in enumerate(tensors):
        if t.shape != first:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(first)} at entry 0 and "
                               f"{list(t.shape)} at entry {k}")
    d = S.normalize_dim(dim, len(first) + 1, "stack")
    return OPS["cat"]([t.unsqueeze(d) for t in tensors], d)


def _at_least(t: Tensor, ndim: int) -> Tensor:
    return t.reshape((1,) * (ndim - t.ndim) + tuple(t.shape)) if t.ndim < ndim else t


def _hstack(tensors):
    tensors = [_at_least(t, 1) for t in _check_tensors(tensors, "hstack")]
    return OPS["cat"](tensors, 0 if tensors[0].ndim == 1 else 1)


def _vstack(tensors):
    return OPS["cat"]([_at_least(t, 2) for t in _check_tensors(tensors, "vstack")], 0)


declare("cat(Tensor[] tensors, int dim=0) -> Tensor", "copy", dtype=_cat_dtype,
        grad={"tensors": "cat_backward(grad, tensors_shape, dim)"}, fwd="auto_linear", method=False,
        aliases=("concat", "concatenate"), autocast={"cpu": "promote"},
        doc="Join tensors along an existing dim; dtypes promote.\n\n"
            ">>> tw.cat([tw.zeros(1, 2), tw.ones(2, 2)]).shape\ntilewise.Size([3, 2])", batch=cat_rule)
composite("stack(Tensor[] tensors, int dim=0) -> Tensor", _stack, method=False, autocast={"cpu": "promote"},
          doc="Join equal-shaped tensors along a new dim.\n\n"
              ">>> tw.stack([tw.zeros(2), tw.ones(2)], 1).shape\ntilewise.Size([2, 2])", batch=stack_rule)
composite("hstack(Tensor[] tensors) -> Tensor", _hstack, method=False)
composite("vstack(Tensor[] tensors) -> Tensor", _vstack, method=False)


# ---------------------------------------------------------------- flips and rolls


def _fliplr(self):
    if self.ndim < 2:
        raise RuntimeError(f"fliplr(): input must be at least 2-D, got shape {list(self.shape)}")
    return self.flip([1])


def _flipud(self):
    if self.ndim < 1:
        raise RuntimeError("flipud(): input must be at least 1-D, got a 0-dim tensor")
    return self.flip([0])


def _roll(self, shifts, dims=()):
    if not shifts:
        raise RuntimeError("`shifts` required")
    if not dims and len(shifts) == 1:  # the flattened tensor rolled
        return _roll(self.reshape(-1), shifts, (0,)).view(self.shape)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = self
    for shift, dim in zip(shifts, dims):
        d = S.normalize_dim_of_dims(dim, self.ndim, "roll")
        n = out.shape[d] if out.ndim else 1
        if n and shift % n:
            k = shift % n
            out = OPS["cat"]([out.narrow(d, n - k, k), out.narrow(d, 0, n - k)], d)
    return self.clone(memory_format=contiguous_format) if out is self else out  # torch's: a row-major copy


declare("flip(Tensor self, int[] dims) -> Tensor", "copy", dtype=R.first_input,
        grad={"self": "grad.flip(dims)"}, fwd="auto_linear",
        doc="Reverse the order of elements along ``dims`` (a copy).\n\n>>> tw.arange(3).flip(0)\ntensor([2, 1, 0])",
        batch=shift_dims, out=False)
composite("fliplr(Tensor self) -> Tensor", _fliplr, out=False)
composite("flipud(Tensor self) -> Tensor", _flipud, out=False)
composite("roll(Tensor self, int[1] shifts, int[1] dims=[]) -> Tensor", _roll,
          doc="Shift elements cyclically along ``dims`` (the flattened tensor when no dims are given).\n\n"
              ">>> tw.arange(4).roll(1)\ntensor([3, 0, 1, 2])", out=False)


# ---------------------------------------------------------------- pad

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_pairs(pad, ndim: int) -> list[tuple[int, int, int]]:
    """``(dim, before, after)`` per padded dim; ``pad`` lists pairs from the last dim backwards."""
    if len(pad) % 2:
        raise RuntimeError(f"Padding length must be divisible by 2 (pad(): got {len(pad)} values {list(pad)})")
    if len(pad) // 2 > ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(pad)} and input of dimension {ndim} (pad(): padding length "
                           f"{len(pad)} pads {len(pad) // 2} dims, but the input has only {ndim})")
    return [(ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def _check_nonconstant_pad(x: Tensor, pad, mode: str) -> None:
    padded = len(pad) // 2
    if padded not in (1, 2, 3) or x.ndim not in (padded + 1, padded + 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {x.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            f"  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)\n(pad(): mode {mode!r}, input of shape "
            f"{list(x.shape)})")
    if mode != "circular" and 0 in x.shape[-padded - 1:]:  # torch's reflection and replication kernels refuse it
        raise RuntimeError(f"Expected {padded + 1}D or {padded + 2}D (batch mode) tensor with possibly 0 batch size "
                           f"and other non-zero dimensions for input, but got: {list(x.shape)}")


def _cropped(x: Tensor, d: int, before: int, after: int) -> Tensor:
    """Apply the negative parts of a dim's padding: cut elements off."""
    cut_before, cut_after = max(-before, 0), max(-after, 0)
    n = x.shape[d]
    if n - cut_before - cut_after < 0:
        raise RuntimeError(f"narrow(): length must be non-negative. (pad(): the input size {n} plus negative padding "
                           f"({before}, {after}) gives a negative output size at dimension {d} of input "
                           f"{list(x.shape)})")
    return x.narrow(d, cut_before, n - cut_before - cut_after) if cut_before or cut_after else x


def _constant_pad(x: Tensor, pairs, value) -> Tensor:
    """One write of the (cropped) input into a filled tensor of the output's shape."""
    from tilewise.ops.creation import full

    for d, before, after in pairs:
        x = _cropped(x, d, before, after)
    if all(before <= 0 and after <= 0 for _, before, after in pairs):
        return x.clone()  # torch's: a copy of the cropped input in its order (clone under preserve_format)
    shape = list(x.shape)
    for d, before, after in pairs:
        shape[d] += max(before, 0) + max(after, 0)
    strides = S.contiguous_strides(shape)
    offset = sum(max(before, 0) * strides[d] for d, before, _ in pairs)
    filled = full(shape, checked_scalar(value, x.dtype, "pad"), dtype=x.dtype, device=x.device)
    padded = OPS["view_scatter"](filled, x, tuple(x.shape), strides, offset)
    return padded.contiguous(memory_format=suggest_memory_format(x))  # torch keeps a channels-last input's format


def _check_reflect_pad(x: Tensor, pairs) -> None:
    for d, before, after in pairs:
        if before >= x.shape[d] or after >= x.shape[d]:
            argument = 4 + 2 * (x.ndim - 1 - d)  # torch's reflection_pad kernels number the pads from the last dim's
            raise RuntimeError(f"Argument #{argument}: Padding size should be less than the corresponding input "
                               f"dimension, but got: padding ({before}, {after}) at dimension {d} of input "
                               f"{list(x.shape)}")


def _reflect(x: Tensor, d: int, before: int, after: int) -> list[Tensor]:
    n = x.shape[d]
    return [x.narrow(d, 1, before).flip([d]), x, x.narrow(d, n - 1 - after, after).flip([d])]


def _replicate(x: Tensor, d: int, before: int, after: int) -> list[Tensor]:
    n = x.shape[d]

    def edge(start, count):
        shape = list(x.shape)
        shape[d] = count
        return x.narrow(d, start, 1).expand(shape)

    return [edge(0, before), x, edge(n - 1, after)] if n else [x]


def _circular(x: Tensor, d: int, before: int, after: int) -> list[Tensor]:
    n = x.shape[d]
    if before > n or after > n:
        raise RuntimeError(f"Padding value causes wrapping around more than once. (pad(): circular padding "
                           f"({before}, {after}) at dimension {d}, where the input {list(x.shape)} has {n} elements)")
    return [x.narrow(d, n - before, before), x, x.narrow(d, 0, after)]


_PADDERS = {"reflect": _reflect, "replicate": _replicate, "circular": _circular}


def _pad(input, pad, mode="constant", value=None):
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode} (pad(): expected one of {list(_PAD_MODES)})")
    pairs = _pad_pairs(pad, input.ndim)
    if mode == "constant":
        return _constant_pad(input, pairs, 0 if value is None else value)
    if value is not None and value != 0:
        raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument (pad(): got value={value})")
    _check_nonconstant_pad(input, pad, mode)
    if mode == "reflect":
        _check_reflect_pad(input, pairs)
    if input.dtype is bool_ and mode != "circular":  # torch's reflection and replication kernels have no bool
        kernel = "reflection" if mode == "reflect" else "replication"
        raise NotImplementedError(f"\"{kernel}_pad{len(pad) // 2}d\" not implemented for 'Bool'")
    out = input
    crop_first = mode == "circular"  # torch wraps around the cropped input, but reflects the whole one
    for d, before, after in pairs:
        if crop_first:
            out = _cropped(out, d, before, after)
        parts = _PADDERS[mode](out, d, max(before, 0), max(after, 0))
        out = OPS["cat"](parts, d) if len(parts) > 1 else out
        if not crop_first:
            out = _cropped(out, d, before, after)
    # torch writes a fresh result: in the format the input suggests (reflect, replicate), or row-major (circular)
    memory_format = contiguous_format if mode == "circular" else suggest_memory_format(input)
    if out is input or out._base is not None:  # the input itself, or a view of it or of the joined parts
        return out.clone(memory_format=memory_format)
    return out.contiguous(memory_format=memory_format)


def _pad_autocast_on_cpu(op, args) -> str | None:
    """torch's CPU autocast list has its reflection_pad1d/2d and replication_pad1d/2d/3d kernels, which ``pad``
    reaches for those modes with 2, 4 (reflect) or 2, 4, 6 (replicate) padding values."""
    mode, pads = args[2], len(args[1])
    return "fp32" if (mode == "reflect" and pads in (2, 4)) or (mode == "replicate" and pads in (2, 4, 6)) else None


composite("pad(Tensor input, int[] pad, str mode=\"constant\", float? value=None) -> Tensor", _pad, functional=True,
          function=False, method=False, autocast={"cpu": _pad_autocast_on_cpu},
          doc="torch.nn.functional.pad: ``pad`` lists (before, after) pairs starting from the last dim; modes "
              "constant (negative values crop), reflect, replicate, circular.\n\n"
              ">>> F.pad(tw.ones(2, 2), (1, 1)).shape\ntilewise.Size([2, 4])", out=False)


# ---------------------------------------------------------------- repetition


def _repeat(self, repeats):
    if len(repeats) < self.ndim:
        raise RuntimeError(f"repeat(): number of repeat dims ({len(repeats)}) can not be smaller than number of "
                           f"tensor dims ({self.ndim}); got repeats {list(repeats)} for shape {list(self.shape)}")
    if any(r < 0 for r in repeats):
        raise RuntimeError(f"repeat(): repeats can not be negative, got {list(repeats)}")
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    interleaved = [size for pair in zip((1,) * len(shape), shape) for size in pair]
    expanded = [size for pair in zip(repeats, shape) for size in pair]
    out = self.reshape(interleaved).expand(expanded).reshape([r * s for r, s in zip(repeats, shape)])
    return _own_memory(out)


def _own_memory(out: Tensor) -> Tensor:
    """``out`` in memory of its own, as torch's repeat always returns: a reshape of an expanded size-1 dim is a
    view (with stride 0, or of the input itself when nothing repeats), which in-place writes must not reach."""
    if out._base is None:
        return out
    return out.clone() if out.is_contiguous() else out.contiguous()


def _tile(self, dims):
    return _repeat(self, (1,) * (self.ndim - len(dims)) + tuple(dims))


def _interleave_input(self, dim):
    if dim is None:
        return self.reshape(-1), 0
    if self.ndim == 0:  # torch repeats along a new dim after ``dim``, which a 0-dim tensor has no room for
        d = S.normalize_dim(dim, 0)
        raise IndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got {d + 1})")
    return self, S.normalize_dim(dim, self.ndim, "repeat_interleave")


def _repeat_interleave_int(self, repeats, dim=None, output_size=None):
    if repeats < 0:
        raise RuntimeError(f"repeat_interleave(): repeats can not be negative, got {repeats}")
    x, d = _interleave_input(self, dim)
    shape = tuple(x.shape)
    out = x.unsqueeze(d + 1).expand(shape[:d + 1] + (repeats,) + shape[d + 1:])
    out = out.reshape(shape[:d] + (shape[d] * repeats,) + shape[d + 1:])
    if output_size is not None and output_size != out.shape[d]:
        raise RuntimeError(f"repeat_interleave(): output_size {output_size} does not match the result's size "
                           f"{out.shape[d]} along dim {d}")
    return _own_memory(out)


def _repeat_interleave_tensor(self, repeats, dim=None, output_size=None):
    if isinstance(repeats, Number) or (repeats.numel() == 1 and repeats.ndim <= 1):
        return _repeat_interleave_int(self, int(repeats if isinstance(repeats, Number) else repeats.item()), dim,
                                      output_size)
    x, d = _interleave_input(self, dim)
    if repeats.ndim != 1 or repeats.shape[0] != x.shape[d]:
        raise RuntimeError(f"repeat_interleave(): repeats must be 1-D with one entry per element along dim {d} "
                           f"(size {x.shape[d]}), got repeats of shape {list(repeats.shape)}")
    positions = OPS["repeat_interleave.Tensor"](repeats, output_size=output_size)
    return OPS["index.Tensor"](x, (None,) * d + (positions,)).contiguous()  # row-major, as torch's index_select


composite("repeat(Tensor self, int[] repeats) -> Tensor", _repeat, function=False,
          doc="Tile the tensor ``repeats[k]`` times along each dim (new leading dims when ``repeats`` is longer).\n\n"
              ">>> tw.tensor([1, 2]).repeat(2)\ntensor([1, 2, 1, 2])")
composite("tile(Tensor self, int[] dims) -> Tensor", _tile, out=False)
composite("repeat_interleave.self_int(Tensor self, int repeats, int? dim=None, *, int? output_size=None) -> Tensor",
          _repeat_interleave_int,
          doc="Repeat each element ``repeats`` times along ``dim`` (of the flattened tensor when dim is None).\n\n"
              ">>> tw.tensor([1, 2]).repeat_interleave(2)\ntensor([1, 1, 2, 2])", out=False)
composite("repeat_interleave.self_Tensor(Tensor self, Tensor repeats, int? dim=None, *, int? output_size=None) -> "
          "Tensor", _repeat_interleave_tensor, out=False)
declare("repeat_interleave.Tensor(Tensor repeats, *, int? output_size=None) -> Tensor", "index",
        differentiable=False, doc="``arange(len(repeats))`` with element ``i`` repeated ``repeats[i]`` times, in "
                                  "repeats' dtype when it is int32 (as torch), else int64.", batch=dynamic_shape,
        out=False)


def check_repeats(repeats):
    """The dtype of ``repeat_interleave(repeats)``, after checking ``repeats`` is a 0-dim or 1-D integer tensor
    (shared by every backend's kernel, as is :func:`check_repeats_total`)."""
    from tilewise import dtypes

    if repeats.ndim > 1 or repeats.dtype.is_floating_point or repeats.dtype is dtypes.bool_:
        raise RuntimeError(f"repeat_interleave(): repeats must be a 0-dim or 1-dim integer tensor, got shape "
                           f"{list(repeats.shape)} and dtype {repeats.dtype}")
    return dtypes.int32 if repeats.dtype is dtypes.int32 else dtypes.int64


def check_repeats_total(total: int, smallest: int, output_size) -> None:
    """Refuse a negative repeat (``smallest``: the least entry, or 0) and an ``output_size`` that is not the
    sum of the repeats (``total``)."""
    if smallest < 0:
        raise RuntimeError(f"repeat_interleave(): repeats can not be negative, got {smallest}")
    if output_size is not None and output_size != total:
        raise RuntimeError(f"repeat_interleave(): output_size {output_size} does not match the sum of repeats "
                           f"{total}")


# ---------------------------------------------------------------- selection and updates by index


# Which index dtypes each operator takes, and torch's exception and words for any other.
_LONG_OR_INT = ("int32", "int64")
INDEX_DTYPE_RULES = {
    "index_select": (_LONG_OR_INT, RuntimeError, "Expected dtype int32 or int64 for index"),
    "index_add": (_LONG_OR_INT, RuntimeError, "Expected dtype int32/int64 for index but got: {c10}"),
    "index_reduce": (_LONG_OR_INT, RuntimeError, "Expected dtype int32/int64 for index but got: {c10}"),
    "index_copy": (("int64",), RuntimeError, "Expected a long tensor for index, but got {c10}"),
    "index_fill": (("int64",), IndexError, "Expected dtype int64 for index."),
    "take": (("int64",), RuntimeError, "Expected a long tensor for index, but got {c10}"),
    "put": (("int64",), RuntimeError, "Expected a long tensor for index, but got {c10}"),
}


def check_index_dtype(index, op: str) -> None:
    """Refuse an index of a dtype ``op`` does not take, as torch does (its exception type and words)."""
    allowed, error, words = INDEX_DTYPE_RULES[op]
    dtype = getattr(index, "dtype", None)
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}(): index must be a Tensor, got {type(index).__name__}")
    if dtype.name not in allowed:
        raise error(f"{op}(): {words.format(c10=c10_name(dtype))} (got {dtype.name}; valid index dtypes are "
                    f"{' and '.join(allowed)})")


def _index_vector(index, op: str) -> Tensor:
    if isinstance(index, Tensor) and index.ndim > 1:
        if op == "index_fill":
            raise RuntimeError(f"index_fill(): Index has to be a vector/scalar, got shape {list(index.shape)}")
        raise IndexError(f"{op}(): Index is supposed to be a vector (0-D or 1-D), got shape {list(index.shape)}")
    check_index_dtype(index, op)
    return index.reshape(-1)


def _along(self, dim, index, op: str) -> tuple[Tensor, int, tuple]:
    """(self as at least 1-D, the normalised dim, the index key selecting ``index`` along it)."""
    x = self.reshape(1) if self.ndim == 0 else self
    d = S.normalize_dim(dim, x.ndim, op)
    return x, d, (None,) * d + (_index_vector(index, op),)


def _index_bounds(index: Tensor) -> tuple[int, int] | None:
    """(least, greatest) entry of an index whose values can be read here (without a trace or a device sync)."""
    if not values_readable(index) or index.device.type != "cpu" or index.numel() == 0:
        return None
    return int(index.amin()), int(index.amax())


def check_index_range(index: Tensor, size: int, dim: int, op: str, error: type[Exception] = IndexError) -> None:
    """Indices must lie in [0, size): unlike ``x[index]``, these operators do not wrap negative indices (torch
    refuses them with IndexError, "index out of range in self"; index_add of 2-D or more with RuntimeError,
    ``error``). Checked
    here where the values can be read; elsewhere the indexing kernel refuses them when the composite runs it under
    ``_index_errors_named(op, negative_wraps=False)`` (a CUDA kernel reports them at the next synchronisation)."""
    bounds = _index_bounds(index)
    if bounds is None:
        return
    low, high = bounds
    if low < 0 or high >= size:
        valid = f"0..{size - 1}" if size else "none (the dimension is empty)"
        raise error(f"{op}(): index out of range in self: index {low if low < 0 else high} is out of bounds "
                         f"for dimension {dim} with size {size}; valid indices are {valid} (negative indices are "
                         "not counted from the end)")


def check_flat_range(index: Tensor, numel: int, op: str) -> None:
    """take/put: an index into the flattened tensor lies in [-numel, numel), as torch's IndexError says."""
    bounds = _index_bounds(index)
    if bounds is None:
        return
    for value in bounds:
        if not -numel <= value < numel:
            valid = f"{-numel}..{numel - 1}" if numel else "none (the tensor is empty)"
            raise IndexError(f"{op}(): out of range: tried to access index {value} on a tensor of {numel} elements "
                             f"(valid indices are {valid})")


def _check_source(x: Tensor, d: int, index: Tensor, source, op: str, self_ndim: int) -> Tensor:
    if not isinstance(source, Tensor):
        raise TypeError(f"{op}(): source must be a Tensor, got {type(source).__name__}")
    if op in ("index_add", "index_reduce") and source.ndim != self_ndim:
        raise RuntimeError(f"{op}(): source tensor shape must match self tensor shape, excluding the specified "
                           f"dimension. Got self.shape = {list(x.shape) if self_ndim else []} source.shape = "
                           f"{list(source.shape)} (both need the same number of dims)")
    src = source.reshape(1) if source.ndim == 0 else source
    expected = x.shape[:d] + (index.numel(),) + x.shape[d + 1:]
    if tuple(src.shape) != expected:
        raise RuntimeError(f"{op}(): source of shape {list(source.shape)} does not fit: selecting {index.numel()} "
                           f"indices along dim {d} of self {list(x.shape)} needs a source of shape {list(expected)}")
    if source.dtype is not x.dtype:
        raise RuntimeError(f"{op}(): self ({x.dtype}) and source ({source.dtype}) must have the same dtype")
    return src


def _index_select(self, dim, index):
    x, d, key = _along(self, dim, index, "index_select")
    check_index_range(key[-1], x.shape[d], d, "index_select")
    with _index_errors_named("index_select", negative_wraps=False):
        out = OPS["index.Tensor"](x, key).contiguous()  # row-major, as torch's (indexing keeps x's order)
    return out.reshape(()) if self.ndim == 0 else out


def _index_update(self, dim, index, source, accumulate: bool, op: str):
    x, d, key = _along(self, dim, index, op)
    src = _check_source(x, d, key[-1], source, op, self.ndim)
    # torch's index_add refuses a bad index into a tensor of two or more dims with RuntimeError
    check_index_range(key[-1], x.shape[d], d, op, RuntimeError if op == "index_add" and x.ndim > 1 else IndexError)
    with _index_errors_named(op, negative_wraps=False):  # row-major, as torch's (index_put keeps x's order)
        return OPS["index_put"](x, key, src, accumulate).reshape(self.shape).contiguous()


def _index_add(self, dim, index, source, alpha=1):
    if isinstance(alpha, float) and isinstance(self, Tensor) and not (self.dtype.is_floating_point or
                                                                       self.dtype.is_complex):
        alpha = int(alpha)  # torch's integer kernels take alpha's integer part (alpha.to<int64_t>())
    return _index_update(self, dim, index, source if alpha == 1 else source * alpha, True, "index_add")


def _index_copy(self, dim, index, source):
    return _index_update(self, dim, index, source, False, "index_copy")


def _index_fill(self, dim, index, value):
    if isinstance(value, Tensor) and value.ndim != 0:
        raise RuntimeError(f"index_fill(): only supports a 0-dimensional value tensor, but got a tensor of shape "
                           f"{list(value.shape)}")
    x, _, key = _along(self, dim, index, "index_fill")
    fill = value.to(x.dtype) if isinstance(value, Tensor) else checked_scalar(value, x.dtype, "index_fill")
    with _index_errors_named("index_fill"):
        return OPS["index_put"](x, key, fill, False).reshape(self.shape)


def _take(self, index):
    check_index_dtype(index, "take")
    check_flat_range(index, self.numel(), "take")
    with _index_errors_named("take"):
        return OPS["index.Tensor"](self.reshape(-1), (index,)).contiguous()  # row-major, as torch's


def _take_along_dim(self, indices, dim=None):
    if dim is None:  # torch gathers from the flattened tensor: gather's dtypes, and no wrapping
        with _index_errors_named("take_along_dim"):
            return self.reshape(-1).gather(0, indices.reshape(-1))
    if self.ndim != indices.ndim:
        raise RuntimeError(f"take_along_dim(): input and indices should have the same number of dimensions, but got "
                           f"{self.ndim} dimensions for input, and {indices.ndim} dimensions for indices (shapes "
                           f"{list(self.shape)} and {list(indices.shape)})")
    if indices.dtype is not int64:
        raise RuntimeError(f"take_along_dim(): dtype of indices should be Long but got {c10_name(indices.dtype)} "
                           "(convert them with .long())")
    d = S.normalize_dim(dim, self.ndim, "take_along_dim")
    if self.ndim == 0:
        raise IndexError("take_along_dim(): Dimension specified as 0 but tensor has no dimensions (a 0-dim input "
                         "takes dim=None)")
    other = S.broadcast_shapes(self.shape[:d] + (1,) + self.shape[d + 1:],
                               indices.shape[:d] + (1,) + indices.shape[d + 1:], op="take_along_dim")
    source = self.expand(other[:d] + (self.shape[d],) + other[d + 1:])
    broadcast = indices.expand(other[:d] + (indices.shape[d],) + other[d + 1:])
    # torch wraps every index into [0, size) (not only the negative ones) before it gathers
    return source.gather(d, broadcast.remainder(self.shape[d]))


def _check_mask(mask, op: str) -> None:
    if not isinstance(mask, Tensor) or mask.dtype.name != "bool":
        raise RuntimeError(f"{op}(): expected a bool mask tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")


def _masked_select(self, mask):
    _check_mask(mask, "masked_select")
    shape = S.broadcast_shapes(self.shape, mask.shape, op="masked_select")
    flat = (-1,) if not shape else shape
    return self.expand(shape).reshape(flat)[mask.expand(shape).reshape(flat)]


def _masked_scatter(self, mask, source):
    _check_mask(mask, "masked_scatter")
    if source.dtype is not self.dtype:
        raise RuntimeError(f"masked_scatter(): self ({self.dtype}) and source ({source.dtype}) must have the same "
                           "dtype")
    shape = S.broadcast_shapes(self.shape, mask.shape, op="masked_scatter")
    flat_mask = mask.expand(shape).reshape(-1)
    if values_readable(mask):
        count = int(flat_mask.sum())
        if source.numel() < count:
            raise RuntimeError(f"masked_scatter(): Number of elements of source < number of ones in mask: the mask "
                               f"selects {count} elements but source has only {source.numel()} (shape "
                               f"{list(source.shape)})")
    # the k-th selected position takes source's k-th element: a gather at the running count of the mask, with no
    # data-dependent size, so that vmap batches it and a compiled program keeps it on the device
    values = source.reshape(-1) if source.numel() else source.new_zeros((1,))
    picked = values.gather(0, _running_positions(flat_mask, values.shape[0]))
    return picked.where(flat_mask, self.expand(shape).reshape(-1)).reshape(shape)


def _running_positions(flat_mask, size: int):
    """For each True of a flat mask, how many Trues precede it (clamped into [0, size), so that the positions where
    the mask is False, which nothing reads, stay in range)."""
    return (flat_mask.to(int64).cumsum(0) - 1).clamp(0, max(size - 1, 0))


def masked_scatter_backward(grad, mask, source_shape):
    """torch's: the gradients at the positions the mask selects, in row-major order, into a zero tensor of the
    source's shape; added at the running positions, with no data-dependent size (vmap batches it)."""
    from tilewise.ops.creation import zeros

    count = math.prod(source_shape)
    flat_mask = mask.expand(grad.shape).reshape(-1)
    kept = grad.reshape(-1).where(flat_mask, 0)
    total = zeros((max(count, 1),), dtype=grad.dtype, device=grad.device)
    total = total.scatter_add(0, _running_positions(flat_mask, count), kept)
    return total.narrow(0, 0, count).reshape(source_shape)


HELPERS.update(masked_scatter_backward=masked_scatter_backward)


composite("index_select(Tensor self, int dim, Tensor index) -> Tensor", _index_select,
          doc="The slices ``index`` names along ``dim``.\n\n"
              ">>> tw.arange(6).view(2, 3).index_select(1, tw.tensor([2, 0]))\ntensor([[2, 0],\n        [5, 3]])",
          batch=index_select_rule)
composite("index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor", _index_add,
          grad={"self": "grad", "source": "index_source_backward(grad, dim, index, source, alpha)", "index": None},
          fwd="auto_linear", inplace=True,
          doc="``self`` with ``alpha * source`` added into the slices ``index`` names along ``dim``.")
composite("index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor", _index_copy,
          grad={"self": "grad.index_fill(dim, index, 0)", "source": "index_source_backward(grad, dim, index, source)",
                "index": None}, fwd="auto_linear", inplace=True, autocast={"cpu": "promote"})
composite("index_fill(Tensor self, int dim, Tensor index, Tensor value) -> Tensor", _index_fill, inplace=True,
          out=False)
composite("take(Tensor self, Tensor index) -> Tensor", _take, grad={"self": "take_backward(grad, self, index)",
                                                                   "index": None}, fwd="auto_linear",
          doc="Elements of the flattened tensor at ``index`` (negative indices count from the end).")
composite("take_along_dim(Tensor self, Tensor indices, int? dim=None) -> Tensor", _take_along_dim)
composite("masked_select(Tensor self, Tensor mask) -> Tensor", _masked_select,
          doc="The elements where the (broadcast) mask is True, as a 1-D tensor.")
composite("masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor", _masked_scatter, inplace=True,
          grad={"self": "grad.masked_fill(mask, 0)", "mask": None,
                "source": "masked_scatter_backward(grad, mask, source_shape)"}, fwd="auto_linear",
          doc="``self`` with the positions where ``mask`` is True filled from ``source`` in row-major order.",
          out=False)


# ---------------------------------------------------------------- triangles, diagonals, splits


def _triangle_mask(x: Tensor, diagonal: int, op: str, upper: bool) -> Tensor:
    from tilewise.ops.creation import arange

    if x.ndim < 2:
        raise RuntimeError(f"{op}(): input tensor must have at least 2 dimensions, got shape {list(x.shape)}")
    rows, cols = x.shape[-2:]
    offset = arange(cols, device=x.device) - arange(rows, device=x.device).unsqueeze(1)
    return offset < diagonal if upper else offset > diagonal


def _tril(self, diagonal=0):
    return self.masked_fill(_triangle_mask(self, diagonal, "tril", upper=False), 0)


def _triu(self, diagonal=0):
    return self.masked_fill(_triangle_mask(self, diagonal, "triu", upper=True), 0)


def _diag_embed(self, offset=0, dim1=-2, dim2=-1):
    from tilewise.ops.creation import zeros
    from tilewise.ops.views import view_geometry

    if self.ndim == 0:
        raise RuntimeError("diag_embed(): expected a tensor with at least 1 dimension, got a 0-dim tensor")
    d1, d2 = S.normalize_dim(dim1, self.ndim + 1, "diag_embed"), S.normalize_dim(dim2, self.ndim + 1, "diag_embed")
    if d1 == d2:
        raise RuntimeError(f"diag_embed(): diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = self.shape[-1] + abs(offset)
    shape = list(self.shape[:-1])
    for d in sorted((d1, d2)):
        shape.insert(d, n)
    geometry = view_geometry("diagonal", tuple(shape), offset, d1, d2)
    return OPS["view_scatter"](zeros(shape, dtype=self.dtype, device=self.device), self, *geometry)


def _diag(self, diagonal=0):
    if self.ndim == 1:
        return _diag_embed(self, diagonal, 0, 1)
    if self.ndim == 2:
        return self.diagonal(diagonal).clone()
    raise RuntimeError(f"diag(): expected a 1-D or 2-D tensor, got shape {list(self.shape)}")


def _trace(self):
    if self.ndim != 2:
        raise RuntimeError(f"trace(): expected a matrix (2-D tensor), got shape {list(self.shape)}")
    return self.diagonal().sum()


def _tensor_split_dim(self, dim) -> int:
    if self.ndim == 0:
        raise RuntimeError("tensor_split(): expected at least a 1-dimensional tensor, got a 0-dim tensor")
    return S.normalize_dim(dim, self.ndim, "tensor_split")


def _tensor_split_sections(self, sections, dim=0):
    d = _tensor_split_dim(self, dim)
    if sections <= 0:
        raise RuntimeError(f"tensor_split(): number of sections must be larger than 0, got {sections}")
    size, extra = divmod(self.shape[d], sections)
    bounds = [0]
    for k in range(sections):
        bounds.append(bounds[-1] + size + (k < extra))
    return tensor_split_at(self, d, bounds)


def _tensor_split_indices(self, indices, dim=0):
    d = _tensor_split_dim(self, dim)
    return tensor_split_at(self, d, [0, *indices, None])


def _meshgrid(tensors, indexing=None):
    tensors = _check_tensors(tensors, "meshgrid")
    if indexing is None:
        warn_once("torch.meshgrid: in an upcoming release, it will be required to pass the indexing argument.")
    indexing = indexing or "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    for k, t in enumerate(tensors):
        if t.ndim > 1:
            raise RuntimeError(f"meshgrid(): expects all tensors to have 0 or 1 dimensions, but tensor {k} has shape "
                               f"{list(t.shape)}")
        if t.dtype is not tensors[0].dtype:
            raise RuntimeError(f"meshgrid(): expects all tensors to have the same dtype, got {tensors[0].dtype} and "
                               f"{t.dtype}")
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        order[0], order[1] = 1, 0
    shape = [tensors[k].numel() for k in order]
    grids = []
    for k, t in enumerate(tensors):
        axis = order.index(k)
        grids.append(t.reshape([-1 if a == axis else 1 for a in range(len(tensors))]).expand(shape))
    return tuple(grids)


composite("tril(Tensor self, int diagonal=0) -> Tensor", _tril, inplace=True,
          doc="Keep the elements on and below the ``diagonal``-th diagonal of the last two dims, zero the rest.")
composite("triu(Tensor self, int diagonal=0) -> Tensor", _triu, inplace=True,
          doc="Keep the elements on and above the ``diagonal``-th diagonal of the last two dims, zero the rest.")
composite("diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1) -> Tensor", _diag_embed,
          doc="Matrices (in dims ``dim1``, ``dim2``) whose ``offset``-th diagonal holds the last dim of ``self``.",
          out=False)
composite("diag(Tensor self, int diagonal=0) -> Tensor", _diag,
          doc="A 1-D tensor's diagonal matrix, or a copy of a matrix's diagonal.\n\n"
              ">>> tw.diag(tw.tensor([1, 2]))\ntensor([[1, 0],\n        [0, 2]])")
composite("trace(Tensor self) -> Tensor", _trace, autocast={"cpu": "fp32"}, out=False)
composite("tensor_split.sections(Tensor self, int sections, int dim=0) -> Tensor[]", _tensor_split_sections,
          inline=True, out=False)
composite("tensor_split.indices(Tensor self, int[] indices, int dim=0) -> Tensor[]", _tensor_split_indices,
          inline=True, out=False)
composite("meshgrid(Tensor[] tensors, *, str? indexing=None) -> Tensor[]", _meshgrid, method=False, varargs=True,
          doc="Coordinate grids from 1-D tensors (``indexing='ij'``: matrix order, ``'xy'``: Cartesian).", out=False)
