"""The ``Strategy`` API every strategy shares: scope, run, reduce, gather.

A strategy is a thin object; the work is done by its ``extended``
(:class:`~hpcdist.distribute.extended.StrategyExtended`). This module holds
the argument checks and the semantics TF documents for ``reduce`` with an
axis: ``SUM`` (also ``MIN``/``MAX``) reduces inside each replica and then
across replicas; ``MEAN`` divides the global sum by the global count of
elements, so uneven and partial batches give the exact mean.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> v = s.experimental_distribute_values_from_function(
    ...     lambda ctx: np.arange(4.0) if ctx.replica_id_in_sync_group == 0 else np.arange(2.0))
    >>> float(s.reduce("MEAN", v, axis=0))  # (0+1+2+3 + 0+1) / 6
    1.1666666666666667
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcdist.arrays import array_module, as_result, asarray
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute import context, nest
from hpcdist.distribute.input_pipeline import input_pipeline
from hpcdist.distribute.values import (
    PerReplica,
    import_values,
    is_distributed,
    local_results,
    select_replica,
)

if TYPE_CHECKING:
    from hpcdist.cluster.base import ClusterResolver
    from hpcdist.distribute.extended import StrategyExtended


def mixing_error(current: Any, called: Any) -> RuntimeError:
    """The error for using a strategy while another one is current."""
    return RuntimeError(
        f"Mixing different strategies: {called!r} is used while {current!r} is current "
        "(its scope or run is active). Use one strategy per program section: leave the "
        "other strategy's `with scope()` block first."
    )


def require_cross_replica(strategy: Strategy, method: str) -> None:
    """Raise unless ``strategy`` may run a cross-replica method here.

    Allowed: in ``strategy``'s cross-replica context, or where only the
    default strategy is current. Inside ``strategy.run`` it is a
    ``RuntimeError`` that points at ``merge_call``; while another strategy is
    current it is the mixing error.
    """
    mode = context.current_mode()
    if mode.cross_replica is strategy:
        return
    default = context.default_strategy()
    if mode.strategy is not strategy:
        if mode.strategy is default:
            return
        raise mixing_error(mode.strategy, strategy)
    if strategy is default and mode.replica is strategy.extended._default_replica_context():
        return
    raise RuntimeError(
        f"{method} must be called in the cross-replica context, not inside strategy.run; "
        "call it after run returns, or from a replica function use "
        "hpcdist.get_replica_context().merge_call(fn) (or all_reduce / all_gather)"
    )


class _Scope:
    """The context manager ``strategy.scope()`` returns."""

    def __init__(self, strategy: Strategy) -> None:
        self._strategy = strategy
        self._modes: list[context.Mode] = []

    def __enter__(self) -> Strategy:
        strategy = self._strategy
        mode = context.current_mode()
        if mode.strategy is not strategy and context.has_strategy():
            raise mixing_error(mode.strategy, strategy)
        if mode.strategy is strategy and mode.replica is not None:
            if strategy is not context.default_strategy():
                raise RuntimeError(
                    "strategy.scope() was entered inside strategy.run; the replica function "
                    "already runs under the strategy. Create variables before run, or "
                    "use hpcdist.get_replica_context().merge_call(fn)"
                )
        new = context.Mode(strategy, strategy, None)
        context.push_mode(new)
        self._modes.append(new)
        return strategy

    def __exit__(self, *exc: object) -> None:
        context.pop_mode(self._modes.pop())


class Strategy:
    """Base class of the distribution strategies (``tf.distribute.Strategy``).

    Example: ``with strategy.scope(): v = hd.Variable(1.0)``, then
    ``strategy.reduce("SUM", strategy.run(fn), axis=None)``.
    """

    def __init__(self, extended: Any) -> None:
        self._extended = extended

    # -- properties -----------------------------------------------------------------
    @property
    def extended(self) -> StrategyExtended:
        """The :class:`StrategyExtended` with the lower-level API."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas that take part in each step, over all workers."""
        return self._extended._num_replicas_in_sync

    @property
    def cluster_resolver(self) -> ClusterResolver | None:
        """The cluster resolver of a multi-worker strategy, else ``None``."""
        return self._extended.cluster_resolver

    def __repr__(self) -> str:
        return f"<{type(self).__name__} replicas={self.num_replicas_in_sync}>"

    # -- contexts ---------------------------------------------------------------------
    def scope(self) -> _Scope:
        """A context manager that makes this strategy current.

        Variables created inside are distributed by the strategy. Entering the
        scope of another strategy inside this one raises ``RuntimeError``.

        Example: ``with strategy.scope(): v = hd.Variable(np.zeros(3))``.
        """
        return _Scope(self)

    # -- running ------------------------------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        args: tuple | list = (),
        kwargs: dict | None = None,
        options: Any = None,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` on every local replica; return the grouped results.

        Distributed values in ``args``/``kwargs`` give each replica its own
        component. A result that is the same object on every replica (or the
        only replica's) is returned as it is; others become ``PerReplica``.
        """
        del options  # accepted for TF compatibility; nothing to tune yet
        if not isinstance(args, (tuple, list)):
            raise ValueError(
                f"positional args must be a tuple or list, got {type(args).__name__}; "
                "write args=(x,) for a single argument"
            )
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
        require_cross_replica(self, "strategy.run")
        return self._extended.call_for_each_replica(fn, tuple(args), dict(kwargs or {}))

    def experimental_run_v2(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """The old name of :meth:`run`."""
        return self.run(fn, args=args, kwargs=kwargs, options=options)

    # -- reducing ---------------------------------------------------------------------
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Reduce ``value`` over all replicas; the result is one array on this worker.

        ``axis=None`` reduces across replicas only. With an axis, ``SUM``,
        ``MIN`` and ``MAX`` reduce inside each replica along ``axis`` and then
        across replicas; ``MEAN`` divides the global sum by the global count
        of elements along ``axis`` (TF allows only SUM and MEAN with an axis;
        hpcdist also gives MIN and MAX).
        """
        require_cross_replica(self, "strategy.reduce")
        op = ReduceOp.from_any(reduce_op)
        value, back = import_values(value)  # torch/jax/tf: NumPy/CuPy views, the type back out
        return back(self._reduce(op, value, axis))

    def _reduce(self, op: ReduceOp, value: Any, axis: int | None) -> Any:
        ext = self._extended
        if axis is None:
            return as_result(ext._reduce_to_host(op, value))
        if op is ReduceOp.MEAN:
            numer, denom = self._per_replica(value, lambda x: _sum_and_count(x, axis))
            total = ext._reduce_to_host(ReduceOp.SUM, numer)
            count = ext._reduce_to_host(ReduceOp.SUM, denom)
            xp = array_module(total)
            return as_result(xp.true_divide(total, xp.asarray(count, dtype=total.dtype)))
        reduce_fn = {ReduceOp.SUM: "sum", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}[op]
        partial = self._per_replica(value, lambda x: _reduce_axis(x, axis, reduce_fn))[0]
        return as_result(ext._reduce_to_host(op, partial))

    def _per_replica(self, value: Any, fn: Callable[[Any], tuple]) -> tuple[Any, ...]:
        """Apply ``fn`` (returning a tuple) to each local component, in cross-replica context.

        A plain value is taken to be on every local replica, as if each
        replica had computed it (what TF's ``run`` of the reduction does).
        """
        parts = [fn(asarray(v)) for v in local_results(value)]
        if not _is_distributed_input(value):
            parts = parts * self._extended._num_local_replicas
        return tuple(PerReplica(items) for items in zip(*parts, strict=True))

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenate every replica's ``value`` along ``axis``, in replica order.

        Sizes along ``axis`` may differ between replicas. The result is one
        array on this worker.
        """
        require_cross_replica(self, "strategy.gather")
        value, back = import_values(value)  # torch/jax/tf: NumPy/CuPy views, the type back out
        return back(self._extended._gather_to_host(value, axis))

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """This worker's components of ``value`` (``(value,)`` for a plain value).

        A nested structure gives one structure per local replica.

        Example: ``strategy.experimental_local_results(strategy.run(fn))``.
        """

        if nest.is_nested(value):
            k = self._extended._num_local_replicas
            return tuple(select_replica(i, value) for i in range(k))
        return local_results(value)

    # -- input -------------------------------------------------------------------------
    def _input_args(self) -> dict[str, Any]:
        ext = self._extended
        return {
            "num_workers": ext._num_workers,
            "worker_index": ext._worker_index,
            "num_replicas_per_worker": ext._num_local_replicas,
            "collectives": ext._collectives,
            "devices": ext._devices,
        }

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """Split each global batch of ``dataset`` over all replicas (TF's rebatch and autoshard).

        The dataset's batch size is the global batch size. Each step gives a
        ``PerReplica`` of this worker's sub-batches; see :mod:`hpcdist.data`.

        Example: ``for x in strategy.experimental_distribute_dataset(ds.batch(64)): ...``.
        """
        return input_pipeline().distribute_dataset(dataset, options, **self._input_args())

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Any], options: Any = None
    ) -> Any:
        """Call ``dataset_fn(InputContext)`` once per worker; it returns per-replica batches.

        Example: ``strategy.distribute_datasets_from_function(lambda ctx:
        make(ctx).batch(ctx.get_per_replica_batch_size(64)))``.
        """
        return input_pipeline().distribute_datasets_from_function(
            dataset_fn, options, **self._input_args()
        )

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def experimental_make_numpy_dataset(self, numpy_input: Any) -> Any:
        """A dataset of the slices of ``numpy_input`` (arrays or nested tuples/dicts of them).

        Example: ``strategy.experimental_make_numpy_dataset((x, y)).batch(32)``.
        """
        return input_pipeline().make_numpy_dataset(numpy_input)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """A ``PerReplica`` of ``value_fn(ctx)`` for each local replica.

        ``ctx`` is a :class:`ValueContext` with ``replica_id_in_sync_group``
        and ``num_replicas_in_sync``.

        Example: ``strategy.experimental_distribute_values_from_function(lambda c:
        data[c.replica_id_in_sync_group])``.
        """
        return self._extended._distribute_values_from_function(value_fn)


class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells ``value_fn``."""

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )


def _is_distributed_input(value: Any) -> bool:
    return is_distributed(value)


def _check_axis(x: Any, axis: int) -> int:
    if x.ndim == 0:
        raise ValueError(
            f"reduce with axis={axis} needs values of rank >= 1, got a scalar; use axis=None"
        )
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for values of shape {x.shape}")
    return axis % x.ndim


def _sum_and_count(x: Any, axis: int) -> tuple[Any, Any]:
    axis = _check_axis(x, axis)
    xp = array_module(x)
    return xp.sum(x, axis=axis), xp.asarray(x.shape[axis], dtype=xp.int64)


def _reduce_axis(x: Any, axis: int, name: str) -> tuple[Any]:
    axis = _check_axis(x, axis)
    xp = array_module(x)
    if name != "sum" and x.shape[axis] == 0:
        raise ValueError(
            f"{name.upper()} along axis {axis} of an empty replica value (shape {x.shape}) is "
            "not defined; every replica needs at least one element along the axis"
        )
    return (getattr(xp, name)(x, axis=axis),)
