"""The CUDA toolchain: CUDA C → PTX → cubin (NVRTC), the kernel cache, SASS, and loading/launching.

[Note: toolchain]
Everything up to the cubin and its SASS runs without a GPU (``nvrtc``, ``cache``, ``sass``); only
``module`` (load and launch) needs one. Importing this package imports no CUDA library: NVRTC and the
driver are bound on first use through ``tilewise.backends.cuda.runtime.driver``.
"""

from tilewise.compiler.toolchain.cache import (
    TOOLCHAIN_FORMAT_VERSION,
    KernelCache,
    cache_key,
    compile_cached,
    default_cache,
    default_cache_dir,
)
from tilewise.compiler.toolchain.module import (
    Function,
    FunctionAttributes,
    Module,
    launch,
    load_module,
)
from tilewise.compiler.toolchain.nvrtc import (
    CompiledKernel,
    KernelCompileError,
    compile_cuda,
    cuda_include_dirs,
    nvrtc_available,
    nvrtc_version,
)
from tilewise.compiler.toolchain.sass import (
    ResourceUsage,
    ToolNotFoundError,
    disassemble,
    find_binary_utility,
    resource_usage,
)

__all__ = [
    "TOOLCHAIN_FORMAT_VERSION",
    "CompiledKernel",
    "Function",
    "FunctionAttributes",
    "KernelCache",
    "KernelCompileError",
    "Module",
    "ResourceUsage",
    "ToolNotFoundError",
    "cache_key",
    "compile_cached",
    "compile_cuda",
    "cuda_include_dirs",
    "default_cache",
    "default_cache_dir",
    "disassemble",
    "find_binary_utility",
    "launch",
    "load_module",
    "nvrtc_available",
    "nvrtc_version",
    "resource_usage",
]
