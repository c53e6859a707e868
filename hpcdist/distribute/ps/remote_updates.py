"""``apply_gradients`` for variables on parameter servers: push the gradients, the ps updates.

Under :class:`~hpcdist.distribute.ps.strategy.ParameterServerStrategy` a
worker does not update variables itself. ``apply_gradients``:

1. sums the gradients of the worker's local replicas (one merge call: the
   replicas of a worker are synchronous);
2. takes the next global step from the optimizer's ``iterations`` variable on
   the ps (an atomic fetch-and-add, so the learning-rate schedule sees the
   number of updates of all workers);
3. clips (``clipnorm``, ``global_clipnorm``, ``clipvalue``) on the worker;
4. sends each ps one request with the gradients of its variables (sparse
   ``IndexedSlices`` gradients only the rows they touch); the ps runs the
   optimizer's fused kernel on its shards. Nothing waits for other workers.

The optimizer calls in (``hpcdist.optimizers`` is the layer above; this module imports
nothing from it): it passes itself as a :class:`RemoteOptimizer`, a small view with
public members. The ps objects are used through their public interface too
(``PSVariable.ps_task``/``var_id``/``version``, ``ParameterServerExtended.ps_client``/
``register_optimizer``/``create_ps_variable``, ``ShardedVariable.split``).

Example: inside ``strategy.run``, ``optimizer.apply_gradients(zip(grads, model.trainable_weights))``
works unchanged for ps variables.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from hpcdist.arrays import asarray, to_host
from hpcdist.distribute import context
from hpcdist.distribute.indexed_slices import IndexedSlices
from hpcdist.distribute.ps.variable import PSVariable
from hpcdist.distribute.sharded_variable import ShardedVariable
from hpcdist.distribute.values import PerReplica, local_results
from hpcdist.distribute.variables import Variable, VariableAggregation, VariableSynchronization


class RemoteOptimizer(Protocol):
    """What an optimizer gives :func:`apply_gradients` (``hpcdist.optimizers`` implements it).

    ``optimizer`` is the optimizer object itself (registered with the ps by its class name
    and config); ``iterations`` is its step counter, replaced by a ps variable on first use.
    """

    iterations: Any

    @property
    def name(self) -> str:
        """The optimizer's name (the ps variable of its step is ``<name>/iterations``)."""
        ...

    @property
    def clipnorm(self) -> float | None:
        """Clip each gradient to this norm (on the worker, before the push)."""
        ...

    @property
    def global_clipnorm(self) -> float | None:
        """Clip the gradients to this global norm."""
        ...

    @property
    def clipvalue(self) -> float | None:
        """Clip each gradient element to ``[-clipvalue, clipvalue]``."""
        ...

    @property
    def optimizer(self) -> Any:
        """The optimizer object (its class name and ``get_config()`` go to the ps)."""
        ...

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of global step ``step`` (schedules run on the workers)."""
        ...

    def check_missing(self, pairs: list, variables: list, missing: list, stacklevel: int) -> None:
        """Warn or raise for variables without gradients, as the optimizer does locally."""
        ...


def targets_ps(pairs: list) -> bool:
    """Whether any variable of the ``(gradient, variable)`` pairs lives on parameter servers.

    Example: ``targets_ps([(g, ps_variable)])`` is ``True``.
    """
    for pair in pairs:
        v = pair[1] if isinstance(pair, (tuple, list)) and len(pair) == 2 else None
        if isinstance(v, PSVariable):
            return True
        shards = getattr(v, "variables", None)
        if isinstance(shards, (list, tuple)) and shards and isinstance(shards[0], PSVariable):
            return True
    return False


def _extended(v: Any) -> Any:
    shards = getattr(v, "variables", None)
    return (shards[0] if isinstance(shards, (list, tuple)) else v).extended


def apply_gradients(optimizer: RemoteOptimizer, pairs: list) -> Any:
    """Push ``pairs``' gradients to the ps; returns the optimizer's ``iterations``.

    Example: ``apply_gradients(view, [(g, v)])`` for a ps variable ``v``, where ``view`` is
    the optimizer's :class:`RemoteOptimizer`.
    """
    grads, variables = _filter(optimizer, pairs)
    ext = _extended(variables[0])
    for v in variables[1:]:
        if _extended(v) is not ext:
            raise ValueError(
                f"variable {v.name!r} belongs to another ParameterServerStrategy than "
                f"{variables[0].name!r}; one apply_gradients updates one strategy's variables"
            )
    ctx = context.get_replica_context()
    strategy = ext.strategy
    if (
        ctx is not None
        and ctx.strategy is strategy
        and ext.num_local_replicas > 1
        and getattr(ctx, "_merger", None) is not None
    ):

        def merge(s: Any, g: Any) -> Any:
            return _push(optimizer, ext, variables, [_local_sum(x) for x in g])

        key = ("ps_apply_gradients", id(optimizer.optimizer), tuple(id(v) for v in variables))
        return ctx._merge(merge, (tuple(grads),), None, False, key)
    return _push(optimizer, ext, variables, [_local_sum(g) for g in grads])


def _filter(optimizer: RemoteOptimizer, pairs: list) -> tuple[list, list]:
    grads, variables, missing, seen = [], [], [], set()
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(
                f"apply_gradients expects (gradient, variable) pairs, got {pair!r}; "
                "write apply_gradients(zip(grads, variables))"
            )
        g, v = pair
        if not isinstance(v, (PSVariable, ShardedVariable)):
            raise TypeError(
                f"variable {getattr(v, 'name', v)!r} is not a parameter-server variable, but "
                "others in this apply_gradients are; create all of them in the "
                "ParameterServerStrategy's scope"
            )
        if id(v) in seen:
            raise ValueError(
                f"variable {v.name!r} appears twice in grads_and_vars; pass each variable once"
            )
        seen.add(id(v))
        if g is None:
            missing.append(v.name)
            continue
        grads.append(g)
        variables.append(v)
    optimizer.check_missing(pairs, variables, missing, stacklevel=5)
    return grads, variables


def _host(x: Any) -> np.ndarray:
    if isinstance(x, Variable):
        x = x.value()  # a read-only view, no copy
    return np.asarray(to_host(asarray(x)))


def _local_sum(g: Any) -> Any:
    """One gradient of the worker: the sum of its local replicas' gradients."""
    parts = list(local_results(g)) if isinstance(g, PerReplica) else [g]
    if isinstance(parts[0], IndexedSlices):
        if len(parts) == 1:
            return parts[0]
        return IndexedSlices(
            np.concatenate([_host(p.values) for p in parts]),
            np.concatenate([_host(p.indices) for p in parts]),
            parts[0].dense_shape,
        )
    total = _host(parts[0])
    for p in parts[1:]:
        total = total + _host(p)
    return total


def _iterations(optimizer: RemoteOptimizer, ext: Any) -> Any:
    """The optimizer's ``iterations`` as a ps variable (the global step), made on first use."""
    it = optimizer.iterations
    if isinstance(it, PSVariable) and it.extended is ext:
        return it
    start = 0 if it is None else int(np.asarray(it.value() if isinstance(it, Variable) else it))
    spec = {
        "name": f"{optimizer.name}/iterations",
        "trainable": False,
        "synchronization": VariableSynchronization.AUTO,
        "aggregation": VariableAggregation.ONLY_FIRST_REPLICA,
    }
    optimizer.iterations = ext.create_ps_variable(np.int64(start), spec)
    return optimizer.iterations


def _clip(optimizer: RemoteOptimizer, dense: list[np.ndarray]) -> list[np.ndarray]:
    if optimizer.clipnorm is not None:
        out = []
        for g in dense:
            norm = math.sqrt(float(np.vdot(g, g)))
            out.append(g * (optimizer.clipnorm / norm) if norm > optimizer.clipnorm else g)
        return out
    if optimizer.global_clipnorm is not None:
        norm = math.sqrt(sum(float(np.vdot(g, g)) for g in dense))
        if norm > optimizer.global_clipnorm:
            return [g * (optimizer.global_clipnorm / norm) for g in dense]
        return dense
    if optimizer.clipvalue is not None:
        c = optimizer.clipvalue
        return [np.clip(g, -c, c) for g in dense]
    return dense


def _push(optimizer: RemoteOptimizer, ext: Any, variables: list, grads: list) -> Any:
    """Clip, then one apply request per ps (plus sparse ones); invalidates the caches."""
    client = ext.ps_client
    opt_id = ext.register_optimizer(optimizer.optimizer)
    it = _iterations(optimizer, ext)
    new_step = client.add_fetch(it.ps_task, it.var_id, np.ones((), np.int64))
    it.set_cached(np.asarray(new_step, np.int64).reshape(()))
    step = int(new_step) - 1
    lr = optimizer.learning_rate_at(step)
    sparse = [isinstance(g, IndexedSlices) for g in grads]
    dense_values = [g.values if s else g for g, s in zip(grads, sparse, strict=True)]
    dense_values = _clip(optimizer, [_host(x) for x in dense_values])
    by_ps: dict[int, tuple[list, list, list]] = {}
    touched = []

    def add_dense(shard: Any, g: np.ndarray) -> None:
        ids, gs, versions = by_ps.setdefault(shard.ps_task, ([], [], []))
        ids.append(shard.var_id)
        gs.append(np.array(g, dtype=shard.dtype, order="C"))
        versions.append(shard.version)
        touched.append(shard)

    for v, g, values, is_sparse in zip(variables, grads, dense_values, sparse, strict=True):
        if is_sparse:
            _push_sparse(client, opt_id, lr, v, IndexedSlices(values, g.indices, g.dense_shape))
            touched.extend(v.variables if isinstance(v, ShardedVariable) else [v])
            continue
        if tuple(values.shape) != tuple(v.shape):
            raise ValueError(
                f"the gradient for variable {v.name!r} has shape {tuple(values.shape)} but the "
                f"variable has shape {tuple(v.shape)}; they must match"
            )
        if isinstance(v, ShardedVariable):
            for shard, piece in zip(v.variables, v.split(values), strict=True):
                add_dense(shard, piece)
        else:
            add_dense(v, values)
    for ps, (ids, gs, versions) in by_ps.items():
        client.apply(ps, opt_id, ids, gs, lr, versions)
    for shard in touched:
        shard.invalidate()
    return it


def _push_sparse(client: Any, opt_id: int, lr: float, v: Any, slices: Any) -> None:
    indices = np.asarray(to_host(asarray(slices.indices)), dtype=np.int64).reshape(-1)
    values = _host(slices.values)
    if isinstance(v, ShardedVariable):
        for i, rows, vals in v.split_indexed_slices(type(slices)(values, indices, v.shape)):
            shard = v.variables[i]
            client.apply_sparse(
                shard.ps_task,
                opt_id,
                shard.var_id,
                np.ascontiguousarray(rows, dtype=np.int64),
                np.ascontiguousarray(vals, dtype=shard.dtype),
                lr,
                shard.version,
            )
        return
    if indices.size and (indices.min() < 0 or indices.max() >= v.shape[0]):
        raise IndexError(
            f"a sparse gradient for variable {v.name!r} has row indices outside "
            f"[0, {v.shape[0]}); they must index its rows"
        )
    client.apply_sparse(
        v.ps_task,
        opt_id,
        v.var_id,
        np.ascontiguousarray(indices),
        np.ascontiguousarray(values, dtype=v.dtype),
        lr,
        v.version,
    )


__all__ = ["RemoteOptimizer", "apply_gradients", "targets_ps"]
