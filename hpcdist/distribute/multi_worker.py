"""``MultiWorkerMirroredStrategy``: synchronous training over all MPI ranks.

Every MPI rank is a worker; its replicas are its GPUs (bound by
:meth:`hpcdist.runtime.World.gpu_binding`) or the CPU, or the devices given
with the hpcdist keyword ``devices`` (e.g. two logical CPU devices per rank).
The cluster comes from :func:`hpcdist.cluster.detect.resolve` (TF_CONFIG,
SLURM, MPI launchers) and must describe exactly the ranks of the MPI job.
Replica ``i`` of the worker with id ``w`` (chief 0, then workers) is replica
``w * k + i`` of ``num_replicas_in_sync = k * W``.

Constructing the strategy is collective: every rank must construct it.

Example:
    >>> import hpcdist as hd
    >>> s = hd.MultiWorkerMirroredStrategy()  # a plain python run: one worker
    >>> s.num_replicas_in_sync, s.extended.experimental_between_graph
    (1, True)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from hpcdist.cluster.base import ClusterResolver
from hpcdist.cluster.detect import resolve
from hpcdist.cluster.gpus import parse_visible_devices
from hpcdist.cluster.roles import id_in_cluster, worker_count
from hpcdist.collectives import CommunicationImplementation, CommunicationOptions
from hpcdist.collectives.engine import Collectives
from hpcdist.distribute.devices import Device, canonical_devices, check_devices_exist
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.strategy import Strategy
from hpcdist.errors import ClusterConfigError, LaunchError
from hpcdist.runtime import mpi, world
from hpcdist.runtime.checks import shared_gpu_advice, shared_gpu_problems


def _options(communication_options: Any, communication: Any) -> CommunicationOptions:
    if communication_options is None:
        communication_options = CommunicationOptions()
    if not isinstance(communication_options, CommunicationOptions):
        raise TypeError(
            "communication_options must be a hpcdist.experimental.CommunicationOptions, got "
            f"{type(communication_options).__name__}"
        )
    if communication is not None:
        implementation = CommunicationImplementation.from_any(communication)
        communication_options = communication_options.merge(
            CommunicationOptions(implementation=implementation)
        )
    return communication_options


def _worker_id(resolver: ClusterResolver) -> tuple[int, int, str, int]:
    """``(workers, this worker's id, job, task)`` from the resolver's cluster and task."""
    spec = resolver.cluster_spec()
    task_type, task_id = resolver.task_type, resolver.task_id
    if not spec.jobs:
        return 1, 0, task_type or "worker", task_id or 0
    return (
        worker_count(spec, task_type),
        id_in_cluster(spec, task_type, task_id),
        task_type or "worker",
        int(task_id or 0),
    )


def _process_ordinals(binding: Any, environ: Any = None) -> tuple[int, ...]:
    """This process's CUDA numbers of the GPUs ``binding`` gives the rank.

    ``binding.ordinals`` count from 0 as if ``CUDA_VISIBLE_DEVICES`` were already
    narrowed to the rank's GPUs; when it is not (plain ``mpirun`` on a node with
    several GPUs), rank k's GPU is found in the list the process sees now, so
    that the ranks of a node use different GPUs.

    Example:
        >>> from hpcdist.cluster.gpus import GPUBinding
        >>> b = GPUBinding(("2",), (0,), False, "host GPUs")
        >>> _process_ordinals(b, {}), _process_ordinals(b, {"CUDA_VISIBLE_DEVICES": "0,2"})
        ((2,), (1,))
    """
    environ = os.environ if environ is None else environ
    current = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    if current is None:  # every GPU of the host is visible, numbered as the host numbers them
        found = [int(v) for v in binding.visible if v.isdigit()]
    else:
        found = [current.index(v) for v in binding.visible if v in current]
    return tuple(found) if len(found) == len(binding.visible) else tuple(binding.ordinals)


def _pci_bus_id(index: int) -> str | None:
    """The PCI bus id of CUDA device ``index`` (``None`` without CuPy or that device)."""
    try:
        import cupy  # lazy: optional GPU dependency (CuPy)

        return str(cupy.cuda.Device(index).pci_bus_id)
    except Exception:  # no CuPy, no driver, no such device: fall back to the visible list
        return None


def _physical_gpus(local: Sequence[Device]) -> list[str]:
    """Host-wide ids of this worker's GPUs: PCI bus ids, else ``CUDA_VISIBLE_DEVICES`` entries.

    The PCI bus id tells GPUs apart even where each task sees its own GPU as
    device 0 (SLURM with ``ConstrainDevices``, which also renumbers
    ``CUDA_VISIBLE_DEVICES`` to ``0`` in every task).
    """
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    ids = []
    for d in local:
        if d.device_type == "GPU":
            index = d.index or 0
            bus = _pci_bus_id(index)
            if bus is not None:
                ids.append(bus)
            else:
                ids.append(visible[index] if visible and index < len(visible) else str(index))
    return ids


class _WorkerView(NamedTuple):
    """What each rank tells the others in :func:`_agree` (the first four ``None`` on an error)."""

    workers: Any  # chief+worker tasks in the cluster
    worker: Any  # this rank's worker id
    job: Any
    task: Any
    num_local: int  # local replicas
    error: str | None  # the resolver's error, reported on every rank
    where: tuple[str, list[str]]  # host name and physical GPU ids


def _agree(comm: Any, resolver: ClusterResolver, local: Sequence[Device]) -> tuple[int, str, int]:
    """Check on every rank that the cluster matches the MPI job; collective.

    Returns this rank's worker id, job and task. Every rank raises the same
    error when any rank's view disagrees (including two ranks of a host on
    one GPU), so none is left waiting.
    """
    num_local = len(local)
    where = (mpi().Get_processor_name(), _physical_gpus(local))
    try:
        mine = _WorkerView(*_worker_id(resolver), num_local, None, where)
    except Exception as error:  # reported collectively below
        failed = f"{type(error).__name__}: {error}"
        mine = _WorkerView(None, None, None, None, num_local, failed, where)
    views: list[_WorkerView] = comm.allgather(mine)
    shared = shared_gpu_problems([v.where for v in views])
    if shared:
        raise LaunchError(
            "MultiWorkerMirroredStrategy: " + "; ".join(shared) + ". " + shared_gpu_advice()
        )
    size = comm.Get_size()
    problems = [f"rank {r}: {v.error}" for r, v in enumerate(views) if v.error]
    if not problems:
        counts = {v.workers for v in views}
        ids = sorted(v.worker for v in views)
        if counts != {size}:
            problems.append(
                f"the cluster has {sorted(counts)} chief+worker tasks but the MPI job has "
                f"{size} ranks; every rank must be one worker"
            )
        elif ids != list(range(size)):
            by_rank = [v.worker for v in views]
            problems.append(f"worker ids {by_rank} (by rank) are not 0..{size - 1}")
        locals_ = {v.num_local for v in views}
        if len(locals_) > 1:
            problems.append(
                f"ranks have different numbers of local replicas {[v.num_local for v in views]}; "
                "every worker needs the same number of devices"
            )
    if problems:
        raise ClusterConfigError(
            "MultiWorkerMirroredStrategy: the cluster does not match the MPI job: "
            + "; ".join(problems)
        )
    return mine.worker, mine.job, mine.task


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous replicas on every MPI rank (``tf.distribute.MultiWorkerMirroredStrategy``).

    ``communication_options`` (a :class:`CommunicationOptions`) tunes the
    collectives; the old TF argument ``communication`` sets its
    implementation. ``devices`` (an hpcdist addition, like TF's test-only
    ``_from_local_devices``) gives each rank's local devices, e.g.
    ``["/cpu:0", "/cpu:1"]`` for two replicas per rank on CPUs.

    Example: ``strategy = hd.MultiWorkerMirroredStrategy()`` under ``mpirun -n 4``.
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
        *,
        communication: CommunicationImplementation | str | None = None,
        devices: Sequence[str | Device] | None = None,
    ) -> None:
        options = _options(communication_options, communication)
        w = world()
        resolver = resolve() if cluster_resolver is None else cluster_resolver
        local = self._local_devices(w, devices)
        worker, job, task = _agree(w.comm, resolver, local)
        comm = w.comm if worker == w.rank else w.comm.Split(0, key=worker)
        if options.implementation is CommunicationImplementation.NCCL and any(
            d.device_type != "GPU" for d in local
        ):
            raise ValueError(
                "communication implementation NCCL needs GPU devices, but this worker's "
                f"devices are {[d.short for d in local]}; use AUTO or RING on CPUs"
            )
        local = canonical_devices(
            [Device(None, None, None, d.device_type, d.index) for d in local], job=job, task=task
        )
        extended = StrategyExtended(
            self,
            local,
            worker_index=worker,
            num_workers=w.size,
            collectives=Collectives(comm, options),
            between_graph=True,
            cluster_resolver=resolver,
            communication_options=options,
        )
        super().__init__(extended)

    @classmethod
    def _from_local_devices(
        cls,
        devices: Sequence[str | Device],
        communication_options: CommunicationOptions | None = None,
    ) -> MultiWorkerMirroredStrategy:
        """TF's test helper: the strategy with these local devices on every worker."""
        return cls(communication_options=communication_options, devices=devices)

    @staticmethod
    def _local_devices(w: Any, devices: Sequence[str | Device] | None) -> tuple[Device, ...]:
        if devices is not None:
            return check_devices_exist(canonical_devices(devices))
        binding = w.gpu_binding()
        if binding.ordinals:
            return tuple(Device("localhost", 0, 0, "GPU", i) for i in _process_ordinals(binding))
        return (Device("localhost", 0, 0, "CPU", 0),)

    def __repr__(self) -> str:
        ext = self._extended
        return (
            f"<MultiWorkerMirroredStrategy worker={ext._worker_index}/{ext._num_workers} "
            f"local_devices=[{', '.join(d.short for d in ext._devices)}]>"
        )
