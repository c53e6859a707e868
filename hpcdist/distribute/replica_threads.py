"""Run a function on several local replicas, one thread each, in lock-step at merge calls.

The calling (main) thread starts one thread per local replica and then
coordinates: whenever every replica thread has either returned or reached a
``merge_call`` (``all_reduce``, ``all_gather`` and variable updates are merge
calls), the main thread runs the merge function once, in the cross-replica
context, and hands each replica its part of the result. So all MPI traffic
happens on the calling thread, one collective at a time, in the same order
on every worker.

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
from collections.abc import Callable
from typing import Any

from hpcdist.distribute import context
from hpcdist.distribute.values import regroup, select_replica


class _Stopped(BaseException):
    """Raised inside a replica thread to unwind it after another replica failed."""


class _ReplicaThread(threading.Thread):
    def __init__(self, runner: Runner, local_id: int, fn: Callable, args: tuple, kwargs: dict):
        super().__init__(name=f"hpcdist-replica-{local_id}", daemon=True)
        self.runner = runner
        self.local_id = local_id
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.should_run = threading.Event()
        self.has_paused = threading.Event()
        self.done = False
        self.stopped = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.merge: tuple[Callable, tuple, dict, bool] | None = None
        self.merge_result: Any = None

    def run(self) -> None:
        self.should_run.wait()
        self.should_run.clear()
        try:
            if self.stopped:
                raise _Stopped()
            ctx = self.runner.extended._make_replica_context(self.local_id, self.merge_call)
            context.set_thread_stack([context.Mode(ctx.strategy, None, ctx)])
            with self.runner.extended._device_scope(self.local_id):
                self.result = self.fn(*self.args, **self.kwargs)
        except _Stopped:
            pass
        except BaseException as error:  # handed to the calling thread
            self.error = error
        finally:
            context.set_thread_stack([])
            self.done = True
            self.has_paused.set()

    def merge_call(self, merge_fn: Callable, args: tuple, kwargs: dict, wrap_all: bool) -> Any:
        if threading.current_thread() is not self:
            raise RuntimeError("merge_call must be called on the replica's own thread")
        self.merge = (merge_fn, args, kwargs, wrap_all)
        self.has_paused.set()
        self.should_run.wait()
        self.should_run.clear()
        if self.stopped:
            raise _Stopped()
        result, self.merge_result, self.merge = self.merge_result, None, None
        return result


class Runner:
    """Runs ``fn`` on the local replicas of ``extended`` (see the module docstring)."""

    def __init__(self, extended: Any) -> None:
        self.extended = extended

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        k = self.extended._num_local_replicas
        threads = [
            _ReplicaThread(self, i, fn, select_replica(i, args), select_replica(i, kwargs))
            for i in range(k)
        ]
        for t in threads:
            t.start()
        try:
            self._loop(threads)
        finally:
            self._stop(threads)
        return regroup([t.result for t in threads])

    def _loop(self, threads: list[_ReplicaThread]) -> None:
        for t in threads:
            t.should_run.set()
        while True:
            for t in threads:
                t.has_paused.wait()
                t.has_paused.clear()
            failed = [t for t in threads if t.error is not None]
            if failed:
                raise failed[0].error  # type: ignore[misc]
            if all(t.done for t in threads):
                return
            self._check_same_merge(threads)
            self._do_merge(threads)
            for t in threads:
                t.should_run.set()

    @staticmethod
    def _check_same_merge(threads: list[_ReplicaThread]) -> None:
        finished = [t.local_id for t in threads if t.done]
        if finished:
            waiting = [t.local_id for t in threads if not t.done]
            raise RuntimeError(
                f"local replicas {finished} returned while replicas {waiting} wait in a "
                "merge_call (all_reduce, all_gather, a variable update): every replica must "
                "make the same collective calls in the same order"
            )
        names = {_merge_name(t.merge[0]) for t in threads}  # type: ignore[index]
        if len(names) > 1:
            raise RuntimeError(
                f"the local replicas called different merge functions at the same step "
                f"({sorted(names)}): every replica must make the same collective calls in "
                "the same order"
            )

    def _do_merge(self, threads: list[_ReplicaThread]) -> None:
        merge_fn, _, _, wrap_all = threads[0].merge  # type: ignore[misc]
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
    def _stop(threads: list[_ReplicaThread]) -> None:
        for t in threads:
            if not t.done:
                t.stopped = True
                t.should_run.set()
        for t in threads:
            t.join()


def _merge_name(fn: Callable) -> str:
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
    return repr(type(fn))
