"""Horovod's process sets over hpcdist's (:mod:`hpcdist.collectives.process_sets`).

``ProcessSet(ranks)`` describes a set; :func:`add_process_set` (collective
over every rank, also from ``hvd.init(process_sets=[...])``) makes its
sub-communicator and gives it an id; every collective takes
``process_set=`` and runs on the set's :class:`~hpcdist.horovod.common.runner.Runner`.
A rank outside the set that calls one of its collectives gets
:class:`~hpcdist.errors.ProcessSetError` at once. ``global_process_set``
(id 0) is every rank.

Example:
    >>> global_process_set.process_set_id
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcdist.collectives.process_sets import ProcessSet as _Group
from hpcdist.errors import HorovodNotInitializedError, ProcessSetError
from hpcdist.horovod.common.runner import Runner


class ProcessSet:
    """Some ranks of the job, for collectives among them only (Horovod's ``hvd.ProcessSet``).

    Args:
        ranks_or_comm: the ranks (any order) or an mpi4py communicator whose ranks
            of the world they are.
    """

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            ranks: list[int] = []
        else:
            ranks = sorted(int(r) for r in ranks_or_comm)
        self.ranks = ranks
        self._group: _Group | None = None
        self._runner: Runner | None = None
        self._more: list[Runner] = []  # one per DistributedOptimizer over the set

    def size(self) -> int | None:
        """The number of ranks in the set (``None`` before it is added)."""
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self) -> int | None:
        """This process's rank in the set; ``-1`` outside it, ``None`` before it is added."""
        if self._group is None:
            return None
        return self._group.rank()

    def included(self) -> bool | None:
        """Whether this process is in the set (``None`` before it is added)."""
        if self._group is None:
            return None
        return self._group.included()

    def runner(self) -> Runner:
        """The set's runner; a typed error where this rank may not use the set."""
        if self._group is None:
            if self is global_process_set:
                raise HorovodNotInitializedError(
                    "Horovod has not been initialized; use hvd.init() before collectives"
                )
            raise ProcessSetError(
                f"process set {self.ranks} was not added (or was removed); call "
                "hvd.add_process_set(ps) on every rank, or pass it to hvd.init(process_sets=...)"
            )
        if self._runner is None:
            self._runner = Runner(self._group.engine().comm)  # engine(): typed error outside
        return self._runner

    def new_runner(self) -> Runner:
        """Another runner over the set (its own communicator and thread), for a stream of
        calls made from another thread (a ``DistributedOptimizer``'s buckets); ``join``
        joins it too. Collective: every rank of the set makes the same ones in order."""
        self.runner()  # the typed errors
        assert self._group is not None
        extra = Runner(self._group.engine().comm)
        self._more.append(extra)
        return extra

    def all_runners(self) -> list[Runner]:
        """The main runner, then those of :meth:`new_runner` in creation order."""
        return [self.runner(), *self._more]

    def group(self) -> _Group:
        """The hpcdist process set behind it (its ``engine()`` serves hpcdist's own APIs)."""
        if self._group is None:
            raise ProcessSetError(f"process set {self.ranks} was not added; add it first")
        return self._group

    def _attach(self, parent: Any, set_id: int) -> None:
        if self.mpi_comm is not None:  # the world ranks of the communicator's members
            world_group = parent.Get_group()
            members = self.mpi_comm.Get_group()
            self.ranks = sorted(
                int(r) for r in members.Translate_ranks(list(range(members.Get_size())),
                                                        world_group)
            )
        self._group = _Group(self.ranks).create(parent)
        self.process_set_id = set_id

    def _detach(self) -> None:
        for runner in [*([self._runner] if self._runner else []), *self._more]:
            runner.close()
        self._runner = None
        self._more = []
        if self._group is not None and self is not global_process_set:
            self._group.free()
        self._group = None
        self.process_set_id = None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_sets: dict[int, ProcessSet] = {}
_parent: list[Any] = []


def setup(comm: Any, extra: Sequence[ProcessSet] = ()) -> None:
    """Make the global set over ``comm`` and add ``extra`` (called by ``hvd.init``)."""
    _parent[:] = [comm]
    global_process_set.ranks = list(range(int(comm.Get_size())))
    global_process_set._attach(comm, 0)
    _sets.clear()
    _sets[0] = global_process_set
    for ps in extra:
        add_process_set(ps)


def teardown() -> None:
    """Close every set's runner and free the sub-communicators (``hvd.shutdown``)."""
    for ps in list(_sets.values()):
        ps._detach()
    _sets.clear()
    _parent.clear()
    global_process_set.process_set_id = 0


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (collective: every rank calls it, in the same order).

    Example: ``evens = hvd.add_process_set([0, 2])``.
    """
    if not _parent:
        raise HorovodNotInitializedError("call hvd.init() before hvd.add_process_set()")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ProcessSetError(f"{ps!r} is already added; add a process set once")
    if ps.mpi_comm is None and any(ps.ranks == other.ranks for other in _sets.values()):
        raise ProcessSetError(f"a process set with ranks {ps.ranks} is already added")
    ps._attach(_parent[0], max(_sets) + 1)
    assert ps.process_set_id is not None
    _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (every rank calls it); ``False`` if it was not added.

    The global process set cannot be removed.
    """
    if process_set is global_process_set:
        raise ProcessSetError("the global process set cannot be removed")
    if process_set.process_set_id not in _sets:
        return False
    del _sets[process_set.process_set_id]
    process_set._detach()
    return True
