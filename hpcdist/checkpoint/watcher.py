"""The preemption notice of one worker, and the per-step agreement of all workers on it.

Shared by :class:`~hpcdist.checkpoint.preemption.PreemptionCheckpointHandler`
and :class:`~hpcdist.callbacks.BackupAndRestore`. A notice is a signal of
:data:`PREEMPTION_SIGNALS` (or a ``termination_watcher_fn`` returning ``True``);
the signal handler only counts it. Before each step every worker calls
:meth:`PreemptionWatcher.agree`: one ``Allreduce`` (MAX) of one int64 on a
communicator of the watcher's own, so it never mixes with the collectives
engine's messages and checks.

Example:
    >>> import signal
    >>> signal.SIGUSR1 in PREEMPTION_SIGNALS
    True
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.checkpoint.sync import workers_communicator
from hpcdist.runtime import mpi

__all__ = ["PREEMPTION_SIGNALS", "PreemptionWatcher"]

log = logging.getLogger("hpcdist.checkpoint")

#: The signals that announce a preemption: SLURM sends ``SIGTERM`` (and ``SIGUSR1`` with
#: ``sbatch --signal=USR1@<seconds>``); ``mpirun`` forwards ``SIGUSR1`` to every rank.
PREEMPTION_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionWatcher:
    """The signal (or watcher-function) flag and the per-step agreement, shared by the handler
    and ``BackupAndRestore``.

    It gets a communicator of its own for the strategy's workers (a ``Dup``;
    the clients' group under ParameterServer; none for one worker), so every
    worker must create it at the same point; :meth:`close` frees it (collective
    too) and puts the previous signal handlers back. Signal handlers can only be installed
    from the main thread: elsewhere use a ``termination_watcher_fn``.

    Example:
        >>> import os
        >>> w = PreemptionWatcher(None)
        >>> w.start(); os.kill(os.getpid(), signal.SIGUSR1)
        >>> w.local_value(), w.agree(w.local_value())
        (1, 1)
        >>> w.close()
    """

    def __init__(
        self,
        strategy: Any,
        termination_watcher_fn: Callable[[], bool] | None = None,
        signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS,
        poll_interval: float = 1.0,
    ) -> None:
        self._comm = None if strategy is None else workers_communicator(strategy)
        self._watcher_fn = termination_watcher_fn
        self._signals = tuple(signals)
        self._poll_interval = float(poll_interval)
        self._received = 0  # notices received (signals or watcher_fn True)
        self._handled = 0  # notices already acted upon
        self.first_notice: float | None = None  # time.monotonic() of the first unhandled one
        self.last_signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._stop_poll: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._buf = np.zeros(2, dtype=np.int64)
        self._send, self._recv = self._buf[:1], self._buf[1:]
        self._max: Any = None
        if self._comm is not None:
            self._max = mpi().MAX

    # -- notices
    def _notice(self, signum: int | None = None) -> None:
        self._received += 1
        if self.first_notice is None:
            self.first_notice = time.monotonic()
        if signum is not None:
            self.last_signal = signum

    def _handler(self, signum: int, frame: Any) -> None:
        self._notice(signum)  # only a flag: no I/O and no MPI inside a signal handler

    def _poll(self) -> None:
        stop = self._stop_poll
        assert stop is not None
        while not stop.is_set():
            try:
                noticed = bool(self._watcher_fn())  # type: ignore[misc]  # set: polled only then
            except Exception as error:  # a flaky watcher must not kill training
                log.warning("termination_watcher_fn raised %r; still watching", error)
                noticed = False
            if noticed:
                self._notice()
                return
            stop.wait(self._poll_interval)

    @property
    def watching(self) -> bool:
        """Whether signal handlers or the watcher thread are active."""
        return bool(self._previous) or self._thread is not None

    def start(self) -> None:
        """Install the signal handlers (or start polling ``termination_watcher_fn``)."""
        if self.watching:
            return
        if self._watcher_fn is not None:
            self._stop_poll = threading.Event()
            self._thread = threading.Thread(
                target=self._poll, name="hpcdist-termination-watcher", daemon=True
            )
            self._thread.start()
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "preemption signal handlers can only be installed from the main thread; "
                "create the handler there, or pass TerminationConfig(termination_watcher_fn=...)"
            )
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handler)

    def stop(self) -> None:
        """Put the previous signal handlers back and stop the watcher thread."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if self._thread is not None and self._stop_poll is not None:
            self._stop_poll.set()
            self._thread.join(timeout=5.0)
        self._thread = None
        self._stop_poll = None

    # -- agreement
    def local_value(self) -> int:
        """``1`` when this worker has an unhandled notice, else ``0``."""
        return 1 if self._received > self._handled else 0

    def agree(self, value: int) -> int:
        """The MAX of ``value`` over the workers (one tiny ``Allreduce``; none for one worker)."""
        if self._comm is None:
            return int(value)
        self._buf[0] = value
        self._comm.Allreduce(self._send, self._recv, op=self._max)
        return int(self._recv[0])

    def mark_handled(self, received: int) -> None:
        """Forget the notices counted up to ``received`` (later ones stay pending)."""
        self._handled = max(self._handled, received)
        if self._received <= self._handled:
            self.first_notice = None

    @property
    def received(self) -> int:
        """How many notices arrived so far (signals or watcher hits)."""
        return self._received

    def close(self) -> None:
        """Stop watching and free the duplicated communicator (collective)."""
        self.stop()
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def __del__(self) -> None:  # never leave a dead object as the SIGTERM handler
        with contextlib.suppress(Exception):
            if self._previous and threading.current_thread() is threading.main_thread():
                self.stop()
