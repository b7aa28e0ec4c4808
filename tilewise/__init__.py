"""tilewise: a deep-learning framework and compiler with PyTorch's API, built to be seen through.

>>> import tilewise as tw
>>> x = tw.arange(6.0).view(2, 3)
>>> (x.exp() * 2).sum(1).shape
tilewise.Size([2])
"""

from __future__ import annotations

from tilewise import _tensor_str  # noqa: F401 — gives Tensor its repr
from tilewise import dtypes as _dtypes
from tilewise._tensor_str import set_printoptions
from tilewise.device import Device
from tilewise.device import Device as device  # noqa: N813 — torch spells the constructor tilewise.device
from tilewise.dtypes import (
    DType,
    bfloat16,
    bool_,
    can_cast,
    cdouble,
    cfloat,
    complex64,
    complex128,
    double,
    finfo,
    float,
    float4_e2m1fn_x2,
    float8_e4m3fn,
    float8_e5m2,
    float8_e8m0fnu,
    float16,
    float32,
    float64,
    get_default_dtype,
    half,
    iinfo,
    int,
    int8,
    int16,
    int32,
    int64,
    long,
    promote_types,
    set_default_dtype,
    short,
    uint8,
)
from tilewise.layouts import (
    channels_last,
    channels_last_3d,
    contiguous_format,
    layout,
    legacy_contiguous_format,
    memory_format,
    preserve_format,
    strided,
)
from tilewise.storage import is_storage
from tilewise.tensor import Size, Tensor, as_tensor, from_numpy, is_inference, is_tensor, tensor
from tilewise.tensortypes import CPU_TYPES as _CPU_TYPES
from tilewise.tensortypes import set_default_tensor_type, typename

globals().update({cls.__name__: cls for cls in _CPU_TYPES.values()})  # LongTensor, FloatTensor, ...
bool = bool_  # noqa: A001 — tilewise.bool, like torch.bool
dtype = DType
# the constants torch exports (torch.inf, torch.pi, ...): Python floats, as torch's are
from math import e, inf, nan, pi  # noqa: E402, I001
newaxis = None

from tilewise import backends as _backends  # noqa: E402

_backends.load()

from tilewise.ops import functions as _functions  # noqa: E402 — tilewise.add, tilewise.exp, ...: every operator
from tilewise.ops.creation import (  # noqa: E402
    Generator,
    arange,
    default_generator,
    empty,
    empty_like,
    empty_permuted,
    eye,
    frombuffer,
    full,
    full_like,
    get_rng_state,
    initial_seed,
    linspace,
    manual_seed,
    normal,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    scalar_tensor,
    seed,
    set_rng_state,
    zeros,
    zeros_like,
)
from tilewise.ops.creation import deprecated_range as range  # noqa: E402, A004 — torch.range, end included
from tilewise.ops.storage_api import LEGACY_CPU as _LEGACY_STORAGES  # noqa: E402
from tilewise.ops.storage_api import TypedStorage, UntypedStorage, from_file  # noqa: E402

globals().update(_LEGACY_STORAGES)  # FloatStorage, LongStorage, ...
Storage = _LEGACY_STORAGES["FloatStorage"]  # torch.Storage is torch.FloatStorage
from tilewise.ops.windows import (  # noqa: E402
    bartlett_window,
    blackman_window,
    hamming_window,
    hann_window,
    kaiser_window,
)

_clashes = sorted(set(_functions.FUNCTIONS) & set(globals()))
if _clashes:
    raise ImportError(f"operator names shadow tilewise names defined above: {_clashes}")
globals().update(_functions.FUNCTIONS)

from tilewise import (  # noqa: E402
    amp,
    autograd,  # noqa: E402
    distributions,
    fft,
    library,
    linalg,
    nn,
    optim,
    profiler,  # fills the dispatcher's Profiler key (torch.profiler, too, loads with torch)
    random,
    utils,
)
from tilewise._dlpack import from_dlpack, to_dlpack  # noqa: E402 — also gives Tensor its __dlpack__ methods
from tilewise._lobpcg import lobpcg  # noqa: E402
from tilewise._lowrank import pca_lowrank, svd_lowrank  # noqa: E402
from tilewise.amp import (  # noqa: E402
    GradScaler,
    autocast,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_cache_enabled,
    is_autocast_enabled,
)
from tilewise.amp.autocast_mode import (  # noqa: E402
    get_autocast_cpu_dtype,
    get_autocast_gpu_dtype,
    is_autocast_cpu_enabled,
    set_autocast_cache_enabled,
    set_autocast_cpu_dtype,
    set_autocast_cpu_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
    set_autocast_gpu_dtype,
)
from tilewise.autograd import (  # noqa: E402
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tilewise.autograd.anomaly_mode import (  # noqa: E402
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_anomaly_enabled,
)
from tilewise.backends import get_default_device, set_default_device  # noqa: E402
from tilewise.compiler import compile  # noqa: E402, A004 — tilewise.compile, like torch.compile
from tilewise.nn.modules.rnn_functions import gru, lstm, rnn_relu, rnn_tanh  # noqa: E402 — torch.lstm, ...
from tilewise.ops.tags import Tag  # noqa: E402 — torch.Tag: operator tags (custom_op(..., tags=...))
from tilewise.profiler.explain import explain  # noqa: E402 — every layer of one compiled call, timed
from tilewise.profiler.report import report  # noqa: E402 — the same call as one self-contained HTML page
from tilewise.serialization import load, save  # noqa: E402

# isort: split
# torch's global settings and device modules: tilewise.backends.cuda.matmul.allow_tf32, tilewise.backends.cudnn,
# tilewise.cuda.amp, tilewise.cpu, tilewise.accelerator, tilewise.use_deterministic_algorithms, ...
from tilewise import _C, accelerator, cpu, jit, overrides, signal, special  # noqa: E402 — _C: torch._C's __torch_function__ switches
from tilewise.accelerator import get_device_module  # noqa: E402
from tilewise.backends import cudnn as _cudnn  # noqa: E402
from tilewise.backends import mha as _mha  # noqa: E402
from tilewise.backends import mkldnn as _mkldnn  # noqa: E402
from tilewise.backends import mps as _mps  # noqa: E402
from tilewise.backends.cpu.threads import (  # noqa: E402
    get_num_interop_threads,
    get_num_threads,
    init_num_threads,
    set_num_interop_threads,
    set_num_threads,
)
from tilewise.backends.cuda import matmul as _cuda_matmul  # noqa: E402
from tilewise.backends.flags import (  # noqa: E402
    are_deterministic_algorithms_enabled,
    get_deterministic_debug_mode,
    get_float32_matmul_precision,
    is_deterministic_algorithms_warn_only_enabled,
    is_warn_always_enabled,
    set_deterministic_debug_mode,
    set_float32_matmul_precision,
    set_flush_denormal,
    set_warn_always,
    use_deterministic_algorithms,
)
from tilewise.cpu import amp as _cpu_amp  # noqa: E402
from tilewise.cuda import OutOfMemoryError  # noqa: E402 — torch.OutOfMemoryError is torch.cuda's
from tilewise.cuda import amp as _cuda_amp  # noqa: E402
from tilewise.overrides import DisableTorchFunction, DisableTorchFunctionSubclass  # noqa: E402
from tilewise.quant.tensor import QuantizedTensor, dequantize, quantize  # noqa: E402


def result_type(*operands) -> DType:
    return _dtypes.result_type(*operands)


def numel(t: Tensor) -> int:
    return t.numel()


def is_floating_point(t: Tensor) -> bool:
    return t.is_floating_point()


def is_complex(t: Tensor) -> bool:
    return t.is_complex()


__version__ = "0.1.0"


def __getattr__(name: str):
    """``tilewise.distributed`` on first use, as ``torch.distributed`` is there after ``import torch`` (importing
    it with every ``import tilewise`` would cost its sockets, stores and transports where nothing uses them)."""
    if name in ("distributed", "func", "testing", "sparse"):  # these, too, only where a program uses them
        import importlib

        return importlib.import_module(f"tilewise.{name}")
    if name == "vmap":  # torch.vmap is torch.func.vmap
        from tilewise.func import vmap

        return vmap
    if name in ("chalf", "complex32"):
        raise AttributeError(f"module 'tilewise' has no attribute {name!r}: {_dtypes.NO_COMPLEX32}")
    raise AttributeError(f"module 'tilewise' has no attribute {name!r}")
