"""``SlurmClusterResolver``: the cluster of an ``srun`` job step, from ``SLURM_*`` variables.

Follows ``tf.distribute.cluster_resolver.SlurmClusterResolver`` (same
arguments, ``jobs`` laid over the ranks in sorted job-name order, addresses
``host:port_base+i`` for the ``i``-th task on a host, GPUs split evenly over a
node's tasks) with these differences, each one a fix:

* Hosts stay in SLURM's node-list order and ranks follow SLURM's task
  distribution (``block`` by default; ``cyclic`` and ``plane`` from
  ``SLURM_DISTRIBUTION``). TF sorts host names as strings, which puts
  ``node10`` before ``node9`` and gives tasks addresses on the wrong hosts.
  ``--distribution=arbitrary`` is refused (its layout is not in the
  environment). Where SLURM says which node this task runs on
  (``SLURM_NODEID``) the layout is checked against it.
* Heterogeneous steps (``srun ... : ...``, ``SLURM_HET_SIZE`` or the older
  ``SLURM_PACK_SIZE``) are ranked component by component, each component's
  nodes taken from ``SLURM_JOB_NODELIST_HET_GROUP_<k>`` (or ``_PACK_GROUP_``);
  the step's own node list is sorted across components and cannot be used
  as it is.
* Every inconsistency raises a :class:`~hpcdist.errors.SlurmConfigError` (or
  :class:`~hpcdist.errors.GPUBindingError` for GPUs) naming the variable,
  instead of silently dropping tasks or GPUs. Both are ``ValueError``.
* A process started by another launcher inside the allocation (``mpirun`` or
  ``mpiexec``, whose rank and size, read by
  :func:`~hpcdist.cluster.launchers.find_launcher`, disagree with
  ``SLURM_PROCID`` and the step's task count) or in the batch script of a
  multi-task job (no srun step by
  :func:`~hpcdist.cluster.launchers.slurm_step_id`) is refused, not given a
  wrong rank.
* GPUs are bound by one rule, :func:`~hpcdist.cluster.gpus.bind_gpus`: a
  ``CUDA_VISIBLE_DEVICES`` that srun visibly gave to this task alone is kept
  whole (``srun --gpus-per-task=2`` keeps 2 GPUs), any other list is split
  by local rank; too few GPUs for an explicit ``gpus_per_task`` is an
  error, too few otherwise are shared.

Example:
    >>> env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
    ...        "SLURM_STEP_NUM_TASKS": "4",
    ...        "SLURM_STEP_NODELIST": "node[9-10]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    ...        "CUDA_VISIBLE_DEVICES": ""}
    >>> r = SlurmClusterResolver(jobs={"ps": 1, "worker": 3}, environ=env)
    >>> r.cluster_spec().as_dict()
    {'ps': ['node9:8888'], 'worker': ['node9:8889', 'node10:8888', 'node10:8889']}
    >>> r.get_task_info(), r.master()
    (('worker', 2), 'grpc://node10:8889')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping

from hpcdist.cluster import gpus as _gpus
from hpcdist.cluster.base import ClusterResolver, assign_jobs, task_of_rank
from hpcdist.cluster.envparse import check_int_arg, parse_uint, short
from hpcdist.cluster.hostlist import expand_hostlist, expand_tasks_per_node
from hpcdist.cluster.launchers import LaunchInfo, find_launcher, slurm_step_id
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.errors import GPUBindingError, LauncherConfigError, SlurmConfigError

#: The most tasks a step may have (a bound against absurd values, not a SLURM limit).
MAX_TASKS = 10_000_000

_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_NTASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
_HET_SIZE_VARS = ("SLURM_HET_SIZE", "SLURM_PACK_SIZE")
_HET_NODELIST_VARS = (
    "SLURM_JOB_NODELIST_HET_GROUP_{k}",
    "SLURM_JOB_NODELIST_PACK_GROUP_{k}",
    "SLURM_NODELIST_HET_GROUP_{k}",
    "SLURM_NODELIST_PACK_GROUP_{k}",
)
_SRUN_HINT = "run the program with srun (inside salloc or an sbatch script)"


# -- reading variables -------------------------------------------------------------------


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of ``names`` that is set, with its value."""
    for name in names:
        value = environ.get(name)
        if value is not None:
            return name, value
    return None


def _to_int(name: str, value: str, minimum: int = 0) -> int:
    return parse_uint(name, value, SlurmConfigError, minimum)


def _hostlist(name: str, value: str) -> list[str]:
    try:
        hosts = expand_hostlist(value)
    except SlurmConfigError as e:
        raise SlurmConfigError(f"{name}: {e}") from None
    if not hosts:
        raise SlurmConfigError(
            f"{name} is {short(value)}, an empty node list; expected e.g. 'n[1-4]'"
        )
    return hosts


def _user_counts(tasks_per_node: object, hosts: list[str] | None) -> tuple[list[str], list[int]]:
    """Hosts and counts from the ``tasks_per_node`` argument (an int or ``{host: count}``)."""
    if isinstance(tasks_per_node, Mapping):
        for host, count in tasks_per_node.items():
            if not isinstance(host, str) or isinstance(count, bool) or not isinstance(count, int):
                raise SlurmConfigError(
                    f"tasks_per_node must map host names to integers; found "
                    f"{short(host)}: {short(count)}"
                )
            check_int_arg(f"tasks_per_node[{short(host)}]", count, 0, SlurmConfigError)
        if hosts is None:
            return list(tasks_per_node), list(tasks_per_node.values())
        missing = [h for h in dict.fromkeys(hosts) if h not in tasks_per_node]
        unknown = [h for h in tasks_per_node if h not in set(hosts)]
        if missing or unknown:
            raise SlurmConfigError(
                f"tasks_per_node does not match the node list {short(hosts, 200)}: missing "
                f"hosts {short(missing, 200)}, hosts not in the step {short(unknown, 200)}; "
                f"give a count for each node"
            )
        return hosts, [tasks_per_node[h] for h in hosts]
    if isinstance(tasks_per_node, bool) or not isinstance(tasks_per_node, int):
        raise SlurmConfigError(
            f"tasks_per_node must be an integer or a dict {{host: count}}; "
            f"found {type(tasks_per_node).__name__}"
        )
    check_int_arg("tasks_per_node", tasks_per_node, 1, SlurmConfigError)
    if hosts is None:
        raise SlurmConfigError(
            f"tasks_per_node={short(tasks_per_node)} needs a node list, but none of "
            f"{', '.join(_NODELIST_VARS)} is set; {_SRUN_HINT}"
        )
    return hosts, [tasks_per_node] * len(hosts)


def _distribution(environ: Mapping[str, str]) -> tuple[str, int]:
    """The node-level task distribution of the step and its plane size."""
    raw = environ.get("SLURM_DISTRIBUTION", "")
    kind = raw.split(":", 1)[0].split(",", 1)[0].strip().lower()
    if kind in ("", "block", "*"):
        return "block", 0
    if kind == "cyclic":
        return "cyclic", 0
    if kind == "plane" or kind.startswith("plane="):
        size_text = kind[len("plane=") :] if "=" in kind else None
        name = "SLURM_DIST_PLANESIZE"
        if size_text is not None:
            name = f"the plane size of SLURM_DISTRIBUTION={short(raw)}"
        else:
            size_text = environ.get(name)
            if size_text is None:
                raise SlurmConfigError(
                    "SLURM_DISTRIBUTION is 'plane' but SLURM_DIST_PLANESIZE is not set; "
                    "expected the plane size that srun --distribution=plane=<size> sets"
                )
        return "plane", _to_int(name, size_text, minimum=1)
    if kind == "arbitrary":
        raise SlurmConfigError(
            "SLURM_DISTRIBUTION is 'arbitrary': the task layout comes from a host file that "
            "the environment does not show; pass tasks_per_node and use block order, or use "
            "the MPI launcher's resolver instead"
        )
    raise SlurmConfigError(
        f"SLURM_DISTRIBUTION is {short(raw)}; expected block, cyclic or plane (optionally "
        f"followed by ':<socket distribution>')"
    )


def _slurm_gpus_per_task(environ: Mapping[str, str]) -> int | None:
    """``SLURM_GPUS_PER_TASK`` (``"2"``, ``"a100:2"``, ``"volta:3,kepler:1"``) as a number.

    ``None`` when unset or blank; a list of typed counts gives their sum.

    Raises:
        GPUBindingError: a count is not a whole number.

    Example:
        >>> _slurm_gpus_per_task({"SLURM_GPUS_PER_TASK": "volta:3,kepler:1"})
        4
    """
    value = environ.get("SLURM_GPUS_PER_TASK")
    if value is None or not value.strip():
        return None
    total = 0
    for item in value.split(","):
        count = item.strip().rsplit(":", 1)[-1]
        if not count.isascii() or not count.isdigit():
            raise GPUBindingError(
                f"SLURM_GPUS_PER_TASK is {short(value)}; expected a GPU count such as '2' or "
                f"'a100:2' (as given to --gpus-per-task): unset or correct it"
            )
        total += parse_uint("SLURM_GPUS_PER_TASK", count, GPUBindingError)
    return total


def _order(slots: list[tuple[str, int]], kind: str, plane: int) -> list[str]:
    """The host of each rank when ``slots`` ((host, count), in node order) are filled."""
    if kind == "block":
        return [host for host, count in slots for _ in range(count)]
    chunk = 1 if kind == "cyclic" else plane
    left = [count for _, count in slots]
    out: list[str] = []
    while any(left):
        for i, (host, _) in enumerate(slots):
            take = min(chunk, left[i])
            out.extend([host] * take)
            left[i] -= take
    return out


def _het_slots(
    environ: Mapping[str, str], hosts: list[str], counts: list[int], step_var: str
) -> list[list[tuple[str, int]]] | None:
    """The step's (host, count) pairs grouped by heterogeneous component, in component order.

    ``None`` for an ordinary step. SLURM sorts a heterogeneous step's node list
    across components, while its ranks go component by component.
    """
    found = _first(environ, _HET_SIZE_VARS)
    if found is None:
        return None
    size = _to_int(*found)
    if size <= 1 or len(set(hosts)) != len(hosts):
        # One component; or nodes shared by components, where SLURM keeps the
        # node list unsorted, in component order.
        return None
    remaining = dict(zip(hosts, counts, strict=True))
    groups: list[list[tuple[str, int]]] = []
    for k in range(size):
        names = tuple(v.format(k=k) for v in _HET_NODELIST_VARS)
        var = _first(environ, names)
        if var is None:
            raise SlurmConfigError(
                f"{found[0]}={short(found[1])} but {names[0]} is not set; a heterogeneous job "
                f"needs each component's node list to order its ranks"
            )
        group = [(h, remaining.pop(h)) for h in _hostlist(*var) if h in remaining]
        groups.append(group)
    if remaining:
        raise SlurmConfigError(
            f"hosts {short(sorted(remaining), 200)} of {step_var} belong to no component of "
            f"the heterogeneous job ({found[0]}={short(found[1])}); the "
            f"SLURM_JOB_NODELIST_HET_GROUP_<k> "
            f"variables do not match the step"
        )
    return groups


class _Layout:
    """Where each rank of the step runs: ``rank_hosts[r]`` and the node list."""

    def __init__(self, environ: Mapping[str, str], tasks_per_node: object) -> None:
        found = _first(environ, _NODELIST_VARS)
        hosts = _hostlist(*found) if found is not None else None
        self.nodelist_var = found[0] if found else "tasks_per_node"
        ntasks_found = _first(environ, _NTASKS_VARS)
        self.ntasks_var = ntasks_found[0] if ntasks_found else None
        ntasks = _to_int(*ntasks_found) if ntasks_found else None

        self.user_counts = tasks_per_node is not None
        if tasks_per_node is not None:
            hosts, counts = _user_counts(tasks_per_node, hosts)
            counts_var = "tasks_per_node"
        elif hosts is None:
            raise SlurmConfigError(
                f"none of {', '.join(_NODELIST_VARS)} is set, so the nodes of the job are "
                f"unknown; {_SRUN_HINT}"
            )
        else:
            assert found is not None  # the hosts came from it
            tpn = _first(environ, _TASKS_PER_NODE_VARS)
            if tpn is not None:
                try:
                    counts = expand_tasks_per_node(tpn[1])
                except SlurmConfigError as e:
                    raise SlurmConfigError(f"{tpn[0]}: {e}") from None
                counts_var = f"{tpn[0]}={short(tpn[1])}"
            elif len(hosts) == 1 and ntasks is not None:
                counts, counts_var = [ntasks], str(self.ntasks_var)
            else:
                raise SlurmConfigError(
                    f"none of {', '.join(_TASKS_PER_NODE_VARS)} is set, so the tasks of each "
                    f"node are unknown; {_SRUN_HINT}, or pass tasks_per_node"
                )
            if len(counts) != len(hosts):
                raise SlurmConfigError(
                    f"{counts_var} gives task counts for {len(counts)} nodes but "
                    f"{self.nodelist_var}={short(found[1])} lists {len(hosts)} nodes; the two "
                    f"must describe the same nodes"
                )
        total = sum(counts)
        if total > MAX_TASKS:
            raise SlurmConfigError(
                f"{counts_var} adds up to {short(total)} tasks, more than {MAX_TASKS:,}; "
                f"check it for a typo"
            )
        if total == 0:
            raise SlurmConfigError(f"{counts_var} gives no task at all; expected >= 1 task")
        if ntasks is not None and ntasks != total:
            raise SlurmConfigError(
                f"{self.ntasks_var}={ntasks} but {counts_var} adds up to {total} tasks on "
                f"{len(hosts)} nodes; the task count and the tasks per node must agree"
            )
        self.hosts = hosts
        self.ntasks = total
        kind, plane = _distribution(environ)
        groups = _het_slots(environ, hosts, counts, self.nodelist_var)
        self.heterogeneous = groups is not None
        if groups is None:
            groups = [list(zip(hosts, counts, strict=True))]
        self.rank_hosts = [h for group in groups for h in _order(group, kind, plane)]


# -- the resolver ------------------------------------------------------------------------


class SlurmClusterResolver(ClusterResolver):
    """The cluster of the current SLURM job step, read from ``SLURM_*`` variables.

    Args:
        jobs: ``{job_name: task_count}``; defaults to ``{"worker": ntasks}``.
            Ranks are given to jobs in sorted job-name order, and the counts
            must add up to the step's task count; a job of 0 tasks is kept
            as an empty job, as in TF.
        port_base: the port of the first task on each host; the ``i``-th
            task on a host listens on ``port_base + i`` (all within 1..65535).
        gpus_per_node: GPUs on each node, used where ``CUDA_VISIBLE_DEVICES``
            is unset (the GPUs are then ordinals ``0 .. gpus_per_node - 1``)
            and for TF's check that ``gpus_per_task`` times a node's tasks
            fits; defaults to :func:`~hpcdist.cluster.gpus.count_gpus`.
        gpus_per_task: GPUs per task; defaults to ``SLURM_GPUS_PER_TASK``,
            else an even share of the GPUs this node's tasks see
            (:func:`~hpcdist.cluster.gpus.bind_gpus`).
        tasks_per_node: an int for every node, or ``{host: count}``; defaults
            to ``SLURM_STEP_TASKS_PER_NODE`` (``SLURM_TASKS_PER_NODE``).
        auto_set_gpu: set ``CUDA_VISIBLE_DEVICES`` in ``environ`` to this
            task's GPUs (:func:`~hpcdist.cluster.gpus.apply_binding`) where
            the binding changes what the task sees.
        rpc_layer: the protocol prefix of :meth:`master`.
        environ: the variables to read (and write ``CUDA_VISIBLE_DEVICES``
            to, when mutable); ``os.environ`` by default.

    Besides TF's methods it has read-only ``rank``, ``num_tasks``,
    ``local_rank``, ``local_size``, ``hosts``, ``task_hosts``,
    ``gpus_per_node``, ``gpus_per_task`` and ``gpu_binding``.

    Raises:
        SlurmConfigError: not inside an ``srun`` step (no ``SLURM_PROCID``,
            or the batch script of a multi-task job), started by another
            launcher, a variable is malformed or inconsistent with another, or
            an argument is invalid.
        GPUBindingError: more GPUs are asked for (``gpus_per_task``,
            ``SLURM_GPUS_PER_TASK``) than a node has or this task sees.

    Example:
        >>> env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        ...        "SLURM_STEP_NUM_TASKS": "4",
        ...        "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
        >>> r = SlurmClusterResolver(gpus_per_node=4, environ=env)
        >>> r.task_type, r.task_id, r.num_accelerators(), env["CUDA_VISIBLE_DEVICES"]
        ('worker', 1, {'GPU': 2}, '2,3')
    """

    detect_order = 2
    resolve_kwargs = frozenset(
        {
            "jobs",
            "port_base",
            "gpus_per_node",
            "gpus_per_task",
            "tasks_per_node",
            "auto_set_gpu",
            "rpc_layer",
        }
    )

    @classmethod
    def detected(
        cls, environ: Mapping[str, str], launch: Callable[[], LaunchInfo | None]
    ) -> str | None:
        """Inside an srun step (with or without ``--mpi=pmix``/``pmi2``)."""
        info = launch()
        if info is None or not info.launcher.startswith("srun"):
            return None
        step = slurm_step_id(environ)
        return f"inside srun step {step} ({info.launcher}, rank {info.rank} of {info.size})"

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        gpus_per_node: int | None = None,
        gpus_per_task: int | None = None,
        tasks_per_node: int | Mapping[str, int] | None = None,
        auto_set_gpu: bool = True,
        rpc_layer: str | None = "grpc",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._environ = environ
        self._rpc_layer = rpc_layer
        check_int_arg("port_base", port_base, 1, SlurmConfigError)
        if gpus_per_node is not None:
            check_int_arg("gpus_per_node", gpus_per_node, 0, GPUBindingError)
        if gpus_per_task is not None:
            check_int_arg("gpus_per_task", gpus_per_task, 0, GPUBindingError)
        env = self.environ

        procid = env.get("SLURM_PROCID")
        if procid is None:
            raise SlurmConfigError(
                f"SLURM_PROCID is not set: not inside a SLURM job step; {_SRUN_HINT}"
            )
        self._rank = _to_int("SLURM_PROCID", procid)
        layout = _Layout(env, tasks_per_node)
        if self._rank >= layout.ntasks:
            counted_by = layout.ntasks_var or "the tasks per node"
            raise SlurmConfigError(
                f"SLURM_PROCID={self._rank} but the step has {layout.ntasks} tasks "
                f"(from {counted_by}); expected a rank below {layout.ntasks}"
            )
        _check_in_step(env, layout.ntasks)
        _check_other_launcher(env, self._rank, layout.ntasks)
        self._hosts = layout.hosts
        self._rank_hosts = layout.rank_hosts
        host = layout.rank_hosts[self._rank]
        if not (layout.heterogeneous or layout.user_counts):
            _check_node_id(env, layout, self._rank, host)

        self._tasks_on_host = dict(Counter(layout.rank_hosts))
        self._local_size = self._tasks_on_host[host]
        self._local_rank = layout.rank_hosts[: self._rank].count(host)
        counted_by = layout.ntasks_var or "the tasks per node"
        self._spec = assign_jobs(
            jobs, layout.rank_hosts, port_base, SlurmConfigError, f"the step ({counted_by})"
        )
        self._task_type, self._task_id = task_of_rank(self._spec, self._rank)

        self._gpu_binding: _gpus.GPUBinding | None = None
        self._resolve_gpus(gpus_per_node, gpus_per_task, auto_set_gpu)

    # -- GPUs ------------------------------------------------------------------------------
    def _resolve_gpus(
        self, gpus_per_node: int | None, gpus_per_task: int | None, auto_set_gpu: bool
    ) -> None:
        """One decision: :func:`~hpcdist.cluster.gpus.bind_gpus` for this task, then applied."""
        env = self.environ
        per_task = gpus_per_task if gpus_per_task is not None else _slurm_gpus_per_task(env)
        if gpus_per_node is not None and per_task:
            for h, count in self._tasks_on_host.items():
                if per_task * count > gpus_per_node:  # TF's "more GPUs per node than available"
                    raise GPUBindingError(
                        f"node {h} runs {count} tasks with {per_task} GPU(s) each, "
                        f"{per_task * count} GPUs, but gpus_per_node is {gpus_per_node}; "
                        f"pass gpus_per_task={gpus_per_node // count} or run at most "
                        f"{gpus_per_node // per_task} tasks per node"
                    )
        visible = _gpus.parse_visible_devices(_gpus.visible_devices_before_binding(env))
        num_gpus = gpus_per_node
        if num_gpus is None and visible is None:
            num_gpus = _gpus.count_gpus()
        binding = _gpus.bind_gpus(
            self._local_rank, self._local_size, per_task, environ=env, num_gpus=num_gpus
        )
        # (num_gpus is None only where visible is not)
        self._gpus_per_node = num_gpus if num_gpus is not None else len(visible or ())
        self._gpus_per_task = len(binding.visible)
        if not auto_set_gpu:
            return
        self._gpu_binding = binding
        if visible is not None:
            changed = binding.visible != tuple(visible)
        else:  # unset: all GPUs show, so only a share (or hiding them) changes anything
            changed = bool(binding.visible) or not binding.narrowed
        if changed and isinstance(env, MutableMapping):
            _gpus.apply_binding(binding, env)

    # -- ClusterResolver API -------------------------------------------------------------------
    def cluster_spec(self) -> ClusterSpec:
        """The jobs and addresses of the step, e.g. ``{"worker": ["n9:8888", "n10:8888"]}``."""
        return ClusterSpec(self._spec)

    def get_task_info(self) -> tuple[str | None, int | None]:
        """``(task_type, task_id)`` of this task, e.g. ``("worker", 3)``."""
        return self.task_type, self.task_id

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """This task's GPUs, ``{"GPU": gpus_per_task}`` (TF reports ``gpus_per_task`` too)."""
        return {"GPU": self._gpus_per_task}

    # -- extra read-only facts -----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This task's global rank (``SLURM_PROCID``)."""
        return self._rank

    @property
    def num_tasks(self) -> int:
        """The number of tasks of the step."""
        return len(self._rank_hosts)

    @property
    def local_rank(self) -> int:
        """This task's index among the tasks on its host."""
        return self._local_rank

    @property
    def local_size(self) -> int:
        """The number of tasks on this task's host."""
        return self._local_size

    @property
    def hosts(self) -> list[str]:
        """The step's nodes in SLURM's order."""
        return list(self._hosts)

    @property
    def task_hosts(self) -> list[str]:
        """The host of every rank, indexed by rank."""
        return list(self._rank_hosts)

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node as given, else this task's ``CUDA_VISIBLE_DEVICES`` entries, else
        :func:`~hpcdist.cluster.gpus.count_gpus` (per task where SLURM bound GPUs to tasks)."""
        return self._gpus_per_node

    @property
    def gpus_per_task(self) -> int:
        """This task's GPUs: ``gpus_per_task`` when given, else as bound."""
        return self._gpus_per_task

    @property
    def gpu_binding(self) -> _gpus.GPUBinding | None:
        """This task's GPUs when ``auto_set_gpu`` is on, else ``None``."""
        return self._gpu_binding


# -- checks ------------------------------------------------------------------------------


def _check_in_step(environ: Mapping[str, str], ntasks: int) -> None:
    """Refuse the batch script (or salloc shell) of a multi-task job: it is no task of it.

    A step is what :func:`~hpcdist.cluster.launchers.slurm_step_id` says it is, so
    that this resolver and launcher detection always agree.
    """
    try:
        step = slurm_step_id(environ)
    except LauncherConfigError as e:
        raise SlurmConfigError(str(e)) from None
    if step is not None or ntasks <= 1:
        return
    found = _first(environ, ("SLURM_STEP_ID", "SLURM_STEPID"))
    if _first(environ, ("SLURM_JOB_ID", "SLURM_JOBID")) is None:
        why = "SLURM_JOB_ID is not set, so this is no SLURM job step"
    elif found is None:
        # Real batch scripts and salloc shells carry no step id at all (captured with
        # SLURM 22.05).
        why = "SLURM_STEP_ID is not set, so this is the batch script (or salloc shell)"
    else:
        why = (
            f"{found[0]}={short(found[1])} is not an srun step (SLURM's batch, extern and "
            f"interactive steps have ids from 0xfffffff0), so this is the batch script"
        )
    raise SlurmConfigError(
        f"{why} of a job of {ntasks} tasks: every process started here would claim rank "
        f"{environ.get('SLURM_PROCID')}; {_SRUN_HINT} (for mpirun, use MPIClusterResolver)"
    )


def _check_other_launcher(environ: Mapping[str, str], rank: int, ntasks: int) -> None:
    """Refuse a process of another launcher whose rank or size disagrees with the srun step.

    ``mpirun``/``mpiexec`` inside an allocation start their daemons with srun,
    so their ranks inherit a step's ``SLURM_PROCID`` (one per node, not per rank).
    """
    launcher = find_launcher(environ)
    if launcher is None or launcher.name.startswith("srun"):
        return
    try:
        info = launcher.read(environ)
    except LauncherConfigError as e:
        raise SlurmConfigError(
            f"this process also has {launcher.name} launcher variables, and they are malformed: {e}"
        ) from None
    if (info.rank, info.size) != (rank, ntasks):
        raise SlurmConfigError(
            f"the {info.launcher} launcher's variables say rank {info.rank} of {info.size} but "
            f"SLURM_PROCID={rank} of {ntasks} tasks: this process was started by "
            f"{info.launcher}, not by srun; use MPIClusterResolver, or start the program "
            f"with srun"
        )


def _check_node_id(environ: Mapping[str, str], layout: _Layout, rank: int, host: str) -> None:
    """Where SLURM says which node this task is on, the layout must agree."""
    node_id = environ.get("SLURM_NODEID")
    if node_id is None or len(set(layout.hosts)) != len(layout.hosts):
        return
    node = _to_int("SLURM_NODEID", node_id)
    expected = layout.hosts.index(host)
    if node != expected:
        where = layout.hosts[node] if node < len(layout.hosts) else "no such node"
        raise SlurmConfigError(
            f"SLURM_NODEID={node} ({where}) but rank {rank} lands on node {expected} ({host}) "
            f"under SLURM_DISTRIBUTION={short(environ.get('SLURM_DISTRIBUTION', 'block'))}; this "
            f"task layout is not one the resolver can rebuild: pass tasks_per_node, or use "
            f"the MPI launcher's resolver"
        )


__all__ = ["MAX_TASKS", "SlurmClusterResolver"]
