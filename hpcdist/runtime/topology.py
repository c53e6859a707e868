"""Who and where this rank is: the world, its node, and the node leaders.

:func:`world` initialises MPI on its first call, builds the three
communicators once and checks the launch (see :mod:`hpcdist.runtime.checks`).

Virtual nodes:
    ``HPCDIST_VIRTUAL_NODES=N`` splits the ranks of each host into ``N``
    virtual nodes (contiguous blocks of local ranks), so that the hierarchical
    code paths (node communicator, node leaders) run on one machine. With
    ``mpirun -n 4`` and ``N=2`` there are two nodes of two ranks. ``N`` larger
    than the ranks on a host gives one rank per node.

Example:
    >>> w = world()
    >>> 0 <= w.rank < w.size and 0 <= w.node_index < w.node_count
    True
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hpcdist.cluster.envparse import environ_or_default, parse_uint
from hpcdist.cluster.gpus import (
    GPUBinding,
    bind_among_peers,
    count_gpus,
    parse_visible_devices,
    visible_devices_before_binding,
)
from hpcdist.errors import ClusterConfigError
from hpcdist.observe import recorder, timeline
from hpcdist.runtime.abort import install_abort_on_error
from hpcdist.runtime.checks import check_launch_everywhere
from hpcdist.runtime.failures import register_exit_guard
from hpcdist.runtime.mpi import mpi

#: The variable that splits each host into virtual nodes (see "Virtual nodes" above).
VIRTUAL_NODES_VAR = "HPCDIST_VIRTUAL_NODES"


@dataclass(frozen=True)
class World:
    """This rank's place in the job and the communicators that go with it.

    ``leaders_comm`` joins rank 0 of every node; it is ``None`` on other ranks.
    ``host_rank``/``host_size`` count the ranks of the whole host; they equal
    ``local_rank``/``local_size`` unless virtual nodes split the host.
    ``host_visible[i]`` is the ``CUDA_VISIBLE_DEVICES`` entries host rank ``i``
    saw (``None``: unset), and ``host_gpus`` the host's GPU count, asked only
    when some rank had the variable unset.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_index: int
    node_count: int
    hostname: str
    virtual_nodes: int
    host_rank: int
    host_size: int
    host_gpus: int | None
    host_visible: tuple[tuple[str, ...] | None, ...]
    comm: Any = field(repr=False)
    node_comm: Any = field(repr=False)
    leaders_comm: Any = field(repr=False)

    @property
    def is_node_leader(self) -> bool:
        """Whether this rank is local rank 0 of its node."""
        return self.local_rank == 0

    @property
    def is_chief(self) -> bool:
        """Whether this rank is rank 0 of the world, the one that prints and writes."""
        return self.rank == 0

    def gpu_binding(self, gpus_per_task: int | None = None) -> GPUBinding:
        """The GPUs of this rank, decided from what every rank of the host sees.

        Ranks that see the same ``CUDA_VISIBLE_DEVICES`` (or none, then the
        host's GPUs) split that list in host-rank order; a rank that sees a
        list of its own (the scheduler narrowed it) keeps it. Not collective:
        the lists were gathered when the world was built.

        Example: ``world().gpu_binding().visible`` is ``()`` on a machine without GPUs.
        """
        return bind_among_peers(
            self.host_visible, self.host_rank, gpus_per_task=gpus_per_task, num_gpus=self.host_gpus
        )

    def as_dict(self) -> dict[str, Any]:
        """The plain fields (every field but the communicators), for printing and JSON."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}


def virtual_nodes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The value of ``HPCDIST_VIRTUAL_NODES`` (1 when unset).

    Example: ``virtual_nodes_from_env({"HPCDIST_VIRTUAL_NODES": "2"}) == 2``.
    """
    text = environ_or_default(environ).get(VIRTUAL_NODES_VAR, "")
    if not text.strip():
        return 1  # one node per host
    return parse_uint(VIRTUAL_NODES_VAR + " (virtual nodes per host)", text, minimum=1)


def build_world(comm: Any = None, virtual_nodes: int | None = None) -> World:
    """Build a :class:`World` over ``comm`` (``COMM_WORLD``); collective over it.

    Also gathers, over each host, the ``CUDA_VISIBLE_DEVICES`` every rank saw
    and (only where some rank has it unset) the host's GPU count, asked once
    by the host's first rank, for :meth:`World.gpu_binding`.

    Example: ``build_world(virtual_nodes=2)`` under ``mpirun -n 4`` gives two nodes.
    """
    MPI = mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if virtual_nodes is None:
        virtual_nodes = virtual_nodes_from_env()
    if virtual_nodes < 1:
        raise ClusterConfigError(f"virtual_nodes is {virtual_nodes}; expected >= 1")
    rank, size = comm.Get_rank(), comm.Get_size()
    host_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    host_rank, host_size = host_comm.Get_rank(), host_comm.Get_size()
    own = parse_visible_devices(visible_devices_before_binding())
    host_visible = tuple(
        None if seen is None else tuple(seen)
        for seen in host_comm.allgather(None if own is None else tuple(own))
    )
    host_gpus = None
    if host_rank == 0 and None in host_visible:
        host_gpus = count_gpus()
    host_gpus = host_comm.bcast(host_gpus, root=0)
    if virtual_nodes > 1:
        color = host_rank * virtual_nodes // host_size
        node_comm = host_comm.Split(color, key=rank)
        host_comm.Free()
    else:
        node_comm = host_comm
    local_rank, local_size = node_comm.Get_rank(), node_comm.Get_size()
    leaders = comm.Split(0 if local_rank == 0 else MPI.UNDEFINED, key=rank)
    if local_rank == 0:
        node_index, node_count = leaders.Get_rank(), leaders.Get_size()
    else:
        node_index = node_count = -1
        leaders = None
    node_index, node_count = node_comm.bcast((node_index, node_count), root=0)
    return World(
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        node_index=node_index,
        node_count=node_count,
        hostname=socket.gethostname(),
        virtual_nodes=virtual_nodes,
        host_rank=host_rank,
        host_size=host_size,
        host_gpus=host_gpus,
        host_visible=host_visible,
        comm=comm,
        node_comm=node_comm,
        leaders_comm=leaders,
    )


_WORLD: World | None = None
_WORLD_LOCK = threading.Lock()


def world() -> World:
    """The process-wide :class:`World`, built on first use (thread-safe).

    The first call, on every rank:

    1. starts MPI and checks the launch on every rank; if any rank finds a
       mistake, every rank raises (none is left waiting in a collective);
    2. in a world of more than one rank, makes an uncaught exception abort the
       whole job (see :mod:`hpcdist.runtime.abort`);
    3. builds the world, node and node-leader communicators, and gathers what
       each host's ranks see of its GPUs.

    Example: ``hpcdist.runtime.world().size``.
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    with _WORLD_LOCK:
        if _WORLD is None:
            comm = mpi().COMM_WORLD
            check_launch_everywhere(comm)
            if comm.Get_size() > 1:
                install_abort_on_error(comm)
                register_exit_guard()
            _WORLD = build_world(comm)
            recorder.configure(_WORLD.rank, _WORLD.size)  # flight recorder: rank, dump signals
            timeline.start_from_environment(_WORLD.rank, _WORLD.size, comm)  # HPCDIST_TIMELINE
    return _WORLD
