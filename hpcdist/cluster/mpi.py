"""MPIClusterResolver: the cluster of an MPI launch (mpirun, mpiexec, PALS, jsrun, Flux).

Rank, size and local rank come from the launcher's variables
(:func:`hpcdist.cluster.launchers.detect_launcher`); without any, from MPI
itself (``mpi4py``, started by the MPI bootstrap that :mod:`hpcdist.runtime`
registers with :func:`set_mpi_provider`; the cluster layer never imports the
runtime layer above it). Ranks are given to jobs in sorted job-name order, as TF's
``SlurmClusterResolver`` does (:func:`hpcdist.cluster.base.assign_jobs`): with
``jobs={"ps": 2, "worker": 6}`` ranks 0-1 are ``ps`` 0-1 and ranks 2-7 are
``worker`` 0-5. Every task listens on ``host:port_base + local_rank``, the
local rank counted in rank order among the ranks of a host (as MPI's
shared-memory split numbers them). Each rank derives every address from the
host list alone, so all ranks agree; a launcher may number its own local ranks
in another order (Open MPI 5, oversubscribed, gave ranks 0-3 the local ranks
0, 2, 1, 3), which :attr:`MPIClusterResolver.local_rank` reports unchanged.

Creating an ``MPIClusterResolver`` without ``hosts`` is collective over
``comm`` (``MPI.COMM_WORLD`` by default): the host names are gathered then, so
every rank must create one, as every rank creates a communicator.

Example:
    >>> env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
    ...        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    >>> r = MPIClusterResolver(jobs={"chief": 1, "worker": 3}, environ=env,
    ...                        hosts=["a", "a", "b", "b"])
    >>> r.task_type, r.task_id, r.master()
    ('worker', 2, 'b:8889')
    >>> r.cluster_spec().as_dict()
    {'chief': ['a:8888'], 'worker': ['a:8889', 'b:8888', 'b:8889']}
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from hpcdist.cluster.base import ClusterResolver, assign_jobs, task_of_rank
from hpcdist.cluster.envparse import short
from hpcdist.cluster.gpus import bind_gpus
from hpcdist.cluster.launchers import LaunchInfo, detect_launcher
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.errors import ClusterConfigError, LauncherConfigError, NotRegisteredError

#: The launcher name reported when the world came from MPI itself.
MPI_FALLBACK = "mpi"


# The function that returns ``mpi4py.MPI`` (starting MPI on its first call). The runtime
# layer sets it when it is imported (``import hpcdist`` always imports it), so this
# module stays a pure function of the environment and the communicator it is given.
_mpi_provider: Callable[[], ModuleType] | None = None


def set_mpi_provider(provider: Callable[[], ModuleType]) -> None:
    """Set the function that starts MPI and returns ``mpi4py.MPI`` (the runtime's bootstrap).

    :mod:`hpcdist.runtime.mpi` registers :func:`hpcdist.runtime.mpi.mpi` here when it
    is imported; a resolver created without launcher variables or ``comm`` calls it.

    Example:
        >>> from hpcdist.runtime.mpi import mpi
        >>> set_mpi_provider(mpi)
    """
    global _mpi_provider
    _mpi_provider = provider


def _mpi() -> Any:
    """``mpi4py.MPI``, started by hpcdist's bootstrap (which sets the thread level)."""
    if _mpi_provider is None:
        raise NotRegisteredError(
            "MPIClusterResolver needs MPI (no launcher variables and no comm were given), "
            "but no MPI bootstrap is registered; expected hpcdist.runtime to be imported "
            "(`import hpcdist` does it), or pass comm= or hosts= and launcher variables"
        )
    return _mpi_provider()


def _world_from_mpi(comm: Any) -> tuple[Any, LaunchInfo]:
    """Rank, size and node-local rank/size from MPI (``comm`` or ``COMM_WORLD``)."""
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
    finally:
        node.Free()
    info = LaunchInfo(MPI_FALLBACK, comm.Get_rank(), comm.Get_size(), local_rank, local_size, None)
    return comm, info


class MPIClusterResolver(ClusterResolver):
    """Cluster resolver for a job started by an MPI launcher.

    Args:
        jobs: job name -> number of tasks; default ``{"worker": size}``. The
            counts must add up to the number of ranks; a job of 0 tasks is
            kept as an empty job, as TF's ``SlurmClusterResolver`` keeps it.
        port_base: port of local rank 0 on each host; local rank ``i`` uses
            ``port_base + i`` (all within 1..65535).
        rpc_layer: protocol prefix of :meth:`master` (``"grpc"``), or ``None``.
        environ: the variables to read (``os.environ`` by default).
        comm: an mpi4py communicator; used to gather host names and, without
            launcher variables, for rank and size (``MPI.COMM_WORLD`` when needed).
        hosts: host name of every rank, in rank order. When not given, they
            are gathered over ``comm`` here, in the constructor: a collective
            call that every rank of ``comm`` must make.

    Raises:
        ClusterConfigError: ``jobs``, ``port_base`` or ``hosts`` is malformed, or
            the job counts do not add up to the size.
        LauncherConfigError: a launcher variable is malformed, or the
            communicator's size is not the launcher's.

    Example:
        >>> r = MPIClusterResolver(environ={"PMI_RANK": "0", "PMI_SIZE": "1",
        ...                                 "MPI_LOCALRANKID": "0"}, hosts=["n1"])
        >>> r.launcher, r.cluster_spec().as_dict()
        ('hydra', {'worker': ['n1:8888']})
    """

    detect_order = 1
    resolve_kwargs = frozenset({"jobs", "port_base", "rpc_layer", "comm", "hosts"})

    @classmethod
    def detected(
        cls, environ: Mapping[str, str], launch: Callable[[], LaunchInfo | None]
    ) -> str | None:
        """An MPI launcher's variables (not srun's), or none at all: MPI then says."""
        info = launch()
        if info is None:
            return (
                "no TF_CONFIG, launcher variables or srun step: rank and size will come from "
                "MPI itself (a plain python run is a world of one)"
            )
        if info.launcher.startswith("srun"):
            return None
        return (
            f"the {info.launcher} launcher's variables are present "
            f"(rank {info.rank} of {info.size})"
        )

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        rpc_layer: str | None = None,
        environ: Mapping[str, str] | None = None,
        comm: Any = None,  # an mpi4py communicator; cluster never imports mpi4py itself
        hosts: Sequence[str] | None = None,
    ) -> None:
        self._environ = environ
        self._rpc_layer = rpc_layer
        self._comm = comm
        info = detect_launcher(self.environ)
        if info is None:
            self._comm, info = _world_from_mpi(comm)
        self._info = info
        self._hosts = self._check_hosts(self._gather_hosts() if hosts is None else hosts)
        self._spec = assign_jobs(
            jobs, self._hosts, port_base, ClusterConfigError, f"the launch ({info.launcher})"
        )
        self._task_type, self._task_id = task_of_rank(self._spec, info.rank)

    def _check_hosts(self, hosts: Sequence[str]) -> list[str]:
        if isinstance(hosts, str) or len(hosts) != self._info.size:
            raise ClusterConfigError(
                f"hosts has {1 if isinstance(hosts, str) else len(hosts)} entries; expected one "
                f"host name per rank, {self._info.size} in rank order"
            )
        for host in hosts:
            if not isinstance(host, str) or not host:
                raise ClusterConfigError(
                    f"hosts contains {short(host)}; expected host name strings"
                )
        return list(hosts)

    def _gather_hosts(self) -> list[str]:
        """Every rank's host name, gathered over ``comm`` (a collective call)."""
        if self._comm is None:
            self._comm = _mpi().COMM_WORLD
        gathered = self._comm.allgather(socket.gethostname().lower())
        if len(gathered) != self._info.size:
            raise LauncherConfigError(
                f"the communicator has {len(gathered)} ranks but the launcher "
                f"({self._info.launcher}) says {self._info.size}; expected the same world. "
                f"Launch with the MPI library's own launcher, or pass hosts="
            )
        return gathered

    # -- ClusterResolver ----------------------------------------------------------------
    def cluster_spec(self) -> ClusterSpec:
        """Every task's ``host:port_base + i``, ``i`` its position among its host's ranks.

        Example: hosts ``["a", "b", "a"]`` give ``["a:8888", "b:8888", "a:8889"]``.
        """
        return ClusterSpec(self._spec)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """``{"GPU": n}``, ``n`` the GPUs this rank gets among the ranks of its node.

        The node's GPUs (``CUDA_VISIBLE_DEVICES``, else the machine's) are split
        by local rank as :func:`~hpcdist.cluster.gpus.bind_gpus` does; ``{}``
        without GPUs. Where the launcher gives no local rank, every visible GPU.
        """
        local_rank, local_size = self._info.local_rank, self._info.local_size
        if local_rank is None or local_size is None:
            return self._visible_gpus()
        count = len(bind_gpus(local_rank, local_size, environ=self.environ).visible)
        return {"GPU": count} if count else {}

    # -- extras ---------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the launch."""
        return self._info.rank

    @property
    def size(self) -> int:
        """The number of ranks in the launch."""
        return self._info.size

    @property
    def local_rank(self) -> int | None:
        """This process's rank among the ranks on its node (``None`` if unknown)."""
        return self._info.local_rank

    @property
    def local_size(self) -> int | None:
        """The number of ranks on this node (``None`` if unknown)."""
        return self._info.local_size

    @property
    def launcher(self) -> str:
        """The launcher's name (``"openmpi"``, ``"hydra"``, ... or ``"mpi"`` from MPI itself)."""
        return self._info.launcher

    @property
    def launch_info(self) -> LaunchInfo:
        """Everything read about the launch."""
        return self._info


__all__ = ["MPIClusterResolver", "MPI_FALLBACK", "set_mpi_provider"]
