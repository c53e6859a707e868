"""Callbacks that set the learning rate: ``LearningRateScheduler`` and ``ReduceLROnPlateau``.

Both change ``model.optimizer.learning_rate`` between epochs, as Keras's do,
and add the rate to the epoch's logs as ``"learning_rate"``. Under a strategy
every worker runs them: ``ReduceLROnPlateau`` decides from the epoch logs
(the same on every worker), and ``LearningRateScheduler`` takes the chief's
value of the schedule (one small broadcast per epoch under a multi-worker
strategy), so the workers keep one learning rate even if the schedule is not
a pure function of the epoch.

Example:
    >>> class Opt:
    ...     learning_rate = 0.1
    >>> class Model:
    ...     optimizer, distribute_strategy, stop_training = Opt(), None, False
    >>> sched = LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr)
    >>> sched.set_model(Model())
    >>> for epoch in range(3):
    ...     sched.on_epoch_begin(epoch)
    >>> Model.optimizer.learning_rate
    0.025
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.arrays import to_host
from hpcdist.callbacks.base import Callback, Logs, is_chief, log, monitor_op_for


def _optimizer(model: Any, owner: str) -> Any:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "learning_rate"):
        raise ValueError(
            f"{owner} needs a compiled model whose optimizer has a learning_rate; call "
            "model.compile(optimizer=...) before fit"
        )
    return optimizer


def _same_on_every_worker(model: Any, value: float) -> float:
    """The chief's ``value`` on every worker (a broadcast under a multi-worker strategy)."""
    strategy = getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    if extended is None or getattr(extended, "num_workers", 1) <= 1:
        return value

    out = extended.broadcast_initial_value(np.array([value], dtype=np.float64))
    return float(to_host(out)[0])


class LearningRateScheduler(Callback):
    """Set the learning rate at the start of every epoch to ``schedule(epoch, lr)``
    (``keras.callbacks.LearningRateScheduler``).

    ``schedule`` takes the 0-based epoch and the current learning rate (or the
    epoch alone) and returns the new rate. ``verbose=1`` prints the change
    (chief only).

    Example: ``LearningRateScheduler(lambda epoch, lr: lr if epoch < 10 else lr * 0.9)``.
    """

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise TypeError(f"LearningRateScheduler needs a callable schedule, got {schedule!r}")
        self.schedule = schedule
        self.verbose = verbose

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Compute and set this epoch's learning rate."""
        optimizer = _optimizer(self.model, "LearningRateScheduler")
        lr = float(optimizer.learning_rate)
        try:
            new = self.schedule(epoch, lr)
        except TypeError:  # a schedule of the epoch alone (Keras's old form)
            new = self.schedule(epoch)
        try:
            new = float(new)
        except (TypeError, ValueError):
            raise ValueError(
                f"the output of the schedule of LearningRateScheduler must be a float; got {new!r}"
            ) from None
        if not math.isfinite(new):
            raise ValueError(f"the schedule of LearningRateScheduler returned {new!r} at epoch "
                             f"{epoch}; expected a finite learning rate")  # fmt: skip
        new = _same_on_every_worker(self.model, new)
        optimizer.learning_rate = new
        if self.verbose > 0 and is_chief(self.model):
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to {new}.")

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Add ``"learning_rate"`` to the epoch's logs."""
        if logs is not None:
            logs["learning_rate"] = float(_optimizer(self.model, "LearningRateScheduler")
                                          .learning_rate)  # fmt: skip


class ReduceLROnPlateau(Callback):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved for
    ``patience`` epochs (``keras.callbacks.ReduceLROnPlateau``).

    An improvement beats the best value by more than ``min_delta`` (downwards in
    ``"min"`` mode, upwards in ``"max"`` mode; ``"auto"``: max for names ending
    in ``acc``, ``accuracy`` or ``auc``). After a reduction, ``cooldown`` epochs
    pass before counting again; the rate never goes below ``min_lr``.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if "epsilon" in kwargs:  # Keras's old name of min_delta
            min_delta = kwargs.pop("epsilon")
        if kwargs:
            raise TypeError(f"ReduceLROnPlateau got unexpected arguments {sorted(kwargs)}")
        if not float(factor) < 1.0:
            raise ValueError(
                f"ReduceLROnPlateau does not support a factor >= 1.0; got {factor!r}"
            )
        self.monitor = monitor
        self.factor = float(factor)
        self.patience = int(patience)
        self.verbose = verbose
        self.mode = monitor_op_for(monitor, mode, "ReduceLROnPlateau")
        self.min_delta = abs(float(min_delta))
        self.cooldown = int(cooldown)
        self.min_lr = float(min_lr)
        self._reset()

    def _reset(self) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait = 0
        self.cooldown_counter = 0

    def _improved(self, current: float) -> bool:
        if self.mode == "min":
            return current < self.best - self.min_delta
        return current > self.best + self.min_delta

    def in_cooldown(self) -> bool:
        """Whether the cooldown after a reduction is still running."""
        return self.cooldown_counter > 0

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Reset the best value and the counters."""
        self._reset()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Count an epoch without improvement; reduce the rate when patience runs out."""
        logs = logs if logs is not None else {}
        optimizer = _optimizer(self.model, "ReduceLROnPlateau")
        logs["learning_rate"] = float(optimizer.learning_rate)
        current = logs.get(self.monitor)
        if current is None:
            if is_chief(self.model):
                log.warning(
                    "ReduceLROnPlateau is conditioned on %r, which is not in the logs "
                    "(available: %s); it will not change the learning rate.",
                    self.monitor, ", ".join(logs) or "none",
                )  # fmt: skip
            return
        current = float(current)
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self._improved(current):
            self.best = current
            self.wait = 0
            return
        if self.in_cooldown():
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        old = float(optimizer.learning_rate)
        if old > self.min_lr:
            new = max(old * self.factor, self.min_lr)
            optimizer.learning_rate = new
            if self.verbose > 0 and is_chief(self.model):
                print(f"\nEpoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new}.")
            self.cooldown_counter = self.cooldown
            self.wait = 0
