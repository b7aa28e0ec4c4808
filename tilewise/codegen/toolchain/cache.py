"""The kernel cache: compile a CUDA source once per machine, not once per process.

[Note: kernel cache]
An NVRTC compile costs tens of milliseconds; a model has hundreds of kernels. Results are kept in memory
(per process) and on disk in ``$TILEWISE_CACHE_DIR`` or ``~/.cache/tilewise/kernels``. The key is the
sha256 of everything that changes the output, as Triton does: the source, the kernel names and name
expressions, the target arch, the full NVRTC option list (include directories too), the NVRTC version,
and :data:`TOOLCHAIN_FORMAT_VERSION`, which is bumped whenever this file format or the meaning of an
option changes. Entries are sealed, written atomically and validated before use, and the disk cache is
an optimisation that may fail without failing a compile ([Note: disk caches] in ``disk.py``): a damaged
entry is recompiled and replaced, and a directory that cannot be written is reported once and skipped.

Finding the NVRTC version (loading the library) and the header directories costs about a hundred milliseconds,
more than a first call served from disk should take. So the cache directory remembers them in
``toolchain-v2.json``, under a stamp of the installation (the interpreter prefix, ``CUDA_HOME``/``CUDA_PATH``, and
the modification times of the ``cuda.bindings`` and ``nvidia`` package directories, which a reinstall or
upgrade changes); a process whose stamp matches takes them from there. A miss, which compiles anyway, looks
them up again and keys the entry by what it found.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from tilewise.codegen.toolchain.disk import DiskCache
from tilewise.codegen.toolchain.nvrtc import (
    CompiledKernel,
    build_options,
    compile_cuda,
    cuda_include_dirs,
    nvrtc_version,
)

TOOLCHAIN_FORMAT_VERSION = 2
# versioned: processes of another tilewise version may share the directory, and must not read this format
TOOLCHAIN_RECORD = f"toolchain-v{TOOLCHAIN_FORMAT_VERSION}.json"


def default_cache_dir() -> Path:
    """``$TILEWISE_CACHE_DIR`` if set, else ``~/.cache/tilewise/kernels``."""
    configured = os.environ.get("TILEWISE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "tilewise" / "kernels"


def cache_key(
    source: str,
    names: Sequence[str],
    arch: str,
    options: Sequence[str],
    nvrtc: tuple[int, int],
    name_expressions: Sequence[str] = (),
    filename: str = "kernel.cu",
) -> str:
    """sha256 (hex) of everything that determines a compile's output."""
    material = json.dumps(
        {
            "format": TOOLCHAIN_FORMAT_VERSION,
            "source": source,
            "names": list(names),
            "name_expressions": list(name_expressions),
            "arch": arch,
            "options": list(options),
            "nvrtc": list(nvrtc),
            "filename": filename,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    corrupt_entries: int = 0
    write_failures: int = 0


class KernelCache:
    """Memory + disk cache in front of :func:`~tilewise.codegen.toolchain.nvrtc.compile_cuda`.

    ``last_source`` says where the latest :meth:`compile` result came from: "memory", "disk" or "nvrtc".

    >>> cache = KernelCache("/tmp/tilewise-doc-cache")  # doctest: +SKIP
    >>> k = cache.compile('extern "C" __global__ void one(float* o) { *o = 1.f; }', "one")  # doctest: +SKIP
    >>> cache.last_source  # doctest: +SKIP
    'nvrtc'
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, use_disk: bool = True) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.use_disk = use_disk
        self.disk = DiskCache(self.directory, "CUDA kernel cache")
        self.stats = CacheStats()
        self._toolchain: tuple | None = None
        self.last_source: str | None = None
        self._memory: dict[str, CompiledKernel] = {}
        self._compiling: dict[str, Future] = {}  # key -> the result of a compile another thread is doing
        self._lock = threading.Lock()
        self._toolchain_lock = threading.Lock()

    def compile(
        self,
        source: str,
        names: str | Sequence[str],
        arch: str = "sm_90",
        options: Iterable[str] = (),
        *,
        filename: str = "kernel.cu",
        name_expressions: Sequence[str] = (),
    ) -> CompiledKernel:
        """Like ``compile_cuda``, but served from memory or disk when this exact compile was done before. Threads
        may compile at once: one that asks for a kernel another is compiling waits for that compile."""
        names = (names,) if isinstance(names, str) else tuple(names)
        options = tuple(options)
        version, dirs = self.toolchain()
        key = cache_key(source, names, arch, build_options(arch, options, dirs), version, name_expressions, filename)
        with self._lock:
            kernel = self._memory.get(key)
            underway = self._compiling.get(key)
            if kernel is None and underway is None:
                mine = self._compiling[key] = Future()
        if kernel is not None:
            return self._hit(kernel, "memory")
        if underway is not None:
            return self._hit(underway.result(), "memory")
        try:
            kernel = self._compile_missing(key, source, names, arch, options, version, dirs, filename,
                                           name_expressions)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._compiling[key]
        mine.set_result(kernel)
        return kernel

    def holds(self, source: str, names: str | Sequence[str], arch: str = "sm_90", options: Iterable[str] = ()) -> bool:
        """Whether :meth:`compile` of these would be served without a compile: in memory, being compiled by another
        thread, or on the disk (the entry is not read here)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        version, dirs = self.toolchain()
        key = cache_key(source, names, arch, build_options(arch, tuple(options), dirs), version, (), "kernel.cu")
        with self._lock:
            if key in self._memory or key in self._compiling:
                return True
        return self.use_disk and self.path_for(key).exists()

    def _compile_missing(self, key: str, source: str, names: tuple[str, ...], arch: str, options: tuple[str, ...],
                         version: tuple[int, int], dirs: tuple[str, ...], filename: str,
                         name_expressions: Sequence[str]) -> CompiledKernel:
        """A kernel not in memory: from disk, or compiled (and written there)."""
        kernel = self._read(key) if self.use_disk else None
        if kernel is not None:
            with self._lock:
                self._memory[key] = kernel
            return self._hit(kernel, "disk")
        if (version, dirs) != (nvrtc_version(), cuda_include_dirs()):  # remembered wrongly: key by what is here
            self.toolchain(refresh=True)
            return self.compile(source, names, arch, options, filename=filename, name_expressions=name_expressions)
        kernel = compile_cuda(source, names, arch, options, filename=filename, name_expressions=name_expressions)
        with self._lock:
            self.stats.compiles += 1
            self._memory[key] = kernel
        self.last_source = "nvrtc"
        if self.use_disk:
            self._write(key, kernel)
        return kernel

    def toolchain(self, refresh: bool = False) -> tuple[tuple[int, int], tuple[str, ...]]:
        """(NVRTC version, CUDA header directories): remembered on disk per installation (see the note); looked up
        once when several threads ask at once."""
        found = None if refresh else self._toolchain
        if found is not None:
            return found
        with self._toolchain_lock:
            found = None if refresh else self._toolchain
            if found is not None:
                return found
            stamp = installation_stamp()
            if self.use_disk and not refresh:
                found = _remembered_toolchain(self.disk.read(TOOLCHAIN_RECORD), stamp)
            if found is None:
                found = (nvrtc_version(), cuda_include_dirs())
                if self.use_disk:
                    record = {"stamp": stamp, "nvrtc": list(found[0]), "include_dirs": list(found[1])}
                    self.disk.write(TOOLCHAIN_RECORD, json.dumps(record).encode())
            self._toolchain = found
            return found

    def _hit(self, kernel: CompiledKernel, where: str) -> CompiledKernel:
        with self._lock:
            if where == "memory":
                self.stats.memory_hits += 1
            else:
                self.stats.disk_hits += 1
        self.last_source = where
        return replace(kernel, from_cache=True)

    def clear_memory(self) -> None:
        """Forget the in-memory entries (the disk cache stays)."""
        with self._lock:
            self._memory.clear()

    def path_for(self, key: str) -> Path:
        return self.disk.path_for(_entry_name(key))

    def _read(self, key: str) -> CompiledKernel | None:
        damaged = self.disk.damaged
        data = self.disk.read(_entry_name(key))
        kernel = decode_entry(data, key) if data is not None else None
        if data is not None and kernel is None:
            self.disk.report_damaged(self.path_for(key), "its contents do not describe this kernel")
        self.stats.corrupt_entries += self.disk.damaged - damaged
        return kernel

    def _write(self, key: str, kernel: CompiledKernel) -> None:
        if self.disk.write(_entry_name(key), encode_entry(key, kernel)) is None:
            self.stats.write_failures += 1


def _entry_name(key: str) -> str:
    return f"{key[:2]}/{key}.kernel"


def _remembered_toolchain(data: bytes | None, stamp: list) -> tuple | None:
    """(NVRTC version, include directories) from the toolchain record, if it is one for this installation."""
    if data is None:
        return None
    try:
        record = json.loads(data)
        if record["stamp"] == stamp:
            return tuple(record["nvrtc"]), tuple(record["include_dirs"])
    except (ValueError, KeyError, TypeError):
        pass
    return None


def installation_stamp() -> list:
    """What changes when the CUDA toolchain a process would use changes (see [Note: kernel cache])."""
    stamp: list = [sys.prefix, os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
    for package in ("cuda.bindings", "nvidia"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for place in (spec.submodule_search_locations or ()) if spec is not None else ():
            try:
                stamp.append([package, place, os.stat(place).st_mtime_ns])
            except OSError:
                pass
    return stamp


def encode_entry(key: str, kernel: CompiledKernel) -> bytes:
    """An entry's payload (sealed by ``disk``): 4-byte header length, JSON header, cubin bytes."""
    header = json.dumps(
        {
            "key": key,
            "names": list(kernel.names),
            "arch": kernel.arch,
            "ptx": kernel.ptx,
            "log": kernel.log,
            "compile_seconds": kernel.compile_seconds,
            "options": list(kernel.options),
            "lowered_names": dict(kernel.lowered_names),
            "has_cubin": kernel.cubin is not None,
        }
    ).encode()
    return len(header).to_bytes(4, "big") + header + (kernel.cubin or b"")


def decode_entry(body: bytes, key: str) -> CompiledKernel | None:
    """The kernel in an entry's payload, or None if it does not parse or belongs to another key."""
    if len(body) < 4:
        return None
    header_size = int.from_bytes(body[:4], "big")
    try:
        header = json.loads(body[4 : 4 + header_size])
        if header["key"] != key:
            return None
        return CompiledKernel(
            names=tuple(header["names"]),
            ptx=header["ptx"],
            cubin=bytes(body[4 + header_size :]) if header["has_cubin"] else None,
            arch=header["arch"],
            log=header["log"],
            compile_seconds=float(header["compile_seconds"]),
            options=tuple(header["options"]),
            lowered_names=dict(header["lowered_names"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


_default_cache: KernelCache | None = None
_default_cache_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide kernel cache (directory from ``$TILEWISE_CACHE_DIR`` at first use)."""
    global _default_cache
    with _default_cache_lock:
        if _default_cache is None:
            _default_cache = KernelCache()
        return _default_cache


def compile_cached(
    source: str,
    names: str | Sequence[str],
    arch: str = "sm_90",
    options: Iterable[str] = (),
    **kwargs: object,
) -> CompiledKernel:
    """Compile through the process-wide :class:`KernelCache`."""
    return default_cache().compile(source, names, arch, options, **kwargs)  # type: ignore[arg-type]
