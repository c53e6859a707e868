"""Run a function on several local replicas, one thread each, in lock-step at merge calls.

The calling (main) thread starts one thread per local replica and then
coordinates: whenever every replica thread has either returned or reached a
``merge_call`` (``all_reduce``, ``all_gather`` and variable updates are merge
calls), the main thread runs the merge function once, in the cross-replica
context, and hands each replica its part of the result. So all MPI traffic
happens on the calling thread, one collective at a time, in the same order
on every worker.

With several local GPUs each replica runs on its own CUDA stream
(:mod:`hpcdist.distribute.streams`). Events order them with the calling
thread at every hand-over, with no host synchronisation: before the merge
function runs (and when the replicas return) the calling thread's streams
wait for the replicas' work so far (*hand-off*); after the merge result is
handed over (and before a run starts) the replica streams wait for the
calling thread's work so far (*hand-back*). CPU replicas skip all of it.

If a replica raises, the others are stopped at their next merge point and the
exception is re-raised on the calling thread. Replicas that disagree (one
returns while another waits in a merge call, or they call different
collectives) raise ``RuntimeError`` instead of hanging.

Example:
    >>> import hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> rid = lambda: hd.get_replica_context().replica_id_in_sync_group
    >>> s.experimental_local_results(s.run(rid))
    (0, 1)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from hpcdist.distribute import context
from hpcdist.distribute.values import regroup, select_replica


class _Stopped(BaseException):
    """Raised inside a replica thread to unwind it after another replica failed."""


class _Replica:
    """One replica's thread: kept alive between ``run`` calls, waiting for the next job."""

    def __init__(self, local_id: int) -> None:
        self.local_id = local_id
        self.should_run = threading.Event()
        self.has_paused = threading.Event()
        # (extended, fn, args, kwargs); fn is None once done (references dropped)
        self.job: tuple[Any, Callable | None, tuple, dict] | None = None
        self.reset()
        self.thread = threading.Thread(
            target=self._main, name=f"hpcdist-replica-{local_id}", daemon=True
        )
        self.thread.start()

    def reset(self) -> None:
        self.done = False
        self.stopped = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.merge: tuple[Callable, tuple, dict, bool, Any] | None = None
        self.merge_result: Any = None

    def _main(self) -> None:
        while True:
            self.should_run.wait()
            self.should_run.clear()
            if self.job is None:
                return  # the runner was collected
            extended, fn, args, kwargs = self.job
            assert fn is not None  # should_run is set with a new job
            self._run_job(extended, fn, args, kwargs)

    def _run_job(self, extended: Any, fn: Callable, args: tuple, kwargs: dict) -> None:
        try:
            if self.stopped:
                raise _Stopped()
            ctx = extended._make_replica_context(self.local_id, self.merge_call)
            context.set_thread_stack([context.Mode(ctx.strategy, None, ctx)])
            with extended._device_scope(self.local_id):
                self.result = fn(*args, **kwargs)
        except _Stopped:
            pass
        except BaseException as error:  # handed to the calling thread
            self.error = error
        finally:
            context.set_thread_stack([])
            self.job = (None, None, (), {})
            self.done = True
            self.has_paused.set()

    def merge_call(
        self, merge_fn: Callable, args: tuple, kwargs: dict, wrap_all: bool, key: Any = None
    ) -> Any:
        if threading.current_thread() is not self.thread:
            raise RuntimeError("merge_call must be called on the replica's own thread")
        if self.stopped:  # e.g. a collective in a `finally` while the run is unwinding
            raise _Stopped()
        self.merge = (merge_fn, args, kwargs, wrap_all, key)
        self.has_paused.set()
        self.should_run.wait()
        self.should_run.clear()
        if self.stopped:
            raise _Stopped()
        result, self.merge_result, self.merge = self.merge_result, None, None
        return result


def _shutdown(replicas: list[_Replica]) -> None:
    for r in replicas:
        r.job = None
        r.should_run.set()


class Runner:
    """Runs ``fn`` on the local replicas of ``extended`` (see the module docstring).

    The replica threads live as long as the runner. A ``run`` while another
    is in progress (``run`` inside a merge function, or from another thread)
    gets threads of its own for that call.
    """

    def __init__(self, extended: Any) -> None:
        self.extended = extended
        self._lock = threading.Lock()
        self._replicas: list[_Replica] | None = None

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        if not self._lock.acquire(blocking=False):
            return Runner(self.extended).run(fn, args, kwargs)
        try:
            if self._replicas is None:
                k = self.extended._num_local_replicas
                self._replicas = [_Replica(i) for i in range(k)]
                weakref.finalize(self, _shutdown, self._replicas)
            return self._run(self._replicas, fn, args, kwargs)
        finally:
            self._lock.release()

    def _run(self, replicas: list[_Replica], fn: Callable, args: tuple, kwargs: dict) -> Any:
        streams = getattr(self.extended, "_streams", None)
        if streams is not None:
            streams.hand_back_all()  # inputs, variables: what this thread enqueued before the run
        for r in replicas:
            r.reset()
            r.job = (
                self.extended,
                fn,
                select_replica(r.local_id, args),
                select_replica(r.local_id, kwargs),
            )
        try:
            self._loop(replicas)
        finally:
            self._stop(replicas)
        results = [r.result for r in replicas]
        for r in replicas:
            r.result = None
        return regroup(results)

    def _loop(self, threads: list[_Replica]) -> None:
        streams = getattr(self.extended, "_streams", None)
        for t in threads:
            t.should_run.set()
        while True:
            for t in threads:
                t.has_paused.wait()
                t.has_paused.clear()
            failed = [t for t in threads if t.error is not None]
            if failed:
                error, failed[0].error = failed[0].error, None
                assert error is not None  # failed: its error is set
                raise error
            if streams is not None:
                streams.hand_off_all()  # the replicas' work so far, before this thread's
            if all(t.done for t in threads):
                return
            self._check_same_merge(threads)
            self._do_merge(threads)
            if streams is not None:
                streams.hand_back_all()  # the merge's work, before the replicas' next
            for t in threads:
                t.should_run.set()

    @staticmethod
    def _check_same_merge(threads: list[_Replica]) -> None:
        finished = [t.local_id for t in threads if t.done]
        if finished:
            waiting = [t.local_id for t in threads if not t.done]
            raise RuntimeError(
                f"local replicas {finished} returned while replicas {waiting} wait in a "
                "merge_call (all_reduce, all_gather, a variable update): every replica must "
                "make the same collective calls in the same order"
            )
        # every thread here waits in a merge_call: its merge is set
        calls = [_describe(t.merge) for t in threads]  # type: ignore[arg-type]
        if len(set(calls)) > 1:
            described = "; ".join(
                f"replica {t.local_id}: {c}" for t, c in zip(threads, calls, strict=True)
            )
            raise RuntimeError(
                "the local replicas made different collective calls at the same step "
                f"({described}): every replica must make the same calls (same op, axis, "
                "shapes, variable) in the same order"
            )

    def _do_merge(self, threads: list[_Replica]) -> None:
        # (the ignores below: every thread waits in a merge_call, so its merge is set)
        merge_fn, _, _, wrap_all, _ = threads[0].merge  # type: ignore[misc]
        args = regroup([t.merge[1] for t in threads], always_wrap=wrap_all)  # type: ignore[index]
        kwargs = regroup([t.merge[2] for t in threads], always_wrap=wrap_all)  # type: ignore[index]
        strategy = self.extended._strategy
        mode = context.Mode(strategy, strategy, None)
        context.push_mode(mode)
        try:
            result = merge_fn(strategy, *args, **kwargs)
        finally:
            context.pop_mode(mode)
        for t in threads:
            t.merge_result = select_replica(t.local_id, result)

    @staticmethod
    def _stop(threads: list[_Replica]) -> None:
        """Unwind replicas still paused in a merge call; wait until every job has ended."""
        for t in threads:
            if not t.done:
                t.stopped = True
                t.should_run.set()
        for t in threads:
            while not t.done:
                t.has_paused.wait()
                t.has_paused.clear()
            t.has_paused.clear()


def _describe(merge: tuple) -> str:
    """What a paused replica asked for: the key of a collective, else the merge function."""
    merge_fn, key = merge[0], merge[4]
    return _merge_name(merge_fn) if key is None else repr(key)


def _merge_name(fn: Callable) -> str:
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
    return repr(type(fn))
