"""``LambdaCallback`` (hooks from plain functions) and ``TerminateOnNaN`` (Keras's).

Under a strategy every worker runs every callback with the same logs (the
loss and metrics are reduced over all replicas first). ``TerminateOnNaN``
therefore stops every worker at the same batch. A ``LambdaCallback`` runs on
every worker too: print or write only where ``hpcdist.callbacks.is_chief(model)``,
and set ``model.stop_training`` only from the logs, so that every worker stops
together.

Example:
    >>> seen = []
    >>> cb = LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append((epoch, logs["loss"])))
    >>> cb.on_epoch_end(0, {"loss": 0.5})
    >>> cb.on_epoch_begin(1)  # not given: does nothing
    >>> seen
    [(0, 0.5)]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpcdist.callbacks.base import Callback, Logs, is_chief

_HOOKS = (
    "on_epoch_begin", "on_epoch_end", "on_batch_begin", "on_batch_end", "on_train_begin",
    "on_train_end", "on_train_batch_begin", "on_train_batch_end", "on_test_begin",
    "on_test_end", "on_test_batch_begin", "on_test_batch_end", "on_predict_begin",
    "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)  # fmt: skip


class LambdaCallback(Callback):
    """A callback whose hooks are the given functions (``keras.callbacks.LambdaCallback``).

    Epoch hooks are called as ``f(epoch, logs)``, batch hooks as ``f(batch, logs)``,
    begin/end hooks as ``f(logs)``. Any hook of :class:`~hpcdist.callbacks.Callback`
    may be given by name.

    Example: ``LambdaCallback(on_train_end=lambda logs: print("done"))``.
    """

    def __init__(
        self,
        on_epoch_begin: Callable[..., Any] | None = None,
        on_epoch_end: Callable[..., Any] | None = None,
        on_train_begin: Callable[..., Any] | None = None,
        on_train_end: Callable[..., Any] | None = None,
        on_train_batch_begin: Callable[..., Any] | None = None,
        on_train_batch_end: Callable[..., Any] | None = None,
        **kwargs: Callable[..., Any],
    ) -> None:
        super().__init__()
        given = dict(kwargs, on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end,
                     on_train_begin=on_train_begin, on_train_end=on_train_end,
                     on_train_batch_begin=on_train_batch_begin,
                     on_train_batch_end=on_train_batch_end)  # fmt: skip
        for name, fn in given.items():
            if name not in _HOOKS:
                raise TypeError(
                    f"LambdaCallback got {name}=..., which is not a callback hook; expected one "
                    f"of {', '.join(_HOOKS)}"
                )
            if fn is None:
                continue
            if not callable(fn):
                raise TypeError(f"LambdaCallback {name} must be callable, got {fn!r}")
            setattr(self, name, fn)  # replaces the base class's no-op for this instance


class TerminateOnNaN(Callback):
    """Stop training as soon as a batch's loss is NaN or infinite (``keras.callbacks.
    TerminateOnNaN``). The logged loss is the same on every worker, so all stop at once.

    Example: ``model.fit(x, y, callbacks=[TerminateOnNaN()])``.
    """

    def on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Check ``logs["loss"]``; set ``model.stop_training`` when it is not finite."""
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        if not math.isfinite(float(loss)):
            if is_chief(self.model):
                print(f"Batch {batch}: Invalid loss, terminating training")
            self.model.stop_training = True
