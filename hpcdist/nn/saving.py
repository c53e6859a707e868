"""``model.save(path)``: architecture, weights and optimizer state (read by ``load_model``).

:func:`~hpcdist.nn.loading.load_model` (in :mod:`hpcdist.nn.loading`, which builds
models and so sits above :mod:`hpcdist.nn.model`) reads what this module writes.

``path`` becomes a directory holding one checkpoint of the project's format
(:mod:`hpcdist.checkpoint.format`): ``model.data.npz`` (every weight, the
optimizer's ``iterations`` and slots; NumPy arrays, never pickles) and
``model.index.json`` (the manifest, written last, with the checksums of the
data file). The manifest also holds the architecture as JSON: the model's
class and layer configs, its input shape, and the compile arguments
(optimizer config, loss, metrics). Nothing is unpickled or executed when
loading: layers, losses, metrics and optimizers are looked up by class name
among hpcdist's own (and the ``custom_objects`` given).

Saving is collective under a multi-worker strategy (every worker calls
``model.save``; the chief writes). Loading works on any number of workers,
with any strategy: the chief reads and checks the files and broadcasts them;
mirrored weights and slots are the same on every replica, so the world size
may change between saving and loading. Sync-on-read weights (BatchNormalization's
moving statistics) are saved as the mean of the replicas' copies.

Example:
    >>> import os, tempfile, numpy as np
    >>> from hpcdist.nn import Dense, Sequential
    >>> model = Sequential([Dense(2, input_shape=(3,))])
    >>> model.compile(optimizer="adam", loss="mse")
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.keras")
    >>> model.save(path)
    >>> sorted(os.listdir(path))
    ['model.data.npz', 'model.index.json']
    >>> from hpcdist.nn.loading import load_model
    >>> twin = load_model(path)
    >>> bool(np.array_equal(twin.predict(np.ones((1, 3))), model.predict(np.ones((1, 3)))))
    True
    >>> int(twin.optimizer.iterations)
    1
"""

from __future__ import annotations

import json
import os
from typing import Any

from hpcdist import optimizers
from hpcdist.checkpoint import Checkpoint
from hpcdist.checkpoint.format import index_file
from hpcdist.checkpoint.sync import Group
from hpcdist.nn import losses, metrics

__all__ = ["model_config", "save_model"]

FORMAT = "hpcdist.nn.saved_model"
VERSION = 1
_PREFIX = "model"
ARCH_KEY = "architecture"


class _Architecture:
    """The checkpoint object that carries the architecture as its (JSON) meta."""

    def __init__(self, config: dict | None) -> None:
        self.config = config

    def _checkpoint_state(self) -> tuple[dict, dict]:
        return {}, dict(self.config or {})

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        return None


def path_prefix(filepath: Any) -> tuple[str, str]:
    path = os.fspath(filepath)
    if path.endswith((".h5", ".hdf5")):
        raise ValueError(
            f"cannot save to {path!r}: HDF5 files are not supported; give a directory name "
            "(e.g. 'model.keras'): hpcdist writes a directory with a JSON manifest and an .npz"
        )
    return path, os.path.join(path, _PREFIX)


# -- describing the compile arguments as JSON --------------------------------------------------
def _loss_config(loss: Any) -> Any:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, losses.Loss):
        return {"class_name": type(loss).__name__, "config": loss.get_config()}
    if isinstance(loss, type) and issubclass(loss, losses.Loss):
        return {"class_name": loss.__name__, "config": {}}
    name = getattr(loss, "__name__", None)
    if callable(loss) and name:
        return {"function": name}
    raise ValueError(f"cannot save the loss {loss!r}: pass a name, a Loss object or a function")


def _metric_config(metric: Any) -> Any:
    if isinstance(metric, str):
        return metric
    if isinstance(metric, type):
        return metric.__name__
    if type(metric) is metrics.MeanMetricWrapper:
        fn = metric._fn
        return {"function": fn.__name__, "config": metric.get_config()}
    if isinstance(metric, metrics.Metric):
        return {"class_name": type(metric).__name__, "config": metric.get_config()}
    name = getattr(metric, "__name__", None)
    if callable(metric) and name:
        return {"function": name}
    raise ValueError(f"cannot save the metric {metric!r}: pass a name, a Metric or a function")


def model_config(model: Any) -> dict:
    """The JSON description of ``model``: class, layers, input shape and compile arguments.

    Example: ``model_config(model)["config"]["layers"][0]["class_name"] == "Dense"``.
    """

    config: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "class_name": type(model).__name__,
        "config": model.get_config(),
        "build_input_shape": list(model.input_shape) if model.built else None,
        "compile_config": None,
    }
    if getattr(model, "_compiled", False):
        config["compile_config"] = {
            "optimizer": optimizers.serialize(model.optimizer),
            "loss": _loss_config(model.loss),
            "metrics": [_metric_config(m) for m in getattr(model, "_compile_metrics", [])],
        }
    try:
        json.dumps(config)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"model {model.name!r} cannot be saved: its configuration is not JSON ({error}); "
            "custom layers, losses and metrics need get_config() returning plain values"
        ) from None
    return config


# -- saving and loading ----------------------------------------------------------------------
def saved_objects(model: Any, config: dict | None) -> dict[str, Any]:
    objects: dict[str, Any] = {ARCH_KEY: _Architecture(config), "model": model}
    if getattr(model, "_compiled", False):
        objects["optimizer"] = model.optimizer
    return objects


def save_model(model: Any, filepath: str | os.PathLike, overwrite: bool = True) -> None:
    """Write ``model`` (architecture, weights, optimizer state) to the directory ``filepath``.

    Collective under a multi-worker strategy. ``overwrite=False`` refuses an
    existing saved model there (``FileExistsError`` on every worker).

    Example: ``save_model(model, "runs/model.keras")`` (what ``model.save`` does).
    """

    if not model.built:
        raise ValueError(
            f"model {model.name!r} is not built, so it has no weights to save: build it "
            "(model.build((None, features))) or train it first"
        )
    path, prefix = path_prefix(filepath)
    config = model_config(model)
    strategy = model.distribute_strategy
    if not overwrite:
        with Group.open(strategy) as group:  # the chief's file system decides for all
            exists = group.bcast_json(bool(group.is_root and os.path.exists(index_file(prefix))))
        if exists:
            raise FileExistsError(
                f"{path!r} already holds a saved model and overwrite=False; remove it or pass "
                "overwrite=True"
            )
    Checkpoint(**saved_objects(model, config)).write(prefix)
