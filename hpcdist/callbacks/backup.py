"""Back up the training state during ``fit`` and resume from it (Keras's ``BackupAndRestore``).

The backup is an hpcdist checkpoint (:mod:`hpcdist.checkpoint`) of the model's
weights, the optimizer (its step count and slots) and the position of
``fit``: the epoch, the number of batches done in it, the shuffle seed and
the position of the input iterator. When ``fit`` starts and the backup
directory holds a checkpoint, everything is restored and training resumes
*at the saved step*: the epoch's data is reshuffled as in an uninterrupted run
(the saved seed and iteration counters) and the batches already trained are
skipped, so the final weights are bit for bit those of a run that was never
interrupted. (Keras redoes a partly done epoch after an epoch-level backup;
here an epoch-level backup is taken at the end of an epoch, so nothing is redone.)

Differences from Keras, on purpose:

* ``save_before_preemption`` defaults to ``True`` (Keras: ``False``): at
  every step the workers agree whether one of them received a preemption
  signal (:data:`~hpcdist.checkpoint.preemption.PREEMPTION_SIGNALS`); if so
  all save at that step and exit with
  :data:`~hpcdist.checkpoint.preemption.PREEMPTION_EXIT_CODE`. The cost is
  one 8-byte all-reduce per step with several workers (none with one), and
  batch systems always send such a signal before they stop a job;
* two backups are kept (Keras: one), so a damaged newest one falls back to
  the previous one;
* ``delete_checkpoint`` removes only the backup's own files (and the
  directory if it is then empty), never other files of ``backup_dir``;
* the logs of a resumed epoch cover the batches run after the restart only
  (metric state is not saved).

Example:
    >>> cb = BackupAndRestore("/tmp/backup", save_freq=100)
    >>> cb.save_freq, cb.delete_checkpoint, cb.save_before_preemption
    (100, True, True)
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from typing import Any

import numpy as np

from hpcdist.callbacks.base import Callback, Logs, is_chief
from hpcdist.checkpoint.checkpoint import Checkpoint
from hpcdist.checkpoint.manager import CheckpointManager
from hpcdist.checkpoint.preemption import PREEMPTION_EXIT_CODE
from hpcdist.checkpoint.watcher import PreemptionWatcher
from hpcdist.data.dataset import iteration_counts
from hpcdist.errors import CheckpointError


class FitState:
    """Where ``fit`` is: the checkpointed object that lets a restarted ``fit`` resume there.

    ``epoch`` is the epoch being run (or the next one, after an epoch end),
    ``step`` the number of its batches done. ``fit`` updates it; its
    checkpoint state is meta only: ``{"epoch", "step", "seed", "iterator"}``,
    where ``iterator`` is the input iterator's own state (its pipelines'
    iteration counters and the steps it gave, see
    :class:`~hpcdist.data.distributed.DistributedIterator`).

    Example:
        >>> s = FitState(seed=7)
        >>> s.epoch, s.step, s.resumed
        (0, 0, False)
    """

    def __init__(self, seed: int | None = None, dist: Any = None) -> None:
        self.epoch = 0
        self.step = 0
        self.seed = seed
        self.dist = dist  # the DistributedDataset fit iterates
        self.iterator: Any = None  # the iterator the next step reads from (None: a fresh one)
        self.resumed = False
        self._pending_iterator: dict | None = None
        self._pending_step = 0

    # -- what fit calls
    def position(self, iterator: Any) -> Any:
        """Put a new iterator at the restored position (once, after a resume); returns it."""
        meta, self._pending_iterator = self._pending_iterator, None
        if meta is not None:
            iterator._restore_checkpoint_state({}, meta)
        return iterator

    def begin_epoch(self, epoch: int, iterator: Any) -> int:
        """Record the epoch and its iterator; returns the first step (restored or 0)."""
        self.epoch, self.iterator = epoch, iterator
        self.step, self._pending_step = self._pending_step, 0
        return self.step

    def end_epoch(self, epoch: int, keep_iterator: bool) -> None:
        """After the last batch of ``epoch``: the state is "at the start of the next one"."""
        self.epoch, self.step = epoch + 1, 0
        if not keep_iterator:
            self.iterator = None

    # -- the checkpoint state protocol
    def _iterator_meta(self) -> dict | None:
        if self.iterator is not None:
            return self.iterator._checkpoint_state()[1]
        if self.dist is None or not hasattr(self.dist, "sources"):
            return None

        counts = [iteration_counts(s) for s in self.dist.sources]
        return {"counts": counts, "steps": 0, "done": False}

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        meta: dict[str, Any] = {"epoch": self.epoch, "step": self.step, "seed": self.seed}
        meta["iterator"] = self._iterator_meta()
        return {}, meta

    def _restore_checkpoint_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        try:
            epoch, step = int(meta["epoch"]), int(meta["step"])
            seed = None if meta["seed"] is None else int(meta["seed"])
            iterator = meta["iterator"]
            if epoch < 0 or step < 0 or not (iterator is None or isinstance(iterator, dict)):
                raise ValueError("negative position or bad iterator state")
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(
                f"the saved fit state {meta!r} is not one BackupAndRestore wrote ({error}); "
                "use an empty backup_dir for a new training"
            ) from None
        self.epoch, self.seed = epoch, seed
        self.step = self._pending_step = step
        self._pending_iterator = iterator
        self.resumed = True


def _check_save_freq(save_freq: Any) -> str | int | bool:
    if save_freq == "epoch" or save_freq is False:
        return save_freq
    if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq <= 0:
        raise ValueError(
            f"BackupAndRestore(save_freq={save_freq!r}): expected 'epoch', a positive number "
            "of batches, or False (save only before a preemption)"
        )
    return save_freq


class BackupAndRestore(Callback):
    """Back up the training state and resume an interrupted ``fit`` where it stopped.

    Args:
        backup_dir: the directory of the backups (shared by all workers; only
            the chief writes). Use one directory per training.
        save_freq: ``"epoch"`` (at each epoch end), an integer ``n`` (after
            every ``n`` batches, counted across epochs) or ``False`` (only
            before a preemption).
        delete_checkpoint: delete the backup when ``fit`` completes (kept when
            ``fit`` stops with an error or a preemption).
        save_before_preemption: watch the preemption signals and, when one
            arrives on any worker, save at that step on every worker and exit
            with ``PREEMPTION_EXIT_CODE``. Default ``True`` (Keras: ``False``).

    Every worker must pass the same callback arguments (saves are collective).

    Example::

        backup = hd.callbacks.BackupAndRestore("/scratch/run1/backup", save_freq=200)
        model.fit(x, y, epochs=20, callbacks=[backup])   # rerun the same line after a crash
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike[str],
        save_freq: str | int | bool = "epoch",
        delete_checkpoint: bool = True,
        save_before_preemption: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(
                f"BackupAndRestore(backup_dir={backup_dir!r}): expected a directory path"
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = _check_save_freq(save_freq)
        self.delete_checkpoint = bool(delete_checkpoint)
        self.save_before_preemption = bool(save_before_preemption)
        self.exit_fn = lambda: sys.exit(_exit_code())  # replaceable, like TerminationConfig's
        self._manager: Any = None
        self._state: FitState | None = None
        self._watcher: Any = None
        self._batches_since_save = 0

    # -- called by fit
    def begin_fit(self, model: Any, state: FitState) -> bool:
        """Make the checkpoint, restore the newest backup (collective); whether one was found."""

        self._state = state
        objects = {"model": model, "fit_state": state}
        if getattr(model, "optimizer", None) is not None:
            objects["optimizer"] = model.optimizer
        self._manager = CheckpointManager(Checkpoint(**objects), self.backup_dir, max_to_keep=2)
        self._manager.restore_or_initialize()
        self._batches_since_save = 0
        if self.save_before_preemption:
            self._watcher = PreemptionWatcher(model.distribute_strategy)
            self._watcher.start()
        return state.resumed

    def check_preemption(self) -> None:
        """Before a step: if any worker was signalled, save here on every worker and exit."""
        watcher = self._watcher
        if watcher is None:
            return
        received = watcher.received
        if watcher.agree(watcher.local_value()) == 0:
            return
        self._save()
        watcher.mark_handled(received)
        self.exit_fn()

    def end_fit(self) -> None:
        """Stop watching the signals and free the watcher's communicator (fit's ``finally``)."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def _save(self) -> str | None:
        return self._manager.save(check_interval=False)

    # -- hooks
    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Save after every ``save_freq`` batches (integer ``save_freq`` only)."""
        if isinstance(self.save_freq, bool) or not isinstance(self.save_freq, int):
            return
        self._batches_since_save += 1
        if self._batches_since_save >= self.save_freq and self._manager is not None:
            self._batches_since_save = 0
            self._save()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Save at the end of each epoch (``save_freq="epoch"``)."""
        if self.save_freq == "epoch" and self._manager is not None:
            self._save()

    def on_train_end(self, logs: Logs | None = None) -> None:
        """``fit`` completed: delete the backup (``delete_checkpoint``) on the chief."""
        self.end_fit()
        if self.delete_checkpoint and self._manager is not None and is_chief(self.model):
            _delete_backup(self.backup_dir)
        self._manager = None

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments."""
        return {
            "backup_dir": self.backup_dir,
            "save_freq": self.save_freq,
            "delete_checkpoint": self.delete_checkpoint,
            "save_before_preemption": self.save_before_preemption,
        }


def _exit_code() -> int:
    return PREEMPTION_EXIT_CODE


def _delete_backup(directory: str, name: str = "ckpt") -> None:
    """Remove the manager's files (``ckpt-*``, ``checkpoint``, leftovers) and an empty directory."""
    patterns = (f"{name}-*", "checkpoint", "checkpoint.tmp-*")
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(directory), pattern)):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def find_backup(callbacks: Any) -> BackupAndRestore | None:
    """The ``BackupAndRestore`` among ``callbacks`` (at most one is allowed), else ``None``.

    Example: ``find_backup([BackupAndRestore("/tmp/b")]).backup_dir`` is ``'/tmp/b'``.
    """
    found = [cb for cb in callbacks if isinstance(cb, BackupAndRestore)]
    if len(found) > 1:
        raise ValueError(
            f"fit got {len(found)} BackupAndRestore callbacks; pass one (it backs up the whole "
            "training state)"
        )
    return found[0] if found else None
