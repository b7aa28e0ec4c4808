"""In-place operators, derived from their out-of-place form: compute, check, write back, rebase history.

``x.add_(y)`` runs ``add(x, y)`` through the dispatcher (so autograd records an ordinary node), checks that
the result fits ``x`` (shape and dtype, with torch's messages), writes it into ``x``'s memory, bumps the
storage version, and makes the node the new ``grad_fn`` of ``x``. When the node will save ``x`` itself,
the op is given a clone, because the write would otherwise invalidate the saved value.

[Note: in-place writes] With nothing to record, a backend may skip the write-back: the op's first call is
offered the target (``STATE.into``), and a backend with ``run_into`` (CUDA's pointwise kernels) writes the
result straight into it when the result would have the target's shape, strides and dtype and no other input
shares the target's memory; one kernel instead of two, and no temporary. ``commit`` then only bumps the version.
"""

from __future__ import annotations

from tilewise import dispatch
from tilewise.dispatch import STATE
from tilewise.dtypes import castable
from tilewise.tensor import INFERENCE_INPLACE, Tensor, tensor


def _any_requires_grad(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if type(a) is Tensor and a._requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(type(b) is Tensor and b._requires_grad for b in a):
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


def mark_multi_output_views(views: tuple, node_name: str) -> tuple:
    """Outputs of split and unbind that autograd tracks: torch forbids changing them in place (their shared
    backward could not be rebased onto the write)."""
    from tilewise.dispatch import STATE

    if STATE.grad_enabled:
        for k, view in enumerate(views):
            if view._requires_grad:
                view.__dict__["_multi_output_view"] = (node_name, k)
    return views


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
    multi = self.__dict__.get("_multi_output_view")
    if multi is not None:
        raise RuntimeError(f"{name}: Output {multi[1]} of {multi[0]} is a view and is being modified inplace. This "
                           "view is the output of a function that returns multiple views. Such functions do not "
                           "allow the output views to be modified inplace. You should replace the inplace operation "
                           "by an out-of-place one.")
    if self.grad_fn is None and self._requires_grad and self._base is None:
        raise RuntimeError(f"{name}: a leaf Variable that requires grad is being used in an in-place operation; "
                           "wrap it in `with tilewise.no_grad():` or use the out-of-place form")
    base = self._base
    if base is not None and base.grad_fn is None and base._requires_grad:
        raise RuntimeError(f"{name}: a view of a leaf Variable that requires grad is being used in an in-place "
                           "operation; wrap it in `with tilewise.no_grad():` or clone() the leaf first")
    if base is not None and not (base.is_contiguous() and base._offset == 0):
        raise RuntimeError(f"{name}: in-place writes through a view need a contiguous base to be recorded for "
                           "autograd; call .contiguous() on the base tensor first")


def _rebase_view_history(view: Tensor, result: Tensor) -> None:
    """An in-place write through a view changes its base: record it as ``base = view_scatter(base, result)``
    and make the view a fresh strided view of the new base (torch's CopySlices, in two ordinary ops)."""
    from tilewise.ops.registry import OPS

    base = view._base
    geometry = (view._shape, view._strides, view._offset)
    new_base = OPS["view_scatter"](base, result, *geometry)
    base.grad_fn, base._output_nr, base._requires_grad = new_base.grad_fn, new_base._output_nr, True
    new_view = OPS["as_strided"](base, *geometry)
    view.grad_fn, view._output_nr, view._requires_grad = new_view.grad_fn, new_view._output_nr, True


def make_inplace(fn, name: str):
    from tilewise.ops.registry import OVERLOADS

    # a composite records its primitives, which may save ``self`` (index_reduce_'s scatter_reduce, clamp_min_'s)
    saves_self = any("self" in op.saved_params or (op.kind == "composite" and not op.derivatives)
                     for op in OVERLOADS[name])

    def inplace(self, *args, **kwargs):
        check_no_internal_overlap(self, f"{name}_")
        recording = STATE.grad_enabled and (self._requires_grad or _any_requires_grad(args, kwargs))
        if recording:
            check_inplace_allowed(self, f"{name}_")
        dual = bool(dispatch.dual_levels)  # a tangent rule may read ``self`` after the write: give it the value
        # the node keeps the value ``self`` had before the write, whether or not ``self`` requires grad: the
        # derivative for another input may read it (``x.mul_(w)`` with only ``w`` requiring grad), as torch's
        # in-place operators keep ``original_self``
        source = self.clone() if (recording or dual) and saves_self else self
        autocast, STATE.autocast = STATE.autocast, None  # torch's autocast lists no in-place op
        if not recording and not STATE.trace_depth and not STATE.vmap and not dual \
                and not written_outside_inference(self):  # commit refuses it, after torch's shape checks
            STATE.into = (self, name)
        try:
            result = fn(source, *args, **kwargs)
        finally:
            STATE.autocast = autocast
            STATE.into = None
        commit(self, result, f"{name}_")
        if (recording and result is not self and result._dtype is self._dtype and result._requires_grad
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
    from tilewise.ops.registry import OPS

    if result is self:  # written in place already (see [Note: in-place writes])
        self._bump_version()
        return self
    if result._shape != self._shape:
        raise RuntimeError(f"{name}: output with shape {list(self._shape)} doesn't match the broadcast shape "
                           f"{list(result._shape)}")
    check_inference_write(self)
    _take_tangents(self, result)
    if result._dtype is not self._dtype:
        if not allow_any_cast and not castable(result._dtype, self._dtype):
            raise RuntimeError(f"{name}: result type {result._dtype.name} can't be cast to the desired output type "
                               f"{self._dtype.name}")
        result = result.to(self._dtype)
    if STATE.grad_enabled and result._requires_grad:
        check_inplace_allowed(self, name)
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
    if prev and result._requires_grad:
        if self._base is not None:
            _rebase_view_history(self, result)
        else:
            self.grad_fn, self._output_nr, self._requires_grad = result.grad_fn, result._output_nr, True
    self._bump_version()
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
    node = result.grad_fn
    saved = getattr(node, "saved", None)
    entry = saved.get("result") if saved else None
    if (entry is None or isinstance(entry, tuple) or not entry.is_output or entry.unpack_hook is not None
            or entry.tensor is None or entry.tensor._storage is not result._storage):
        return
    entry.tensor = self.detach()
    entry.version = self._storage.version


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
