"""``Checkpoint``: save and restore models, optimizers, variables, generators and iterators.

Objects are tracked by keyword (``Checkpoint(model=m, optimizer=opt)``);
nested Checkpoints, dicts and lists get dotted paths (``"opt"``,
``"extra.rng"``, ``"layers.0"``). Under a multi-worker strategy every worker
calls ``save``/``write``/``restore``/``read`` in the same order: every worker
computes its state, the chief writes the files (its arrays, every worker's
meta), and on restore the chief reads and verifies them and broadcasts what
each worker needs. A failure anywhere raises the same error on every worker.
No pickle is used in writing, sending or reading.

Example:
    >>> import os, tempfile, numpy as np, hpcdist as hd
    >>> v = hd.Variable(np.array([1.0, 2.0]))
    >>> ckpt = Checkpoint(v=v, rng=np.random.default_rng(0))
    >>> path = ckpt.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    >>> os.path.basename(path), ckpt.save_counter
    ('ckpt-1', 1)
    >>> _ = v.assign([0.0, 0.0])
    >>> ckpt.restore(path).assert_consumed().save_counter
    1
    >>> v.numpy()
    array([1., 2.])
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np

from hpcdist.checkpoint import format as fmt
from hpcdist.checkpoint.state import adapt, has_protocol, ps_variables_of
from hpcdist.checkpoint.state_file import write_state_file
from hpcdist.checkpoint.status import CheckpointLoadStatus, CheckpointMatchError
from hpcdist.checkpoint.sync import Group, is_ps_strategy
from hpcdist.distribute import context
from hpcdist.distribute.ps.checkpoint import pause_clients, restore_ps_shards, save_ps_shards
from hpcdist.errors import CheckpointError
from hpcdist.observe.timeline import span

__all__ = ["Checkpoint", "CheckpointLoadStatus", "CheckpointMatchError"]

_RESERVED = ("save_counter",)


def _strategy_of(obj: Any) -> Any:
    """The strategy of a tracked object's variables, or ``None``."""
    for attr in ("_distribute_strategy",):
        s = getattr(obj, attr, None)
        if s is not None:
            return s
    for attr in ("_iterations", "weights", "variables"):
        try:
            inner = getattr(obj, attr, None)
        except Exception:  # an unbuilt model, a property that needs state
            continue
        if isinstance(inner, (list, tuple)):
            inner = inner[0] if inner else None
        if inner is not None and not callable(inner):
            s = getattr(inner, "_distribute_strategy", None)
            if s is not None:
                return s
    return None


class Checkpoint:
    """Groups trackable objects for saving and restoring (``tf.train.Checkpoint``).

    ``root`` (optional) is tracked under the name ``"root"``; every keyword
    argument under its name; attributes set later are tracked too. Trackable:
    variables, models, optimizers, ``np.random.Generator``/``RandomState``,
    distributed iterators, other Checkpoints, dicts and lists of those, and any
    object with ``_checkpoint_state``/``_restore_checkpoint_state``.

    The workers that take part are those of the strategy of the tracked
    variables (models, optimizers), else of the current strategy: a Checkpoint
    of only iterators and generators must be used inside ``strategy.scope()``.

    Example: ``ckpt = Checkpoint(model=model, optimizer=opt); ckpt.save("/ckpt/run")``.
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        object.__setattr__(self, "_objects", {})
        object.__setattr__(self, "_save_counter", 0)
        if root is not None:
            self._track("root", root)
        for name, obj in kwargs.items():
            self._track(name, obj)

    # -- tracking --------------------------------------------------------------------------
    def _track(self, name: str, obj: Any) -> None:
        if not name or "." in name or name in _RESERVED:
            raise ValueError(
                f"cannot track an object as {name!r}: names must be non-empty, without '.', "
                f"and not one of {list(_RESERVED)}"
            )
        _flatten(name, obj, [])  # raises TypeError for what cannot be tracked
        self._objects[name] = obj

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._track(name, value)

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"Checkpoint tracks no object named {name!r} ({sorted(objects)})")

    @property
    def save_counter(self) -> int:
        """How many times ``save`` was called (restored by ``restore``)."""
        return self._save_counter

    def __repr__(self) -> str:
        return f"<hpcdist.checkpoint.Checkpoint {sorted(self._objects)}>"

    # -- the protocol, for a Checkpoint nested in another --------------------------------------
    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"save_counter": np.asarray(np.int64(self._save_counter))}, {}

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        if "save_counter" in arrays:
            self._save_counter = int(arrays["save_counter"])

    def _entries(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for name, obj in self._objects.items():
            _flatten(name, obj, out)
        return out

    def _strategy(self) -> Any:
        found = []
        stack = list(self._objects.values())
        while stack:
            obj = stack.pop(0)
            if isinstance(obj, Checkpoint):
                stack.extend(obj._objects.values())
            elif isinstance(obj, dict):
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple)):
                stack.extend(obj)
            else:
                s = _strategy_of(obj)
                if s is not None and s is not context.default_strategy():
                    found.append(s)
        if any(s is not found[0] for s in found):
            raise CheckpointError(
                f"the objects of {self!r} belong to different strategies ({found[0]!r}, ...); "
                "a Checkpoint saves the objects of one strategy"
            )
        return found[0] if found else context.get_strategy()

    # -- saving ------------------------------------------------------------------------------
    def save(self, file_prefix: str | os.PathLike[str], options: Any = None) -> str:
        """Increment ``save_counter`` and write ``f"{file_prefix}-{save_counter}"``; returns it.

        Also records it in the directory's ``checkpoint`` state file (for
        ``latest_checkpoint``). Collective under a multi-worker strategy.

        Example: ``ckpt.save("/ckpt/run")`` returns ``"/ckpt/run-1"``, then ``"/ckpt/run-2"``.
        """

        self._save_counter += 1
        prefix = f"{os.fspath(file_prefix)}-{self._save_counter}"

        def record(manifest: dict) -> None:
            directory = os.path.dirname(os.path.abspath(prefix))
            write_state_file(directory, [os.path.basename(prefix)], [manifest["created"]])

        try:
            return self._write(prefix, record)[0]
        except BaseException:
            self._save_counter -= 1
            raise

    def write(self, file_prefix: str | os.PathLike[str], options: Any = None) -> str:
        """Write the checkpoint exactly at ``file_prefix`` (``save_counter`` unchanged).

        Example: ``ckpt.write("/ckpt/final")`` writes ``/ckpt/final.index.json`` and data.
        """
        return self._write(os.fspath(file_prefix), None)[0]

    def _write(self, prefix: str, on_root: Any) -> tuple[str, Any]:
        """Write; ``on_root(manifest)`` runs on the chief after, its result reaches all."""
        with span("checkpoint write", "checkpoint", {"prefix": prefix}):  # timeline (off: no-op)
            return self._write_files(prefix, on_root)

    def _write_files(self, prefix: str, on_root: Any) -> tuple[str, Any]:
        entries = self._entries()
        strategy = self._strategy()
        with Group.open(strategy) as group, _paused(strategy, group):
            error, arrays, metas, ps = None, {}, {}, {}
            try:
                for path, adapter in entries:
                    named, meta = adapter._checkpoint_state()
                    arrays[path], metas[path] = dict(named), meta
                    variables = ps_variables_of(adapter)
                    if variables:
                        ps[path] = variables
                json.dumps(metas)  # every worker's meta must be JSON-able
            except Exception as e:
                error = e
            group.agree(error)
            per_worker = group.gather_json(metas)
            error, result = None, None
            if group.is_root:
                assert per_worker is not None  # gathered on the root
                try:
                    fragment, names = None, None
                    if ps:
                        unique = list({id(v): v for vs in ps.values() for v in vs}.values())
                        fragment = save_ps_shards(strategy, prefix, unique)
                        names = {p: [str(v.name) for v in vs] for p, vs in ps.items()}
                    manifest = fmt.write_checkpoint(
                        prefix, arrays, per_worker, self._save_counter,
                        ps_fragment=fragment, ps_objects=names,
                    )  # fmt: skip
                    result = on_root(manifest) if on_root is not None else None
                except Exception as e:
                    error = e
            group.agree(error)
            if on_root is not None:
                result = group.bcast_json(result)
        return prefix, result

    # -- restoring ---------------------------------------------------------------------------
    def restore(
        self, save_path: str | os.PathLike[str] | None, options: Any = None
    ) -> CheckpointLoadStatus:
        """Restore every tracked object (and ``save_counter``) from ``save_path``.

        ``None`` restores nothing (the status's assertions then fail). Values for
        optimizer slots that do not exist yet wait until the optimizer is built.
        Raises ``CheckpointCorruptError`` (damaged files), ``CheckpointNotFoundError``
        or ``CheckpointError`` (a layout that does not fit) on every worker.

        Example: ``ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()``.
        """
        if save_path is None:
            return CheckpointLoadStatus(None, self._entries(), [])
        return self._read(os.fspath(save_path), True)

    def read(self, save_path: str | os.PathLike[str], options: Any = None) -> CheckpointLoadStatus:
        """Like :meth:`restore` for a checkpoint made by :meth:`write` (``save_counter`` kept).

        Example: ``ckpt.read("/ckpt/final").assert_consumed()``.
        """
        return self._read(os.fspath(save_path), False)

    def _read(self, prefix: str, with_counter: bool) -> CheckpointLoadStatus:
        entries = self._entries()
        paths = [p for p, _ in entries]
        strategy = self._strategy()
        with Group.open(strategy) as group:
            error, header, values, manifest = None, None, None, None
            if group.is_root:
                try:
                    manifest = fmt.read_manifest(prefix)
                    fmt.verify_files(prefix, manifest)
                    loaded = fmt.load_arrays(prefix, manifest, paths)
                    header, values = _header(manifest, loaded)
                except Exception as e:
                    error = e
            group.agree(error)
            header = group.bcast_json(header)
            specs = [(d, s) for _, _, d, s in header["arrays"]]
            flat = group.bcast_arrays(values, specs)
            arrays: dict[str, dict] = {p: {} for p in header["objects"]}
            for (path, name, _, _), value in zip(header["arrays"], flat, strict=True):
                arrays[path][name] = value
            matched = [(p, a) for p, a in entries if p in header["objects"]]
            error, metas = None, {}
            try:
                metas = _metas_for(group, header, [p for p, _ in matched])
                for path, adapter in matched:
                    if ps_variables_of(adapter) and not header["ps"]:
                        raise CheckpointError(
                            f"{path!r} has variables on parameter servers, but {prefix!r} was "
                            "not saved under ParameterServerStrategy"
                        )
                    check = getattr(adapter, "_check_checkpoint_state", None)
                    if callable(check):
                        check(arrays[path], metas[path])
            except Exception as e:
                error = e
            group.agree(error)
            if header["ps"]:
                error = None
                with _paused(strategy, group):
                    if group.is_root:
                        try:
                            if not is_ps_strategy(strategy):
                                raise CheckpointError(
                                    f"{prefix!r} holds parameter-server shards; restore it "
                                    "under ParameterServerStrategy"
                                )

                            assert manifest is not None  # read above on the root
                            restore_ps_shards(strategy, prefix, manifest["ps_shards"])
                        except Exception as e:
                            error = e
                group.agree(error)
            error = None
            try:
                for path, adapter in matched:
                    adapter._restore_checkpoint_state(arrays[path], metas[path])
            except Exception as e:
                error = e
            group.agree(error)
        status = CheckpointLoadStatus(prefix, entries, list(header["objects"]))
        status.save_counter = int(header["save_counter"])
        if with_counter:
            self._save_counter = status.save_counter
        return status


def _paused(strategy: Any, group: Group) -> Any:
    """Under ParameterServerStrategy: every client flushes its updates and waits (a snapshot)."""
    if not is_ps_strategy(strategy):
        return contextlib.nullcontext()

    return pause_clients(strategy, group.comm)


def _flatten(path: str, obj: Any, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Append ``(dotted path, adapter)`` for ``obj`` and what it contains."""
    if isinstance(obj, Checkpoint):
        out.append((path, obj))
        for name, child in obj._objects.items():
            _flatten(f"{path}.{name}", child, out)
    elif isinstance(obj, dict) and not has_protocol(obj):
        for key, child in obj.items():
            if not isinstance(key, str) or not key or "." in key:
                raise ValueError(f"cannot track dict key {key!r} of {path!r}: use plain names")
            _flatten(f"{path}.{key}", child, out)
    elif isinstance(obj, (list, tuple)) and not has_protocol(obj):
        for i, child in enumerate(obj):
            _flatten(f"{path}.{i}", child, out)
    else:
        out.append((path, adapt(obj)))
    return out


def _header(manifest: dict, loaded: dict) -> tuple[dict, list]:
    """What every worker needs from the chief's reading, and the arrays in its order."""
    specs, values = [], []
    for path, named in loaded.items():
        for name, value in named.items():
            specs.append([path, name, value.dtype.str, list(value.shape)])
            values.append(value)
    objects = {p: o.get("ps_variables", []) for p, o in manifest["objects"].items()}
    header = {
        "save_counter": manifest["save_counter"],
        "objects": objects,
        "arrays": specs,
        "per_worker": manifest["meta"]["per_worker"],
        "ps": "ps_shards" in manifest,
    }
    return header, values


def _metas_for(group: Group, header: dict, paths: list[str]) -> dict[str, Any]:
    """This worker's meta of each object (a common one when the worker count changed)."""
    per_worker = header["per_worker"]
    if len(per_worker) == group.size:
        mine = per_worker[group.rank]
        return {p: mine.get(p, {}) for p in paths}
    out = {}
    for p in paths:
        values = [w.get(p, {}) for w in per_worker]
        if any(v != values[0] for v in values):
            raise CheckpointError(
                f"{p!r} was saved with a different state on each of {len(per_worker)} workers, "
                f"but {group.size} workers restore it; restore with {len(per_worker)} workers"
            )
        out[p] = values[0]
    return out
