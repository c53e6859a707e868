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

from hpcdist.cluster.base import ClusterResolver, detectable_resolvers
from hpcdist.cluster.envparse import environ_or_default
from hpcdist.cluster.launchers import LaunchInfo, detect_launcher
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.cluster.schedulers import detect_scheduler
from hpcdist.cluster.slurm import SlurmClusterResolver
from hpcdist.cluster.tfconfig import TFConfigClusterResolver
from hpcdist.errors import ClusterConfigError, LauncherConfigError

# The resolvers register by class (``detect_order``); importing them is what registers them.
BUILT_IN = (TFConfigClusterResolver, MPIClusterResolver, SlurmClusterResolver)


def _choose(environ: Mapping[str, str]) -> tuple[type[ClusterResolver], str, LaunchInfo | None]:
    """(resolver class, reason, launch info); raises on malformed launcher variables.

    The launcher's variables are read when a resolver asks for them, so a resolver
    tried earlier (``TF_CONFIG``) wins even over malformed ones.
    """
    read: list[LaunchInfo | None] = []

    def launch() -> LaunchInfo | None:
        if not read:
            read.append(detect_launcher(environ))
        return read[0]

    for cls in detectable_resolvers():
        reason = cls.detected(environ, launch)
        if reason is not None:
            break
    else:  # MPIClusterResolver fits whenever srun's SlurmClusterResolver does not
        names = [c.__name__ for c in detectable_resolvers()]
        raise ClusterConfigError(
            f"none of the registered cluster resolvers {names} fits this environment; "
            "pass a cluster resolver to the strategy"
        )
    if not read:
        try:  # informational only
            launch()
        except LauncherConfigError:
            read.append(None)
    return cls, reason, read[0]


def resolve(environ: Mapping[str, str] | None = None, **kwargs: Any) -> ClusterResolver:
    """The cluster resolver for this process, chosen in the order of the module docstring.

    ``kwargs`` go to the chosen resolver, those it does not take are dropped
    (each resolver class lists its own in ``resolve_kwargs``):
    ``resolve(jobs={"ps": 1, "worker": 3})`` applies the jobs under mpirun or
    srun and is ignored with ``TF_CONFIG``.

    Raises:
        TypeError: a keyword that no resolver takes.
        LauncherConfigError: a launcher variable is malformed.

    Example:
        >>> env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
        >>> r = resolve(env, hosts=["n1"], rpc_layer="grpc")
        >>> type(r).__name__, r.master()
        ('MPIClusterResolver', 'grpc://n1:8888')
    """
    known = frozenset().union(*(cls.resolve_kwargs for cls in detectable_resolvers()))
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"resolve() got unexpected keyword arguments {unknown}; expected some of "
            f"{sorted(known)}"
        )
    cls, _reason, _launch = _choose(environ_or_default(environ))
    args = {k: v for k, v in kwargs.items() if k in cls.resolve_kwargs}
    return cls(environ=environ, **args)  # type: ignore[call-arg]


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
        cls, reason, launch = _choose(env)
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
    out.update(resolver=cls.__name__, reason=reason)
    return out


__all__ = ["resolve", "describe_environment"]
