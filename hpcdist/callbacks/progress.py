"""Progress display of ``fit``, ``evaluate`` and ``predict`` (the role of Keras's ProgbarLogger).

On the chief only. ``verbose=1`` on a terminal (plain ``python`` with tqdm installed): a live
tqdm bar per epoch with the running loss and metrics in its postfix (4 significant digits),
replaced at the end of the epoch by one summary line. ``verbose=1`` anywhere else (under
``mpirun``/``srun``, whose output forwarding swallows a bar's carriage returns, or with the
output redirected to a file, or without tqdm): plain *progress lines* during the epoch, never
a ``\r``, then the summary line. ``verbose=2``: only the summary line; ``verbose=0``: nothing.

A progress line comes when the epoch crosses a tenth of its steps and at least
``min_interval_s`` (5 s) passed since the last line, or when ``max_interval_s`` (30 s)
passed, so a short epoch prints its summary line only and a long one about ten lines::

    Epoch 3/5 - step 120/500 (24%) - 12.3 steps/s - ETA 31s - loss: 0.1234 - accuracy: 0.9700

The summary line reads::

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
from hpcdist.cluster.launchers import find_launcher

FRACTION = 0.1  # a progress line at each tenth of an epoch's steps ...
MIN_INTERVAL_S = 5.0  # ... but not sooner than this after the last line ...
MAX_INTERVAL_S = 30.0  # ... and at least this often


def live_display(stream: Any, environ: Any = None) -> bool:
    """Whether a live bar suits ``stream``: a terminal, in a process no MPI launcher started.

    Launchers (``mpirun``, ``srun``, ...) forward each rank's output through a pipe or
    their own pseudo-terminal, line by line, so a bar's ``\r`` updates never show.
    Example: ``live_display(io.StringIO())`` is ``False``.
    """
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False

    try:
        return find_launcher(environ) is None
    except Exception:  # a malformed launcher variable: launched, whatever it is
        return False


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


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
        from tqdm import tqdm  # lazy: optional progress-bar dependency
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
        live: ``None`` (default) shows a live bar only where :func:`live_display` says so;
            ``True`` always (where tqdm is), ``False`` never (progress lines instead).
        min_interval_s, max_interval_s: the spacing of progress lines (see the module).

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
        self,
        verbose: int | None = None,
        stream: TextIO | None = None,
        use_tqdm: bool | None = None,
        live: bool | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
        max_interval_s: float = MAX_INTERVAL_S,
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
        self._live = live
        self._min_interval = float(min_interval_s)
        self._max_interval = float(max_interval_s)
        self._lines = False  # progress lines in this phase
        self._desc = ""
        self._last_line = 0.0
        self._last_tenth = 0

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
        self._desc, self._last_line, self._last_tenth = desc, self._t0, 0
        self._lines = self._show and self.verbose == 1
        if not (self._lines and self._use_tqdm is not False):
            return
        live = self._live if self._live is not None else live_display(self.stream)
        tqdm = _import_tqdm() if live else None
        if tqdm is None:
            return
        self._lines = False
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
            if self._lines:
                self._maybe_line(logs if postfix else None)
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

    def _maybe_line(self, logs: Logs | None, now: float | None = None) -> None:
        """Print a progress line if a tenth of the steps and the spacing say so."""
        now = time.perf_counter() if now is None else now
        since = now - self._last_line
        total = self.params.get("steps")
        tenth = int(self._seen * 10 // total) if total else 0
        due = since >= self._max_interval or (
            tenth > self._last_tenth and since >= self._min_interval
        )
        if not due or (total and self._seen >= total):  # the summary line comes next
            return
        self._last_line, self._last_tenth = now, tenth
        elapsed = max(now - self._t0, 1e-9)
        rate = self._seen / elapsed
        parts = [self._desc]
        if total:
            parts.append(f"step {self._seen}/{total} ({100 * self._seen // total}%)")
        else:
            parts.append(f"step {self._seen}")
        parts.append(f"{rate:.3g} steps/s")
        if total:
            parts.append(f"ETA {_duration((total - self._seen) / rate)}")
        text = format_logs(logs)
        if text:
            parts.append(text)
        stream = self.stream
        stream.write(" - ".join(parts) + "\n")
        stream.flush()

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
