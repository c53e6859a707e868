"""File sources of the input pipeline: listing files and reading their rows one file at a time.

A *reader* opens one file and gives its arrays (a bare array, a tuple or a
dict of arrays with the same first dimension); the dataset yields the rows
(first axis) of those arrays. Nothing is read whole when it can be avoided:

* ``.npy``: memory-mapped (``np.load(mmap_mode="r")``), rows are copied as they are yielded;
* ``.npz``: the member arrays are loaded when the file is opened (NumPy cannot
  memory-map inside a zip archive), one file at a time;
* HDF5: through h5py (imported only when used); rows are read from the open file.

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "a.npy"), np.arange(6).reshape(3, 2))
    >>> files = glob_files(os.path.join(d, "*.npy"))
    >>> with NpyReader().open(files[0]) as arrays:
    ...     print(arrays.shape, rows_of(files[0], arrays))
    (3, 2) 3
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np


def glob_files(pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """The files matching a glob pattern (or any of several), sorted and without duplicates.

    Raises ``ValueError`` when nothing matches, as TF's ``list_files`` does.

    Example: ``glob_files("/data/train-*.npy")`` gives ``("/data/train-0.npy", ...)``.
    """
    patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else list(pattern)
    if not patterns:
        raise ValueError("list_files got no pattern; expected a glob pattern such as 'data/*.npy'")
    found: set[str] = set()
    for p in patterns:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"list_files: pattern {p!r} is not a string; expected a glob pattern")
        found.update(f for f in glob.glob(os.path.expanduser(os.fspath(p))) if os.path.isfile(f))
    if not found:
        shown = ", ".join(repr(os.fspath(p)) for p in patterns)
        raise ValueError(
            f"list_files: no files match {shown} (relative to {os.getcwd()!r}); "
            "check the pattern, or pass the paths to Dataset.from_files"
        )
    return tuple(sorted(found))


def check_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """The paths as a tuple of str, checking each names an existing file.

    Example: ``check_paths(["a.npy", "b.npy"])`` gives ``("a.npy", "b.npy")``.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out = []
    for p in items:
        path = to_path(p, "from_files")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"from_files: {path!r} is not a file (relative to {os.getcwd()!r}); "
                "pass paths of existing files, or use Dataset.list_files(pattern)"
            )
        out.append(path)
    return tuple(out)


def to_path(name: Any, what: str = "read") -> str:
    """A file name given as str, bytes, ``os.PathLike`` or 0-d string array, as a str.

    Example: ``to_path(b"a.npy") == "a.npy"``.
    """
    if isinstance(name, np.ndarray) and name.ndim == 0:
        name = name[()]
    if isinstance(name, bytes):
        return name.decode()
    if isinstance(name, (str, os.PathLike)):
        return os.fspath(name)
    raise TypeError(
        f"{what}: got {type(name).__name__} {name!r} where a file name was expected; "
        "file readers (read_npy, read_npz, read_hdf5) read datasets of file names, "
        "such as Dataset.list_files(pattern) or Dataset.from_files(paths)"
    )


def _leaves(arrays: Any) -> list[tuple[str, Any]]:
    if isinstance(arrays, Mapping):
        return [(str(k), v) for k, v in arrays.items()]
    if isinstance(arrays, tuple):
        return [(str(i), v) for i, v in enumerate(arrays)]
    return [("array", arrays)]


def rows_of(path: str, arrays: Any) -> int:
    """The common first dimension of the arrays read from ``path`` (ValueError if they differ).

    Example: ``rows_of("f.npz", {"x": np.zeros((4, 2)), "y": np.zeros(4)}) == 4``.
    """
    sizes = {}
    for name, a in _leaves(arrays):
        shape = tuple(a.shape)
        if len(shape) == 0:
            raise ValueError(
                f"{path}: array {name!r} is a scalar (shape ()); a file reader yields rows, "
                "so every array needs at least one dimension"
            )
        sizes[name] = shape[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"{path}: the arrays have different numbers of rows {sizes}; every array of a "
            "file must have the same first dimension (choose matching keys)"
        )
    return next(iter(sizes.values()))


class FileReader:
    """Base of file readers: ``open(path)`` is a context manager giving the file's arrays.

    Example: ``with NpyReader().open("x.npy") as a: a[0]``.
    """

    name = "file"

    def open(self, path: str) -> contextlib.AbstractContextManager[Any]:
        """Open ``path`` and give its arrays (closed when the ``with`` block ends)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NpyReader(FileReader):
    """Reads ``.npy`` files, memory-mapped: each element is one row of the file's array.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.arange(4))
        >>> with NpyReader().open(path) as a:
        ...     print(int(a[2]))
        2
    """

    name = "npy"

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[Any]:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as err:
            raise ValueError(f"read_npy: cannot read {path!r} as a .npy array: {err}") from err
        if not isinstance(array, np.ndarray):
            raise ValueError(
                f"read_npy: {path!r} is not a .npy file (np.load gave {type(array).__name__}); "
                "use read_npz for .npz archives"
            )
        yield array  # the mapping closes when the last row view is released


class NpzReader(FileReader):
    """Reads ``.npz`` archives: a dict of all arrays, a tuple in ``keys`` order, or one array.

    ``keys=None`` gives a dict keyed by array name (in archive order); a list of
    names gives a tuple; a single name gives that array's rows alone.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "d.npz")
        >>> np.savez(path, x=np.zeros((2, 3)), y=np.arange(2))
        >>> with NpzReader(["y", "x"]).open(path) as (y, x):
        ...     print(y.tolist(), x.shape)
        [0, 1] (2, 3)
    """

    name = "npz"

    def __init__(self, keys: str | Sequence[str] | None = None) -> None:
        self.keys = _check_keys(keys, "read_npz", required=False)

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[Any]:
        try:
            archive = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise ValueError(f"read_npz: cannot read {path!r} as a .npz archive: {err}") from err
        if not hasattr(archive, "files"):
            raise ValueError(
                f"read_npz: {path!r} is not a .npz archive (np.load gave "
                f"{type(archive).__name__}); use read_npy for .npy files"
            )
        with archive:
            yield _select(archive, list(archive.files), self.keys, path, "read_npz")

    def __repr__(self) -> str:
        return f"NpzReader(keys={self.keys!r})"


class Hdf5Reader(FileReader):
    """Reads HDF5 files through h5py (imported lazily): the datasets named by ``keys``.

    A single key gives that dataset's rows; a list gives tuples in that order.
    Rows are read from the open file as they are needed.

    Example: ``Hdf5Reader(["images", "labels"])`` yields ``(image, label)`` rows.
    """

    name = "hdf5"

    def __init__(self, keys: str | Sequence[str]) -> None:
        self.keys = _check_keys(keys, "read_hdf5", required=True)
        self._h5py = import_h5py()

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[Any]:
        with self._h5py.File(path, "r") as f:
            names = [k for k in f.keys() if isinstance(f[k], self._h5py.Dataset)]
            yield _select(f, names, self.keys, path, "read_hdf5")

    def __repr__(self) -> str:
        return f"Hdf5Reader(keys={self.keys!r})"


def import_h5py() -> Any:
    """The h5py module, or an ImportError that says how to install it."""
    try:
        import h5py  # lazy: optional HDF5 dependency
    except ImportError:
        raise ImportError(
            "read_hdf5 needs h5py, which is not installed; install it with "
            "`pip install h5py`, or save the arrays as .npy/.npz files and use read_npy/read_npz"
        ) from None
    return h5py


def _check_keys(keys: Any, what: str, required: bool) -> str | tuple[str, ...] | None:
    if keys is None:
        if required:
            raise ValueError(f"{what}: keys is None; name the dataset(s) to read, e.g. 'x'")
        return None
    if isinstance(keys, str):
        return keys
    if not isinstance(keys, Sequence) or not keys or not all(isinstance(k, str) for k in keys):
        raise TypeError(
            f"{what}: keys is {keys!r}; expected a name or a non-empty list of names (str)"
        )
    return tuple(keys)


def _select(container: Any, names: list[str], keys: Any, path: str, what: str) -> Any:
    wanted = names if keys is None else ([keys] if isinstance(keys, str) else list(keys))
    missing = [k for k in wanted if k not in names]
    if missing:
        raise ValueError(
            f"{what}: {path!r} has no array named {', '.join(map(repr, missing))}; "
            f"it has {', '.join(map(repr, names)) or 'none'}"
        )
    if keys is None:
        return {k: container[k] for k in names}
    if isinstance(keys, str):
        return container[keys]
    return tuple(container[k] for k in keys)


__all__ = [
    "FileReader",
    "NpyReader",
    "NpzReader",
    "Hdf5Reader",
    "glob_files",
    "check_paths",
    "to_path",
    "rows_of",
    "import_h5py",
]
