"""``model.save(path)`` and :func:`load_model`: architecture, weights and optimizer state.

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
    >>> twin = load_model(path)
    >>> bool(np.array_equal(twin.predict(np.ones((1, 3))), model.predict(np.ones((1, 3)))))
    True
    >>> int(twin.optimizer.iterations)
    1
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hpcdist.errors import CheckpointError

__all__ = ["load_model", "save_model"]

FORMAT = "hpcdist.nn.saved_model"
VERSION = 1
_PREFIX = "model"
_ARCH = "architecture"


class _Architecture:
    """The checkpoint object that carries the architecture as its (JSON) meta."""

    def __init__(self, config: dict | None) -> None:
        self.config = config

    def _checkpoint_state(self) -> tuple[dict, dict]:
        return {}, dict(self.config or {})

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        return None


def _prefix(filepath: Any) -> tuple[str, str]:
    path = os.fspath(filepath)
    if path.endswith((".h5", ".hdf5")):
        raise ValueError(
            f"cannot save to {path!r}: HDF5 files are not supported; give a directory name "
            "(e.g. 'model.keras'): hpcdist writes a directory with a JSON manifest and an .npz"
        )
    return path, os.path.join(path, _PREFIX)


# -- describing the compile arguments as JSON --------------------------------------------------
def _loss_config(loss: Any) -> Any:
    from hpcdist.nn import losses

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
    from hpcdist.nn import metrics

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
    from hpcdist import optimizers

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
def _objects(model: Any, config: dict | None) -> dict[str, Any]:
    objects: dict[str, Any] = {_ARCH: _Architecture(config), "model": model}
    if getattr(model, "_compiled", False):
        objects["optimizer"] = model.optimizer
    return objects


def save_model(model: Any, filepath: str | os.PathLike, overwrite: bool = True) -> None:
    """Write ``model`` (architecture, weights, optimizer state) to the directory ``filepath``.

    Collective under a multi-worker strategy. ``overwrite=False`` refuses an
    existing saved model there (``FileExistsError`` on every worker).

    Example: ``save_model(model, "runs/model.keras")`` (what ``model.save`` does).
    """
    from hpcdist.checkpoint import Checkpoint
    from hpcdist.checkpoint.format import index_file
    from hpcdist.checkpoint.sync import Group

    if not model.built:
        raise ValueError(
            f"model {model.name!r} is not built, so it has no weights to save: build it "
            "(model.build((None, features))) or train it first"
        )
    path, prefix = _prefix(filepath)
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
    Checkpoint(**_objects(model, config)).write(prefix)


def _read_config(prefix: str, strategy: Any) -> dict:
    """The architecture saved at ``prefix``: read and checked by the chief, sent to all."""
    from hpcdist.checkpoint.format import read_manifest
    from hpcdist.checkpoint.sync import Group

    with Group.open(strategy) as group:
        error, config = None, None
        if group.is_root:
            try:
                manifest = read_manifest(prefix)
                workers = manifest["meta"]["per_worker"]
                config = workers[0].get(_ARCH) if workers else None
                if not isinstance(config, dict) or config.get("format") != FORMAT:
                    raise CheckpointError(
                        f"{prefix!r} is a checkpoint but not a model saved by model.save (it "
                        "has no architecture); restore it with hpcdist.checkpoint.Checkpoint"
                    )
                if config.get("version") != VERSION:
                    raise CheckpointError(
                        f"{prefix!r} was saved in version {config.get('version')!r} of the "
                        f"format; this hpcdist reads version {VERSION}"
                    )
            except Exception as e:  # every worker raises the chief's error
                error = e
        group.agree(error)
        return group.bcast_json(config)


def _lookup(kind: str, name: str, table: Mapping[str, Any], custom: Mapping[str, Any]) -> Any:
    if name in custom:
        return custom[name]
    if name in table:
        return table[name]
    raise ValueError(
        f"the saved model uses the {kind} {name!r}, which hpcdist does not know; pass it in "
        f"custom_objects={{{name!r}: ...}} (known: {', '.join(sorted(table))})"
    )


def _layer_classes() -> dict[str, type]:
    from hpcdist.nn import embedding, layers, normalization

    classes = [layers.InputLayer, layers.Dense, layers.Activation, layers.Dropout,
               layers.Flatten, normalization.BatchNormalization,
               normalization.LayerNormalization, embedding.Embedding]  # fmt: skip
    return {c.__name__: c for c in classes}


def _model_from_config(config: dict, custom: Mapping[str, Any]) -> Any:
    from hpcdist.nn.model import Model
    from hpcdist.nn.sequential import Sequential

    cls = _lookup("model class", config["class_name"],
                  {"Sequential": Sequential, "Model": Model}, custom)  # fmt: skip
    inner = config["config"]
    model = cls(name=inner.get("name"))
    classes = _layer_classes()
    for entry in inner.get("layers", []):
        layer_cls = _lookup("layer", entry["class_name"], classes, custom)
        model.add(layer_cls.from_config(dict(entry.get("config") or {})))
    shape = config.get("build_input_shape")
    if shape is not None and not model.built:
        model.build(tuple(shape))
    return model


def _loss_from_config(config: Any, custom: Mapping[str, Any]) -> Any:
    from hpcdist.nn import losses

    if isinstance(config, str):
        return custom.get(config, config)
    if "function" in config:
        table = {n: getattr(losses, n) for n in dir(losses) if callable(getattr(losses, n))}
        return _lookup("loss function", config["function"], table, custom)
    table = {c.__name__: c for c in set(losses._BY_NAME.values())}
    cls = _lookup("loss", config["class_name"], table, custom)
    return cls.from_config(dict(config.get("config") or {}))


def _metric_from_config(config: Any, custom: Mapping[str, Any]) -> Any:
    from hpcdist.nn import metrics

    if isinstance(config, str):
        return custom.get(config, config)
    if "function" in config:
        fn = _lookup("metric function", config["function"], dict(metrics._FUNCTIONS), custom)
        if "config" not in config:
            return fn
        kwargs = dict(config["config"])
        return metrics.MeanMetricWrapper(fn, **kwargs)
    cls = _lookup("metric", config["class_name"], metrics._classes(), custom)
    return cls(**dict(config.get("config") or {}))


def _optimizer_from_config(config: dict, custom: Mapping[str, Any]) -> Any:
    from hpcdist import optimizers

    name = config.get("class_name")
    if isinstance(name, str) and name in custom:
        return custom[name].from_config(dict(config.get("config") or {}))
    return optimizers.deserialize(config)


def load_model(
    filepath: str | os.PathLike,
    custom_objects: Mapping[str, Any] | None = None,
    compile: bool = True,
) -> Any:
    """A model saved by ``model.save(filepath)``: same layers, weights and, when it was
    compiled (and ``compile=True``), the same optimizer with its ``iterations`` and slots,
    loss and metrics (``keras.models.load_model``).

    Call it where the model should live: inside ``strategy.scope()`` its weights are that
    strategy's (collective under a multi-worker strategy), outside any scope they are plain.
    The number of workers may differ from the one that saved it. ``custom_objects`` maps
    class or function names to your own layers, losses, metrics and optimizers.

    Example: ``with strategy.scope(): model = hd.nn.load_model("runs/model.keras")``.
    """
    from hpcdist.checkpoint import Checkpoint
    from hpcdist.distribute import context

    custom = dict(custom_objects or {})
    _, prefix = _prefix(filepath)
    strategy = context.get_strategy()
    config = _read_config(prefix, strategy)
    model = _model_from_config(config, custom)
    compile_config = config.get("compile_config") if compile else None
    if compile_config is not None:
        model.compile(
            optimizer=_optimizer_from_config(compile_config["optimizer"], custom),
            loss=_loss_from_config(compile_config["loss"], custom),
            metrics=[_metric_from_config(m, custom) for m in compile_config.get("metrics", [])],
        )
        with model._strategy_scope():
            model.optimizer.build(model.trainable_variables)  # the slots exist before restoring
    objects = _objects(model, None)
    if compile_config is None:
        objects.pop("optimizer", None)
    Checkpoint(**objects).read(prefix)
    return model
