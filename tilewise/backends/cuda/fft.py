"""The fft primitives on CUDA through cuFFT (nvmath-python's raw bindings, ``nvmath.bindings.cufft``).

[Note: cuFFT plans] A primitive's input is copied, with its transformed dims moved last, into a dense buffer
(a c2r transform overwrites its input, so it always gets a copy); one cuFFT plan then transforms every batch
of at most three dims, dense signals one after another. A two-sided r2c is the c2c transform of the signal
with a zero imaginary part. More than three dims are transformed in steps, complex-to-complex steps over the
leading dims (first for c2r, last for r2c, whose one-sided halving must apply to the last dim). Plans are kept
per (device, type, signal sizes, batch) without a work area of their own: each execution takes its work area
from the caching allocator on the current stream, so it is freed in stream order like any temporary. cuFFT
leaves results unscaled; the primitive's normalization is one multiply of the real view afterwards. Without
nvmath-python installed, the primitives run on host copies (numpy), like any operator without a CUDA kernel.
"""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel
from tilewise.device import Device
from tilewise.tensor import Tensor

FORWARD, INVERSE = -1, 1  # CUFFT_FORWARD, CUFFT_INVERSE
MAX_RANK = 3  # the most dims one cuFFT plan transforms

_bindings: list = []
_plans: dict[tuple, tuple[int, int]] = {}  # (device, type, sizes, batch) -> (plan handle, work area bytes)


def _cufft():
    """nvmath's cuFFT bindings, imported at first use (the GPU extra), or None where they are not installed."""
    if not _bindings:
        from tilewise.backends.cuda.nvmath_bindings import binding

        try:
            cufft = binding("cufft")
        except ImportError:
            cufft = None
        _bindings.append(cufft)
    return _bindings[0]


def _on_host(name: str, device: Device, *args) -> Tensor:
    """Without nvmath-python the primitive runs numpy's transform on host copies (logged under
    ``TILEWISE_LOG=fallback``), so that fft works on CUDA tensors before the GPU extra is installed."""
    from tilewise.backends.cuda.kernels.fallback import run_on_host
    from tilewise.ops.registry import OPS

    return run_on_host(OPS[name], args, device)


def _transform_type(kind: str, real: dtypes.DType) -> int:
    single = real is dtypes.float32
    cufft = _cufft()
    return int({"c2c": cufft.Type.C2C if single else cufft.Type.Z2Z,
                "r2c": cufft.Type.R2C if single else cufft.Type.D2Z,
                "c2r": cufft.Type.C2R if single else cufft.Type.Z2D}[kind])


def _plan(device: int, kind: str, real: dtypes.DType, sizes: tuple, batch: int) -> tuple[int, int]:
    """A cuFFT plan for ``batch`` dense signals of ``sizes`` (the real sizes for r2c and c2r)."""
    key = (device, kind, real, sizes, batch)
    found = _plans.get(key)
    if found is None:
        from tilewise.backends.cuda.runtime import ensure_context

        ensure_context(device)  # planning allocates on the device
        cufft = _cufft()
        handle = cufft.create()
        cufft.set_auto_allocation(handle, 0)
        complex_sizes = sizes[:-1] + (sizes[-1] // 2 + 1,)
        in_sizes, out_sizes = {"c2c": (sizes, sizes), "r2c": (sizes, complex_sizes),
                               "c2r": (complex_sizes, sizes)}[kind]
        # embeds equal to the sizes: dense signals one after another, cuFFT's basic layout
        work = cufft.make_plan_many64(handle, len(sizes), list(sizes), list(in_sizes), 1, math.prod(in_sizes),
                                      list(out_sizes), 1, math.prod(out_sizes), _transform_type(kind, real), batch)
        found = _plans[key] = (handle, work)
    return found


def _execute(kind: str, src: Tensor, out: Tensor, sizes: tuple, direction: int) -> None:
    """One plan over the last ``len(sizes)`` dims of dense ``src`` into dense ``out``."""
    real = src._dtype.to_real()
    batch = math.prod(src._shape[:-len(sizes)])
    index = src._device.index
    handle, work = _plan(index, kind, real, sizes, batch)
    cufft = _cufft()
    stream = stream_handle(index)
    area = empty((max(work, 1),), dtypes.uint8, src._device)  # freed in stream order after the launch below
    cufft.set_stream(handle, stream)
    cufft.set_work_area(handle, data_ptr(area))
    single = real is dtypes.float32
    if kind == "c2c":
        (cufft.exec_c2c if single else cufft.exec_z2z)(handle, data_ptr(src), data_ptr(out), direction)
    elif kind == "r2c":
        (cufft.exec_r2c if single else cufft.exec_d2z)(handle, data_ptr(src), data_ptr(out))
    else:
        (cufft.exec_c2r if single else cufft.exec_z2d)(handle, data_ptr(src), data_ptr(out))


def _dims_last(x: Tensor, dims: tuple) -> tuple[Tensor, tuple]:
    """A dense copy of ``x`` with ``dims`` moved last (in their order), and the permutation that undoes it."""
    from tilewise.backends.cuda.kernels.copy import cast

    order = tuple(d for d in range(x.ndim) if d not in dims) + tuple(dims)
    moved = Tensor._make(x._storage, S.permuted(x._shape, order), S.permuted(x._strides, order), x._offset,
                         x._dtype, x._device)
    inverse = [0] * len(order)
    for k, d in enumerate(order):
        inverse[d] = k
    return cast(moved, x._dtype), tuple(inverse)


def _restored(out: Tensor, inverse: tuple) -> Tensor:
    return Tensor._make(out._storage, S.permuted(out._shape, inverse), S.permuted(out._strides, inverse),
                        out._offset, out._dtype, out._device)


def _normalized(out: Tensor, normalization: int, signal_numel: int) -> Tensor:
    """``out`` scaled by the primitive's normalization (0 none, 1 by 1/sqrt(n), 2 by 1/n) in place."""
    from tilewise.backends.cuda.kernels.pointwise import elementwise
    from tilewise.codegen.render.cstyle import compute_of
    from tilewise.ops.complex import real_view
    from tilewise.ops.expr import Expr

    if normalization == 0 or not out.numel():
        return out
    scale = 1.0 / (math.sqrt(signal_numel) if normalization == 1 else signal_numel)
    target = real_view(out) if out._dtype.is_complex else out
    scaled = Expr("input", (), 0) * Expr("input", (), 1)  # the scale is an argument: one kernel for every size
    elementwise("fft_scale", scaled, compute_of(target._dtype), [target, scale], target)
    return out


def _c2c_steps(x: Tensor, dims: tuple, direction: int) -> Tensor:
    """Complex-to-complex over ``dims`` of dense ``x`` (dims last), at most three dims per plan."""
    for start in range(0, len(dims), MAX_RANK):
        step = dims[start:start + MAX_RANK]
        x, inverse = _dims_last(x, step)
        out = empty(x._shape, x._dtype, x._device)
        _execute("c2c", x, out, tuple(x._shape[-len(step):]), direction)
        x = _restored(out, inverse)
    return x


def _laid_out(out: Tensor, strides: tuple) -> Tensor:
    """``out`` with the strides torch's CPU transforms give their results (see [Note: fft result strides] in
    ``strides.py``): a copy unless it already has them."""
    if out._strides == strides:
        return out
    from tilewise.backends.cuda.kernels.copy import copy_into

    return copy_into(empty(out._shape, out._dtype, out._device, strides), out)


def _empty_result(shape: tuple, dtype: dtypes.DType, device: Device) -> Tensor:
    from tilewise.backends.cuda.kernels.creation import fill

    return fill(empty(shape, dtype, device), 0.0)


@kernel("_fft_c2c")
def fft_c2c(device: Device, self: Tensor, dim, normalization: int, forward: bool) -> Tensor:
    if _cufft() is None:
        return _on_host("_fft_c2c", device, self, dim, normalization, forward)
    dims = tuple(dim)
    order = S.fft_dims_in_order(self._strides, dims)
    strides = S.fft_result_strides(self._shape, self._strides, self._shape, order) if dims else \
        S.preserved_strides(self._shape, self._strides)  # no dim: torch's clone
    if not self.numel() or not dims:
        from tilewise.backends.cuda.kernels.copy import cast

        return _laid_out(cast(self, self._dtype), strides)
    out = _c2c_steps(self, dims, FORWARD if forward else INVERSE)
    return _laid_out(_normalized(out, normalization, math.prod(self._shape[d] for d in dims)), strides)


@kernel("_fft_r2c")
def fft_r2c(device: Device, self: Tensor, dim, normalization: int, onesided: bool) -> Tensor:
    if _cufft() is None:
        return _on_host("_fft_r2c", device, self, dim, normalization, onesided)
    dims = tuple(dim)
    out_shape = list(self._shape)
    if onesided:
        out_shape[dims[-1]] = self._shape[dims[-1]] // 2 + 1
    strides = S.fft_result_strides(self._shape, self._strides, out_shape,
                                   S.fft_dims_in_order(self._strides, dims, keep_last=True))
    complex_dtype = self._dtype.to_complex()
    if not onesided:  # the full spectrum: the complex transform of the signal with a zero imaginary part
        from tilewise.backends.cuda.kernels.copy import cast

        return _laid_out(fft_c2c(device, cast(self, complex_dtype), dims, normalization, True), strides)
    if not self.numel():
        return _laid_out(_empty_result(tuple(out_shape), complex_dtype, device), strides)
    last = dims[-MAX_RANK:]
    x, inverse = _dims_last(self, last)
    half = empty(x._shape[:-1] + (x._shape[-1] // 2 + 1,), complex_dtype, device)
    _execute("r2c", x, half, tuple(x._shape[-len(last):]), FORWARD)
    out = _restored(half, inverse)
    if len(dims) > MAX_RANK:
        out = _c2c_steps(out, dims[:-MAX_RANK], FORWARD)
    return _laid_out(_normalized(out, normalization, math.prod(self._shape[d] for d in dims)), strides)


@kernel("_fft_c2r")
def fft_c2r(device: Device, self: Tensor, dim, normalization: int, last_dim_size: int) -> Tensor:
    if _cufft() is None:
        return _on_host("_fft_c2r", device, self, dim, normalization, last_dim_size)
    dims = tuple(dim)
    out_shape = list(self._shape)
    out_shape[dims[-1]] = last_dim_size
    strides = S.fft_c2r_result_strides(self._shape, self._strides, out_shape, dims)
    real_dtype = self._dtype.to_real()
    if not self.numel() or not math.prod(out_shape):
        return _laid_out(_empty_result(tuple(out_shape), real_dtype, device), strides)
    x = self
    if len(dims) > MAX_RANK:
        x = _c2c_steps(x, dims[:-MAX_RANK], INVERSE)
    last = dims[-MAX_RANK:]
    x, inverse = _dims_last(x, last)  # always a copy: cuFFT's c2r overwrites its input
    sizes = tuple(x._shape[-len(last):-1]) + (last_dim_size,)
    out = empty(x._shape[:-1] + (last_dim_size,), real_dtype, device)
    _execute("c2r", x, out, sizes, INVERSE)
    return _laid_out(_normalized(_restored(out, inverse), normalization, math.prod(out_shape[d] for d in dims)),
                     strides)
