"""The CUDA backend: :class:`CUDABackend`, the :class:`~tilewise.device.Backend` the dispatcher and tensors use.

[Note: CUDA backend]
Its pieces: ``device_memory`` (a tensor's :class:`DeviceBuffer` from the caching allocator), ``transfers``
(host <-> device copies, pinned memory), ``kernels/`` (the eager kernels), ``matmul``, ``attention`` and
``convolution`` (cuDNN graphs, ``cudnn``), ``fft``,
``linalg`` (library calls), ``scaled_mm`` (the FP8 GEMM), ``recurrent`` (an LSTM layer's time loop on raw
buffers), ``runtime/`` (the driver).
This module only ties them to the protocol; each piece imports what it needs from the others directly, never this
package, so none of them depends on all.

``run`` picks the kernel by operator kind, exactly like the CPU backend: pointwise and reduction kernels
are generated from the declaration (``kernels/pointwise.py``, ``kernels/reduction.py``); other primitives
have a registered kernel (``kernels/``, ``matmul.py``); composites run their decomposition, so each
primitive inside reaches this backend again (fusing them into one kernel is the compiler's job). A
primitive with no CUDA kernel yet runs its CPU kernel on host copies of its inputs and moves the results
back (logged once per operator under ``TILEWISE_LOG=fallback``).
"""

from __future__ import annotations

from tilewise.backends.cuda.device_memory import (
    SMALL_BLOCK,
    SMALL_CACHE_LIMIT,
    DeviceBuffer,
    DeviceMemory,
    data_ptr,
    empty,
    empty_fast,
    memory,
    record_stream,
    stream_handle,
)
from tilewise.backends.cuda.runtime.device import _thread_state, current_device, ensure_context
from tilewise.backends.cuda.transfers import download, empty_pinned, is_pinned, pin_memory, upload
from tilewise.device import Backend, Device, cpu
from tilewise.tensor import Tensor

_kernels: dict = {}  # the kernel registry, bound by _load_kernels
_pointwise = _pointwise_into = _reduction = _host = _fused = None  # the generated-kernel entry points (_load_kernels)
_fused_ops: frozenset = frozenset()  # composites run as one compiled kernel (register_composite_runner)


def run_into(op, args: tuple, device: Device, out: Tensor) -> Tensor | None:
    """A pointwise op's result written into ``out`` (an in-place op's target), or None: see ``dispatch.call_into``."""
    if out._dtype.is_complex:
        return None  # computed as complex operands are (see run), then written back
    if _thread_state.context_device != device.index:
        ensure_context(device.index)
    return _pointwise_into(op, args, device, out)


def run(op, args: tuple, device: Device):
    """Run ``op`` on ``device``, whose primary context is made current first.

    [Note: the operation's device]
    Library calls (cuBLASLt, cuDNN, cuFFT) and copies on the legacy default stream run in the thread's current
    context, not the operands' device, so every operator makes its device's context current before it starts:
    a thread may meet tensors of several GPUs in turn (``DataParallel``'s backward runs every replica's nodes on
    the caller's thread), and a kernel of one GPU reading another's memory stops the process's CUDA context
    with an illegal address."""
    if _thread_state.context_device != device.index:
        ensure_context(device.index)
    try:
        return _run(op, args, device)
    except (NotImplementedError, KeyError):  # kernels are generated for real dtypes: see _run_complex
        if not (_complex_operands(op, args) or _complex_result(op, args)):
            raise
        return _run_complex(op, args, device)


def _run(op, args: tuple, device: Device):
    kind = op.kind
    if kind == "pointwise":
        return _pointwise(op, args, device)
    if kind == "composite" and op.name in _fused_ops:
        out = _fused(op, args)
        if out is not None:
            return out
    impl = _kernels.get(op.full_name)
    if impl is not None:
        return impl(device, *args)
    if kind == "custom":  # its kernels live with its registration (tilewise.library)
        return op.attrs["run"](args, device)
    if kind == "reduction" and op.reduce is not None:
        return _reduction(op, args, device)
    if op.decomposition is not None:
        return op.decomposition(*args)
    return _host(op, args, device)


def _complex_operands(op, args: tuple) -> bool:
    return any(type(args[k]) is Tensor and args[k]._dtype.is_complex for k in op.tensor_idx)


def _complex_result(op, args: tuple) -> bool:
    """Real operands, a complex result (``complex(real, imag)``, ``polar``)."""
    try:
        return op.dtype_rule(op, args)[0].is_complex
    except Exception:  # noqa: BLE001 — no dtype rule for these arguments: not a complex-making pointwise op
        return False


def _run_complex(op, args: tuple, device: Device):
    """An operator with complex operands whose kernel has no complex form (kernels are generated for real dtypes;
    copies, casts, fills and the fft primitives handle complex tensors themselves): a pointwise operator runs
    real operators on the parts where it has a real form (the arithmetic fft users need), anything else its CPU
    kernel on host copies (see [Note: complex tensors] in ops/complex.py)."""
    if op.kind == "pointwise":
        from tilewise.ops.complex import run_real_form

        out_dtype, _ = op.dtype_rule(op, args)  # refuses an operator without a complex meaning, as on the CPU
        try:
            found = run_real_form(op, args, out_dtype, device)
        except (KeyError, NotImplementedError):  # e.g. a complex Python scalar, which the parts cannot take
            found = None
        if found is not None:
            return found
    return _host(op, args, device)


def synchronize(device: Device) -> None:
    from tilewise.backends.cuda.runtime import synchronize as synchronize_device

    synchronize_device(device.index)


class CUDABackend(Backend):
    """This package as a :class:`~tilewise.device.Backend` (the dispatcher's and the tensors' view of it)."""

    pins_host_memory = True

    run = staticmethod(run)
    run_into = staticmethod(run_into)
    empty = staticmethod(empty)
    upload = staticmethod(upload)
    download = staticmethod(download)
    synchronize = staticmethod(synchronize)
    pin_memory = staticmethod(pin_memory)
    is_pinned = staticmethod(is_pinned)
    empty_pinned = staticmethod(empty_pinned)
    current_index = staticmethod(current_device)  # Device("cuda") is the thread's current device

    def __repr__(self) -> str:
        return "<CUDA backend>"


backend = CUDABackend()


def register_composite_runner(names: frozenset, runner) -> None:
    """[Plug-in point] Run the composite operators ``names`` through ``runner(op, args)`` (which returns None
    to decline) instead of their decomposition. The compiler registers itself here at import
    (``compiler.composites``): the backend stays below the compiler and never imports it."""
    global _fused, _fused_ops
    _fused, _fused_ops = runner, frozenset(names)


def _load_kernels() -> None:
    global _kernels, _pointwise, _pointwise_into, _reduction, _host
    from tilewise.backends.cuda import (  # noqa: F401 — attention; fft; the linalg primitives; mm, bmm, linear;
        attention,  # an LSTM layer's time loop; convolutions
        convolution,
        fft,
        linalg,
        matmul,
        recurrent,
        scaled_mm,
    )
    from tilewise.backends.cuda.kernels import (  # noqa: F401 — each module registers its kernels
        KERNELS,
        copy,
        creation,
        index,
        random,
        scan,
        search,
        sort,
    )
    from tilewise.backends.cuda.kernels.fallback import run_on_host
    from tilewise.backends.cuda.kernels.pointwise import run_pointwise, run_pointwise_into
    from tilewise.backends.cuda.kernels.reduction import run_reduction

    _kernels, _pointwise, _reduction, _host = KERNELS, run_pointwise, run_reduction, run_on_host
    _pointwise_into = run_pointwise_into


__all__ = ["SMALL_BLOCK", "SMALL_CACHE_LIMIT", "CUDABackend", "DeviceBuffer", "DeviceMemory", "backend", "cpu",
           "data_ptr", "download", "empty", "empty_fast", "empty_pinned", "is_pinned", "memory", "pin_memory",
           "record_stream", "run", "stream_handle", "upload"]


# torch.backends.cuda's functions (see backends/cuda/torch_api.py)
from tilewise.backends.cuda.torch_api import (  # noqa: E402
    cudnn_sdp_enabled,
    enable_cudnn_sdp,
    enable_flash_sdp,
    enable_math_sdp,
    enable_mem_efficient_sdp,
    flash_sdp_enabled,
    is_built,
    math_sdp_enabled,
    mem_efficient_sdp_enabled,
    sdp_kernel,
)
