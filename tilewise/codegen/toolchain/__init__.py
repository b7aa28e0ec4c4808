"""The toolchain: CUDA C → PTX → cubin (NVRTC), the kernel cache, SASS; C through the host compiler (``cc``).

[Note: toolchain]
Everything here runs without a GPU: it turns source into binaries and reads them back (registers, SASS).
Loading a cubin into a context and launching it belong to the CUDA runtime
(``backends.cuda.runtime.module``). Importing this package imports no CUDA library: NVRTC is bound on first
use through ``tilewise._cuda_api``.
"""

from tilewise.codegen.toolchain.cache import (
    TOOLCHAIN_FORMAT_VERSION,
    KernelCache,
    cache_key,
    compile_cached,
    default_cache,
    default_cache_dir,
)
from tilewise.codegen.toolchain.nvrtc import (
    CompiledKernel,
    KernelCompileError,
    compile_cuda,
    cuda_include_dirs,
    nvrtc_available,
    nvrtc_version,
)
from tilewise.codegen.toolchain.sass import (
    ResourceUsage,
    ToolNotFoundError,
    disassemble,
    disassemble_all,
    find_binary_utility,
    resource_usage,
)

__all__ = [
    "TOOLCHAIN_FORMAT_VERSION",
    "CompiledKernel",
    "KernelCache",
    "KernelCompileError",
    "ResourceUsage",
    "ToolNotFoundError",
    "cache_key",
    "compile_cached",
    "compile_cuda",
    "cuda_include_dirs",
    "default_cache",
    "default_cache_dir",
    "disassemble",
    "disassemble_all",
    "find_binary_utility",
    "nvrtc_available",
    "nvrtc_version",
    "resource_usage",
]
