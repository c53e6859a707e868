"""The flight recorder: this process's last collectives, always on, dumped when things go wrong.

Every collective the engine runs is recorded in a ring of ``N`` entries
(``HPCDIST_FLIGHT_RECORDS``, default 256): the communicator (the engine's
creation index in this process and its size), the collective's sequence
number on it (the ``#N`` of timeout and mismatch errors), its description
(operation, op, dtypes and shapes), its bytes, the algorithm that ran it and
its start and end times (an entry without an end never completed). Recording
is two tuple writes per call, well under a microsecond
(``benchmarks/flight_recorder.py``).

The records are written to ``HPCDIST_FLIGHT_DIR`` (default
``<tmpdir>/hpcdist-flight``), one JSON file per rank named
``<job>-rank<R>.json``, when:

* a collective raises :class:`~hpcdist.errors.CollectiveTimeoutError` or
  :class:`~hpcdist.errors.CollectiveMismatchError` (the error message ends
  with ``[flight recorder: PATH]``);
* an uncaught exception aborts the job (:mod:`hpcdist.runtime.abort`);
* the process receives ``SIGUSR1`` (it writes and goes on) or ``SIGTERM``
  (it writes, then ends as it would have), when no handler was installed
  before hpcdist's world started.

``hpcdist timeline report DIR`` reads the dumps of all ranks and shows the
first collective where they diverge and which rank did not arrive
(:func:`hpcdist.observe.analysis.divergence`).

Example:
    >>> rec = FlightRecorder(4)
    >>> rec.begin("0/2", 1, "allreduce(op=SUM, [float32(4,)])", "small")
    >>> rec.end()
    >>> [(r["seq"], r["operation"], r["done"]) for r in rec.records()]
    [(1, 'allreduce', True)]
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hpcdist.errors import CollectiveMismatchError, CollectiveTimeoutError
from hpcdist.observe import timeline
from hpcdist.observe.timeline import describe

SIZE_VAR = "HPCDIST_FLIGHT_RECORDS"
DIR_VAR = "HPCDIST_FLIGHT_DIR"
DEFAULT_SIZE = 256
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_JOB_VARS = ("SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PBS_JOBID")

F = TypeVar("F", bound=Callable[..., Any])
_clock = time.perf_counter


def flight_dir(environ: dict[str, str] | None = None) -> str:
    """Where dumps go: ``HPCDIST_FLIGHT_DIR``, else ``<tmpdir>/hpcdist-flight``.

    Example: ``flight_dir({"HPCDIST_FLIGHT_DIR": "/scratch/f"}) == "/scratch/f"``.
    """
    env = os.environ if environ is None else environ
    return env.get(DIR_VAR) or os.path.join(tempfile.gettempdir(), "hpcdist-flight")


def job_id(environ: dict[str, str] | None = None) -> str:
    """A name of this job shared by its ranks (scheduler or launcher job id), safe in a file name.

    Example: ``job_id({"SLURM_JOB_ID": "42"}) == "42"``.
    """
    env = os.environ if environ is None else environ
    for var in _JOB_VARS:
        if env.get(var):
            value = env[var]
            if var == "SLURM_JOB_ID" and env.get("SLURM_STEP_ID"):
                value += "." + env["SLURM_STEP_ID"]
            return re.sub(r"[^A-Za-z0-9_.-]+", "_", value)
    return f"pid{os.getpid()}"


def _capacity() -> int:
    try:
        return max(1, int(os.environ.get(SIZE_VAR) or DEFAULT_SIZE))
    except ValueError:
        return DEFAULT_SIZE


class _OpenRecord(threading.local):
    record: list[Any] | None = None


class FlightRecorder:
    """A ring of the last ``capacity`` collective records of this process.

    :meth:`begin` opens a record (the engine calls it when a collective is
    counted), :meth:`end` closes the open one (when the call returns). When
    the timeline is on, :meth:`end` also writes the collective to it.
    Example: ``rec = FlightRecorder(8); rec.begin("0/2", 1, "barrier()", 0, None); rec.end()``.
    """

    __slots__ = ("capacity", "on", "rank", "size", "last_dump", "_slots", "_next", "_here")

    def __init__(self, capacity: int = DEFAULT_SIZE) -> None:
        self.capacity = int(capacity)
        self.on = True
        self.rank: int | None = None
        self.size: int | None = None
        self.last_dump: str | None = None  # the path of the last dump this process wrote
        # Each record: [comm, seq, what, bytes, algorithm, start, end (0.0: open)].
        self._slots: list[list[Any] | None] = [None] * self.capacity
        self._next = 0
        #: Per thread, the record its running collective has open: engines over different
        #: communicators may run collectives at the same time from different threads
        #: (hpcdist.horovod's runners: the script's calls and an optimizer's buckets).
        self._here = _OpenRecord()

    def begin(self, comm: str, seq: int, call: Any, algorithm: str | None) -> None:
        """Open the record of collective ``seq`` on communicator ``comm``.

        ``call`` describes it: a string, or the engine's layout of the call
        (its ``text``, and ``nbytes`` or ``total``; read only when the records
        are), so that recording costs no attribute lookups.
        Example: ``rec.begin("0/4", 7, "allreduce(op=SUM, [float32(4,)])", "shm")``.
        """
        i = self._next
        self._slots[i] = self._here.record = [comm, seq, call, algorithm, _clock(), 0.0]
        self._next = (i + 1) % self.capacity

    def end(self) -> None:
        """Close the open record (the collective completed). Example: ``rec.end()``."""
        here = self._here
        record = here.record
        if record is not None:
            record[5] = _clock()
            here.record = None
            if timeline.active:
                timeline.collective(record)

    def records(self) -> list[dict[str, Any]]:
        """The records, oldest first, as dictionaries. Example: ``rec.records()[-1]["seq"]``."""
        out = []
        for k in range(self.capacity):
            entry = self._slots[(self._next + k) % self.capacity]
            if entry is None:
                continue
            comm, seq, call, algorithm, t0, t1 = entry
            what, nbytes = describe(call)
            out.append({
                "comm": comm, "seq": seq, "operation": what.split("(", 1)[0], "what": what,
                "bytes": nbytes, "algorithm": algorithm, "start": t0,
                "end": t1 if t1 else None, "done": bool(t1),
            })
        return out

    def dump(self, reason: str, directory: str | None = None) -> str:
        """Write the records to ``<dir>/<job>-rank<R>.json``; returns the path.

        Example: ``rec.dump("SIGUSR1")``.
        """
        directory = directory or flight_dir()
        rank = self.rank if self.rank is not None else _rank_from_env()
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{job_id()}-rank{rank:05d}.json")
        data = {
            "hpcdist_flight_recorder": 1, "reason": reason, "rank": rank, "size": self.size,
            "job": job_id(), "host": socket.gethostname(), "pid": os.getpid(),
            "time": time.time(), "wall_minus_perf": time.time() - time.perf_counter(),
            "capacity": self.capacity, "records": self.records(),
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        self.last_dump = path
        return path

    def failed(self, err: BaseException) -> None:
        """Dump for a collective's error ``err`` and add the path to its message (once).

        Example: ``except CollectiveTimeoutError as e: rec.failed(e); raise``.
        """
        if getattr(err, "flight_record", None):
            return
        try:
            path = self.dump(f"{type(err).__name__}: {str(err).splitlines()[0][:2000]}")
        except OSError as exc:
            path = f"(not written: {exc})"
        err.flight_record = path  # type: ignore[attr-defined]
        if err.args and isinstance(err.args[0], str):
            err.args = (f"{err.args[0]} [flight recorder: {path}]", *err.args[1:])


def _rank_from_env() -> int:
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 0


#: The process's recorder (the engine records into it).
RECORDER = FlightRecorder(_capacity())


def recorded(method: F) -> F:
    """Decorate an engine operation: close its record when it returns, dump on its errors.

    Example: ``allreduce = recorded(allreduce)`` in the engine's class body.
    """

    recorder = RECORDER

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            out = method(*args, **kwargs)
        except (CollectiveTimeoutError, CollectiveMismatchError) as err:
            recorder.failed(err)
            raise
        here = recorder._here  # (what end() does, inline: this runs on every collective)
        record = here.record
        if record is not None:
            record[5] = _clock()
            here.record = None
            if timeline.active:
                timeline.collective(record)
        return out

    return call  # type: ignore[return-value]


def dump_now(reason: str) -> str | None:
    """Dump the process's records if it has any; returns the path (``None``: nothing, or failed).

    Example: ``dump_now("abort")`` before ``MPI_Abort``.
    """
    if not any(RECORDER._slots):
        return None
    if reason == "abort" and RECORDER.last_dump is not None:
        return RECORDER.last_dump  # the error's own dump (with its reason) says it all
    try:
        return RECORDER.dump(reason)
    except OSError:
        return None


_engines = 0


def engine_key(size: int) -> str:
    """The name of a new engine's communicator in the records: ``"<index>/<size>"``.

    ``index`` counts the engines this process made; every rank makes its
    engines in the same order, so a key names the same communicator on every
    rank. Example: ``engine_key(4)`` is ``"0/4"`` for the first engine.
    """
    global _engines
    key = f"{_engines}/{size}"
    _engines += 1
    return key


_installed = False


def configure(rank: int, size: int) -> None:
    """Name this process's rank and install the ``SIGUSR1``/``SIGTERM`` dump handlers.

    Called once by :func:`hpcdist.runtime.world`. A signal that already has a
    handler keeps it. Example: ``configure(world.rank, world.size)``.
    """
    global _installed
    RECORDER.rank, RECORDER.size = int(rank), int(size)
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None and signal.getsignal(usr1) == signal.SIG_DFL:
        signal.signal(usr1, _on_usr1)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_term)


def _on_usr1(signum: int, frame: Any) -> None:
    dump_now("SIGUSR1")


def _on_term(signum: int, frame: Any) -> None:
    dump_now("SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
