"""Keras-style callbacks: the :class:`Callback` base and :class:`History`.

A training loop (``Sequential.fit``, ``evaluate``, ``predict``) calls the hooks of a
:class:`~hpcdist.callbacks.callback_list.CallbackList`, which forwards each call, in order,
to every callback it holds. Hook
names and arguments follow ``tf.keras.callbacks.Callback``: ``epoch`` and ``batch`` are
0-based, ``logs`` is a dict of Python floats.

Under a multi-worker strategy every worker runs the same callbacks with the same logs, so
every worker takes the same decisions (stop training, best value); only the *chief*
(:func:`is_chief`) prints and writes files.

Example:
    >>> history = History()
    >>> history.on_train_begin()
    >>> history.on_epoch_end(0, {"loss": 0.5})
    >>> history.on_epoch_end(1, {"loss": 0.25})
    >>> history.history, history.epoch
    ({'loss': [0.5, 0.25]}, [0, 1])
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

log = logging.getLogger("hpcdist.callbacks")

Logs = dict[str, Any]


def is_chief(model: Any) -> bool:
    """Whether this worker prints and writes files for ``model`` (the chief worker).

    ``model.distribute_strategy.extended.should_checkpoint`` when the model has a strategy,
    else ``True`` (a model without strategy, or no model at all).

    Example:
        >>> class Plain:
        ...     distribute_strategy = None
        >>> is_chief(Plain()), is_chief(None)
        (True, True)
    """
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        return True
    return bool(strategy.extended.should_checkpoint)


def monitor_op_for(monitor: str, mode: str, owner: str) -> str:
    """``"max"`` or ``"min"``: the direction in which ``monitor`` improves.

    ``mode="auto"`` picks ``"max"`` for names ending in ``acc``, ``accuracy`` or ``auc``
    (``val_accuracy`` too) and ``"min"`` otherwise, as Keras does.

    Example:
        >>> monitor_op_for("val_accuracy", "auto", "EarlyStopping")
        'max'
        >>> monitor_op_for("val_loss", "auto", "EarlyStopping")
        'min'
    """
    if mode not in ("auto", "min", "max"):
        raise ValueError(
            f"{owner}(mode={mode!r}) is not a known mode; expected 'auto', 'min' or 'max'. "
            "Use 'min' for losses, 'max' for accuracies, or 'auto' to infer it from the name."
        )
    if mode != "auto":
        return mode
    if monitor.endswith(("acc", "accuracy", "auc")):
        return "max"
    return "min"


class Callback:
    """Base class of callbacks: every hook is a no-op; override the ones you need.

    ``model`` and ``params`` are set by the training loop through :meth:`set_model` and
    :meth:`set_params` (``params`` holds ``verbose``, ``epochs`` and ``steps``).

    Example:
        >>> class Count(Callback):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.batches = 0
        ...     def on_train_batch_end(self, batch, logs=None):
        ...         self.batches += 1
        >>> c = Count()
        >>> for b in range(3):
        ...     c.on_train_batch_end(b, {"loss": 1.0})
        >>> c.batches
        3
    """

    model: Any = None
    params: Mapping[str, Any] = MappingProxyType({})

    def __init__(self) -> None:
        self.model = None
        self.params = {}

    def set_params(self, params: Mapping[str, Any]) -> None:
        """Store the loop's parameters (``verbose``, ``epochs``, ``steps``)."""
        self.params = params

    def set_model(self, model: Any) -> None:
        """Store the model being trained, evaluated or used for prediction."""
        self.model = model

    # Epoch hooks (fit only).
    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Called at the start of epoch ``epoch`` (0-based) of ``fit``."""

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Called at the end of an epoch; ``logs`` has the epoch's loss, metrics, ``val_*``."""

    # Batch hooks.
    def on_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Backwards-compatible alias hook, called by :meth:`on_train_batch_begin`."""

    def on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Backwards-compatible alias hook, called by :meth:`on_train_batch_end`."""

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Called before training step ``batch`` (0-based within the epoch)."""
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Called after a training step; ``logs`` has the running loss and metrics."""
        self.on_batch_end(batch, logs=logs)

    def on_test_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Called before evaluation step ``batch``."""

    def on_test_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Called after an evaluation step."""

    def on_predict_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Called before prediction step ``batch``."""

    def on_predict_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Called after a prediction step."""

    # Begin/end hooks.
    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Called at the start of ``fit``."""

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Called at the end of ``fit``."""

    def on_test_begin(self, logs: Logs | None = None) -> None:
        """Called at the start of ``evaluate`` (and of validation inside ``fit``)."""

    def on_test_end(self, logs: Logs | None = None) -> None:
        """Called at the end of ``evaluate``; ``logs`` has the final results."""

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        """Called at the start of ``predict``."""

    def on_predict_end(self, logs: Logs | None = None) -> None:
        """Called at the end of ``predict``."""


class History(Callback):
    """Records the logs of every epoch: ``history`` (dict of lists) and ``epoch`` (list).

    ``fit`` adds one automatically and returns it; it is also ``model.history``.

    Example:
        >>> h = History()
        >>> h.on_train_begin()
        >>> h.on_epoch_end(0, {"loss": 1.0, "val_loss": 2.0})
        >>> h.history
        {'loss': [1.0], 'val_loss': [2.0]}
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[Any]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Start a new list of epochs (as Keras, ``history`` itself is kept)."""
        self.epoch = []

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Append ``epoch`` and each value of ``logs``; set ``model.history`` to ``self``."""
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)
        if self.model is not None:
            self.model.history = self
