"""``value_and_grad``: the loss of a model and its gradients, through its explicit backward pass.

The model's ``forward`` gives the predictions and the caches of its layers;
the loss is computed on ``Traced.leaf(y_pred)``, so its ``.grad`` is
``dL/dy_pred``; ``model.backward(caches, dL/dy_pred)`` gives the gradients of
the trainable variables. Any object with ``forward(x, training)`` and
``backward(caches, dy)`` works.

Example:
    >>> import numpy as np
    >>> from hpcdist.nn.losses import MeanSquaredError
    >>> class Scale:  # y = 2 * x, no weights
    ...     def forward(self, x, training=False):
    ...         return 2 * x, None
    ...     def backward(self, caches, dy):
    ...         return []
    >>> step = value_and_grad(Scale(), MeanSquaredError())
    >>> loss, grads = step(np.array([[1.0], [2.0]]), np.array([[2.0], [3.0]]))
    >>> float(loss), grads
    (0.5, [])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcdist.arrays import array_module
from hpcdist.distribute import context
from hpcdist.nn import mixed_precision
from hpcdist.nn.tape import Traced


def value_and_grad(
    model: Any, loss_fn: Callable[..., Any], return_outputs: bool = False
) -> Callable[..., tuple]:
    """A function ``step(x, y, sample_weight=None, training=True)`` -> ``(loss, grads)``.

    ``loss`` is a 0-d array, ``grads`` a list aligned with ``model.trainable_variables``;
    with ``return_outputs=True`` the predictions come third. ``loss_fn(y, y_pred[,
    sample_weight])`` must return a scalar ``Traced`` (a loss object with reduction SUM or
    SUM_OVER_BATCH_SIZE, or ``compute_average_loss`` of per-example losses).
    A model with regularizers gets ``model.losses`` added to the loss and their gradients
    to ``grads``, divided by ``num_replicas_in_sync`` (as ``scale_regularization_loss``):
    summed over replicas they are one process's.

    Example: ``step = value_and_grad(model, lambda y, p: hd.nn.compute_average_loss(
    per_example(y, p), global_batch_size=64))``; ``loss, grads = step(x, y)``.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(y_true, y_pred), got {loss_fn!r}")

    def step(x: Any, y: Any, sample_weight: Any = None, training: bool = True) -> tuple:
        y_pred, caches = model.forward(x, training=training)
        leaf = Traced.leaf(mixed_precision.to_float32(y_pred))  # a mixed model's loss: float32
        if sample_weight is None:
            loss = loss_fn(y, leaf)
        else:
            loss = loss_fn(y, leaf, sample_weight)
        if not isinstance(loss, Traced):
            raise TypeError(
                f"the loss function returned {type(loss).__name__}, which does not depend on "
                "the predictions it was given; it must compute the loss from its y_pred "
                "argument with hpcdist.nn losses (and +, -, * and / by constants, sum, mean)"
            )
        if loss._leaf is not leaf._leaf:
            raise TypeError(
                "the loss was computed from another Traced leaf than the predictions passed "
                "to the loss function; compute it from its y_pred argument"
            )
        if loss.size != 1:
            raise TypeError(
                f"the loss must be a scalar, got shape {loss.shape}; use a loss with reduction "
                "SUM or SUM_OVER_BATCH_SIZE, or hpcdist.nn.compute_average_loss of the "
                "per-example losses"
            )
        grads = model.backward(caches, loss.grad)
        value = array_module(loss.value).reshape(loss.value, ())
        regularization = getattr(model, "_regularization", None)
        if regularization is not None:
            ctx = context.get_replica_context()
            n = 1 if ctx is None else int(ctx.num_replicas_in_sync)
            reg = regularization(grads, 1.0 / n)
            if reg:
                value = value + value.dtype.type(reg)
        if return_outputs:
            return value, grads, y_pred
        return value, grads

    return step
