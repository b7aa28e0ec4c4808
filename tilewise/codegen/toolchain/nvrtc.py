"""CUDA C to PTX and cubin with NVRTC.

[Note: NVRTC]
Generated kernels are compiled in-process by NVRTC, which needs no GPU, so the whole path down to SASS
can be shown on a CPU-only machine. For a real target (``sm_90``, ``sm_90a``, ``sm_100a``…) NVRTC gives
both PTX and a cubin; the runtime loads the cubin, so no driver JIT happens at run time. For a virtual
target (``compute_90``) there is PTX only. NVRTC has no built-in CUDA headers: when a header directory of
a CUDA install or of the nvidia-cuda-runtime wheel can be found, it is added with ``-I`` so that
``cuda_bf16.h``/``cuda_fp8.h`` resolve. NVRTC rejects options it does not know (``-O3`` is one), and a
failed compile raises :class:`KernelCompileError` with the kernel name, the compiler log, and the source
lines the log points at, numbered, so a codegen bug reads like a compiler error in one's own file.
NVRTC contracts a multiply and an add into a fused multiply-add by default (``--fmad=true``), as nvcc does for
torch's own CUDA kernels; where torch's results depend on one, the operator's expression says ``fma`` explicitly
(see [Note: fused multiply-adds of torch's kernels] in ops/pointwise.py), so the C target, compiled without
contraction, computes the same.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from tilewise._cuda_api import CudaError, check, nvrtc_api

_ARCH_PATTERN = re.compile(r"^(sm|compute)_(\d+)([af]?)$")
_DIAGNOSTIC_PATTERN = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?P<kind>catastrophic error|error|warning)")
_MAX_EXCERPTS = 8
_EXCERPT_CONTEXT = 2


@dataclass(frozen=True)
class CompiledKernel:
    """The result of one NVRTC compile.

    ``names``: the kernels the source defines that the caller asked for; ``lowered_names`` maps C++ name
    expressions to their mangled names; ``cubin`` is None for a virtual (``compute_XX``) target.
    """

    names: tuple[str, ...]
    ptx: str
    cubin: bytes | None
    arch: str
    log: str
    compile_seconds: float
    options: tuple[str, ...] = ()
    lowered_names: Mapping[str, str] = field(default_factory=dict)
    from_cache: bool = False

    @property
    def name(self) -> str:
        return self.names[0]


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel; the message holds the kernel name(s), the log and numbered source excerpts."""

    def __init__(self, names: Sequence[str], arch: str, status: str, log: str, source: str, filename: str) -> None:
        self.names = tuple(names)
        self.arch = arch
        self.log = log
        self.source = source
        self.excerpt = source_excerpt(source, log, filename)
        kernels = ", ".join(repr(name) for name in self.names)
        parts = [
            f"NVRTC could not compile kernel {kernels} for {arch} ({status}).",
            "--- compiler log ---",
            log.strip(),
        ]
        if self.excerpt:
            parts += ["--- source at the reported lines ---", self.excerpt]
        super().__init__("\n".join(parts))


@lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = check(nvrtc_api().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def nvrtc_available() -> bool:
    """Whether CUDA C can be compiled here (cuda-bindings and the NVRTC library load); no GPU is needed."""
    try:
        nvrtc_version()
    except Exception:  # noqa: BLE001 — no cuda-bindings or no NVRTC library: nothing to compile with
        return False
    return True


@lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """Directories holding the CUDA headers (cuda_fp16.h, cuda_bf16.h, …), if any can be found."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
    except Exception:  # pathfinder missing or unable to look: fall back to the environment
        found = None
    if found is None:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        candidate = os.path.join(home, "include") if home else None
        found = candidate if candidate and os.path.isfile(os.path.join(candidate, "cuda_bf16.h")) else None
    return (found,) if found else ()


def validate_arch(arch: str) -> tuple[bool, int]:
    """(is_real_target, version number) for an arch like "sm_90"; ValueError for anything else."""
    match = _ARCH_PATTERN.match(arch)
    if match is None:
        raise ValueError(f"unknown CUDA target {arch!r}: expected e.g. 'sm_90', 'sm_90a', 'sm_100a' or 'compute_90'")
    return match.group(1) == "sm", int(match.group(2))


def build_options(arch: str, options: Iterable[str] = (), include_dirs: Iterable[str] | None = None) -> tuple[str, ...]:
    """The full NVRTC option list: the target, the caller's options, the CUDA header directories."""
    validate_arch(arch)
    dirs = cuda_include_dirs() if include_dirs is None else tuple(include_dirs)
    return (f"-arch={arch}", *options, *(f"-I{d}" for d in dirs))


def compile_cuda(
    source: str,
    names: str | Sequence[str],
    arch: str = "sm_90",
    options: Iterable[str] = (),
    *,
    filename: str = "kernel.cu",
    name_expressions: Sequence[str] = (),
    include_dirs: Iterable[str] | None = None,
) -> CompiledKernel:
    """Compile CUDA C ``source`` for ``arch`` with NVRTC (uncached; see ``cache.compile_cached``).

    >>> k = compile_cuda('extern "C" __global__ void one(float* o) { o[0] = 1.0f; }', "one")  # doctest: +SKIP
    >>> k.arch, k.ptx.count(".entry one"), len(k.cubin) > 0  # doctest: +SKIP
    ('sm_90', 1, True)
    """
    names = (names,) if isinstance(names, str) else tuple(names)
    full_options = build_options(arch, options, include_dirs)
    is_real, _ = validate_arch(arch)
    nvrtc = nvrtc_api()
    program = check(nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expression in name_expressions:
            check(nvrtc.nvrtcAddNameExpression(program, expression.encode()), "nvrtcAddNameExpression")
        encoded = [option.encode() for option in full_options]
        start = time.perf_counter()
        status = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)[0]
        seconds = time.perf_counter() - start
        log = _program_log(program)
        if int(status) != 0:
            raise KernelCompileError(names, arch, getattr(status, "name", str(status)), log, source, filename)
        return CompiledKernel(
            names=names,
            ptx=_program_ptx(program),
            cubin=_program_cubin(program) if is_real else None,
            arch=arch,
            log=log,
            compile_seconds=seconds,
            options=full_options,
            lowered_names={e: _lowered_name(program, e) for e in name_expressions},
        )
    finally:
        check(nvrtc.nvrtcDestroyProgram(program), "nvrtcDestroyProgram")


def _program_log(program: object) -> str:
    nvrtc = nvrtc_api()
    size = check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
    buffer = bytearray(size)  # NVRTC writes into it: never an immutable (possibly shared, cached) bytes object
    check(nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
    return buffer.rstrip(b"\0").decode(errors="replace")


def _program_ptx(program: object) -> str:
    nvrtc = nvrtc_api()
    size = check(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
    buffer = bytearray(size)
    check(nvrtc.nvrtcGetPTX(program, buffer), "nvrtcGetPTX")
    return buffer.rstrip(b"\0").decode()


def _program_cubin(program: object) -> bytes:
    nvrtc = nvrtc_api()
    size = check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
    buffer = bytearray(size)
    check(nvrtc.nvrtcGetCUBIN(program, buffer), "nvrtcGetCUBIN")
    return bytes(buffer)


def _lowered_name(program: object, expression: str) -> str:
    try:
        lowered = check(nvrtc_api().nvrtcGetLoweredName(program, expression.encode()), "nvrtcGetLoweredName")
    except CudaError as exc:
        raise ValueError(f"name expression {expression!r} does not name a kernel in the source") from exc
    return lowered.decode() if isinstance(lowered, bytes) else str(lowered)


def reported_lines(log: str, filename: str) -> list[int]:
    """The source line numbers the compiler log reports diagnostics for, in order, without repeats."""
    lines: list[int] = []
    for log_line in log.splitlines():
        match = _DIAGNOSTIC_PATTERN.match(log_line.strip())
        if match and match.group("file") == filename and int(match.group("line")) not in lines:
            lines.append(int(match.group("line")))
    return lines


def source_excerpt(source: str, log: str, filename: str = "kernel.cu") -> str:
    """Numbered source lines around each line the log points at (the reported line marked with '>')."""
    source_lines = source.splitlines()
    width = len(str(len(source_lines)))
    blocks = []
    for line_number in reported_lines(log, filename)[:_MAX_EXCERPTS]:
        first = max(1, line_number - _EXCERPT_CONTEXT)
        last = min(len(source_lines), line_number + _EXCERPT_CONTEXT)
        rows = [f"{filename}:{line_number}"]
        for number in range(first, last + 1):
            marker = ">" if number == line_number else " "
            rows.append(f"{marker} {number:>{width}} | {source_lines[number - 1]}")
        blocks.append("\n".join(rows))
    return "\n".join(blocks)
