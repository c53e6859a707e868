"""TF's multi-worker role rules as plain functions of ``(cluster_spec, task_type, task_id)``.

The rules follow ``tf.distribute``'s multi-worker semantics:

- the jobs of a cluster are ``chief``, ``worker``, ``ps`` and ``evaluator``;
  at most one ``chief`` task and at most one ``evaluator`` task;
- the ``chief`` task is the chief; without a ``chief`` task, ``worker`` 0 is
  (task id 0, also in a sparse worker job, as in TF); an ``evaluator`` runs on
  its own and is the chief of itself;
- the workers of a synchronous cluster are the chief plus the workers, numbered
  chief first (``id_in_cluster``); parameter servers are not workers.

A run without a cluster (an empty spec) is a single task and its own chief.

Example:
    >>> spec = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]}
    >>> is_chief(spec, "worker", 0), worker_count(spec, "worker"), id_in_cluster(spec, "worker", 1)
    (False, 3, 2)
    >>> collective_leader(spec, "worker", 1)
    '/job:chief/replica:0/task:0'
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcdist.cluster.envparse import short
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.errors import ClusterConfigError

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
TASK_TYPES: tuple[str, ...] = (CHIEF, WORKER, PS, EVALUATOR)
"""The task types (job names) of a multi-worker cluster, as in TF."""

ClusterLike = ClusterSpec | Mapping | None


def _spec(cluster_spec: ClusterLike) -> ClusterSpec:
    return cluster_spec if isinstance(cluster_spec, ClusterSpec) else ClusterSpec(cluster_spec)


def _has_chief(spec: ClusterSpec) -> bool:
    return CHIEF in spec.jobs and spec.num_tasks(CHIEF) > 0


def validate_task(cluster_spec: ClusterLike, task_type: str | None, task_id: int | None) -> None:
    """Check that ``(task_type, task_id)`` is a valid task of a multi-worker cluster.

    Raises :class:`~hpcdist.errors.ClusterConfigError` when the cluster has a job
    other than chief/worker/ps/evaluator, more than one chief or evaluator task,
    when the task type is unknown or not a job of the cluster (an evaluator may
    be outside the cluster), or when the task id is not a task of its job.
    ``task_type=None`` is only valid for an empty cluster (a single-task run).

    Example:
        >>> validate_task({"worker": ["a:1", "b:1"]}, "worker", 1)
        >>> validate_task({"worker": ["a:1"]}, "worker", 1)
        Traceback (most recent call last):
        ...
        hpcdist.errors.ClusterConfigError: task_id 1 is not a task of job 'worker'; ...
    """
    spec = _spec(cluster_spec)
    unknown_jobs = [job for job in spec.jobs if job not in TASK_TYPES]
    if unknown_jobs:
        raise ClusterConfigError(
            f"cluster has jobs {short(unknown_jobs, 200)} that a multi-worker cluster does not "
            f"allow; allowed jobs are {list(TASK_TYPES)}; rename or remove them"
        )
    for job in (CHIEF, EVALUATOR):
        if job in spec.jobs and spec.num_tasks(job) > 1:
            raise ClusterConfigError(
                f"cluster job {job!r} has {spec.num_tasks(job)} tasks; "
                f"expected at most one {job} task"
            )
    if task_type is None:
        if spec:
            raise ClusterConfigError(
                f"task_type is None but the cluster has jobs {short(spec.jobs, 200)}; "
                f"give the task type and id of this task (one of {list(TASK_TYPES)})"
            )
        return
    if task_type not in TASK_TYPES:
        raise ClusterConfigError(
            f"task_type {short(task_type)} is not a known task type; "
            f"expected one of {list(TASK_TYPES)}"
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        raise ClusterConfigError(
            f"task_id of a {task_type!r} task is {short(task_id)}; expected a non-negative integer"
        )
    if task_type not in spec.jobs:
        if task_type == EVALUATOR:
            return  # an evaluator may run outside the training cluster
        raise ClusterConfigError(
            f"task_type {short(task_type)} is not a job of the cluster; the jobs are "
            f"{short(spec.jobs, 200)}"
        )
    if task_id not in spec.task_indices(task_type):
        raise ClusterConfigError(
            f"task_id {short(task_id)} is not a task of job {short(task_type)}; "
            f"its task ids are {short(spec.task_indices(task_type), 200)}"
        )


def is_chief(cluster_spec: ClusterLike, task_type: str | None, task_id: int | None) -> bool:
    """Whether this task is the chief: it logs, writes summaries and checkpoints.

    The chief task is the chief; without a chief task, worker 0 is (as in TF, a
    sparse worker job without index 0 has no chief); an evaluator is the chief
    of itself; a run without a cluster is its own chief. A ``chief`` job of 0
    tasks counts as no chief (TF would then have no chief at all).

    Example:
        >>> is_chief({"worker": ["a:1", "b:1"]}, "worker", 0)
        True
        >>> is_chief({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0)
        False
    """
    spec = _spec(cluster_spec)
    validate_task(spec, task_type, task_id)
    if not spec or task_type in (CHIEF, EVALUATOR):
        return True
    return task_type == WORKER and not _has_chief(spec) and task_id == 0


def worker_count(cluster_spec: ClusterLike, task_type: str | None) -> int:
    """Number of workers that train together, as seen from a task of ``task_type``.

    Chief and workers count together; an evaluator counts only the evaluator
    job (1 when it runs outside the cluster); a ps task is not a worker and
    raises :class:`~hpcdist.errors.ClusterConfigError`. An empty cluster has one.

    Example:
        >>> worker_count({"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]}, "chief")
        3
    """
    spec = _spec(cluster_spec)
    if not spec and task_type is None:
        return 1
    indices = spec.task_indices(task_type) if task_type in spec.jobs else []
    validate_task(spec, task_type, indices[0] if indices else 0)
    if task_type == EVALUATOR:
        return spec.num_tasks(EVALUATOR) if EVALUATOR in spec.jobs else 1
    if task_type == PS:
        raise ClusterConfigError(
            "worker_count is asked for task_type 'ps'; parameter servers are not workers; "
            "ask for 'chief', 'worker' or 'evaluator'"
        )
    return sum(spec.num_tasks(job) for job in (CHIEF, WORKER) if job in spec.jobs)


def id_in_cluster(cluster_spec: ClusterLike, task_type: str | None, task_id: int | None) -> int:
    """Index of this task among the workers: chief 0, worker ``i`` is ``i`` + number of chiefs.

    An evaluator's id is its own index; a ps task has no id and raises
    :class:`~hpcdist.errors.ClusterConfigError`. A run without a cluster is 0.

    Example:
        >>> id_in_cluster({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "worker", 1)
        2
    """
    spec = _spec(cluster_spec)
    validate_task(spec, task_type, task_id)
    if task_type is None:
        return 0
    index = int(task_id)  # type: ignore[arg-type]  # an int: checked by validate_task
    if task_type == CHIEF:
        return 0
    if task_type == WORKER:
        return index + (spec.num_tasks(CHIEF) if CHIEF in spec.jobs else 0)
    if task_type == EVALUATOR:
        return index
    raise ClusterConfigError(
        f"id_in_cluster is asked for task_type {task_type!r}; only chief, worker and "
        f"evaluator tasks have an id among the workers"
    )


def collective_leader(cluster_spec: ClusterLike, task_type: str | None, task_id: int | None) -> str:
    """Device name of the task that leads collectives, or ``""`` when there is none.

    The chief leads when there is one, else worker 0 (task id 0, as in TF, also
    when the worker job is sparse). An evaluator, an empty cluster and a
    cluster without chief or worker tasks have no leader.

    Example:
        >>> collective_leader({"worker": ["a:1", "b:1"]}, "worker", 1)
        '/job:worker/replica:0/task:0'
        >>> collective_leader({}, None, None)
        ''
    """
    spec = _spec(cluster_spec)
    if not spec:
        return ""
    validate_task(spec, task_type, task_id)
    if task_type == EVALUATOR:
        return ""
    if _has_chief(spec):
        return f"/job:{CHIEF}/replica:0/task:0"
    if WORKER in spec.jobs and spec.num_tasks(WORKER):
        return f"/job:{WORKER}/replica:0/task:0"
    return ""


def should_save_checkpoint(
    cluster_spec: ClusterLike, task_type: str | None, task_id: int | None
) -> bool:
    """Whether this task writes checkpoints: the chief only (never an evaluator).

    Example:
        >>> should_save_checkpoint({"worker": ["a:1", "b:1"]}, "worker", 1)
        False
    """
    return task_type != EVALUATOR and is_chief(cluster_spec, task_type, task_id)


def should_load_checkpoint(
    cluster_spec: ClusterLike, task_type: str | None, task_id: int | None
) -> bool:
    """Whether this task reads checkpoints itself: the chief (which then broadcasts
    the values to the workers) and an evaluator, which is the chief of itself.

    Example:
        >>> should_load_checkpoint({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0)
        True
    """
    return is_chief(cluster_spec, task_type, task_id)


__all__ = [
    "CHIEF",
    "EVALUATOR",
    "PS",
    "TASK_TYPES",
    "WORKER",
    "collective_leader",
    "id_in_cluster",
    "is_chief",
    "should_load_checkpoint",
    "should_save_checkpoint",
    "validate_task",
    "worker_count",
]
