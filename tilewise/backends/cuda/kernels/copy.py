"""Copies and casts on the device: ``_to_copy``, ``clone``, ``_write_``, and the helpers other kernels use.

Every copy is the identity expression through the pointwise machinery, so a strided source, a strided
destination, a broadcast and a dtype change are all one kernel, on the device, with no host round trip.
A dense copy that keeps its layout is a single ``cuMemcpyDtoDAsync`` of the covered bytes. Casts into a
float8 type follow torch: e4m3fn saturates out-of-range values and infinities to +-448, e5m2 overflows to
infinity; ``cast(..., saturate=True)`` clamps e5m2 to its largest finite value too, as FP8 scaling recipes
expect.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel, kernel_into
from tilewise.backends.cuda.kernels.pointwise import elementwise
from tilewise.codegen.render.cstyle import compute_of
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.layouts import copy_strides
from tilewise.ops.expr import Expr
from tilewise.tensor import Tensor, fp4_cast_error

_IDENTITY = Expr("input", (), 0)


def cast(x: Tensor, dtype: DType, saturate: bool = False) -> Tensor:
    """A new contiguous tensor holding ``x`` converted to ``dtype``."""
    out = empty(x._shape, dtype, x._device)
    return copy_into(out, x, saturate)


def copy_into(out: Tensor, src: Tensor, saturate: bool = False) -> Tensor:
    """Write ``src`` (same shape, or broadcastable to it) into ``out``, converting dtypes."""
    if out._dtype.is_complex or src._dtype.is_complex:
        return _copy_parts(out, src)
    if out._dtype is dtypes.float4_e2m1fn_x2 or src._dtype is dtypes.float4_e2m1fn_x2:
        if out._dtype is not src._dtype:
            raise fp4_cast_error(src._dtype.np, out._dtype.np)
        copy_into(_as_bytes(out), _as_bytes(src))  # packed pairs have no value to convert: copy the bytes
        return out
    return elementwise("copy", _IDENTITY, compute_of(src._dtype), [src], out, saturate)


def _as_bytes(t: Tensor) -> Tensor:
    """A one-byte-per-element tensor as uint8, with the same geometry and memory."""
    out = Tensor._make(t._storage, t._shape, t._strides, t._offset, dtypes.uint8, t._device)
    out._base = t._base if t._base is not None else t
    return out


def _copy_parts(out: Tensor, src: Tensor) -> Tensor:
    """Copies and casts of complex tensors, as copies of their real and imaginary parts (the kernels are generated
    for real dtypes; see [Note: complex tensors] in ops/complex.py): a real source has a zero imaginary part, a
    real destination takes the real part."""
    from tilewise.backends.cuda.kernels.creation import fill
    from tilewise.ops.complex import part_view, real_view

    if out._dtype.is_complex and src._dtype.is_complex:
        copy_into(real_view(out), real_view(src))
    elif out._dtype.is_complex:
        copy_into(part_view(out, 0), src)
        fill(part_view(out, 1), 0.0)
    else:
        copy_into(out, part_view(src, 0))
    return out


def contiguous(x: Tensor) -> Tensor:
    return x if x.is_contiguous() else cast(x, x._dtype)


def _dense_copy(x: Tensor) -> Tensor:
    """A copy with the same strides, for a tensor that covers a dense block of memory exactly once."""
    out = empty(x._shape, x._dtype, x._device, x._strides)
    nbytes = x.numel() * x._dtype.itemsize
    if nbytes:
        from tilewise.backends.cuda.runtime import copy_dtod

        copy_dtod(data_ptr(out), data_ptr(x), nbytes, stream_handle(x._device.index))
    return out


@kernel("clone")
def clone(device: Device, self: Tensor, memory_format=None) -> Tensor:
    """torch's rule: keep the layout of a dense tensor, otherwise (or when asked) use the format asked for or the
    one the strides suggest."""
    strides = copy_strides(self, memory_format)
    if strides == self._strides and S.is_non_overlapping_and_dense(self._shape, strides):
        return _dense_copy(self)
    return copy_into(empty(self._shape, self._dtype, device, strides), self)


@kernel("_write_")
def write(device: Device, self: Tensor, src: Tensor) -> Tensor:
    if src._device.type == "cpu":
        src = src.to(self._device) if src.ndim else src
    if src._storage is self._storage and (src._shape, src._strides, src._offset) != (self._shape, self._strides,
                                                                                    self._offset):
        src = cast(src, src._dtype)  # overlapping source and destination: read everything first
    copy_into(self, src)
    return self


def _window(base: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``base.narrow(dim, start, length)`` as a plain strided view (no autograd, no dispatch)."""
    shape = base._shape[:dim] + (length,) + base._shape[dim + 1:]
    return Tensor._make(base._storage, shape, base._strides, base._offset + start * base._strides[dim], base._dtype,
                        base._device)


@kernel("cat")
def cat(device: Device, tensors, dim: int = 0) -> Tensor:
    from tilewise.ops.movement import cat_memory_format, check_cat

    parts, d, dtype = check_cat(tensors, dim)
    shape = list(parts[0]._shape)
    shape[d] = sum(t._shape[d] for t in parts)
    out = empty(tuple(shape), dtype, device, S.format_strides(cat_memory_format(tensors), shape))
    _cat(out, parts, d)
    return out


@kernel_into("cat")
def cat_into(out: Tensor, tensors, dim: int = 0) -> bool:
    from tilewise.ops.movement import check_cat

    parts, d, _ = check_cat(tensors, dim)
    if any(t._device != out._device for t in parts):
        return False
    _cat(out, parts, d)
    return True


def _cat(out: Tensor, parts, d: int) -> None:
    start = 0
    for t in parts:
        copy_into(_window(out, d, start, t._shape[d]), t)
        start += t._shape[d]


@kernel("flip")
def flip(device: Device, self: Tensor, dims) -> Tensor:
    """A copy reading ``self`` through negated strides: the copy kernel's strides are signed."""
    axes = S.normalize_dims(dims, self.ndim, "flip") if self.ndim else ()
    strides, offset = list(self._strides), self._offset
    for d in axes:
        offset += (self._shape[d] - 1) * strides[d] if self._shape[d] else 0
        strides[d] = -strides[d]
    reversed_view = Tensor._make(self._storage, self._shape, tuple(strides), offset, self._dtype, self._device)
    # laid out as ``self``, as torch's flip (``strides.preserved_strides``)
    return copy_into(empty(self._shape, self._dtype, device, S.preserved_strides(self._shape, self._strides)),
                     reversed_view)
