"""The replica context: what a function run by ``strategy.run`` sees of its replica.

``all_reduce`` and ``all_gather`` work on nested structures and give every
replica the same result; ``merge_call(fn)`` runs ``fn(strategy, ...)`` once,
in the cross-replica context, with the arguments of all local replicas
grouped into :class:`~hpcdist.distribute.values.PerReplica` values.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> def fn():
    ...     ctx = hd.get_replica_context()
    ...     return ctx.all_reduce("sum", np.float64(ctx.replica_id_in_sync_group + 1))
    >>> s.experimental_local_results(s.run(fn))
    (np.float64(3.0), np.float64(3.0))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.arrays import as_result, asarray
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute import context, nest
from hpcdist.distribute.values import import_values

if TYPE_CHECKING:
    from hpcdist.distribute.strategy import Strategy

#: A merge function: called as merge_fn(strategy, *args, **kwargs), returns a structure.
MergeFn = Callable[..., Any]


class ReplicaContext:
    """One replica's view of its strategy, inside ``strategy.run``.

    ``merger`` does the rendezvous of a ``merge_call`` (the replica threads'
    runner); without one, the merge function runs at once on this thread.
    """

    def __init__(
        self,
        strategy: Strategy,
        replica_id_in_sync_group: int,
        local_id: int = 0,
        devices: tuple[str, ...] = (),
        merger: Callable[[MergeFn, tuple, dict, bool, Any], Any] | None = None,
    ) -> None:
        self._strategy = strategy
        self._replica_id = int(replica_id_in_sync_group)
        self._local_id = int(local_id)
        self._devices = tuple(devices)
        self._merger = merger
        self._mode: context.Mode | None = None

    # -- properties ------------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        """The strategy this replica belongs to."""
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas take part, over all workers."""
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        """This replica's id among all replicas, ``0 .. num_replicas_in_sync - 1``."""
        return self._replica_id

    @property
    def devices(self) -> tuple[str, ...]:
        """The device(s) this replica runs on."""
        return self._devices

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica_id_in_sync_group={self._replica_id}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )

    # -- entering as a context manager ----------------------------------------
    def __enter__(self) -> ReplicaContext:
        self._mode = context.Mode(self._strategy, None, self)
        context.push_mode(self._mode)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._mode is not None
        context.pop_mode(self._mode)
        self._mode = None

    # -- merge_call -------------------------------------------------------------
    def _check_current(self, method: str) -> None:
        if context.get_replica_context() is not self:
            raise RuntimeError(
                f"ReplicaContext.{method} must be called in this replica's own context (inside "
                "the function given to strategy.run, on its thread), not from the "
                "cross-replica context or another replica"
            )

    def merge_call(
        self,
        merge_fn: MergeFn,
        args: tuple | list = (),
        kwargs: dict | None = None,
        *,
        key: Any = None,
    ) -> Any:
        """Run ``merge_fn(strategy, *args, **kwargs)`` once, in the cross-replica context.

        Every local replica must call ``merge_call`` at the same point; the
        arguments of all replicas arrive grouped into ``PerReplica`` values
        (an argument that is the same object on every replica arrives as
        itself). Each replica gets back its own component of the result.
        ``key`` (an hpcdist addition) names what the replicas must agree on: replicas
        that pass different keys get a ``RuntimeError``.

        Example: ``ctx.merge_call(lambda s, x: s.reduce("sum", x, axis=None), args=(x,))``.
        """
        return self._merge(merge_fn, args, kwargs, False, key)

    def _merge(
        self, merge_fn: MergeFn, args: Any, kwargs: dict | None, wrap_all: bool, key: Any = None
    ) -> Any:
        """The rendezvous behind every merge call.

        ``wrap_all`` makes every argument a ``PerReplica`` (collectives); ``key``
        names what the replicas must agree on (the op and axis of a collective,
        the variable of a write): replicas that pass different keys get a
        ``RuntimeError`` instead of replica 0's arguments silently winning.
        """
        self._check_current("merge_call")
        if not isinstance(args, (tuple, list)):
            raise TypeError(
                f"merge_call args must be a tuple or list, got {type(args).__name__}; "
                "write args=(x,)"
            )
        kwargs = {} if kwargs is None else dict(kwargs)
        if self._merger is not None:
            return self._merger(merge_fn, tuple(args), kwargs, wrap_all, key)
        mode = context.Mode(self._strategy, self._strategy, None)
        context.push_mode(mode)
        try:
            return merge_fn(self._strategy, *args, **kwargs)
        finally:
            context.pop_mode(mode)

    # -- collectives --------------------------------------------------------------
    def all_reduce(self, reduce_op: ReduceOp | str, value: Any, options: Any = None) -> Any:
        """Reduce ``value`` (a nested structure of arrays) over all replicas.

        Every replica must call it with the same structure, shapes and dtypes;
        each gets the reduced structure back (its own copy).

        Example: ``ctx.all_reduce(hd.ReduceOp.MEAN, {"loss": loss, "grads": grads})``.
        """
        op = ReduceOp.from_any(reduce_op)
        if self._merger is None:
            fast = _fast_all_reduce(self, op, value, options)
            if fast is not None:
                return fast
        value, back = import_values(value)  # torch/jax/tf: NumPy/CuPy views, the type back out
        flat = [asarray(x) for x in nest.flatten(value)]

        def merge(strategy: Strategy, *leaves: Any) -> list[Any]:
            return strategy.extended._all_reduce_leaves(op, list(leaves), options)

        key = ("all_reduce", op.name, len(flat), [(x.shape, str(x.dtype)) for x in flat])
        reduced = self._merge(merge, flat, None, True, key)
        return back(nest.pack_sequence_as(value, [as_result(x) for x in reduced]))

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Concatenate ``value`` (nested arrays) of all replicas along ``axis``, in replica order.

        Sizes along ``axis`` may differ between replicas; the other dimensions
        must agree. Every replica gets the whole result.

        Example: ``ctx.all_gather(labels, axis=0)`` inside ``run``.
        """
        value, back = import_values(value)  # torch/jax/tf: NumPy/CuPy views, the type back out
        flat = [asarray(x) for x in nest.flatten(value)]

        def merge(strategy: Strategy, *leaves: Any) -> list[Any]:
            return strategy.extended._all_gather_leaves(list(leaves), axis, options)

        key = ("all_gather", axis, len(flat), [(x.ndim, str(x.dtype)) for x in flat])
        gathered = self._merge(merge, flat, None, True, key)
        return back(nest.pack_sequence_as(value, list(gathered)))


def _fast_all_reduce(ctx: ReplicaContext, op: ReduceOp, value: Any, options: Any) -> Any:
    """One replica per worker and a NumPy array or a list of them: the reduction without
    the nest walk and the merge rendezvous (one engine call); ``None`` for anything else."""
    if value.__class__ is np.ndarray:
        leaves = [value]
    elif value.__class__ is list and value and all(x.__class__ is np.ndarray for x in value):
        leaves = value
    else:
        return None
    ctx._check_current("all_reduce")
    reduced = ctx._strategy.extended._all_reduce_leaves(op, leaves, options)
    if value.__class__ is np.ndarray:
        return as_result(reduced[0])
    return [as_result(x) for x in reduced]
