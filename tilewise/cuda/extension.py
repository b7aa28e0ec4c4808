"""``tilewise.cuda.load_inline`` and ``load``: one's own CUDA C kernels, compiled and launched as ours are.

[Note: CUDA extensions] torch's ``load_inline`` builds a C++ extension with nvcc and pybind11; here the source is
CUDA C kernels alone (``__global__`` functions, ``extern "C"`` or C++), and the rest is the toolchain generated
kernels already use: NVRTC through the kernel cache (keyed by source, arch and options, in memory and on disk),
the same diagnostics (a compile error quotes the log and the numbered source lines it points at, under the
file name given), nvdisasm for SASS, the cubin's ELF for registers and shared memory. ``compile_only=True``
stops before loading, so PTX, SASS and resource use are there on a machine without a GPU. A kernel is called
with its launch shape and its arguments (``kernel(x, out, n, grid=..., block=...)``): tensors go as device
pointers after a check that they are CUDA tensors on the module's device, Python numbers are packed to the width
of their parameter (read from the cubin), and the launch is ordered on the current stream, like ours. Each
launch inside a custom operator's kernel (``tilewise.library``) is remembered by that operator, so ``explain``
shows the PTX and SASS of the kernels a custom operator launches beside the generated ones.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.codegen.toolchain import ToolNotFoundError, compile_cached, disassemble, resource_usage
from tilewise.codegen.toolchain.nvrtc import CompiledKernel
from tilewise.device import Device
from tilewise.tensor import Tensor

__all__ = ["CudaKernel", "CudaModule", "load", "load_inline"]

_GLOBAL_RE = re.compile(r"(template\s*<[^>]*>\s*)?__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(")
PTX_LINES = 60
SASS_LINES = 80

# the custom operator whose kernel is running on this thread (set by tilewise.library): launches are told to it
ACTIVE_OPERATOR = threading.local()


@dataclass
class CudaKernel:
    """One ``__global__`` function of a module: its machine code and, once loaded, a launcher."""

    name: str
    lowered_name: str
    module: CudaModule = field(repr=False)
    function: object = field(default=None, repr=False)  # the loaded driver function (None: compile_only)

    @property
    def ptx(self) -> str:
        return self.module.ptx

    @property
    def sass(self) -> str:
        """The SASS of this kernel's part of the cubin (nvdisasm)."""
        return _kernel_section(self.module.sass, self.lowered_name)

    @property
    def registers(self) -> int | None:
        usage = self.module.resources.get(self.lowered_name)
        return usage.registers if usage is not None else None

    @property
    def shared_bytes(self) -> int | None:
        usage = self.module.resources.get(self.lowered_name)
        return usage.shared_bytes if usage is not None else None

    def __call__(self, *args, grid, block, shared_mem: int = 0, stream=None) -> None:
        """Launch on a ``grid`` of ``block``-sized blocks (ints or up to 3-tuples), ``shared_mem`` bytes of dynamic
        shared memory, on ``stream`` (default: the current stream of the module's device)."""
        from tilewise.backends.cuda.device_memory import stream_handle
        from tilewise.backends.cuda.runtime.module import launch

        if self.function is None:
            raise RuntimeError(f"{self.module.name}.{self.name}: the module was built with compile_only=True; load it "
                               "without compile_only to launch its kernels")
        device = self.module.device
        values = [_argument(self, k, a, device) for k, a in enumerate(args)]
        handle = stream_handle(device.index) if stream is None else int(getattr(stream, "cuda_stream", stream))
        launch(self.function, grid, block, values, shared_mem, handle)
        operator = getattr(ACTIVE_OPERATOR, "custom", None)
        if operator is not None:
            operator.launched(self.module)

    def describe(self) -> str:
        resources = f", {self.registers} registers/thread" if self.registers is not None else ""
        return f"kernel {self.name} ({self.module.arch}{resources})"


def _argument(kernel: CudaKernel, index: int, value, device: Device):
    if isinstance(value, Tensor):
        if value.device != device:
            raise ValueError(f"{kernel.module.name}.{kernel.name}: argument {index} is a tensor on {value.device}; "
                             f"the kernel runs on {device} and takes tensors on that device (move it with "
                             f".to('{device}'))")
        return value.data_ptr()
    if isinstance(value, bool):
        return int(value)
    return value


def _kernel_section(sass: str, name: str) -> str:
    """The lines of ``name``'s function in a whole cubin's SASS."""
    lines = sass.splitlines()
    start = next((k for k, line in enumerate(lines) if line.strip().startswith(f".text.{name}")
                  or f"//--------------------- .text.{name} " in line), None)
    if start is None:
        return sass
    end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith("//---------------------")), len(lines))
    return "\n".join(lines[start:end])


class CudaModule:
    """The kernels of one CUDA source, by name (``module.my_kernel(...)``), with the module's PTX, SASS and cubin."""

    def __init__(self, name: str, source: str, compiled: CompiledKernel, functions: Sequence[str], device: Device,
                 load: bool):
        self.name, self.source, self.compiled, self.device = name, source, compiled, device
        self.arch = compiled.arch
        self.kernels: dict[str, CudaKernel] = {}
        loaded = None
        if load:
            from tilewise.backends.cuda.runtime.module import load_module

            loaded = load_module(compiled.cubin, device.index)
        for fn in functions:
            lowered = compiled.lowered_names.get(fn, fn)
            kernel = CudaKernel(fn, lowered, self)
            if loaded is not None:
                kernel.function = loaded.get_function(lowered)
            self.kernels[fn] = kernel
        self._sass: str | None = None

    def __getattr__(self, name: str) -> CudaKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"module {self.__dict__.get('name')!r} has no kernel {name!r} (kernels: "
                             f"{sorted(kernels)}); name it in functions=[...]")

    def __dir__(self):
        return [*super().__dir__(), *self.kernels]

    def __repr__(self) -> str:
        return f"<CudaModule {self.name!r} ({self.arch}): {', '.join(self.kernels)}>"

    @property
    def ptx(self) -> str:
        return self.compiled.ptx

    @property
    def cubin(self) -> bytes:
        return self.compiled.cubin

    @property
    def sass(self) -> str:
        if self._sass is None:
            self._sass = disassemble(self.compiled.cubin)
        return self._sass

    @property
    def resources(self) -> dict:
        return resource_usage(self.compiled.cubin) or {}

    def machine_code(self) -> list[tuple[str, str]]:
        """(title, text) sections as ``explain`` shows a generated kernel's: PTX, then resources and SASS."""
        ptx = self.ptx.splitlines()
        more = f"\n... ({len(ptx) - PTX_LINES} more lines)" if len(ptx) > PTX_LINES else ""
        out = [(f"{self.name}: PTX ({self.arch})", "\n".join(ptx[:PTX_LINES]) + more)]
        for kernel in self.kernels.values():
            try:
                sass = kernel.sass.splitlines()
            except ToolNotFoundError as exc:
                out.append((f"kernel {kernel.name}: SASS", str(exc)))
                continue
            usage = self.resources.get(kernel.lowered_name)
            head = (f"{usage.registers} registers/thread, {usage.shared_bytes} B shared/block, {usage.local_bytes} B "
                    "local (spills)/thread\n") if usage is not None else ""
            more = f"\n... ({len(sass) - SASS_LINES} more lines)" if len(sass) > SASS_LINES else ""
            out.append((f"kernel {kernel.name}: SASS ({self.arch})", head + "\n".join(sass[:SASS_LINES]) + more))
        return out

    def explain(self) -> str:
        return "\n\n".join(f"== {title} ==\n{text}" for title, text in self.machine_code())


def _global_functions(source: str) -> list[str]:
    """The kernels a source defines, templates left out (they are named with their arguments: ``f<float>``)."""
    return list(dict.fromkeys(name for template, name in _GLOBAL_RE.findall(source) if not template))


def _target(device, arch: str | None, compile_only: bool) -> tuple[Device, str]:
    from tilewise.backends.cuda.runtime import current_device, get_device_properties, is_available

    device = Device(device) if device is not None else Device("cuda")
    if device.type != "cuda":
        raise ValueError(f"load_inline: kernels run on a CUDA device, not {device}")
    if device.index is None:  # tensors name their device's index: compare like with like
        device = Device("cuda", current_device() if is_available() else 0)
    if arch is not None:
        return device, arch
    if is_available():
        return device, get_device_properties(device.index).arch
    if compile_only:
        return device, "sm_90"
    raise RuntimeError("load_inline: no CUDA GPU is available to load the kernels on; pass compile_only=True (and "
                       "arch='sm_90' or another target) to compile them without one")


def load_inline(name: str, cuda_sources: str | Sequence[str], functions: str | Iterable[str] | None = None, *,
                cpp_sources: str | Sequence[str] = (), extra_cuda_cflags: Iterable[str] = (), arch: str | None = None,
                device=None, compile_only: bool = False, verbose: bool = False) -> CudaModule:
    """Compile CUDA C kernels with NVRTC and load them (``torch.utils.cpp_extension.load_inline``'s role).

    ``functions``: the ``__global__`` kernels to expose (default: every one in the source); ``compile_only``:
    compile for ``arch`` (default: the GPU's, or sm_90) and return the module with PTX and SASS, unloaded.

    >>> src = 'extern "C" __global__ void twice(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2; }'
    >>> m = load_inline("demo", src, ["twice"], compile_only=True, arch="sm_90")  # doctest: +SKIP
    >>> ".entry twice" in m.ptx, m.twice.registers > 0  # doctest: +SKIP
    (True, True)
    """
    if cpp_sources and any(s.strip() for s in ([cpp_sources] if isinstance(cpp_sources, str) else cpp_sources)):
        raise ValueError("load_inline: cpp_sources (host C++ bound with pybind11) are not supported; write the host "
                         "side in Python and launch the CUDA kernels with module.kernel(*args, grid=..., block=...)")
    source = cuda_sources if isinstance(cuda_sources, str) else "\n".join(cuda_sources)
    return _build(name, source, functions, extra_cuda_cflags, arch, device, compile_only, verbose, f"{name}.cu")


def load(name: str, sources: str | os.PathLike | Sequence[str | os.PathLike], functions=None, *,
         extra_cuda_cflags: Iterable[str] = (), extra_include_paths: Iterable[str] = (), arch: str | None = None,
         device=None, compile_only: bool = False, verbose: bool = False) -> CudaModule:
    """``load_inline`` of ``.cu`` files (concatenated; their directories are on the include path); errors quote
    the file's own name and lines."""
    paths = [Path(sources)] if isinstance(sources, (str, os.PathLike)) else [Path(s) for s in sources]
    source = "\n".join(p.read_text() for p in paths)
    includes = [*dict.fromkeys(str(p.resolve().parent) for p in paths), *extra_include_paths]
    options = [*extra_cuda_cflags, *(f"-I{d}" for d in includes)]
    filename = paths[0].name if len(paths) == 1 else f"{name}.cu"
    return _build(name, source, functions, options, arch, device, compile_only, verbose, filename)


def _build(name, source, functions, options, arch, device, compile_only, verbose, filename) -> CudaModule:
    names = [functions] if isinstance(functions, str) else list(functions) if functions is not None else \
        _global_functions(source)
    if not names:
        raise ValueError(f"load_inline({name!r}): no __global__ function in the source and none named in functions")
    missing = [n for n in names if "<" not in n and n not in _global_functions(source)]
    if missing:
        raise ValueError(f"load_inline({name!r}): no __global__ function named {missing} in the source (found: "
                         f"{_global_functions(source)})")
    device, arch = _target(device, arch, compile_only)
    compiled = compile_cached(source, names, arch, tuple(options), filename=filename, name_expressions=names)
    if verbose:
        print(f"load_inline {name}: {arch}, {'from the cache' if compiled.from_cache else 'compiled'} in "
              f"{compiled.compile_seconds * 1e3:.1f} ms{': ' + compiled.log if compiled.log.strip() else ''}")
    return CudaModule(name, source, compiled, names, device, load=not compile_only)
