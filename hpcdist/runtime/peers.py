"""Notice, while waiting for the ranks of one node, that one of them is gone or gave up.

A rank that waits in a shared-memory barrier spins on its peers' flags; if a
peer was killed by a signal (and the launcher does not end the job, as
``srun`` without ``--kill-on-bad-exit`` or ``mpirun --with-ft ulfm`` do) or
left the collective because of a ``KeyboardInterrupt`` that its program
caught, the spin would never end. :class:`PeerWatch` is the check those wait
loops call: every :data:`CHECK_INTERVAL_S` seconds it looks whether each
peer's process still runs (the peers share the host, so their process ids
are visible, zombies included) and whether a peer marked itself as gone, and
raises :class:`~hpcdist.errors.RankFailedError` naming the rank if so.

A peer marks itself (:meth:`PeerWatch.leave`) when an exception such as
``KeyboardInterrupt`` takes it out of a wait loop: the collective it left
cannot complete any more, so waiting for it is pointless.

Example:
    >>> from hpcdist.runtime.peers import process_state
    >>> import os
    >>> process_state(os.getpid()) in ("R", "S")
    True
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.errors import RankFailedError
from hpcdist.runtime.mpi import mpi

CHECK_INTERVAL_S = 0.25  # how often a waiting rank looks at its peers
LEFT_WORD = 7  # the word of a rank's 64-byte flag line that marks it as gone (0 or 1)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``"R"``, ``"S"``, ``"Z"`` …), ``None`` if it is gone.

    Reads ``/proc/<pid>/stat`` where it exists; elsewhere asks ``kill(pid, 0)``
    and answers ``"?"`` for a live process.
    Example: ``process_state(os.getpid()) == "R"``.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        return text[text.rindex(b")") + 2 :][:1].decode()
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "?"
    return "?"


def _alive(state: str | None) -> bool:
    return state is not None and state not in ("Z", "X", "x")


class PeerWatch:
    """The peers of one node window: their process ids and their "gone" marks.

    Args:
        pids: the process id of each local rank, in local rank order.
        ranks: the world rank of each local rank (for messages).
        rank: this process's local rank.
        flags: the window's flag words (``int64``), ``stride`` words per rank;
            word :data:`LEFT_WORD` of each line is the rank's "gone" mark.
        where: what the waiting is (for messages).

    Build it collectively with :meth:`over`. Example:
    ``watch = PeerWatch.over(node_comm, flags, 8)``; ``watch.check()`` in a
    wait loop; ``watch.leave()`` when an exception leaves one.
    """

    def __init__(
        self,
        pids: Sequence[int],
        ranks: Sequence[int],
        rank: int,
        flags: np.ndarray,
        stride: int,
        where: str = "a shared-memory collective",
    ) -> None:
        self.pids = tuple(int(p) for p in pids)
        self.ranks = tuple(int(r) for r in ranks)
        self.rank = rank
        self.flags = flags
        self.stride = stride
        self.where = where
        self._next = 0.0
        # Process ids of another pid namespace (a container per rank) mean nothing here.
        self._pids_usable = all(_alive(process_state(p)) for p in self.pids)

    @classmethod
    def over(cls, node_comm: Any, flags: np.ndarray, stride: int) -> PeerWatch:
        """Gather the process ids and world ranks of ``node_comm`` (collective over it)."""

        world_rank = mpi().COMM_WORLD.Get_rank()
        pairs = node_comm.allgather((os.getpid(), world_rank))
        return cls(
            [p for p, _ in pairs], [r for _, r in pairs], int(node_comm.Get_rank()), flags, stride
        )

    def leave(self) -> None:
        """Mark this rank as gone: peers waiting for it raise instead of spinning.

        Example: ``except BaseException: watch.leave(); raise``.
        """
        self.flags[self.rank * self.stride + LEFT_WORD] = 1

    def check(self, now: float | None = None) -> None:
        """Raise :class:`~hpcdist.errors.RankFailedError` if a peer is gone (rate-limited).

        Cheap to call on every round of a wait loop: it looks at the peers at
        most every :data:`CHECK_INTERVAL_S` seconds.
        """
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        self._next = now + CHECK_INTERVAL_S
        self.check_now()

    def check_now(self) -> None:
        """Look at every peer now; raise :class:`~hpcdist.errors.RankFailedError` for a gone one."""
        for k, rank in enumerate(self.ranks):
            if k == self.rank:
                continue
            if int(self.flags[k * self.stride + LEFT_WORD]) != 0:
                raise RankFailedError(
                    f"rank {rank} left {self.where} (interrupted or failed) while rank "
                    f"{self.ranks[self.rank]} waited for it; the collective cannot complete. "
                    "End the job (the rank that left says why in its own output).",
                    rank=rank,
                )
            if self._pids_usable and not _alive(process_state(self.pids[k])):
                raise RankFailedError(
                    f"rank {rank} (process {self.pids[k]} on this host) has ended while rank "
                    f"{self.ranks[self.rank]} waited for it in {self.where}; the job cannot go "
                    "on. Look at the launcher's message for how it ended (signal, exit status).",
                    rank=rank,
                )
