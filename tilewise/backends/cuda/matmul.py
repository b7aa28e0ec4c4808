"""GEMM on CUDA through cuBLASLt (nvmath-python's raw bindings): mm, bmm, and linear with fused epilogues.

[Note: cuBLASLt GEMM]
cuBLASLt is column-major; tilewise is row-major. A row-major ``D[M,N] = A[M,K] @ B[K,N]`` is computed as
the column-major ``D^T = B^T A^T``: cuBLASLt's first operand is ``B`` and its second ``A``. A row-major
operand with strides ``(ld, 1)`` *is* its transpose in column-major with leading dimension ``ld``, and a
transposed view with strides ``(1, ld)`` is the same matrix with ``TRANS=T``: so ``x @ w.t()`` and other
transposed views need no copy; only an operand with neither stride 1 is copied first. Batches are strided
(``bmm`` reads ``stride[0]``, 0 for a broadcast batch). Bias (per output column), bias+ReLU and bias+GELU
(tanh) are cuBLASLt epilogues, used by ``linear`` when its backward is not being recorded.

Per shape, the descriptors, the layouts and the algorithm are made once and cached: the heuristic's first
candidate, or the fastest of the few best where they are timed (a ``mode="max-autotune"`` first run,
``TILEWISE_GEMM_TUNE=1``) or were timed by an earlier process (see [Note: library algorithm choice] in
``backends/cuda/tuning.py``). The global flags decide the
numerics (see [Note: backend flags] in ``backends/flags.py``), and are part of every cache key: float32 GEMMs run in
full float32 (CUBLAS_COMPUTE_32F) unless TF32 is allowed (``tilewise.backends.cuda.matmul.allow_tf32``, or
``set_float32_matmul_precision("high")``: CUBLAS_COMPUTE_32F_FAST_TF32); float16/bfloat16 GEMMs may sum split-K
partials in their own dtype unless ``allow_fp16/bf16_reduced_precision_reduction`` is off; in deterministic mode the
heuristic's first algorithm is taken (a timed choice may differ from one process to the next) and split-K in place
(atomic accumulation into the output) is excluded. A GEMM may also be planned for fewer than all the GPU's SMs
(cuBLASLt's SM count target, ``gemm_into(..., sm_count=)``), which a compiled program does beside a collective
([Note: GEMMs beside collectives] in ``compiler/lowering/streams.py``): the target is part of the plan's key too,
and of its timed choice's on disk where it is set. This module carries torch.backends.cuda.matmul's attributes
(``tilewise.backends.cuda.matmul.allow_tf32 = True``). Enum values are those of ``library_types.h``,
``cublas_api.h`` and ``cublasLt.h``, a stable ABI.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tilewise import dispatch, dtypes
from tilewise._stages import stage
from tilewise.backends import flags
from tilewise.backends.cuda.device_memory import data_ptr, empty, empty_fast, stream_handle
from tilewise.backends.cuda.kernels import kernel, kernel_into
from tilewise.config import log, settings
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.ops.linalg import check_mm_shapes
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

WORKSPACE_BYTES = 32 << 20
_DATA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType_t
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70  # cublasComputeType_t
_OP_N, _OP_T = 0, 1
_SCHEME_INPLACE, _SCHEME_COMPUTE_TYPE, _SCHEME_ALL = 1, 2, 7  # cublasLtReductionScheme_t (NONE = 0 always passes)
EPILOGUES = {"none": 1, "relu": 2, "bias": 4, "relu_bias": 6, "gelu": 32, "gelu_bias": 36,  # cublasLtEpilogue_t
             "gelu_aux_bias": 164, "dgelu": 192}
# epilogues with a second matrix beside D, laid out as D: the GELU input, written by gelu_aux_bias, read by dgelu
AUX_EPILOGUES = ("gelu_aux_bias", "dgelu")
_TUNE_MIN_FLOPS = 1 << 25
_CANDIDATES = 8


_bindings: list = []


def _lt():
    """nvmath's cuBLASLt bindings, imported at first use (the GPU extra)."""
    if not _bindings:
        from tilewise.backends.cuda.nvmath_bindings import binding

        _bindings.append(binding("cublasLt"))
    return _bindings[0]


@dataclass
class _Context:
    handle: int
    workspace: Tensor


_contexts: dict[int, _Context] = {}


def _context(device: Device) -> _Context:
    ctx = _contexts.get(device.index)
    if ctx is None:
        from tilewise.backends.cuda.runtime import ensure_context

        ensure_context(device.index)
        ctx = _contexts[device.index] = _Context(_lt().create(), empty((WORKSPACE_BYTES,), dtypes.uint8, device))
    return ctx


def _set(setter, dtype_of, obj: int, attr, value) -> None:
    buffer = np.array([value], dtype=dtype_of(int(attr)))
    setter(obj, int(attr), buffer.ctypes.data, buffer.nbytes)


# ---------------------------------------------------------------------------------------------- operands

@dataclass(frozen=True)
class Operand:
    """How cuBLASLt reads a row-major logical matrix: transpose flag, rows/cols of the stored matrix, ld."""

    trans: int
    rows: int
    cols: int
    ld: int


def column_major(rows: int, cols: int, row_stride: int, col_stride: int) -> Operand | None:
    """A logical row-major (rows x cols) matrix as cuBLASLt's op(X), X column-major; None if it needs a copy.

    op(X) is the (cols x rows) transpose, which is what the D^T = B^T A^T formulation consumes."""
    if (col_stride == 1 or cols == 1) and (row_stride >= max(cols, 1) or rows == 1):
        return Operand(_OP_N, cols, rows, max(row_stride if rows > 1 else cols, 1))
    if (row_stride == 1 or rows == 1) and (col_stride >= max(rows, 1) or cols == 1):
        return Operand(_OP_T, rows, cols, max(col_stride if cols > 1 else rows, 1))
    return None


def _operand(x: Tensor) -> tuple[Tensor, Operand]:
    rows, cols = x._shape[-2:]
    found = column_major(rows, cols, x._strides[-2], x._strides[-1])
    if found is None:
        from tilewise.backends.cuda.kernels.copy import cast

        x = cast(x, x._dtype)
        found = column_major(rows, cols, x._strides[-2], x._strides[-1])
    return x, found


def _alignment(ptr: int) -> int:
    return min(ptr & -ptr, 256) if ptr else 256


# ---------------------------------------------------------------------------------------------- plans

@dataclass
class _Plan:
    desc: int
    layouts: tuple[int, int, int]  # A (our B), B (our A), D
    algo: int  # address of the chosen cublasLtMatmulAlgo_t
    keep: list = field(default_factory=list)  # host objects whose memory the handles above point into
    alpha: np.ndarray = None
    beta: np.ndarray = None
    scalars: tuple[int, int] = (0, 0)  # host addresses of alpha and beta
    bias_ptr: int = 0
    aux_ptr: int = 0


_plans: dict[tuple, _Plan] = {}


def plan_key(device: int, dtype: DType, a_op: Operand, b_op: Operand, m: int, n: int, k: int, batch: int,
             strides: tuple[int, int], epilogue: str, aligns: tuple[int, ...], sm_count: int = 0) -> tuple:
    """A GEMM plan's key: its geometry, dtype, epilogue and alignments, the numerics the flags allow (see [Note:
    backend flags]), and the SMs it is planned for (0: all); without the device's index, the key of its timed
    choice on disk too (``_entry_name``)."""
    return (device, dtype, a_op, b_op, m, n, k, batch, strides, epilogue, aligns, flags.gemm_numerics(), sm_count)


def _layout(dtype: DType, op: Operand, batch: int, batch_stride: int) -> int:
    lt = _lt()
    layout = lt.matrix_layout_create(_DATA_TYPE[dtype.name], op.rows, op.cols, op.ld)
    if batch > 1:
        _set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout,
             lt.MatrixLayoutAttribute.BATCH_COUNT, batch)
        _set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout,
             lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, batch_stride)
    return layout


def _plan(key: tuple, dtype: DType, a_op: Operand, b_op: Operand, m: int, n: int, k: int, batch: int,
          strides: tuple[int, int], epilogue: str, aligns: tuple[int, ...], args: tuple) -> _Plan:
    lt = _lt()
    wide = dtype is dtypes.float64
    numerics, sm_count = key[-2:]
    tf32, _, _, deterministic = numerics
    compute = _COMPUTE_64F if wide else (_COMPUTE_32F_FAST_TF32 if dtype is dtypes.float32 and tf32 else _COMPUTE_32F)
    scale = _DATA_TYPE["float64" if wide else "float32"]
    desc = lt.matmul_desc_create(compute, scale)
    setter, dtype_of = lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype
    _set(setter, dtype_of, desc, lt.MatmulDescAttribute.TRANSA, b_op.trans)
    _set(setter, dtype_of, desc, lt.MatmulDescAttribute.TRANSB, a_op.trans)
    if sm_count:  # planned for that many SMs (see [Note: GEMMs beside collectives])
        _set(setter, dtype_of, desc, lt.MatmulDescAttribute.SM_COUNT_TARGET, sm_count)
    if epilogue != "none":
        _set(setter, dtype_of, desc, lt.MatmulDescAttribute.EPILOGUE, EPILOGUES[epilogue])
    if epilogue in AUX_EPILOGUES:  # the pointers are set at each run; the heuristic wants them set already
        _set(setter, dtype_of, desc, lt.MatmulDescAttribute.EPILOGUE_AUX_LD, n)
        _set(setter, dtype_of, desc, lt.MatmulDescAttribute.EPILOGUE_AUX_POINTER, args[7])
        if args[4]:
            _set(setter, dtype_of, desc, lt.MatmulDescAttribute.BIAS_POINTER, args[4])
    b_stride, a_stride = strides
    layouts = (_layout(dtype, b_op, batch, b_stride), _layout(dtype, a_op, batch, a_stride),
               _layout(dtype, Operand(_OP_N, n, m, n), batch, m * n))
    plan = _Plan(desc, layouts, 0)
    if epilogue in AUX_EPILOGUES:
        plan.bias_ptr, plan.aux_ptr = args[4], args[7]
    plan.alpha = np.array([1.0], np.float64 if wide else np.float32)
    plan.beta = np.array([0.0], np.float64 if wide else np.float32)
    plan.scalars = (plan.alpha.ctypes.data, plan.beta.ctypes.data)
    algos, results = _heuristics(args[0], desc, layouts, aligns, _reduction_schemes(dtype, numerics))
    plan.keep.append(results)
    plan.algo = algos[0] if deterministic else _choose(key, plan, algos, m * n * k * batch, args)
    return plan


def _reduction_schemes(dtype: DType, numerics: tuple) -> int:
    """The split-K reduction schemes cuBLASLt may choose from: partial sums in the output's own dtype only where
    reduced-precision reduction is allowed (torch's default), none at all without split-K, and never in place (in
    an order that varies between runs) in deterministic mode."""
    tf32, fp16, bf16, deterministic = numerics
    allowed, split_k = {"float16": fp16, "bfloat16": bf16}.get(dtype.name, (True, True))
    schemes = _SCHEME_ALL if allowed else _SCHEME_COMPUTE_TYPE if split_k else 0
    return schemes & ~_SCHEME_INPLACE if deterministic else schemes


def _heuristics(handle: int, desc: int, layouts, aligns, schemes: int = _SCHEME_ALL) -> tuple[list[int], object]:
    lt = _lt()
    pref = lt.matmul_preference_create()
    setter, dtype_of = lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype
    attrs = lt.MatmulPreferenceAttribute
    _set(setter, dtype_of, pref, attrs.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
    if schemes != _SCHEME_ALL:
        _set(setter, dtype_of, pref, attrs.REDUCTION_SCHEME_MASK, schemes)
    for attr, align in zip((attrs.MIN_ALIGNMENT_A_BYTES, attrs.MIN_ALIGNMENT_B_BYTES, attrs.MIN_ALIGNMENT_C_BYTES,
                            attrs.MIN_ALIGNMENT_D_BYTES), aligns):
        _set(setter, dtype_of, pref, attr, align)
    results = lt.MatmulHeuristicResult(_CANDIDATES)
    count = np.zeros(1, np.int32)
    a, b, d = layouts[0], layouts[1], layouts[-1]
    c = layouts[2] if len(layouts) == 4 else d  # (A, B, D), or (A, B, C, D) where C's type differs from D's
    lt.matmul_algo_get_heuristic(handle, desc, a, b, c, d, pref, _CANDIDATES, results.ptr,
                                 count.ctypes.data)
    lt.matmul_preference_destroy(pref)
    if count[0] == 0:
        raise RuntimeError("cuBLASLt found no algorithm for this GEMM (dtype, layout or alignment unsupported)")
    size = lt.matmul_heuristic_result_dtype.itemsize
    raw = np.frombuffer((ctypes.c_char * (size * _CANDIDATES)).from_address(results.ptr),
                        dtype=lt.matmul_heuristic_result_dtype)
    algos = [results.ptr + i * size for i in range(int(count[0])) if int(raw[i]["state"]) == 0]
    return algos, results


def _choose(key: tuple, plan: _Plan, algos: list[int], work: int, args: tuple) -> int:
    """The heuristic's candidate for this GEMM: one an earlier timed choice remembered on disk, else the fastest
    timed on its real operands where timing is asked for (see :func:`choose_fastest`), else the first ([Note:
    library algorithm choice] in ``backends/cuda/tuning.py``)."""
    if len(algos) == 1 or settings.gemm_tune is False:
        return algos[0]
    entry = _entry_name(key, len(algos))
    remembered = _remembered(entry, len(algos))
    if remembered is not None:
        return algos[remembered]

    def run(algo: int) -> None:
        plan.algo = algo
        _run(plan, *args)

    timed = _timed_here(algos, work)
    chosen = choose_fastest(key[0], f"GEMM {key[1:]}", algos, work, run, args[6])
    if timed:  # (under a capture, or too small to time, the first was taken untimed: nothing to remember)
        _remember(entry, algos.index(chosen), len(algos))
    return chosen


def _timed_here(algos: list[int], work: int) -> bool:
    """Whether :func:`choose_fastest` times these candidates: more than one, timing asked for, a GEMM large
    enough to time, and no CUDA graph capture under way (nothing can be waited for there)."""
    from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing

    return len(algos) > 1 and tuning_wanted() and work * 2 >= _TUNE_MIN_FLOPS and not is_current_stream_capturing()


def tuning_wanted() -> bool:
    """Whether a new GEMM shape's candidates are timed: ``TILEWISE_GEMM_TUNE=1``, or inside
    :func:`tilewise.backends.cuda.tuning.tuning` (a ``mode="max-autotune"`` first run) where it is unset."""
    from tilewise.backends.cuda import tuning

    return settings.gemm_tune is True or (settings.gemm_tune is None and tuning.active())


_disk: list = []


def _store():
    if not _disk:
        from tilewise.codegen.toolchain.cache import default_cache_dir
        from tilewise.codegen.toolchain.disk import DiskCache

        _disk.append(DiskCache(default_cache_dir() / "cublaslt", "cuBLASLt algorithm choice cache"))
    return _disk[0]


def _entry_name(key: tuple, count: int) -> str:
    """The disk entry of a GEMM's timed choice: its plan key (without the device's index) on this GPU model,
    with this cuBLASLt and this many candidates. The key's last field, the SMs it was planned for, is part of the
    name only where it is set: a GEMM planned for every SM keeps the entry it had before there was a target."""
    from tilewise.backends.cuda.runtime import get_device_properties

    name = get_device_properties(key[0]).name
    identity = repr((key[1:] if key[-1] else key[1:-1], name, _lt().get_version(), count, "gemm-choice-v1"))
    return hashlib.sha256(identity.encode()).hexdigest()[:32] + ".json"


def _remembered(entry: str, count: int) -> int | None:
    """The candidate index an earlier process's timed choice picked, if any."""
    try:
        payload = _store().read(entry)
        if payload is None:
            return None
        index = json.loads(payload)["index"]
        return index if isinstance(index, int) and 0 <= index < count else None
    except Exception:  # noqa: BLE001 — a remembered choice is only an optimisation
        return None


def _remember(entry: str, index: int, count: int) -> None:
    try:
        _store().write(entry, json.dumps({"index": index, "candidates": count, "at": time.time()}).encode())
    except Exception:  # noqa: BLE001, S110 — a choice not remembered is timed again in the next process
        pass


def choose_fastest(device: int, label: str, algos: list[int], work: int, run: Callable[[int], None],
                   stream: int) -> int:
    """The fastest of cuBLASLt's heuristic candidates ``algos``, where ``run(algo)`` queues the GEMM once with
    that algorithm on ``stream`` (its result the same whichever runs); the first where there is one, no timing
    is asked for (:func:`tuning_wanted`) or the GEMM is too small to time.

    The GPU is first kept busy long enough to leave its idle clocks (unless a GEMM was timed a moment ago),
    and the candidates are then timed in interleaved rounds, each round queued whole before the host waits:
    timed one after another from idle, the first candidates ran at lower clocks and lost to slower ones (on an
    H200, cuBLASLt's first choice for bf16 8192^3 measured 801 TFLOP/s directly but lost to a 718 TFLOP/s
    candidate).

    Each round is queued behind a spinning kernel that outlasts the queueing: a GEMM of a few microseconds
    runs faster than the host queues it, and timed as it is queued every candidate measured the host's rate
    (1024^3 bf16 chose a kernel at 0.84x of torch's).

    Under a CUDA graph capture nothing can be timed (the host cannot wait for work that has not run): the first
    candidate is kept."""
    if not _timed_here(algos, work):
        return algos[0]
    from tilewise.backends.cuda.kernels import spin
    from tilewise.backends.cuda.runtime import get_device_properties

    global _clocks_up_until
    with stage("cuBLASLt algorithm choice"):
        if time.perf_counter() > _clocks_up_until:
            _timed(run, algos[0], stream, _warmup_runs(run, algos[0], stream))
        times: list[list[float]] = [[] for _ in algos]
        hold_us = _FIRST_HOLD_US
        cycles_per_us = get_device_properties(device).clock_rate_khz // 1000  # the top clock: spins last as asked
        for _ in range(_ROUNDS):
            spin(hold_us * cycles_per_us, device, stream)
            queued = time.perf_counter()
            events = [_queued(run, algo, stream, _RUNS_PER_ROUND) for algo in algos]
            hold_us = int(2e6 * (time.perf_counter() - queued)) + 50  # twice this round's queueing
            events[-1][1].synchronize()
            for k, (start, end) in enumerate(events):
                times[k].append(start.elapsed_time(end) / _RUNS_PER_ROUND)
        _clocks_up_until = time.perf_counter() + _CLOCKS_HOLD_S
    medians = [sorted(t)[len(t) // 2] for t in times]
    best = min(range(len(algos)), key=medians.__getitem__)
    log("matmul", f"{label}: candidate medians (ms) {[round(t, 4) for t in medians]}, chose #{best}")
    return algos[best]


_ROUNDS, _RUNS_PER_ROUND = 5, 2
_FIRST_HOLD_US = 1000  # the first round's spin; later ones spin twice as long as the round before took to queue
_WARMUP_MS = 20.0  # GPU time spent before timing, enough for the clocks to ramp up from idle
_CLOCKS_HOLD_S = 0.1  # after timing a GEMM, the GPU is taken to be at its clocks for this long
_clocks_up_until = 0.0


def _queued(run: Callable[[int], None], algo: int, stream: int, runs: int) -> tuple:
    """(start, end) events around ``runs`` back-to-back runs with ``algo``, queued on ``stream``."""
    from tilewise.backends.cuda.runtime import Event

    start, end = Event(enable_timing=True), Event(enable_timing=True)
    run(algo)  # queued ahead of the start event, so host latency is not timed
    start.record(stream)
    for _ in range(runs):
        run(algo)
    end.record(stream)
    return start, end


def _timed(run: Callable[[int], None], algo: int, stream: int, runs: int) -> float:
    """Milliseconds per run of ``runs`` back-to-back runs with ``algo``, by events on ``stream``."""
    start, end = _queued(run, algo, stream, runs)
    end.synchronize()
    return start.elapsed_time(end) / runs


def _warmup_runs(run: Callable[[int], None], algo: int, stream: int) -> int:
    one = _timed(run, algo, stream, 1)
    return max(1, min(200, int(_WARMUP_MS / max(one, 1e-3))))


def _run(plan: _Plan, handle: int, a_ptr: int, b_ptr: int, d_ptr: int, bias_ptr: int, workspace: int,
         stream: int, aux_ptr: int = 0) -> None:
    lt = _lt()
    if bias_ptr and bias_ptr != plan.bias_ptr:
        plan.bias_ptr = bias_ptr
        _set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, plan.desc,
             lt.MatmulDescAttribute.BIAS_POINTER, bias_ptr)
    if aux_ptr and aux_ptr != plan.aux_ptr:
        plan.aux_ptr = aux_ptr
        _set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, plan.desc,
             lt.MatmulDescAttribute.EPILOGUE_AUX_POINTER, aux_ptr)
    a_layout, b_layout, d_layout = plan.layouts
    alpha, beta = plan.scalars
    lt.matmul(handle, plan.desc, alpha, b_ptr, a_layout, a_ptr, b_layout, beta, d_ptr, d_layout, d_ptr, d_layout,
              plan.algo, workspace, WORKSPACE_BYTES, stream)


# ---------------------------------------------------------------------------------------------- entry points

SUPPORTED = ("float32", "float64", "float16", "bfloat16")


@dataclass
class _Call:
    """What a GEMM call with given shapes, strides, dtype, epilogue and alignment needs besides its pointers."""

    plan: _Plan | None
    copy_a: bool
    copy_b: bool
    out_shape: tuple
    out_strides: tuple
    numel: int


_calls: dict[tuple, _Call] = {}


def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, epilogue: str = "none") -> Tensor:
    """``a @ b`` (+ ``bias`` per output column, then ``epilogue``) for 2-D or batched 3-D CUDA tensors.

    ``epilogue``: "none", "bias", "relu_bias", "gelu_bias" (GELU with the tanh approximation), "relu", "gelu".
    The two with a second matrix go through :func:`gemm_into`.
    """
    return _gemm(a, b, bias, epilogue, None)[0]


def gemm_into(out: Tensor, a: Tensor, b: Tensor, bias: Tensor | None = None, epilogue: str = "none",
              aux: Tensor | None = None, sm_count: int = 0) -> bool:
    """:func:`gemm` writing into ``out`` (contiguous, of the product's shape and dtype); whether it had to
    copy an operand first (a layout cuBLASLt cannot read), which allocates memory.

    For 2-D products, two epilogues take ``aux``, a contiguous matrix of ``out``'s shape and dtype (see
    :func:`aux_epilogue_fits`): "gelu_aux_bias" writes ``pre = a @ b + bias`` into ``aux`` and ``gelu(pre)``
    (tanh) into ``out``; "dgelu" (no bias) writes ``gelu_backward(a @ b, aux)`` (tanh) into ``out``.

    ``sm_count``: plan the GEMM for that many of the GPU's SMs (cuBLASLt's SM count target), leaving the others
    to kernels running beside it on another stream (a compiled program's collectives, see [Note: GEMMs beside
    collectives] in ``compiler/lowering/streams.py``); 0: for all of them."""
    return _gemm(a, b, bias, epilogue, out, aux, sm_count)[1]


def aux_epilogue_fits(out: Tensor, a: Tensor, b: Tensor, bias: Tensor | None, aux: Tensor) -> bool:
    """Whether cuBLASLt's GELU epilogues with a second matrix take these operands where they lie: one floating
    dtype on one device, 2-D operands it reads without a copy, a contiguous ``out`` and ``aux`` of the product's
    shape whose rows are a multiple of 8 elements, a contiguous ``bias`` (if any) of one value per column, and
    every address 16-byte aligned."""
    m, n = a._shape[0] if a.ndim == 2 else -1, b._shape[-1]
    dtype, device = a._dtype, a._device
    tensors = (a, b, out, aux) + ((bias,) if bias is not None else ())
    return (dtype.name in SUPPORTED and dtype is not dtypes.float64 and a.ndim == 2 and b.ndim == 2
            and a._shape[1] == b._shape[0] and m > 0 and n % 8 == 0 and a._shape[1] > 0
            and all(t._dtype is dtype and t._device == device and data_ptr(t) % 16 == 0 for t in tensors)
            and out._shape == aux._shape == (m, n) and out.is_contiguous() and aux.is_contiguous()
            and (bias is None or (bias._shape == (n,) and bias.is_contiguous()))
            and column_major(m, a._shape[1], *a._strides) is not None
            and column_major(b._shape[0], n, *b._strides) is not None)


def _gemm(a: Tensor, b: Tensor, bias: Tensor | None, epilogue: str, into: Tensor | None,
          aux: Tensor | None = None, sm_count: int = 0) -> tuple[Tensor, bool]:
    device = a._device
    a_ptr, b_ptr = data_ptr(a), data_ptr(b)
    key = (device.index, a._dtype, a._shape, a._strides, b._shape, b._strides, epilogue, _alignment(a_ptr),
           _alignment(b_ptr), flags.gemm_numerics(), sm_count)
    call = _calls.get(key)
    stream = stream_handle(device.index)
    if call is None:
        call = _calls[key] = _call(a, b, bias, epilogue, stream, aux, into, sm_count)
    if into is None:
        out = empty_fast(call.out_shape, call.out_strides, call.numel, a._dtype, device, stream)
    elif into._shape != call.out_shape or into._strides != call.out_strides or into._dtype is not a._dtype:
        raise ValueError(f"gemm_into: out is {list(into._shape)} strides {list(into._strides)} {into._dtype.name}; "
                         f"the product needs a contiguous {list(call.out_shape)} {a._dtype.name}")
    else:
        out = into
    if call.plan is None:
        return _degenerate(out, bias, epilogue), False
    copied = call.copy_a or call.copy_b
    if call.copy_a:
        a = _copied(a)
        a_ptr = data_ptr(a)
    if call.copy_b:
        b = _copied(b)
        b_ptr = data_ptr(b)
    ctx = _contexts[device.index]
    _run(call.plan, ctx.handle, a_ptr, b_ptr, data_ptr(out), data_ptr(bias) if bias is not None else 0,
         data_ptr(ctx.workspace), stream, data_ptr(aux) if aux is not None else 0)
    return out, copied


def pointer_gemm(a: Tensor, b: Tensor, out: Tensor, alignment: int):
    """``run(a_ptr, b_ptr, out_ptr, stream)``: the 2-D product ``a @ b`` into a contiguous ``out`` for a loop that
    runs one geometry over many buffers below the dispatcher (an LSTM layer's time steps, backends/cuda/
    recurrent.py), launched on raw addresses of operands laid out as ``a``, ``b`` and ``out``. The plan is made
    (and its algorithm chosen, writing ``out``) here, for addresses aligned to ``alignment`` bytes, which every
    address passed must be. A product cuBLASLt cannot take where the operands lie, or an empty one, is refused."""
    m, k = a._shape
    n = b._shape[1]
    a_op, b_op = column_major(m, k, *a._strides), column_major(k, n, *b._strides)
    if a_op is None or b_op is None or 0 in (m, n, k) or not out.is_contiguous() or out._shape != (m, n):
        raise ValueError(f"pointer_gemm: {list(a._shape)} @ {list(b._shape)} into {list(out._shape)} needs a copy "
                         f"or is empty")
    device = a._device
    ctx = _context(device)
    stream = stream_handle(device.index)
    aligns = (alignment,) * 4
    key = plan_key(device.index, a._dtype, a_op, b_op, m, n, k, 1, (0, 0), "none", aligns)
    plan = _plans.get(key)
    if plan is None:
        args = (ctx.handle, data_ptr(a), data_ptr(b), data_ptr(out), 0, data_ptr(ctx.workspace), stream, 0)
        plan = _plans[key] = _plan(key, a._dtype, a_op, b_op, m, n, k, 1, (0, 0), "none", aligns, args)
    matmul = _lt().matmul
    a_layout, b_layout, d_layout = plan.layouts
    alpha, beta = plan.scalars
    handle, desc, algo, workspace = ctx.handle, plan.desc, plan.algo, data_ptr(ctx.workspace)

    def run(a_ptr: int, b_ptr: int, out_ptr: int, stream: int) -> None:
        matmul(handle, desc, alpha, b_ptr, a_layout, a_ptr, b_layout, beta, out_ptr, d_layout, out_ptr, d_layout,
               algo, workspace, WORKSPACE_BYTES, stream)

    return run


def _copied(x: Tensor) -> Tensor:
    from tilewise.backends.cuda.kernels.copy import cast

    return cast(x, x._dtype)


def _degenerate(out: Tensor, bias: Tensor | None, epilogue: str) -> Tensor:
    """An empty product, or K == 0 (the product is zeros)."""
    if out.numel() == 0:
        return out
    from tilewise.backends.cuda.kernels.creation import fill

    fill(out, 0)
    return out if bias is None else _epilogue_by_hand(out + bias, epilogue)


def _call(a: Tensor, b: Tensor, bias: Tensor | None, epilogue: str, stream: int, aux: Tensor | None,
          into: Tensor | None, sm_count: int = 0) -> _Call:
    device = a._device
    batched = a.ndim == 3
    m, k = a._shape[-2:]
    n = b._shape[-1]
    batch = a._shape[0] if batched else 1
    out_shape = ((batch,) if batched else ()) + (m, n)
    from tilewise import strides as S

    call = _Call(None, False, False, out_shape, S.contiguous_strides(out_shape), S.numel(out_shape))
    if m == 0 or n == 0 or batch == 0 or k == 0:
        return call
    call.copy_a = column_major(m, k, a._strides[-2], a._strides[-1]) is None
    call.copy_b = column_major(k, n, b._strides[-2], b._strides[-1]) is None
    a = _copied(a) if call.copy_a else a
    b = _copied(b) if call.copy_b else b
    a_op, b_op = _operand(a)[1], _operand(b)[1]
    ctx = _context(device)
    # algorithm timing writes the output (and the aux matrix of gelu_aux_bias): the caller's when it gave one,
    # which it is about to be written anyway, so that the choice takes no memory beside it
    fits = into is not None and into._shape == out_shape and into._strides == call.out_strides
    out = into if fits else empty(out_shape, a._dtype, device)
    if epilogue == "gelu_aux_bias" and not fits:
        aux = empty(aux._shape, aux._dtype, device)
    ptrs = (data_ptr(a), data_ptr(b), data_ptr(out))
    aligns = tuple(_alignment(p) for p in (ptrs[1], ptrs[0], ptrs[2], ptrs[2]))
    strides = (b._strides[0] if batched else 0, a._strides[0] if batched else 0)
    key = plan_key(device.index, a._dtype, a_op, b_op, m, n, k, batch, strides, epilogue, aligns, sm_count)
    args = (ctx.handle, ptrs[0], ptrs[1], ptrs[2], data_ptr(bias) if bias is not None else 0,
            data_ptr(ctx.workspace), stream, data_ptr(aux) if aux is not None else 0)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _plan(key, a._dtype, a_op, b_op, m, n, k, batch, strides, epilogue, aligns, args)
    call.plan = plan
    return call


def _epilogue_by_hand(x: Tensor, epilogue: str) -> Tensor:
    if epilogue.startswith("relu"):
        return x.relu()
    if epilogue.startswith("gelu"):
        return OPS["gelu"](x, approximate="tanh")
    return x


def _host(op_name: str, *args):
    from tilewise.backends.cuda.kernels.fallback import run_on_host

    return run_on_host(OPS[op_name], args, args[0]._device)


@kernel("mm")
def mm(device: Device, self: Tensor, mat2: Tensor) -> Tensor:
    check_mm_shapes("mm", self, mat2)
    if self._dtype.name not in SUPPORTED:
        return _host("mm", self, mat2)
    return gemm(self, mat2)


@kernel("bmm")
def bmm(device: Device, self: Tensor, mat2: Tensor) -> Tensor:
    check_mm_shapes("bmm", self, mat2)
    if self._dtype.name not in SUPPORTED:
        return _host("bmm", self, mat2)
    return gemm(self, mat2)


@kernel("matmul")
def matmul(device: Device, self: Tensor, other: Tensor) -> Tensor:
    """A product of two matrices of one dtype goes straight to the GEMM, one dispatch where the declared
    decomposition (``a.mm(b)``) would make a second; every other case (ranks, mixed dtypes and the errors
    they raise) runs the decomposition. Reached only where no gradient is recorded: with one, autograd
    records the decomposition's primitives."""
    a, b = self._shape, other._shape
    if len(a) == 2 and len(b) == 2 and a[1] == b[0] and self._dtype is other._dtype and self._dtype.name in SUPPORTED \
            and not dispatch.profiling:  # a profile shows aten::mm inside aten::matmul, as torch's: dispatch it
        return gemm(self, other)
    return OPS["matmul"].decomposition(self, other)


def bias_epilogue(op_name: str, bias: Tensor, mat1: Tensor, mat2: Tensor, beta=1, alpha=1,
                  use_gelu: bool = False) -> str | None:
    """The cuBLASLt epilogue computing ``addmm`` / ``_addmm_activation`` in the GEMM, or None when it cannot
    (scaled terms, a bias that is not one value per output column, mixed dtypes or devices)."""
    dtype = mat1._dtype
    if (beta != 1 or alpha != 1 or dtype.name not in SUPPORTED or mat1.ndim != 2 or mat2.ndim != 2
            or bias._shape != mat2._shape[-1:] or bias._dtype is not dtype or mat2._dtype is not dtype
            or bias._device != mat1._device or mat2._device != mat1._device or mat1._shape[1] != mat2._shape[0]):
        return None
    if op_name == "addmm":
        return "bias"
    return "gelu_bias" if use_gelu else "relu_bias"


@kernel("addmm")
def addmm(device: Device, self: Tensor, mat1: Tensor, mat2: Tensor, beta=1, alpha=1) -> Tensor:
    epilogue = bias_epilogue("addmm", self, mat1, mat2, beta, alpha)
    if epilogue is None:
        return OPS["addmm"].decomposition(self, mat1, mat2, beta=beta, alpha=alpha)
    return gemm(mat1, mat2, self.contiguous(), epilogue)


@kernel("_addmm_activation")
def addmm_activation(device: Device, self: Tensor, mat1: Tensor, mat2: Tensor, beta=1, alpha=1,
                     use_gelu: bool = False) -> Tensor:
    epilogue = bias_epilogue("_addmm_activation", self, mat1, mat2, beta, alpha, use_gelu)
    if epilogue is None:
        return OPS["_addmm_activation"].decomposition(self, mat1, mat2, beta=beta, alpha=alpha, use_gelu=use_gelu)
    return gemm(mat1, mat2, self.contiguous(), epilogue)


# [Note: GELU epilogues with a second matrix]
# A training step keeps GELU's input for its backward. cuBLASLt's GELU_AUX_BIAS writes it beside the GELU of the
# biased product, so the forward is one GEMM where it was a GEMM with a bias and a pointwise kernel reading the
# sum back. DGELU reads it back in the backward's product and writes GELU's derivative applied to the product,
# where a fused kernel read the product back. The compiler's CUDA target rewrites the two patterns into these
# operators (``compiler.passes.epilogues``); their kernels fall back to the declared decomposition whenever
# cuBLASLt cannot take the operands where they lie. (DGELU_BGRAD would also sum the result's columns, a bias
# gradient; on an H200 it took 221 us for 8192x768 @ 768x3072 in bf16, against 76 us for DGELU and 21 us for the
# compiler's column sum, so the sum stays a generated kernel.) Their kernels into an output take ``sm_count`` as
# ``gemm_into`` does, for a compiled program's step beside a collective ([Note: GEMMs beside collectives]).

@kernel("_addmm_gelu")
def addmm_gelu(device: Device, self: Tensor, mat1: Tensor, mat2: Tensor):
    if mat1.ndim == 2 and mat2.ndim == 2:
        out = empty((mat1._shape[0], mat2._shape[-1]), mat1._dtype, device)
        pre = empty(out._shape, out._dtype, device)
        if addmm_gelu_into((out, pre), self, mat1, mat2):
            return out, pre
    return OPS["_addmm_gelu"].decomposition(self, mat1, mat2)


@kernel_into("_addmm_gelu")
def addmm_gelu_into(outs: tuple, self: Tensor, mat1: Tensor, mat2: Tensor, sm_count: int = 0) -> bool:
    out, pre = outs
    if out is None or pre is None or not aux_epilogue_fits(out, mat1, mat2, self, pre):
        return False
    return not gemm_into(out, mat1, mat2, self, "gelu_aux_bias", pre, sm_count)


@kernel("_mm_gelu_backward")
def mm_gelu_backward(device: Device, mat1: Tensor, mat2: Tensor, preactivation: Tensor):
    if mat1.ndim == 2 and mat2.ndim == 2:
        grad = empty((mat1._shape[0], mat2._shape[-1]), mat1._dtype, device)
        if mm_gelu_backward_into(grad, mat1, mat2, preactivation):
            return grad
    return OPS["_mm_gelu_backward"].decomposition(mat1, mat2, preactivation)


@kernel_into("_mm_gelu_backward")
def mm_gelu_backward_into(out: Tensor, mat1: Tensor, mat2: Tensor, preactivation: Tensor, sm_count: int = 0) -> bool:
    if out is None or not aux_epilogue_fits(out, mat1, mat2, None, preactivation):
        return False
    return not gemm_into(out, mat1, mat2, None, "dgelu", preactivation, sm_count)


def linear_activation(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
    """``activation(x @ weight.T + bias)`` in one cuBLASLt call; ``activation``: "none", "relu", "gelu" (tanh).

    Not differentiable by itself: the autograd path of ``linear`` runs its decomposition."""
    rows = x.reshape(-1, x._shape[-1]) if x.ndim != 2 else x
    if bias is None:
        epilogue = activation
    else:
        epilogue = "bias" if activation == "none" else f"{activation}_bias"
        bias = bias if bias.is_contiguous() else bias.contiguous()
    out = gemm(rows, weight.t(), bias, epilogue)
    if x.ndim == 2:
        return out
    out = out.view(x._shape[:-1] + (weight._shape[0],))
    out._base = None  # the product is the result, no view of anything (see ops.linalg.private)
    return out


@kernel("linear")
def linear(device: Device, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    same = input._dtype is weight._dtype and (bias is None or bias._dtype is input._dtype)
    if not same or input._dtype.name not in SUPPORTED or input.ndim == 0 or weight.ndim != 2 or (
            bias is not None and (bias.ndim != 1 or bias._device is not device)):
        from tilewise.ops.linalg import _linear

        return _linear(input, weight, bias)
    if input._shape[-1] != weight._shape[1]:
        from tilewise.ops.linalg import _check_matmul

        _check_matmul(input, weight.t())
    return linear_activation(input, weight, bias)


# ---------------------------------------------------------------------------------------------- torch's spellings

def _flag(getter, setter) -> property:
    return property(lambda module: getter(), lambda module, value: setter(value))


class _MatmulFlags(types.ModuleType):
    """This module as ``torch.backends.cuda.matmul``: its flag attributes read and write ``backends/flags.py``, so
    that ``allow_tf32`` and ``set_float32_matmul_precision`` stay linked as in torch. ``allow_fp16_accumulation``
    is kept and read back only: float16 GEMMs here always accumulate in float32."""

    allow_tf32 = _flag(flags.cublas_allow_tf32, flags.set_cublas_allow_tf32)
    fp32_precision = _flag(lambda: flags.get_fp32_precision("cuda", "matmul"),
                           lambda value: flags.set_fp32_precision("cuda", "matmul", value))
    allow_fp16_reduced_precision_reduction = _flag(lambda: flags.reduced_precision_reduction("fp16")[0],
                                                   lambda value: flags.set_reduced_precision_reduction("fp16", value))
    allow_fp16_reduced_precision_reduction_split_k = property(lambda m: flags.reduced_precision_reduction("fp16")[1])
    allow_bf16_reduced_precision_reduction = _flag(lambda: flags.reduced_precision_reduction("bf16")[0],
                                                   lambda value: flags.set_reduced_precision_reduction("bf16", value))
    allow_bf16_reduced_precision_reduction_split_k = property(lambda m: flags.reduced_precision_reduction("bf16")[1])
    allow_fp16_accumulation = _flag(flags.fp16_accumulation, flags.set_fp16_accumulation)


sys.modules[__name__].__class__ = _MatmulFlags
