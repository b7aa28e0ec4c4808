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
:data:`C_FORMAT_VERSION`. A library on disk is sealed and written atomically ([Note: disk caches] in
``disk.py``): its length and checksum are checked before it is loaded, because ``dlopen`` maps a truncated
library without complaint and the process dies of SIGBUS when it runs it. A damaged library is built again
and replaced; where the cache directory cannot be written, libraries are built and loaded from a private
temporary directory. A second process compiling the same program loads it without running the compiler.

[Note: the OpenMP runtime] GNU OpenMP's threads spin between parallel loops by default (``OMP_WAIT_POLICY``
unset: about 300,000 iterations before they sleep). On a machine whose cores are also busy with other work —
BLAS workers, the Python thread, other processes — a spinning thread holds a core that the thread everyone
waits for at the next barrier needs. Measured on 2 shared cores (a compiled nanoGPT training step, load
average 6-7): 370-1700 ms per step spinning, 40-80 ms passive, 45-80 ms on one thread. So the runtime is
loaded before the first program, with ``OMP_WAIT_POLICY=PASSIVE`` in the environment for the moment it
reads it (its constructor), unless the user set a policy (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``); the
variable is removed again, so other OpenMP runtimes (torch's own copy) and child processes never see it.
Where libgomp was already loaded by someone else, it keeps the policy it was loaded with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import platform
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tilewise.codegen.toolchain.cache import default_cache_dir
from tilewise.codegen.toolchain.disk import DiskCache
from tilewise.config import settings

C_FORMAT_VERSION = 2
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
    disk = DiskCache(default_cache_dir() / "c", "C kernel cache")
    # versioned: processes of another tilewise version may share the directory, and must not read this format
    record = f"libmvec-v{C_FORMAT_VERSION}-{hashlib.sha256(compiler_version(cc).encode()).hexdigest()[:16]}"
    remembered = disk.read(record)
    if remembered is not None:
        return tuple(remembered.decode().split())
    probe = "#include <math.h>\nfloat f(float x) { return expf(x); }\nint main(void) { return (int)f(0.f); }\n"
    with tempfile.TemporaryDirectory(prefix="tilewise-cc-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(probe)
        done = subprocess.run([cc, str(src), "-o", str(Path(tmp) / "probe"), "-lmvec", "-lm"], capture_output=True)
    flags = ("-DTW_LIBMVEC", "-lmvec") if done.returncode == 0 else ()
    disk.write(record, " ".join(flags).encode())
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
    damaged: int = 0  # libraries found on disk that failed validation or would not load, and were rebuilt


class CLibraryCache:
    """Memory + disk cache of compiled C libraries; ``last_source`` is "memory", "disk" or "cc"."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir() / "c"
        self.disk = DiskCache(self.directory, "C kernel cache")
        self.stats = CStats()
        self.last_source: str | None = None
        self._memory: dict[str, ctypes.CDLL] = {}
        self._lock = threading.Lock()

    def path_for(self, key: str) -> Path:
        return self.disk.path_for(_entry_name(key))

    def load(self, source: str) -> ctypes.CDLL:
        openmp_runtime()
        cc = settings.cc
        flags = c_flags(cc)
        key = c_cache_key(source, cc, flags)
        with self._lock:
            lib = self._memory.get(key)
            if lib is not None:
                self.stats.memory_hits += 1
                self.last_source = "memory"
                return lib
            lib = self._load_from_disk(key)
            if lib is not None:
                self.stats.disk_hits += 1
                self.last_source = "disk"
            else:
                lib = self._build(key, source, cc, flags)
                self.stats.compiles += 1
                self.last_source = "cc"
            self._memory[key] = lib
            return lib

    def _load_from_disk(self, key: str) -> ctypes.CDLL | None:
        """The cached library, loaded only once its length and checksum have been verified (see the note)."""
        damaged = self.disk.damaged
        try:
            if self.disk.read(_entry_name(key)) is None:
                return None
            try:
                return ctypes.CDLL(str(self.path_for(key)))
            except OSError as exc:  # sealed, yet not loadable here: build it again
                self.disk.report_damaged(self.path_for(key), f"it does not load ({exc})")
                return None
        finally:
            self.stats.damaged += self.disk.damaged - damaged

    def _build(self, key: str, source: str, cc: str, flags: tuple[str, ...]) -> ctypes.CDLL:
        with tempfile.TemporaryDirectory(prefix="tilewise-cc-") as tmp:
            built = _compile(source, cc, flags, Path(tmp))
            stored = self.disk.write(_entry_name(key), built.read_bytes())
            # without a usable cache directory the library is loaded from the temporary one: the mapping
            # outlives the file, which is removed with its directory
            return ctypes.CDLL(str(stored if stored is not None else built))


@cache
def openmp_runtime() -> ctypes.CDLL | None:
    """GNU OpenMP, which ``-fopenmp`` links, loaded with a passive wait policy (see [Note: the OpenMP runtime]);
    None where it is not found."""
    name = ctypes.util.find_library("gomp")
    if name is None:
        return None
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return ctypes.CDLL(name)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        return ctypes.CDLL(name)
    finally:
        del os.environ["OMP_WAIT_POLICY"]


def _entry_name(key: str) -> str:
    return f"{key[:2]}/{key}.so"


def _compile(source: str, cc: str, flags: tuple[str, ...], directory: Path) -> Path:
    """Compile ``source`` into ``directory``/kernels.so."""
    src = directory / "kernels.c"
    src.write_text(source)
    out = directory / "kernels.so"
    done = subprocess.run([cc, *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
    if done.returncode != 0:
        raise CCompileError(f"{cc} failed on generated kernels:\n{done.stderr}\n{_numbered(source)}")
    return out


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
