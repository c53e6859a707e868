"""``ParameterServerStrategy`` over MPI: variables on ps ranks, asynchronous workers.

Every rank of the job constructs the strategy (collective). The roles come
from the cluster resolver: ``TF_CONFIG``, or the MPI ranks with a layout such
as ``MPIClusterResolver(jobs={"ps": 2, "worker": 6})`` (ranks are given to
jobs in sorted name order: chief, ps, worker). Then:

* a **ps** rank serves variables (:func:`hpcdist.distribute.ps.server.serve`)
  until every client has shut down or died, and exits with status 0 (the
  hpcdist keyword ``exit_after_serving=False`` returns instead);
* a **worker** (and the **chief**) is a client: variables made in the scope
  are :class:`~hpcdist.distribute.ps.variable.PSVariable` objects placed
  round-robin on the ps tasks (split into a ``ShardedVariable`` when
  ``variable_partitioner`` asks for several shards), ``strategy.run`` runs the
  worker's local replicas in sync, and ``optimizer.apply_gradients`` pushes
  the gradients to the ps, which runs the optimizer: workers never wait for
  each other.

Two styles of program work: every worker runs the training loop itself (TF1
style, ``extended.call_for_each_replica`` plus a global step on the ps), or a
chief schedules functions on the workers with
:class:`~hpcdist.distribute.coordinator.ClusterCoordinator` (TF2 style).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcdist.arrays import to_host
from hpcdist.cluster.base import ClusterResolver
from hpcdist.cluster.detect import resolve
from hpcdist.distribute import context
from hpcdist.distribute import variables as vs
from hpcdist.distribute.devices import Device, canonical_devices, check_devices_exist
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.input_context import InputContext
from hpcdist.distribute.multi_worker import MultiWorkerMirroredStrategy
from hpcdist.distribute.partitioners import shard_offsets, shard_sizes
from hpcdist.distribute.ps.client import PSClient
from hpcdist.distribute.ps.roles import PSRoles, roles_from_tasks
from hpcdist.distribute.ps.server import serve
from hpcdist.distribute.ps.variable import PSVariable
from hpcdist.distribute.sharded_variable import ShardedVariable
from hpcdist.distribute.strategy import Strategy
from hpcdist.errors import ClusterConfigError
from hpcdist.runtime import world

log = logging.getLogger("hpcdist.ps")


class _TaskView(NamedTuple):
    """What each rank tells the others in :func:`_tasks`."""

    task_type: str
    task_id: int
    error: str  # the resolver's error ("" when none), reported on every rank


def _tasks(comm: Any, resolver: ClusterResolver) -> list[tuple[str, int]]:
    """Every rank's ``(task_type, task_id)``, by rank (collective; the same list everywhere)."""
    try:
        mine = _TaskView(str(resolver.task_type), int(resolver.task_id or 0), "")
    except Exception as error:  # reported on every rank below
        mine = _TaskView("?", -1, f"{type(error).__name__}: {error}")
    views: list[_TaskView] = comm.allgather(mine)
    bad = [f"rank {r}: {v.error}" for r, v in enumerate(views) if v.error]
    if bad:
        raise ClusterConfigError("ParameterServerStrategy: no task for " + "; ".join(bad))
    return [(v.task_type, v.task_id) for v in views]


class ParameterServerExtended(StrategyExtended):
    """The extended API of :class:`ParameterServerStrategy` on a client (chief or worker).

    Example: ``strategy.extended.parameter_devices`` lists the ps tasks' devices.
    """

    def __init__(
        self,
        strategy: Any,
        roles: PSRoles,
        devices: Sequence[Device],
        partitioner: Any,
        ps_comm: Any,
        coordination_comm: Any,
        *,
        client: PSClient,
        cluster_resolver: ClusterResolver,
    ) -> None:
        super().__init__(
            strategy, devices, num_workers=1, between_graph=True, cluster_resolver=cluster_resolver
        )
        self._roles = roles
        self._ps_comm = ps_comm
        self._coordination_comm = coordination_comm
        self._partitioner = partitioner
        self._client = client
        self._next_id = itertools.count()
        self._next_optimizer_id = itertools.count()
        self._run_token: int | None = None
        self._run_counter = itertools.count(1)
        self._read_set: dict[int, Any] = {}
        self._colocate_ps: int | None = None
        self._global_step_var: Any = None
        self._closed = False

    # -- properties ---------------------------------------------------------------------
    @property
    def _num_ps(self) -> int:
        return len(self._roles.ps_ranks)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The devices that hold variables: the CPU of each ps task."""
        return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(self._num_ps))

    @property
    def should_checkpoint(self) -> bool:
        """Whether this task writes checkpoints: the chief, else worker 0."""
        return self._is_lead()

    @property
    def should_save_summary(self) -> bool:
        """Whether this task writes summaries: the chief, else worker 0."""
        return self._is_lead()

    def _is_lead(self) -> bool:
        r = self._roles
        return r.is_chief or (r.chief_rank is None and r.worker_index == 0)

    # -- running: one pull per variable and step --------------------------------------------
    def call_for_each_replica(
        self, fn: Callable, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Run ``fn`` on every local replica; variables read in it are pulled once per call.

        The variables the previous call read are pulled up front, one batched
        request per ps.
        """
        if self._run_token is not None:  # a run inside a run reuses the outer step's values
            return super().call_for_each_replica(fn, args, kwargs)
        token = next(self._run_counter)
        self._prefetch(token)
        self._run_token = token
        try:
            return super().call_for_each_replica(fn, args, kwargs)
        finally:
            self._run_token = None

    def _prefetch(self, token: int) -> None:
        previous, self._read_set = self._read_set, {}
        by_ps: dict[int, list[Any]] = {}
        for var in previous.values():
            by_ps.setdefault(var._ps, []).append(var)
        for ps, variables in by_ps.items():
            outs = [np.empty(v._shape, v._dtype) for v in variables]
            versions = self._client.pull(ps, [v._id for v in variables], outs)
            for v, out, version in zip(variables, outs, versions, strict=True):
                v._value, v._version, v._token = out, version, token

    # -- variables ------------------------------------------------------------------------
    def _place(self, var_id: int) -> int:
        if self._colocate_ps is not None:
            return self._colocate_ps
        return var_id % self._num_ps

    def create_variable(self, initial_value: Any, dtype: Any, shape: Any, spec: dict) -> Any:
        """A PSVariable (or a ShardedVariable of them); sync-on-read variables stay local."""
        self._check_open()
        if spec["synchronization"] is vs.VariableSynchronization.ON_READ:
            return super().create_variable(initial_value, dtype, shape, spec)
        if spec["synchronization"] is vs.VariableSynchronization.NONE:
            return super().create_variable(initial_value, dtype, shape, spec)  # raises
        value = np.array(to_host(vs.initial_array(initial_value, dtype, shape)), order="C")
        shards = self._num_shards(value)
        if shards <= 1:
            return self._new_ps_variable(value, spec)
        offsets = shard_offsets(shard_sizes(value.shape[0], shards))
        parts = [
            self._new_ps_variable(
                np.array(value[offsets[i] : offsets[i + 1]], order="C"),
                {**spec, "name": f"{spec['name']}/part_{i}"},
            )
            for i in range(shards)
        ]
        return ShardedVariable(parts, name=spec["name"])

    def _num_shards(self, value: np.ndarray) -> int:
        if self._partitioner is None or value.ndim == 0 or self._colocate_ps is not None:
            return 1
        parts = list(self._partitioner(tuple(value.shape), value.dtype))
        if len(parts) != value.ndim or any(p != 1 for p in parts[1:]) or parts[0] < 1:
            raise ValueError(
                f"variable_partitioner returned {parts} for shape {tuple(value.shape)}; expected "
                f"a list of {value.ndim} partition counts that splits axis 0 only, e.g. "
                f"[n] + [1] * {value.ndim - 1}"
            )
        return min(int(parts[0]), value.shape[0])

    def _new_ps_variable(self, value: np.ndarray, spec: dict) -> Any:
        var_id = next(self._next_id)
        ps = self._place(var_id)
        self._client.create(ps, var_id, value, spec["name"])
        return PSVariable(self, var_id, ps, value.copy(), **spec)

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Place the variables created inside on the ps task of ``colocate_with_variable``.

        Example: ``with strategy.extended.colocate_vars_with(v): slot = hd.Variable(0.0)``.
        """
        ps = getattr(colocate_with_variable, "_ps", None)
        if ps is None:
            shards = getattr(colocate_with_variable, "variables", None)
            ps = getattr(shards[0], "_ps", None) if shards else None
        if ps is None:
            raise TypeError(
                "colocate_vars_with needs a variable of this ParameterServerStrategy, got "
                f"{type(colocate_with_variable).__name__}"
            )
        previous, self._colocate_ps = self._colocate_ps, ps
        try:
            yield
        finally:
            self._colocate_ps = previous

    # -- the public interface of the ps updates (remote_updates) ---------------------------
    @property
    def ps_client(self) -> Any:
        """The :class:`~hpcdist.distribute.ps.client.PSClient` that talks to the ps tasks."""
        return self._client

    def create_ps_variable(self, initial_value: Any, spec: dict) -> Any:
        """A new variable on the ps (a PSVariable, or a ShardedVariable of them).

        ``spec``: ``name``, ``trainable``, ``synchronization``, ``aggregation``.
        """
        return self.create_variable(initial_value, None, None, spec)

    def register_optimizer(self, optimizer: Any) -> int:
        """The id of ``optimizer`` on the ps (registered with every ps on first use)."""
        key = getattr(optimizer, "_ps_ids", None)
        if key is None:
            key = optimizer._ps_ids = {}
        if id(self) not in key:
            opt_id = next(self._next_optimizer_id)
            self._client.register_optimizer(opt_id, type(optimizer).__name__, _config(optimizer))
            key[id(self)] = opt_id
        return key[id(self)]

    # -- shutdown ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                "this ParameterServerStrategy was shut down (strategy.shutdown()); its ps ranks "
                "have stopped serving"
            )

    def _shutdown(self) -> None:
        if not self._closed:
            coordinator = getattr(self._strategy, "_cluster_coordinator", None)
            if coordinator is not None:  # scheduled work first, then the ps may stop
                coordinator._shutdown()
            self._closed = True
            self._client.close()


def _config(optimizer: Any) -> dict:
    """``optimizer.get_config()`` made JSON-able (a schedule's config is a dict already)."""
    config = dict(optimizer.get_config())
    if not isinstance(config.get("learning_rate"), (int, float)):
        config["learning_rate"] = 0.0  # the workers send the learning rate of each step
    return config


class ParameterServerStrategy(Strategy):
    """Asynchronous training with variables on parameter-server ranks.

    ``cluster_resolver`` gives the roles (default: :func:`hpcdist.cluster.detect.resolve`);
    ``variable_partitioner`` (e.g. ``FixedShardsPartitioner(2)``) shards large
    variables along axis 0. hpcdist keywords: ``devices`` (the local replicas
    of each worker; default its GPUs, else the CPU) and ``exit_after_serving``.

    Example: ``strategy = hd.ParameterServerStrategy(MPIClusterResolver(jobs={"ps": 1,
    "worker": 3}))``; on the ps rank this call serves, then exits with status 0.
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        variable_partitioner: Any = None,
        *,
        devices: Sequence[str | Device] | None = None,
        exit_after_serving: bool = True,
    ) -> None:
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(
                "variable_partitioner must be a partitioner such as "
                f"FixedShardsPartitioner(2), got {variable_partitioner!r}"
            )
        w = world()
        resolver = resolve() if cluster_resolver is None else cluster_resolver
        roles = roles_from_tasks(w.comm, _tasks(w.comm, resolver))
        ps_comm = w.comm.Dup()
        coordination_comm = w.comm.Dup()
        self._roles = roles
        self._served: dict | None = None
        if roles.is_ps:
            self._served = serve(ps_comm, roles.clients)
            log.info("ps %d: all clients done, stats %s", roles.task_id, self._served)
            if exit_after_serving:
                sys.stdout.flush()
                sys.exit(0)
            self._extended = None
            self._cluster_resolver = resolver
            return
        if devices is not None:
            local = check_devices_exist(canonical_devices(devices))
        else:
            local = MultiWorkerMirroredStrategy._local_devices(w, None)
        local = canonical_devices(
            [Device(None, None, None, d.device_type, d.index) for d in local],
            job=roles.task_type,
            task=roles.task_id,
        )
        initializer = roles.is_chief or (roles.chief_rank is None and roles.worker_index == 0)
        extended = ParameterServerExtended(
            self,
            roles,
            local,
            variable_partitioner,
            ps_comm,
            coordination_comm,
            client=PSClient(ps_comm, roles.ps_ranks, initializer=initializer),
            cluster_resolver=resolver,
        )
        super().__init__(extended)
        atexit.register(extended._shutdown)

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """The cluster resolver the roles came from."""
        return getattr(self, "_cluster_resolver", None) or self._extended.cluster_resolver

    @property
    def extended(self) -> Any:
        """The extended API (raises on a ps rank that returned from serving)."""
        if self._extended is None:
            raise RuntimeError(
                "this rank is a parameter server and has finished serving; it has no strategy "
                "to use (ParameterServerStrategy(..., exit_after_serving=False) returned)"
            )
        return self._extended

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Any], options: Any = None
    ) -> Any:
        """Call ``dataset_fn(InputContext)`` on this worker; the context names its input pipeline.

        ``num_input_pipelines`` is the number of workers and ``input_pipeline_id``
        this worker's index (0 on the chief), so ``dataset_fn`` can shard with
        ``ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)``; nothing is
        shared between workers (they never wait for each other).

        Example: ``strategy.distribute_datasets_from_function(lambda ctx: ds.shard(
        ctx.num_input_pipelines, ctx.input_pipeline_id).batch(32))``.
        """
        roles = self._roles
        pipelines, pipeline = len(roles.worker_ranks), roles.worker_index or 0

        def on_this_worker(ctx: Any) -> Any:
            return dataset_fn(InputContext(pipelines, pipeline, ctx.num_replicas_in_sync))

        return super().distribute_datasets_from_function(on_this_worker, options)

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    @property
    def is_ps(self) -> bool:
        """Whether this rank is a parameter server (it only serves)."""
        return self._roles.is_ps

    @property
    def served(self) -> dict | None:
        """On a ps rank that returned from serving: the server's final statistics."""
        return self._served

    def shutdown(self) -> None:
        """Tell the ps ranks this client is done (also done at exit); then the strategy is unusable.

        Example: ``strategy.shutdown()`` at the end of a worker's program.
        """
        self.extended._shutdown()

    def __repr__(self) -> str:
        r = self._roles
        return (
            f"<ParameterServerStrategy {r.task_type}:{r.task_id} ps={len(r.ps_ranks)} "
            f"workers={len(r.worker_ranks)} chief={r.chief_rank is not None}>"
        )


def get_or_create_global_step(strategy: Any = None) -> Any:
    """The int64 global step of ``strategy`` (the current one by default), created once.

    Under a ParameterServerStrategy it is a variable on a ps task: every
    worker's ``assign_add(1)`` reaches the same counter, none is lost (TF1's
    ``tf.compat.v1.train.get_or_create_global_step``). In a replica context
    only the first replica's increment counts (aggregation ONLY_FIRST_REPLICA).

    Example: ``step = get_or_create_global_step(); step.assign_add(1)``.
    """
    strategy = strategy or context.get_strategy()
    ext = strategy.extended
    var = getattr(ext, "_global_step_var", None)
    if var is None:
        with strategy.scope():
            make: Any = vs.Variable  # its metaclass takes the tf.Variable arguments
            var = make(
                np.int64(0),
                name="global_step",
                trainable=False,
                aggregation=vs.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        ext._global_step_var = var
    return var


__all__ = [
    "ParameterServerExtended",
    "ParameterServerStrategy",
    "get_or_create_global_step",
]
