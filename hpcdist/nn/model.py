"""The model core: an ordered stack of layers with forward, backward and weight handling.

A :class:`Model` remembers the strategy current when it was made
(``distribute_strategy``) and creates its weights in that strategy's scope,
so inside ``strategy.scope()`` they are ``MirroredVariable`` objects. It must
be built before ``strategy.run`` (by ``Dense(..., input_shape=...)`` as the
first layer, ``model.build(input_shape)``, or one call outside ``run``).

``forward`` and ``backward`` are pure, so every replica thread can run the
same model at once. ``save_weights`` writes an ``.npz`` file (no pickle) on
the chief only and is not collective; ``load_weights`` reads it on every
worker.

Example:
    >>> import numpy as np
    >>> from hpcdist.nn.layers import Dense
    >>> model = Model([Dense(4, activation="relu", input_shape=(3,)), Dense(1)])
    >>> y, caches = model.forward(np.ones((2, 3)))
    >>> grads = model.backward(caches, np.ones((2, 1)))
    >>> [g.shape for g in grads] == [v.shape for v in model.trainable_variables]
    True
    >>> model.count_params()
    21
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray, to_host
from hpcdist.distribute import context
from hpcdist.distribute.variables import DistributedVariable, Variable
from hpcdist.nn.layers import InputLayer, Layer, check_build_context, snake_case
from hpcdist.nn.saving import save_model
from hpcdist.runtime.atomic import atomic_write

_FORMAT = "hpcdist.nn.Model.weights/1"
_NAMES_KEY = "__names__"
_FORMAT_KEY = "__format__"

_model_counters: dict[str, Any] = {}
_model_counters_lock = threading.Lock()


def _auto_model_name(cls: type) -> str:
    """``"model"``, ``"model_1"``, ... per class name, over the whole process (as Keras)."""
    base = snake_case(cls.__name__)
    with _model_counters_lock:
        n = next(_model_counters.setdefault(base, itertools.count()))
    return base if n == 0 else f"{base}_{n}"


def _build_shape(shape: Any) -> tuple:
    if isinstance(shape, (int, np.integer)) or shape is None:
        raise ValueError(
            f"input_shape is {shape!r}; expected a tuple that includes the batch dimension, "
            "e.g. (None, 10)"
        )
    try:
        out = tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"input_shape is {shape!r}; expected a tuple of ints or None, e.g. (None, 10)"
        ) from None
    if len(out) < 2:
        raise ValueError(
            f"input_shape is {shape!r}; it must include the batch dimension, e.g. (None, 10) "
            "for inputs of 10 features"
        )
    return out


class Model:
    """Layers applied in order (the core that ``Sequential`` extends with training).

    Example: ``model = Model([Dense(8, activation="relu", input_shape=(4,)), Dense(1)])``,
    then ``y = model(x)``, or ``y, caches = model.forward(x, training=True)`` and
    ``grads = model.backward(caches, dL_dy)``.
    """

    def __init__(self, layers: Iterable[Layer] | None = None, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"model name is {name!r}; expected a non-empty string or None")
        self.name = name or _auto_model_name(type(self))
        self._distribute_strategy = context.get_strategy()
        self._layers: list[Layer] = []
        self._layer_name_counts: dict[str, int] = {}
        self._batch_input_shape: tuple | None = None
        self._output_shapes: list[tuple] = []
        self.built = False
        self.stop_training = False
        self._grad_buffers: dict[int, Any] = {}
        if isinstance(layers, Layer):
            layers = [layers]
        for layer in layers or ():
            self.add(layer)

    # -- structure -------------------------------------------------------------------------
    @property
    def distribute_strategy(self) -> Any:
        """The strategy that was current when the model was made (its weights' strategy)."""
        return self._distribute_strategy

    @property
    def layers(self) -> list[Layer]:
        """The layers, in order (an ``InputLayer`` is not listed)."""
        return list(self._layers)

    def add(self, layer: Layer) -> None:
        """Append ``layer``; name it when it has no name (``dense``, ``dense_1``, ...).

        The model builds as soon as its input shape is known (an ``InputLayer``
        or ``input_shape=`` on the first layer); layers added to a built model
        are built at once.

        Example: ``model.add(Dense(10, activation="softmax"))``.
        """
        if not isinstance(layer, Layer):
            raise TypeError(
                f"Model.add expects an hpcdist.nn.layers.Layer; got {type(layer).__name__}"
            )
        if isinstance(layer, InputLayer):
            if self._layers:
                raise ValueError("an InputLayer must come first: add it before any other layer")
            self._batch_input_shape = layer._batch_input_shape
            return
        if any(existing is layer for existing in self._layers):
            raise ValueError(f"layer {layer.name!r} is already in model {self.name!r}")
        names = {existing.name for existing in self._layers}
        if layer._name is None:
            base = layer._base_name
            count = self._layer_name_counts.get(base, 0)
            candidate = base if count == 0 else f"{base}_{count}"
            while candidate in names:
                count += 1
                candidate = f"{base}_{count}"
            self._layer_name_counts[base] = count + 1
            layer._name = candidate
        elif layer.name in names:
            raise ValueError(
                f"model {self.name!r} already has a layer named {layer.name!r}; layer names must "
                "be unique within a model (they name the weights): pass another name="
            )
        self._layers.append(layer)
        if self.built:
            self._build_layers(len(self._layers) - 1, self._last_shape())
        elif len(self._layers) == 1 and self._batch_input_shape is None:
            if layer._batch_input_shape is not None:
                self.build(layer._batch_input_shape)
        elif len(self._layers) == 1:
            self.build(self._batch_input_shape)

    def get_layer(self, name: str | None = None, index: int | None = None) -> Layer:
        """The layer with ``name``, or at ``index``.

        Example: ``model.get_layer("dense_1").kernel``.
        """
        if index is not None:
            return self._layers[index]
        for layer in self._layers:
            if layer.name == name:
                return layer
        raise ValueError(
            f"no layer named {name!r} in model {self.name!r}; its layers are "
            f"{[layer.name for layer in self._layers]}"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} layers={len(self._layers)}>"

    # -- building ----------------------------------------------------------------------------
    def _last_shape(self) -> tuple:
        shape = self._output_shapes[-1] if self._output_shapes else self._batch_input_shape
        assert shape is not None  # only asked of a built model
        return shape

    def _scope(self) -> Any:
        """The cross-replica context to create weights in: the model's strategy's scope."""
        strategy = self._distribute_strategy
        mode = context.current_mode()
        if mode.cross_replica is strategy:
            return contextlib.nullcontext()
        if strategy is context.default_strategy():
            if mode.strategy is not strategy:
                raise RuntimeError(
                    f"model {self.name!r} was made outside any strategy scope, but it is being "
                    f"built inside the scope of {mode.strategy!r}; make the model inside "
                    "`with strategy.scope():` so that its weights belong to that strategy"
                )
            return contextlib.nullcontext()
        return strategy.scope()

    def _build_layers(self, start: int, shape: tuple) -> None:
        check_build_context(f"model {self.name!r}", "model.build(input_shape)")
        shapes = self._output_shapes[:start]
        with self._scope():
            for layer in self._layers[start:]:
                if not layer.built:
                    layer._build(shape)
                shape = tuple(layer.compute_output_shape(shape))
                shapes.append(shape)
        self._output_shapes = shapes

    def build(self, input_shape: Sequence[int | None] | None = None) -> None:
        """Build every layer for inputs of ``input_shape`` (batch dimension included).

        Weights are created in the scope of ``distribute_strategy`` (entered if
        needed); inside ``strategy.run`` this is an error.
        """
        if input_shape is None:
            input_shape = self._batch_input_shape
            if input_shape is None and self._layers:
                input_shape = self._layers[0]._batch_input_shape
            if input_shape is None:
                raise ValueError(
                    f"model {self.name!r} does not know its input shape: call "
                    "model.build((None, features)), give the first layer input_shape=(features,), "
                    "or call the model on a batch"
                )
        input_shape = _build_shape(input_shape)
        self._build_layers(0, input_shape)
        self._batch_input_shape = input_shape
        self.built = True

    @property
    def input_shape(self) -> tuple:
        """The input shape the model was built for, e.g. ``(None, 10)``."""
        if not self.built:
            raise AttributeError(f"model {self.name!r} is not built, so it has no input shape")
        assert self._batch_input_shape is not None  # build sets it
        return self._batch_input_shape

    @property
    def output_shape(self) -> tuple:
        """The output shape, e.g. ``(None, 1)``."""
        if not self.built:
            raise AttributeError(f"model {self.name!r} is not built, so it has no output shape")
        return self._last_shape()

    # -- computing ---------------------------------------------------------------------------
    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        """``(y, caches)``: the output and what :meth:`backward` needs. Pure.

        Builds the model from ``x.shape`` first when it is not built (only
        outside ``strategy.run``).
        """
        if not self.built:
            x = asarray(x)
            check_build_context(f"model {self.name!r}", "model.build(input_shape)")
            self.build((None, *x.shape[1:]))
        caches = []
        y = x
        for layer in self._layers:
            y, cache = layer.forward(y, training)
            caches.append(cache)
        y = asarray(y)
        return y, (tuple(caches), tuple(y.shape))

    def backward(self, caches: Any, dy: Any) -> list[Any]:
        """The gradients of the trainable variables, given dL/dy for the forward output.

        The list is aligned with :attr:`trainable_variables`. Layers below the
        first trainable one are not visited.
        """
        if not (isinstance(caches, tuple) and len(caches) == 2 and isinstance(caches[0], tuple)):
            raise TypeError("caches must be the second value returned by model.forward(x)")
        layer_caches, out_shape = caches
        if len(layer_caches) != len(self._layers):
            raise ValueError(
                f"caches hold {len(layer_caches)} layers but model {self.name!r} has "
                f"{len(self._layers)}; use the caches of this model's forward"
            )
        dy = asarray(dy)
        if tuple(dy.shape) != out_shape:
            raise ValueError(
                f"dy has shape {tuple(dy.shape)}, but the model's output had shape {out_shape}; "
                "pass dL/dy with the shape of the forward output"
            )
        trainable = [i for i, layer in enumerate(self._layers) if layer.trainable_weights]
        if not trainable:
            return []
        # 16-bit gradients under loss scaling overflow by design (the step is then skipped)
        mixed = any(getattr(la, "compute_dtype", None) != getattr(la, "dtype", None)
                    for la in self._layers)  # fmt: skip
        quiet = np.errstate(over="ignore", invalid="ignore") if mixed else contextlib.nullcontext()
        with quiet:
            return self._backward_layers(layer_caches, dy, trainable[0])

    def _backward_layers(self, layer_caches: tuple, dy: Any, first: int) -> list[Any]:
        """The backward passes from the last layer down to ``first`` (the first trainable)."""
        outs = self._gradient_views()
        per_layer: list[list[Any]] = [[] for _ in self._layers]
        for i in range(len(self._layers) - 1, first - 1, -1):
            layer = self._layers[i]
            out = None if outs is None else outs[i]
            if out is not None and getattr(layer, "_grads_into", False):
                dy, per_layer[i] = layer._backward(layer_caches[i], dy, i > first, out=out)
                continue
            dy, per_layer[i] = layer._backward(layer_caches[i], dy, i > first)
            if out is not None:
                for view, g in zip(out, per_layer[i], strict=True):
                    view[...] = g
                per_layer[i] = out
        return [g for grads in per_layer for g in grads]

    def _gradient_views(self) -> list[list[Any]] | None:
        """Per layer, views into one flat gradient buffer of this replica (or ``None``).

        The gradients of all trainable variables then lie in one contiguous
        buffer, in :attr:`trainable_variables` order, so the optimizer packs
        nothing before its allreduce. The buffer is reused from step to step
        unless someone still holds a gradient of the previous step (then a new
        one is made, so held gradients never change). Mixed dtypes: ``None``.
        """
        variables = self.trainable_variables
        if not variables:
            return None
        arrays = [v.raw_value() for v in variables]
        dtype = arrays[0].dtype
        if any(a.dtype != dtype for a in arrays):
            return None
        ctx = context.get_replica_context()
        key = 0 if ctx is None else getattr(ctx, "_local_id", 0)
        total = sum(int(a.size) for a in arrays)
        buf = self._grad_buffers.get(key)
        # References: the dict's and getrefcount's own; more means views are still held.
        if buf is None or buf.size != total or buf.dtype != dtype or sys.getrefcount(buf) > 3:
            xp = array_module(arrays[0])
            buf = self._grad_buffers[key] = xp.empty(total, dtype=dtype)
        views: list[list[Any]] = []
        offset = 0
        for layer in self._layers:
            mine = []
            for v in layer.trainable_weights:
                n = int(v.size)
                mine.append(buf[offset : offset + n].reshape(v.shape))
                offset += n
            views.append(mine)
        return views

    def __call__(self, x: Any, training: bool = False) -> Any:
        """The output for ``x`` (``forward(x, training)[0]``)."""
        return self.forward(x, training)[0]

    # -- variables ---------------------------------------------------------------------------
    @property
    def trainable_weights(self) -> list[Variable]:
        """The trained variables, layer by layer (the order of ``backward``'s gradients)."""
        return [v for layer in self._layers for v in layer.trainable_weights]

    @property
    def non_trainable_weights(self) -> list[Variable]:
        """The variables that are not trained."""
        return [v for layer in self._layers for v in layer.non_trainable_weights]

    @property
    def weights(self) -> list[Variable]:
        """All variables, layer by layer (the order of ``get_weights``)."""
        return [v for layer in self._layers for v in layer.weights]

    trainable_variables = trainable_weights
    non_trainable_variables = non_trainable_weights
    variables = weights

    @property
    def losses(self) -> list[Any]:
        """The regularization penalties of all layers, now (``keras.Model.losses``).

        Example: ``total = loss + sum(model.losses)`` (``fit`` adds them itself).
        """
        return [p for layer in self._layers for p in layer.losses]

    def _regularization(self, grads: list[Any] | None, scale: float) -> float:
        """``scale * sum(self.losses)``; adds ``scale *`` their gradients to ``grads`` (aligned
        with :attr:`trainable_variables`, added in place where possible). 0.0 without any."""
        terms = [(var, reg) for layer in self._layers for var, reg in layer._regularized]
        if not terms:
            return 0.0
        position = {id(v): i for i, v in enumerate(self.trainable_variables)}
        total = 0.0
        for var, reg in terms:
            w = var.raw_value()
            total += float(to_host(reg(w)))
            i = position.get(id(var))
            if grads is None or i is None:
                continue
            delta = reg.gradient(w) * w.dtype.type(scale)
            g = grads[i]
            flags = getattr(g, "flags", None)
            if getattr(flags, "writeable", True) and getattr(g, "dtype", None) == w.dtype:
                g += delta  # in the model's flat gradient buffer: the optimizer packs nothing
            else:
                grads[i] = g + delta
        return total * scale

    def count_params(self) -> int:
        """The number of scalars in all weights.

        Example: ``Model([Dense(1, input_shape=(3,))]).count_params() == 4``.
        """
        if not self.built:
            raise ValueError(
                f"model {self.name!r} is not built, so it has no weights to count yet: call "
                "model.build(input_shape) or call it on a batch first"
            )
        return int(sum(v.size for v in self.weights))

    def _require_built(self, method: str) -> None:
        if not self.built:
            raise ValueError(
                f"{method} needs a built model, and model {self.name!r} is not built: call "
                "model.build((None, features)) or call the model on a batch first"
            )

    def get_weights(self) -> list[np.ndarray]:
        """NumPy copies of all weights, in the order of :attr:`weights`.

        Example: ``snapshot = model.get_weights(); ...; model.set_weights(snapshot)``.
        """
        return [np.array(to_host(v.raw_value()), copy=True) for v in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Assign ``weights`` (as from :meth:`get_weights`) to every replica's copy.

        Call it outside ``strategy.run``. Shapes must match.

        Example: ``model.set_weights([np.zeros(v.shape) for v in model.weights])``.
        """
        variables = self.weights
        weights = list(weights)
        if weights and not self.built:
            self._require_built("set_weights")
        if len(weights) != len(variables):
            raise ValueError(
                f"set_weights got {len(weights)} arrays, but model {self.name!r} has "
                f"{len(variables)} weights ({', '.join(v.name for v in variables)})"
            )
        values = [asarray(w.raw_value() if isinstance(w, Variable) else w) for w in weights]
        for v, w in zip(variables, values, strict=True):
            if tuple(w.shape) != tuple(v.shape):
                raise ValueError(
                    f"set_weights: weight {v.name!r} has shape {tuple(v.shape)}, but the array "
                    f"given for it has shape {tuple(w.shape)}"
                )
        mode = context.current_mode()
        if mode.replica is not None and mode.strategy is not context.default_strategy():
            raise RuntimeError(
                "set_weights must be called outside strategy.run (in the cross-replica "
                "context), where it sets every replica's copy"
            )
        for v, w in zip(variables, values, strict=True):
            v.assign(w)

    # -- files -------------------------------------------------------------------------------
    def save(self, filepath: str | os.PathLike, overwrite: bool = True) -> None:
        """Save the architecture, the weights and the optimizer state (``keras.Model.save``).

        ``filepath`` becomes a directory with a JSON manifest and an ``.npz`` of
        the arrays (no pickle); :func:`hpcdist.nn.load_model` restores it on any
        number of workers. Collective under a multi-worker strategy (every
        worker calls it; the chief writes). See :mod:`hpcdist.nn.saving`.
        """

        save_model(self, filepath, overwrite=overwrite)

    def save_weights(self, filepath: str | os.PathLike) -> None:
        """Write all weights to ``filepath`` as ``.npz`` (chief only, atomically, no pickle).

        Only the chief (``distribute_strategy.extended.should_checkpoint``)
        writes; other workers return at once. Nothing here is collective, so
        the chief may call it alone. The file is written exactly at
        ``filepath`` (no suffix added), through a temporary file, ``fsync`` and
        ``os.replace`` (:func:`hpcdist.runtime.atomic.atomic_write`). Sync-on-read
        weights are saved as the first local replica's copy.
        """
        self._require_built("save_weights")
        if not self._distribute_strategy.extended.should_checkpoint:
            return
        variables = self.weights
        names = [v.name for v in variables]
        if len(set(names)) != len(names):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(
                f"model {self.name!r} has several weights named {duplicates}; give its layers "
                "unique names (name=...) before saving"
            )
        arrays = {}
        for v in variables:
            source = v.values[0] if isinstance(v, DistributedVariable) else v
            arrays[v.name] = to_host(source.raw_value())
        path = os.fspath(filepath)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        header = {_FORMAT_KEY: np.array(_FORMAT), _NAMES_KEY: np.array(names, dtype=str)}
        payload: dict[str, Any] = {**header, **arrays}  # (arrays: names, not savez's flags)
        atomic_write(path, lambda f: np.savez(f, **payload))

    def load_weights(self, filepath: str | os.PathLike) -> None:
        """Read weights written by :meth:`save_weights` and assign them (every worker).

        The file must hold the same weight names, in the same order, with the
        same shapes; otherwise a ``ValueError`` names the first mismatch and
        nothing is assigned.
        """
        self._require_built("load_weights")
        path = os.fspath(filepath)
        not_weights = f"{path!r} is not a weights file written by Model.save_weights"
        try:
            data = np.load(path, allow_pickle=False)
        except ValueError as err:  # not NumPy's format, or it would need pickle
            raise ValueError(f"{not_weights}: {err}") from err
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError(f"{not_weights} (it holds a single array, not an .npz archive)")
        with data:
            if _NAMES_KEY not in data.files:
                raise ValueError(f"{not_weights} (no {_NAMES_KEY!r} entry)")
            names = [str(n) for n in data[_NAMES_KEY].tolist()]
            missing = [n for n in names if n not in data.files]
            if missing:
                raise ValueError(f"{path!r} is incomplete: it lists but lacks weights {missing}")
            arrays = [data[n] for n in names]
        variables = self.weights
        if len(names) != len(variables):
            raise ValueError(
                f"{path!r} holds {len(names)} weights ({', '.join(names)}), but model "
                f"{self.name!r} has {len(variables)} ({', '.join(v.name for v in variables)}); "
                "load it into a model with the same layers"
            )
        for i, (v, name, array) in enumerate(zip(variables, names, arrays, strict=True)):
            if name != v.name:
                raise ValueError(
                    f"weight {i} of {path!r} is {name!r}, but weight {i} of model {self.name!r} "
                    f"is {v.name!r}; build the model with the same layers and layer names"
                )
            if tuple(array.shape) != tuple(v.shape):
                raise ValueError(
                    f"weight {v.name!r} has shape {tuple(v.shape)} in model {self.name!r}, but "
                    f"shape {tuple(array.shape)} in {path!r}"
                )
        self.set_weights(arrays)

    # -- description -------------------------------------------------------------------------
    def summary(
        self,
        line_length: int | None = None,
        positions: Sequence[float] | None = None,
        print_fn: Callable[[str], Any] | None = None,
    ) -> None:
        """Print a table of the layers, their output shapes and parameter counts.

        With no ``print_fn`` it prints on the chief only; a given ``print_fn``
        is called on every worker, once per line.
        """
        if not self.built:
            raise ValueError(
                f"model {self.name!r} is not built yet: call model.build((None, features)), "
                "give the first layer input_shape=(features,), or call it on a batch"
            )
        if print_fn is None:
            if not self._distribute_strategy.extended.should_checkpoint:
                return
            print_fn = print
        for line in self._summary_lines(line_length or 65, positions or (0.45, 0.85, 1.0)):
            print_fn(line)

    def _summary_lines(self, width: int, positions: Sequence[float]) -> list[str]:
        stops = [int(width * p) if p <= 1 else int(p) for p in positions]

        def row(fields: Sequence[str]) -> str:
            line = f" {fields[0]}"
            for field, stop in zip(fields[1:], stops, strict=False):
                # each field starts at its column; a long one pushes the next one right
                line = (line.ljust(stop) if len(line) < stop else f"{line} ") + field
            return line

        lines = [f'Model: "{self.name}"', "_" * width]
        lines += [row(["Layer (type)", "Output Shape", "Param #"]), "=" * width]
        for i, (layer, shape) in enumerate(zip(self._layers, self._output_shapes, strict=True)):
            if i:
                lines.append("")
            lines.append(row([f"{layer.name} ({type(layer).__name__})", str(shape),
                              str(layer.count_params())]))  # fmt: skip
        trainable = sum(v.size for v in self.trainable_weights)
        non_trainable = sum(v.size for v in self.non_trainable_weights)
        lines += [
            "=" * width,
            f"Total params: {trainable + non_trainable:,}",
            f"Trainable params: {trainable:,}",
            f"Non-trainable params: {non_trainable:,}",
            "_" * width,
        ]
        return lines

    def get_config(self) -> dict[str, Any]:
        """The model's name and its layers' configs.

        Example: ``[c["class_name"] for c in model.get_config()["layers"]]``.
        """
        return {
            "name": self.name,
            "layers": [
                {"class_name": type(layer).__name__, "config": layer.get_config()}
                for layer in self._layers
            ],
        }
