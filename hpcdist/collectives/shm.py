"""One MPI-3 shared-memory window per node: per-rank slots, result areas and flags.

:class:`NodeWindow` allocates, with ``MPI.Win.Allocate_shared`` on a node
communicator, one block of memory every rank of the node maps:

* a flag line (64 bytes) per rank: a barrier sequence number and, for the
  two latest barriers, the digest of the call the rank is in;
* two *sets* (double buffering), each with one slot per rank plus one
  result area, every one ``slot_bytes`` long.

Calls alternate between the sets, so a rank may write the next bucket while
a slower rank still reads the previous one; two barriers per bucket then
make every access safe (see :mod:`hpcdist.collectives.shm_backend`).

The barrier is a flag per rank: a rank stores its sequence number (release)
and spins, with acquire loads, until every rank's flag has reached it. When
the node has more ranks than cores the spin yields the CPU between short
bursts, so oversubscribed ranks do not starve each other. Each arrival also
publishes a digest of the call; :meth:`NodeWindow.barrier` tells whether all
ranks passed the same one, which is how a mismatch between ranks is caught
at no extra cost.

Example:
    ``w = NodeWindow(node_comm, slot_bytes=1 << 22)``; ``w.slots(0)[rank]``
    is this rank's slot of set 0; ``w.barrier(digest)`` waits for the node.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from hpcdist.kernels import address_of, arrive_and_wait, wait_all
from hpcdist.runtime import mpi, world
from hpcdist.runtime.peers import PeerWatch

LINE = 64  # bytes of one rank's flag line (a cache line)
LINE_WORDS = LINE // 8
ALIGN = 64  # byte alignment of slots
SPINS = 20000  # spin rounds (a few ns each) before a waiting rank starts to yield the CPU
SPINS_BETWEEN_YIELDS = 200


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class NodeWindow:
    """The shared-memory window of one node communicator.

    Args:
        node_comm: an mpi4py communicator whose ranks share memory (from
            ``Split_type(COMM_TYPE_SHARED)``). Creating the window is
            collective over it.
        slot_bytes: bytes of each slot and result area (rounded up to 64).
        host_ranks: ranks on this host (default: the node's); when they
            outnumber the cores, waiting ranks yield the CPU almost at once.

    Example: ``NodeWindow(node_comm, 1 << 22).barrier(digest)`` returns
    ``True`` when every rank passed ``digest``.
    """

    def __init__(self, node_comm: Any, slot_bytes: int, host_ranks: int | None = None) -> None:
        MPI = mpi()
        self.comm = node_comm
        self.rank = int(node_comm.Get_rank())
        self.size = int(node_comm.Get_size())
        self.slot_bytes = _aligned(max(slot_bytes, ALIGN))
        n = self.size
        self._set_bytes = (n + 1) * self.slot_bytes
        total = n * LINE + 2 * self._set_bytes
        self._win = MPI.Win.Allocate_shared(
            total if self.rank == 0 else 0, 1, comm=node_comm
        )
        memory, _ = self._win.Shared_query(0)
        raw = np.frombuffer(memory, dtype=np.uint8, count=total)
        self._raw = raw
        base = address_of(raw) + n * LINE
        self.slot_addresses = tuple(
            tuple(base + which * self._set_bytes + k * self.slot_bytes for k in range(n))
            for which in (0, 1)
        )
        self._views: dict[tuple[int, Any, bool], np.ndarray] = {}
        self.flags = raw[: n * LINE].view(np.int64)
        self._data = raw[n * LINE :]
        self._seq = 0
        self._sets = 0
        self._oversubscribed = (host_ranks or n) > _cores()
        if self.rank == 0:
            self.flags[:] = 0
        self.peers = PeerWatch.over(node_comm, self.flags, LINE_WORDS)  # a dead peer ends waits
        node_comm.Barrier()

    # -- memory views -------------------------------------------------------

    def next_set(self) -> int:
        """The set (0 or 1) the next bucket uses; sets alternate."""
        self._sets += 1
        return self._sets & 1

    def resync(self) -> None:
        """Restart the alternation of sets (every rank at once, after a mismatch).

        Ranks that passed different calls may have used different numbers of
        sets; all of them call this in the mismatch path.
        """
        self._sets = 0

    def slots(self, which: int, dtype: np.dtype | type = np.uint8) -> np.ndarray:
        """Set ``which`` (0 or 1) as a ``(size, slot_bytes // itemsize)`` array of ``dtype``.

        Example: ``w.slots(1, np.float32)[w.rank]`` is this rank's fp32 slot.
        """
        key = (which, dtype, False)
        view = self._views.get(key)
        if view is None:
            dt = np.dtype(dtype)
            start = which * self._set_bytes
            base = self._data[start : start + self.size * self.slot_bytes]
            view = self._views[key] = base.view(dt).reshape(
                self.size, self.slot_bytes // dt.itemsize
            )
        return view

    def result(self, which: int, dtype: np.dtype | type = np.uint8) -> np.ndarray:
        """The result area of set ``which`` as a 1-D array of ``dtype``."""
        key = (which, dtype, True)
        view = self._views.get(key)
        if view is None:
            start = which * self._set_bytes + self.size * self.slot_bytes
            view = self._data[start : start + self.slot_bytes].view(np.dtype(dtype))
            self._views[key] = view
        return view

    # -- synchronisation ----------------------------------------------------

    def agreed(self, seq: int, digest: int) -> bool:
        """Whether every rank arrived at barrier ``seq`` with ``digest`` (call after :meth:`wait`).
        """
        digests = self.flags[1 + (seq & 1) :: LINE_WORDS]
        return bool((digests == digest).all())

    def missing(self, seq: int) -> list[int]:
        """Local ranks that have not arrived at barrier ``seq`` yet."""
        return [k for k in range(self.size) if int(self.flags[k * LINE_WORDS]) < seq]

    def sync(self, digest: int, deadline: float | None) -> tuple[bool | None, int]:
        """A barrier: arrive with ``digest`` and wait for every rank of the node.

        Returns ``(agreed, seq)``: ``agreed`` says whether every rank passed
        the same digest, or is ``None`` when ``deadline`` (a
        ``time.monotonic()`` value) passed first; ``seq`` is the barrier's
        sequence number, to finish it later with :meth:`wait` and :meth:`agreed`.
        The common case is one compiled call (:func:`hpcdist.kernels.arrive_and_wait`).
        """
        self._seq += 1
        seq = self._seq
        burst = 32 if self._oversubscribed else SPINS
        status = arrive_and_wait(
            self.flags, self.rank, self.size, LINE_WORDS, seq, digest, burst
        )
        if status:
            return status > 0, seq
        if not self._wait_more(seq, deadline):
            return None, seq
        return self.agreed(seq, digest), seq

    def wait(self, seq: int, deadline: float | None) -> bool:
        """Wait until every rank arrived at barrier ``seq``; ``False`` if ``deadline`` passed first.

        Spins briefly (the common case: the others are a few microseconds
        away), then yields the CPU between short spins, so ranks that share
        cores with others still make progress. ``deadline`` is a
        ``time.monotonic()`` value (``None``: wait for ever).
        """
        burst = 32 if self._oversubscribed else SPINS
        if wait_all(self.flags, 0, self.size, LINE_WORDS, seq, burst):
            return True
        return self._wait_more(seq, deadline)

    def _wait_more(self, seq: int, deadline: float | None) -> bool:
        flags, n = self.flags, self.size
        between = 16 if self._oversubscribed else SPINS_BETWEEN_YIELDS
        yield_cpu, clock, peers = os.sched_yield, time.monotonic, self.peers
        try:
            while True:
                now = clock()
                peers.check(now)
                if deadline is not None and now > deadline:
                    return False
                yield_cpu()
                if wait_all(flags, 0, n, LINE_WORDS, seq, between):
                    return True
        except BaseException:  # interrupted or a peer gone: peers waiting for us must not spin
            peers.leave()
            raise

    def barrier(self, digest: int) -> bool:
        """Arrive and wait (no deadline); ``True`` if every rank passed ``digest``."""
        return bool(self.sync(digest, None)[0])


# Windows live until MPI finalizes: freeing one is collective, so it cannot be
# left to the garbage collector, and engines over the same node share one.
_WINDOWS: dict[tuple[Any, ...], NodeWindow] = {}


def node_comm_of(comm: Any) -> tuple[Any, int]:
    """The ranks of ``comm`` on this rank's node (virtual nodes included), as a new
    communicator, and the number of ranks of ``comm`` on this host.

    Collective over ``comm``.
    """
    MPI = mpi()
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    host_ranks = shared.Get_size()
    w = world()
    if w.node_count > 1:
        # Virtual nodes (HPCDIST_VIRTUAL_NODES) split a host's ranks further.
        node = shared.Split(w.node_index, key=comm.Get_rank())
        shared.Free()
        return node, host_ranks
    return shared, host_ranks


def shared_window(node_comm: Any, slot_bytes: int, host_ranks: int | None = None) -> NodeWindow:
    """The node window for the ranks of ``node_comm``, created on first use (collective).

    Engines whose node communicators hold the same world ranks share one
    window (and its sequence of barriers), which is safe because every rank
    issues collectives in one order.
    """
    MPI = mpi()
    group = node_comm.Get_group()
    everyone = MPI.COMM_WORLD.Get_group()
    members = tuple(group.Translate_ranks(list(range(group.Get_size())), everyone))
    group.Free()
    everyone.Free()
    key = (members, slot_bytes)
    window = _WINDOWS.get(key)
    if window is None:
        window = _WINDOWS[key] = NodeWindow(node_comm, slot_bytes, host_ranks)
    return window
