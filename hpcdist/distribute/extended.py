"""``StrategyExtended``: the machinery shared by the mirrored family of strategies.

One class serves OneDevice, Mirrored and MultiWorkerMirrored (and the default
strategy): a worker owns ``k`` local devices, there are ``W`` workers joined
by a collectives engine, and ``num_replicas_in_sync = k * W``. The global id
of local replica ``i`` on worker ``w`` is ``w * k + i``.

Reductions go in two stages: the cross-device ops reduce the ``k`` local
values on one device, then (with ``W > 1``) the collectives engine reduces
across workers, in one batched call for all tensors of a step. ``MEAN`` sums
and divides by ``k * W`` at the end.

Example:
    >>> import hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> s.extended.worker_devices
    ('/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.arrays import array_module, as_result, asarray, is_array, to_device
from hpcdist.collectives.ops import ReduceOp, divide_mean
from hpcdist.distribute import context, nest, streams
from hpcdist.distribute import variables as vs
from hpcdist.distribute.cross_device_ops import (
    CrossDeviceOps,
    default_cross_device_ops,
    destination_devices,
    place,
)
from hpcdist.distribute.devices import Device
from hpcdist.distribute.replica_context import ReplicaContext
from hpcdist.distribute.replica_threads import Runner
from hpcdist.distribute.strategy import ValueContext, require_cross_replica
from hpcdist.distribute.streams import ReplicaStreams
from hpcdist.distribute.values import (
    DistributedValues,
    Mirrored,
    PerReplica,
    regroup,
    select_replica,
)
from hpcdist.distribute.variables import DistributedVariable, SyncOnReadVariable, Variable
from hpcdist.runtime.device import is_device_array

if TYPE_CHECKING:
    from hpcdist.cluster.base import ClusterResolver
    from hpcdist.collectives.options import CommunicationOptions


class StrategyExtended:
    """The lower-level API of a strategy (``tf.distribute.StrategyExtended``)."""

    def __init__(
        self,
        strategy: Any,
        devices: Sequence[Device],
        *,
        worker_index: int = 0,
        num_workers: int = 1,
        collectives: Any = None,
        cross_device_ops: CrossDeviceOps | None = None,
        distributed_variables: bool = True,
        between_graph: bool = False,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
    ) -> None:
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(
                f"cross_device_ops must be a CrossDeviceOps (e.g. hd.ReductionToOneDevice()), "
                f"got {cross_device_ops!r}"
            )
        self._strategy = strategy
        self._cluster_resolver = cluster_resolver
        self._communication_options = communication_options
        self._devices = tuple(devices)
        self._num_local_replicas = len(self._devices)
        self._worker_index = worker_index
        self._num_workers = num_workers
        self._num_replicas_in_sync = self._num_local_replicas * num_workers
        self._collectives = collectives
        self._cross_device_ops = cross_device_ops or default_cross_device_ops(self._devices)
        self._distributed_variables = distributed_variables
        self._between_graph = between_graph
        self._variable_device: Device | None = self._devices[0]
        # One stream per replica for several local GPUs (streams are made on first use).
        gpus = any(d.device_type == "GPU" for d in self._devices)
        self._streams = ReplicaStreams(self._devices) if gpus and len(self._devices) > 1 else None
        self._runner = Runner(self)
        self._default_ctx: ReplicaContext | None = None

    # -- properties -------------------------------------------------------------------
    @property
    def strategy(self) -> Any:
        """The :class:`Strategy` this extended API belongs to."""
        return self._strategy

    @property
    def num_local_replicas(self) -> int:
        """How many replicas this worker runs (its local devices)."""
        return self._num_local_replicas

    @property
    def worker_index(self) -> int:
        """This worker's index among the workers (0 is the chief)."""
        return self._worker_index

    @property
    def num_workers(self) -> int:
        """How many workers (MPI ranks) take part."""
        return self._num_workers

    @property
    def collectives(self) -> Any:
        """The collectives engine that joins the workers (``None`` for one worker)."""
        return self._collectives

    @property
    def cluster_resolver(self) -> ClusterResolver | None:
        """The cluster resolver of a multi-worker strategy, else ``None``."""
        return self._cluster_resolver

    @property
    def communication_options(self) -> CommunicationOptions | None:
        """The collectives' options of a multi-worker strategy, else ``None``."""
        return self._communication_options

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The devices of this worker's replicas, as full device names."""
        return tuple(d.name for d in self._devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The devices that hold variables (every replica's device: variables are mirrored)."""
        return self.worker_devices

    @property
    def experimental_between_graph(self) -> bool:
        """Whether each worker runs its own copy of the program (multi-worker strategies)."""
        return self._between_graph

    @property
    def experimental_require_static_shapes(self) -> bool:
        """Whether input shapes must be static (never here: NumPy shapes are always known)."""
        return False

    @property
    def should_checkpoint(self) -> bool:
        """Whether this worker writes checkpoints (worker 0, the chief)."""
        return self._worker_index == 0

    @property
    def should_save_summary(self) -> bool:
        """Whether this worker writes summaries (worker 0, the chief)."""
        return self._worker_index == 0

    @property
    def experimental_should_init(self) -> bool:
        """Whether this worker initialises variables (every worker does)."""
        return True

    should_init = experimental_should_init

    # -- replica contexts and running ---------------------------------------------------
    def _default_replica_context(self) -> ReplicaContext:
        if self._default_ctx is None:
            self._default_ctx = ReplicaContext(self._strategy, 0, 0, self.worker_devices[:1])
        return self._default_ctx

    def _make_replica_context(self, local_id: int, merger: Callable | None) -> ReplicaContext:
        replica_id = self._worker_index * self._num_local_replicas + local_id
        names = self.__dict__.get("_device_names")
        if names is None:
            names = self._device_names = tuple(d.name for d in self._devices)
        return ReplicaContext(self._strategy, replica_id, local_id, (names[local_id],), merger)

    @contextlib.contextmanager
    def _device_scope(self, local_id: int) -> Iterator[None]:
        """Where replica ``local_id`` runs: its GPU, and its own stream when there are several.

        With one local replica the caller's current stream of the GPU stays
        current (the collectives engine enqueues there too). CPU: nothing.
        """
        if self._streams is not None:
            with self._streams.scope(local_id):
                yield
            return
        with self._main_device_scope(local_id):
            yield

    @contextlib.contextmanager
    def _main_device_scope(self, local_id: int) -> Iterator[None]:
        """Replica ``local_id``'s GPU current, on the calling thread's own stream of it.

        For work the calling (main) thread does on a replica's device, e.g. a
        variable update in a merge call: it stays on the main thread's stream,
        which the replica streams are ordered with at merge points.
        """
        device = self._devices[local_id]
        if device.device_type != "GPU":
            yield
            return
        with streams.cupy_module().cuda.Device(device.index):
            yield

    def call_for_each_replica(
        self, fn: Callable, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Run ``fn`` on every local replica (what ``strategy.run`` does after its checks)."""
        kwargs = kwargs or {}
        if self._num_local_replicas == 1 and not kwargs and _plain_arrays(args):
            # The common step of one replica per worker: nothing to select or check.
            if self._devices[0].device_type == "CPU":
                with self._make_replica_context(0, None):
                    return fn(*args)
            with self._make_replica_context(0, None), self._device_scope(0):
                return fn(*args)
        self._check_component_counts((args, kwargs))
        if self._num_local_replicas > 1:
            return self._runner.run(fn, args, kwargs)
        with self._make_replica_context(0, None), self._device_scope(0):
            return fn(*select_replica(0, args), **select_replica(0, kwargs))

    def _check_component_counts(self, structure: Any) -> None:
        k = self._num_local_replicas
        for leaf in nest.flatten(structure):
            if isinstance(leaf, DistributedValues) and len(leaf.values) != k:
                raise ValueError(
                    f"a {type(leaf).__name__} argument has {len(leaf.values)} components but "
                    f"this strategy has {k} local replicas: it was made by another strategy"
                )

    def _distribute_values_from_function(self, value_fn: Callable[[Any], Any]) -> PerReplica:
        values = []
        for i, device in enumerate(self._devices):
            ctx = ValueContext(
                self._worker_index * self._num_local_replicas + i, self._num_replicas_in_sync
            )
            value = value_fn(ctx)
            if device.device_type == "GPU":
                value = nest.map_structure(
                    lambda x, d=device: (
                        to_device(x, "GPU", d.index, copy=False) if is_array(x) else x
                    ),
                    value,
                )
            values.append(value)
        if len(values) == 1:
            return values[0]
        return regroup(values, always_wrap=True)

    # -- reductions ---------------------------------------------------------------------
    def _components(self, value: Any, op: ReduceOp) -> list[Any] | Any:
        """The local values to reduce, or the finished result when no reduction is needed."""

        k = self._num_local_replicas
        if isinstance(value, SyncOnReadVariable):
            return [asarray(c.raw_value()) for c in value.values]
        mirrored = isinstance(value, (Mirrored, DistributedVariable))
        if isinstance(value, (DistributedValues, DistributedVariable)):
            comps = list(value.values)
            if len(comps) != k:
                raise ValueError(
                    f"the distributed value has {len(comps)} components but this strategy has "
                    f"{k} local replicas: it was made by another strategy"
                )
            comps = [asarray(c.raw_value() if isinstance(c, Variable) else c) for c in comps]
            if not mirrored:
                return comps
            if op is not ReduceOp.SUM:
                return comps[0]  # the same everywhere: MEAN, MIN, MAX of it is itself
            if self._num_replicas_in_sync == 1:
                return comps[0]
            raise ValueError(
                f"a mirrored value ({type(value).__name__}) cannot be SUM-reduced: it is the "
                f"same on all {self._num_replicas_in_sync} replicas, so the sum is not "
                "meaningful; reduce the per-replica values (the output of run) instead"
            )
        if isinstance(value, Variable):
            value = value.raw_value()
        value = asarray(value)
        if k == 1:
            return [value]
        if op is not ReduceOp.SUM:
            return [value] * k if self._num_workers > 1 else value
        xp = array_module(value)
        if self._num_workers == 1 and not bool(xp.any(value != 0)):
            return xp.zeros_like(value)  # a sum of zeros is zero however many replicas
        raise ValueError(
            f"a value that is not distributed cannot be SUM-reduced over {k} local replicas: "
            f"got {type(value).__name__} {value!r}. Reduce the PerReplica output of "
            "strategy.run (or use MEAN for a value that is the same on every replica)"
        )

    def reduce_leaves(self, op: ReduceOp, leaves: Sequence[Any], options: Any = None) -> list[Any]:
        """Reduce each leaf over all replicas; results on the first local device.

        One engine call for all leaves. With one local replica per worker the
        replica's arrays go to the engine as they are (it reads them in place
        and never writes them) and the engine does the whole reduction, MEAN
        included, so the result is the engine's, bit for bit, in a buffer the
        engine reuses once the caller has dropped it. With several local
        replicas the cross-device ops first reduce the local values.
        """
        device = self._devices[0]
        direct = self._num_local_replicas == 1 and self._num_workers > 1
        local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        results: list[Any] = []
        pending: list[int] = []
        for leaf in leaves:
            if direct and leaf.__class__ is np.ndarray:
                comps: Any = [leaf]  # (what _components gives for an array, with less work)
            elif direct and leaf.__class__ is PerReplica and _host_values(leaf, 1):
                comps = list(leaf.values)
            else:
                comps = self._components(leaf, op)
            if isinstance(comps, list):
                pending.append(len(results))
                if direct:
                    results.append(comps[0])
                else:
                    results.append(self._cross_device_ops.reduce_local(local_op, comps, device))
            else:
                results.append(to_device(comps, device.device_type, device.index))
        if not pending:
            return results
        if direct:
            reduced = self._collectives.allreduce([results[i] for i in pending], op, options)
            for i, r in zip(pending, reduced, strict=True):
                results[i] = r
            return results
        if self._num_workers > 1:
            reduced = self._collectives.allreduce([results[i] for i in pending], local_op, options)
            for i, r in zip(pending, reduced, strict=True):
                results[i] = r
        if op is ReduceOp.MEAN:
            for i in pending:
                results[i] = divide_mean(results[i], self._num_replicas_in_sync)
        return results

    def _reduce_to_host(self, op: ReduceOp, value: Any) -> Any:
        leaves = nest.flatten(value)
        return nest.pack_sequence_as(value, self.reduce_leaves(op, leaves))

    def _all_reduce_leaves(self, op: ReduceOp, leaves: list[Any], options: Any) -> list[Any]:
        if self._streams is not None and self._num_workers == 1:
            done = [self._local_gpu_reduce(op, leaf, self._devices) for leaf in leaves]
            rest = [leaf for leaf, r in zip(leaves, done, strict=True) if r is _UNHANDLED]
            rest_reduced = iter(self.reduce_leaves(op, rest, options) if rest else ())
            return [
                place(next(rest_reduced), self._devices) if r is _UNHANDLED else r for r in done
            ]
        reduced = self.reduce_leaves(op, leaves, options)
        if self._num_local_replicas == 1 and self._devices[0].device_type == "CPU":
            if all(r.__class__ is np.ndarray for r in reduced):
                return reduced  # (what place gives for NumPy arrays on one CPU device)
        return [place(r, self._devices) for r in reduced]

    def _local_gpu_reduce(self, op: ReduceOp, value: Any, dests: Sequence[Device]) -> Any:
        """The cross-device ops' ``reduce`` of a ``PerReplica`` of GPU arrays, else _UNHANDLED.

        Only for several local GPUs and one worker: then ``NcclAllReduce``
        reduces with NCCL on the GPUs (its docstring says when); every other
        value goes the usual way (:meth:`reduce_leaves`).
        """
        if self._streams is None or self._num_workers != 1:
            return _UNHANDLED
        if type(value) is not PerReplica or len(value.values) != self._num_local_replicas:
            return _UNHANDLED
        if not all(is_device_array(v) for v in value.values):
            return _UNHANDLED
        return self._cross_device_ops.reduce(op, value, tuple(dests))

    def local_gpu_all_reduce(self, op: ReduceOp, leaves: Sequence[Any]) -> list[list[Any]] | None:
        """Each leaf (a ``PerReplica`` of GPU arrays) all-reduced among the local GPUs.

        Returns, per local replica, the reduced leaves on that replica's GPU (with
        ``NcclAllReduce``: one NCCL all-reduce per leaf, nothing copied between GPUs
        or to the host), or ``None`` when :meth:`_local_gpu_reduce` does not apply
        to every leaf (then :meth:`reduce_leaves`). The optimizers' gradient sum.
        """
        if self._streams is None or self._num_workers != 1:
            return None
        done = [self._local_gpu_reduce(op, leaf, self._devices) for leaf in leaves]
        if any(d is _UNHANDLED for d in done):
            return None
        return [[d.values[r] for d in done] for r in range(self._num_local_replicas)]

    def reduce_to(
        self, reduce_op: ReduceOp | str, value: Any, destinations: Any, options: Any = None
    ) -> Any:
        """Reduce ``value`` over all replicas and copy it to ``destinations``.

        Example: ``extended.reduce_to("SUM", per_replica_grad, destinations=var)`` gives a
        ``Mirrored`` with one copy per device of ``var``.
        """
        require_cross_replica(self._strategy, "extended.reduce_to")
        op = ReduceOp.from_any(reduce_op)
        dests = destination_devices(destinations, self._devices)
        done = self._local_gpu_reduce(op, value, dests)
        if done is not _UNHANDLED:
            return done
        return place(self.reduce_leaves(op, [value], options)[0], dests)

    def batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple],
        options: Any = None,
    ) -> list[Any]:
        """:meth:`reduce_to` for many ``(value, destinations)`` pairs, in one batched collective."""
        require_cross_replica(self._strategy, "extended.batch_reduce_to")
        op = ReduceOp.from_any(reduce_op)
        pairs = list(value_destination_pairs)
        if not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
            raise ValueError(
                "value_destination_pairs must be a list of (value, destinations) pairs"
            )
        dests = [destination_devices(d, self._devices) for _, d in pairs]
        done = [self._local_gpu_reduce(op, v, ds) for (v, _), ds in zip(pairs, dests, strict=True)]
        rest = [v for (v, _), r in zip(pairs, done, strict=True) if r is _UNHANDLED]
        reduced = iter(self.reduce_leaves(op, rest, options) if rest else ())
        return [
            place(next(reduced), ds) if r is _UNHANDLED else r
            for r, ds in zip(done, dests, strict=True)
        ]

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """A copy of ``tensor`` on each device of ``destinations`` (this worker's devices).

        Example: ``extended.broadcast_to(np.zeros(3), destinations=var)``.
        """
        require_cross_replica(self._strategy, "extended.broadcast_to")
        if isinstance(tensor, DistributedValues) and not isinstance(tensor, Mirrored):
            raise TypeError(
                "broadcast_to copies one value to every device; got a PerReplica. Reduce it "
                "first (reduce_to) or pick one replica's value"
            )
        if isinstance(tensor, Mirrored):
            tensor = tensor.primary
        return place(asarray(tensor), destination_devices(destinations, self._devices))

    # -- gathering ----------------------------------------------------------------------------
    def _gather_components(self, value: Any) -> list[Any]:
        if isinstance(value, (DistributedValues, DistributedVariable)):
            comps = list(value.values)
        else:
            comps = [value]  # a plain value is this worker's contribution (as TF)
        comps = [asarray(c.raw_value() if isinstance(c, Variable) else c) for c in comps]
        for c in comps:
            if c.ndim == 0:
                raise ValueError(
                    "gather needs values of rank >= 1 to concatenate, got a scalar; reshape "
                    "each replica's value to shape (1,) first, or use reduce"
                )
        return comps

    def _gather_leaf(self, value: Any, axis: int, options: Any = None) -> Any:
        device = self._devices[0]
        comps = [
            to_device(c, device.device_type, device.index, copy=False)
            for c in self._gather_components(value)
        ]
        ndim = comps[0].ndim
        if not -ndim <= axis < ndim:
            raise ValueError(f"axis {axis} is out of range for values of rank {ndim}")
        if len(comps) == 1 and self._num_workers > 1:
            # One replica per worker: the engine reads the value in place and returns a
            # new array (no local concatenation copy on the way).
            return self._collectives.allgather(comps[0], axis=axis, options=options)
        xp = array_module(comps[0])
        try:
            local = xp.concatenate(comps, axis=axis)
        except ValueError as error:
            shapes = [tuple(c.shape) for c in comps]
            raise ValueError(
                f"cannot gather values of shapes {shapes} along axis {axis}: all dimensions "
                "but the gather axis must agree"
            ) from error
        if self._num_workers > 1:
            local = self._collectives.allgather(local, axis=axis, options=options)
        return local

    def _gather_to_host(self, value: Any, axis: int) -> Any:
        leaves = nest.flatten(value)
        batched = self._gather_batch(leaves, axis, None)
        if batched is not None:
            return nest.pack_sequence_as(value, [as_result(g) for g in batched])
        return nest.map_structure(lambda v: as_result(self._gather_leaf(v, axis)), value)

    def _all_gather_leaves(self, leaves: list[Any], axis: int, options: Any) -> list[Any]:
        batched = self._gather_batch(leaves, axis, options)
        if batched is not None:
            return [place(g, self._devices) for g in batched]
        return [place(self._gather_leaf(v, axis, options), self._devices) for v in leaves]

    def _gather_batch(self, leaves: list[Any], axis: int, options: Any) -> list[Any] | None:
        """One replica per worker, NumPy values: every leaf in one engine call (pooled
        results), else ``None``."""
        if self._num_workers == 1 or len(self._devices) != 1 or not leaves:
            return None
        if self._devices[0].device_type != "CPU":
            return None
        comps = [self._gather_components(v) for v in leaves]
        if not all(len(c) == 1 and c[0].__class__ is np.ndarray for c in comps):
            return None
        for (c,) in comps:
            if not -c.ndim <= axis < c.ndim:
                raise ValueError(f"axis {axis} is out of range for values of rank {c.ndim}")
        return self._collectives.allgather_list([c for (c,) in comps], axis, options)

    # -- variables ----------------------------------------------------------------------------
    def update(
        self,
        var: Any,
        fn: Callable,
        args: tuple = (),
        kwargs: dict | None = None,
        group: bool = True,
    ) -> Any:
        """Run ``fn(component, *args, **kwargs)`` on each component of ``var``.

        A ``PerReplica`` argument gives each component its own value. In a
        replica context this is a merge call. Returns ``var`` when ``fn``
        returns the component it updated, else the grouped results.

        Example: ``extended.update(v, lambda var, x: var.assign_add(x), args=(1.0,))``.
        """

        kwargs = kwargs or {}
        ctx = context.get_replica_context()
        if (
            ctx is not None
            and ctx.strategy is self._strategy
            and self._strategy is not (context.default_strategy())
        ):
            return ctx._merge(
                lambda s, *a, **kw: s.extended.update(var, fn, a, kw, group),
                args,
                kwargs,
                False,
                ("update", id(var)),
            )
        require_cross_replica(self._strategy, "extended.update")
        if context.get_cross_replica_context() is not self._strategy:
            with self._strategy.scope():  # fn runs in the cross-replica context, as in TF
                return self.update(var, fn, args, kwargs, group)
        if not isinstance(var, DistributedVariable):
            return fn(var, *args, **kwargs)
        results = []
        for i, component in enumerate(var.values):
            with self._main_device_scope(i):
                results.append(fn(component, *select_replica(i, args), **select_replica(i, kwargs)))
        if all(r is c for r, c in zip(results, var.values, strict=True)):
            return var
        if not group:
            return tuple(results)
        return regroup(results, Mirrored)

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Place variables created inside on the devices of ``colocate_with_variable``.

        Every variable of these strategies is on all replica devices already,
        so this only checks its argument.

        Example: ``with strategy.extended.colocate_vars_with(v): slot = hd.Variable(0.0)``.
        """

        if not isinstance(colocate_with_variable, Variable):
            raise TypeError(
                f"colocate_vars_with needs a variable, got {type(colocate_with_variable).__name__}"
            )
        yield

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether ``v`` was created in this strategy's scope."""
        return getattr(v, "_distribute_strategy", None) is self._strategy

    def value_container(self, value: Any) -> Any:
        """The distributed variable that owns the component ``value``, else ``value``.

        Example: ``extended.value_container(v.values[0]) is v``.
        """
        container = getattr(value, "_container", None)
        return value if container is None else container

    def read_var(self, v: Any) -> Any:
        """The value of ``v`` in the cross-replica context (aggregated for sync-on-read)."""
        return v.read_value()

    def create_variable(self, initial_value: Any, dtype: Any, shape: Any, spec: dict) -> Any:
        """The variable this strategy makes for ``hd.Variable(...)`` in its scope."""

        value = vs.initial_array(initial_value, dtype, shape)
        if not self._distributed_variables:
            device = self._variable_device
            if device is None:
                value = array_module(value).array(value, copy=True)
            else:
                value = to_device(value, device.device_type, device.index)
            return vs.Variable._make(value, device=device, strategy=self._owner(), **spec)
        if spec["synchronization"] is vs.VariableSynchronization.NONE:
            raise ValueError(
                f"synchronization NONE is not supported for variables of a distribution "
                f"strategy (variable {spec['name']!r}): use AUTO/ON_WRITE (kept in sync on "
                "write) or ON_READ (combined when read)"
            )
        if spec["aggregation"] is vs.VariableAggregation.MEAN and not _is_float(value):
            raise ValueError(
                f"a distributed variable with aggregation MEAN must have a floating dtype; "
                f"variable {spec['name']!r} is {value.dtype}. Use a float initial value or "
                "another aggregation (SUM, ONLY_FIRST_REPLICA)"
            )
        components = self._replica_components(self.broadcast_initial_value(value), spec)
        on_read = spec["synchronization"] is vs.VariableSynchronization.ON_READ
        kind = vs.SyncOnReadVariable if on_read else vs.MirroredVariable
        return kind(self._strategy, components, **spec)

    def _replica_components(self, value: Any, spec: dict) -> tuple[Any, ...]:
        """One plain variable per local device holding a copy of ``value`` (``name/replica_i``)."""

        return tuple(
            vs.Variable._make(
                to_device(value, d.device_type, d.index),
                device=d,
                strategy=self._strategy,
                **{**spec, "name": spec["name"] if i == 0 else f"{spec['name']}/replica_{i}"},
            )
            for i, d in enumerate(self._devices)
        )

    def _owner(self) -> Any:
        """The strategy recorded on plain variables made in scope (``None`` for the default)."""
        return self._strategy

    def broadcast_initial_value(self, value: Any) -> Any:
        """Worker 0's ``value`` on every worker (collective when there are several)."""
        if self._num_workers > 1:
            return self._collectives.broadcast([value], root=0)[0]
        return value


_UNHANDLED = object()  # _local_gpu_reduce: this value goes the usual way


def _host_values(value: PerReplica, count: int) -> bool:
    """Whether ``value`` has ``count`` components, each a NumPy array."""
    values = value.values
    return len(values) == count and all(v.__class__ is np.ndarray for v in values)


def _plain_arrays(args: tuple) -> bool:
    """Whether every argument is a NumPy array, or a list of them (a gradient list)."""
    for a in args:
        if a.__class__ is np.ndarray:
            continue
        if a.__class__ is list and all(x.__class__ is np.ndarray for x in a):
            continue
        return False
    return True


def _is_float(x: Any) -> bool:
    return bool(array_module(x).issubdtype(x.dtype, array_module(x).floating))
