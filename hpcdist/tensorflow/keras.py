"""Keras ``model.fit`` with hpcdist: an optimizer that averages gradients, a broadcast callback.

Works with the Keras that ships with current TensorFlow (Keras 3): the
optimizer's ``apply`` (which ``apply_gradients`` and ``fit``'s train step
call) first reduces the gradients, in the ``tf.function`` that ``fit`` compiles
as well as eagerly.

Example::

    model.compile(optimizer=hdtf.DistributedOptimizer(keras.optimizers.Adam(1e-3)), loss=...)
    model.fit(x_shard, y_shard, batch_size=global_batch // ranks,
              callbacks=[hdtf.BroadcastVariablesCallback(root=0)])
"""

from __future__ import annotations

from typing import Any

import keras

from hpcdist.collectives import CommunicationOptions
from hpcdist.tensorflow.tape import allreduce_gradients, broadcast_variables


class _Distributed:
    """What :func:`DistributedOptimizer` puts before the optimizer class's ``apply``."""

    _hd_strategy: Any = None
    _hd_compression: tuple[Any, Any] = (None, None)

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        """Average ``grads`` over the replicas, then the wrapped optimizer's ``apply``."""
        grads = allreduce_gradients(
            list(grads), "MEAN", self._hd_strategy, *self._hd_compression
        )
        # the wrapped optimizer's class follows _Distributed in the MRO
        return super().apply(grads, trainable_variables)  # type: ignore[misc]


def DistributedOptimizer(  # noqa: N802  (named as in Horovod)
    optimizer: keras.optimizers.Optimizer,
    strategy: Any = None,
    compression: str | None = None,
    compression_filter: Any = None,
) -> keras.optimizers.Optimizer:
    """``optimizer`` (a Keras optimizer) made to average its gradients over the replicas first.

    The same object is returned, its class replaced by a subclass of its
    class (``isinstance`` checks, serialization names and state are kept).
    ``compression`` (``"bf16"``, ``"fp16"``) and ``compression_filter``: how
    float32 gradients travel between nodes (:class:`~hpcdist.CommunicationOptions`).

    Example: ``model.compile(optimizer=hdtf.DistributedOptimizer(keras.optimizers.SGD(0.1)))``.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a keras.optimizers.Optimizer; got "
            f"{type(optimizer).__name__}"
        )
    if not isinstance(optimizer, _Distributed):
        base = type(optimizer)
        optimizer.__class__ = type(base.__name__, (_Distributed, base), {})
    CommunicationOptions(compression=compression, compression_filter=compression_filter)
    optimizer._hd_strategy = strategy
    optimizer._hd_compression = (compression, compression_filter)
    return optimizer


class BroadcastVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's variables from rank ``root`` when training begins.

    Example: ``model.fit(x, y, callbacks=[hdtf.BroadcastVariablesCallback(0)])``.
    """

    def __init__(self, root: int = 0, strategy: Any = None) -> None:
        super().__init__()
        self._root = root
        self._strategy = strategy

    def on_train_begin(self, logs: Any = None) -> None:
        broadcast_variables(self.model.variables, self._root, self._strategy)
