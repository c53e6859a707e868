"""Process sets: collectives among a subset of the ranks, one engine per MPI sub-communicator.

A :class:`ProcessSet` names some ranks of a parent communicator (by default
the MPI world). :meth:`ProcessSet.create` is collective over the parent:
every parent rank calls it, and the ranks in the set get a sub-communicator
(``comm.Split``) and, on first use, their own :class:`Collectives` engine
over it. Ranks outside the set get no communicator; asking them for the
engine raises :class:`~hpcdist.errors.ProcessSetError` at once (never a
hang). The Strategy API, ``hpcdist.torch`` and ``hpcdist.horovod`` all take
the engine of a set.

Example:
    >>> ps = ProcessSet([0]).create()
    >>> ps.included(), ps.size(), ps.rank()
    (True, 1, 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcdist.collectives.engine import Collectives
from hpcdist.errors import ProcessSetError
from hpcdist.runtime import mpi, world


class ProcessSet:
    """Some ranks of a parent communicator (default: the MPI world), sorted and distinct.

    Args:
        ranks: the parent ranks in the set (any order; duplicates are an error).
    """

    def __init__(self, ranks: Iterable[int]) -> None:
        try:
            listed = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise ProcessSetError(
                f"process set ranks are {ranks!r}; expected an iterable of int ranks"
            ) from None
        if len(set(listed)) != len(listed):
            raise ProcessSetError(f"process set ranks {listed} repeat a rank; list each once")
        self.ranks: list[int] = sorted(listed)
        self.comm: Any = None
        self._parent_size: int | None = None
        self._engine: Collectives | None = None
        self._created = False

    def create(self, parent: Any = None) -> ProcessSet:
        """Make the sub-communicator: collective over every rank of ``parent`` (default world).

        Returns the set itself. Ranks outside the set take part and get none.
        """
        if parent is None:
            parent = world().comm
        size = int(parent.Get_size())
        bad = [r for r in self.ranks if not 0 <= r < size]
        if bad or not self.ranks:
            raise ProcessSetError(
                f"process set ranks {self.ranks} are not a non-empty subset of the "
                f"{size} ranks 0..{size - 1}; pass ranks of the communicator"
            )
        me = int(parent.Get_rank())
        included = me in self.ranks
        if size == 1:
            self.comm = parent
        else:
            MPI = mpi()
            sub = parent.Split(0 if included else MPI.UNDEFINED, me)
            self.comm = sub if included else None
        self._parent_size = size
        self._created = True
        return self

    def included(self) -> bool:
        """Whether this rank is in the set (after :meth:`create`)."""
        return self.comm is not None

    def size(self) -> int:
        """The number of ranks in the set."""
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank inside the set, ``-1`` where it is not in it."""
        return int(self.comm.Get_rank()) if self.comm is not None else -1

    def engine(self) -> Collectives:
        """The collectives engine over the set (made on first use).

        Raises :class:`~hpcdist.errors.ProcessSetError` on a rank outside the
        set, or before :meth:`create`.
        """
        if not self._created:
            raise ProcessSetError(
                f"process set {self.ranks} is not created yet; call create() on every rank first"
            )
        if self.comm is None:
            me = world().rank
            raise ProcessSetError(
                f"rank {me} is not in process set {self.ranks}; only its ranks may call its "
                "collectives (test ps.included() first)"
            )
        if self._engine is None:
            self._engine = Collectives(self.comm)
        return self._engine

    def free(self) -> None:
        """Release the engine and the sub-communicator (local; the set is unusable after)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self.comm is not None and self._parent_size not in (None, 1):
            self.comm.Free()
        self.comm = None
        self._created = False

    def __repr__(self) -> str:
        return f"ProcessSet(ranks={self.ranks})"
