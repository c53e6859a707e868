"""Running a collective's MPI calls: blocking, or nonblocking with a deadline.

A collective is written once as a *plan*: a generator that yields
:class:`Call` records (an mpi4py buffer-mode method name and its arguments)
and returns the result. :func:`drive` issues each call on the communicator,

* blocking (``comm.Allreduce``) when there is no timeout, or
* nonblocking (``comm.Iallreduce``) polled with ``Test`` and a growing sleep
  (50 µs up to 10 ms, so a waiting rank does not burn a core) when there is
  one; past the deadline it raises :class:`~hpcdist.errors.CollectiveTimeoutError`
  whose ``request`` (a :class:`PendingCollective`) can finish the plan later.

MPI does not match a nonblocking collective with a blocking one, so every
rank must run a plan in the same mode; calls marked ``nonblocking`` (the
metadata check) are nonblocking in both modes, which lets ranks that disagree
on the mode find out instead of hanging. A plan that starts point-to-point
requests itself (``comm.Isend``, ``comm.Irecv``: the same in both modes) yields
``Call(WAITALL, (requests,))`` to wait for them (blocking ``Waitall``, or
``Testall`` polled against the deadline).

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> def plan(buf):
    ...     yield Call("Allreduce", (mpi().IN_PLACE, buf, mpi().SUM))
    ...     return buf
    >>> drive(mpi().COMM_SELF, plan(np.ones(2)), timeout=None, what="allreduce")
    array([1., 1.])
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Generator
from typing import Any, NamedTuple

from hpcdist.errors import CollectiveStallWarning, CollectiveTimeoutError

FIRST_SLEEP_S = 50e-6
LONGEST_SLEEP_S = 10e-3
YIELDING_TESTS = 32  # tests, yielding the CPU between them, before the first sleep
#: The longest sleep between tests of a plan's own transfers (:data:`WAITALL`): Open MPI's
#: TCP transport moves data only while a request is tested, so the sleeps stay short; but
#: a thread that sleeps leaves the core to the computation the transfer overlaps (the
#: backward pass), where a blocking ``Wait`` would spin on it.
TRANSFER_SLEEP_S = 200e-6

Plan = Generator["Call", None, Any]

#: The name of a :class:`Call` that waits for requests the plan started: ``args[0]`` lists them.
WAITALL = "Waitall"


class Call(NamedTuple):
    """One buffer-mode MPI collective: ``getattr(comm, name)(*args)``.

    ``nonblocking=True`` issues the ``I`` variant and waits for it even when
    the plan runs blocking; ``label`` says what the step is for in errors.
    """

    name: str
    args: tuple[Any, ...]
    nonblocking: bool = False
    label: str = ""  # what the step does, for the timeout error


class Requests:
    """Point-to-point requests a plan started, waited for as one request (:data:`WAITALL`)."""

    __slots__ = ("requests",)

    def __init__(self, requests: list[Any]) -> None:
        self.requests = requests

    def Test(self) -> bool:
        """Whether every request is complete (testing progresses them all)."""
        return all([r.Test() for r in self.requests])

    def Wait(self) -> None:
        """Block until every request is complete, testing them and sleeping in between."""
        poll(self, math.inf, longest=TRANSFER_SLEEP_S)


def _issue(comm: Any, call: Call) -> None:
    """Run ``call`` blocking."""
    if call.name == WAITALL:
        Requests(call.args[0]).Wait()
    else:
        getattr(comm, call.name)(*call.args)


def _start(comm: Any, call: Call) -> Any:
    if call.name == WAITALL:
        return Requests(call.args[0])
    name = "I" + call.name[0].lower() + call.name[1:]  # Allreduce -> Iallreduce, Bcast -> Ibcast
    return getattr(comm, name)(*call.args)


def poll(
    request: Any, deadline: float, watch: Any = None, longest: float = LONGEST_SLEEP_S
) -> bool:
    """Test ``request`` until it completes (``True``) or ``deadline`` passes (``False``).

    Tests a few times first, yielding the CPU in between (:data:`YIELDING_TESTS`),
    then sleeps between tests, 50 µs at first, doubling up to ``longest``; calls
    ``watch.tick()`` (a :class:`hpcdist.collectives.arrivals.Watch`) after each sleep.
    """
    for _ in range(YIELDING_TESTS):  # the common case: the others are microseconds away
        if request.Test():
            return True
        os.sched_yield()
    delay = FIRST_SLEEP_S
    while not request.Test():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, longest)
        if watch is not None:
            watch.tick()
    return True


def _next(plan: Plan, first: bool) -> tuple[Call | None, Any]:
    try:
        return (next(plan) if first else plan.send(None)), None
    except StopIteration as stop:
        return None, stop.value


class PendingCollective:
    """A collective that timed out on this rank and may still complete.

    ``Wait()`` blocks until the whole collective is done on this rank (every
    rank must join it) and returns its result; ``Test()`` makes progress
    without blocking and says whether it is done. Until it is done, the
    engine refuses new collectives on the communicator.
    """

    def __init__(self, comm: Any, plan: Plan, request: Any, what: str) -> None:
        self._comm = comm
        self._plan: Plan | None = plan
        self._request = request
        self.what = what
        self.result: Any = None

    @property
    def done(self) -> bool:
        """Whether the collective has completed on this rank."""
        return self._plan is None

    def _advance(self) -> None:
        """The current request completed: start the next call, or finish."""
        assert self._plan is not None
        try:
            call, value = _next(self._plan, first=False)
        except BaseException:
            self._plan = self._request = None
            raise
        if call is None:
            self._plan = self._request = None
            self.result = value
        else:
            self._request = _start(self._comm, call)

    def Test(self) -> bool:
        """Progress without blocking; ``True`` once the collective is complete."""
        while self._plan is not None:
            if not self._request.Test():
                return False
            self._advance()
        return True

    def Wait(self) -> Any:
        """Block until the collective completes on this rank; return its result."""
        while self._plan is not None:
            self._request.Wait()
            self._advance()
        return self.result

    def __repr__(self) -> str:
        return f"PendingCollective({self.what}, done={self.done})"


def _poll_watched(
    comm: Any, plan: Plan, request: Any, deadline: float, watch: Any, what: str, longest: float
) -> bool:
    """:func:`poll`; a stall warning turned into an error (``-W error``) leaves with the
    pending collective attached as its ``request``, like a timeout."""
    try:
        return poll(request, deadline, watch, longest)
    except CollectiveStallWarning as warning:
        warning.request = PendingCollective(comm, plan, request, what)
        raise


def drive(comm: Any, plan: Plan, timeout: float | None, what: str, watch: Any = None) -> Any:
    """Run ``plan`` on ``comm`` and return its result.

    ``timeout=None`` issues blocking calls (except those marked
    ``nonblocking``); a number issues nonblocking calls and raises
    :class:`CollectiveTimeoutError` when the whole plan is not done within
    ``timeout`` seconds. ``what`` names the operation in the error. A
    ``watch`` (:class:`hpcdist.collectives.arrivals.Watch`, checked mode)
    gives the deadline instead, warns about stalls while waiting and writes
    the timeout error, naming the ranks that have not arrived.
    """
    if watch is not None:
        deadline = watch.deadline
    else:
        deadline = None if timeout is None else time.monotonic() + timeout
    call, value = _next(plan, first=True)
    while call is not None:
        if deadline is None and not call.nonblocking:
            _issue(comm, call)
        else:
            request = _start(comm, call)
            if deadline is None:
                request.Wait()
            elif not _poll_watched(
                comm, plan, request, deadline, watch, what,
                TRANSFER_SLEEP_S if call.name == WAITALL else LONGEST_SLEEP_S,
            ):
                if watch is not None:
                    error = watch.timeout_error(f"in {call.label or call.name}")
                else:
                    error = CollectiveTimeoutError(
                        f"{what} did not complete within {timeout} s on rank "
                        f"{comm.Get_rank()} (waiting in {call.label or call.name}): some rank "
                        "has not joined it (it may have hung, crashed or skipped the call). "
                        "MPI cannot cancel a collective, so this communicator is unusable "
                        "now: abort the job (comm.Abort()). Only if every rank is known to "
                        "join eventually, call err.request.Wait() before the next collective"
                    )
                error.request = PendingCollective(comm, plan, request, what)
                raise error
        call, value = _next(plan, first=False)
    return value
