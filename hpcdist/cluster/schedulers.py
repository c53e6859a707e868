"""Which batch scheduler runs this job, and whether this process is inside a job step.

SLURM (``SLURM_JOB_ID``), PBS and PALS (``PBS_JOBID``), LSF (``LSB_JOBID``) and
Flux (``FLUX_JOB_ID``), tried in the order of :data:`SCHEDULERS`. Pure
functions of the environment, like :mod:`hpcdist.cluster.launchers`.

Example:
    >>> detect_scheduler({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4"}).in_step
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpcdist.cluster.envparse import environ_or_default
from hpcdist.cluster.launchers import first_int, opt_int, slurm_step_id  # package-internal


@dataclass(frozen=True)
class SchedulerInfo:
    """The batch scheduler of this job.

    ``in_step`` is True inside a parallel launch (an srun step, a PALS
    ``mpiexec``, a jsrun, a Flux task) and False in the batch script itself.
    ``num_tasks``/``num_nodes`` are those of the step when in a step, else of
    the allocation; ``None`` when the scheduler does not say.

    Example:
        >>> SchedulerInfo("slurm", "42", 4, 2, True).in_step
        True
    """

    scheduler: str
    job_id: str | None
    num_tasks: int | None
    num_nodes: int | None
    in_step: bool


def _slurm(environ: Mapping[str, str]) -> SchedulerInfo:
    job_id = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID"))
    in_step = slurm_step_id(environ) is not None
    if in_step:
        tasks = first_int(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
        nodes = first_int(environ, ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
    else:
        tasks = first_int(environ, ("SLURM_NTASKS", "SLURM_NPROCS"))
        nodes = first_int(environ, ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
    return SchedulerInfo("slurm", job_id, tasks[1], nodes[1], in_step)


def _flux(environ: Mapping[str, str]) -> SchedulerInfo:
    return SchedulerInfo(
        "flux",
        environ.get("FLUX_JOB_ID"),
        opt_int(environ, "FLUX_JOB_SIZE"),
        opt_int(environ, "FLUX_JOB_NNODES"),
        "FLUX_TASK_RANK" in environ,
    )


def _pbs(environ: Mapping[str, str]) -> SchedulerInfo:
    return SchedulerInfo(
        "pbs",
        environ.get("PBS_JOBID"),
        opt_int(environ, "PBS_NP"),
        opt_int(environ, "PBS_NUM_NODES"),
        "PALS_RANKID" in environ,
    )


def _lsf(environ: Mapping[str, str]) -> SchedulerInfo:
    return SchedulerInfo(
        "lsf",
        environ.get("LSB_JOBID"),
        opt_int(environ, "LSB_DJOB_NUMPROC"),
        None,
        "JSM_NAMESPACE_RANK" in environ,
    )


#: Schedulers in the order they are tried: Flux first, as Flux commonly runs as
#: a nested instance inside a SLURM or LSF allocation and is then the one in charge.
SCHEDULERS = (
    ("FLUX_JOB_ID", _flux),
    ("SLURM_JOB_ID", _slurm),
    ("SLURM_JOBID", _slurm),
    ("PBS_JOBID", _pbs),
    ("LSB_JOBID", _lsf),
)


def detect_scheduler(environ: Mapping[str, str] | None = None) -> SchedulerInfo | None:
    """The batch scheduler of this job (``slurm``, ``pbs``, ``lsf``, ``flux``), or ``None``.

    Raises:
        LauncherConfigError: a count or ``SLURM_STEP_ID`` is malformed; the message names it.

    Example:
        >>> detect_scheduler({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4"})
        SchedulerInfo(scheduler='slurm', job_id='5', num_tasks=4, num_nodes=None, in_step=False)
    """
    environ = environ_or_default(environ)
    for variable, read in SCHEDULERS:
        if variable in environ:
            return read(environ)
    return None


__all__ = ["SCHEDULERS", "SchedulerInfo", "detect_scheduler"]
