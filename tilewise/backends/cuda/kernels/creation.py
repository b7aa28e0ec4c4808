"""Creation operators on CUDA: full (a fill kernel, or a memset for zeros), empty, arange, linspace, eye.

arange computes each element from its index in float64 (int64 for integer arange), the same arithmetic as the
CPU kernel, then converts once to the requested dtype; linspace follows torch's formula (see its kernel).
"""

from __future__ import annotations

import math

import numpy as np

from tilewise import dtypes
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, kernel_into, launch, load
from tilewise.backends.cuda.kernels.pointwise import elementwise
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source, compute_of, store_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.ops.expr import Expr
from tilewise.tensor import Tensor

_BLOCK = 256


def fill(out: Tensor, value) -> Tensor:
    """Set every element of ``out`` (any strides) to the Python number ``value``."""
    numel = out.numel()
    if out._dtype.is_complex:  # each part on its own: kernels are generated for real dtypes
        from tilewise.ops.complex import part_view

        fill(part_view(out, 0), complex(value).real)
        fill(part_view(out, 1), complex(value).imag)
        return out  # (not the last part's view: a complex factory returned its imaginary parts as a real tensor)
    if numel and out.is_contiguous() and value == 0 and math.copysign(1.0, value) > 0:
        from tilewise._cuda_api import check, driver_api

        check(driver_api().cuMemsetD8Async(data_ptr(out), 0, numel * out._dtype.itemsize,
                                           stream_handle(out._device.index)), "cuMemsetD8Async")
        return out
    return elementwise("fill", Expr("input", (), 0), compute_of(out._dtype), [value], out)


@kernel("full")
def full(device: Device, size, fill_value, dtype=None, target=None) -> Tensor:
    return fill(empty(tuple(size), dtype, device), fill_value)


@kernel("empty")
def empty_op(device: Device, size, dtype=None, target=None) -> Tensor:
    return empty(tuple(size), dtype, device)


def _index_kernel(name: str, dtype: DType, formula: str, params: str, wide: DType, device: int):
    """``out[i] = formula`` (a C expression of ``i`` in ``wide``), stored as ``dtype``."""
    source = Source(CUDA)
    source.need_storage(dtype)
    c_out, c_wide = CUDA.ctype(dtype), CUDA.ctype(wide)
    store = store_code(CUDA, dtype, "v", wide)
    text = (f'extern "C" __global__ void {name}({c_out}* __restrict__ out, long long n{params}) {{\n'
            f"    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (i >= n) return;\n    const {c_wide} v = {formula};\n    out[i] = {store};\n}}")
    return load(source.text(text), name, device)


def _launch_index_kernel(fn, out: Tensor, *args) -> Tensor:
    n = out.numel()
    if n:
        launch(fn, ceil_div(n, _BLOCK), _BLOCK, [data_ptr(out), n, *args], stream_handle(out._device.index))
    return out


@kernel("arange")
def arange(device: Device, start, end, step=1, dtype=None, target=None) -> Tensor:
    out = empty((max(int(math.ceil((end - start) / step)), 0),), dtype, device)
    arange_into(out, start, end, step, dtype)
    return out


@kernel_into("arange")
def arange_into(out: Tensor, start, end, step=1, dtype=None, target=None) -> bool:
    dtype = out._dtype
    if dtype.is_floating_point:
        fn = _index_kernel(f"tw_arange_{SUFFIX[dtype.name]}", dtype, "start + (double)i * step",
                           ", double start, double step", dtypes.float64, out._device.index)
        _launch_index_kernel(fn, out, float(start), float(step))
    else:
        fn = _index_kernel(f"tw_arange_{SUFFIX[dtype.name]}", dtype, "start + i * step",
                           ", long long start, long long step", dtypes.int64, out._device.index)
        _launch_index_kernel(fn, out, int(start), int(step))
    return True


@kernel("linspace")
def linspace(device: Device, start, end, steps, dtype=None, target=None) -> Tensor:
    out = empty((steps,), dtype, device)
    if steps < 2:
        return fill(out, start)
    formula, wide, args = linspace_plan(start, end, steps, dtype)
    fn = _index_kernel(f"tw_linspace_{SUFFIX[dtype.name]}", dtype, formula, LINSPACE_PARAMS, wide, device.index)
    return _launch_index_kernel(fn, out, *args)


LINSPACE_PARAMS = ", double start, double step, double end, long long halfway"


def linspace_plan(start, end, steps: int, dtype: DType) -> tuple[str, DType, tuple]:
    """linspace's kernel for ``steps`` >= 2: its formula, compute dtype and arguments. torch's formula (the CPU
    kernel's, ``backends/cpu/kernels.py``): the first half up from the start, the second down from the end, each a
    fused multiply-add; float32 computes in float32 (the ends and the step rounded to it here, so the float64
    parameters hold them exactly), float16 and bfloat16 too, rounded once by the store (torch's rounds the product
    to them first, so their last bit may differ), integers in float64, truncated by the store, as torch's CPU kernel
    does (its CUDA kernel steps in float32)."""
    if dtype is dtypes.float32 or (dtype.is_floating_point and dtype.itemsize < 4):
        low, high = np.float32(start), np.float32(end)
        step = float(np.float32(high - low) / np.float32(steps - 1))
        formula = ("i < halfway ? fmaf((float)step, (float)i, (float)start) "
                   ": fmaf(-(float)step, (float)(n - 1 - i), (float)end)")
        return formula, dtypes.float32, (float(low), step, float(high), steps // 2)
    if not (dtype.is_floating_point or dtype.is_complex):  # torch's start.to<int64_t>()
        start, end = int(start), int(end)
    step = (float(end) - float(start)) / (steps - 1)
    formula = "i < halfway ? fma(step, (double)i, start) : fma(-step, (double)(n - 1 - i), end)"
    return formula, dtypes.float64, (float(start), step, float(end), steps // 2)


@kernel("eye")
def eye(device: Device, n, m=None, dtype=None, target=None) -> Tensor:
    cols = n if m is None else m
    out = empty((n, cols), dtype, device)
    fn = _index_kernel(f"tw_eye_{SUFFIX[dtype.name]}", dtype, "(i / cols == i % cols) ? 1 : 0", ", long long cols",
                       dtypes.int64, device.index)
    return _launch_index_kernel(fn, out, max(cols, 1))
