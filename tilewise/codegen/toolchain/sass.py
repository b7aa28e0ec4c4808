"""SASS and resource usage of a cubin, without a GPU.

[Note: SASS]
``nvdisasm -c -g`` turns a cubin into SASS text (code sections only, with line info where the cubin has
it). The executable is looked up with cuda.pathfinder, then in the ``nvidia/cu13/bin`` folder of the
nvidia-cuda-nvdisasm wheel, then on PATH. Resource usage (registers, static shared memory, local memory
per thread, which holds spills) comes from ``cuobjdump -res-usage`` when that tool is installed, and
otherwise is read straight from the cubin's ELF: the ``.nv.info`` section carries, per kernel symbol,
EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x11) records, and the static shared memory is the size of
the kernel's ``.nv.shared.<kernel>`` section. Both readers give the same :class:`ResourceUsage` figures
(checked on an H200 against cuobjdump 13.0 and ``cuFuncGetAttribute``): ``local_bytes`` is the stack frame
(cuobjdump's STACK; its LOCAL column reads 0 for a spilling kernel), equal to the driver's
LOCAL_SIZE_BYTES. On sm_90 and later the shared figure (the section, and cuobjdump's SHARED) includes
1 KiB that the toolchain reserves per block, so it is 1 KiB more than the driver's SHARED_SIZE_BYTES,
which counts only the kernel's own ``__shared__`` arrays.

nvdisasm costs about a second per run whatever the kernel's size (its start-up), and a training step has a
few hundred kernels: SASS text is therefore kept per cubin (in memory, and on disk beside the kernel cache,
keyed by the cubin's bytes and the disassembler's identity, written atomically), and
:func:`disassemble_all` runs the disassembler on many cubins at once, one process per core.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tilewise.fileio import atomic_write_bytes

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04
_SHT_SYMTAB = 2
_TOOL_TIMEOUT_S = 120
_SASS_FORMAT_VERSION = 1  # of the files under ``sass-v<N>/`` in the kernel cache's directory
_DISASSEMBLY_ARGUMENTS = ("-c", "-g")


class ToolNotFoundError(RuntimeError):
    """A CUDA binary utility (nvdisasm, cuobjdump) is not installed."""


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel resources, per thread for registers/local memory and per block for shared memory."""

    kernel: str
    registers: int
    shared_bytes: int
    local_bytes: int
    source: str  # "cuobjdump" or "elf"


@cache
def find_binary_utility(name: str) -> str | None:
    """Path of a CUDA binary utility ("nvdisasm", "cuobjdump"), or None."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility(name)
    except Exception:  # pathfinder missing or unaware of the tool: keep looking
        found = None
    return found or _find_in_nvidia_wheels(name) or shutil.which(name)


def _find_in_nvidia_wheels(name: str) -> str | None:
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        candidate = Path(root) / "cu13" / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _run_on_cubin(tool: str, arguments: list[str], cubin: bytes) -> str:
    with tempfile.TemporaryDirectory(prefix="tilewise-sass-") as directory:
        path = Path(directory) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(
            [tool, *arguments, str(path)], capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(tool).name} {' '.join(arguments)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (``nvdisasm -c -g``), remembered per cubin (see [Note: SASS]).

    >>> from tilewise.codegen.toolchain.nvrtc import compile_cuda
    >>> k = compile_cuda('extern "C" __global__ void one(float* o) { *o = 1.f; }', "one")  # doctest: +SKIP
    >>> "STG" in disassemble(k.cubin)  # doctest: +SKIP
    True
    """
    tool = find_binary_utility("nvdisasm")
    if tool is None:
        raise ToolNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or put a CUDA toolkit on PATH")
    key = _sass_key(tool, cubin)
    with _remembered_lock:
        text = _remembered.get(key)
    if text is None:
        path = _sass_path(key)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            text = _run_on_cubin(tool, list(_DISASSEMBLY_ARGUMENTS), cubin)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, text.encode(), durable=False)
            except OSError:
                pass  # a read-only cache directory: the text is still remembered in this process
        with _remembered_lock:
            _remembered[key] = text
    return text


def disassemble_all(cubins: Sequence[bytes]) -> list[str]:
    """:func:`disassemble` of each cubin, in order, with the disassembler run on several at once."""
    workers = max(1, min(len(cubins), os.cpu_count() or 1))
    if workers == 1:
        return [disassemble(c) for c in cubins]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tilewise-nvdisasm") as pool:
        return list(pool.map(disassemble, cubins))


_remembered: dict[str, str] = {}
_remembered_lock = threading.Lock()


def _sass_key(tool: str, cubin: bytes) -> str:
    """What determines the text: the cubin's bytes, the disassembler (its path, size and time) and its flags."""
    stat = os.stat(tool)
    identity = f"{_SASS_FORMAT_VERSION}\0{tool}\0{stat.st_size}\0{stat.st_mtime_ns}\0{' '.join(_DISASSEMBLY_ARGUMENTS)}"
    return hashlib.sha256(identity.encode() + b"\0" + cubin).hexdigest()


def _sass_path(key: str) -> Path:
    from tilewise.codegen.toolchain.cache import default_cache_dir

    return default_cache_dir() / f"sass-v{_SASS_FORMAT_VERSION}" / f"{key}.sass"


def resource_usage(cubin: bytes) -> dict[str, ResourceUsage] | None:
    """Registers, shared and local memory of each kernel in ``cubin``; None if neither reader can tell."""
    tool = find_binary_utility("cuobjdump")
    if tool is not None:
        try:
            return parse_res_usage(_run_on_cubin(tool, ["-res-usage"], cubin))
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            pass  # fall through to the ELF reader
    try:
        return elf_resource_usage(cubin)
    except (ValueError, struct.error):
        return None


_FUNCTION_LINE = re.compile(r"^\s*Function (\S+):\s*$")
_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_res_usage(text: str) -> dict[str, ResourceUsage]:
    """Parse ``cuobjdump -res-usage`` output."""
    usage: dict[str, ResourceUsage] = {}
    kernel = None
    for line in text.splitlines():
        match = _FUNCTION_LINE.match(line)
        if match:
            kernel = match.group(1)
            continue
        fields = dict(_FIELD.findall(line))
        if kernel is not None and "REG" in fields:
            local = max(int(fields.get("STACK", 0)), int(fields.get("LOCAL", 0)))
            usage[kernel] = ResourceUsage(kernel, int(fields["REG"]), int(fields.get("SHARED", 0)), local, "cuobjdump")
            kernel = None
    return usage


# ---- the ELF reader ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def _sections(elf: bytes) -> list[_Section]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    section_offset = struct.unpack_from("<Q", elf, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", elf, section_offset + i * entry_size) for i in range(count)]
    names_offset = raw[names_index][4]
    return [_Section(_c_string(elf, names_offset + r[0]), r[1], r[4], r[5], r[6]) for r in raw]


def _c_string(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode()


def _symbol_names(elf: bytes, sections: list[_Section]) -> list[str]:
    symtab = next(s for s in sections if s.type == _SHT_SYMTAB)
    strtab = sections[symtab.link]
    return [
        _c_string(elf, strtab.offset + struct.unpack_from("<I", elf, symtab.offset + i * 24)[0])
        for i in range(symtab.size // 24)
    ]


def _per_symbol_attributes(elf: bytes, info: _Section) -> dict[tuple[int, int], int]:
    """{(attribute, symbol index): value} for the (symbol, value) records of the global .nv.info."""
    found = {}
    position, end = info.offset, info.offset + info.size
    while position + 4 <= end:
        fmt, attribute, size = elf[position], elf[position + 1], struct.unpack_from("<H", elf, position + 2)[0]
        if fmt != _EIFMT_SVAL:
            position += 4
            continue
        if size == 8:
            symbol, value = struct.unpack_from("<II", elf, position + 4)
            found[(attribute, symbol)] = value
        position += 4 + size
    return found


def elf_resource_usage(cubin: bytes) -> dict[str, ResourceUsage]:
    """Resource usage read from the cubin's ELF sections (see the note at the top)."""
    sections = _sections(cubin)
    symbols = _symbol_names(cubin, sections)
    info = next((s for s in sections if s.name == ".nv.info"), None)
    attributes = _per_symbol_attributes(cubin, info) if info is not None else {}
    shared = {s.name[len(".nv.shared.") :]: s.size for s in sections if s.name.startswith(".nv.shared.")}
    usage = {}
    for section in sections:
        if not section.name.startswith(".text."):
            continue
        kernel = section.name[len(".text.") :]
        index = symbols.index(kernel) if kernel in symbols else -1
        usage[kernel] = ResourceUsage(
            kernel=kernel,
            registers=attributes.get((_EIATTR_REGCOUNT, index), 0),
            shared_bytes=shared.get(kernel, 0),
            local_bytes=attributes.get((_EIATTR_FRAME_SIZE, index), 0),
            source="elf",
        )
    return usage
