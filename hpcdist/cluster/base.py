"""ClusterResolver base class, SimpleClusterResolver and UnionResolver.

Semantics follow ``tf.distribute.cluster_resolver``. Every concrete resolver
reads its environment from an ``environ`` mapping (``os.environ`` by default),
so that it can be tested with a captured dict of variables.

Example:
    >>> r = SimpleClusterResolver(ClusterSpec({"worker": ["a:1", "b:1"]}),
    ...                           task_type="worker", task_id=1, rpc_layer="grpc")
    >>> r.master("worker", 1)
    'grpc://b:1'
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from hpcdist.cluster import gpus as _gpus
from hpcdist.cluster.envparse import check_int_arg, environ_or_default, short
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.errors import ClusterConfigError, DuplicateTaskError

if TYPE_CHECKING:
    from hpcdist.cluster.launchers import LaunchInfo

#: The highest TCP port.
MAX_PORT = 65535


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """``rpc_layer://master``, or ``master`` alone when there is no rpc layer.

    Example: ``format_master_url("h:2222", "grpc") == "grpc://h:2222"``.
    """
    return f"{rpc_layer}://{master}" if rpc_layer else master


def assign_jobs(
    jobs: Mapping[str, int] | None,
    task_hosts: Sequence[str],
    port_base: int,
    error: type[ClusterConfigError] = ClusterConfigError,
    source: str = "the job",
) -> dict[str, list[str]]:
    """Give the ranks to ``jobs`` in sorted job-name order, with an address for each task.

    Rank ``r`` runs on ``task_hosts[r]`` and listens on ``port_base + i``, ``i``
    its place among the ranks of that host in rank order. ``jobs`` defaults to
    ``{"worker": len(task_hosts)}``; a job of 0 tasks is kept as ``[]``, as TF
    does. :func:`task_of_rank` finds a rank's task in the result.

    Raises ``error`` (naming ``source``, where the ranks come from) when ``jobs``
    is not a non-empty dict of non-empty names to counts ``>= 0``, when the
    counts do not add up to the ranks, or when a port would fall outside
    1..65535.

    Example:
        >>> assign_jobs({"worker": 2, "ps": 1, "chief": 0}, ["a", "a", "b"], 8888)
        {'chief': [], 'ps': ['a:8888'], 'worker': ['a:8889', 'b:8888']}
    """
    size = len(task_hosts)
    if jobs is None:
        jobs = {"worker": size}
    if not isinstance(jobs, Mapping) or not jobs:
        raise error(
            f"jobs is {short(jobs)}; expected a non-empty dict of job name to task count, "
            f"such as {{'worker': {size}}}"
        )
    for name, count in jobs.items():
        if not isinstance(name, str) or not name:
            raise error(f"jobs has the job name {short(name)}; expected a non-empty string")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise error(f"jobs[{short(name)}] is {short(count)}; expected a number of tasks >= 0")
    asked = sum(jobs.values())
    if asked != size:
        raise error(
            f"jobs {short(dict(jobs), 200)} ask for {short(asked)} tasks but {source} has "
            f"{size} ranks; make the counts add up to {size} or launch that many ranks"
        )
    check_int_arg("port_base", port_base, 1, error)
    per_host = Counter(task_hosts)
    most = max(per_host.values(), default=1)
    if most > MAX_PORT:
        raise error(
            f"{source} puts {most} tasks on one host, more than the {MAX_PORT} TCP ports a "
            f"host has, so the tasks cannot all get an address; spread them over more hosts"
        )
    if port_base + most - 1 > MAX_PORT:
        raise error(
            f"port_base={short(port_base)} with up to {most} tasks on one host needs ports "
            f"above {MAX_PORT}; choose a port_base <= {MAX_PORT + 1 - most}"
        )
    seen: Counter[str] = Counter()
    addresses = []
    for host in task_hosts:
        addresses.append(f"{host}:{port_base + seen[host]}")
        seen[host] += 1
    layout: dict[str, list[str]] = {}
    first = 0
    for name in sorted(jobs):
        layout[name] = addresses[first : first + jobs[name]]
        first += jobs[name]
    return layout


def task_of_rank(layout: Mapping[str, Sequence[str]], rank: int) -> tuple[str, int]:
    """``(task_type, task_id)`` of ``rank`` in a layout made by :func:`assign_jobs`.

    Example:
        >>> task_of_rank({"chief": ["a:1"], "worker": ["a:2", "b:1"]}, 2)
        ('worker', 1)
    """
    first = 0
    for job, tasks in layout.items():
        if first <= rank < first + len(tasks):
            return job, rank - first
        first += len(tasks)
    raise ClusterConfigError(
        f"rank {rank} is not among the {first} tasks of the jobs {list(layout)}"
    )


class ClusterResolver(abc.ABC):
    """Finds the cluster a task belongs to and the task's own place in it.

    Subclasses implement :meth:`cluster_spec` and, where TF gives it other rules,
    :meth:`master`; ``task_type``, ``task_id`` and ``rpc_layer`` are settable, as in TF.

    A subclass that sets ``detect_order`` registers itself with
    :func:`hpcdist.cluster.detect.resolve` (as jax's cluster plug-ins do): ``resolve``
    asks the registered classes' :meth:`detected`, lowest ``detect_order`` first, and
    makes the first that fits with the keyword arguments named in ``resolve_kwargs``.
    """

    #: The place in the order ``resolve`` tries (``None``: not tried).
    detect_order: ClassVar[int | None] = None
    #: The keyword arguments of ``resolve`` this resolver takes (the others are dropped).
    resolve_kwargs: ClassVar[frozenset[str]] = frozenset()
    _registered: ClassVar[list[type[ClusterResolver]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("detect_order") is not None:
            ClusterResolver._registered.append(cls)
            ClusterResolver._registered.sort(key=lambda c: c.detect_order or 0)

    @classmethod
    def detected(
        cls, environ: Mapping[str, str], launch: Callable[[], LaunchInfo | None]
    ) -> str | None:
        """Why this resolver fits a process started with ``environ``, else ``None``.

        ``launch()`` gives the launcher's variables (``None``: no launcher), and
        raises ``LauncherConfigError`` where they are malformed.
        """
        return None

    _task_type: str | None = None
    _task_id: int | None = None
    _rpc_layer: str | None = None
    _environ: Mapping[str, str] | None = None

    @property
    def environ(self) -> Mapping[str, str]:
        """The variables this resolver reads (``os.environ`` unless one was given)."""
        return environ_or_default(self._environ)

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The whole cluster as a :class:`ClusterSpec`."""

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Address of a task (this one by default), prefixed by the rpc layer; ``""`` if unknown.

        Example: ``r.master("worker", 1, rpc_layer="grpc") == "grpc://n2:8888"``.
        """
        return self._master_of(task_type, task_id, rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """Accelerators per task, e.g. ``{"GPU": 2}``; the base class counts none."""
        return {}

    @property
    def environment(self) -> str:
        """The environment name (TF uses ``"google"`` for TPU pods); ``""`` here."""
        return ""

    @property
    def task_type(self) -> str | None:
        """The job name of this task, such as ``"worker"``."""
        return self._task_type

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = value

    @property
    def task_id(self) -> int | None:
        """The index of this task within its job."""
        return self._task_id

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = value

    @property
    def rpc_layer(self) -> str | None:
        """The protocol prefix of addresses (``"grpc"``), or ``None``."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = value

    def _visible_gpus(self) -> dict[str, int]:
        """``{"GPU": n}`` for the GPUs this task can use; ``{}`` when it has none.

        ``n`` is the number of devices ``CUDA_VISIBLE_DEVICES`` lists; when it is
        unset, the machine's GPUs (:func:`~hpcdist.cluster.gpus.count_gpus`, which
        never starts CUDA in this process), as TF counts the local devices.
        """
        visible = _gpus.parse_visible_devices(self.environ.get("CUDA_VISIBLE_DEVICES"))
        count = _gpus.count_gpus() if visible is None else len(visible)
        return {"GPU": count} if count else {}

    def _master_of(self, task_type: str | None, task_id: int | None, rpc_layer: str | None) -> str:
        """Shared body of ``master``: the address of the given or current task, or ``""``."""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)


def detectable_resolvers() -> tuple[type[ClusterResolver], ...]:
    """The resolver classes :func:`hpcdist.cluster.detect.resolve` tries, in order."""
    return tuple(ClusterResolver._registered)


class SimpleClusterResolver(ClusterResolver):
    """A resolver that returns what it was given.

    Example:
        >>> r = SimpleClusterResolver(ClusterSpec({"worker": ["a:1"]}), master="a:1")
        >>> r.master(), r.num_accelerators()
        ('a:1', {})
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec | Mapping,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: Mapping[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        self._cluster_spec = ClusterSpec(cluster_spec)
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = dict(num_accelerators or {})
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The given master when no task is named, else that task's address."""
        if task_type is not None and task_id is not None:
            return self._master_of(task_type, task_id, rpc_layer)
        return format_master_url(self._master, rpc_layer or self._rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        return dict(self._num_accelerators)

    @property
    def environment(self) -> str:
        return self._environment


class UnionResolver(ClusterResolver):
    """Merges the cluster specs of several resolvers; the first one answers the rest.

    Jobs present in several resolvers are concatenated when all are dense
    lists, else merged as dicts; a task index given twice raises
    :class:`~hpcdist.errors.DuplicateTaskError` (a ``KeyError``, as in TF). A
    keyword other than ``task_type``, ``task_id`` and ``rpc_layer`` raises
    :class:`~hpcdist.errors.ClusterConfigError` (a ``ValueError``, as in TF).

    Example:
        >>> a = SimpleClusterResolver(ClusterSpec({"worker": ["a:1"]}))
        >>> b = SimpleClusterResolver(ClusterSpec({"worker": ["b:1"], "ps": ["p:1"]}))
        >>> UnionResolver(a, b).cluster_spec().as_dict()
        {'worker': ['a:1', 'b:1'], 'ps': ['p:1']}
    """

    def __init__(self, *resolvers: ClusterResolver, **kwargs: object) -> None:
        unknown = sorted(set(kwargs) - {"task_type", "task_id", "rpc_layer"})
        if unknown:  # a ValueError, as in TF
            raise ClusterConfigError(
                f"UnionResolver got unexpected keyword arguments {unknown}; "
                f"expected only task_type, task_id or rpc_layer"
            )
        if not resolvers:
            raise ClusterConfigError("UnionResolver needs at least one ClusterResolver")
        for r in resolvers:
            if not isinstance(r, ClusterResolver):
                raise TypeError(
                    f"UnionResolver arguments must be ClusterResolver instances; "
                    f"found {type(r).__name__}"
                )
        self._resolvers = resolvers
        # (kwargs hold only these three names, given as the base class's types)
        self._task_type = kwargs.get("task_type")  # type: ignore[assignment]
        self._task_id = kwargs.get("task_id")  # type: ignore[assignment]
        self._rpc_layer = kwargs.get("rpc_layer")  # type: ignore[assignment]

    def cluster_spec(self) -> ClusterSpec:
        specs = [r.cluster_spec().as_dict() for r in self._resolvers]
        sparse_jobs = {job for s in specs for job, tasks in s.items() if isinstance(tasks, dict)}
        merged: dict[str, list[str] | dict[int, str]] = {}
        for spec in specs:
            for job, tasks in spec.items():
                if job not in sparse_jobs and not isinstance(tasks, dict):
                    dense = merged.setdefault(job, [])
                    assert isinstance(dense, list)  # the job is dense in every spec
                    dense.extend(tasks)
                    continue
                into = merged.setdefault(job, {})
                assert isinstance(into, dict)  # the job is sparse in some spec
                new = tasks if isinstance(tasks, dict) else dict(enumerate(tasks))
                clash = sorted(set(new) & set(into))
                if clash:
                    raise DuplicateTaskError(
                        f"UnionResolver: job {short(job)} has task indices {short(clash, 200)} "
                        f"in more than one resolver; give each task index once"
                    )
                into.update(new)
        return ClusterSpec(merged)

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The named task's address, else the first resolver's master."""
        if task_type is not None and task_id is not None:
            return self._master_of(task_type, task_id, rpc_layer)
        return self._resolvers[0].master(rpc_layer=rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        return self._resolvers[0].num_accelerators(task_type, task_id, config_proto)

    @property
    def environment(self) -> str:
        return self._resolvers[0].environment

    @property
    def task_type(self) -> str | None:
        return self._task_type or self._resolvers[0].task_type

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = value

    @property
    def task_id(self) -> int | None:
        return self._task_id if self._task_id is not None else self._resolvers[0].task_id

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = value

    @property
    def rpc_layer(self) -> str | None:
        return self._rpc_layer or self._resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = value
