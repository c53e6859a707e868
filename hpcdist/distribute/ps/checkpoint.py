"""Checkpoints of ParameterServerStrategy variables: each ps writes and reads its own shard file.

The chief (``strategy.extended.should_checkpoint``) calls :func:`save_ps_shards`
with the ps variables to save (``PSVariable``, ``ShardedVariable``, or an
optimizer: its ``iterations`` counter). Each ps holding some of them writes
``<prefix>.ps-<i>.npz`` itself (atomically: temporary file, flush, fsync,
rename, directory fsync), with the values, their versions, and the state of
every optimizer registered on it for those variables (slots and per-variable
step counts), and replies with the file's sha256 and size. The function
returns the manifest fragment that the chief's
:class:`hpcdist.checkpoint.Checkpoint` stores::

    {"files": {basename: {"sha256", "bytes"}},
     "ps_variables": {name: {"ps", "file", "keys", "dtype", "shape", "id", "name", "version"}},
     "ps_optimizers": {opt_id: class_name}}

:func:`restore_ps_shards` (chief) matches the fragment's variables to the live
ones by name (by creation order among equal names), then restores in two
phases: every ps verifies the sha256 and size of the files it needs and checks
every array (*stage*); only when all succeeded do they apply them (*commit*).
A changed, truncated or missing file raises
:class:`~hpcdist.errors.CheckpointCorruptError` naming it, on the chief; the
ps keeps serving, unchanged. The files must be on a file system every ps can
reach at the same path (a relative prefix is made absolute on the chief).

Consistency: a save is one point in each ps's request order, so each shard
is consistent (no half-applied update), but with asynchronous training the
shards of several ps are not one global snapshot: workers keep sending
updates while the ps tasks write. For a global snapshot the workers must
pause. :func:`pause_clients` does that, on every client (chief and workers,
collectively): each client waits until its own earlier requests have been
handled by every ps (:func:`flush_ps_requests`), then all meet in a barrier of
a communicator of the clients (made from ``extended._coordination_comm``; the
ps ranks take no part); the chief saves inside the ``with`` block while the
workers wait in a second barrier. With a
:class:`~hpcdist.distribute.coordinator.ClusterCoordinator`, save after
``coordinator.join()``: no scheduled function runs then.

Example: on the chief, ``fragment = save_ps_shards(strategy, "/ckpt/ckpt-1", [emb, opt])``;
later ``restore_ps_shards(strategy, "/ckpt/ckpt-1", fragment)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.strategy import ParameterServerStrategy
from hpcdist.distribute.ps.variable import PSVariable
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.runtime import mpi

_CLIENTS_TAG = 7109  # the tag of Create_group for the clients' communicator


def is_ps_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is a :class:`ParameterServerStrategy` (on any rank).

    Example:
        >>> import hpcdist as hd
        >>> is_ps_strategy(hd.distribute.get_strategy())
        False
    """
    return isinstance(strategy, ParameterServerStrategy)


def ps_variables(objects: Any) -> list[Any]:
    """The ``PSVariable`` objects in ``objects``: variables, ``ShardedVariable`` (its shards),
    optimizers (their ``iterations`` when it lives on a ps), and lists/tuples/dicts of those;
    each once, in order. Raises ``TypeError`` for anything else.

    Example: ``ps_variables([emb, opt])`` lists ``emb``'s shards and ``opt.iterations``.
    """
    out: dict[int, Any] = {}

    def walk(x: Any) -> None:
        if isinstance(x, PSVariable):
            out.setdefault(id(x), x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif isinstance(getattr(x, "variables", None), list) and not hasattr(x, "slot_names"):
            walk(x.variables)  # a ShardedVariable
        elif hasattr(x, "slot_names"):  # an optimizer: its step counter, if on a ps
            it = getattr(x, "_iterations", None)
            if isinstance(it, PSVariable):
                walk(it)
        else:
            raise TypeError(
                f"{type(x).__name__} {getattr(x, 'name', '')!r} is not a parameter-server "
                "variable; pass PSVariable, ShardedVariable or optimizer objects (save other "
                "state with the chief's arrays)"
            )

    walk(objects)
    return list(out.values())


def _extended(strategy: Any) -> Any:
    if not is_ps_strategy(strategy):
        raise TypeError(
            f"expected a ParameterServerStrategy, got {type(strategy).__name__}; the ps shard "
            "functions are for parameter-server training only"
        )
    return strategy.extended  # raises on a ps rank


def _raise_first(replies: dict[int, Any], what: str) -> None:
    """Raise a CheckpointError (CheckpointCorruptError if any ps found a corrupt file) naming
    every ps that failed."""
    errors = {ps: e for ps, e in sorted(replies.items()) if isinstance(e, Exception)}
    if not errors:
        return
    text = "; ".join(f"ps task {ps}: {e}" for ps, e in errors.items())
    corrupt = any(isinstance(e, CheckpointCorruptError) for e in errors.values())
    cls = CheckpointCorruptError if corrupt else CheckpointError
    raise cls(f"{what}: {text}")


def save_ps_shards(strategy: Any, file_prefix: str, variables: list) -> dict:
    """Ask each ps holding some of ``variables`` to write ``f"{file_prefix}.ps-{i}.npz"``;
    returns the manifest fragment (see the module doc). Chief only.

    Raises :class:`~hpcdist.errors.CheckpointError` naming the ps tasks that failed
    (e.g. an ``OSError`` writing the file) and ``TypeError`` for objects that are not
    ps variables or a strategy that is not a ParameterServerStrategy.
    """
    ext = _extended(strategy)
    found = ps_variables(variables)
    for v in found:
        if v._ext is not ext:
            raise CheckpointError(
                f"variable {v.name!r} belongs to another ParameterServerStrategy; save each "
                "strategy's variables with it"
            )
    prefix = os.path.abspath(os.fspath(file_prefix))
    by_ps: dict[int, list[int]] = {}
    for v in sorted(found, key=lambda v: v._id):
        by_ps.setdefault(v._ps, []).append(v._id)
    requests = {
        ps: (P.OP_SAVE, {"path": f"{prefix}.ps-{ps}.npz", "ps": ps, "ids": ids})
        for ps, ids in sorted(by_ps.items())
    }
    replies = ext._client.request_json(requests) if requests else {}
    _raise_first(replies, f"saving the parameter-server shards of {prefix} failed")
    return fragment_of(replies)


def fragment_of(replies: dict[int, dict]) -> dict:
    """The manifest fragment from the ps tasks' SAVE replies ``{ps: reply}``.

    Example:
        >>> reply = {"file": "c.ps-0.npz", "sha256": "ab", "bytes": 9, "optimizers": [],
        ...          "variables": [{"id": 0, "name": "w", "shape": [2], "dtype": "float32",
        ...                         "version": 4, "key": "var0.value"}]}
        >>> f = fragment_of({0: reply})
        >>> f["files"], f["ps_variables"]["w"]["keys"]
        ({'c.ps-0.npz': {'sha256': 'ab', 'bytes': 9}}, {'value': 'var0.value', 'slots': {}})
    """
    files: dict[str, dict] = {}
    entries: list[dict] = []
    optimizers: dict[str, str] = {}
    for ps, reply in sorted(replies.items()):
        files[reply["file"]] = {"sha256": reply["sha256"], "bytes": int(reply["bytes"])}
        slots: dict[int, dict[str, dict[str, str]]] = {}
        steps: dict[int, dict[str, int]] = {}
        for opt in reply["optimizers"]:
            optimizers[str(opt["id"])] = opt["class_name"]
            for st in opt["states"]:
                slots.setdefault(int(st["var"]), {})[str(opt["id"])] = st["slots"]
                steps.setdefault(int(st["var"]), {})[str(opt["id"])] = int(st["step"])
        for v in reply["variables"]:
            vid = int(v["id"])
            entries.append(
                {"ps": ps, "file": reply["file"], "id": vid, "name": v["name"],
                 "dtype": v["dtype"], "shape": list(v["shape"]), "version": int(v["version"]),
                 "keys": {"value": v["key"], "slots": slots.get(vid, {})},
                 "steps": steps.get(vid, {})}
            )  # fmt: skip
    named: dict[str, dict] = {}
    for e in sorted(entries, key=lambda e: e["id"]):
        key, k = e["name"], 1
        while key in named:  # equal names (e.g. several "Variable"): "name#1", "name#2", ...
            key, k = f"{e['name']}#{k}", k + 1
        named[key] = e
    return {"files": files, "ps_variables": named, "ps_optimizers": optimizers}


def match_variables(saved: list[dict], live: list[dict]) -> list[tuple[dict, dict]]:
    """Pair each saved variable with a live one: by name; among equal names the one with the
    saved id, else by creation (id) order when the counts agree. Shapes and dtypes must
    match. Entries are dicts with ``id``, ``name``, ``shape``, ``dtype`` (live ones: ``ps``).

    Raises :class:`~hpcdist.errors.CheckpointError` naming what does not fit.

    Example:
        >>> s = [{"id": 0, "name": "w", "shape": [2], "dtype": "float32"}]
        >>> l = [{"id": 5, "name": "w", "shape": [2], "dtype": "float32", "ps": 1}]
        >>> [(a["id"], b["id"]) for a, b in match_variables(s, l)]
        [(0, 5)]
    """
    by_name: dict[str, list[dict]] = {}
    for v in sorted(live, key=lambda v: v["id"]):
        by_name.setdefault(v["name"], []).append(v)
    saved_by_name: dict[str, list[dict]] = {}
    for s in sorted(saved, key=lambda s: s["id"]):
        saved_by_name.setdefault(s["name"], []).append(s)
    pairs = []
    for name, group in saved_by_name.items():
        cands = by_name.get(name, [])
        if not cands:
            raise CheckpointError(
                f"the checkpoint has parameter-server variable {name!r} (shape "
                f"{tuple(group[0]['shape'])}, dtype {group[0]['dtype']}) but this program has "
                "no ps variable of that name; create the same variables before restoring"
            )
        by_id = {c["id"]: c for c in cands}
        if all(s["id"] in by_id for s in group):
            chosen = [by_id[s["id"]] for s in group]
        elif len(cands) == len(group):
            chosen = cands
        else:
            raise CheckpointError(
                f"the checkpoint has {len(group)} parameter-server variables named {name!r} "
                f"and this program has {len(cands)}; they cannot be matched. Give the "
                "variables distinct names"
            )
        for s, c in zip(group, chosen, strict=True):
            if list(s["shape"]) != list(c["shape"]) or s["dtype"] != c["dtype"]:
                raise CheckpointError(
                    f"parameter-server variable {name!r}: the checkpoint has shape "
                    f"{tuple(s['shape'])}, dtype {s['dtype']}; this program has shape "
                    f"{tuple(c['shape'])}, dtype {c['dtype']}. Build the model as in the "
                    "saving program"
                )
            pairs.append((s, c))
    return pairs


def _check_fragment(fragment: Any) -> None:
    ok = (
        isinstance(fragment, dict)
        and isinstance(fragment.get("files"), dict)
        and isinstance(fragment.get("ps_variables"), dict)
        and all(
            isinstance(e, dict) and {"id", "name", "file", "shape", "dtype"} <= set(e)
            for e in fragment["ps_variables"].values()
        )
    )
    if not ok:
        raise CheckpointCorruptError(
            "the checkpoint's parameter-server fragment is malformed: expected a dict with "
            "'files' and 'ps_variables' (entries with id, name, file, shape, dtype), as "
            f"save_ps_shards returns; got {str(fragment)[:200]}"
        )


def restore_ps_shards(strategy: Any, file_prefix: str, fragment: dict) -> None:
    """Put the variables (and their optimizer state) of ``fragment`` back on the ps tasks from
    the files next to ``file_prefix``. Chief only; all or nothing.

    Raises :class:`~hpcdist.errors.CheckpointCorruptError` when a file is missing or its
    sha256/size differ from ``fragment["files"]`` (naming the file), and
    :class:`~hpcdist.errors.CheckpointError` when the saved variables do not fit the live
    ones (names, shapes, dtypes, optimizer classes). The ps tasks keep serving either way.

    Example: ``restore_ps_shards(strategy, "/ckpt/ckpt-3", manifest["ps"])``.
    """
    ext = _extended(strategy)
    _check_fragment(fragment)
    saved = list(fragment["ps_variables"].values())
    if not saved:
        return
    client = ext._client
    listed = client.request_json({ps: (P.OP_LIST, None) for ps in range(client.num_ps)})
    _raise_first(listed, "listing the parameter-server variables failed")
    live = [
        {"ps": ps, "id": int(r[0]), "name": r[1], "shape": list(r[2]), "dtype": r[3]}
        for ps, reply in listed.items()
        for r in reply["variables"]
    ]
    directory = os.path.dirname(os.path.abspath(os.fspath(file_prefix)))
    plans: dict[int, dict[str, Any]] = {}
    for s, c in match_variables(saved, live):
        base = str(s["file"])
        info = fragment["files"].get(base)
        if not isinstance(info, dict) or not {"sha256", "bytes"} <= set(info):
            raise CheckpointCorruptError(
                f"the checkpoint's manifest has no sha256/size for file {base!r} of "
                f"parameter-server variable {s['name']!r}; the manifest is damaged"
            )
        plan = plans.setdefault(c["ps"], {"phase": "stage", "files": {}, "items": []})
        plan["files"][base] = {"path": os.path.join(directory, base), **info}
        plan["items"].append({"file": base, "saved_id": int(s["id"]), "var": c["id"]})
    staged = client.request_json({ps: (P.OP_RESTORE, plan) for ps, plan in plans.items()})
    if any(isinstance(r, Exception) for r in staged.values()):
        ok = [ps for ps, r in staged.items() if not isinstance(r, Exception)]
        client.request_json({ps: (P.OP_RESTORE, {"phase": "abort"}) for ps in ok})
        _raise_first(staged, f"restoring the parameter-server shards of {file_prefix} failed")
    done = client.request_json({ps: (P.OP_RESTORE, {"phase": "commit"}) for ps in plans})
    _raise_first(done, f"restoring the parameter-server shards of {file_prefix} failed part-way")


def flush_ps_requests(strategy: Any) -> None:
    """Return when every ps has handled every request this client sent before (its
    asynchronous updates included); raises an error a ps reports for one of them.

    Example: ``opt.apply_gradients(pairs); flush_ps_requests(strategy)``.
    """
    _extended(strategy)._client.sync()


def clients_comm(strategy: Any) -> Any:
    """A new communicator of the clients (chief, then workers; no ps), made from the
    coordination communicator. Collective over the clients; the caller frees it.

    Example: ``comm = clients_comm(strategy); comm.Barrier(); comm.Free()``.
    """
    ext = _extended(strategy)
    base = ext._coordination_comm
    everyone = base.Get_group()
    group = everyone.Incl(list(ext._roles.clients))
    try:
        return base.Create_group(group, _CLIENTS_TAG)
    finally:
        group.Free()
        everyone.Free()


@contextlib.contextmanager
def pause_clients(strategy: Any, comm: Any = None) -> Iterator[None]:
    """Pause every client for a globally consistent save (collective over the clients).

    On entry each client flushes its requests to the ps tasks, then all meet
    in a barrier of ``comm`` (default: a new :func:`clients_comm`); nothing is
    in flight to any ps then. The chief saves inside the block; on exit all
    meet in a second barrier, so no worker sends an update during the save.
    If a flush fails on any client, every client raises ``CheckpointError``.

    Example: ``with pause_clients(strategy): if ext.should_checkpoint: save_ps_shards(...)``.
    """
    _extended(strategy)
    own = comm is None
    comm = clients_comm(strategy) if own else comm
    try:
        flag = np.zeros(1, np.int64)
        error: Exception | None = None
        try:
            flush_ps_requests(strategy)
        except Exception as e:
            error, flag[0] = e, 1
        total = np.zeros(1, np.int64)
        MPI = mpi()
        comm.Allreduce([flag, MPI.INT64_T], [total, MPI.INT64_T], MPI.SUM)
        try:
            if total[0]:
                why = f": {error}" if error is not None else " on another client"
                raise CheckpointError(
                    f"{int(total[0])} client(s) could not flush their parameter-server "
                    f"requests before the save{why}"
                )
            yield
        finally:
            comm.Barrier()
    finally:
        if own:
            comm.Free()


__all__ = [
    "clients_comm",
    "flush_ps_requests",
    "fragment_of",
    "is_ps_strategy",
    "match_variables",
    "pause_clients",
    "ps_variables",
    "restore_ps_shards",
    "save_ps_shards",
]
