"""``_scaled_mm`` on CUDA: the cuBLASLt FP8 GEMM (see [Note: scaled matrix products] in ``ops/scaled_mm.py``).

[Note: cuBLASLt FP8 GEMM]
cuBLASLt multiplies FP8 matrices only in the "TN" form: its first operand transposed, its second not. With
the row-major ``D[M,N] = A[M,K] @ B[K,N]`` computed as the column-major ``D^T = B^T A^T`` (see
[Note: cuBLASLt GEMM] in ``matmul.py``), that is ``A`` row-major (strides ``(K, 1)``) and ``B`` column-major
(strides ``(1, K)``, ``w.t()`` of a row-major weight) — the layout torch requires, so the same calls pass
and fail. Tensorwise scales are device fp32 pointers (``A/B_SCALE_POINTER``), read by the GEMM, so a scale
computed on the GPU is never copied to the host; rowwise scales use the ``OUTER_VEC_32F`` scale mode, which
cuBLASLt offers from 12.9 on sm_90 (an older cuBLASLt refuses with an error saying so: there is no fallback).
beta is 0, so C is never read; its pointer is mat1's, as torch passes it, since cuBLASLt takes neither a null C
nor the result's own buffer in these FP8 calls.
A float8 result is multiplied by ``scale_result`` (``D_SCALE_POINTER``, torch's CUDA semantics), and
``scaled_gemm(..., amax=t)`` asks cuBLASLt for the result's absolute maximum (``AMAX_D_POINTER``) in the same
pass, for a recipe that scales the next cast from it. ``use_fast_accum`` sets ``FAST_ACCUM`` (Hopper's
faster, less precise FP8 accumulation). Plans (descriptor, layouts, heuristic algorithm) are cached per shape,
dtypes, scaling and which of the optional pointers (D scale, amax) are given, as the algorithm cuBLASLt picks
depends on them; the heuristic is asked with every pointer set, as torch asks it, and the pointers are set again
at each call. The algorithm is the heuristic's first choice, as torch takes it: timed on the device (calls queued
back to back, the two libraries alternating), it runs every shape of ``benchmarks/lowprec.py`` at torch's rate
(8192^3: 1430 against 1433 TFLOP/s on an H200), where the fastest of the heuristic's candidates timed on the first
call (the other GEMMs' ``choose_fastest``) ran at 0.94-1.01x of torch's: the FP8 kernels draw enough power that a short
timing does not rank them as they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tilewise import dtypes
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel, kernel_into
from tilewise.backends.cuda.matmul import (
    _COMPUTE_32F,
    _DATA_TYPE,
    WORKSPACE_BYTES,
    Operand,
    _alignment,
    _context,
    _heuristics,
    _lt,
    _set,
    column_major,
)
from tilewise.device import Device
from tilewise.dtypes import c10_name
from tilewise.ops.scaled_mm import check_scaled_mm
from tilewise.tensor import Tensor

FP8_DATA_TYPE = {"float8_e4m3fn": 28, "float8_e5m2": 29}  # cudaDataType_t: CUDA_R_8F_E4M3, CUDA_R_8F_E5M2
OUTPUT_DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
_SCALE_OUTER_VEC_32F = 3  # cublasLtMatmulMatrixScale_t
_ROWWISE_MIN_VERSION = 120900


def _data_type(dtype) -> int:
    return FP8_DATA_TYPE.get(dtype.name, _DATA_TYPE.get(dtype.name, -1))


def check_cuda(a: Tensor, b: Tensor, scale_a, scale_b, bias, scale_result, out_dtype, device: Device) -> str:
    """torch's CUDA checks, in its order, after the checks every device makes; returns the scaling."""
    from tilewise.backends.cuda.runtime import get_device_properties

    props = get_device_properties(device.index)
    if (props.major, props.minor) < (8, 9):
        raise RuntimeError("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 or "
                           f"8.9, or ROCm MI300+ (this device: sm_{props.major}{props.minor})")
    scaling = check_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, cuda=True)
    if a.shape[1] % 16:
        raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: "
                           f"({a.shape[0]}x{a.shape[1]}).")
    if b.shape[0] % 16 or b.shape[1] % 16:
        raise RuntimeError(f"mat2 shape ({b.shape[0]}x{b.shape[1]}) must be divisible by 16")
    if out_dtype.name not in OUTPUT_DTYPES:
        raise RuntimeError(f"_scaled_mm: out_dtype {out_dtype.name} is not a cuBLASLt FP8 output; valid: "
                           f"{', '.join(OUTPUT_DTYPES)}")
    if a.dtype is dtypes.float8_e5m2 and b.dtype is dtypes.float8_e5m2:
        raise ValueError("Multiplication of two Float8_e5m2 matrices is not supported")
    if scaling == "rowwise" and props.major < 9:
        raise NotImplementedError(f"_scaled_mm: rowwise scales need cuBLASLt's OUTER_VEC_32F mode, which runs on sm_90 "
                                  f"and later (this device: sm_{props.major}{props.minor}); use tensorwise scales")
    if bias is not None:
        _check_bias(bias, out_dtype)
    for name, t in (("mat1", a), ("mat2", b), ("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b),
                    ("scale_result", scale_result)):
        if t is not None and t.device != device:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{device} and {t.device}! (when checking argument {name} of _scaled_mm)")
    return scaling


def _check_bias(bias: Tensor, out_dtype) -> None:
    if out_dtype is dtypes.float32:
        raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
    if bias.dtype not in (dtypes.bfloat16, dtypes.float16):
        raise RuntimeError(f"Bias must be BFloat16 or Half, but got {c10_name(bias.dtype)}")
    if out_dtype is dtypes.bfloat16 and bias.dtype is not dtypes.bfloat16:
        raise RuntimeError(f"Bias must be BFloat16 to compute {c10_name(out_dtype)} output, but got "
                           f"{c10_name(bias.dtype)}")
    if out_dtype is dtypes.float16 and bias.dtype is not dtypes.float16:
        raise RuntimeError(f"Bias must be Float16 to compute {c10_name(out_dtype)} output, but got "
                           f"{c10_name(bias.dtype)}")


def _operands(a: Tensor, b: Tensor) -> tuple[Operand, Operand]:
    """cuBLASLt's view of ``a`` (row-major) and ``b`` (column-major): the TN form FP8 requires."""
    m, k = a.shape
    n = b.shape[1]
    a_op = column_major(m, k, *a._strides)
    b_op = column_major(k, n, *b._strides)
    if a_op is None or b_op is None or a_op.trans != 0 or b_op.trans != 1:
        raise RuntimeError(f"Only multiplication of row-major and column-major matrices is supported by cuBLASLt "
                           f"(_scaled_mm: mat1 {list(a.shape)} strides {list(a._strides)} must be row-major, mat2 "
                           f"{list(b.shape)} strides {list(b._strides)} column-major, e.g. w.t() of a row-major w)")
    return a_op, b_op


@dataclass
class _FP8Plan:
    desc: int
    layouts: tuple[int, int, int, int]  # A (our b), B (our a), C, D
    algo: int
    keep: list
    scalars: tuple[int, int]
    pointers: dict = field(default_factory=dict)  # the pointer attributes the descriptor holds now, by name


_plans: dict[tuple, _FP8Plan] = {}


def _pointers(scale_a: Tensor, scale_b: Tensor, scale_result, amax, bias, out_dtype) -> list[tuple[str, int]]:
    """The descriptor's pointer attributes for one call, by attribute name (0: not given)."""
    pointers = [("A_SCALE_POINTER", data_ptr(scale_b)), ("B_SCALE_POINTER", data_ptr(scale_a))]  # cuBLASLt's A: b
    if out_dtype.is_float8:
        pointers += [("D_SCALE_POINTER", data_ptr(scale_result) if scale_result is not None else 0),
                     ("AMAX_D_POINTER", data_ptr(amax) if amax is not None else 0)]
    if bias is not None:
        pointers.append(("BIAS_POINTER", data_ptr(bias)))
    return pointers


def _set_pointers(desc: int, pointers: list[tuple[str, int]], held: dict | None = None) -> None:
    """Set the descriptor's pointer attributes; with ``held`` (what the descriptor holds now, updated here), only
    those that changed: each set is a call into cuBLASLt, and a GEMM small enough to run in tens of microseconds
    is otherwise paced by them."""
    lt = _lt()
    setter, dtype_of, attr = lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, lt.MatmulDescAttribute
    for name, pointer in pointers:
        if held is not None:
            if held.get(name) == pointer:
                continue
            held[name] = pointer
        _set(setter, dtype_of, desc, getattr(attr, name), pointer)


def _plan(key: tuple, handle: int, a: Tensor, b: Tensor, a_op: Operand, b_op: Operand, out_dtype, bias,
          scaling: str, fast_accum: bool, aligns: tuple, pointers: list[tuple[str, int]]) -> _FP8Plan:
    lt = _lt()
    if scaling == "rowwise" and lt.get_version() < _ROWWISE_MIN_VERSION:
        raise NotImplementedError(f"_scaled_mm: rowwise scales need cuBLASLt >= 12.9 (OUTER_VEC_32F scale mode); "
                                  f"this one is {lt.get_version()}. Use tensorwise (one-element) scales")
    m, n = a.shape[0], b.shape[1]
    desc = lt.matmul_desc_create(_COMPUTE_32F, _DATA_TYPE["float32"])
    setter, dtype_of, attr = lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, lt.MatmulDescAttribute
    _set(setter, dtype_of, desc, attr.TRANSA, b_op.trans)
    _set(setter, dtype_of, desc, attr.TRANSB, a_op.trans)
    if fast_accum:
        _set(setter, dtype_of, desc, attr.FAST_ACCUM, 1)
    if scaling == "rowwise":
        _set(setter, dtype_of, desc, attr.A_SCALE_MODE, _SCALE_OUTER_VEC_32F)
        _set(setter, dtype_of, desc, attr.B_SCALE_MODE, _SCALE_OUTER_VEC_32F)
    if bias is not None:
        _set(setter, dtype_of, desc, attr.EPILOGUE, 4)  # CUBLASLT_EPILOGUE_BIAS
        _set(setter, dtype_of, desc, attr.BIAS_DATA_TYPE, _DATA_TYPE[bias.dtype.name])
    # a float8 D takes a 16-bit C (cuBLASLt's FP8 table); beta is 0, so C is never read
    c_type = _DATA_TYPE[bias.dtype.name if bias is not None else "float16"] if out_dtype.is_float8 \
        else _data_type(out_dtype)
    layouts = (lt.matrix_layout_create(_data_type(b.dtype), b_op.rows, b_op.cols, b_op.ld),
               lt.matrix_layout_create(_data_type(a.dtype), a_op.rows, a_op.cols, a_op.ld),
               lt.matrix_layout_create(c_type, n, m, n),
               lt.matrix_layout_create(_data_type(out_dtype), n, m, n))
    _set_pointers(desc, pointers)
    alpha, beta = np.array([1.0], np.float32), np.array([0.0], np.float32)
    algos, results = _heuristics(handle, desc, layouts, aligns)
    return _FP8Plan(desc, layouts, algos[0], [results, alpha, beta], (alpha.ctypes.data, beta.ctypes.data),
                    dict(pointers))


def scaled_gemm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Tensor | None = None,
                scale_result: Tensor | None = None, out_dtype=None, use_fast_accum: bool = False,
                amax: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """The FP8 GEMM; ``amax``: a one-element float32 device tensor that receives ``max|D|`` (before the D scale),
    for a float8 result only; ``out``: a dense tensor of the result's shape and dtype to write."""
    device = a._device
    out_dtype = out_dtype or a.dtype
    scaling = check_cuda(a, b, scale_a, scale_b, bias, scale_result, out_dtype, device)
    m, k = a.shape
    n = b.shape[1]
    out = empty((m, n), out_dtype, device) if out is None else out
    if m == 0 or n == 0 or k == 0:
        return out.zero_() if k == 0 and out.numel() else out
    a_op, b_op = _operands(a, b)
    if amax is not None and (not out_dtype.is_float8 or amax.dtype is not dtypes.float32 or amax.numel() != 1):
        raise RuntimeError(f"scaled_gemm: amax wants a one-element float32 tensor and a float8 result; got "
                           f"{amax.dtype.name} {list(amax.shape)} for a {out_dtype.name} result")
    ctx = _context(device)
    ptrs = (data_ptr(a), data_ptr(b), data_ptr(out))
    # C is never read (beta is 0), but cuBLASLt refuses a null C and, for FP8, C == D when their types or
    # layouts differ: like torch, C points at mat1 (see [Note: cuBLASLt FP8 GEMM])
    aligns = tuple(_alignment(p) for p in (ptrs[1], ptrs[0], ptrs[0], ptrs[2]))
    bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
    scale_a = scale_a if scale_a.is_contiguous() else scale_a.contiguous()
    scale_b = scale_b if scale_b.is_contiguous() else scale_b.contiguous()
    pointers = _pointers(scale_a, scale_b, scale_result, amax, bias, out_dtype)
    key = (device.index, a.dtype, b.dtype, out_dtype, a_op, b_op, m, n, k, scaling, bool(use_fast_accum),
           bias.dtype if bias is not None else None, aligns, tuple(p != 0 for _, p in pointers))
    plan = _plans.get(key)
    fresh = plan is None
    if fresh:
        plan = _plans[key] = _plan(key, ctx.handle, a, b, a_op, b_op, out_dtype, bias, scaling, use_fast_accum,
                                   aligns, pointers)
    else:
        _set_pointers(plan.desc, pointers, plan.pointers)
    lt = _lt()
    alpha, beta = plan.scalars
    a_layout, b_layout, c_layout, d_layout = plan.layouts
    workspace, stream = data_ptr(ctx.workspace), stream_handle(device.index)

    def run(algo: int) -> None:  # every run writes the same D (and amax): beta is 0
        lt.matmul(ctx.handle, plan.desc, alpha, ptrs[1], a_layout, ptrs[0], b_layout, beta, ptrs[0], c_layout,
                  ptrs[2], d_layout, algo, workspace, WORKSPACE_BYTES, stream)

    run(plan.algo)
    return out


@kernel("_scaled_mm")
def scaled_mm(device: Device, self: Tensor, mat2: Tensor, scale_a: Tensor, scale_b: Tensor, bias=None,
              scale_result=None, out_dtype=None, use_fast_accum: bool = False) -> Tensor:
    return scaled_gemm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)


@kernel_into("_scaled_mm")
def scaled_mm_into(out: Tensor, self: Tensor, mat2: Tensor, scale_a: Tensor, scale_b: Tensor, bias=None,
                   scale_result=None, out_dtype=None, use_fast_accum: bool = False) -> bool:
    """Into a compiled program's planned buffer (and so into its CUDA graph) when nothing needs a temporary:
    the scales and the bias already contiguous, on the operands' device (see [Note: kernels into a given
    output])."""
    operands = (scale_a, scale_b, bias, scale_result)
    if out is None or any(t is not None and (not t.is_contiguous() or t._device != self._device) for t in operands):
        return False
    scaled_gemm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out=out)
    return True
