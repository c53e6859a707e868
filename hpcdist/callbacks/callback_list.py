"""``CallbackList``: calls each hook on every callback it holds, in order (as Keras's).

It sits above the callbacks it may add by default (:class:`~hpcdist.callbacks.base.History`
and :class:`~hpcdist.callbacks.progress.ProgressBar`), so it has a module of its own.

Example:
    >>> history = History()
    >>> callbacks = CallbackList([history])
    >>> callbacks.on_train_begin()
    >>> callbacks.on_epoch_end(0, {"loss": 0.5})
    >>> callbacks.on_epoch_end(1, {"loss": 0.25})
    >>> history.history, history.epoch
    ({'loss': [0.5, 0.25]}, [0, 1])
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpcdist.callbacks.base import Callback, History, Logs
from hpcdist.callbacks.progress import ProgressBar

__all__ = ["CallbackList"]


def _flatten(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, CallbackList):
        return list(callbacks.callbacks)
    if isinstance(callbacks, Iterable) and not isinstance(callbacks, (str, bytes, Mapping)):
        out: list[Any] = []
        for item in callbacks:
            out.extend(_flatten(item))
        return out
    if hasattr(callbacks, "on_epoch_end") and hasattr(callbacks, "set_model"):
        return [callbacks]  # duck-typed callback
    raise TypeError(
        f"callbacks must be Callback instances (or a list of them); found "
        f"{type(callbacks).__name__}. Subclass hpcdist.callbacks.Callback."
    )


class CallbackList:
    """A container that calls each hook on every callback, in order.

    ``add_history=True`` appends a :class:`History` (unless one is given) and
    ``add_progbar=True`` puts a :class:`~hpcdist.callbacks.progress.ProgressBar` first (unless
    one is given), as Keras's ``CallbackList``. The other keyword arguments (``verbose``,
    ``epochs``, ``steps``) become ``params`` and are passed to every callback with
    :meth:`set_params`; ``model`` is passed with :meth:`set_model`. Hooks receive ``{}`` when
    called with ``logs=None``.

    Example:
        >>> class Say(Callback):
        ...     def __init__(self, tag):
        ...         super().__init__()
        ...         self.tag = tag
        ...     def on_epoch_begin(self, epoch, logs=None):
        ...         print(self.tag, epoch, self.params["epochs"])
        >>> cbs = CallbackList([Say("a"), Say("b")], epochs=3)
        >>> cbs.on_epoch_begin(0)
        a 0 3
        b 0 3
    """

    def __init__(
        self,
        callbacks: Any = None,
        add_history: bool = False,
        add_progbar: bool = False,
        model: Any = None,
        **params: Any,
    ) -> None:
        self.callbacks: list[Any] = _flatten(callbacks)
        self.model: Any = None
        self.params: dict[str, Any] = {}
        self._history: History | None = None
        self._progbar: Callback | None = None
        self._add_default_callbacks(add_history, add_progbar)
        if model is not None:
            self.set_model(model)
        if params:
            self.set_params(params)

    def _add_default_callbacks(self, add_history: bool, add_progbar: bool) -> None:
        for cb in self.callbacks:
            if isinstance(cb, ProgressBar):
                self._progbar = cb
            elif isinstance(cb, History):
                self._history = cb
        if self._progbar is None and add_progbar:
            self._progbar = ProgressBar()
            self.callbacks.insert(0, self._progbar)
        if self._history is None and add_history:
            self._history = History()
            self.callbacks.append(self._history)

    def append(self, callback: Any) -> None:
        """Add ``callback`` at the end (it does not get model/params until they are set)."""
        self.callbacks.extend(_flatten(callback))

    def set_params(self, params: Mapping[str, Any]) -> None:
        """Store ``params`` and pass them to every callback."""
        self.params = dict(params)
        for cb in self.callbacks:
            cb.set_params(self.params)

    def set_model(self, model: Any) -> None:
        """Store ``model``, pass it to every callback and set ``model.history``."""
        self.model = model
        if self._history is not None:
            model.history = self._history
        for cb in self.callbacks:
            cb.set_model(model)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def _call(self, hook: str, *args: Any, logs: Logs | None) -> None:
        logs = {} if logs is None else logs
        for cb in self.callbacks:
            getattr(cb, hook)(*args, logs)  # positional, as Keras: any parameter name works

    # Epoch hooks.
    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Call ``on_epoch_begin(epoch, logs)`` on every callback."""
        self._call("on_epoch_begin", epoch, logs=logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Call ``on_epoch_end(epoch, logs)`` on every callback."""
        self._call("on_epoch_end", epoch, logs=logs)

    # Batch hooks.
    def on_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Alias of :meth:`on_train_batch_begin`."""
        self.on_train_batch_begin(batch, logs=logs)

    def on_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Alias of :meth:`on_train_batch_end`."""
        self.on_train_batch_end(batch, logs=logs)

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_train_batch_begin(batch, logs)`` on every callback."""
        self._call("on_train_batch_begin", batch, logs=logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_train_batch_end(batch, logs)`` on every callback."""
        self._call("on_train_batch_end", batch, logs=logs)

    def on_test_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_test_batch_begin(batch, logs)`` on every callback."""
        self._call("on_test_batch_begin", batch, logs=logs)

    def on_test_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_test_batch_end(batch, logs)`` on every callback."""
        self._call("on_test_batch_end", batch, logs=logs)

    def on_predict_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_predict_batch_begin(batch, logs)`` on every callback."""
        self._call("on_predict_batch_begin", batch, logs=logs)

    def on_predict_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Call ``on_predict_batch_end(batch, logs)`` on every callback."""
        self._call("on_predict_batch_end", batch, logs=logs)

    # Begin/end hooks.
    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Call ``on_train_begin(logs)`` on every callback."""
        self._call("on_train_begin", logs=logs)

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Call ``on_train_end(logs)`` on every callback."""
        self._call("on_train_end", logs=logs)

    def on_test_begin(self, logs: Logs | None = None) -> None:
        """Call ``on_test_begin(logs)`` on every callback."""
        self._call("on_test_begin", logs=logs)

    def on_test_end(self, logs: Logs | None = None) -> None:
        """Call ``on_test_end(logs)`` on every callback."""
        self._call("on_test_end", logs=logs)

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        """Call ``on_predict_begin(logs)`` on every callback."""
        self._call("on_predict_begin", logs=logs)

    def on_predict_end(self, logs: Logs | None = None) -> None:
        """Call ``on_predict_end(logs)`` on every callback."""
        self._call("on_predict_end", logs=logs)
