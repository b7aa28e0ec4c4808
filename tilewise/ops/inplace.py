"""In-place operators, derived from their out-of-place form: compute, check, write back, rebase history.

``x.add_(y)`` runs ``add(x, y)`` through the dispatcher (so autograd records an ordinary node), checks that
the result fits ``x`` (shape and dtype, with torch's messages), writes it into ``x``'s memory, bumps the
storage version, and makes the node the new ``grad_fn`` of ``x``. When the node will save ``x`` itself,
the op is given a clone, because the write would otherwise invalidate the saved value.

[Note: in-place writes] A backend may skip the write-back: the op's first call is offered the target
(``STATE.into``), and a backend with ``run_into`` (CUDA's pointwise kernels) writes the result straight into it
when the result would have the target's shape, strides and dtype and no other input shares the target's memory;
one kernel instead of two, and no temporary. ``commit`` then only bumps the version. Where autograd records the
op, the target is offered only when the node will not keep what it held (the op saves no ``self``: ``relu_``,
``add_``, not ``mul_``), the target is no view and no saved-tensor hooks are active; the recorded node then takes
the target as its output (``autograd.graph.record``, which also declines when the call would make no new node or
could be refused after the write), and its saved result takes the version the write gave it.

[Note: watched views] Some views carry torch's creation meta (``Tensor._view_meta``: the version of their memory
when made, and a kind), because what an in-place write means for them depends on how they were made:
  ``MULTIPLE``   outputs of split, split_with_sizes, chunk and unbind, which share one autograd node whose backward
                 concatenates their gradients (and views of them): no in-place write under grad mode ("is a view
                 and is being modified inplace. This view is the output of a function that returns multiple
                 views"), and, once their memory was written by anything else, no use by autograd either;
  ``CUSTOM_FUNCTION`` the same, with torch's reason, for the outputs of an autograd.Function that are views (made
                 in its forward, or an input it returned as-is): a write through them would bypass its backward;
  ``REGENERATE`` every other view made under grad mode of a tensor that requires grad, and the outputs of
                 tensor_split (one node for the group, as split's, but torch's are separate slices that may be
                 written): used by autograd after their memory was written (through the base, another view, or
                 under no_grad), they become a fresh strided view of their base first, whose history holds the
                 write (torch's view regeneration; without it ``v = b[:2]; b.mul_(3)`` gave ``v`` the gradient
                 of the values before the write);
  ``NO_GRAD``    views made under no_grad: they require grad through their base alone (no grad_fn and no gradient
                 accumulator of their own: a gradient reaching them goes nowhere, as torch's; ``requires_grad``
                 follows the base's flag, as any view's without a grad_fn does), and, while their base requires grad
                 (from the start, or given history by an in-place write later), take no in-place write that records,
                 nor, once their memory was written since they were made, any use by autograd: torch refuses
                 ``with no_grad(): v = b[:2]`` then ``b.mul_(w)`` then ``v * 2``, where regenerating ``v`` from ``b``
                 would silently record a write made outside the block that made ``v``;
  ``INFERENCE``  the same, made in inference mode (of a tensor that is no inference tensor), in torch's words.
A view of a watched view is watched alike (under no_grad it becomes ``NO_GRAD``, in inference mode ``INFERENCE``,
as torch propagates the meta). Autograd checks the version whenever it takes such a view as an input
(``autograd.graph.check_view_history``).
"""

from __future__ import annotations

import re

from tilewise import dispatch
from tilewise import strides as S
from tilewise.dispatch import STATE
from tilewise.dtypes import c10_name, castable
from tilewise.tensor import INFERENCE_INPLACE, Tensor, tensor


def _any_requires_grad(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if type(a) is Tensor and a.requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(type(b) is Tensor and b.requires_grad for b in a):
            return True
    return False


def check_no_internal_overlap(self: Tensor, name: str) -> None:
    """torch refuses to write in place into a tensor whose elements share memory (an expanded tensor): the
    result would depend on the order of the writes."""
    if 0 in self._strides and 0 not in self._shape and \
            any(stride == 0 and size > 1 for size, stride in zip(self._shape, self._strides)):  # empty: no element
        raise RuntimeError(f"{name}: unsupported operation: more than one element of the written-to tensor refers "
                           f"to a single memory location (a tensor of shape {list(self._shape)} with strides "
                           f"{list(self._strides)}). Please clone() the tensor before performing the operation.")


# kinds of watched views (see the note)
MULTIPLE, REGENERATE, NO_GRAD, INFERENCE = "multiple", "regenerate", "no_grad", "inference"
CUSTOM_FUNCTION = "custom_function"
_MULTIPLE_VIEWS = ("This view is the output of a function that returns multiple views. Such functions do not allow the "
                   "output views to be modified inplace. You should replace the inplace operation by an out-of-place "
                   "one.")
# the views no in-place write may change, and why (torch's words)
_WRITE_REFUSED = {
    MULTIPLE: _MULTIPLE_VIEWS,
    CUSTOM_FUNCTION: "This view was created inside a custom Function (or because an input was returned as-is) and the "
                     "autograd logic to handle view+inplace would override the custom backward associated with the "
                     "custom Function, leading to incorrect gradients. This behavior is forbidden. You can fix this by "
                     "cloning the output of the custom Function.",
}
# a view made under no_grad or in inference mode: (where it was made, the mode a write is refused in, the block)
_MADE_WHERE = {NO_GRAD: ("no_grad mode", "with grad mode enabled", "no_grad"),
               INFERENCE: ("inference mode", "in normal mode", "inference_mode")}


def _ambiguous(block: str) -> str:
    return ("Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by "
            f"moving both the view and the inplace either both inside the {block} block (if you don't want the "
            "inplace to be tracked) or both outside (if you want the inplace to be tracked).")


def short_node_name(name: str) -> str:
    """A node's name as torch's errors give it: ``MulBackward0`` -> ``Mul``, ``PowBackward1`` -> ``Pow1``."""
    return re.sub(r"Backward(\d*)$", lambda m: "" if m[1] == "0" else m[1], name)


def watch_view(view: Tensor, kind: str) -> None:
    """Watch ``view`` from now on (see [Note: watched views])."""
    view.__dict__["_view_meta"] = (view._write_count(), kind)


def requires_grad_through_base_alone(t: Tensor) -> bool:
    """Whether ``t`` requires grad through its base alone: a view with no grad_fn and no flag of its own whose base
    requires grad now (made under no_grad or in inference mode of a tensor that requires grad, or of one that came
    to require grad later). It has no gradient accumulator: a gradient that reaches it goes nowhere, as in torch."""
    base = t._base
    return base is not None and base._requires_grad and not t._requires_grad


def check_view_write(self: Tensor, name: str) -> None:
    """torch's refusals of an in-place write under grad mode into a watched view."""
    kind = self._view_meta[1]
    if kind in _MADE_WHERE:
        made, refused_in, block = _MADE_WHERE[kind]
        node = self._grad_fn
        which = "A view was" if node is None else \
            f"Output {self._output_nr} of {short_node_name(node.name())} is a view of a view which was"
        raise RuntimeError(f"{name}: {which} created in {made} and is being modified inplace {refused_in}. "
                           f"{_ambiguous(block)}")
    if kind in _WRITE_REFUSED and self._grad_fn is not None:
        raise RuntimeError(f"{name}: Output {self._output_nr} of {short_node_name(self._grad_fn.name())} is a view and "
                           f"is being modified inplace. {_WRITE_REFUSED[kind]}")


def stale_view_error(view: Tensor) -> RuntimeError:
    """torch's refusal to use a watched view whose memory was written since it was made."""
    if view._view_meta[1] in _MADE_WHERE:
        made, refused_in, block = _MADE_WHERE[view._view_meta[1]]
        return RuntimeError(f"A view was created in {made} and its base or another view of its base has been modified "
                            f"inplace {refused_in}. {_ambiguous(block)}")
    node = short_node_name(view._grad_fn.name()) if view._grad_fn is not None else "a function"
    return RuntimeError(f"Output {view._output_nr} of {node} is a view and its base or another view of its base has "
                        f"been modified inplace. {_WRITE_REFUSED[view._view_meta[1]]}")


def written_outside_inference(self: Tensor) -> bool:
    """Whether writing into ``self`` now would change an inference tensor outside inference mode (see
    [Note: inference tensors] in ``storage.py``): for a normal tensor, one read of a class default."""
    storage = self._storage
    return storage is not None and storage.inference and not STATE.inference


def check_inference_write(self: Tensor) -> None:
    """torch's refusal of an in-place change to an inference tensor outside inference mode."""
    if written_outside_inference(self):
        raise RuntimeError(INFERENCE_INPLACE)


def check_inplace_allowed(self: Tensor, name: str) -> None:
    if self._view_meta is not None:
        check_view_write(self, name)
    if self._grad_fn is None and self._requires_grad and self._base is None:
        raise RuntimeError(f"{name}: a leaf Variable that requires grad is being used in an in-place operation; "
                           "wrap it in `with tilewise.no_grad():` or use the out-of-place form")
    base = self._base
    if base is not None and base._grad_fn is None and base._requires_grad:
        raise RuntimeError(f"{name}: a view of a leaf Variable that requires grad is being used in an in-place "
                           "operation; wrap it in `with tilewise.no_grad():` or clone() the leaf first")
    if base is not None and memory_order(base) is None:
        raise RuntimeError(f"{name}: in-place writes through a view need a base that covers its memory densely from "
                           f"its start to be recorded for autograd (the base has shape {list(base._shape)}, strides "
                           f"{list(base._strides)}, offset {base._offset}); call .contiguous() on the base first")


def memory_order(base: Tensor) -> tuple | None:
    """The permutation of ``base``'s dims that lays it out row-major in its memory: () for a row-major base,
    (0, 2, 3, 1) for a channels-last one; None when there is none (gaps, overlaps, an offset), where views'
    storage geometry cannot be replayed on the base's values."""
    return S.dense_order(base._shape, base._strides) if base._offset == 0 else None


def row_major(base: Tensor) -> tuple[Tensor, tuple]:
    """``base`` seen row-major in its memory (a recorded permute, for a base that is not already) and that
    permutation (see ``memory_order``), over which views' storage geometry addresses the base's values."""
    from tilewise.ops.registry import OPS

    order = memory_order(base)
    if order is None:
        raise RuntimeError(f"a view's base of shape {list(base._shape)}, strides {list(base._strides)}, offset "
                           f"{base._offset} does not cover its memory densely from its start")
    return (base if not order else OPS["permute"](base, order)), order


def rebase_view_history(view: Tensor, result: Tensor) -> None:
    """An in-place write through a view changes its base: record it as ``base = view_scatter(base, result)``
    and make the view a fresh strided view of the new base (torch's CopySlices, in two ordinary ops). A base
    that is not row-major (channels-last) is scattered into through its row-major permutation."""
    from tilewise.ops.registry import OPS

    base = view._base
    geometry = (view._shape, view._strides, view._offset)
    dense, order = row_major(base)
    if view._dtype is dense._dtype:
        new_dense = OPS["view_scatter"](dense, result, *geometry)
    elif dense._dtype.is_complex:  # the real parts of a complex base (view_as_real): scattered into its parts
        new_dense = OPS["view_as_complex"](OPS["view_scatter"](OPS["view_as_real"](dense), result, *geometry))
    else:  # a complex view of a real base (view_as_complex): its parts scattered into the base
        new_dense = OPS["view_scatter"](dense, OPS["view_as_real"](result), *_parts_geometry(*geometry))
    if order:
        inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
        new_base = OPS["permute"](new_dense, inverse)
    else:
        new_base = new_dense
    base._grad_fn, base._output_nr, base._requires_grad = new_base._grad_fn, new_base._output_nr, True
    new_view = strided_view(row_major(base)[0], view)
    view._grad_fn, view._output_nr, view._requires_grad = new_view._grad_fn, new_view._output_nr, True


def _parts_geometry(shape, strides, offset) -> tuple:
    """A complex view's geometry over the real parts of its storage (view_as_real's)."""
    return tuple(shape) + (2,), tuple(2 * s for s in strides) + (1,), 2 * offset


def strided_view(source: Tensor, view: Tensor) -> Tensor:
    """``view``'s geometry taken afresh from ``source`` (its base, row-major), as a recorded ``as_strided``: in the
    view's dtype, which may read the base's bytes as their real parts (view_as_real of a complex base) or as
    complex pairs (view_as_complex of a real base)."""
    from tilewise.ops.registry import OPS

    if view._dtype is source._dtype:
        return OPS["as_strided"](source, view._shape, view._strides, view._offset)
    if source._dtype.is_complex and view._dtype is source._dtype.to_real():
        return OPS["as_strided"](OPS["view_as_real"](source), view._shape, view._strides, view._offset)
    if view._dtype.is_complex and source._dtype is view._dtype.to_real():
        parts = OPS["as_strided"](source, *_parts_geometry(view._shape, view._strides, view._offset))
        return OPS["view_as_complex"](parts)
    raise RuntimeError(f"a view that reads its base's bytes as {view._dtype.name} (the base is "
                       f"{source._dtype.name}) cannot be made afresh from its base after an in-place write; take "
                       "the view again after the write")


def make_inplace(fn, name: str):
    from tilewise.ops.registry import OVERLOADS

    # a composite records its primitives, which may save ``self`` (index_reduce_'s scatter_reduce, clamp_min_'s)
    saves_self = any("self" in op.saved_params or (op.kind == "composite" and not op.derivatives)
                     for op in OVERLOADS[name])

    def inplace(self, *args, **kwargs):
        check_no_internal_overlap(self, f"{name}_")
        recording = STATE.grad_enabled and (self.requires_grad or _any_requires_grad(args, kwargs))
        if recording:
            check_inplace_allowed(self, f"{name}_")
        dual = bool(dispatch.dual_levels)  # a tangent rule may read ``self`` after the write: give it the value
        # the node keeps the value ``self`` had before the write, whether or not ``self`` requires grad: the
        # derivative for another input may read it (``x.mul_(w)`` with only ``w`` requiring grad), as torch's
        # in-place operators keep ``original_self``
        source = self.clone() if (recording or dual) and saves_self else self
        autocast, STATE.autocast = STATE.autocast, None  # torch's autocast lists no in-place op
        if not STATE.trace_depth and not STATE.vmap and not dual and not written_outside_inference(self) \
                and (not recording or source is self and self._base is None and self._view_meta is None
                     and not STATE.saved_tensor_hooks):  # (commit refuses an inference write, after torch's checks)
            STATE.into = (self, name)
        try:
            result = fn(source, *args, **kwargs)
        finally:
            STATE.autocast = autocast
            STATE.into = None
        commit(self, result, f"{name}_")
        if recording and result is self:
            _saved_after_write(self)
        elif (recording and result._dtype is self._dtype and result._requires_grad
                and all(result is not a for a in args)):
            _save_written(self, result)
        return self

    inplace.__name__ = f"{name}_"
    return inplace


def shares_read_only_array(t: Tensor) -> bool:
    """Whether ``t``'s memory is a numpy array marked read-only (from_numpy/as_tensor of one)."""
    flags = getattr(getattr(t._storage, "data", None), "flags", None)
    return flags is not None and not flags.writeable


def read_only_error(name: str, t: Tensor) -> RuntimeError:
    return RuntimeError(f"{name}: cannot write into a tensor of shape {list(t._shape)} whose memory is a read-only "
                        "numpy array (given to from_numpy or as_tensor); copy it first, e.g. tilewise.tensor(array) "
                        "or array.copy()")


def commit(self: Tensor, result: Tensor, name: str, allow_any_cast: bool = False) -> Tensor:
    """Write ``result`` into ``self`` and hand it ``result``'s autograd identity."""
    if result is self:  # written in place already (see [Note: in-place writes])
        self._bump_version()
        return self
    from tilewise.ops.registry import OPS  # (below the common case above: an import is not free)

    if result._shape != self._shape:
        raise RuntimeError(f"{name}: output with shape {list(self._shape)} doesn't match the broadcast shape "
                           f"{list(result._shape)}")
    check_inference_write(self)
    _take_tangents(self, result)
    if result._dtype is not self._dtype:
        if not allow_any_cast and not castable(result._dtype, self._dtype):
            raise RuntimeError(f"result type {c10_name(result._dtype)} can't be cast to the desired output type "
                               f"{c10_name(self._dtype)} ({name}: its {result._dtype.name} result cannot be written "
                               f"into a tensor of dtype {self._dtype.name})")
        result = result.to(self._dtype)
    if STATE.grad_enabled:
        if result._requires_grad or self.requires_grad:  # a write that records: torch's refusals (none otherwise)
            check_inplace_allowed(self, name)
        if self.requires_grad and not result._requires_grad:
            # values that need no gradient written over a tensor that does (``fill_``, ``zero_``, ``copy_`` of a
            # constant): the write is recorded, so no gradient reaches what ``self`` held before
            result = OPS["_overwrite"](self, result)
    prev = STATE.grad_enabled
    STATE.grad_enabled = False
    try:
        OPS["_write_"](self, result)
    except ValueError:
        if shares_read_only_array(self):
            raise read_only_error(name, self) from None
        raise
    finally:
        STATE.grad_enabled = prev
    recorded = prev and result._requires_grad
    if recorded:
        if self._base is not None:
            rebase_view_history(self, result)
        else:
            self._grad_fn, self._output_nr, self._requires_grad = result._grad_fn, result._output_nr, True
    self._bump_version()
    if recorded and self._view_meta is not None:  # its history now holds this write: it is current again
        watch_view(self, self._view_meta[1])
    return self


def _save_written(self: Tensor, result: Tensor) -> None:
    """After an in-place operator wrote ``result``, the temporary it computed, into ``self``: a node that saved
    that result (``relu_``'s, ``sigmoid_``'s) keeps ``self`` instead, as torch's in-place operators do: the same
    values, written now, so the temporary is freed (an in-place activation held a copy of its output for backward:
    a ResNet's ``ReLU(inplace=True)`` saved a third more activation memory than torch) and a later in-place write
    to ``self`` is refused at backward as torch refuses it. Only for the operator's own temporary: ``copy_`` of
    a tensor the caller holds leaves that tensor's node as it is."""
    if self._storage is None or result._storage is None or dispatch.dual_levels:  # traced or batched tensors, or
        return  # forward AD (the saved value carries tangents)
    entry = _saved_result(result._grad_fn, result._storage)
    if entry is not None:
        entry.tensor = self.detach()
        entry.version = self._storage.version - self._storage.untracked


def _saved_after_write(self: Tensor) -> None:
    """After an in-place operator recorded its node with ``self`` as the output it wrote directly: the node's saved
    output (``relu_``'s) holds the value written, so it takes the version the write gave ``self``."""
    entry = _saved_result(self._grad_fn, self._storage)
    if entry is not None:
        entry.version = self._storage.version - self._storage.untracked


def _saved_result(node, storage):
    """The node's saved output held as it is (no pack hook) in ``storage``, if it saved one."""
    saved = getattr(node, "saved", None)
    entry = saved.get("result") if saved else None
    if (entry is None or isinstance(entry, tuple) or not entry.is_output or entry.unpack_hook is not None
            or entry.tensor is None or entry.tensor._storage is not storage):
        return None
    return entry


def _take_tangents(self: Tensor, result: Tensor) -> None:
    """Forward AD: the written tensor's tangents become the result's (none where the result has none)."""
    if dispatch.dual_levels:
        dispatch.forward_ad_write(self, result)


def copy_into(self, src, name: str, non_blocking: bool = False):
    """``self.copy_(src)`` without refusing an expanded ``self`` (torch's fill_ and zero_ write one value to
    every element, so they may)."""
    if not isinstance(src, Tensor):
        src = tensor(src, dtype=self.dtype, device=self.device)
    value = src
    if value.device != self.device:
        value = value.to(self.device, non_blocking=non_blocking)
    if value.dtype is not self.dtype:
        value = value.to(self.dtype)
    if value.shape != self.shape:
        value = value.expand(self.shape)
    return commit(self, value, name, allow_any_cast=True)
