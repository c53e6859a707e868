"""The arrival board: which collective each rank is in, readable while a collective waits.

In checked mode (a timeout in effect) every engine keeps one small MPI RMA
window over its communicator, one record per rank: the sequence number of the
collective the rank last entered, whether it has left it, and a short
description of it (operation, op, shapes, dtypes). A rank writes only its own
record, under an exclusive lock on itself, when it enters and when it leaves a
collective. A rank that has waited long reads every record with passive-target
``Lock``/``Rget``/``Unlock`` (no help from the other ranks needed), within
about one second in all; a record that cannot be read in time (a rank that
died, or a transport that needs the target's help) is reported as unknown.

:class:`Watch` follows one checked collective's wait: past the stall threshold
it warns once (:class:`~hpcdist.errors.CollectiveStallWarning` and the
``hpcdist`` logger) naming the ranks that have not arrived and where the
others are; at the deadline it builds the
:class:`~hpcdist.errors.CollectiveTimeoutError`.

Example:
    >>> from hpcdist.runtime import mpi
    >>> board = ArrivalBoard(mpi().COMM_SELF)
    >>> board.enter(3, "allreduce(op=SUM, [float32(4,)])")
    >>> board.read()
    [Entry(seq=3, state=1, text='allreduce(op=SUM, [float32(4,)])')]
    >>> board.free()
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcdist.collectives.metadata import rank_ranges
from hpcdist.errors import CollectiveStallWarning, CollectiveTimeoutError

log = logging.getLogger("hpcdist")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

RECORD_BYTES = 256  # one rank's record: 4 int64 words, then the description
HEADER_WORDS = 4  # seq, state, description length, unused
TEXT_BYTES = RECORD_BYTES - 8 * HEADER_WORDS
READ_BUDGET_S = 1.0  # longest a read of the whole board may take
NONE, INSIDE, LEFT = 0, 1, 2  # record states
SHOWN = 160  # characters of a description in a report

ADVICE = (
    "MPI cannot cancel a collective, so this communicator is unusable now: abort the job "
    "(comm.Abort()). Only if every rank is known to join eventually, call "
    "err.request.Wait() before the next collective"
)


class Entry(NamedTuple):
    """One rank's record: the collective ``seq`` it last entered, ``state`` and its description.

    ``state`` is ``INSIDE`` (1) until the rank leaves the collective, then
    ``LEFT`` (2); ``NONE`` (0, ``seq`` 0) before its first checked collective.
    Example: ``Entry(12, LEFT, "allreduce(op=SUM, [float32(4,)])")``.
    """

    seq: int
    state: int
    text: str


def _decode(record: np.ndarray) -> Entry:
    head = record[: 8 * HEADER_WORDS].view(np.int64)
    n = int(min(max(head[2], 0), TEXT_BYTES))
    text = bytes(record[8 * HEADER_WORDS : 8 * HEADER_WORDS + n]).decode("utf-8", "ignore")
    return Entry(int(head[0]), int(head[1]), text)


class ArrivalBoard:
    """The arrival records of the ranks of ``comm`` in one RMA window (collective to create).

    Args:
        comm: an mpi4py intracommunicator; every rank creates the board at the
            same point (``MPI.Win.Allocate`` is collective) and frees it with
            :meth:`free`, also collectively.

    Example: ``board = ArrivalBoard(comm); board.enter(1, "barrier()"); board.leave(1)``.
    """

    def __init__(self, comm: Any) -> None:
        from hpcdist.runtime import mpi

        MPI = mpi()
        self._MPI = MPI
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self._win = MPI.Win.Allocate(RECORD_BYTES, 1, comm=comm)
        self._win.Set_errhandler(MPI.ERRORS_RETURN)
        self._record = np.frombuffer(self._win.tomemory(), dtype=np.uint8, count=RECORD_BYTES)
        self._head = self._record[: 8 * HEADER_WORDS].view(np.int64)
        self._win.Lock(self.rank, MPI.LOCK_EXCLUSIVE)
        self._record[:] = 0
        self._win.Unlock(self.rank)
        self._text = ""
        self._open: dict[int, Any] = {}  # rank -> Rget still pending from an earlier read
        comm.Barrier()  # every record is zeroed before anyone reads one

    def enter(self, seq: int, text: str) -> None:
        """Record that this rank entered collective ``seq``, described by ``text``.

        Example: ``board.enter(7, "broadcast(root=0, [int64(3,)])")``.
        """
        win, me = self._win, self.rank
        win.Lock(me, self._MPI.LOCK_EXCLUSIVE)
        head = self._head
        head[0] = seq
        head[1] = INSIDE
        if text != self._text:
            data = text.encode("utf-8")[:TEXT_BYTES]
            start = 8 * HEADER_WORDS
            self._record[start : start + len(data)] = np.frombuffer(data, np.uint8)
            head[2] = len(data)
            self._text = text
        win.Unlock(me)

    def leave(self, seq: int) -> None:
        """Record that this rank left collective ``seq``. Example: ``board.leave(7)``."""
        win, me = self._win, self.rank
        win.Lock(me, self._MPI.LOCK_EXCLUSIVE)
        if self._head[0] == seq:
            self._head[1] = LEFT
        win.Unlock(me)

    def read(self, budget: float = READ_BUDGET_S) -> list[Entry | None]:
        """Every rank's record, ``None`` for those not readable within ``budget`` seconds.

        Never blocks much longer than ``budget``: the reads are started
        together and polled with short sleeps; a read still pending at the end
        stays open and is finished by a later call.
        Example: ``[e.seq if e else None for e in board.read()]``.
        """
        MPI, win = self._MPI, self._win
        out: list[Entry | None] = [None] * self.size
        out[self.rank] = _decode(self._record.copy())
        for rank, request in list(self._open.items()):  # reads left open by an earlier call
            try:
                if request.Test():
                    win.Unlock(rank)
                    del self._open[rank]
            except MPI.Exception:
                pass
        buffers = {}
        requests = {}
        for rank in range(self.size):
            if rank == self.rank or rank in self._open:
                continue
            buf = np.zeros(RECORD_BYTES, np.uint8)
            try:
                win.Lock(rank, MPI.LOCK_SHARED)
            except MPI.Exception:
                continue
            try:
                requests[rank] = win.Rget(buf, rank)
                buffers[rank] = buf
            except MPI.Exception:
                try:
                    win.Unlock(rank)
                except MPI.Exception:
                    pass
        deadline = time.monotonic() + budget
        delay = 50e-6
        while requests:
            for rank, request in list(requests.items()):
                try:
                    done = request.Test()
                except MPI.Exception:
                    done = None
                if done is False:
                    continue
                del requests[rank]
                try:
                    win.Unlock(rank)
                except MPI.Exception:
                    done = None
                if done:
                    out[rank] = _decode(buffers[rank])
            left = deadline - time.monotonic()
            if not requests or left <= 0:
                break
            time.sleep(min(delay, left))
            delay = min(2 * delay, 10e-3)
        self._open.update(requests)
        return out

    def free(self) -> None:
        """Free the window (collective over the communicator). Example: ``board.free()``."""
        for rank, request in self._open.items():
            try:
                request.Wait()
                self._win.Unlock(rank)
            except self._MPI.Exception:
                pass
        self._open.clear()
        self._win.Free()


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside hpcdist (the user's call), for warnings."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _where(entry: Entry, seq: int) -> str:
    """Where a rank that is not in collective ``seq`` is, from its ``entry``."""
    if entry.state == NONE or entry.seq <= 0:
        return "it has not entered any checked collective yet"
    what = f"collective #{entry.seq} {_clip(entry.text)}"
    if entry.state == INSIDE:
        return f"it is still inside {what}"
    if entry.seq < seq:
        return f"it last left {what} and has not entered #{seq}"
    return f"it has left {what}"


def _grouped(ranks: Sequence[int], entries: Sequence[Entry | None], seq: int) -> str:
    """``rank 1: <where>; ranks 2-3: <where>`` with ranks in the same place together."""
    groups: dict[str, list[int]] = {}
    for rank in ranks:
        entry = entries[rank]
        assert entry is not None
        groups.setdefault(_where(entry, seq), []).append(rank)
    return "; ".join(
        f"{'rank' if len(g) == 1 else 'ranks'} {rank_ranges(g)}: {where}"
        for where, g in groups.items()
    )


def describe_arrivals(seq: int, entries: Sequence[Entry | None]) -> str:
    """Which ranks have not arrived at collective ``seq``, which are ahead, which are unknown.

    ``entries[r]`` is rank ``r``'s record (``None``: unreadable).

    Example:
        >>> print(describe_arrivals(5, [Entry(5, INSIDE, "b()"), Entry(4, INSIDE, "b()")]))
        rank 1 has not arrived (rank 1: it is still inside collective #4 b())
    """
    unknown = [r for r, e in enumerate(entries) if e is None]
    known = [(r, e) for r, e in enumerate(entries) if e is not None]
    missing = [r for r, e in known if e.seq < seq or e.state == NONE]
    ahead = [r for r, e in known if e.seq > seq]
    inside = [r for r, e in known if e.seq == seq and e.state == INSIDE]
    parts = []
    if missing:
        verb = "has" if len(missing) == 1 else "have"
        label = "rank" if len(missing) == 1 else "ranks"
        parts.append(
            f"{label} {rank_ranges(missing)} {verb} not arrived "
            f"({_grouped(missing, entries, seq)})"
        )
    if ahead:
        label = "rank" if len(ahead) == 1 else "ranks"
        verb = "is" if len(ahead) == 1 else "are"
        parts.append(f"{label} {rank_ranges(ahead)} {verb} ahead ({_grouped(ahead, entries, seq)})")
    if unknown:
        label = "rank" if len(unknown) == 1 else "ranks"
        parts.append(
            f"the state of {label} {rank_ranges(unknown)} is unknown (the arrival board "
            "could not be read in time: the rank may have died)"
        )
    if not missing and not unknown:
        text = "every rank has entered this collective"
        if inside:
            text += f" (still inside it: {rank_ranges(inside)})"
        parts.insert(0, text)
    return "; ".join(parts)


def missing_ranks(seq: int, entries: Sequence[Entry | None]) -> list[int]:
    """Ranks whose record says they have not arrived at collective ``seq``.

    Example: ``missing_ranks(5, [Entry(5, 1, "x"), Entry(4, 2, "x")]) == [1]``.
    """
    return [
        r for r, e in enumerate(entries) if e is not None and (e.seq < seq or e.state == NONE)
    ]


class Watch:
    """The wait of one checked collective: its deadline, stall warning and timeout error.

    Args:
        board: the engine's :class:`ArrivalBoard` (``None``: none yet, the
            other ranks' state is then reported as unknown).
        rank: this rank in the communicator.
        seq: the collective's sequence number on the communicator.
        what: the collective's description (operation, op, shapes).
        timeout: seconds from now to the deadline.
        stall: seconds after which to warn once (``None``: never).

    The waiting loops call :meth:`tick` between their sleeps.
    Example: ``w = Watch(board, 0, 12, "allreduce(...)", 30.0, 15.0); w.tick()``.
    """

    __slots__ = ("board", "rank", "seq", "what", "timeout", "start", "deadline", "_stall_at")

    def __init__(
        self,
        board: ArrivalBoard | None,
        rank: int,
        seq: int,
        what: str,
        timeout: float,
        stall: float | None,
    ) -> None:
        self.board = board
        self.rank = rank
        self.seq = seq
        self.what = what
        self.timeout = timeout
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self._stall_at = None if stall is None or stall >= timeout else self.start + stall

    def expired(self) -> bool:
        """Whether the deadline has passed. Example: ``if w.expired(): ...``."""
        return time.monotonic() > self.deadline

    def report(self) -> str:
        """Where the other ranks are, read from the board (at most about 1 s).

        Example: ``"rank 1 has not arrived (...)"``.
        """
        if self.board is None:
            return (
                "the other ranks' state is unknown (the arrival board is set up at the "
                "first checked collective of this communicator)"
            )
        return describe_arrivals(self.seq, self.board.read())

    def tick(self) -> None:
        """Warn once when the stall threshold has passed. Example: ``w.tick()``."""
        if self._stall_at is not None and time.monotonic() >= self._stall_at:
            self._stall_at = None
            waited = time.monotonic() - self.start
            message = (
                f"{self.what} (collective #{self.seq} on this communicator) has waited "
                f"{waited:.1f} s on rank {self.rank} (timeout {self.timeout} s): {self.report()}"
            )
            log.warning("rank %d: %s", self.rank, message)
            warnings.warn(message, CollectiveStallWarning, stacklevel=_caller_level())

    def timeout_error(self, where: str) -> CollectiveTimeoutError:
        """The error for a deadline that passed while waiting ``where`` (``"in Iallreduce"``).

        Example: ``raise w.timeout_error("at a node barrier")``.
        """
        return CollectiveTimeoutError(
            f"{self.what} (collective #{self.seq} on this communicator) did not complete "
            f"within {self.timeout} s on rank {self.rank} (waiting {where}): "
            f"{self.report()}. {ADVICE}"
        )
