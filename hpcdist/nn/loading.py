"""``load_model``: a model saved by ``model.save``, rebuilt by class name (no pickle).

The format is :mod:`hpcdist.nn.saving`'s. Layers, losses, metrics and
optimizers are looked up by class name among hpcdist's own and the
``custom_objects`` given; nothing is unpickled or executed. This module builds
``Model``/``Sequential`` objects, so it sits above :mod:`hpcdist.nn.model`
(which saves through :mod:`hpcdist.nn.saving`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hpcdist import optimizers
from hpcdist.checkpoint import Checkpoint
from hpcdist.checkpoint.format import read_manifest
from hpcdist.checkpoint.sync import Group
from hpcdist.distribute import context
from hpcdist.errors import CheckpointError
from hpcdist.nn import embedding, layers, losses, metrics, normalization
from hpcdist.nn.model import Model
from hpcdist.nn.saving import ARCH_KEY, FORMAT, VERSION, path_prefix, saved_objects
from hpcdist.nn.sequential import Sequential

__all__ = ["load_model"]


def _read_config(prefix: str, strategy: Any) -> dict:
    """The architecture saved at ``prefix``: read and checked by the chief, sent to all."""

    with Group.open(strategy) as group:
        error, config = None, None
        if group.is_root:
            try:
                manifest = read_manifest(prefix)
                workers = manifest["meta"]["per_worker"]
                config = workers[0].get(ARCH_KEY) if workers else None
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
    classes = [layers.InputLayer, layers.Dense, layers.Activation, layers.Dropout,
               layers.Flatten, normalization.BatchNormalization,
               normalization.LayerNormalization, embedding.Embedding]  # fmt: skip
    return {c.__name__: c for c in classes}


def _model_from_config(config: dict, custom: Mapping[str, Any]) -> Any:
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
    if isinstance(config, str):
        return custom.get(config, config)
    if "function" in config:
        table = {n: getattr(losses, n) for n in dir(losses) if callable(getattr(losses, n))}
        return _lookup("loss function", config["function"], table, custom)
    table = {c.__name__: c for c in set(losses._BY_NAME.values())}
    cls = _lookup("loss", config["class_name"], table, custom)
    return cls.from_config(dict(config.get("config") or {}))


def _metric_from_config(config: Any, custom: Mapping[str, Any]) -> Any:
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

    custom = dict(custom_objects or {})
    _, prefix = path_prefix(filepath)
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
        with model._scope():
            model.optimizer.build(model.trainable_variables)  # the slots exist before restoring
    objects = saved_objects(model, None)
    if compile_config is None:
        objects.pop("optimizer", None)
    Checkpoint(**objects).read(prefix)
    return model
