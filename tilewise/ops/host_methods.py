"""Tensor methods that are not operators: Python callbacks over the elements (``apply_``, ``map_``, ``map2_``,
CPU only as in torch), in-place resizing (``resize_``, ``resize_as_``), the deprecated non-inplace ``resize``,
queries (``dim_order``, ``output_nr``, ``is_shared``, ``const_data_ptr``, device predicates) and the leaf
gradient hook that runs after accumulation (``register_post_accumulate_grad_hook``, installed by autograd.graph).

[Note: resize_] ``resize_`` keeps the storage while it holds ``storage_offset + numel`` elements and otherwise
moves the tensor to a larger storage holding a copy of the old one, then gives the tensor the contiguous strides
of its new size (a resize to the current size changes nothing, as in torch). In torch the storage object itself
grows, so other views of it see the new buffer; here the tensor gets a new storage and other views keep the old
one (tilewise storages do not change size).
"""

from __future__ import annotations

import warnings
from numbers import Number

from tilewise import strides as S
from tilewise._grad_mode import no_grad
from tilewise.layouts import format_name, preserve_format, suggest_memory_format
from tilewise.ops.inplace import check_inference_write
from tilewise.tensor import Size, Tensor

_DEVICE_PREDICATES = ("is_meta", "is_mps", "is_xpu", "is_maia")


# ---------------------------------------------------------------------------- Python callbacks over elements

def _check_callback_target(self: Tensor, name: str) -> None:
    if self.device.type != "cpu":
        raise TypeError(f"{name} is only implemented on CPU tensors (this one is on {self.device})")
    if self.requires_grad:
        raise RuntimeError(f"Can't call {name}() on Variable that requires grad. Use var.detach().{name}() instead.")


def _python_value(result, dtype):
    if not isinstance(result, Number):
        raise TypeError(f"must be real number, not {type(result).__name__}")
    return bool(result) if dtype.name == "bool" else result


def _write_elements(self: Tensor, fn, *others: Tensor) -> Tensor:
    import numpy as np

    from tilewise.tensor import from_array

    arrays = [self._np(), *(o.expand(self.shape).detach().cpu()._np() for o in others)]
    out = np.empty(self.shape, dtype=self.dtype.np)
    for index in np.ndindex(*self.shape):
        out[index] = _python_value(fn(*(a[index].item() for a in arrays)), self.dtype)
    with no_grad():
        return self.copy_(from_array(out, self.dtype))


def apply_(self: Tensor, callable) -> Tensor:  # noqa: A002 — torch's argument name
    """Replace each element ``x`` by ``callable(x)`` (a Python function: slow, CPU only, as in torch)."""
    _check_callback_target(self, "apply_")
    return _write_elements(self, callable)


def map_(self: Tensor, tensor: Tensor, callable) -> Tensor:  # noqa: A002
    """Replace each element ``x`` by ``callable(x, y)``, ``y`` the element of ``tensor`` broadcast to ``self``."""
    _check_callback_target(self, "map_")
    return _write_elements(self, callable, tensor)


def map2_(self: Tensor, x: Tensor, y: Tensor, callable) -> Tensor:  # noqa: A002
    _check_callback_target(self, "map2_")
    return _write_elements(self, callable, x, y)


# ---------------------------------------------------------------------------- resizing

def _sizes(args: tuple) -> tuple[int, ...]:
    sizes = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list, Size)) else tuple(args)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"resize_(): size must be a sequence of ints, got {list(sizes)}")
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(sizes)}")
    return sizes


def resize_(self: Tensor, *sizes, memory_format=None) -> Tensor:
    """Give the tensor a new size in place (see [Note: resize_])."""
    check_inference_write(self)
    if self.requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    shape = _sizes(sizes)
    strides = _resized_strides(shape, memory_format)
    if shape == tuple(self.shape) and memory_format is None:
        return self
    needed = self.storage_offset() + S.numel(shape)
    if needed > self._storage.numel:
        _move_to_larger_storage(self, needed)
    self._shape, self._strides, self._array = Size(shape), strides, None
    self._storage.version += 1
    return self


def _resized_strides(shape: tuple, memory_format) -> tuple:
    """The strides ``resize_`` gives: row-major, or those of ``memory_format`` (which restrides even when the
    size stays, as in torch)."""
    if memory_format is None:
        return S.contiguous_strides(shape)
    name = format_name(memory_format, "resize_")
    if name == "preserve_format":
        raise RuntimeError("Unsupported memory formatPreserve")
    return S.format_strides(name, shape)


def _move_to_larger_storage(self: Tensor, size: int) -> None:
    from tilewise.ops.creation import empty

    old = self._storage
    with no_grad():
        flat = empty(size, dtype=self.dtype, device=self.device)
        if old.numel:
            whole = self.as_strided((old.numel,), (1,), 0)
            flat[:old.numel].copy_(whole)
    self._storage = flat._storage


def resize_as_(self: Tensor, the_template: Tensor, *, memory_format=None) -> Tensor:
    if memory_format is preserve_format:  # torch: the template's own format
        memory_format = suggest_memory_format(the_template)
    return resize_(self, tuple(the_template.shape), memory_format=memory_format)


def resize(self: Tensor, *sizes) -> Tensor:
    """Deprecated: the tensor viewed at another shape with the same number of elements."""
    warnings.warn("non-inplace resize is deprecated", UserWarning, stacklevel=2)
    shape = _sizes(sizes)
    if S.numel(shape) != self.numel():
        raise RuntimeError(f"requested resize to {'x'.join(map(str, shape))} ({S.numel(shape)} elements in total), "
                           f"but the given tensor has a size of {'x'.join(map(str, self.shape))} ({self.numel()} "
                           "elements). autograd's resize can only change the shape of a given tensor, while "
                           "preserving the number of elements. ")
    return self.contiguous().view(shape)


def resize_as(self: Tensor, tensor: Tensor) -> Tensor:
    warnings.warn("non-inplace resize_as is deprecated", UserWarning, stacklevel=2)
    return self.contiguous().view(tuple(tensor.shape)) if tensor.numel() == self.numel() else \
        resize(self, tuple(tensor.shape))


# ---------------------------------------------------------------------------- queries

def _channels_last_strides(shape) -> tuple[int, ...] | None:
    if len(shape) not in (4, 5):
        return None
    order = (1, *range(len(shape) - 1, 1, -1), 0)  # innermost first: channels, then the spatial dims, then batch
    strides, step = [0] * len(shape), 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _is_channels_last(shape, strides) -> bool:
    expected = _channels_last_strides(shape)
    return expected is not None and all(n == 1 or s == e for n, s, e in zip(shape, strides, expected))


def _should_swap(shape, strides, a: int, b: int) -> int:
    """torch's comparison of two dims for the physical order: 1 swaps, -1 keeps, 0 cannot tell."""
    def ge(x, y):
        return y == 0 or (x != 0 and (x >= y or x % y == 0))

    sa, sb = strides[a], strides[b]
    if sa == 0 or sb == 0:
        return 0
    if sa == sb:
        return 0 if ge(shape[b], shape[a]) else 1
    if ge(sb, sa):
        return -1
    return 1 if ge(sa, sb) else 0


def dim_order(self: Tensor, *, ambiguity_check: bool = False) -> tuple[int, ...]:
    """The dims from outermost to innermost in memory (torch's insertion sort by stride, ties kept in order)."""
    shape, strides, ndim = tuple(self.shape), self.stride(), self.ndim
    if ambiguity_check and (any(a == b for a, b in zip(strides, strides[1:])) or 1 in shape):
        raise RuntimeError("The tensor does not have unique dim order, or cannot map to exact one of the given memory "
                           "formats.")
    if ndim < 2:
        return tuple(range(ndim))
    contiguous, channels_last = self.is_contiguous(), _is_channels_last(shape, strides)
    if contiguous and not channels_last:
        return tuple(range(ndim))
    if channels_last and not contiguous:
        return (0, *range(2, ndim), 1)
    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):
        j = i
        for k in reversed(range(i)):
            order = _should_swap(shape, strides, perm[k], perm[j])
            if order > 0:
                perm[k], perm[j] = perm[j], perm[k]
                j = k
            elif order < 0:
                break
    return tuple(reversed(perm))


def output_nr(self: Tensor) -> int:
    """Which output of its grad_fn this tensor is (0 for a leaf)."""
    return self._output_nr if self._grad_fn is not None else 0


def is_shared(self: Tensor) -> bool:
    """Whether the storage is in memory shared between processes: a device's memory (as torch counts it), and on
    the CPU the batches DataLoader workers send; other CPU storages are private."""
    return self.device.type not in ("cpu", "meta") or (self._storage is not None and self._storage.shared)


def share_memory_(self: Tensor) -> Tensor:
    """Move the storage to shared memory: a no-op here for CUDA tensors and storages already shared, as in torch;
    other CPU storages stay private."""
    if self.device.type == "cpu" and not self._storage.shared:
        raise NotImplementedError("share_memory_(): tilewise's CPU storages cannot move to shared memory; pass tensors "
                                  "between processes with tilewise.save/load or numpy arrays")
    return self


def const_data_ptr(self: Tensor) -> int:
    return self.data_ptr()


# ---------------------------------------------------------------------------- legacy spellings

def new(self: Tensor, *args) -> Tensor:
    """The legacy constructor of ``self``'s type and device: sizes give an uninitialised tensor, data a new tensor
    in ``self``'s dtype, a tensor of that type an alias (``x.new(2, 3)``, ``x.new([1, 2])``)."""
    from tilewise.tensortypes import CPU_TYPES, CUDA_TYPES

    types = CUDA_TYPES if self.device.type == "cuda" else CPU_TYPES
    legacy = types.get(self.dtype)
    if legacy is None:
        raise TypeError(f"new(): tensors of dtype {self.dtype.name} have no legacy constructor; use new_empty, "
                        "new_tensor or new_zeros")
    return legacy(*args, device=self.device)


def _volatile(self: Tensor) -> bool:
    warnings.warn("volatile was removed and now has no effect. Use `with tilewise.no_grad():` instead.", UserWarning,
                  stacklevel=2)
    return False


def reinforce(self: Tensor, reward):
    raise RuntimeError("reinforce() was removed.\nUse tilewise.distributions instead (a Categorical's log_prob "
                       "times the reward, as the loss).")


def module_load(self: Tensor, other: Tensor, assign: bool = False) -> Tensor:
    """How ``other`` is loaded into ``self`` by ``load_state_dict`` when parameters are swapped: copied into
    ``self``, or taken as it is with ``assign``."""
    return other.detach() if assign else self.copy_(other).detach()


def attach() -> None:
    for fn in (apply_, map_, map2_, resize_, resize_as_, resize, resize_as, dim_order, is_shared, share_memory_,
               const_data_ptr, new, reinforce, module_load):
        setattr(Tensor, fn.__name__, fn)
    Tensor.volatile = property(_volatile)
    Tensor.output_nr = property(output_nr)
    Tensor.name = property(lambda self: None, doc="The tensor's dim-naming name: None (named tensors are not "
                                                   "supported).")
    for predicate in _DEVICE_PREDICATES:
        setattr(Tensor, predicate, property(lambda self: False))
    Tensor.cfloat = lambda self: self.to(dtype=_dtype("complex64"))
    Tensor.cdouble = lambda self: self.to(dtype=_dtype("complex128"))
    Tensor.chalf = chalf


def chalf(self: Tensor, memory_format=None) -> Tensor:
    """torch's ``self.to(torch.complex32)``: refused, since tilewise has no complex32 dtype."""
    from tilewise.dtypes import NO_COMPLEX32

    raise TypeError(f"Tensor.chalf(): {NO_COMPLEX32}")


def _dtype(name: str):
    from tilewise.dtypes import from_name

    return from_name(name)
