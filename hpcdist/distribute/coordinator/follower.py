"""The worker side of ``ClusterCoordinator``: record the closures, run those the chief assigns.

A worker runs the same program as the chief, so its ``schedule`` calls record
the same closures in the same order (closure ``k`` is its ``k``-th schedule).
Nothing runs until a sync point (``join``, ``done``, ``fetch``, and at exit):
there the worker serves the chief's messages: ``RUN k`` runs closure ``k``
(with ``PerWorkerValues`` replaced by this worker's component) and sends back
the result or the error; the chief's ``SYNC`` for this sync point ends the wait
and carries what the chief's call returned or raised, which the worker returns
or raises in turn. ``RUN k`` names the function by a hash of its qualified
name; a different function, a closure this worker never scheduled, or a SYNC of
another kind means the programs diverged: :class:`~.remote_value.ProgramsDivergedError`.

Example: on a worker rank, ``ClusterCoordinator(strategy)`` is a
:class:`WorkerCoordinator`; ``coordinator.join()`` runs the assigned closures.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

import numpy as np

from hpcdist.distribute import nest
from hpcdist.distribute.coordinator import cluster_coordinator as cc
from hpcdist.distribute.coordinator import wire
from hpcdist.distribute.coordinator.remote_value import (
    PerWorkerDataset,
    RemoteValue,
    check_dataset_fn,
    check_schedule,
    resolve_per_worker,
)
from hpcdist.runtime.failures import register_exit_guard


class WorkerCoordinator(cc.ClusterCoordinator):
    """``ClusterCoordinator`` on a worker rank: same methods, runs the chief's assignments.

    Example: ``rv = coordinator.schedule(fn)`` records closure ``k``; ``coordinator.join()``
    runs the closures the chief sends here and returns (or raises) what the chief's does.
    """

    def __init__(self, strategy: Any) -> None:
        if getattr(self, "_strategy", None) is not None:
            return  # the strategy's existing coordinator
        self._attach(strategy)
        roles = self._roles
        self._index = int(roles.worker_index)
        self._chief = int(roles.chief_rank)
        # closure k -> (fn, args, kwargs, name hash, RemoteValue); dropped once surely finished
        self._closures: dict[int, tuple[Any, tuple, dict, int, RemoteValue]] = {}
        self._count = 0
        self._seq = 0
        self._exited = False  # EXIT received, or the chief is gone
        try:
            strategy._cluster_coordinator = self
        except AttributeError:
            pass
        register_exit_guard()  # no-op when the world already registered it
        atexit.register(self._shutdown)

    # -- the public API (same as the chief's)
    def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> RemoteValue:
        """Record closure ``k`` (it runs here only if the chief assigns it to this worker)."""
        self._not_in_closure("schedule")
        args, kwargs = check_schedule(fn, args, kwargs, len(self._workers))
        k = self._count
        self._count += 1
        rv = RemoteValue(self, k, wire.qualname_of(fn))
        self._closures[k] = (fn, args, kwargs, wire.name_hash(fn), rv)
        return rv

    def join(self) -> None:
        """Run the chief's assignments until it has joined; raise what its ``join`` raised.

        Example: ``coordinator.join()`` (the same line as on the chief).
        """
        try:
            self._sync(wire.JOIN)
        finally:  # whether join returned or raised, every closure so far has finished
            self._closures.clear()

    def done(self) -> bool:
        """Run the chief's assignments until its ``done`` answers; return that answer.

        Example: ``while not coordinator.done(): ...`` (the same line as on the chief).
        """
        try:
            result = bool(self._sync(wire.DONE))
        except wire.ProgramsDivergedError:
            raise
        except Exception:
            self._closures.clear()  # done raised: nothing runs any more
            raise
        if result:
            self._closures.clear()
        return result

    def fetch(self, val: Any) -> Any:
        """``val`` with its RemoteValues replaced by the results the chief fetched.

        Example: ``coordinator.fetch(rvs)`` (the same line as on the chief).
        """
        flat = nest.flatten(val)
        count = sum(isinstance(x, RemoteValue) for x in flat)
        for x in flat:
            if isinstance(x, RemoteValue) and x._owner is not self:
                raise ValueError(f"{x!r} was scheduled by another coordinator")
        values = self._sync(wire.FETCH)
        if not isinstance(values, list) or len(values) != count:
            got = len(values) if isinstance(values, list) else type(values).__name__
            raise wire.ProgramsDivergedError(
                f"programs diverged: worker {self._index} fetches {count} RemoteValues at sync "
                f"point {self._seq}, the chief fetched {got}"
            )
        it = iter(values)
        return nest.pack_sequence_as(
            val, [next(it) if isinstance(x, RemoteValue) else x for x in flat]
        )

    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """This worker's dataset (built from ``dataset_fn()`` on first read) behind placeholders.

        Example: ``it = iter(coordinator.create_per_worker_dataset(dataset_fn))``.
        """
        check_dataset_fn(dataset_fn)
        return PerWorkerDataset(len(self._workers), self._index, dataset_fn)

    # -- serving
    def _recv(self, buf: np.ndarray, tag: int) -> None:
        try:
            wire.wait(self._comm.Irecv(buf, source=self._chief, tag=tag))
        except self._MPI.Exception as e:
            self._lost(e)

    def _send(self, buf: np.ndarray, tag: int) -> Any:
        try:
            return self._comm.Isend(buf, dest=self._chief, tag=tag)
        except self._MPI.Exception as e:
            self._lost(e)

    def _lost(self, exc: Exception) -> None:
        if wire.is_proc_failed(exc):
            self._exited = True
            raise wire.UnavailableError(
                f"worker {self._index}: the chief (rank {self._chief}) has failed; this worker "
                "cannot go on (restart the job from the last checkpoint)"
            ) from exc
        raise RuntimeError(f"worker {self._index}: MPI error talking to the chief: {exc}") from exc

    def _serve(self, at_exit: bool = False) -> tuple[int, int, np.ndarray] | None:
        """Serve RUN messages until a SYNC (returned) or, ``at_exit``, until EXIT."""
        head = np.zeros(wire.HEADER_LEN, np.int64)
        warned = False
        while True:
            self._recv(head, wire.TAG_CTRL)
            kind, a, b, nbytes = wire.read_header(head)
            if kind == wire.RUN:
                self._run(a, b)
                continue
            data = np.empty(nbytes, np.uint8)
            if nbytes:
                self._recv(data, wire.TAG_CTRL_DATA)
            if kind == wire.SYNC and not at_exit:
                return a, b, data
            if kind == wire.EXIT:
                self._exited = True
                if at_exit:
                    return None
                raise wire.ProgramsDivergedError(
                    f"programs diverged: worker {self._index} waits in sync point {self._seq + 1} "
                    "but the chief's program has ended; run the same schedule/join/done/fetch "
                    "calls on every rank"
                )
            if kind == wire.SYNC and not warned:  # at exit: the chief made more sync points
                warned = True
                print(
                    f"hpcdist: worker {self._index}: the program ended here but the chief is at "
                    f"sync point {a} ({wire.SYNC_NAMES.get(b, b)}); the programs diverged",
                    file=sys.stderr,
                    flush=True,
                )

    def _run(self, k: int, fn_hash: int) -> None:
        ok, name = True, "?"
        try:
            if k not in self._closures:
                raise wire.ProgramsDivergedError(
                    f"programs diverged: the chief asked worker {self._index} to run closure {k}, "
                    f"but this worker's program has scheduled {self._count} functions at this "
                    "point (and finished those before its last join)"
                )
            fn, args, kwargs, mine, rv = self._closures[k]
            name = rv._name
            if mine != fn_hash:
                raise wire.ProgramsDivergedError(
                    f"programs diverged: worker {self._index}'s closure {k} is {name!r}, which is "
                    f"not the chief's (name hash {fn_hash} != {mine}); schedule the same functions "
                    "in the same order on every rank"
                )
            cc._current.worker = self._index
            try:
                result = fn(
                    *resolve_per_worker(args, self._index),
                    **resolve_per_worker(kwargs, self._index),
                )
            finally:
                cc._current.worker = None
            data = wire.encode_message(True, result)
        except Exception as e:
            ok = False
            data = wire.encode_message(
                False, wire.error_info(e, closure=k, worker=self._index, name=name)
            )
        head = wire.header(wire.RESULT, k, int(ok), data.nbytes)
        reqs = [self._send(head, wire.TAG_RESULT), self._send(data, wire.TAG_RESULT_DATA)]
        try:
            for req in reqs:
                wire.wait(req)
        except self._MPI.Exception as e:
            self._lost(e)

    def _not_in_closure(self, what: str) -> None:
        if getattr(cc._current, "worker", None) is not None:
            raise RuntimeError(
                f"coordinator.{what}() was called inside a scheduled function; schedule, join, "
                "done and fetch are called by the program, not by the functions it schedules"
            )

    def _sync(self, kind: int) -> Any:
        self._not_in_closure(wire.SYNC_NAMES[kind].rstrip("()"))
        if self._exited:
            raise wire.UnavailableError(
                f"worker {self._index}: the chief has ended or failed; no sync point can complete"
            )
        self._seq += 1
        seq, got_kind, data = self._serve() or (0, 0, np.zeros(0, np.uint8))
        if seq != self._seq or got_kind != kind:
            raise wire.ProgramsDivergedError(
                f"programs diverged: worker {self._index} is at sync point {self._seq} "
                f"({wire.SYNC_NAMES[kind]}) but the chief sent sync point {seq} "
                f"({wire.SYNC_NAMES.get(got_kind, got_kind)}); run the same "
                "schedule/join/done/fetch calls on every rank"
            )
        ok, payload = wire.decode_message(data)
        if not ok:
            raise wire.rebuild_error(payload)
        return payload

    def _shutdown(self) -> None:
        """At exit: run what the chief still assigns, until its EXIT."""
        if self._exited:
            return
        try:
            self._serve(at_exit=True)
        except Exception as e:  # at exit: report, never raise
            print(f"hpcdist: worker {self._index} at exit: {e}", file=sys.stderr, flush=True)
        self._exited = True


cc.register_worker_class(WorkerCoordinator)

__all__ = ["WorkerCoordinator"]
