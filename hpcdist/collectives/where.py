"""The facts an algorithm decides from (:class:`Where`), and the algorithm protocol.

The engine's front gathers plain facts about a call — host or device
arrays, the implementation asked for, the world's size and nodes, the
fused layout, whether NCCL is usable and MPI CUDA-aware — and asks the
registry (:mod:`hpcdist.collectives.registry`); each algorithm's
``applies(where)`` decides from these facts alone, the first that says yes
runs. Nothing is decided before the registry is asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from hpcdist.collectives import choice
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session, Topology


class Where(NamedTuple):
    """What an algorithm's ``applies`` sees of one call: plain facts."""

    #: The call's fusion layout (groups, ``nbytes``, ``op``, ``shapes``). ``None`` when
    #: the front asks which device transport a broadcast, allgather or reduce_scatter takes.
    layout: Layout | None
    options: CommunicationOptions  # the call's merged options
    #: The implementation asked for: the options', or ``HPCDIST_COLLECTIVES``'s for AUTO.
    implementation: CI
    size: int  # ranks of the communicator
    nodes: int = 1  # nodes they are on
    largest_node: int = 1  # ranks on the fullest node
    topology: Topology | None = None  # the session's (None in a world of one)
    device: bool = False  # the call's arrays are device (GPU) arrays
    #: Device calls: NCCL is usable (several ranks, a provider found, no two ranks on one GPU).
    nccl: bool = False
    cuda_aware: bool = False  # device calls: MPI takes device pointers
    operation: str = "allreduce"  # or "reduce_scatter"

    @property
    def auto(self) -> bool:
        """The call asked for AUTO (and ``HPCDIST_COLLECTIVES`` named no implementation)."""
        return self.implementation is CI.AUTO

    @property
    def backend(self) -> CI:
        """The host backend the implementation asked for comes to here: ``MPI``, ``SHM``
        (one node, ranks sharing memory) or ``HIERARCHICAL`` (see
        :func:`~hpcdist.collectives.choice.choose`)."""
        return choice.choose(
            self.implementation, self.nodes, self.size, self.largest_node, _NO_ENV
        )

    @property
    def window(self) -> Any:
        """This node's shared window (``None``: no rank to share memory with)."""
        return None if self.topology is None else self.topology.window


_NO_ENV: dict[str, str] = {}  # (the implementation is already the environment's)


@runtime_checkable
class Algorithm(Protocol):
    """An allreduce algorithm: a ``name``, ``applies(where)`` and ``allreduce(...)``.

    ``allreduce(session, items, layout, opts)`` returns one reduced wire-dtype
    buffer per group of ``layout`` (device buffers for device calls). An optional
    ``reduce_scatter(session, items, layout, opts, bounds)`` returns this rank's
    block ``[bounds[rank], bounds[rank + 1])`` of the one-tensor ``layout``.
    """

    name: str

    def applies(self, where: Where) -> bool:
        """Whether this algorithm runs the call ``where`` describes."""
        ...

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """The reduced wire-dtype buffer of each group of ``layout``."""
        ...
