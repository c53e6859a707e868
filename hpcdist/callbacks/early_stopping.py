"""Stop training when a monitored quantity stops improving (Keras's ``EarlyStopping``).

The decision uses only the epoch logs, which are the same on every worker, so every worker
stops at the same epoch. With ``restore_best_weights`` every worker keeps its own host copy
of the best weights and restores it with ``model.set_weights``, so replicas stay identical.

Example:
    >>> class Model:  # any object with stop_training
    ...     stop_training = False
    >>> stop = EarlyStopping(monitor="loss", patience=2)
    >>> stop.set_model(Model())
    >>> stop.on_train_begin()
    >>> for epoch, loss in enumerate([0.5, 0.4, 0.45, 0.41, 0.3]):
    ...     stop.on_epoch_end(epoch, {"loss": loss})
    ...     if stop.model.stop_training:
    ...         break
    >>> stop.stopped_epoch, stop.best, stop.best_epoch
    (3, 0.4, 1)
"""

from __future__ import annotations

import math
from typing import Any

from hpcdist.callbacks.base import Callback, Logs, is_chief, log, monitor_op_for


class EarlyStopping(Callback):
    """Set ``model.stop_training`` when ``monitor`` has not improved for ``patience`` epochs.

    Args:
        monitor: the log key to watch (default ``"val_loss"``).
        min_delta: an improvement must exceed the best value by more than ``|min_delta|``
            (downwards in ``"min"`` mode, upwards in ``"max"`` mode).
        patience: the number of epochs without improvement after which training stops.
        verbose: 1 prints a line when the callback acts (chief only).
        mode: ``"auto"``, ``"min"`` or ``"max"`` (auto: max for names ending in ``acc``,
            ``accuracy`` or ``auc``, else min).
        baseline: training stops if the monitored value does not beat ``baseline`` within
            ``patience`` epochs (the wait counter restarts only on epochs that beat both the
            best value and the baseline).
        restore_best_weights: when training is stopped by this callback, set the weights of
            the best epoch back (as tf.keras 2: weights are restored when stopping, not when
            training runs to its last epoch). If no epoch improved, those of the first
            monitored epoch.
        start_from_epoch: epochs before this one are not monitored (warm-up).

    After training, ``stopped_epoch`` is the 0-based epoch at which training stopped (0 when
    it did not), ``best`` the best value and ``best_epoch`` its epoch. A missing ``monitor``
    key logs a warning and never stops training.

    Example:
        >>> EarlyStopping(monitor="val_accuracy", min_delta=0.01).min_delta
        0.01
        >>> EarlyStopping(monitor="val_loss", min_delta=0.01).min_delta
        -0.01
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0,
        patience: int = 0,
        verbose: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(
                f"EarlyStopping(patience={patience!r}): expected a non-negative integer "
                "number of epochs."
            )
        if not isinstance(start_from_epoch, int) or start_from_epoch < 0:
            raise ValueError(
                f"EarlyStopping(start_from_epoch={start_from_epoch!r}): expected a "
                "non-negative integer epoch."
            )
        self.monitor = monitor
        self.patience = patience
        self.verbose = verbose
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self.start_from_epoch = start_from_epoch
        self.mode = monitor_op_for(monitor, mode, "EarlyStopping")
        # Signed as Keras: improvement means monitor_op(current - min_delta, reference).
        self.min_delta = abs(min_delta) if self.mode == "max" else -abs(min_delta)
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self._worst()
        self.best_weights: list[Any] | None = None
        self.best_epoch = 0

    def _worst(self) -> float:
        return math.inf if self.mode == "min" else -math.inf

    def _is_improvement(self, value: float, reference: float) -> bool:
        shifted = value - self.min_delta
        return shifted < reference if self.mode == "min" else shifted > reference

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Reset the state, so that the callback can be reused for another ``fit``."""
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self._worst()
        self.best_weights = None
        self.best_epoch = 0

    def get_monitor_value(self, logs: Logs | None) -> float | None:
        """``logs[monitor]`` as a float, or ``None`` (with a warning) when it is missing."""
        value = (logs or {}).get(self.monitor)
        if value is None:
            if is_chief(self.model):
                log.warning(
                    "EarlyStopping is conditioned on %r, which is not in the logs (available: "
                    "%s); it will not stop training.",
                    self.monitor,
                    ", ".join(logs or {}) or "none",
                )
            return None
        return float(value)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Update the best value and the wait counter; stop training when patience runs out."""
        current = self.get_monitor_value(logs)
        if current is None or epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()  # restore these if nothing improves
        self.wait += 1
        if self._is_improvement(current, self.best):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._is_improvement(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                if self.verbose > 0 and is_chief(self.model):
                    print(
                        "Restoring model weights from the end of the best epoch: "
                        f"{self.best_epoch + 1}."
                    )
                self.model.set_weights(self.best_weights)

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Print the stopping epoch (``verbose > 0``, chief only)."""
        if self.stopped_epoch > 0 and self.verbose > 0 and is_chief(self.model):
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")
