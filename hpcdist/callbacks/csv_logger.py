"""Stream the results of every epoch to a CSV file (Keras's ``CSVLogger``).

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
    >>> logger = CSVLogger(path)
    >>> logger.on_train_begin()
    >>> logger.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.75})
    >>> logger.on_train_end()
    >>> print(open(path).read(), end="")
    epoch,accuracy,loss
    0,0.75,0.5
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from typing import IO, Any

import numpy as np

from hpcdist.callbacks.base import Callback, Logs, is_chief


def _cell(value: Any) -> Any:
    """A CSV cell: strings and numbers as they are, sequences as ``"[a, b]"``."""
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, Iterable):
        return f"[{', '.join(map(str, value))}]"
    return value


class CSVLogger(Callback):
    """Write one CSV row per epoch: ``epoch`` (0-based, as Keras) then the logged values.

    The columns after ``epoch`` are the keys of the first epoch's logs, sorted (as Keras);
    a key missing in a later epoch is written as ``NA``, new keys are ignored. With
    ``append=True`` rows are added to an existing file and the header is written only when
    the file is new or empty (continue a run); otherwise the file is overwritten. The file is
    flushed after every epoch. Only the chief writes.

    Args:
        filename: path of the CSV file.
        separator: the column separator.
        append: add to an existing file instead of overwriting it.

    Example:
        >>> logger = CSVLogger("training.csv", separator=";", append=True)
        >>> logger.sep, logger.append
        (';', True)
    """

    def __init__(
        self, filename: str | os.PathLike[str], separator: str = ",", append: bool = False
    ) -> None:
        super().__init__()
        if not isinstance(separator, str) or len(separator) != 1:
            raise ValueError(
                f"CSVLogger(separator={separator!r}): expected a one-character string such as "
                "',' or ';'."
            )
        self.filename = os.fspath(filename)
        self.sep = separator
        self.append = append
        self.keys: list[str] | None = None
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._write_header = True

    def _open(self) -> None:
        if self.append:
            mode = "a"
            self._write_header = True
            if os.path.exists(self.filename):
                with open(self.filename, encoding="utf-8") as f:
                    self._write_header = not f.readline()
        else:
            mode = "w"
            self._write_header = True
        dirname = os.path.dirname(self.filename)
        if dirname:
            os.makedirs(dirname, exist_ok=True)
        self._file = open(self.filename, mode, newline="", encoding="utf-8")
        self._writer = None

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Open (chief) the file: truncate it, or append to it with ``append=True``."""
        self._close()
        if is_chief(self.model):
            self._open()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Write the row of ``epoch`` (and the header first, when due) and flush."""
        if not is_chief(self.model):
            return
        logs = logs or {}
        if self._file is None:
            self._open()
        file = self._file
        assert file is not None  # opened above
        if self.keys is None:
            self.keys = sorted(logs)
        if self._writer is None:
            self._writer = csv.writer(file, delimiter=self.sep, lineterminator="\n")
            if self._write_header:
                self._writer.writerow(["epoch", *self.keys])
        row = [epoch] + [_cell(logs[k]) if k in logs else "NA" for k in self.keys]
        self._writer.writerow(row)
        file.flush()

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Close the file."""
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None
