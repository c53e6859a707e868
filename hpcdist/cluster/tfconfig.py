"""The ``TF_CONFIG`` variable: a strict parser and ``TFConfigClusterResolver``.

``TF_CONFIG`` is a JSON object with the keys ``"cluster"`` (job name to a list
of addresses, or to an object ``{"index": address}``), ``"task"``
(``{"type": ..., "index": ...}``), ``"rpc_layer"``, ``"session_master"`` and
``"environment"``. Unknown top-level keys (and unknown keys inside ``"task"``,
such as Cloud ML Engine's ``"trial"``) are ignored; the known ones are checked
strictly, and every error names the key at fault.

As in TF, a job may have any non-empty name (an old ``"master"`` job is
fine) and the task must be a task of the cluster (an ``evaluator`` may be
outside it). When the cluster is a multi-worker one (only ``chief``,
``worker``, ``ps`` and ``evaluator`` jobs) and the task is one of its tasks,
:func:`hpcdist.cluster.roles.validate_task` also checks its rules (at most one
chief and one evaluator task) at once, where TF waits for the strategy.

Example:
    >>> cfg = parse_tf_config('{"cluster": {"worker": ["a:2222", "b:2222"]},'
    ...                       ' "task": {"type": "worker", "index": 1}}')
    >>> cfg.task_type, cfg.task_id, cfg.cluster.num_tasks("worker")
    ('worker', 1, 2)
    >>> r = TFConfigClusterResolver(rpc_layer="grpc", environ={"TF_CONFIG": '{"cluster": '
    ...     '{"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}'})
    >>> r.master()
    'grpc://b:2222'
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcdist.cluster.base import ClusterResolver, format_master_url
from hpcdist.cluster.envparse import parse_uint, short
from hpcdist.cluster.roles import EVALUATOR, TASK_TYPES, validate_task
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.errors import ClusterConfigError, TFConfigError

TF_CONFIG = "TF_CONFIG"
_EXAMPLE = (
    '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
)


@dataclass(frozen=True)
class TFConfig:
    """The parsed contents of ``TF_CONFIG``; ``session_master`` is ``None`` when absent.

    Example:
        >>> TFConfig().cluster.jobs, TFConfig().task_type, TFConfig().session_master
        ([], None, None)
    """

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    task_type: str | None = None
    task_id: int | None = None
    rpc_layer: str | None = None
    session_master: str | None = None
    environment: str = ""


# -- helpers ---------------------------------------------------------------------------


def _key(*path: object) -> str:
    """``TF_CONFIG['cluster']['worker'][1]`` for the path ``("cluster", "worker", 1)``."""
    return TF_CONFIG + "".join(f"[{short(p)}]" for p in path)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {short(value)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in pairs:
        if name in out:
            raise TFConfigError(
                f"TF_CONFIG has the key {short(name)} twice in one JSON object; "
                f"expected each key once; remove the duplicate"
            )
        out[name] = value
    return out


def _optional_str(data: Mapping[str, object], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise TFConfigError(
            f"{_key(name)} is {_json_type(value)}; expected a string; fix or remove the key"
        )
    return value


# -- the parser ------------------------------------------------------------------------


def parse_tf_config(text: str) -> TFConfig:
    """Parse and check the text of ``TF_CONFIG``; empty text gives an empty config.

    Raises :class:`~hpcdist.errors.TFConfigError` naming the key at fault when the
    text is not a JSON object, the cluster is malformed (an empty job name, an
    address that is not a string), the task is not a task of the cluster (an
    evaluator may be outside the cluster), or the task of a multi-worker cluster
    breaks :func:`~hpcdist.cluster.roles.validate_task` (two chief tasks). A task
    index may be an integer or an integer-like string, as TF accepts.

    Example:
        >>> parse_tf_config("").cluster.jobs
        []
        >>> parse_tf_config('{"cluster": {"ps": {"1": "p1:2222"}}}').cluster.as_dict()
        {'ps': {1: 'p1:2222'}}
    """
    if not isinstance(text, str):
        raise TFConfigError(f"TF_CONFIG must be a string of JSON; found {type(text).__name__}")
    if not text.strip():
        return TFConfig()
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except TFConfigError:
        raise
    except json.JSONDecodeError as e:
        raise TFConfigError(
            f"TF_CONFIG is not valid JSON: {e.msg} at line {e.lineno} column {e.colno} "
            f"(char {e.pos}), found {short(text[e.pos : e.pos + 20])} there; "
            f"expected a JSON object such as {_EXAMPLE}; fix the TF_CONFIG variable"
        ) from None
    except (ValueError, RecursionError) as e:
        raise TFConfigError(
            f"TF_CONFIG is not valid JSON ({type(e).__name__}: {e}); "
            f"expected a JSON object such as {_EXAMPLE}"
        ) from None
    if not isinstance(data, dict):
        raise TFConfigError(
            f"TF_CONFIG is {_json_type(data)}; expected a JSON object such as {_EXAMPLE}"
        )
    cluster = _parse_cluster(data.get("cluster"))
    task_type, task_id = _parse_task(data.get("task"))
    _check_task(cluster, task_type, task_id, _key("task", "type"), _key("task", "index"))
    return TFConfig(
        cluster=cluster,
        task_type=task_type,
        task_id=task_id,
        rpc_layer=_optional_str(data, "rpc_layer"),
        session_master=_optional_str(data, "session_master"),
        environment=_optional_str(data, "environment") or "",
    )


def _parse_cluster(value: object) -> ClusterSpec:
    if value is None:
        return ClusterSpec()
    if not isinstance(value, dict):
        raise TFConfigError(
            f"{_key('cluster')} is {_json_type(value)}; expected an object of job name to "
            f'a list of addresses, such as {{"worker": ["host1:2222", "host2:2222"]}}'
        )
    jobs: dict[str, dict[int, str]] = {}
    for job, tasks in value.items():
        if not job.strip():
            raise TFConfigError(
                f"{_key('cluster', job)}: the job name is blank; expected a name such as "
                f'"worker" (any non-empty name is accepted)'
            )
        jobs[job] = _parse_job(job, tasks)
    try:
        return ClusterSpec(jobs)
    except ClusterConfigError as e:  # not expected after the checks above
        raise TFConfigError(f"{_key('cluster')} is invalid: {e}") from None


def _parse_job(job: str, tasks: object) -> dict[int, str]:
    if isinstance(tasks, list):
        items: list[tuple[int, object, object]] = [(i, i, a) for i, a in enumerate(tasks)]
    elif isinstance(tasks, dict):
        items = []
        for name, address in tasks.items():
            index = parse_uint(f"a task index of {_key('cluster', job)}", name, TFConfigError)
            items.append((index, name, address))
    else:
        raise TFConfigError(
            f"{_key('cluster', job)} is {_json_type(tasks)}; expected a list of addresses "
            f'["host:port", ...] or an object {{"index": "host:port"}}'
        )
    out: dict[int, str] = {}
    for index, name, address in items:
        if not isinstance(address, str) or not address:
            raise TFConfigError(
                f"{_key('cluster', job, name)} is {_json_type(address)}; "
                f'expected a non-empty address string such as "host:2222"'
            )
        if index in out:
            raise TFConfigError(
                f"{_key('cluster', job)} gives task index {index} twice; give each index once"
            )
        out[index] = address
    return out


def _parse_task(value: object) -> tuple[str | None, int | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise TFConfigError(
            f"{_key('task')} is {_json_type(value)}; expected an object such as "
            f'{{"type": "worker", "index": 0}}'
        )
    task_type, index = value.get("type"), value.get("index")
    if task_type is None and index is None:
        return None, None
    if task_type is None:
        raise TFConfigError(
            f"{_key('task')} has an index but no type; expected a type, a job of the cluster "
            f"such as {TASK_TYPES[1]!r}"
        )
    if not isinstance(task_type, str) or not task_type.strip():
        raise TFConfigError(
            f"{_key('task', 'type')} is {_json_type(task_type)}; expected a job of the cluster "
            f"such as {TASK_TYPES[1]!r}"
        )
    if index is None:
        raise TFConfigError(
            f"{_key('task')} has the type {short(task_type)} but no index; expected an index "
            f"such as 0"
        )
    return task_type, _parse_index(index, _key("task", "index"))


def _parse_index(value: object, where: str) -> int:
    """A non-negative integer; an integer-like string or an integral float is accepted."""
    index: int | None = None
    if isinstance(value, bool):
        index = None
    elif isinstance(value, int):
        index = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        index = int(value)
    elif isinstance(value, str):
        try:
            index = parse_uint(where, value, TFConfigError)
        except TFConfigError:
            index = None
    if index is None or index < 0:
        raise TFConfigError(
            f"{where} is {_json_type(value)}; expected a non-negative integer such as 0"
        )
    return index


def _check_task(
    cluster: ClusterSpec,
    task_type: str | None,
    task_id: int | None,
    type_where: str,
    id_where: str,
    roles: bool = True,
) -> None:
    """Check that a task type and id name a task of ``cluster`` (an evaluator may be outside).

    With ``roles``, the task of a multi-worker cluster is then checked by
    ``roles.validate_task``.
    """
    if task_type is None:
        return
    if task_type not in cluster.jobs:
        if task_type == EVALUATOR:
            return
        raise TFConfigError(
            f"{type_where} is {short(task_type)}, which is not a job of {_key('cluster')}; "
            f"the jobs are {short(cluster.jobs, 200)}; add the job to the cluster or fix the "
            f"task type"
        )
    if task_id is not None and task_id not in cluster.task_indices(task_type):
        raise TFConfigError(
            f"{id_where} is {short(task_id)}, which is not a task of job {short(task_type)}; "
            f"its task indices are {short(cluster.task_indices(task_type), 200)}"
        )
    if not roles or task_id is None or any(job not in TASK_TYPES for job in cluster.jobs):
        return  # not a multi-worker cluster: TF's resolver accepts it as it is
    try:
        validate_task(cluster, task_type, task_id)
    except ClusterConfigError as e:
        raise TFConfigError(
            f"{_key('cluster')} is not a valid multi-worker cluster for task "
            f"{task_type!r} {task_id}: {e}"
        ) from None


# -- the resolver ----------------------------------------------------------------------


class TFConfigClusterResolver(ClusterResolver):
    """A cluster resolver that reads ``TF_CONFIG``, like TF's class of the same name.

    ``TF_CONFIG`` is read again at each call (it is parsed only when it changed)
    and is checked once at construction, so that a bad value fails at start-up.
    Arguments given here override the values in ``TF_CONFIG``.

    Args:
        task_type: overrides ``TF_CONFIG["task"]["type"]``.
        task_id: overrides ``TF_CONFIG["task"]["index"]``.
        rpc_layer: overrides ``TF_CONFIG["rpc_layer"]`` (e.g. ``"grpc"``).
        environment: the value of :attr:`environment` (``""`` by default); as in
            TF, ``TF_CONFIG["environment"]`` is not used for it.
        environ: the variables to read; ``os.environ`` by default.

    Raises:
        TFConfigError: ``TF_CONFIG`` is malformed, or the task (after the
            overrides) is not a task of its cluster.

    Example:
        >>> env = {"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]},'
        ...                     ' "task": {"type": "chief", "index": 0}}'}
        >>> r = TFConfigClusterResolver(environ=env)
        >>> r.task_type, r.task_id, r.master(), r.master("worker", 0, rpc_layer="grpc")
        ('chief', 0, 'c:1', 'grpc://w:1')
    """

    detect_order = 0  # an explicit description written by the user wins over anything inferred
    resolve_kwargs = frozenset({"task_type", "task_id", "rpc_layer", "environment"})

    @classmethod
    def detected(cls, environ: Mapping[str, str], launch: Callable[[], Any]) -> str | None:
        """``TF_CONFIG`` is set and not blank (malformed launcher variables do not matter)."""
        return "TF_CONFIG is set" if environ.get("TF_CONFIG", "").strip() else None

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._environ = environ
        self._cache: tuple[str, TFConfig] | None = None
        for name, value in (
            ("task_type", task_type),
            ("rpc_layer", rpc_layer),
            ("environment", environment),
        ):
            if value is not None and not isinstance(value, str):
                raise TFConfigError(
                    f"the {name} argument is {short(value)}; expected a string or None"
                )
        if task_id is not None:
            try:
                index = -1 if isinstance(task_id, bool) else operator.index(task_id)
            except TypeError:
                index = -1
            if index < 0:
                raise TFConfigError(
                    f"the task_id argument is {short(task_id)}; expected a non-negative integer"
                )
            task_id = index
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment
        config = self._config()
        if task_type is not None and not task_type.strip():
            raise TFConfigError(
                f"the task_type argument is {short(task_type)}; expected a job of the cluster"
            )
        if config.cluster:  # without a cluster, the overrides have nothing to agree with
            _check_task(
                config.cluster,
                self.task_type,
                self.task_id,
                "the task_type argument" if task_type is not None else _key("task", "type"),
                "the task_id argument" if task_id is not None else _key("task", "index"),
            )

    def _config(self) -> TFConfig:
        text = self.environ.get(TF_CONFIG, "")
        if self._cache is None or self._cache[0] != text:
            self._cache = (text, parse_tf_config(text))
        return self._cache[1]

    def cluster_spec(self) -> ClusterSpec:
        """The cluster of ``TF_CONFIG``; an empty ``ClusterSpec`` when there is none.

        Example: ``TFConfigClusterResolver(environ={}).cluster_spec().jobs == []``.
        """
        return ClusterSpec(self._config().cluster)

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The master address, with TF's rules.

        ``TF_CONFIG["session_master"]``, when present (even ``""``), is returned as it is. Else a
        cluster that is empty or holds a single task has master ``""``. Else the
        given (or this) task's address, with the rpc prefix; ``""`` when the task
        is not known or is an evaluator outside the cluster. An unknown task type
        (not a job of the cluster) or id raises ``TFConfigError``.

        Example: ``r.master("worker", 1, rpc_layer="grpc") == "grpc://b:2222"``.
        """
        config = self._config()
        if config.session_master is not None:
            return config.session_master
        cluster = config.cluster
        # TF: no master for a cluster of one job whose job_tasks() list has one entry, that
        # is whose only task is task 0 (without building that list for a sparse job).
        if not cluster or (len(cluster.jobs) == 1 and cluster.task_indices(cluster.jobs[0]) == [0]):
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if (
            task_type is None
            or task_id is None
            or (task_type == EVALUATOR and EVALUATOR not in cluster.jobs)
        ):
            return ""
        _check_task(cluster, task_type, task_id, "master: task_type", "master: task_id", False)
        address = cluster.task_address(task_type, task_id)
        # TF_CONFIG's resolver (unlike the others) keeps an explicit rpc_layer="" as given.
        return format_master_url(address, rpc_layer if rpc_layer is not None else self.rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """``{"GPU": n}``, ``n`` the devices in ``CUDA_VISIBLE_DEVICES``, else the machine's GPUs.

        ``{}`` without GPUs. Example: with ``CUDA_VISIBLE_DEVICES=0,1``, ``{"GPU": 2}``.
        """
        return self._visible_gpus()

    @property
    def task_type(self) -> str | None:
        """The argument given, else ``TF_CONFIG["task"]["type"]``."""
        return self._task_type if self._task_type is not None else self._config().task_type

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = value

    @property
    def task_id(self) -> int | None:
        """The argument given, else ``TF_CONFIG["task"]["index"]``."""
        return self._task_id if self._task_id is not None else self._config().task_id

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = value

    @property
    def rpc_layer(self) -> str | None:
        """The argument given, else ``TF_CONFIG["rpc_layer"]``."""
        return self._rpc_layer if self._rpc_layer is not None else self._config().rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = value

    @property
    def environment(self) -> str:
        """The ``environment`` argument, else ``""``; ``TF_CONFIG`` is not read for it, as in TF."""
        return self._environment or ""

    @environment.setter
    def environment(self, value: str | None) -> None:
        self._environment = value


__all__ = ["TF_CONFIG", "TFConfig", "TFConfigClusterResolver", "parse_tf_config"]
