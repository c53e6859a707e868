"""TensorFlow and Keras models on hpcdist: gradients all-reduced through the hpcdist engine.

One MPI rank is one replica. For custom training loops,
:func:`DistributedGradientTape` wraps a ``tf.GradientTape`` so that
``tape.gradient`` returns gradients averaged over the replicas, and
:func:`broadcast_variables` gives every rank rank 0's start values. For Keras
``model.fit``, :func:`DistributedOptimizer` makes a Keras optimizer average
the gradients before applying them (eagerly or inside the ``tf.function`` that
``fit`` compiles) and :class:`BroadcastVariablesCallback` broadcasts the
model's weights when training begins.

Importing :mod:`hpcdist` never imports TensorFlow; importing this module does.

Example::

    import tensorflow as tf, hpcdist.tensorflow as hdtf
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    tape = hdtf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # MEAN over the ranks
"""

from hpcdist.tensorflow.keras import BroadcastVariablesCallback, DistributedOptimizer
from hpcdist.tensorflow.tape import (
    DistributedGradientTape,
    allreduce_gradients,
    broadcast_variables,
)

__all__ = [
    "BroadcastVariablesCallback",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "allreduce_gradients",
    "broadcast_variables",
]
