"""Training on strategies: layers with explicit backward passes, losses, metrics and models.

``hd.nn`` plays the part of ``tf.keras`` (layers, ``Sequential``, losses,
metrics) and of ``tf.nn.compute_average_loss``. There is no general automatic
differentiation: every layer has a hand-written backward pass, and
:func:`value_and_grad` runs the model forward, the loss and the backward passes
(the stand-in for ``tf.GradientTape`` in custom loops).

Example:
    >>> import hpcdist as hd
    >>> model = hd.nn.Sequential([hd.nn.Dense(2, input_shape=(3,))])
    >>> [tuple(v.shape) for v in model.trainable_variables]
    [(3, 2), (2,)]
"""

from hpcdist.distribute.sharded_variable import embedding_lookup
from hpcdist.nn import (
    activations,
    backend,
    initializers,
    losses,
    metrics,
    mixed_precision,
    regularizers,
)
from hpcdist.nn import confusion_metrics as confusion_metrics  # registers Precision, Recall, AUC
from hpcdist.nn.autodiff import value_and_grad
from hpcdist.nn.embedding import Embedding
from hpcdist.nn.layers import Activation, Dense, Dropout, Flatten, Input, InputLayer, Layer
from hpcdist.nn.loading import load_model
from hpcdist.nn.losses import compute_average_loss, scale_regularization_loss
from hpcdist.nn.model import Model
from hpcdist.nn.normalization import BatchNormalization, LayerNormalization
from hpcdist.nn.sequential import Sequential

__all__ = [
    "embedding_lookup",
    "Activation",
    "BatchNormalization",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "Input",
    "InputLayer",
    "Layer",
    "LayerNormalization",
    "Model",
    "Sequential",
    "activations",
    "backend",
    "compute_average_loss",
    "initializers",
    "load_model",
    "losses",
    "metrics",
    "mixed_precision",
    "regularizers",
    "scale_regularization_loss",
    "value_and_grad",
]
