"""The ordered registry of collective algorithms that AUTO walks, host and device.

The engine asks the algorithms in this order and runs the first whose
``applies(where)`` says yes (as Horovod's ``OperationManager`` does); each
decides from the call's facts (:class:`~hpcdist.collectives.where.Where`);

the list in :func:`_defaults` below is the one place the order is written.

An *algorithm* is one module under :mod:`hpcdist.collectives.algorithms` with
an object that follows :class:`~hpcdist.collectives.where.Algorithm`; adding
one is that module and one line here (or :func:`register` at run time). A
host algorithm says no to device calls (``where.device``) and a device one to
host calls; ``copy`` (one rank), ``mpi`` (host) and ``staged`` (device) leave
no call without one. A reduce_scatter asks only algorithms with a
``reduce_scatter``. An algorithm AUTO may pick must give every rank bitwise
the same result.

Example:
    >>> [a.name for a in registered()]  # doctest: +NORMALIZE_WHITESPACE
    ['copy', 'nccl', 'small', 'mpi-direct', 'shm', 'hierarchical', 'mpi-device', 'staged',
     'mpi']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcdist.collectives import choice
from hpcdist.collectives.algorithms import (
    copy,
    device_mpi,
    hierarchical,
    mpi,
    mpi_direct,
    nccl,
    shm,
    small,
    staged,
)
from hpcdist.collectives.choice import env_implementation
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Algorithm, Where

__all__ = [
    "Algorithm", "Where", "choose_route", "generation", "pick", "register", "registered",
    "remembered_pick", "unregister",
]

_REGISTRY: list[Any] = []
_GENERATION = [0]  # bumped by register/unregister: engines pick again
_UNREAD = object()  # a remembered pick that did not depend on that variable
#: Remembered picks an engine keeps (a full memo is emptied).
MEMO_SIZE = 1024


def generation() -> int:
    """A number that changes whenever the registry does (engines cache their picks by it)."""
    return _GENERATION[0]


def _defaults() -> list[Any]:
    return [  # (device and host algorithms say no to each other's calls: each kind keeps its order)
        copy.ALGORITHM,  # one rank: copies (host and device)
        nccl.ALGORITHM,  # device: NCCL over the whole communicator
        small.ALGORITHM,  # one node, <= 4 KiB, unchecked: pack, one barrier, fold
        mpi_direct.ALGORITHM,  # AUTO, one node of two ranks, MPI's size band
        shm.ALGORITHM,  # one node: the shared window
        hierarchical.ALGORITHM,  # several nodes: in the nodes, then between node leaders
        device_mpi.ALGORITHM,  # device: CUDA-aware MPI on device pointers
        staged.ALGORITHM,  # device: pinned host copies and the host algorithms
        mpi.ALGORITHM,  # every other host call: buffer-mode MPI
    ]


def registered() -> tuple[Algorithm, ...]:
    """The algorithms, in the order AUTO asks them."""
    if not _REGISTRY:
        _REGISTRY.extend(_defaults())
    return tuple(_REGISTRY)


def register(algorithm: Algorithm, before: str | None = None) -> None:
    """Add ``algorithm`` before the one named ``before`` (default: first of all);
    :func:`unregister` undoes it."""
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm is {algorithm!r}; expected an object with name, applies(where) and "
            "allreduce(session, items, layout, opts) (hpcdist.collectives.where.Algorithm)"
        )
    names = [a.name for a in registered()]
    if algorithm.name in names:
        raise ValueError(
            f"an algorithm named {algorithm.name!r} is already registered; unregister it first"
        )
    _GENERATION[0] += 1
    if before is None:
        _REGISTRY.insert(0, algorithm)
        return
    if before not in names:
        raise ValueError(f"before is {before!r}; expected one of {', '.join(names)}")
    _REGISTRY.insert(names.index(before), algorithm)


def unregister(name: str) -> Algorithm:
    """Remove the algorithm named ``name`` and return it."""
    for i, algorithm in enumerate(registered()):
        if algorithm.name == name:
            _GENERATION[0] += 1
            return _REGISTRY.pop(i)
    names = ", ".join(a.name for a in registered())
    raise ValueError(f"no algorithm named {name!r}; registered: {names}")


def pick(where: Where) -> Algorithm:
    """The first registered algorithm that applies to ``where``.

    A reduce_scatter asks only the algorithms that have a ``reduce_scatter``.
    """
    scatter = where.operation == "reduce_scatter"
    for algorithm in registered():
        if scatter and not hasattr(algorithm, "reduce_scatter"):
            continue
        if algorithm.applies(where):
            return algorithm
    names = ", ".join(a.name for a in registered())
    raise RuntimeError(  # pragma: no cover - "mpi" applies to everything
        f"no registered algorithm applies ({names}); register one that always applies last"
    )


def remembered_pick(
    memo: dict[int, tuple[Any, ...]],
    digest: int,
    known: tuple[Any, ...] | None,
    auto: bool,
    where: Callable[[], Where],
) -> tuple[Any, ...]:
    """The pick of the call with signature ``digest``, kept in ``memo`` (an engine's) as
    ``(algorithm, generation, environment version, HPCDIST_COLLECTIVES, HPCDIST_MPI_BAND)``.

    The engine uses a remembered pick while the registry's :func:`generation` and
    :data:`~hpcdist.collectives.choice.ENV_CHANGES` are as remembered, and calls this
    otherwise (``known``: the stale entry or ``None``): after an environment change
    the pick stands if the variables it read (``HPCDIST_COLLECTIVES`` when ``auto``,
    ``HPCDIST_MPI_BAND`` when :func:`~hpcdist.collectives.choice.mpi_band` was read)
    kept their values, else :func:`pick` runs again on ``where()``.
    """
    collectives, band = choice.steering_env()
    version = choice.env_version()
    if (
        known is not None
        and known[1] == generation()
        and (known[3] is _UNREAD or known[3] == collectives)
        and (known[4] is _UNREAD or known[4] == band)
    ):
        known = (known[0], known[1], version, known[3], known[4])  # not these variables
    else:
        reads = choice.band_reads()
        algorithm = pick(where())
        known = (
            algorithm, generation(), version, collectives if auto else _UNREAD,
            band if choice.band_reads() != reads else _UNREAD,
        )
        if len(memo) >= MEMO_SIZE:
            memo.clear()
    memo[digest] = known
    return known


def choose_route(
    asked: CI, size: int, nccl_ok: bool, cuda_aware: bool, nodes: int | None = None
) -> str:
    """The device algorithm the registry picks for a device call with these facts
    (``nodes``: default one rank per node); ``asked`` AUTO follows ``HPCDIST_COLLECTIVES``.

    Example:
        >>> choose_route(CI.AUTO, size=4, nccl_ok=False, cuda_aware=False)
        'staged'
        >>> choose_route(CI.NCCL, size=1, nccl_ok=True, cuda_aware=False)
        'nccl'
    """
    if asked is CI.AUTO:
        asked = env_implementation()
    nodes = size if nodes is None else nodes
    where = Where(
        None, CommunicationOptions(implementation=asked), asked, size, nodes, 1, None, True,
        nccl_ok and size > 1, cuda_aware and size > 1,
    )
    return pick(where).name
