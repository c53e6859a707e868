"""Pick the cluster resolver that fits how this process was started.

:func:`resolve` tries, in this order:

1. ``TF_CONFIG`` is set (and not blank) -> ``TFConfigClusterResolver``: an
   explicit description written by the user wins over anything inferred.
2. An MPI launcher's own variables are present (Open MPI's mpirun/mpiexec,
   MPICH/Intel Hydra, MVAPICH, Cray PALS, jsrun, Flux, a bare PMI/PMIx
   server), also when that launcher runs inside an sbatch allocation ->
   ``MPIClusterResolver``. See :mod:`hpcdist.cluster.launchers` for how the
   launcher's variables win over the ``SLURM_*`` ones it inherits.
3. Inside an srun step (with or without ``--mpi=pmix``/``pmi2``) ->
   ``SlurmClusterResolver``.
4. Otherwise -> ``MPIClusterResolver`` too, which then asks MPI itself for
   rank, size and node (it starts MPI). A plain ``python script.py`` (also in
   an sbatch script without srun) is a world of one, task ``worker`` 0; a
   launcher whose variables are not recognised still gives every rank its own
   task, instead of making each one a separate ``worker`` 0 and chief.

Example:
    >>> r = resolve(environ={})
    >>> type(r).__name__, r.cluster_spec().num_tasks("worker"), r.task_type, r.task_id
    ('MPIClusterResolver', 1, 'worker', 0)
    >>> describe_environment({"SLURM_JOB_ID": "3"})["resolver"]
    'MPIClusterResolver'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcdist.cluster.base import ClusterResolver
from hpcdist.cluster.envparse import environ_or_default
from hpcdist.cluster.launchers import (
    LaunchInfo,
    detect_launcher,
    slurm_step_id,
)
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.cluster.schedulers import detect_scheduler
from hpcdist.cluster.slurm import SlurmClusterResolver
from hpcdist.cluster.tfconfig import TFConfigClusterResolver
from hpcdist.errors import LauncherConfigError

TF_CONFIG_RESOLVER = "TFConfigClusterResolver"
MPI_RESOLVER = "MPIClusterResolver"
SLURM_RESOLVER = "SlurmClusterResolver"

#: Keyword arguments each resolver accepts from :func:`resolve`.
RESOLVER_KWARGS: dict[str, frozenset[str]] = {
    TF_CONFIG_RESOLVER: frozenset({"task_type", "task_id", "rpc_layer", "environment"}),
    MPI_RESOLVER: frozenset({"jobs", "port_base", "rpc_layer", "comm", "hosts"}),
    SLURM_RESOLVER: frozenset(
        {
            "jobs",
            "port_base",
            "gpus_per_node",
            "gpus_per_task",
            "tasks_per_node",
            "auto_set_gpu",
            "rpc_layer",
        }
    ),
}


def _choose(environ: Mapping[str, str]) -> tuple[str, str, LaunchInfo | None]:
    """(resolver class name, reason, launch info); raises on malformed launcher variables."""
    if environ.get("TF_CONFIG", "").strip():
        try:  # informational only: TF_CONFIG wins even over malformed launcher variables
            launch = detect_launcher(environ)
        except LauncherConfigError:
            launch = None
        return TF_CONFIG_RESOLVER, "TF_CONFIG is set", launch
    launch = detect_launcher(environ)
    if launch is not None and not launch.launcher.startswith("srun"):
        return (
            MPI_RESOLVER,
            f"the {launch.launcher} launcher's variables are present "
            f"(rank {launch.rank} of {launch.size})",
            launch,
        )
    if launch is not None:
        step = slurm_step_id(environ)
        return (
            SLURM_RESOLVER,
            f"inside srun step {step} ({launch.launcher}, rank {launch.rank} of {launch.size})",
            launch,
        )
    return (
        MPI_RESOLVER,
        "no TF_CONFIG, launcher variables or srun step: rank and size will come from MPI "
        "itself (a plain python run is a world of one)",
        None,
    )


def resolve(environ: Mapping[str, str] | None = None, **kwargs: Any) -> ClusterResolver:
    """The cluster resolver for this process, chosen in the order of the module docstring.

    ``kwargs`` go to the chosen resolver, those it does not take are dropped
    (see :data:`RESOLVER_KWARGS`): ``resolve(jobs={"ps": 1, "worker": 3})``
    applies the jobs under mpirun or srun and is ignored with ``TF_CONFIG``.

    Raises:
        TypeError: a keyword that no resolver takes.
        LauncherConfigError: a launcher variable is malformed.

    Example:
        >>> env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
        >>> r = resolve(env, hosts=["n1"], rpc_layer="grpc")
        >>> type(r).__name__, r.master()
        ('MPIClusterResolver', 'grpc://n1:8888')
    """
    known = frozenset().union(*RESOLVER_KWARGS.values())
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"resolve() got unexpected keyword arguments {unknown}; expected some of "
            f"{sorted(known)}"
        )
    name, _reason, _launch = _choose(environ_or_default(environ))
    args = {k: v for k, v in kwargs.items() if k in RESOLVER_KWARGS[name]}
    if name == TF_CONFIG_RESOLVER:
        return TFConfigClusterResolver(environ=environ, **args)
    if name == MPI_RESOLVER:
        return MPIClusterResolver(environ=environ, **args)

    return SlurmClusterResolver(environ=environ, **args)


def describe_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What was detected and which resolver :func:`resolve` would choose, and why.

    Never raises on malformed launcher variables: the message is under ``"error"``
    and ``"resolver"`` is ``None``. Never starts MPI: without launcher variables
    the resolver is ``MPIClusterResolver`` and ``rank``/``size`` stay ``None``
    (MPI would give them). Used by ``hpcdist info``.

    Example:
        >>> d = describe_environment({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
        ...     "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"})
        >>> d["launcher"], d["scheduler"], d["job_id"], d["resolver"]
        ('srun', 'slurm', '7', 'SlurmClusterResolver')
    """
    env = environ_or_default(environ)
    out: dict[str, Any] = {
        "launcher": None,
        "rank": None,
        "size": None,
        "local_rank": None,
        "local_size": None,
        "scheduler": None,
        "job_id": None,
        "in_step": None,
        "resolver": None,
        "reason": "",
        "error": None,
    }
    try:
        scheduler = detect_scheduler(env)
    except LauncherConfigError as e:
        scheduler = None
        out["error"] = str(e)
    if scheduler is not None:
        out.update(scheduler=scheduler.scheduler, job_id=scheduler.job_id)
        out["in_step"] = scheduler.in_step
    try:
        name, reason, launch = _choose(env)
    except LauncherConfigError as e:
        out.update(error=str(e), reason="the launcher variables are malformed")
        return out
    if launch is not None:
        out.update(
            launcher=launch.launcher,
            rank=launch.rank,
            size=launch.size,
            local_rank=launch.local_rank,
            local_size=launch.local_size,
        )
    out.update(resolver=name, reason=reason)
    return out


__all__ = ["resolve", "describe_environment", "RESOLVER_KWARGS"]
