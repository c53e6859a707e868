"""Optimizers with fused flat-buffer updates (``keras.optimizers``): SGD, Adam, AdamW, RMSprop,
Adagrad, Nadam.

Use them as in Keras; inside ``strategy.run`` ``apply_gradients`` sums the
gradients over all replicas and workers with one allreduce, then updates
every variable of a dtype on a device with one fused kernel call.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> from hpcdist import optimizers
    >>> opt = optimizers.get("adam")
    >>> type(opt).__name__, opt.learning_rate
    ('Adam', 0.001)
    >>> w = hd.Variable(np.zeros(2), name="w")
    >>> _ = optimizers.SGD(0.1).apply_gradients([(np.array([1.0, -1.0]), w)])
    >>> w.numpy()
    array([-0.1,  0.1])
"""

from __future__ import annotations

from typing import Any

from hpcdist.distribute.ps.optimizer_host import register_optimizer_factory
from hpcdist.optimizers import schedules
from hpcdist.optimizers.adagrad import Adagrad
from hpcdist.optimizers.adam import Adam, AdamW
from hpcdist.optimizers.clipping import clip_by_global_norm
from hpcdist.optimizers.nadam import Nadam
from hpcdist.optimizers.optimizer import Optimizer
from hpcdist.optimizers.rmsprop import RMSprop
from hpcdist.optimizers.sgd import SGD

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "Nadam",
    "Optimizer",
    "RMSprop",
    "clip_by_global_norm",
    "deserialize",
    "get",
    "schedules",
    "serialize",
]

# (the concrete classes: each can be made with no arguments)
_BY_NAME: dict[str, type[SGD | Adam | AdamW | RMSprop | Adagrad | Nadam]] = {
    "sgd": SGD,
    "adam": Adam,
    "adamw": AdamW,
    "rmsprop": RMSprop,
    "adagrad": Adagrad,
    "nadam": Nadam,
}


def serialize(optimizer: Optimizer) -> dict[str, Any]:
    """``{"class_name": ..., "config": ...}`` describing ``optimizer``.

    Example: ``serialize(SGD())["class_name"] == "SGD"``.
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"serialize expects an Optimizer, got {type(optimizer).__name__}")
    return {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}


def deserialize(config: dict[str, Any]) -> Optimizer:
    """A new optimizer from :func:`serialize`'s output.

    Example: ``deserialize({"class_name": "Adam", "config": {"learning_rate": 0.01}})``.
    """
    if not (isinstance(config, dict) and "class_name" in config):
        raise TypeError(
            f"deserialize expects a dict with 'class_name' and 'config', got {config!r}"
        )
    cls = _BY_NAME.get(str(config["class_name"]).lower())
    if cls is None:
        raise ValueError(
            f"unknown optimizer class {config['class_name']!r}; expected one of "
            "SGD, Adam, AdamW, RMSprop, Adagrad, Nadam"
        )
    return cls.from_config(dict(config.get("config", {})))


# The parameter servers (a lower layer) build their optimizers through this registration.
register_optimizer_factory(lambda name, config: deserialize({"class_name": name, "config": config}))


def get(identifier: Any) -> Optimizer:
    """An optimizer from a name (``"adam"``, ``"sgd"``, ``"rmsprop"``, ``"adamw"``,
    ``"adagrad"``, ``"nadam"``), a config dict or an optimizer (returned as it is).

    Example: ``get("sgd")`` is ``SGD()`` with Keras's defaults.
    """
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, dict):
        return deserialize(identifier)
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.strip().lower())
        if cls is not None:
            return cls()
    raise ValueError(
        f"Could not interpret optimizer identifier: {identifier!r}; expected 'adam', 'adamw', "
        "'sgd', 'rmsprop', 'adagrad', 'nadam', a config dict or an hpcdist.optimizers.Optimizer"
    )
