"""``ClusterCoordinator`` over MPI: the chief hands scheduled functions to worker ranks.

Every rank runs the same program. On the chief, :class:`ClusterCoordinator`
queues each ``schedule``-d function (closure ``k``) and sends ``RUN k`` to an
idle worker; results come back encoded (:mod:`.wire`). On a worker the same
constructor returns a :class:`~.follower.WorkerCoordinator`, which records the
same closures and runs those the chief assigns to it while it waits in
``join``/``done``/``fetch`` (the *sync points*): there it serves ``RUN``
messages until the chief's ``SYNC`` for that sync point arrives, carrying what
the chief's call returns or raises, so every rank returns (or raises) the same.

Errors, as in TF: the first exception of a scheduled function is raised once,
by the next ``join``/``done``/``fetch`` on every rank, after the functions
still running have finished; the functions not yet started (and those
scheduled before that sync point) are cancelled, and their RemoteValues raise
:class:`~.remote_value.CancelledError`. Later schedules run normally. One difference
from TF: ``schedule`` never raises that error (it is not a sync point); it
returns a cancelled RemoteValue while the error waits to be raised.

Failover: when a worker dies (run with ``mpirun --with-ft ulfm``), its running
function goes back to the front of the queue and runs on another worker, so a
function may run more than once (as in TF). With no worker left, ``join``,
``done`` and ``fetch`` raise :class:`~.remote_value.UnavailableError`.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.distribute import nest
from hpcdist.distribute.coordinator import wire
from hpcdist.distribute.coordinator.remote_value import (
    PerWorkerDataset,
    RemoteValue,
    check_dataset_fn,
    check_schedule,
)
from hpcdist.runtime.failures import register_exit_guard
from hpcdist.runtime.mpi import mpi

#: ``schedule`` blocks while more closures than this wait for a worker.
CLOSURE_QUEUE_MAX_SIZE = 256

_current = threading.local()
#: The class a worker rank gets for ``ClusterCoordinator(strategy)``; follower.py registers
#: WorkerCoordinator (it subclasses ClusterCoordinator, so this module cannot import it).
_worker_class: list[type[ClusterCoordinator]] = []


def register_worker_class(cls: type[ClusterCoordinator]) -> None:
    """Set the coordinator class of worker ranks (``follower.WorkerCoordinator`` does)."""
    _worker_class[:] = [cls]


def experimental_get_current_worker_index() -> int:
    """The index of the worker running the current scheduled function.

    Raises ``ValueError`` outside a scheduled function.

    Example: ``def step(it): w = experimental_get_current_worker_index(); ...``.
    """
    index = getattr(_current, "worker", None)
    if index is None:
        raise ValueError(
            "experimental_get_current_worker_index() is called outside a scheduled function; "
            "call it inside a function given to ClusterCoordinator.schedule"
        )
    return index


def _roles_of(strategy: Any) -> Any:
    extended = getattr(strategy, "extended", None)
    roles = getattr(extended, "_roles", None)
    comm = getattr(extended, "_coordination_comm", None)
    if roles is None or comm is None:
        raise ValueError(
            f"ClusterCoordinator needs a ParameterServerStrategy (with roles and a coordination "
            f"communicator); got a {type(strategy).__name__}"
        )
    if roles.chief_rank is None:
        raise ValueError(
            "ClusterCoordinator needs a chief task to coordinate the workers, and this cluster "
            f"has none (ps ranks {list(roles.ps_ranks)}, worker ranks {list(roles.worker_ranks)})"
            "; add a chief task, e.g. "
            "hd.cluster_resolver.MPIClusterResolver(jobs={'chief': 1, 'ps': 1, 'worker': 2})"
        )
    if roles.is_ps:
        raise ValueError("ClusterCoordinator is made on the chief and the workers, not on a ps")
    return roles


class ClusterCoordinator:
    """Schedules functions on the workers of a ``ParameterServerStrategy`` (on the chief).

    Made on every rank but the ps (on a worker it is a
    :class:`~.follower.WorkerCoordinator`); one per strategy. Call it from one thread.

    Example: ``coordinator = ClusterCoordinator(strategy); rv = coordinator.schedule(fn)``;
    ``coordinator.join()``; ``rv.fetch()``.
    """

    def __new__(cls, strategy: Any) -> ClusterCoordinator:
        existing = getattr(strategy, "_cluster_coordinator", None)
        if isinstance(existing, ClusterCoordinator):
            return existing
        roles = _roles_of(strategy)
        if cls is ClusterCoordinator and roles.is_worker:
            if not _worker_class:
                raise RuntimeError(
                    "no worker-side coordinator is registered; import "
                    "hpcdist.distribute.coordinator (the package) rather than its modules"
                )
            return super().__new__(_worker_class[0])
        return super().__new__(cls)

    def _attach(self, strategy: Any) -> None:
        """Take the roles and the coordination communicator (errors returned) of ``strategy``."""
        roles = _roles_of(strategy)
        self._strategy = strategy
        self._roles = roles
        self._comm = strategy.extended._coordination_comm
        self._MPI = mpi()
        self._comm.Set_errhandler(self._MPI.ERRORS_RETURN)
        self._workers = list(roles.worker_ranks)

    def __init__(self, strategy: Any) -> None:
        if getattr(self, "_strategy", None) is not None:
            return  # the strategy's existing coordinator
        self._attach(strategy)
        self._lock = threading.RLock()
        self._count = 0  # closures scheduled so far
        self._closed = False
        self._setup()
        try:
            strategy._cluster_coordinator = self
        except AttributeError:
            pass
        register_exit_guard()  # no-op when the world already registered it
        atexit.register(self._shutdown)

    def _setup(self) -> None:
        n = len(self._workers)
        self._alive = [True] * n
        self._busy: list[int | None] = [None] * n
        self._reqs: list[tuple[Any, np.ndarray] | None] = [None] * n
        self._open: dict[int, tuple[RemoteValue, int]] = {}  # unfinished: (value, name hash)
        self._queue: deque[int] = deque()
        self._sends: list[tuple[Any, int, tuple]] = []
        self._pending: dict | None = None
        self._seq = 0

    @property
    def strategy(self) -> Any:
        """The strategy this coordinator schedules for."""
        return self._strategy

    # -- the public API
    def schedule(self, fn: Callable[..., Any], args: Any = None, kwargs: Any = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns its :class:`RemoteValue`.

        ``PerWorkerValues`` in the arguments become the running worker's component.
        Blocks while more than :data:`CLOSURE_QUEUE_MAX_SIZE` functions wait for a worker.
        """
        args, kwargs = check_schedule(fn, args, kwargs, len(self._workers))
        with self._lock:
            self._check_open()
            k = self._count
            self._count += 1
            rv = RemoteValue(self, k, wire.qualname_of(fn))
            if self._pending is not None:
                rv._cancel(f"an earlier scheduled function failed ({self._reason()})")
                return rv
            self._open[k] = (rv, wire.name_hash(fn))
            self._queue.append(k)
            self._poll()
            if len(self._queue) > CLOSURE_QUEUE_MAX_SIZE:
                self._progress(lambda: len(self._queue) <= CLOSURE_QUEUE_MAX_SIZE)
            return rv

    def join(self) -> None:
        """Wait until every scheduled function has finished; raise the first new error.

        Example: ``for _ in range(steps): coordinator.schedule(step_fn)``; ``coordinator.join()``.
        """
        with self._lock:
            self._check_open()
            self._progress(self._idle)
            self._finish(wire.JOIN, None)

    def done(self) -> bool:
        """Whether every scheduled function has finished (does not wait); raises a new error.

        Example: ``while not coordinator.done(): report()``.
        """
        with self._lock:
            self._check_open()
            self._poll()
            if self._pending is not None:
                self._progress(lambda: not self._in_flight())
            elif not self._idle() and not any(self._alive):
                self._unavailable()
            self._finish(wire.DONE, self._idle())
            return self._idle()

    def fetch(self, val: Any) -> Any:
        """``val`` with each :class:`RemoteValue` replaced by its result (waits for them).

        Raises the first new error of any scheduled function, else the error of a
        fetched function that failed or was cancelled.

        Example: ``coordinator.fetch({"loss": rv_loss, "step": 3})``.
        """
        flat = nest.flatten(val)
        targets = [x for x in flat if isinstance(x, RemoteValue)]
        with self._lock:
            self._check_open()
            for t in targets:
                if t._owner is not self:
                    raise ValueError(f"{t!r} was scheduled by another coordinator")
            self._progress(lambda: all(t._finished for t in targets) or self._pending is not None)
            if self._pending is not None:  # raised once the running functions have finished
                self._progress(lambda: not self._in_flight())
                self._finish(wire.FETCH, None)
            failed = next((t._error for t in targets if t._error is not None), None)
            if self._pending is None and failed is not None:
                self._send_sync(wire.FETCH, False, failed)
                raise wire.rebuild_error(failed)
            values = [t._value for t in targets]
            self._finish(wire.FETCH, values)
        it = iter(values)
        return nest.pack_sequence_as(
            val, [next(it) if isinstance(x, RemoteValue) else x for x in flat]
        )

    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """A dataset built on each worker by ``dataset_fn()`` (never on the chief).

        ``dataset_fn`` takes no arguments (e.g. it calls
        ``strategy.distribute_datasets_from_function``), or is such a distributed
        dataset. Each worker builds its dataset the first time a scheduled function
        reads it. ``iter()`` of the result is a per-worker iterator to pass to ``schedule``.

        Example: ``it = iter(coordinator.create_per_worker_dataset(lambda: make_dataset()))``.
        """
        check_dataset_fn(dataset_fn)
        return PerWorkerDataset(len(self._workers), self._roles.worker_index, dataset_fn)

    # -- progress
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the ClusterCoordinator was shut down (at exit); make no more calls")

    def _in_flight(self) -> bool:
        return any(b is not None for b in self._busy)

    def _idle(self) -> bool:
        return not self._queue and not self._in_flight()

    def _reason(self) -> str:
        p = self._pending or {}
        return f"{p.get('qualname')}: {p.get('message')}"

    def _unavailable(self) -> None:
        raise wire.UnavailableError(
            f"every worker ({len(self._workers)}, ranks {self._workers}) has failed, and "
            f"{len(self._queue)} scheduled functions are still waiting; restart the job "
            "(with more workers) from the last checkpoint"
        )

    def _progress(self, until: Callable[[], bool]) -> None:
        backoff = wire.Backoff()
        while True:
            events = self._poll()
            if until():
                return
            if not any(self._alive):
                self._unavailable()
            if events:
                backoff.reset()
            else:
                backoff.idle()

    def _poll(self) -> int:
        """Collect finished results and failures, then hand queued closures to idle workers."""
        events = self._prune_sends()
        for w in range(len(self._workers)):
            pair = self._reqs[w]
            if pair is None or not self._alive[w]:
                continue
            try:
                if not pair[0].Test():
                    continue
                self._reqs[w] = None
                self._receive(w, pair[1])
            except self._MPI.Exception as e:
                self._failure(e, w)
            events += 1
        for w in range(len(self._workers)):
            if self._queue and self._alive[w] and self._busy[w] is None:
                self._dispatch(w, self._queue.popleft())
                events += 1
        return events

    def _dispatch(self, w: int, k: int) -> None:
        rank = self._workers[w]
        head = np.zeros(wire.HEADER_LEN, np.int64)
        self._busy[w] = k
        try:
            self._reqs[w] = (self._comm.Irecv(head, source=rank, tag=wire.TAG_RESULT), head)
            msg = wire.header(wire.RUN, k, self._open[k][1], 0)
            self._sends.append((self._comm.Isend(msg, dest=rank, tag=wire.TAG_CTRL), w, (msg,)))
        except self._MPI.Exception as e:
            self._failure(e, w)

    def _receive(self, w: int, head: np.ndarray) -> None:
        kind, k, ok, nbytes = wire.read_header(head)
        if kind != wire.RESULT or k != self._busy[w]:
            raise RuntimeError(
                f"worker {w} sent message {(kind, k, ok, nbytes)} while running closure "
                f"{self._busy[w]}; "
                "expected its RESULT (are the chief and workers the same hpcdist version?)"
            )
        data = np.empty(nbytes, np.uint8)
        wire.wait(self._comm.Irecv(data, source=self._workers[w], tag=wire.TAG_RESULT_DATA))
        self._busy[w] = None
        if k not in self._open:
            return  # a retried closure that had finished already
        rv = self._open.pop(k)[0]
        try:
            good, payload = wire.decode_message(data)
        except Exception as e:  # a broken message fails the closure, not the chief
            good, payload = False, wire.error_info(e, closure=k, worker=w, name=rv._name)
        if good and ok:
            rv._set(payload)
            return
        if payload.get("qualname") == wire.ProgramsDivergedError.__qualname__:
            payload["message"] += f" (the chief's closure {k} is {rv._name!r})"
            payload["args"] = [payload["message"]]
        rv._fail(payload)
        if self._pending is None:
            self._pending = payload
            reason = f"an earlier scheduled function failed ({self._reason()})"
            self._cancel_queue(reason)

    def _failure(self, exc: Exception, w: int | None) -> None:
        if not wire.is_proc_failed(exc):
            where = "" if w is None else f" with worker {w} (rank {self._workers[w]})"
            raise RuntimeError(f"MPI error in the coordinator's traffic{where}: {exc}") from exc
        dead = wire.failed_ranks(self._comm)
        for i, rank in enumerate(self._workers):
            if self._alive[i] and (rank in dead or i == w):
                self._mark_dead(i)

    def _mark_dead(self, w: int) -> None:
        self._alive[w] = False
        self._reqs[w] = None
        k, self._busy[w] = self._busy[w], None
        note = ""
        if k is not None and k in self._open:
            if self._pending is None:
                self._queue.appendleft(k)
                note = f"; its closure {k} goes to another worker"
            else:
                reason = f"its worker failed after an error ({self._reason()})"
                self._open.pop(k)[0]._cancel(reason)
                note = f"; its closure {k} is cancelled (an earlier one failed)"
        rank = self._workers[w]
        print(
            f"hpcdist: ClusterCoordinator: worker {w} (rank {rank}) failed{note}",
            file=sys.stderr,
            flush=True,
        )

    def _cancel_queue(self, reason: str) -> None:
        for q in self._queue:
            self._open.pop(q)[0]._cancel(reason)
        self._queue.clear()

    def _prune_sends(self) -> int:
        events, keep = 0, []
        for item in self._sends:
            req, w, _ = item
            try:
                if req.Test():
                    continue
                keep.append(item)
            except self._MPI.Exception as e:
                events += 1
                self._failure(e, w)
        self._sends = keep
        return events

    # -- sync points
    def _send_sync(self, kind: int, ok: bool, payload: Any, *, exiting: bool = False) -> None:
        data = wire.encode_message(ok, payload) if not exiting else np.zeros(0, np.uint8)
        self._seq += 1
        code = wire.EXIT if exiting else wire.SYNC
        head = wire.header(code, self._seq, kind, data.nbytes)
        for w, rank in enumerate(self._workers):
            if not self._alive[w]:
                continue
            try:
                req = self._comm.Isend(head, dest=rank, tag=wire.TAG_CTRL)
                self._sends.append((req, w, (head, data)))
                if data.nbytes:
                    req = self._comm.Isend(data, dest=rank, tag=wire.TAG_CTRL_DATA)
                    self._sends.append((req, w, (head, data)))
            except self._MPI.Exception as e:
                self._failure(e, w)

    def _finish(self, kind: int, value: Any) -> None:
        """End a sync point: raise the pending error (once) or tell the workers ``value``."""
        if self._pending is not None:
            info, self._pending = self._pending, None
            self._send_sync(kind, False, info)
            raise wire.rebuild_error(info)
        try:
            self._send_sync(kind, True, value)
        except TypeError as e:
            info = wire.error_info(e)
            self._send_sync(kind, False, info)
            raise

    def _shutdown(self) -> None:
        """At exit: cancel what has not started, wait for what runs, then send EXIT."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cancel_queue("the program ended before it ran")
            try:
                self._progress(lambda: not self._in_flight())
            except Exception as e:  # at exit: report, never hang or raise
                print(f"hpcdist: ClusterCoordinator at exit: {e}", file=sys.stderr, flush=True)
            try:
                self._send_sync(0, True, None, exiting=True)
                backoff = wire.Backoff()
                deadline = time.monotonic() + 10.0  # sends to live workers complete at once
                while self._sends and time.monotonic() < deadline:
                    self._prune_sends()
                    backoff.idle()
            except Exception as e:  # at exit: report, never hang or raise
                print(f"hpcdist: ClusterCoordinator at exit: {e}", file=sys.stderr, flush=True)


__all__ = ["CLOSURE_QUEUE_MAX_SIZE", "ClusterCoordinator", "experimental_get_current_worker_index"]
