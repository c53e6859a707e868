"""``CheckpointManager``: numbered checkpoints in a directory, old ones deleted, the newest found.

The directory's state file ``checkpoint`` (JSON, written atomically by the
chief) names the newest checkpoint and the managed ones, relative to the
directory, with TF's keys::

    {"model_checkpoint_path": "ckpt-7",
     "all_model_checkpoint_paths": ["ckpt-5", "ckpt-6", "ckpt-7"],
     "all_model_checkpoint_timestamps": [...], "last_preserved_timestamp": ...}

:meth:`CheckpointManager.restore_or_initialize` restores the newest checkpoint
that is intact: a damaged newest one (a crash during the save, a truncated
copy) is refused with a warning naming it, and the one before it is restored.

Example:
    >>> import tempfile, numpy as np, hpcdist as hd
    >>> from hpcdist.checkpoint import Checkpoint
    >>> v = hd.Variable(0.0)
    >>> manager = CheckpointManager(Checkpoint(v=v), tempfile.mkdtemp(), max_to_keep=2)
    >>> for step in range(3):
    ...     _ = v.assign(float(step))
    ...     _ = manager.save()
    >>> [os.path.basename(p) for p in manager.checkpoints]
    ['ckpt-2', 'ckpt-3']
    >>> _ = v.assign(-1.0)
    >>> os.path.basename(manager.restore_or_initialize()), float(v)
    ('ckpt-3', 2.0)
    >>> latest_checkpoint(manager.directory) == manager.latest_checkpoint
    True
"""

from __future__ import annotations

import glob
import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcdist.checkpoint.checkpoint import Checkpoint
from hpcdist.checkpoint.format import CheckpointNotFoundError, data_file, index_file
from hpcdist.checkpoint.state_file import read_state_file, write_state_file
from hpcdist.checkpoint.sync import Group
from hpcdist.errors import CheckpointCorruptError
from hpcdist.runtime.atomic import fsync_directory

if TYPE_CHECKING:
    from hpcdist.checkpoint.checkpoint import Checkpoint

__all__ = ["CheckpointManager", "latest_checkpoint", "read_state_file", "write_state_file"]

log = logging.getLogger("hpcdist")


def _full(directory: str, name: str) -> str:
    return name if os.path.isabs(name) else os.path.join(directory, name)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint recorded in ``checkpoint_dir`` (``tf.train.latest_checkpoint``).

    ``None`` when the directory has no state file or the checkpoint it names is
    gone. Reads this process's file system (not collective).

    Example: ``ckpt.restore(latest_checkpoint("/ckpt"))``.
    """
    directory = os.fspath(checkpoint_dir)
    state = read_state_file(directory)
    if state is None or not state["model_checkpoint_path"]:
        return None
    path = _full(directory, state["model_checkpoint_path"])
    return path if os.path.exists(index_file(path)) else None


def delete_checkpoint_files(prefix: str) -> None:
    """Delete a checkpoint's files: the manifest first, so a half-deleted one is never valid."""
    for path in [index_file(prefix), data_file(prefix), *glob.glob(glob.escape(prefix) + ".ps-*")]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    fsync_directory(os.path.dirname(os.path.abspath(prefix)))


class CheckpointManager:
    """Keeps the newest ``max_to_keep`` checkpoints (``tf.train.CheckpointManager``).

    ``keep_checkpoint_every_n_hours`` also keeps (outside the managed list) a
    checkpoint each time that many hours passed since the last one kept so.
    With ``checkpoint_interval`` (needs ``step_counter``), ``save`` skips until
    the step advanced that much. ``init_fn`` runs in ``restore_or_initialize``
    when there is no checkpoint. Creating the manager is collective under a
    multi-worker strategy: the chief reads the state file, every worker gets it.

    Example: ``manager = CheckpointManager(ckpt, "/ckpt", max_to_keep=3); manager.save()``.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        directory: str | os.PathLike[str],
        max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager manages an hpcdist Checkpoint, got {type(checkpoint).__name__}"
            )
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or int(max_to_keep) < 1):
            raise ValueError(f"max_to_keep is {max_to_keep!r}; expected None or an integer >= 1")
        if keep_checkpoint_every_n_hours is not None and not keep_checkpoint_every_n_hours > 0:
            raise ValueError(
                f"keep_checkpoint_every_n_hours is {keep_checkpoint_every_n_hours!r}; expected "
                "None or a positive number of hours"
            )
        if checkpoint_interval is not None and step_counter is None:
            raise ValueError("step_counter must be given when checkpoint_interval is set")
        if not checkpoint_name or "/" in checkpoint_name:
            raise ValueError(f"checkpoint_name is {checkpoint_name!r}; expected a plain file name")
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._name = checkpoint_name
        self._max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self._keep_hours = keep_checkpoint_every_n_hours
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._last_checkpoint_step: int | None = None
        with Group.open(checkpoint._strategy()) as group:
            state, error = None, None
            if group.is_root:
                try:
                    state = self._recover()
                except Exception as e:
                    error = e
            group.agree(error)
            self._set(group.bcast_json(state))

    # -- state -------------------------------------------------------------------------------
    def _recover(self) -> dict:
        """The managed checkpoints found on disk (chief only)."""
        now = time.time()
        try:
            state = read_state_file(self._directory)
        except CheckpointCorruptError as error:
            warnings.warn(f"{error}; looking for checkpoints by name", RuntimeWarning, 3)
            state = None
        if state is None:  # no usable state file: the directory's own checkpoints, by number
            found = []
            for path in glob.glob(os.path.join(glob.escape(self._directory), "*.index.json")):
                name = os.path.basename(path)[: -len(".index.json")]
                stem, _, number = name.rpartition("-")
                if stem == self._name and number.isdigit():
                    found.append((int(number), name))
            names = [n for _, n in sorted(found)]
            return {"names": names, "timestamps": [0.0] * len(names), "last_preserved": now}
        pairs = [
            (n, float(t))
            for n, t in zip(state["all_model_checkpoint_paths"],
                            state["all_model_checkpoint_timestamps"], strict=True)
            if os.path.exists(index_file(_full(self._directory, n)))
        ]  # fmt: skip
        last = state["last_preserved_timestamp"]
        last = now if last is None or last > now else float(last)
        return {"names": [n for n, _ in pairs], "timestamps": [t for _, t in pairs],
                "last_preserved": last}  # fmt: skip

    def _set(self, state: dict) -> None:
        self._names = list(state["names"])
        self._stamps = [float(t) for t in state["timestamps"]]
        self._last_preserved = float(state["last_preserved"])

    def _record(self, prefix: str, created: float) -> dict:
        """After a save (chief only): rotate, delete, write the state file; the new state."""
        name = os.path.basename(prefix)
        pairs = [(n, t) for n, t in zip(self._names, self._stamps, strict=True) if n != name]
        pairs.append((name, float(created)))
        last = self._last_preserved
        while self._max_to_keep is not None and len(pairs) > self._max_to_keep:
            old, stamp = pairs.pop(0)
            if self._keep_hours is not None and stamp - self._keep_hours * 3600.0 >= last:
                last = stamp  # preserved: leaves the managed list, keeps its files
                continue
            delete_checkpoint_files(_full(self._directory, old))
        names, stamps = [n for n, _ in pairs], [t for _, t in pairs]
        write_state_file(self._directory, names, stamps, last)
        return {"names": names, "timestamps": stamps, "last_preserved": last}

    # -- TF's API ----------------------------------------------------------------------------
    @property
    def directory(self) -> str:
        """The directory of the checkpoints and the state file."""
        return self._directory

    @property
    def checkpoint(self) -> Checkpoint:
        """The managed Checkpoint."""
        return self._checkpoint

    @property
    def checkpoint_interval(self) -> int | None:
        """The minimum number of steps between two saves (``None``: every ``save`` saves)."""
        return self._checkpoint_interval

    @property
    def checkpoints(self) -> list[str]:
        """The managed checkpoints (path prefixes), oldest first."""
        return [_full(self._directory, n) for n in self._names]

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest managed checkpoint (``None`` before the first)."""
        return _full(self._directory, self._names[-1]) if self._names else None

    def save(
        self, checkpoint_number: int | None = None, check_interval: bool = True, options: Any = None
    ) -> str | None:
        """Save a new checkpoint ``<directory>/<checkpoint_name>-<number>``; returns its path.

        ``checkpoint_number`` defaults to the Checkpoint's ``save_counter``
        (incremented by every save either way). Returns ``None`` when
        ``checkpoint_interval`` says it is too early (or this step was saved already).
        Collective under a multi-worker strategy.
        """
        if self._checkpoint_interval is not None:
            step = int(self._step_counter)
            last = self._last_checkpoint_step
            if last is not None and (
                step == last or (check_interval and step < last + self._checkpoint_interval)
            ):
                return None
            self._last_checkpoint_step = step
        ckpt = self._checkpoint
        ckpt._save_counter += 1
        number = ckpt._save_counter if checkpoint_number is None else int(checkpoint_number)
        prefix = os.path.join(self._directory, f"{self._name}-{number}")
        try:
            _, state = ckpt._write(prefix, lambda m: self._record(prefix, m["created"]))
        except BaseException:
            ckpt._save_counter -= 1
            raise
        self._set(state)
        return prefix

    def restore_or_initialize(self) -> str | None:
        """Restore the newest intact checkpoint; without any, run ``init_fn``; returns the path.

        A damaged or incomplete checkpoint is skipped with a ``RuntimeWarning``
        naming it and the one before it is tried. If every managed checkpoint is
        damaged, ``CheckpointCorruptError`` lists them (nothing is initialised:
        a silent restart from scratch would lose the run). Collective.
        """
        refused = []
        for path in reversed(self.checkpoints):
            try:
                self._checkpoint.restore(path)
            except (CheckpointCorruptError, CheckpointNotFoundError) as error:
                refused.append(path)
                if self._checkpoint._strategy().extended.should_checkpoint:
                    log.warning("refusing checkpoint %s: %s", path, error)
                    warnings.warn(
                        f"checkpoint {path!r} is damaged and is not restored ({error}); trying "
                        "the one before it",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                continue
            return path
        if refused:
            raise CheckpointCorruptError(
                f"every checkpoint in {self._directory!r} is damaged ({refused}); nothing was "
                "restored. Move them away to start from scratch"
            )
        if self._init_fn is not None:
            self._init_fn()
        return None

    def sync(self) -> None:
        """Wait for pending saves (saves here are synchronous: nothing to wait for)."""

    def __repr__(self) -> str:
        keep = "all" if self._max_to_keep is None else self._max_to_keep
        latest = self.latest_checkpoint
        return f"<CheckpointManager {self._directory!r} keep={keep} latest={latest}>"
