"""Progress display of ``fit``, ``evaluate`` and ``predict`` (the role of Keras's ProgbarLogger).

On the chief only. ``verbose=1``: a tqdm bar per epoch with the running loss and metrics in its
postfix (4 significant digits), replaced at the end of the epoch by one summary line;
``verbose=2``: only the summary line; ``verbose=0``: nothing. Without tqdm, ``verbose=1``
prints the summary lines too. The summary line reads::

    Epoch 3/5 - 12 steps - 0.4s - loss: 0.1234 - accuracy: 0.9700 - val_loss: 0.2000

(values as Keras prints them: 4 decimals, or 4-digit scientific notation for ``|v| <= 1e-3``).

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> bar = ProgressBar(verbose=2, stream=out)
    >>> bar.set_params({"epochs": 5, "steps": 12})
    >>> bar.on_train_begin()
    >>> bar.on_epoch_begin(2)
    >>> bar.on_train_batch_end(11, {"loss": 0.2})
    >>> bar.on_epoch_end(2, {"loss": 0.1234, "accuracy": 0.97})
    >>> import re
    >>> print(re.sub(r" [0-9.]+s ", " <time> ", out.getvalue()), end="")
    Epoch 3/5 - 12 steps - <time> - loss: 0.1234 - accuracy: 0.9700
"""

from __future__ import annotations

import numbers
import sys
import time
from typing import Any, TextIO

from hpcdist.callbacks.base import Callback, Logs, is_chief


def _scalar(value: Any) -> float | None:
    """``value`` as a float when it is a number (Python, NumPy scalar, 0-d array), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and getattr(value, "size", 0) == 1:
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return None


def format_value(value: float) -> str:
    """Keras's number format of the summary line: ``%.4f``, or ``%.4e`` when ``|v| <= 1e-3``.

    Example:
        >>> format_value(0.97), format_value(1.5e-5)
        ('0.9700', '1.5000e-05')
    """
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"


def format_logs(
    logs: Logs | None, sep: str = " - ", kv: str = ": ", fmt: Any = format_value
) -> str:
    """The numeric entries of ``logs`` as ``"key: value"`` joined by ``sep``, in log order.

    Example:
        >>> format_logs({"loss": 0.5, "outputs": [1, 2], "acc": 1.0})
        'loss: 0.5000 - acc: 1.0000'
    """
    parts = []
    for key, value in (logs or {}).items():
        v = _scalar(value)
        if v is not None:
            parts.append(f"{key}{kv}{fmt(v)}")
    return sep.join(parts)


def _format_postfix(logs: Logs | None) -> str:
    return format_logs(logs, sep=", ", kv="=", fmt=lambda v: f"{v:.4g}")


def _import_tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class ProgressBar(Callback):
    """Shows progress on the chief: a tqdm bar (``verbose=1``) and one line per epoch.

    Args:
        verbose: 0 silent, 1 bar and epoch lines, 2 epoch lines only. ``None`` (default) takes
            ``params["verbose"]`` from the training loop (1 when absent).
        stream: where to write; ``None`` means ``sys.stdout`` at the time of writing.
        use_tqdm: ``None`` uses tqdm when it can be imported; ``False`` never uses it.

    The bar's total is ``params["steps"]`` (no total when it is ``None``). Inside ``fit`` the
    validation run (``on_test_*`` hooks) shows nothing; ``evaluate`` and ``predict`` called on
    their own show an ``Evaluate`` / ``Predict`` bar and line. Non-chief workers show nothing.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = ProgressBar(verbose=0, stream=out)
        >>> bar.on_epoch_begin(0); bar.on_epoch_end(0, {"loss": 1.0})
        >>> out.getvalue()
        ''
    """

    def __init__(
        self, verbose: int | None = None, stream: TextIO | None = None, use_tqdm: bool | None = None
    ) -> None:
        super().__init__()
        if verbose is not None and verbose not in (0, 1, 2):
            raise ValueError(
                f"ProgressBar(verbose={verbose!r}): expected 0 (silent), 1 (bar) or 2 (one line "
                "per epoch), or None to follow the training loop's verbose."
            )
        self._verbose = verbose
        self._stream = stream
        self._use_tqdm = use_tqdm
        self._bar: Any = None
        self._seen = 0
        self._t0 = 0.0
        self._in_fit = False
        self._show = False

    @property
    def verbose(self) -> int:
        """The effective verbosity: the constructor's, else ``params["verbose"]``, else 1."""
        if self._verbose is not None:
            return self._verbose
        return int(self.params.get("verbose", 1))

    @property
    def stream(self) -> TextIO:
        """The output stream (``sys.stdout`` unless one was given)."""
        return self._stream if self._stream is not None else sys.stdout

    # -- the three phases ------------------------------------------------------------
    def _start(self, desc: str) -> None:
        self._close_bar()
        self._seen = 0
        self._t0 = time.perf_counter()
        self._show = self.verbose > 0 and is_chief(self.model)
        if not (self._show and self.verbose == 1 and self._use_tqdm is not False):
            return
        tqdm = _import_tqdm()
        if tqdm is None:
            return
        self._bar = tqdm(
            total=self.params.get("steps"),
            desc=desc,
            file=self.stream,
            leave=False,
            unit="step",
            mininterval=0.1,
        )

    def _update(self, batch: int, logs: Logs | None, postfix: bool = True) -> None:
        self._seen = batch + 1
        bar = self._bar
        if bar is None:
            return
        if postfix:
            text = _format_postfix(logs)
            if text:
                bar.set_postfix_str(text, refresh=False)
        step = self._seen - bar.n
        if step > 0:
            bar.update(step)
        else:
            bar.refresh()

    def _finish(self, desc: str, logs: Logs | None) -> None:
        self._close_bar()
        if not self._show:
            return
        self._show = False
        elapsed = time.perf_counter() - self._t0
        unit = "step" if self._seen == 1 else "steps"
        parts = [desc, f"{self._seen} {unit}", f"{elapsed:.1f}s"]
        text = format_logs(logs)
        if text:
            parts.append(text)
        stream = self.stream
        stream.write(" - ".join(parts) + "\n")
        stream.flush()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _epoch_desc(self, epoch: int) -> str:
        epochs = self.params.get("epochs")
        return f"Epoch {epoch + 1}/{epochs}" if epochs is not None else f"Epoch {epoch + 1}"

    # -- fit -------------------------------------------------------------------------
    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Enter ``fit``: validation runs inside it stay silent."""
        self._in_fit = True

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Open the epoch's bar (``verbose=1``, chief) and start its clock."""
        self._start(self._epoch_desc(epoch))

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Advance the bar to ``batch + 1`` steps and show the running loss and metrics."""
        self._update(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Close the bar and print the epoch's summary line (chief, ``verbose >= 1``)."""
        self._finish(self._epoch_desc(epoch), logs)

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Leave ``fit`` (closing any bar left open)."""
        self._close_bar()
        self._in_fit = False

    # -- evaluate / predict called on their own ----------------------------------------
    def on_test_begin(self, logs: Logs | None = None) -> None:
        """Open an ``Evaluate`` bar unless this is the validation run of ``fit``."""
        if not self._in_fit:
            self._start("Evaluate")

    def on_test_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Advance the ``Evaluate`` bar."""
        if not self._in_fit:
            self._update(batch, logs)

    def on_test_end(self, logs: Logs | None = None) -> None:
        """Print the ``Evaluate`` line with the final results."""
        if not self._in_fit:
            self._finish("Evaluate", logs)

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        """Open a ``Predict`` bar."""
        self._start("Predict")

    def on_predict_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        """Advance the ``Predict`` bar (the batch outputs are not shown)."""
        self._update(batch, logs, postfix=False)

    def on_predict_end(self, logs: Logs | None = None) -> None:
        """Print the ``Predict`` line."""
        self._finish("Predict", None)
