"""The runner: Horovod-style collectives of one process set, in order, on one thread.

Every collective of :mod:`hpcdist.horovod` becomes a :class:`Call` on NumPy
arrays, handed to the :class:`Runner` of its process set, which runs calls
one after another on its own thread over a private engine (a duplicate of
the set's communicator), so ``*_async`` calls overlap the caller's work and
every rank runs the same calls in the same order.

Before each call the ranks exchange a 4-number header (one ``Iallgather``):
whether the rank has *joined* (``hvd.join``), a 64-bit digest of the call
(operation, op, root, dtypes, shapes; the first dimension left out where it
may differ), whether the rank found its own arguments invalid, and the
round at which it joined. Then:

* digests that disagree, or a rank with invalid arguments: every rank
  raises :class:`~hpcdist.errors.HorovodMismatchError` naming what each rank
  passed — never a hang, never mixed data;
* some ranks joined: the first rank that has not sends the call's full
  description, and joined ranks take part with zeros (no rows for
  allgather and alltoall);
* every rank joined: ``join`` returns the rank that joined last (the latest
  round; of those, the highest rank).

Every wait sleeps (short naps) rather than spins, and ends with
:class:`~hpcdist.errors.HorovodTimeoutError` after the process default
timeout (``HPCDIST_TIMEOUT_SECONDS``,
:func:`~hpcdist.collectives.options.set_default_timeout`), else after
:data:`DEFAULT_TIMEOUT` seconds: a rank that never makes the call is an
error, not a hang.

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> r = Runner(mpi().COMM_SELF)
    >>> r.submit(Call("allreduce", [np.ones(2)], op="SUM")).wait()[0].tolist()
    [1.0, 1.0]
    >>> r.close()
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.adasum import adasum_allreduce
from hpcdist.collectives.options import get_default_timeout
from hpcdist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    HorovodInternalError,
    HorovodMismatchError,
    HorovodTimeoutError,
    HpcdistError,
)

_ROWS_MAY_DIFFER = ("allgather", "alltoall")
#: Seconds a call waits for the other ranks when no process default timeout is set.
DEFAULT_TIMEOUT = 600.0


class Call:
    """One collective: ``kind`` (allreduce, allgather, broadcast, alltoall, reducescatter,
    barrier), its arrays, ``op`` (SUM, MEAN, MIN, MAX, PRODUCT, ADASUM), ``root``,
    ``splits``, ``tag`` (what the framework layer wants compared too, e.g. its dtype
    names) and ``error`` (this rank's arguments are invalid: why)."""

    __slots__ = ("kind", "arrays", "op", "root", "splits", "tag", "error")

    def __init__(
        self,
        kind: str,
        arrays: Sequence[np.ndarray] = (),
        op: str = "SUM",
        root: int = 0,
        splits: Sequence[int] | None = None,
        tag: str = "",
        error: str = "",
    ) -> None:
        self.kind = kind
        self.arrays = list(arrays)
        self.op = op
        self.root = root
        self.splits = splits
        self.tag = tag
        self.error = error

    def signature(self) -> tuple[Any, ...]:
        """What must agree across ranks."""
        shapes = [
            (a.dtype.str, a.shape[1:] if self.kind in _ROWS_MAY_DIFFER and a.ndim else a.shape)
            for a in self.arrays
        ]
        return (self.kind, self.op, self.root, self.tag, len(self.arrays), shapes)

    def description(self) -> tuple[Any, ...]:
        """What a joined rank needs to take part."""
        return (self.kind, self.op, self.root, self.tag,
                [(a.dtype.str, a.shape) for a in self.arrays])

    def explain(self) -> str:
        if self.error:
            return f"invalid arguments ({self.error})"
        arrays = ", ".join(f"{np.dtype(d)}{list(s)}" for d, s in
                           [(a.dtype.str, a.shape) for a in self.arrays])
        extra = f", root={self.root}" if self.kind == "broadcast" else ""
        tag = f", {self.tag}" if self.tag else ""
        return f"{self.kind}(op={self.op}{extra}{tag}, [{arrays}])"

    @classmethod
    def zeros(cls, description: tuple[Any, ...], size: int) -> Call:
        """The part a joined rank plays in the call ``description`` describes."""
        kind, op, root, tag, arrays = description
        made = []
        for dtype, shape in arrays:
            if kind in _ROWS_MAY_DIFFER and len(shape):
                shape = (0, *shape[1:])
            made.append(np.zeros(shape, dtype=np.dtype(dtype)))
        splits = [0] * size if kind == "alltoall" else None
        return cls(kind, made, op=op, root=root, splits=splits, tag=tag)


def _translated(err: BaseException) -> BaseException:
    """hpcdist's errors as the Horovod-named ones (both at once)."""
    if isinstance(err, HorovodInternalError):
        return err
    if isinstance(err, CollectiveMismatchError):
        return HorovodMismatchError(str(err))
    if isinstance(err, CollectiveTimeoutError):
        return HorovodTimeoutError(str(err))
    if isinstance(err, HpcdistError):
        return HorovodInternalError(f"{type(err).__name__}: {err}")
    return err


def _digest(signature: tuple[Any, ...]) -> int:
    raw = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


class Pending:
    """A submitted call: :meth:`done` says whether it finished, :meth:`wait` gives its
    result (or raises its error)."""

    __slots__ = ("_event", "_result", "_error")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self) -> Any:
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._result


class Runner:
    """Runs the calls of one process set in submission order (see the module doc).

    Args:
        comm: the set's communicator (this rank is in it); the runner works on a duplicate.
    """

    def __init__(self, comm: Any) -> None:
        size = int(comm.Get_size())
        # With a timeout the engine's waits sleep instead of spinning (a spinning wait takes
        # the core from the other ranks' compute on a full host) and never hang.
        options = CommunicationOptions(timeout_seconds=get_default_timeout() or DEFAULT_TIMEOUT)
        self.engine = Collectives(comm.Dup() if size > 1 else comm, options)
        self.rank, self.size = self.engine.rank, self.engine.size
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Pending] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running = threading.Lock()  # held while a call runs (thread or inline)
        self._round = 0
        self._join_round = 0

    # -- submitting ----------------------------------------------------------

    def submit(self, call: Call) -> Pending:
        """Queue ``call``; the returned :class:`Pending` gives its list of result arrays."""
        return self._put(lambda: self._step(call)[1])

    def run(self, call: Call) -> list[np.ndarray]:
        """Run ``call`` now on the calling thread (after the one running, if any): for a
        caller that is itself a communication thread; errors as :meth:`submit` gives them."""
        with self._running:
            try:
                return list(self._step(call)[1])
            except BaseException as err:
                raise _translated(err) from err

    def join(self) -> Pending:
        """Queue a join: take part with zeros until every rank joined; gives the last rank."""
        return self._put(self._join)

    def _put(self, work: Callable[[], Any]) -> Pending:
        pending = Pending()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="hpcdist-horovod", daemon=True
                )
                self._thread.start()
            self._jobs.put((work, pending))
        return pending

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, pending = job
            try:
                with self._running:
                    pending._result = work()
            except BaseException as err:  # handed to the waiting thread
                pending._error = _translated(err)
            finally:
                pending._event.set()

    def close(self) -> None:
        """Stop the thread (after the queued calls) and free the engine."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()
        self.engine.close()

    # -- running -------------------------------------------------------------

    def _exchange(self, row: np.ndarray) -> np.ndarray:
        rows = np.empty((self.size, row.shape[0]), dtype=np.int64)
        if self.size == 1:
            rows[0] = row
            return rows
        request = self.engine.comm.Iallgather(row, rows)
        timeout = self.engine.options.timeout_seconds or DEFAULT_TIMEOUT
        deadline, nap = time.monotonic() + timeout, 1e-5
        while not request.Test():
            if time.monotonic() > deadline:
                err = HorovodTimeoutError(
                    f"a collective of a process set of {self.size} ranks waited more than "
                    f"{timeout} s for the other ranks (a rank skipped it, hangs or died); "
                    "abort the job"
                )
                err.request = request
                raise err
            time.sleep(nap)
            nap = min(nap * 2, 1e-3)
        return rows

    def _step(self, call: Call | None) -> tuple[str, Any]:
        """One negotiated call (``call`` None: this rank has joined)."""
        self._round += 1
        joined = call is None
        bad = call is not None and bool(call.error)
        digest = 0 if call is None else _digest(call.signature())
        row = np.array([int(joined), digest, int(bad), self._join_round if joined else 0],
                       dtype=np.int64)
        rows = self._exchange(row)
        active = [r for r in range(self.size) if rows[r, 0] == 0]
        if not active:
            last = max(range(self.size), key=lambda r: (int(rows[r, 3]), r))
            return "done", last
        if rows[active, 2].any() or len({int(rows[r, 1]) for r in active}) > 1:
            texts = self.engine.comm.allgather(None if call is None else call.explain())
            lines = "; ".join(f"rank {r}: {t}" for r, t in enumerate(texts) if t is not None)
            raise HorovodMismatchError(
                f"ranks called a collective with disagreeing or invalid arguments: {lines}. "
                "Every rank of the process set must make the same calls in the same order, "
                "with the same dtypes, shapes (the first dimension may differ for allgather "
                "and alltoall), ops and roots"
            )
        if len(active) < self.size:
            leader = active[0]
            mine = call.description() if call is not None and self.rank == leader else None
            description = self.engine.comm.bcast(mine, root=leader)
            if call is None:
                call = Call.zeros(description, self.size)
        assert call is not None
        return "run", self._run(call)

    def _join(self) -> int:
        self._join_round = self._round + 1
        while True:
            status, value = self._step(None)
            if status == "done":
                self._join_round = 0
                return int(value)

    def _run(self, call: Call) -> list[np.ndarray]:
        e, kind, op = self.engine, call.kind, call.op
        if kind == "allreduce":
            if op in ("SUM", "MEAN", "MIN", "MAX"):
                return list(e.allreduce(call.arrays, op)) if call.arrays else []
            if op == "PRODUCT":
                return [
                    np.prod(e.allgather(a.reshape(1, *a.shape)), axis=0).astype(a.dtype)
                    for a in call.arrays
                ]
            if op == "ADASUM":
                return [adasum_allreduce(e, a) for a in call.arrays]
        elif kind == "allgather":
            return list(e.allgather_list(call.arrays)) if call.arrays else []
        elif kind == "broadcast":
            return list(e.broadcast(call.arrays, root=call.root)) if call.arrays else []
        elif kind == "alltoall":
            out, received = e.alltoall(call.arrays[0], call.splits)
            return [out, received]
        elif kind == "reducescatter":
            return [e.reduce_scatter(a, op) for a in call.arrays]
        elif kind == "barrier":
            e.barrier()
            return []
        raise HorovodInternalError(f"unknown collective {kind!r} with op {op!r}")
