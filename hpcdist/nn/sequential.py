"""``Sequential``: a stack of layers with Keras's ``compile``/``fit``/``evaluate``/``predict``.

Build it inside ``strategy.scope()`` and ``fit`` trains on all replicas of the
strategy (see :mod:`hpcdist.nn.training`); outside any scope it trains in this
process alone.

Example:
    >>> import numpy as np
    >>> from hpcdist.nn import Dense, Sequential
    >>> model = Sequential([Dense(4, activation="relu", input_shape=(3,)), Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> history = model.fit(np.zeros((8, 3)), np.zeros(8), epochs=2, verbose=0)
    >>> len(history.history["loss"])
    2
"""

from __future__ import annotations

from hpcdist.nn.model import Model
from hpcdist.nn.training import Trainer


class Sequential(Trainer, Model):
    """Layers applied in order, trained with ``compile`` and ``fit`` (``tf.keras.Sequential``).

    Example: ``Sequential([Dense(128, activation="relu", input_shape=(10,)), Dense(1)])``.
    """
