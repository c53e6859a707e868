"""A parameter server's checkpoint file: ``<prefix>.ps-<i>.npz``, written and read by the ps.

The file is an uncompressed ``np.savez`` archive, loaded with
``allow_pickle=False``. It holds, for each saved variable with id ``k``:
``var<k>.value`` (the value), and for each optimizer ``o`` that has state for
it, ``opt<o>.var<k>.<slot>`` (each slot, in the variable's shape). Everything
else is in ``__meta__``, UTF-8 JSON in a uint8 array::

    {"format": "hpcdist-ps-shard", "version": 1, "ps": i,
     "variables": [{"id", "name", "shape", "dtype", "version", "key"}],
     "optimizers": [{"id", "class_name", "config",
                     "states": [{"var", "step", "slots": {slot: key}}]}]}

Writing goes through :func:`hpcdist.runtime.atomic.atomic_write_hashed` (temporary
file, flush, fsync, rename, directory fsync); the reply carries the file's
sha256 and size. Restoring first verifies both against what the chief's
manifest recorded, then checks every array against the live variables (stage),
and only then changes anything (commit), so a bad file leaves the ps as it was.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from hpcdist.errors import CheckpointCorruptError, CheckpointError, PSError
from hpcdist.runtime.atomic import atomic_write_hashed, sha256_of

FORMAT = "hpcdist-ps-shard"
VERSION = 1
META_KEY = "__meta__"


def value_key(var_id: int) -> str:
    """The archive key of variable ``var_id``'s value.

    Example:
        >>> value_key(3)
        'var3.value'
    """
    return f"var{int(var_id)}.value"


def slot_key(opt_id: int, var_id: int, slot: str) -> str:
    """The archive key of slot ``slot`` of variable ``var_id`` under optimizer ``opt_id``.

    Example:
        >>> slot_key(0, 3, "m")
        'opt0.var3.m'
    """
    return f"opt{int(opt_id)}.var{int(var_id)}.{slot}"


def listing(variables: dict[int, Any], host: Any) -> dict[str, Any]:
    """What a ps holds: ``{"variables": [[id, name, shape, dtype, version], ...],
    "optimizers": {id: class_name}}`` (JSON-able).

    Example: ``listing(server.vars, server.host)["variables"][0][1]`` is the first name.
    """
    rows = [
        [vid, v.name, list(v.value.shape), str(v.value.dtype), int(v.version)]
        for vid, v in sorted(variables.items())
    ]
    opts = {str(oid): name for oid, name in sorted(host.registered().items())}
    return {"variables": rows, "optimizers": opts}


def write_shard(
    path: str, ps: int, variables: dict[int, Any], host: Any, ids: list[int]
) -> dict[str, Any]:
    """Write the variables ``ids`` of this ps (values, versions, optimizer slots and steps) to
    ``path`` atomically; returns ``{"file", "sha256", "bytes", "variables", "optimizers"}``
    (the last two as in ``__meta__``).

    Raises :class:`~hpcdist.errors.CheckpointError` for an id this ps does not hold
    and ``OSError`` when the file cannot be written.
    """

    missing = [i for i in ids if i not in variables]
    if missing:
        raise CheckpointError(
            f"ps task {ps} holds no variables with ids {missing}; it holds "
            f"{sorted(variables)}. Save variables of this strategy only"
        )
    arrays: dict[str, Any] = {}
    metas = []
    for vid in ids:
        var = variables[vid]
        key = value_key(vid)
        arrays[key] = var.value
        metas.append(
            {
                "id": vid,
                "name": var.name,
                "shape": list(var.value.shape),
                "dtype": str(var.value.dtype),
                "version": int(var.version),
                "key": key,
            }
        )
    opts = []
    for entry in host.export_states(set(ids)):
        states = []
        for vid, (step, slots) in sorted(entry["states"].items()):
            shape = variables[vid].value.shape
            keys = {}
            for name, flat in slots.items():
                keys[name] = slot_key(entry["id"], vid, name)
                arrays[keys[name]] = flat.reshape(shape)
            states.append({"var": vid, "step": int(step), "slots": keys})
        opts.append({"id": entry["id"], "class_name": entry["class_name"],
                     "config": entry["config"], "states": states})  # fmt: skip
    meta = {"format": FORMAT, "version": VERSION, "ps": int(ps), "variables": metas,
            "optimizers": opts}  # fmt: skip
    arrays[META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), np.uint8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    digest, size = atomic_write_hashed(path, lambda f: np.savez(f, **arrays))
    return {"file": os.path.basename(path), "sha256": digest, "bytes": size,
            "variables": metas, "optimizers": opts}  # fmt: skip


def verify_file(path: str, sha256: str, nbytes: int) -> None:
    """Raise :class:`~hpcdist.errors.CheckpointCorruptError` naming ``path`` unless the file
    exists with ``nbytes`` bytes and sha256 ``sha256``.
    """

    if not os.path.isfile(path):
        raise CheckpointCorruptError(
            f"checkpoint file {path} is missing (the manifest records {nbytes} bytes); the "
            "checkpoint is incomplete: restore another one"
        )
    size = os.path.getsize(path)
    if size != int(nbytes):
        raise CheckpointCorruptError(
            f"checkpoint file {path} has {size} bytes but the manifest records {nbytes}; the "
            "file is truncated or was replaced: restore another checkpoint"
        )
    digest, _ = sha256_of(path)
    if digest != sha256:
        raise CheckpointCorruptError(
            f"checkpoint file {path} is corrupt: its sha256 is {digest} but the manifest "
            f"records {sha256}; restore another checkpoint"
        )


class _Shard:
    """A verified shard file: its meta and a reader of its arrays (checked dtype and shape)."""

    def __init__(self, path: str, sha256: str, nbytes: int) -> None:
        verify_file(path, sha256, nbytes)
        self.path = path
        self._npz: Any = None
        try:
            self._npz = np.load(path, allow_pickle=False)
            self.keys = set(self._npz.files)
            meta = _json(self._npz[META_KEY])
            if meta.get("format") != FORMAT or int(meta.get("version", -1)) != VERSION:
                raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')}")
            self.variables = {int(v["id"]): v for v in meta["variables"]}
            self.optimizers = list(meta["optimizers"])
        except Exception as e:  # a file that matches its digest but is not a shard file
            self.close()
            raise CheckpointCorruptError(
                f"checkpoint file {path} is not a readable ps shard file "
                f"({type(e).__name__}: {e}); expected an npz of format {FORMAT} {VERSION}"
            ) from None

    def close(self) -> None:
        if self._npz is not None:
            self._npz.close()
            self._npz = None

    def array(self, key: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        try:
            arr = self._npz[key] if key in self.keys else None
        except Exception as e:
            raise CheckpointCorruptError(
                f"checkpoint file {self.path}: array {key!r} cannot be read ({e})"
            ) from None
        if arr is None or arr.shape != tuple(shape) or arr.dtype != dtype:
            found = "nothing" if arr is None else f"shape {arr.shape}, dtype {arr.dtype}"
            raise CheckpointCorruptError(
                f"checkpoint file {self.path}: array {key!r} should have shape {tuple(shape)} "
                f"and dtype {dtype}; found {found}"
            )
        return arr


def _json(arr: np.ndarray) -> Any:
    return json.loads(arr.tobytes().decode("utf-8"))


#: One staged variable: (var id, value, version, [(opt id, class, step, {slot: array})]).
Staged = tuple[int, np.ndarray, int, list[tuple[int, str, int, dict[str, np.ndarray]]]]


def stage_restore(
    files: dict[str, dict[str, Any]],
    items: list[dict[str, Any]],
    variables: dict[int, Any],
    host: Any,
) -> list[Staged]:
    """Verify and read what ``items`` restore, changing nothing; returns the staged restore.

    ``files``: ``{basename: {"path", "sha256", "bytes"}}``; ``items``: ``[{"file",
    "saved_id", "var"}]`` (the variable ``saved_id`` of that file goes into this ps's
    variable ``var``). Raises :class:`~hpcdist.errors.CheckpointCorruptError` for a
    missing, changed or unreadable file, :class:`~hpcdist.errors.CheckpointError` when
    the file's variable does not fit the live one (name aside: the client matched those).

    Example: ``staged = stage_restore(files, [{"file": "c-1.ps-0.npz", "saved_id": 0,
    "var": 0}], server.vars, server.host)``.
    """
    shards: dict[str, _Shard] = {}
    try:
        return _stage(files, items, variables, host, shards)
    finally:
        for shard in shards.values():
            shard.close()


def _stage(files: dict, items: list, variables: dict, host: Any, shards: dict) -> list:
    staged = []
    targets: set[int] = set()
    for item in items:
        base, sid, vid = str(item["file"]), int(item["saved_id"]), int(item["var"])
        if base not in shards:
            info = files.get(base)
            if info is None:
                raise CheckpointError(f"restore names file {base!r} but gives no digest for it")
            shards[base] = _Shard(str(info["path"]), str(info["sha256"]), int(info["bytes"]))
        shard = shards[base]
        saved = shard.variables.get(sid)
        if saved is None:
            raise CheckpointCorruptError(
                f"checkpoint file {shard.path} has no variable with id {sid}; it has "
                f"{sorted(shard.variables)}"
            )
        var = variables.get(vid)
        if var is None:
            raise CheckpointError(f"this parameter server holds no variable with id {vid}")
        if vid in targets:
            raise CheckpointError(f"restore names variable {var.name!r} (id {vid}) twice")
        targets.add(vid)
        shape, dtype = tuple(var.value.shape), var.value.dtype
        if tuple(saved["shape"]) != shape or saved["dtype"] != str(dtype):
            raise CheckpointError(
                f"variable {var.name!r}: the checkpoint ({shard.path}) has shape "
                f"{tuple(saved['shape'])}, dtype {saved['dtype']}, but the live variable has "
                f"shape {shape}, dtype {dtype}; build the model as in the saving program"
            )
        value = shard.array(str(saved["key"]), shape, dtype)
        states = []
        for opt in shard.optimizers:
            for st in opt["states"]:
                if int(st["var"]) != sid:
                    continue
                slots = {n: shard.array(k, shape, dtype) for n, k in st["slots"].items()}
                oid, cls = int(opt["id"]), str(opt["class_name"])
                try:
                    host.import_state(oid, cls, vid, int(st["step"]), slots, dry_run=True)
                except PSError as e:
                    raise CheckpointError(f"variable {var.name!r}: {e}") from None
                states.append((oid, cls, int(st["step"]), slots))
        staged.append((vid, value, int(saved["version"]), states))
    return staged


def commit_restore(staged: list, variables: dict[int, Any], host: Any) -> int:
    """Apply a restore from :func:`stage_restore`: values, versions, then optimizer state (a
    restored variable's state under other optimizers is dropped, as at the save); returns
    the number of variables restored.
    """
    for vid, value, version, states in staged:
        var = variables[vid]
        np.copyto(var.value, value)
        var.version = version
        host.forget(vid)
        for oid, cls, step, slots in states:
            host.import_state(oid, cls, vid, step, slots)
    return len(staged)


__all__ = [
    "FORMAT",
    "META_KEY",
    "commit_restore",
    "listing",
    "slot_key",
    "stage_restore",
    "value_key",
    "verify_file",
    "write_shard",
]
