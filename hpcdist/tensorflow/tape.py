"""``DistributedGradientTape``, gradient allreduce (eager or in a graph) and variable broadcast.

Example::

    tape = hdtf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hpcdist.adapters import engine_for
from hpcdist.collectives import CommunicationOptions, ReduceOp


def allreduce_gradients(
    grads: Sequence[Any],
    op: ReduceOp | str = "MEAN",
    strategy: Any = None,
    compression: str | None = None,
    compression_filter: Any = None,
) -> list[Any]:
    """``grads`` (tensors, ``IndexedSlices`` or ``None``) reduced over the replicas.

    Eagerly the engine reads each tensor's memory in place; inside a
    ``tf.function`` the reduction runs as a ``tf.numpy_function`` (one call
    for all gradients). ``IndexedSlices`` are made dense first. ``None``
    (a variable without a gradient) stays ``None``; every rank must have the
    same ``None``s. ``compression`` (``"bf16"``, ``"fp16"``) and
    ``compression_filter``: as in :class:`~hpcdist.CommunicationOptions`.

    Example: ``grads = hdtf.allreduce_gradients(tape.gradient(loss, variables))``.
    """
    engine = engine_for(strategy)
    options = CommunicationOptions(
        compression=compression, compression_filter=compression_filter
    )
    grads = list(grads)
    where = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in where]
    if not dense:
        return grads
    if tf.executing_eagerly():
        reduced = engine.allreduce(dense, op, options)
    else:
        def reduce(*arrays: Any) -> list[Any]:
            return engine.allreduce(list(arrays), op, options)

        reduced = tf.numpy_function(reduce, dense, [g.dtype for g in dense], stateful=True)
        for r, g in zip(reduced, dense, strict=True):
            r.set_shape(g.shape)
    out = list(grads)
    for i, r in zip(where, reduced, strict=True):
        out[i] = r
    return out


class _DistributedTape:
    """A ``tf.GradientTape`` whose ``gradient`` averages over the replicas."""

    def __init__(
        self, tape: tf.GradientTape, op: ReduceOp | str, strategy: Any, compression: Any = (None,)
    ) -> None:
        self._tape = tape
        self._op = op
        self._strategy = strategy
        self._compression = compression  # (compression, compression_filter)

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        """The tape's gradients of ``target`` by ``sources``, reduced over the replicas."""
        grads = self._tape.gradient(target, sources, *args, **kwargs)
        flat = tf.nest.flatten(grads)
        reduced = allreduce_gradients(flat, self._op, self._strategy, *self._compression)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> _DistributedTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)


def DistributedGradientTape(  # noqa: N802  (named as in Horovod)
    tape: tf.GradientTape,
    op: ReduceOp | str = "MEAN",
    strategy: Any = None,
    compression: str | None = None,
    compression_filter: Any = None,
) -> Any:
    """Wrap ``tape`` so that ``tape.gradient(...)`` is averaged (``op``) over the replicas.

    ``compression``: ``"bf16"`` or ``"fp16"`` sends float32 gradients between
    nodes as 16-bit floats (see :class:`~hpcdist.CommunicationOptions`).
    """
    CommunicationOptions(compression=compression, compression_filter=compression_filter)
    return _DistributedTape(tape, op, strategy, (compression, compression_filter))


def broadcast_variables(variables: Sequence[Any], root: int = 0, strategy: Any = None) -> None:
    """Assign rank ``root``'s values to ``variables`` (``tf.Variable``s) on every rank.

    Example: ``hdtf.broadcast_variables(model.variables, root=0)`` after building the model.
    """
    variables = list(variables)
    if not variables:
        return
    values = engine_for(strategy).broadcast([tf.convert_to_tensor(v) for v in variables], root)
    for v, value in zip(variables, values, strict=True):
        v.assign(value)
