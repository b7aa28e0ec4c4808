"""The on-disk side of every compile cache: sealed entries, atomic writes, and a cache that can fail.

[Note: disk caches] Four things are kept under ``$TILEWISE_CACHE_DIR``: NVRTC's compiled kernels
(``cache.py``), the C target's shared libraries and its vector-math probe (``cc.py``), the NVRTC version and
header directories (``toolchain-v2.json``) and ``mode="max-autotune"``'s decisions (``autotune/``). Each is
an optimisation only, so none may make a compile fail or the process crash, whatever is found on disk:

* **Every entry is sealed.** Its bytes end with a one-line trailer, ``TWSEAL1 <length> <sha256>``, over the
  bytes before it (a trailer rather than a header, so that a sealed ``.so`` is still an ELF file that
  ``dlopen`` maps as it is). An entry is used only after its length and checksum match: a truncated shared
  library, which ``dlopen`` maps and the process then dies of (SIGBUS) when it touches the missing pages, or
  a file of garbage, is never loaded; it is counted as damaged and rebuilt, and the rebuilt entry replaces it.
* **Every write is atomic** (``tilewise.fileio.atomic_writer``: a temporary in the same directory, fsync,
  ``os.replace``), so processes compiling the same kernel at once each publish a whole entry, and readers
  see one of them.
* **A directory that cannot be used is skipped.** If the directory cannot be created (the path is a file,
  a parent is not writable) or an entry cannot be written (read-only or full disk), compilation goes on
  without storing entries: C libraries are built in a private temporary directory and loaded from there.
* **Every name carries its format's version** (in the key it is named by, or in the name itself), because
  processes of different tilewise versions may share one directory: none reads an entry of another format.
* **Each problem is reported once per process and cause** (a ``RuntimeWarning``: which cache, which path,
  what went wrong and what to do), not once per kernel.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path

from tilewise.fileio import atomic_write_bytes

_SEAL = b"TWSEAL1 "
_TRAILER_SIZE = 1 + len(_SEAL) + 16 + 1 + 64 + 1  # "\n" SEAL length(hex) " " sha256(hex) "\n"


def seal(payload: bytes) -> bytes:
    """``payload`` followed by its trailer (see [Note: disk caches])."""
    digest = hashlib.sha256(payload).hexdigest().encode()
    return b"".join((payload, b"\n", _SEAL, b"%016x" % len(payload), b" ", digest, b"\n"))


def unseal(data: bytes) -> bytes | None:
    """The payload of a sealed entry, or None when ``data`` is not one (truncated, extended, altered)."""
    if len(data) < _TRAILER_SIZE:
        return None
    trailer = data[-_TRAILER_SIZE:]
    if not trailer.startswith(b"\n" + _SEAL) or not trailer.endswith(b"\n"):
        return None
    start = 1 + len(_SEAL)
    try:
        length = int(trailer[start:start + 16], 16)
    except ValueError:
        return None
    digest = trailer[start + 17:start + 17 + 64]
    if length != len(data) - _TRAILER_SIZE:
        return None
    payload = data[:length]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    return payload


_warned: set[tuple] = set()
_warned_lock = threading.Lock()


def warn_once(cause: tuple, message: str) -> None:
    """A ``RuntimeWarning`` the first time this process meets ``cause``; nothing after."""
    with _warned_lock:
        if cause in _warned:
            return
        _warned.add(cause)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def blocking_path(path: Path) -> Path:
    """The nearest existing ancestor of ``path`` (``path`` itself if it exists): where a failed creation or
    write failed. Two caches under one unusable directory report it once, as one cause."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return path


class DiskCache:
    """Sealed entries in one directory: ``read`` gives a validated payload or None, ``write`` stores one.

    ``kind`` names the cache in warnings ("C kernel cache"). ``damaged`` counts entries found unusable;
    ``write_failures`` counts entries that could not be stored. After a failure to create the directory
    or write into it, this object stops writing (reads of what is there go on)."""

    def __init__(self, directory: str | os.PathLike, kind: str) -> None:
        self.directory = Path(directory)
        self.kind = kind
        self.damaged = 0
        self.write_failures = 0
        self.writable = True

    def path_for(self, name: str) -> Path:
        return self.directory / name

    def read(self, name: str) -> bytes | None:
        """The payload stored under ``name``; None when there is none or it is damaged (then reported once)."""
        path = self.path_for(name)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no directory (``write`` reports that)
            return None
        except OSError as exc:
            self.report_damaged(path, f"it cannot be read ({_describe(exc)})")
            return None
        payload = unseal(data)
        if payload is None:
            self.report_damaged(path, "its length or checksum does not match (truncated, or not written by tilewise)")
        return payload

    def report_damaged(self, path: Path, why: str) -> None:
        self.damaged += 1
        warn_once(("damaged", self.kind), f"tilewise: ignoring a damaged entry of the {self.kind}: {path}: {why}; "
                  "it is rebuilt and replaced (further damaged entries of this cache are rebuilt without a warning)")

    def write(self, name: str, payload: bytes) -> Path | None:
        """Store ``payload`` under ``name`` (sealed, atomically); the entry's path, or None if it was not stored."""
        if not self.writable:
            return None
        path = self.path_for(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, seal(payload), durable=False)  # a lost entry is only a recompile
        except OSError as exc:
            self.write_failures += 1
            self.writable = False
            self.report_unusable(path, exc)
            return None
        return path

    def report_unusable(self, path: Path, exc: OSError) -> None:
        where = blocking_path(path.parent)
        warn_once(("unusable", str(where)),
                  f"tilewise: the {self.kind} cannot store entries under {self.directory} ({_describe(exc)}, at "
                  f"{where}); compiling without keeping results on disk in this process. Point TILEWISE_CACHE_DIR "
                  "at a writable directory to keep them.")


def _describe(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"
