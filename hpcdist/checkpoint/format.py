"""The checkpoint files: ``P.data.npz`` (arrays), ``P.index.json`` (the manifest, written last).

A checkpoint with path prefix ``P`` is complete when ``P.index.json`` exists.
The manifest lists every file with its SHA-256 and size, and every array with
the file, the npz key, the dtype and the shape it must have::

    {"format": "hpcdist-checkpoint", "version": 1, "save_counter": 3,
     "files": {"ckpt-3.data.npz": {"sha256": "...", "bytes": 1234}},
     "objects": {"model": {"arrays": {"0": {"file": "ckpt-3.data.npz", "key": "a0",
                                            "dtype": "<f4", "shape": [3, 2]}}}},
     "meta": {"per_worker": [{...}, {...}]}, "num_workers": 2, "created": 1700000000.0}

Reading never unpickles: the npz members are parsed here (header checked
against the manifest before any data is read), object arrays are refused.
Every problem with the files is a :class:`~hpcdist.errors.CheckpointCorruptError`
naming the file; a missing manifest is a :class:`CheckpointNotFoundError`.

Example:
    >>> import os, tempfile, numpy as np
    >>> prefix = os.path.join(tempfile.mkdtemp(), "ckpt-1")
    >>> _ = write_checkpoint(prefix, {"w": {"value": np.arange(3.0)}}, [{}], save_counter=1)
    >>> manifest = read_manifest(prefix)
    >>> verify_files(prefix, manifest)
    >>> load_arrays(prefix, manifest, ["w"])["w"]["value"]
    array([0., 1., 2.])
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from hpcdist.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError
from hpcdist.runtime.atomic import atomic_write, atomic_write_hashed, fsync_directory, sha256_of

FORMAT = "hpcdist-checkpoint"
VERSION = 1
ALLOWED_KINDS = "biufcSU"  # booleans, numbers and fixed-width strings: never objects
_HEX = re.compile(r"[0-9a-f]{64}")

__all__ = [
    "CheckpointNotFoundError",
    "data_file",
    "index_file",
    "load_arrays",
    "read_manifest",
    "verify_files",
    "write_checkpoint",
]


def data_file(prefix: str) -> str:
    """The chief's array file of checkpoint ``prefix``.

    Example:
        >>> data_file("/ckpt/ckpt-7")
        '/ckpt/ckpt-7.data.npz'
    """
    return f"{prefix}.data.npz"


def index_file(prefix: str) -> str:
    """The manifest of checkpoint ``prefix`` (its presence marks the checkpoint complete).

    Example:
        >>> index_file("/ckpt/ckpt-7")
        '/ckpt/ckpt-7.index.json'
    """
    return f"{prefix}.index.json"


def _corrupt(path: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {path!r} {what}; the checkpoint is damaged or incomplete: restore an "
        "older one (CheckpointManager.restore_or_initialize does so) or save it again"
    )


def _host_array(path: str, name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")
    if array.dtype.kind not in ALLOWED_KINDS:
        raise CheckpointError(
            f"the state of {path!r} has array {name!r} of dtype {array.dtype}; checkpoints hold "
            "boolean, numeric and fixed-width string arrays only (never Python objects)"
        )
    return array


def write_checkpoint(
    prefix: str,
    arrays: dict[str, dict[str, Any]],
    per_worker: list[dict],
    save_counter: int,
    *,
    ps_fragment: dict | None = None,
    ps_objects: dict[str, list[str]] | None = None,
) -> dict:
    """Write ``P.data.npz`` then ``P.index.json`` (each atomically); returns the manifest.

    ``arrays`` maps object paths to their named arrays (the chief's), ``per_worker`` holds
    every worker's meta; ``ps_fragment`` is what ``save_ps_shards`` returned (its files
    are listed too), ``ps_objects`` names the ps variables of each object.

    Example:
        >>> import os, tempfile, numpy as np
        >>> p = os.path.join(tempfile.mkdtemp(), "run", "ckpt-2")
        >>> m = write_checkpoint(p, {"rng": {}}, [{"rng": {"seed": 1}}], save_counter=2)
        >>> sorted(os.listdir(os.path.dirname(p))), m["num_workers"]
        (['ckpt-2.data.npz', 'ckpt-2.index.json'], 1)
    """
    prefix = os.fspath(prefix)
    directory = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(directory, exist_ok=True)
    data_name = os.path.basename(data_file(prefix))
    members: dict[str, np.ndarray] = {}
    objects: dict[str, Any] = {}
    for path, named in arrays.items():
        entries = {}
        for name, value in named.items():
            array = _host_array(path, name, value)
            key = f"a{len(members)}"
            members[key] = array
            entries[str(name)] = {
                "file": data_name,
                "key": key,
                "dtype": array.dtype.str,
                "shape": list(array.shape),
            }
        objects[path] = {"arrays": entries}
    for path, names in (ps_objects or {}).items():
        objects.setdefault(path, {"arrays": {}})["ps_variables"] = list(names)
    index = index_file(prefix)
    if os.path.exists(index):  # an older checkpoint at this prefix is invalid from here on
        os.unlink(index)
        fsync_directory(directory)

    def write_npz(stream: Any) -> None:
        # an .npz archive (what np.savez writes), streamed through the hash
        with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key, array in members.items():
                with zf.open(key + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)

    digest, size = atomic_write_hashed(data_file(prefix), write_npz)
    files = {data_name: {"sha256": digest, "bytes": size}}
    manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if ps_fragment is not None:
        for name, entry in dict(ps_fragment.get("files", {})).items():
            files[str(name)] = {"sha256": str(entry["sha256"]), "bytes": int(entry["bytes"])}
        manifest["ps_shards"] = ps_fragment
    manifest.update(
        save_counter=int(save_counter),
        files=files,
        objects=objects,
        meta={"per_worker": list(per_worker)},
        num_workers=len(per_worker),
        created=time.time(),
    )
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write(index, lambda f: f.write(text))
    return manifest


# -- reading ----------------------------------------------------------------------------------
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_name(where: str, base: str, name: Any) -> str:
    """A file name of the manifest: a plain name of this checkpoint (no directories)."""
    if (
        not isinstance(name, str)
        or not name.startswith(base + ".")
        or any(c in name for c in "/\\\0")
        or name in (".", "..")
    ):
        raise _corrupt(where, f"lists a file {name!r} that is not a file of checkpoint {base!r}")
    return name


def _dtype(where: str, text: Any) -> np.dtype:
    try:
        if not isinstance(text, str):
            raise TypeError
        dtype = np.dtype(text)
    except Exception:  # any text: a manifest is untrusted input
        raise _corrupt(where, f"gives the dtype {text!r}, which is not a NumPy dtype") from None
    if dtype.kind not in ALLOWED_KINDS or dtype.hasobject or dtype.names is not None:
        raise _corrupt(
            where, f"gives the dtype {text!r}; only boolean, numeric and string arrays are allowed"
        )
    return dtype


def _validate(where: str, base: str, m: Any) -> dict:
    """Check the manifest's structure; returns it (raises CheckpointCorruptError)."""
    if not isinstance(m, dict):
        raise _corrupt(where, f"holds a {type(m).__name__}, expected a JSON object")
    if m.get("format") != FORMAT or m.get("version") != VERSION or not _is_int(m.get("version")):
        raise _corrupt(
            where,
            f"is not a {FORMAT} version {VERSION} manifest (format {m.get('format')!r}, "
            f"version {m.get('version')!r})",
        )
    for key, ok in (
        ("save_counter", lambda v: _is_int(v) and v >= 0),
        ("num_workers", lambda v: _is_int(v) and v >= 1),
        ("created", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
        ("files", lambda v: isinstance(v, dict)),
        ("objects", lambda v: isinstance(v, dict)),
        ("meta", lambda v: isinstance(v, dict) and isinstance(v.get("per_worker"), list)),
    ):
        if key not in m or not ok(m[key]):
            raise _corrupt(where, f"has a missing or malformed {key!r} entry: {m.get(key)!r:.200}")
    per_worker = m["meta"]["per_worker"]
    if len(per_worker) != m["num_workers"] or not all(isinstance(x, dict) for x in per_worker):
        raise _corrupt(
            where, f"has {m['num_workers']} workers but {len(per_worker)} per-worker meta entries"
        )
    for name, entry in m["files"].items():
        _check_name(where, base, name)
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _HEX.fullmatch(entry["sha256"])
            and _is_int(entry.get("bytes"))
            and entry["bytes"] >= 0
        ):
            raise _corrupt(where, f"has a malformed entry for file {name!r}: {entry!r:.200}")
    for path, obj in m["objects"].items():
        if not isinstance(obj, dict) or not isinstance(obj.get("arrays"), dict):
            raise _corrupt(where, f"has a malformed entry for object {path!r}")
        ps = obj.get("ps_variables", [])
        if not isinstance(ps, list) or not all(isinstance(x, str) for x in ps):
            raise _corrupt(where, f"has a malformed ps variable list for object {path!r}")
        for name, a in obj["arrays"].items():
            if not (
                isinstance(a, dict)
                and isinstance(a.get("file"), str)
                and a["file"] in m["files"]
                and isinstance(a.get("key"), str)
                and isinstance(a.get("shape"), list)
                and all(_is_int(d) and d >= 0 for d in a["shape"])
            ):
                raise _corrupt(
                    where, f"has a malformed entry for array {name!r} of {path!r}: {a!r:.200}"
                )
            _dtype(where, a.get("dtype"))
    if "ps_shards" in m and not isinstance(m["ps_shards"], dict):
        raise _corrupt(where, "has a malformed 'ps_shards' entry")
    return m


def read_manifest(prefix: str) -> dict:
    """Read and check ``P.index.json``.

    Raises :class:`CheckpointNotFoundError` when it does not exist and
    :class:`~hpcdist.errors.CheckpointCorruptError` when it is not a valid manifest.

    Example: ``read_manifest("/ckpt/ckpt-7")["save_counter"]``.
    """
    where = index_file(prefix)
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        hint = " (it is a directory: pass latest_checkpoint(dir))" if os.path.isdir(prefix) else ""
        raise CheckpointNotFoundError(
            f"no checkpoint at {prefix!r}{hint}: {where!r} does not exist (a checkpoint is "
            "complete only once its manifest is written); check the path, or use "
            "latest_checkpoint(dir)"
        ) from None
    except OSError as error:
        raise _corrupt(where, f"cannot be read ({error})") from None
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise _corrupt(where, f"is not valid JSON ({str(error)[:200]})") from None
    return _validate(where, os.path.basename(prefix), manifest)


def verify_files(prefix: str, manifest: dict) -> None:
    """Check that every file of the manifest exists with the listed size and SHA-256.

    Example: ``verify_files(prefix, read_manifest(prefix))`` raises on a flipped byte.
    """
    directory = os.path.dirname(prefix)
    for name, entry in manifest["files"].items():
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
            if size != entry["bytes"]:
                raise _corrupt(
                    path, f"has {size} bytes, but the manifest lists {entry['bytes']} (truncated?)"
                )
            digest, _ = sha256_of(path)
        except FileNotFoundError:
            raise _corrupt(path, "is missing (the manifest lists it)") from None
        except OSError as error:
            raise _corrupt(path, f"cannot be read ({error})") from None
        if digest != entry["sha256"]:
            raise _corrupt(
                path, f"has SHA-256 {digest}, but the manifest lists {entry['sha256']} (altered)"
            )


def _read_member(
    zf: zipfile.ZipFile, path: str, key: str, dtype: np.dtype, shape: tuple
) -> np.ndarray:
    """One array of an npz archive, header checked first; never unpickles."""
    try:
        info = zf.getinfo(key + ".npy")
    except KeyError:
        raise _corrupt(path, f"has no array {key!r} (the manifest lists it)") from None
    with zf.open(info) as f:
        assert isinstance(f, zipfile.ZipExtFile)  # (read mode: it has readinto)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            found_shape, fortran, found = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            found_shape, fortran, found = np.lib.format.read_array_header_2_0(f)
        else:
            raise _corrupt(path, f"stores array {key!r} in .npy format {version}")
        if found.hasobject:
            raise _corrupt(
                path, f"holds array {key!r} of Python objects; refused (it would need pickle)"
            )
        if found != dtype or tuple(found_shape) != shape:
            raise _corrupt(
                path,
                f"holds array {key!r} with dtype {found.str} and shape {tuple(found_shape)}, but "
                f"the manifest lists dtype {dtype.str} and shape {shape}",
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > os.path.getsize(path) or info.file_size != f.tell() + nbytes:
            raise _corrupt(path, f"holds array {key!r} with a wrong byte count")
        buf = bytearray(nbytes)
        if f.readinto(buf) != nbytes:
            raise _corrupt(path, f"holds a truncated array {key!r}")
    return np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")


def load_arrays(prefix: str, manifest: dict, paths: Iterable[str]) -> dict[str, dict]:
    """The arrays of the objects ``paths`` (those the manifest lists), checked against it.

    Call :func:`verify_files` first. Example: ``load_arrays(prefix, m, ["model"])``.
    """
    directory = os.path.dirname(prefix)
    wanted = [p for p in paths if p in manifest["objects"]]
    by_file: dict[str, list[tuple[str, str, dict]]] = {}
    for p in wanted:
        for name, entry in manifest["objects"][p]["arrays"].items():
            by_file.setdefault(entry["file"], []).append((p, name, entry))
    out: dict[str, dict] = {p: {} for p in wanted}
    for fname, entries in by_file.items():
        path = os.path.join(directory, fname)
        try:
            with zipfile.ZipFile(path) as zf:
                for p, name, entry in entries:
                    dtype = _dtype(index_file(prefix), entry["dtype"])
                    shape = tuple(entry["shape"])
                    out[p][name] = _read_member(zf, path, entry["key"], dtype, shape)
        except CheckpointError:
            raise
        except Exception as error:  # zip or npy parsing of untrusted bytes
            raise _corrupt(path, f"cannot be read as an npz archive ({error!r:.200})") from None
    return out
