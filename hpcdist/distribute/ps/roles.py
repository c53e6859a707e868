"""Who is who in a parameter-server job: the ps, worker and chief ranks of the MPI world.

Every rank's resolver names its task (``ps`` 0, ``worker`` 2, ...); the ranks
share those names once (collective) and build the same :class:`PSRoles`.

Example:
    >>> r = PSRoles(comm=None, rank=1, ps_ranks=(0,), worker_ranks=(1, 2), chief_rank=None,
    ...             task_type="worker", task_id=0)
    >>> r.is_worker, r.worker_index, r.clients
    (True, 0, (1, 2))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcdist.cluster.roles import CHIEF, EVALUATOR, PS, WORKER
from hpcdist.errors import ClusterConfigError


@dataclass(frozen=True)
class PSRoles:
    """The roles of a parameter-server job, as world ranks of ``comm``.

    ``ps_ranks[i]`` is ``ps`` task ``i``, ``worker_ranks[i]`` is ``worker``
    task ``i``; ``chief_rank`` is the chief (the coordinator) or ``None``.

    Example: ``roles.ps_ranks[var_id % len(roles.ps_ranks)]`` holds a variable.
    """

    comm: Any
    rank: int
    ps_ranks: tuple[int, ...]
    worker_ranks: tuple[int, ...]
    chief_rank: int | None
    task_type: str
    task_id: int

    @property
    def is_ps(self) -> bool:
        """Whether this rank is a parameter server."""
        return self.task_type == PS

    @property
    def is_worker(self) -> bool:
        """Whether this rank is a worker."""
        return self.task_type == WORKER

    @property
    def is_chief(self) -> bool:
        """Whether this rank is the chief (the coordinator)."""
        return self.task_type == CHIEF

    @property
    def worker_index(self) -> int | None:
        """This worker's task id, ``None`` on the chief and the ps."""
        return self.task_id if self.is_worker else None

    @property
    def clients(self) -> tuple[int, ...]:
        """The ranks that talk to the ps: the chief (if any), then the workers."""
        chief = () if self.chief_rank is None else (self.chief_rank,)
        return chief + self.worker_ranks


def roles_from_tasks(comm: Any, tasks: list[tuple[str, int]]) -> PSRoles:
    """Build the roles from every rank's ``(task_type, task_id)`` (index = rank); checked.

    Raises :class:`~hpcdist.errors.ClusterConfigError` when a task is named twice,
    a job has gaps, there is no ps or no worker, or a task type is not allowed.

    Example:
        >>> roles_from_tasks(None, [("ps", 0), ("worker", 0), ("worker", 1)]).ps_ranks
        (0,)
    """
    rank = 0 if comm is None else comm.Get_rank()
    problems = []
    by_job: dict[str, dict[int, int]] = {}
    for r, (job, task) in enumerate(tasks):
        if job not in (CHIEF, PS, WORKER):
            hint = " (run an evaluator as its own job)" if job == EVALUATOR else ""
            problems.append(f"rank {r} is task {job!r} {task}, not chief, ps or worker{hint}")
            continue
        slot = by_job.setdefault(job, {})
        if task in slot:
            problems.append(f"ranks {slot[task]} and {r} are both task {job!r} {task}")
        slot[task] = r
    for job, slot in by_job.items():
        if sorted(slot) != list(range(len(slot))):
            n = len(slot)
            problems.append(f"the {job!r} tasks of the ranks are {sorted(slot)}, not 0..{n - 1}")
    if len(by_job.get(CHIEF, {})) > 1:
        problems.append(f"there are {len(by_job[CHIEF])} chief tasks; expected at most one")
    for job in (PS, WORKER):
        if not by_job.get(job):
            problems.append(f"no rank is a {job!r} task; a parameter-server job needs at least one")
    if problems:
        layout = ", ".join(f"rank {r}: {j} {t}" for r, (j, t) in enumerate(tasks))
        raise ClusterConfigError(
            "ParameterServerStrategy: bad layout: " + "; ".join(problems) + f" ({layout}). "
            "Give the roles with TF_CONFIG or e.g. "
            "hd.cluster_resolver.MPIClusterResolver(jobs={'ps': 1, 'worker': 3})"
        )
    ps = by_job[PS]
    workers = by_job[WORKER]
    chief = by_job.get(CHIEF, {})
    job, task = tasks[rank]
    return PSRoles(
        comm=comm,
        rank=rank,
        ps_ranks=tuple(ps[i] for i in range(len(ps))),
        worker_ranks=tuple(workers[i] for i in range(len(workers))),
        chief_rank=chief.get(0),
        task_type=job,
        task_id=task,
    )


__all__ = ["PSRoles", "roles_from_tasks"]
