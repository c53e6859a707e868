"""Atomic file writes: a reader sees the old file or the complete new one, never a part.

:func:`atomic_write` writes through a temporary file next to the target
(``path + ".tmp-<pid>"``), flushes and ``fsync``\\ s it, renames it over the
target with ``os.replace`` (atomic on POSIX file systems) and ``fsync``\\ s the
directory so that the rename itself survives a crash. If anything fails
before the rename, the temporary file is removed and the old file is left as
it was.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "state.json")
    >>> atomic_write(path, lambda f: f.write(b'{"step": 1}'))
    >>> open(path, "rb").read()
    b'{"step": 1}'
    >>> os.listdir(os.path.dirname(path))
    ['state.json']
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from typing import IO, Any

__all__ = [
    "HashingWriter",
    "atomic_write",
    "atomic_write_hashed",
    "fsync_directory",
    "sha256_of",
    "temporary_path",
]


def temporary_path(path: str) -> str:
    """The temporary name :func:`atomic_write` uses for ``path`` in this process.

    Example:
        >>> temporary_path("/ckpt/ckpt-1.index.json").startswith("/ckpt/ckpt-1.index.json.tmp-")
        True
    """
    return f"{path}.tmp-{os.getpid()}"


def fsync_directory(directory: str) -> None:
    """``fsync`` a directory, so that renames and deletions in it are durable.

    File systems that cannot open a directory (some network file systems,
    Windows) are skipped silently: the rename is still atomic there.

    Example:
        >>> import tempfile
        >>> fsync_directory(tempfile.mkdtemp())
    """
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write_fn: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` atomically: ``write_fn(f)`` fills a temporary binary file first.

    The steps: open ``path + ".tmp-<pid>"``, call ``write_fn`` on it, flush,
    ``os.fsync``, ``os.replace`` onto ``path``, ``fsync`` the directory. An
    exception in any step before the rename removes the temporary file and
    propagates; ``path`` keeps its old content (or stays absent).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.bin")
        >>> atomic_write(path, lambda f: f.write(b"old"))
        >>> def crash(f):
        ...     f.write(b"half of the new")
        ...     raise OSError("disk full")
        >>> try:
        ...     atomic_write(path, crash)
        ... except OSError as e:
        ...     print(e)
        disk full
        >>> open(path, "rb").read(), os.listdir(os.path.dirname(path))
        (b'old', ['a.bin'])
    """
    path = os.fspath(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(os.path.dirname(os.path.abspath(path)))


class HashingWriter:
    """A write-only stream that hashes what it passes on. It cannot seek, so ``zipfile`` (under
    ``np.savez``) writes an archive in one pass and the digest is that of the file, without
    reading it back.

    Example:
        >>> import io
        >>> w = HashingWriter(io.BytesIO()); _ = w.write(b"abc")
        >>> w.digest.hexdigest()[:8], w.size, w.tell()
        ('ba7816bf', 3, 3)
    """

    def __init__(self, f: Any) -> None:
        self._f = f
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self._f.write(view)
        self.digest.update(view)
        self.size += len(view)
        return n

    def tell(self) -> int:
        return self.size

    def seekable(self) -> bool:
        return False

    def seek(self, *args: Any) -> int:
        raise OSError("a hashing stream cannot seek")

    def read(self, *args: Any) -> bytes:  # np.savez takes objects with .read for files
        raise OSError("a hashing stream is write-only")

    def flush(self) -> None:
        self._f.flush()


def atomic_write_hashed(
    path: str | os.PathLike[str], write_fn: Callable[[Any], Any]
) -> tuple[str, int]:
    """:func:`atomic_write` through a :class:`HashingWriter`; returns (sha256 hex, bytes).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
        >>> atomic_write_hashed(path, lambda f: f.write(b"abc"))[1]
        3
    """
    writers: list[HashingWriter] = []

    def write(f: IO[bytes]) -> None:
        writers.append(HashingWriter(f))
        write_fn(writers[-1])

    atomic_write(path, write)
    return writers[-1].digest.hexdigest(), writers[-1].size


def sha256_of(path: str | os.PathLike[str], chunk: int = 1 << 22) -> tuple[str, int]:
    """``(sha256 hex digest, size in bytes)`` of a file, read in chunks.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x")
        >>> atomic_write(path, lambda f: f.write(b"abc"))
        >>> sha256_of(path)[0][:16], sha256_of(path)[1]
        ('ba7816bf8f01cfea', 3)
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
