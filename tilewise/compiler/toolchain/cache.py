"""The kernel cache: compile a CUDA source once per machine, not once per process.

[Note: kernel cache]
An NVRTC compile costs tens of milliseconds; a model has hundreds of kernels. Results are kept in memory
(per process) and on disk in ``$TILEWISE_CACHE_DIR`` or ``~/.cache/tilewise/kernels``. The key is the
sha256 of everything that changes the output, as Triton does: the source, the kernel names and name
expressions, the target arch, the full NVRTC option list (include directories too), the NVRTC version,
and :data:`TOOLCHAIN_FORMAT_VERSION`, which is bumped whenever this file format or the meaning of an
option changes. An entry is written to a temporary file in the same directory and moved into place with
``os.replace``, so readers see a whole entry or none, even with several processes compiling at once.
Each entry starts with a magic string and the sha256 of its body; an entry that fails either check, or
does not parse, is counted as corrupt, ignored, recompiled and overwritten. The disk cache is an
optimisation: if it cannot be written (read-only home, full disk) compilation still succeeds.

Finding the NVRTC version (loading the library) and the header directories costs about a hundred milliseconds,
more than a first call served from disk should take. So the cache directory remembers them in
``toolchain.json``, under a stamp of the installation (the interpreter prefix, ``CUDA_HOME``/``CUDA_PATH``, and
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
import tempfile
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tilewise.compiler.toolchain.nvrtc import (
    CompiledKernel,
    build_options,
    compile_cuda,
    cuda_include_dirs,
    nvrtc_version,
)

TOOLCHAIN_FORMAT_VERSION = 1
_MAGIC = b"TILEWISE-KERNEL\n"
_DIGEST_SIZE = 32


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
    """Memory + disk cache in front of :func:`~tilewise.compiler.toolchain.nvrtc.compile_cuda`.

    ``last_source`` says where the latest :meth:`compile` result came from: "memory", "disk" or "nvrtc".

    >>> cache = KernelCache("/tmp/tilewise-doc-cache")  # doctest: +SKIP
    >>> k = cache.compile('extern "C" __global__ void one(float* o) { *o = 1.f; }', "one")  # doctest: +SKIP
    >>> cache.last_source  # doctest: +SKIP
    'nvrtc'
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, use_disk: bool = True) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.use_disk = use_disk
        self.stats = CacheStats()
        self._toolchain: tuple | None = None
        self.last_source: str | None = None
        self._memory: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()

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
        """Like ``compile_cuda``, but served from memory or disk when this exact compile was done before."""
        names = (names,) if isinstance(names, str) else tuple(names)
        options = tuple(options)
        version, dirs = self.toolchain()
        key = cache_key(source, names, arch, build_options(arch, options, dirs), version, name_expressions, filename)
        with self._lock:
            kernel = self._memory.get(key)
        if kernel is not None:
            return self._hit(kernel, "memory")
        kernel = self._read(key) if self.use_disk else None
        if kernel is not None:
            with self._lock:
                self._memory[key] = kernel
            return self._hit(kernel, "disk")
        if (version, dirs) != (nvrtc_version(), cuda_include_dirs()):  # remembered wrongly: key by what is here
            self.toolchain(refresh=True)
            return self.compile(source, names, arch, options, filename=filename, name_expressions=name_expressions)
        kernel = compile_cuda(source, names, arch, options, filename=filename, name_expressions=name_expressions)
        self.stats.compiles += 1
        self.last_source = "nvrtc"
        with self._lock:
            self._memory[key] = kernel
        if self.use_disk:
            self._write(key, kernel)
        return kernel

    def toolchain(self, refresh: bool = False) -> tuple[tuple[int, int], tuple[str, ...]]:
        """(NVRTC version, CUDA header directories): remembered on disk per installation (see the note)."""
        found = None if refresh else self._toolchain
        if found is not None:
            return found
        stamp, path = installation_stamp(), self.directory / "toolchain.json"
        if self.use_disk and not refresh:
            try:
                data = json.loads(path.read_text())
                if data["stamp"] == stamp:
                    found = (tuple(data["nvrtc"]), tuple(data["include_dirs"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        if found is None:
            found = (nvrtc_version(), cuda_include_dirs())
            if self.use_disk:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    text = json.dumps({"stamp": stamp, "nvrtc": list(found[0]), "include_dirs": list(found[1])})
                    atomic_write(path, text.encode())
                except OSError:
                    pass  # remembered next time, perhaps; the lookup still worked
        self._toolchain = found
        return found

    def _hit(self, kernel: CompiledKernel, where: str) -> CompiledKernel:
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
        return self.directory / key[:2] / f"{key}.kernel"

    def _read(self, key: str) -> CompiledKernel | None:
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        kernel = decode_entry(data, key)
        if kernel is None:
            self.stats.corrupt_entries += 1
        return kernel

    def _write(self, key: str, kernel: CompiledKernel) -> None:
        path = self.path_for(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, encode_entry(key, kernel))
        except OSError as exc:
            self.stats.write_failures += 1
            warnings.warn(
                f"tilewise could not write the kernel cache entry {path}: {exc}", RuntimeWarning, stacklevel=3
            )


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
    """MAGIC, sha256(body), body; body = 4-byte header length, JSON header, cubin bytes."""
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
    body = len(header).to_bytes(4, "big") + header + (kernel.cubin or b"")
    return _MAGIC + hashlib.sha256(body).digest() + body


def decode_entry(data: bytes, key: str) -> CompiledKernel | None:
    """The kernel stored in ``data``, or None if the entry is damaged or belongs to another key."""
    if not data.startswith(_MAGIC):
        return None
    digest, body = data[len(_MAGIC) : len(_MAGIC) + _DIGEST_SIZE], data[len(_MAGIC) + _DIGEST_SIZE :]
    if hashlib.sha256(body).digest() != digest or len(body) < 4:
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


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers, in any process, see the old file or the whole new one."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
