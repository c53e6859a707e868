"""The ordered registry of reduction algorithms that AUTO walks, host and device.

An *algorithm* is one module under :mod:`hpcdist.collectives.algorithms`
with an object that follows :class:`Algorithm`:

* ``name``: a short unique name (``"shm"``, ``"mpi"``, ``"nccl"``, ...);
* ``applies(where) -> bool``: whether it can and should run this call;
  ``where`` (a :class:`Where`) holds the engine's :class:`Topology`, the
  call's fusion layout, its merged options, the route that
  :func:`hpcdist.collectives.choice.choose` gives for the implementation
  asked (``MPI``, ``SHM`` or ``HIERARCHICAL``), whether the call asked
  for ``AUTO``, whether its arrays are on a device (``device``; then
  ``device_route`` is :func:`hpcdist.collectives.device_path.choose_route`'s
  answer) and the operation (``"allreduce"`` or ``"reduce_scatter"``);
* ``allreduce(engine, items, layout, opts) -> list``: run it, returning one
  reduced wire-dtype buffer per group of ``layout`` (NumPy for host calls,
  device buffers for device calls), through the engine's public interface
  (:meth:`~hpcdist.collectives.Collectives.topology`,
  :meth:`~hpcdist.collectives.Collectives.run_agreed`,
  :meth:`~hpcdist.collectives.Collectives.run_on_node`,
  :meth:`~hpcdist.collectives.Collectives.device_path`, ...);
* optionally ``reduce_scatter(engine, items, layout, opts, bounds) -> np.ndarray``:
  this rank's block ``[bounds[rank], bounds[rank + 1])`` of the reduced
  (one-tensor) layout. Only algorithms that have it are asked about a
  reduce_scatter.

The engine asks the algorithms in registry order and runs the first whose
``applies`` says yes (as Horovod's ``OperationManager`` does). A host
algorithm says no to device calls (``where.device``) and a device one to
host calls; ``mpi`` (host) and ``device-staged`` (device) apply to every
call of their kind, so every call finds one. An algorithm that AUTO may pick
must give every rank bitwise the same result.

Example:
    >>> [a.name for a in registered()]  # doctest: +NORMALIZE_WHITESPACE
    ['device-copy', 'nccl', 'nccl-hierarchical', 'mpi-device', 'device-staged',
     'small', 'mpi-direct', 'shm', 'hierarchical', 'mpi']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives, Topology
    from hpcdist.collectives.fusion import Layout


class Where(NamedTuple):
    """What an algorithm's ``applies`` sees of one call."""

    topology: Topology
    layout: Layout
    options: CommunicationOptions
    route: CI  # MPI, SHM or HIERARCHICAL: choice.choose's answer for the asked implementation
    auto: bool  # the call asked for AUTO (and HPCDIST_COLLECTIVES did not name a backend)
    size: int  # ranks of the engine's communicator
    device: bool = False  # the call's arrays are device (GPU) arrays
    device_route: str | None = None  # device calls: choose_route's answer ("nccl", ...)
    operation: str = "allreduce"  # or "reduce_scatter"


@runtime_checkable
class Algorithm(Protocol):
    """The protocol of an allreduce algorithm (see the module docstring)."""

    name: str

    def applies(self, where: Where) -> bool:
        """Whether this algorithm runs the call ``where`` describes."""
        ...

    def allreduce(
        self,
        engine: Collectives,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[Any]:
        """The reduced wire-dtype buffer of each group of ``layout``."""
        ...


_REGISTRY: list[Any] = []
_GENERATION = [0]  # bumped by register/unregister: engines pick again


def generation() -> int:
    """A number that changes whenever the registry does (engines cache their picks by it).

    Example: ``before = generation(); register(a); generation() != before``.
    """
    return _GENERATION[0]


def _defaults() -> list[Any]:
    # lazy: the algorithm modules import this one (Where) and the engine's helpers
    from hpcdist.collectives.algorithms import (
        device_copy,
        device_mpi,
        device_staged,
        hierarchical,
        mpi,
        mpi_direct,
        nccl,
        nccl_hierarchical,
        shm,
        small,
    )

    return [
        device_copy.ALGORITHM, nccl.ALGORITHM, nccl_hierarchical.ALGORITHM, device_mpi.ALGORITHM,
        device_staged.ALGORITHM,
        small.ALGORITHM, mpi_direct.ALGORITHM, shm.ALGORITHM, hierarchical.ALGORITHM,
        mpi.ALGORITHM,
    ]


def registered() -> tuple[Algorithm, ...]:
    """The algorithms, in the order AUTO asks them.

    Example: ``registered()[-1].name == "mpi"`` (the one that always applies).
    """
    if not _REGISTRY:
        _REGISTRY.extend(_defaults())
    return tuple(_REGISTRY)


def register(algorithm: Algorithm, before: str | None = None) -> None:
    """Add ``algorithm`` before the one named ``before`` (default: first of all).

    Example: ``register(MyAlgorithm(), before="shm")``; undo with :func:`unregister`.
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm is {algorithm!r}; expected an object with name, applies(where) and "
            "allreduce(engine, items, layout, opts) (hpcdist.collectives.registry.Algorithm)"
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
    """Remove the algorithm named ``name`` and return it.

    Example: ``unregister("mpi-direct")`` (put it back with :func:`register`).
    """
    for i, algorithm in enumerate(registered()):
        if algorithm.name == name:
            _GENERATION[0] += 1
            return _REGISTRY.pop(i)
    names = ", ".join(a.name for a in registered())
    raise ValueError(f"no algorithm named {name!r}; registered: {names}")


def pick(where: Where) -> Algorithm:
    """The first registered algorithm that applies to ``where``.

    A reduce_scatter asks only the algorithms that have a ``reduce_scatter``.
    Example: ``pick(where).name`` is ``"shm"`` for a 1 MiB call on one node.
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
