"""Files written so that a crash, a kill or a full disk leaves the old file or the whole new one, never a mix.

[Note: atomic files] Everything tilewise writes to disk (checkpoints, the demo's plot, the kernel caches'
entries) goes through :func:`atomic_writer`: the bytes go to a temporary file in the destination's own
directory (so the final rename never crosses file systems), are flushed and ``fsync``-ed, and the file is
then moved over the destination with ``os.replace``, which POSIX and Windows make atomic. A reader, in this
process or another, opens the old file or the complete new one; a process killed mid-write leaves the old
file in place and a temporary beside it (``.NAME.XXXXXXXX.tmp``), never a partial file under the final name.
Where the write must also survive a power loss (``durable=True``), the directory is ``fsync``-ed after the
rename so that the new directory entry is on disk too. The temporary is created with mode ``0o666`` less the
process's umask, as ``open`` would create the destination, rather than ``mkstemp``'s ``0o600``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_TEMPORARY_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """A fresh name beside ``path`` for the temporary that will replace it (hidden, ends in ``.tmp``)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{_TEMPORARY_SUFFIX}")


def is_temporary_of(candidate: Path, path: Path) -> bool:
    """Whether ``candidate`` is a temporary that :func:`atomic_writer` made on its way to ``path``."""
    name = candidate.name
    return name.startswith(f".{path.name}.") and name.endswith(_TEMPORARY_SUFFIX)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file whose contents replace ``path`` atomically when the ``with`` block ends without error.

    If the block raises, ``path`` is untouched and the temporary is removed. ``durable`` also syncs the
    directory, so that the rename survives a power loss (see [Note: atomic files]).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "numbers.txt"
    >>> with atomic_writer(target) as f:
    ...     _ = f.write(b"1 2 3")
    >>> target.read_bytes()
    b'1 2 3'
    """
    path = Path(path)
    if path.is_symlink():  # replace the file it points to, as writing through it would, not the link
        path = path.resolve()
    handle, temporary = _create_temporary(path)
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        fsync_directory(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview, *, durable: bool = True) -> None:
    """Replace ``path`` by ``data`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, durable=durable) as file:
        file.write(data)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename or creation in ``directory`` durable; a no-op where directories cannot be opened or synced."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        handle = os.open(directory, flags)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass  # some file systems (and Windows) do not sync directories; the rename itself was atomic
    finally:
        os.close(handle)


def _create_temporary(path: Path) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        temporary = temporary_path(path)
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue
        except FileNotFoundError:  # as open(path, "w") would say it, naming the file asked for
            raise FileNotFoundError(errno.ENOENT, f"No such file or directory (the folder {str(path.parent)!r} "
                                    "does not exist)", str(path)) from None
    raise FileExistsError(f"could not create a temporary file beside {path}")


__all__ = ["atomic_write_bytes", "atomic_writer", "fsync_directory", "is_temporary_of", "temporary_path"]
