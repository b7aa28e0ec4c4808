"""tilewise: a deep-learning framework and compiler with PyTorch's API, built to be seen through.

>>> import tilewise as tw
>>> x = tw.arange(6.0).view(2, 3)
>>> (x.exp() * 2).sum(1).shape
tilewise.Size([2])
"""

from __future__ import annotations

from tilewise import _tensor_str  # noqa: F401 — gives Tensor its repr
from tilewise import dtypes as _dtypes
from tilewise.device import Device
from tilewise.device import Device as device  # noqa: N813 — torch spells the constructor tilewise.device
from tilewise.dtypes import (
    DType,
    bfloat16,
    bool_,
    cdouble,
    cfloat,
    complex64,
    complex128,
    double,
    finfo,
    float,
    float8_e4m3fn,
    float8_e5m2,
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
from tilewise.tensor import Size, Tensor, as_tensor, from_numpy, is_tensor, tensor
from tilewise.tensortypes import CPU_TYPES as _CPU_TYPES

globals().update({cls.__name__: cls for cls in _CPU_TYPES.values()})  # LongTensor, FloatTensor, ...
bool = bool_  # noqa: A001 — tilewise.bool, like torch.bool
dtype = DType

from tilewise import backends as _backends  # noqa: E402

_backends.load()

from tilewise import ops as _ops  # noqa: E402
from tilewise.ops.creation import (  # noqa: E402
    Generator,
    arange,
    default_generator,
    empty,
    empty_like,
    eye,
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

_api = _ops.build_api()  # every public operator function: tilewise.add, tilewise.exp, tilewise.max, ...
_clashes = sorted(set(_api) & set(globals()))
if _clashes:
    raise ImportError(f"operator names shadow tilewise names defined above: {_clashes}")
globals().update(_api)

from tilewise import (  # noqa: E402
    amp,
    autograd,  # noqa: E402
    distributions,
    fft,
    linalg,
    nn,
    optim,
    utils,
)
from tilewise._dlpack import from_dlpack  # noqa: E402 — also gives Tensor its __dlpack__ methods
from tilewise.amp import (  # noqa: E402
    autocast,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_cache_enabled,
    is_autocast_enabled,
)
from tilewise.autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from tilewise.backends import get_default_device, set_default_device  # noqa: E402
from tilewise.compiler import compile  # noqa: E402, A004 — tilewise.compile, like torch.compile
from tilewise.serialization import load, save  # noqa: E402

# isort: split
# torch's global settings and device modules: tilewise.backends.cuda.matmul.allow_tf32, tilewise.backends.cudnn,
# tilewise.cuda.amp, tilewise.cpu, tilewise.accelerator, tilewise.use_deterministic_algorithms, ...
from tilewise import accelerator, cpu  # noqa: E402
from tilewise.backends import cudnn as _cudnn  # noqa: E402
from tilewise.backends import mkldnn as _mkldnn  # noqa: E402
from tilewise.backends import mps as _mps  # noqa: E402
from tilewise.backends.cpu.threads import (  # noqa: E402
    get_num_interop_threads,
    get_num_threads,
    set_num_interop_threads,
    set_num_threads,
)
from tilewise.backends.cuda import matmul as _cuda_matmul  # noqa: E402
from tilewise.backends.flags import (  # noqa: E402
    are_deterministic_algorithms_enabled,
    get_deterministic_debug_mode,
    get_float32_matmul_precision,
    is_deterministic_algorithms_warn_only_enabled,
    set_deterministic_debug_mode,
    set_float32_matmul_precision,
    use_deterministic_algorithms,
)
from tilewise.cpu import amp as _cpu_amp  # noqa: E402
from tilewise.cuda import amp as _cuda_amp  # noqa: E402


def result_type(*operands) -> DType:
    return _dtypes.result_type(*operands)


def numel(t: Tensor) -> int:
    return t.numel()


def is_floating_point(t: Tensor) -> bool:
    return t.is_floating_point()


def is_complex(t: Tensor) -> bool:
    return t.is_complex()


__version__ = "0.1.0"
