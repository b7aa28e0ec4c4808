"""The C toolchain: compile generated C with the system compiler, load it with ctypes, cache it on disk.

[Note: C toolchain] The CPU target's kernels are plain C with OpenMP, built as a shared library with
``cc -O3 -march=native -fopenmp -shared -fPIC -ffp-contract=off`` (no FMA contraction, so results stay
those of the operators' expressions, as numpy computes them) and loaded with ``ctypes``. Two more flags
change no result but unlock vectorisation: ``-fno-trapping-math`` (comparisons such as the NaN checks of
``maximum`` may become blends) and ``-fno-math-errno`` (``sqrt`` becomes an instruction). Where glibc's
vector math library links, ``-DTW_LIBMVEC -lmvec`` lets loops call its vector ``exp``, ``log``, ``tanh``...
(within a few ulp of the scalar functions). As for CUDA
kernels (``cache.py``), the library is kept in memory and on disk, under ``$TILEWISE_CACHE_DIR`` or
``~/.cache/tilewise/kernels``, named by the sha256 of everything that changes the machine code: the
source, the flags, the compiler's version, the host CPU (``-march=native`` targets it) and
:data:`C_FORMAT_VERSION`. A library is written to a temporary name and moved into place, so concurrent
processes never load half a file; a second process compiling the same program loads it without running
the compiler.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tilewise.compiler.toolchain.cache import default_cache_dir
from tilewise.config import settings

C_FORMAT_VERSION = 1
C_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off", "-fno-trapping-math",
           "-fno-math-errno", "-std=gnu11", "-w")


class CCompileError(RuntimeError):
    """The C compiler rejected a generated kernel; the message has its log and the numbered source."""


@cache
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CCompileError(f"the C compiler {cc!r} is not usable ({exc}); install gcc or clang, or point "
                            "TILEWISE_CC at one") from None
    return out.splitlines()[0] if out else cc


@cache
def host_cpu() -> str:
    """What ``-march=native`` depends on: the CPU model and feature flags."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@cache
def vector_math_flags(cc: str) -> tuple[str, ...]:
    """``-DTW_LIBMVEC -lmvec`` when the compiler can link glibc's vector math library, else nothing.

    The answer is kept beside the compiled libraries, keyed by the compiler's version, so a process that
    finds its kernels in the disk cache does not pay for the probe either."""
    record = default_cache_dir() / "c" / f"libmvec-{hashlib.sha256(compiler_version(cc).encode()).hexdigest()[:16]}"
    try:
        return tuple(record.read_text().split())
    except OSError:
        pass
    probe = "#include <math.h>\nfloat f(float x) { return expf(x); }\nint main(void) { return (int)f(0.f); }\n"
    with tempfile.TemporaryDirectory(prefix="tilewise-cc-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(probe)
        done = subprocess.run([cc, str(src), "-o", str(Path(tmp) / "probe"), "-lmvec", "-lm"], capture_output=True)
    flags = ("-DTW_LIBMVEC", "-lmvec") if done.returncode == 0 else ()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(" ".join(flags))
    except OSError:
        pass
    return flags


def c_flags(cc: str) -> tuple[str, ...]:
    return C_FLAGS + vector_math_flags(cc)


def c_cache_key(source: str, cc: str, flags: tuple[str, ...]) -> str:
    material = json.dumps({"format": C_FORMAT_VERSION, "source": source, "flags": list(flags),
                           "compiler": compiler_version(cc), "cpu": host_cpu()}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class CStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0


class CLibraryCache:
    """Memory + disk cache of compiled C libraries; ``last_source`` is "memory", "disk" or "cc"."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir() / "c"
        self.stats = CStats()
        self.last_source: str | None = None
        self._memory: dict[str, ctypes.CDLL] = {}
        self._lock = threading.Lock()

    def path_for(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.so"

    def load(self, source: str) -> ctypes.CDLL:
        cc = settings.cc
        flags = c_flags(cc)
        key = c_cache_key(source, cc, flags)
        with self._lock:
            lib = self._memory.get(key)
            if lib is not None:
                self.stats.memory_hits += 1
                self.last_source = "memory"
                return lib
            path = self.path_for(key)
            if path.exists():
                self.stats.disk_hits += 1
                self.last_source = "disk"
            else:
                self._compile(source, cc, flags, path)
                self.stats.compiles += 1
                self.last_source = "cc"
            lib = ctypes.CDLL(str(path))
            self._memory[key] = lib
            return lib

    def _compile(self, source: str, cc: str, flags: tuple[str, ...], path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tilewise-cc-") as tmp:
            src = Path(tmp) / "kernels.c"
            src.write_text(source)
            out = Path(tmp) / "kernels.so"
            done = subprocess.run([cc, *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
            if done.returncode != 0:
                raise CCompileError(f"{cc} failed on generated kernels:\n{done.stderr}\n{_numbered(source)}")
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
            os.close(handle)
            shutil.copyfile(out, temporary)
            os.replace(temporary, path)


def _numbered(source: str, limit: int = 400) -> str:
    lines = source.splitlines()
    shown = [f"{k + 1:5d}  {line}" for k, line in enumerate(lines[:limit])]
    if len(lines) > limit:
        shown.append(f"       ... ({len(lines) - limit} more lines)")
    return "\n".join(shown)


_default: CLibraryCache | None = None


def default_c_cache() -> CLibraryCache:
    global _default
    if _default is None:
        _default = CLibraryCache()
    return _default
