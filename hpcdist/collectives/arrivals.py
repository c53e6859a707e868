"""The arrival board: which collective each rank is in, readable while a collective waits.

In checked mode (a timeout in effect) every engine keeps one record per rank:
the sequence number of the collective the rank last entered, whether it has
left it, and a short description of it (operation, op, shapes, dtypes). A rank
writes only its own record, when it enters and when it leaves a collective,
into a shared-memory window of its host. A rank that has waited long reads
its host peers' records directly and asks the other hosts for theirs with a
point-to-point query, which any rank of that host waiting in a checked
collective answers; within about a quarter of a second in all. Passive-target RMA across
hosts is not used: over TCP it needs the target's progress, and a lock on a
rank that sleeps in its own code blocks the reader for ever. A host that does
not answer has no rank waiting in a collective: its ranks are reported as not
arrived, busy elsewhere, stopped or dead.

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
from types import FrameType
from typing import Any, NamedTuple

import numpy as np

from hpcdist.collectives.metadata import rank_ranges
from hpcdist.errors import CollectiveStallWarning, CollectiveTimeoutError
from hpcdist.runtime import mpi

log = logging.getLogger("hpcdist")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

RECORD_BYTES = 256  # one rank's record: 4 int64 words, then the description
HEADER_WORDS = 4  # seq, state, description length, unused
TEXT_BYTES = RECORD_BYTES - 8 * HEADER_WORDS
# Longest a read waits for the other hosts' answers: a waiting rank answers at its next
# tick (at most 10 ms apart), so a host silent this long has no rank in a collective.
READ_BUDGET_S = 0.15
# After its own answers, a reader goes on answering other hosts' queries this long: the
# ranks waiting with it time out together and ask at the same moment, and a rank that
# leaves the collective (to raise its error) stops answering.
ANSWER_GRACE_S = 0.1
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
    """The arrival records of the ranks of ``comm`` (collective to create).

    Args:
        comm: an mpi4py intracommunicator; every rank creates the board at the
            same point (the node split, the shared window and the query
            communicator are collective) and frees it with :meth:`free`, also
            collectively.

    The records of one host live in one MPI shared-memory window: a rank writes
    its own with plain stores (a version word makes torn reads detectable) and
    reads its host peers' directly, with no help from them. Records of ranks on
    other hosts come by a point-to-point query: the reader asks every rank of
    that host, and any of them that is waiting in a checked collective (its
    waiting loop calls :meth:`serve`) answers with all of its host's records.
    A host from which no answer comes within the budget has no rank waiting in
    a collective: its ranks are busy in their own code, stopped or dead, and
    are read as ``None``. No read ever waits on a lock another rank holds.
    """

    def __init__(self, comm: Any) -> None:
        MPI = mpi()
        self._MPI = MPI
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self._node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self._win = MPI.Win.Allocate_shared(RECORD_BYTES, 1, comm=self._node)
        peers = [int(r) for r in self._node.allgather(self.rank)]  # node order -> comm rank
        self._records: dict[int, np.ndarray] = {}
        for index, rank in enumerate(peers):
            buf, _ = self._win.Shared_query(index)
            self._records[rank] = np.frombuffer(buf, dtype=np.uint8, count=RECORD_BYTES)
        self._record = self._records[self.rank]
        self._head = self._record[: 8 * HEADER_WORDS].view(np.int64)
        self._record[:] = 0
        self._text = ""
        # Hosts by key (their smallest rank): whom to ask for records of another host.
        keys = [int(k) for k in comm.allgather(min(peers))]
        self._key = min(peers)
        self._hosts: dict[int, list[int]] = {}
        for rank, key in enumerate(keys):
            self._hosts.setdefault(key, []).append(rank)
        self._msg = comm.Dup()  # queries and answers never meet the user's messages
        self._status = MPI.Status()
        self._query = 0
        self._sends: list[tuple[Any, np.ndarray]] = []  # Isends in flight and their buffers
        comm.Barrier()  # every record is zeroed before anyone reads one

    def _write(self, seq: int, state: int, text: str | None) -> None:
        head = self._head
        head[3] += 1  # odd: a write is in progress
        head[0] = seq
        head[1] = state
        if text is not None and text != self._text:
            data = text.encode("utf-8")[:TEXT_BYTES]
            start = 8 * HEADER_WORDS
            self._record[start : start + len(data)] = np.frombuffer(data, np.uint8)
            head[2] = len(data)
            self._text = text
        head[3] += 1  # even again: the record is whole

    def enter(self, seq: int, text: str) -> None:
        """Record that this rank entered collective ``seq``, described by ``text``."""
        self._write(seq, INSIDE, text)

    def leave(self, seq: int) -> None:
        """Record that this rank left collective ``seq``."""
        if self._head[0] == seq:
            self._write(seq, LEFT, None)

    def _copy(self, rank: int) -> np.ndarray | None:
        """A whole copy of a host peer's record (``None`` if it kept changing)."""
        record = self._records[rank]
        version = record[24:32].view(np.int64)
        for _ in range(1000):
            before = int(version[0])
            copy = record.copy()
            if before % 2 == 0 and int(version[0]) == before:
                return copy
        return None

    def _host_records(self) -> np.ndarray:
        """This host's records, in rank order, after a header (query id, host key)."""
        ranks = self._hosts[self._key]
        out = np.zeros(16 + RECORD_BYTES * len(ranks), np.uint8)
        out[8:16].view(np.int64)[0] = self._key
        for i, rank in enumerate(ranks):
            copy = self._copy(rank)
            if copy is not None:
                out[16 + i * RECORD_BYTES : 16 + (i + 1) * RECORD_BYTES] = copy
            else:  # a record that kept changing: state NONE would be wrong, say "unreadable"
                out[16 + i * RECORD_BYTES : 24 + i * RECORD_BYTES].view(np.int64)[0] = -1
        return out

    def _isend(self, data: np.ndarray, dest: int, tag: int) -> None:
        self._sends.append((self._msg.Isend([data, self._MPI.BYTE], dest, tag), data))

    def serve(self) -> None:
        """Answer the other hosts' queries for this host's records (never blocks).

        The waiting loops of checked collectives call it (through
        :meth:`Watch.tick`).
        """
        MPI, msg, status = self._MPI, self._msg, self._status
        while msg.Iprobe(MPI.ANY_SOURCE, _QUERY, status):
            source = status.Get_source()
            query = np.empty(8, np.uint8)
            msg.Recv([query, MPI.BYTE], source, _QUERY)
            answer = self._host_records()
            answer[:8] = query
            self._isend(answer, source, _ANSWER)
        self._sends = [(r, d) for r, d in self._sends if not r.Test()]

    def read(self, budget: float = READ_BUDGET_S) -> list[Entry | None]:
        """Every rank's record; ``None`` for ranks of a host that did not answer in ``budget`` s.

        Records of this host are read directly; other hosts are asked
        together and their answers awaited with short sleeps, serving their
        queries meanwhile, for at most ``budget`` seconds, then their queries
        are served for :data:`ANSWER_GRACE_S` more (with several hosts only).
        """
        MPI, msg, status = self._MPI, self._msg, self._status
        out: list[Entry | None] = [None] * self.size
        for rank in self._hosts[self._key]:
            copy = self._record.copy() if rank == self.rank else self._copy(rank)
            out[rank] = None if copy is None else _decode(copy)
        waiting = {key for key in self._hosts if key != self._key}
        self._query += 1
        query = np.zeros(8, np.uint8)
        query.view(np.int64)[0] = self._query
        for key in waiting:
            for rank in self._hosts[key]:
                self._isend(query, rank, _QUERY)
        deadline = time.monotonic() + budget
        delay = 50e-6
        while waiting:
            self.serve()
            while msg.Iprobe(MPI.ANY_SOURCE, _ANSWER, status):
                answer = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                msg.Recv([answer, MPI.BYTE], status.Get_source(), _ANSWER)
                query_id, key = (int(v) for v in answer[:16].view(np.int64))
                if query_id != self._query or key not in waiting:
                    continue  # a late answer to an earlier read, or a second one
                waiting.discard(key)
                for i, rank in enumerate(self._hosts[key]):
                    record = answer[16 + i * RECORD_BYTES : 16 + (i + 1) * RECORD_BYTES]
                    if int(record[:8].view(np.int64)[0]) >= 0:
                        out[rank] = _decode(record)
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            time.sleep(min(delay, left))
            delay = min(2 * delay, 10e-3)
        if len(self._hosts) > 1:
            linger = time.monotonic() + ANSWER_GRACE_S
            while time.monotonic() < linger:
                self.serve()
                time.sleep(1e-3)
        return out

    def free(self) -> None:
        """Free the board (collective over the communicator)."""
        self.serve()
        self._sends.clear()  # answers nobody collects; MPI completes them with the communicator
        self._msg.Free()
        self._win.Free()
        self._node.Free()


_QUERY, _ANSWER = 1, 2  # tags on the board's own communicator


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside hpcdist (the user's call), for warnings."""
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


NO_ANSWER = (
    "no answer from its host within the read budget, so it is not waiting in any "
    "collective: busy in its own code, stopped or dead"
)


def _where(entry: Entry | None, seq: int) -> str:
    """Where a rank that is not in collective ``seq`` is, from its ``entry`` (``None``: unread)."""
    if entry is None:
        return NO_ANSWER
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
        groups.setdefault(_where(entries[rank], seq), []).append(rank)
    return "; ".join(
        f"{'rank' if len(g) == 1 else 'ranks'} {rank_ranges(g)}: {where}"
        for where, g in groups.items()
    )


def describe_arrivals(seq: int, entries: Sequence[Entry | None]) -> str:
    """Which ranks have not arrived at collective ``seq`` and which are ahead.

    ``entries[r]`` is rank ``r``'s record; ``None`` when its host did not
    answer (no rank there waits in a collective): such a rank has not arrived.

    Example:
        >>> print(describe_arrivals(5, [Entry(5, INSIDE, "b()"), Entry(4, INSIDE, "b()")]))
        rank 1 has not arrived (rank 1: it is still inside collective #4 b())
    """
    known = [(r, e) for r, e in enumerate(entries) if e is not None]
    missing = sorted(
        [r for r, e in known if e.seq < seq or e.state == NONE]
        + [r for r, e in enumerate(entries) if e is None]
    )
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
    if not missing:
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
        """Whether the deadline has passed."""
        return time.monotonic() > self.deadline

    def report(self) -> str:
        """Where the other ranks are, read from the board (at most about a quarter of a second)."""
        if self.board is None:
            return (
                "the other ranks' state is unknown (the arrival board is set up at the "
                "first checked collective of this communicator)"
            )
        return describe_arrivals(self.seq, self.board.read())

    def tick(self) -> None:
        """Answer other hosts' board queries; warn once when the stall threshold has passed."""
        if self.board is not None:
            self.board.serve()
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
        """
        return CollectiveTimeoutError(
            f"{self.what} (collective #{self.seq} on this communicator) did not complete "
            f"within {self.timeout} s on rank {self.rank} (waiting {where}): "
            f"{self.report()}. {ADVICE}"
        )
