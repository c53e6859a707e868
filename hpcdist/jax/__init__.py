"""JAX on hpcdist: all-reduce, broadcast and all-gather of pytrees over the replicas.

One MPI rank is one replica. Leaves are JAX arrays (or anything
:func:`jax.numpy.asarray` takes); the engine reads a CPU array's memory in
place (DLPack) and the results are JAX arrays on the leaves' devices. Inside
``strategy.run`` the reduction goes through the replica context; outside,
straight to the engine of the current strategy (default: every rank).

Importing :mod:`hpcdist` never imports JAX; importing this module does.

Example::

    import jax, hpcdist.jax as hdj
    params = hdj.broadcast(params, root=0)
    grads = jax.grad(loss_fn)(params, local_x, local_y)
    grads = hdj.all_reduce(grads)            # MEAN over the replicas
    params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hpcdist.adapters import engine_for
from hpcdist.collectives import CommunicationOptions, ReduceOp
from hpcdist.distribute import context

__all__ = ["all_gather", "all_reduce", "broadcast"]


def _leaves(tree: Any) -> tuple[list[Any], Any]:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves], treedef


def _replica_context() -> Any:
    ctx = context.get_replica_context()
    if ctx is None or ctx.strategy is context.default_strategy():
        return None
    return ctx


def all_reduce(
    tree: Any,
    op: ReduceOp | str = "MEAN",
    strategy: Any = None,
    compression: str | None = None,
    compression_filter: Any = None,
) -> Any:
    """Every leaf of ``tree`` reduced with ``op`` (default MEAN) over all replicas.

    bfloat16 leaves are reduced in float32 and rounded once. ``compression``
    (``"bf16"``, ``"fp16"``) and ``compression_filter``: how float32 leaves
    travel between nodes (:class:`~hpcdist.CommunicationOptions`).
    Example: ``grads = hdj.all_reduce(jax.grad(loss)(params, x, y), compression="bf16")``.
    """
    options = CommunicationOptions(
        compression=compression, compression_filter=compression_filter
    )
    leaves, treedef = _leaves(tree)
    if not leaves:
        return tree
    ctx = _replica_context() if strategy is None else None
    if ctx is not None:
        reduced = ctx.all_reduce(op, leaves, options)
    else:
        reduced = engine_for(strategy).allreduce(leaves, op, options)
    return jax.tree_util.tree_unflatten(treedef, list(reduced))


def broadcast(tree: Any, root: int = 0, strategy: Any = None) -> Any:
    """Rank ``root``'s ``tree``, on every rank (the other ranks' leaves give shapes and dtypes).

    Example: ``params = hdj.broadcast(init_params(key), root=0)``.
    """
    leaves, treedef = _leaves(tree)
    if not leaves:
        return tree
    out = engine_for(strategy).broadcast(leaves, root=root)
    return jax.tree_util.tree_unflatten(treedef, out)


def all_gather(tree: Any, axis: int = 0, strategy: Any = None) -> Any:
    """Every leaf of ``tree`` concatenated along ``axis`` over all replicas, in replica order."""
    leaves, treedef = _leaves(tree)
    ctx = _replica_context() if strategy is None else None
    if ctx is not None:
        out = ctx.all_gather(leaves, axis)
    else:
        engine = engine_for(strategy)
        out = [engine.allgather(x, axis) for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, list(out))
