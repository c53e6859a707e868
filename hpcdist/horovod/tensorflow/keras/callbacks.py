"""Horovod's Keras callbacks: broadcast the start state, average the epoch's metrics,
warm the learning rate up.

Example::

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3)]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from hpcdist.horovod.common.basics import size
from hpcdist.horovod.tensorflow import Average, allreduce, broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's (and, once built, the optimizer's) variables from
    ``root_rank`` when training begins."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs: Any = None) -> None:
        broadcast_variables(self.model.variables, self.root_rank)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and getattr(opt, "built", False):
            broadcast_variables(opt.variables, self.root_rank)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each epoch's metrics (``logs``) by their average over the ranks."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.isscalar(v) or np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = np.asarray(allreduce(values, op=Average))
        for k, v in zip(keys, averaged.tolist(), strict=True):
            logs[k] = v


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` (per batch when ``steps_per_epoch`` is known), as Horovod's
    callback does: ``lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)``."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0

    def multiplier(self, epoch: float) -> float:
        """The factor on ``initial_lr`` at (fractional) ``epoch``."""
        n = size()
        return 1.0 / n * (min(epoch, self.warmup_epochs) * (n - 1) / self.warmup_epochs + 1)

    def _set(self, epoch: float) -> None:
        if epoch > self.warmup_epochs:
            return
        self.model.optimizer.learning_rate.assign(self.initial_lr * self.multiplier(epoch))

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        self._set(float(epoch))

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.steps_per_epoch:
            self._set(self._epoch + batch / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.verbose and epoch + 1 == self.warmup_epochs:
            print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{self.initial_lr}.")
