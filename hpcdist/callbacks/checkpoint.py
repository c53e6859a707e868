"""Save the model's weights during training (Keras's ``ModelCheckpoint``, weights only).

Every worker runs the same decisions (which epoch is best, when ``save_freq`` batches have
passed) from the same logs; only the chief calls ``model.save_weights``.

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> class Model:  # any object with save_weights(path)
    ...     distribute_strategy = None
    ...     def save_weights(self, path):
    ...         np.savez(path, w=np.zeros(2))
    >>> root = tempfile.mkdtemp()
    >>> ckpt = ModelCheckpoint(os.path.join(root, "w-{epoch:02d}-{val_loss:.2f}.npz"),
    ...                        save_best_only=True)
    >>> ckpt.set_model(Model())
    >>> ckpt.on_train_begin()
    >>> for epoch, val_loss in enumerate([0.5, 0.7, 0.25]):
    ...     ckpt.on_epoch_begin(epoch)
    ...     ckpt.on_epoch_end(epoch, {"loss": 1.0, "val_loss": val_loss})
    >>> sorted(os.listdir(root)), ckpt.best
    (['w-01-0.50.npz', 'w-03-0.25.npz'], 0.25)
"""

from __future__ import annotations

import math
import os
from typing import Any

from hpcdist.callbacks.base import Callback, Logs, is_chief, log, monitor_op_for


class ModelCheckpoint(Callback):
    """Save the weights every epoch, every ``save_freq`` batches, or when ``monitor`` improves.

    Args:
        filepath: where to save; may contain ``{epoch:02d}`` (1-based, as Keras), ``{batch}``
            (1-based, when saving by batches) and log keys such as ``{val_loss:.2f}``.
        monitor: the log key compared with ``save_best_only``.
        verbose: 1 prints a line for each save decision (chief only).
        save_best_only: save only when ``monitor`` improves on the best value so far
            (strictly better; no ``min_delta``).
        save_weights_only: must be ``True``: hpcdist saves weights only
            (``model.save_weights``, an ``.npz`` file).
        mode: ``"auto"``, ``"min"`` or ``"max"`` (auto: max for names ending in ``acc``,
            ``accuracy`` or ``auc``, else min).
        save_freq: ``"epoch"`` (save at each epoch end) or an integer ``n``: save after every
            ``n`` training batches (counted across epochs) with the batch's logs.
        initial_value_threshold: the initial best value; a save needs to beat it.

    Example:
        >>> ModelCheckpoint("ckpt/w-{epoch:03d}.npz", save_freq=100).save_freq
        100
    """

    def __init__(
        self,
        filepath: str | os.PathLike[str],
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = True,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
    ) -> None:
        super().__init__()
        if not save_weights_only:
            raise ValueError(
                "ModelCheckpoint(save_weights_only=False) is not supported: hpcdist saves only "
                "weights (model.save_weights writes an .npz file). Use save_weights_only=True "
                "and rebuild the model in code before model.load_weights(path)."
            )
        if save_freq != "epoch" and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq <= 0
        ):
            raise ValueError(
                f"ModelCheckpoint(save_freq={save_freq!r}): expected 'epoch' or a positive "
                "integer number of batches."
            )
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = True
        self.save_freq = save_freq
        self.mode = monitor_op_for(monitor, mode, "ModelCheckpoint")
        self.initial_value_threshold = initial_value_threshold
        self.best = self._initial_best()
        self._current_epoch = 0
        self._batches_seen_since_last_saving = 0
        self._last_batch_seen = 0

    def _initial_best(self) -> float:
        if self.initial_value_threshold is not None:
            return float(self.initial_value_threshold)
        return math.inf if self.mode == "min" else -math.inf

    def _better(self, current: float, best: float) -> bool:
        return current < best if self.mode == "min" else current > best

    # -- hooks -----------------------------------------------------------------------
    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Reset the batch counter (the best value is kept across ``fit`` calls, as Keras)."""
        self._batches_seen_since_last_saving = 0
        self._last_batch_seen = 0

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Remember the current epoch (for file names of batch-level saves)."""
        self._current_epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Save after every ``save_freq`` batches (integer ``save_freq`` only)."""
        if self._should_save_on_batch(batch):
            self._save(self._current_epoch, batch, logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Save at the end of the epoch (``save_freq="epoch"`` only)."""
        if self.save_freq == "epoch":
            self._save(epoch, None, logs)

    # -- logic -----------------------------------------------------------------------
    def _should_save_on_batch(self, batch: int) -> bool:
        if isinstance(self.save_freq, str):  # "epoch"
            return False
        if batch <= self._last_batch_seen:  # a new epoch started: batches restart at 0
            added = batch + 1
        else:
            added = batch - self._last_batch_seen
        self._batches_seen_since_last_saving += added
        self._last_batch_seen = batch
        if self._batches_seen_since_last_saving >= self.save_freq:
            self._batches_seen_since_last_saving = 0
            return True
        return False

    def _file_path(self, epoch: int, batch: int | None, logs: Logs) -> str:
        """``filepath`` formatted with ``epoch + 1``, ``batch + 1`` and the log values."""
        fields = dict(logs)
        fields["epoch"] = epoch + 1
        if batch is not None and "batch" not in logs:
            fields["batch"] = batch + 1
        try:
            return self.filepath.format(**fields)
        except (KeyError, IndexError) as e:
            raise KeyError(
                f'Failed to format the ModelCheckpoint filepath "{self.filepath}": {e!r} is not '
                f"a log key (available: {', '.join(sorted(fields))}). Use only these "
                "names in the filepath."
            ) from e

    def _save(self, epoch: int, batch: int | None, logs: Logs | None) -> None:
        logs = logs or {}
        chief = is_chief(self.model)
        talk = chief and self.verbose > 0
        path = self._file_path(epoch, batch, logs)
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                if chief:
                    log.warning(
                        "ModelCheckpoint can save the best model only with %r available in the "
                        "logs (found: %s); skipping.",
                        self.monitor,
                        ", ".join(logs) or "none",
                    )
                return
            current = float(current)
            if not self._better(current, self.best):
                if talk:
                    print(
                        f"\nEpoch {epoch + 1:05d}: {self.monitor} did not improve from "
                        f"{self.best:.5f}"
                    )
                return
            if talk:
                print(
                    f"\nEpoch {epoch + 1:05d}: {self.monitor} improved from {self.best:.5f} "
                    f"to {current:.5f}, saving model to {path}"
                )
            self.best = current
        elif talk:
            print(f"\nEpoch {epoch + 1:05d}: saving model to {path}")
        if chief:
            dirname = os.path.dirname(path)
            if dirname:
                os.makedirs(dirname, exist_ok=True)
            self.model.save_weights(path)

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (for logging and reproducing the callback)."""
        return {
            "filepath": self.filepath,
            "monitor": self.monitor,
            "verbose": self.verbose,
            "save_best_only": self.save_best_only,
            "save_weights_only": True,
            "mode": self.mode,
            "save_freq": self.save_freq,
            "initial_value_threshold": self.initial_value_threshold,
        }
