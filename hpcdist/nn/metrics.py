"""Streaming metrics (Keras's ``Mean``, ``Sum``, accuracies) with sync-on-read state.

A metric keeps sums in float64 variables made with ``hd.Variable(...,
synchronization=ON_READ, aggregation=SUM)``: inside a strategy scope they are
sync-on-read, so each replica adds to its own copy in ``strategy.run`` and a
read in the cross-replica context sums the copies of all replicas and
workers. ``result()`` there is the metric over all the data (a collective
under ``MultiWorkerMirroredStrategy``: every worker must call it);
:func:`results` reads many metrics with one batched reduction. Inside
``strategy.run`` ``result()`` is this replica's own result, as in TF.

``update_state`` in the cross-replica context (outside ``run``) adds to this
worker's first replica's copy (TF raises there); the sums stay right.

Example:
    >>> import numpy as np
    >>> m = Mean()
    >>> m.update_state(np.array([1.0, 2.0, 3.0]))
    >>> m.update_state(np.array([9.0]), sample_weight=np.array([0.5]))
    >>> m.result()  # (1 + 2 + 3 + 0.5 * 9) / (3 + 0.5)
    3.0
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import array_module, asarray, is_cupy, to_host
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute.variables import (
    DistributedVariable,
    SyncOnReadVariable,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)
from hpcdist.nn import losses as losses_mod
from hpcdist.nn.tape import Traced


def plain_value(x: Any) -> Any:
    """``x`` as an array: a traced value's value, a variable's stored array, else ``asarray``."""
    if isinstance(x, Traced):
        return x.value
    if isinstance(x, Variable):
        return x.raw_value()
    return asarray(x)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _component(var: Variable) -> Variable:
    """The copy of ``var`` this context writes: its own replica's, else the first one."""
    if isinstance(var, DistributedVariable):
        local_id = var.local_replica_id()
        return var.values[0 if local_id is None else local_id]
    return var


_plain_lock = threading.Lock()  # replica threads may share a metric made outside any scope


def accumulate(var: Variable, delta: Any) -> None:
    """Add ``delta`` to the copy of the metric variable ``var`` this replica writes."""
    comp = _component(var)
    if is_cupy(delta) and not is_cupy(comp.raw_value()):
        delta = to_host(delta)
    if comp is var:
        with _plain_lock:
            comp.assign_add(delta)
    else:
        comp.assign_add(delta)  # this replica's own copy: no other thread writes it


def _local_value(var: Variable) -> np.ndarray:
    if isinstance(var, DistributedVariable):
        return to_host(_component(var).raw_value())
    return to_host(var.raw_value())


def _needs_reduction(var: Variable) -> bool:
    return isinstance(var, SyncOnReadVariable) and var.local_replica_id() is None


class Metric:
    """Base class of metrics: ``update_state``, ``result``, ``reset_state``.

    Subclasses make their state with :meth:`add_weight` and implement
    ``update_state(...)`` and ``_result(state)`` (``state``: NumPy values of
    :attr:`variables`, summed over replicas where that applies).

    Example: ``m = Mean(); m(np.array([1.0, 3.0]))`` gives ``2.0``.
    """

    def __init__(self, name: str | None = None, dtype: DTypeLike | None = None) -> None:
        self.name = name or _snake(type(self).__name__)
        self.dtype = np.dtype(dtype or "float64")
        if not np.issubdtype(self.dtype, np.floating):
            raise TypeError(f"a metric's dtype must be a float dtype, got {self.dtype}")
        self._variables: list[Variable] = []

    def add_weight(self, name: str, shape: tuple[int, ...] = ()) -> Variable:
        """A zero state variable, sync-on-read with SUM aggregation in a strategy scope."""
        var = Variable(
            np.zeros(shape, dtype=self.dtype),
            name=f"{self.name}/{name}",
            trainable=False,
            dtype=self.dtype,
            synchronization=VariableSynchronization.ON_READ,
            aggregation=VariableAggregation.SUM,
        )
        self._variables.append(var)
        return var

    @property
    def variables(self) -> list[Variable]:
        """The state variables."""
        return list(self._variables)

    weights = variables

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        """Add a batch to the state (implemented by subclasses)."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_state")

    def _result(self, state: list[np.ndarray]) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement _result")

    def result(self) -> float:
        """The metric: over all replicas and workers in the cross-replica context.

        Example: ``float(m.result())``.
        """
        return results([self])[0]

    def reset_state(self) -> None:
        """Zero the state (every replica's copy; inside ``run`` this replica's only).

        Example: ``m.reset_state()`` at the start of an epoch.
        """
        for var in self._variables:
            if isinstance(var, DistributedVariable) and var.local_replica_id() is None:
                comps: Sequence[Variable] = var.values
            else:
                comps = [_component(var)]
            for c in comps:
                c.assign(np.zeros(c.shape, dtype=c.dtype))

    def reset_states(self) -> None:
        """The old name of :meth:`reset_state`."""
        self.reset_state()

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        self.update_state(*args, **kwargs)
        return self.result()

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments.

        Example: ``Mean(**Mean(name="loss").get_config())``.
        """
        return {"name": self.name, "dtype": self.dtype.name}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


def _weighted(values: Any, sample_weight: Any, reduce: str) -> tuple[Any, Any]:
    """``(values * weights, weights broadcast to them)`` as float64 (Keras's rank rules)."""
    v = plain_value(values)
    xp = array_module(v)
    v = v.astype(np.float64, copy=False)
    if sample_weight is None:
        return v, None
    w = xp.asarray(plain_value(sample_weight)).astype(np.float64, copy=False)
    if w.ndim > 0:
        if w.ndim == v.ndim + 1 and w.shape[-1] == 1:
            w = w[..., 0]
        elif w.ndim == v.ndim - 1:
            w = xp.expand_dims(w, -1)
    try:
        w = xp.broadcast_to(w, v.shape)
    except ValueError:
        if w.ndim > v.ndim or tuple(w.shape) != tuple(v.shape[: w.ndim]):
            raise ValueError(
                f"sample_weight of shape {tuple(w.shape)} does not fit values of shape "
                f"{tuple(v.shape)}; give one weight per example"
            ) from None
        axes = tuple(range(w.ndim, v.ndim))
        v = xp.sum(v, axis=axes) if reduce == "sum" else xp.mean(v, axis=axes)
    return v * w, w


class Sum(Metric):
    """The (weighted) sum of the values (``tf.keras.metrics.Sum``).

    Example: ``m = Sum(); m.update_state(np.array([1.0, 2.0])); m.result()`` gives ``3.0``.
    """

    def __init__(self, name: str = "sum", dtype: DTypeLike | None = None) -> None:
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_weight("total")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        """Add ``sum(values * sample_weight)``."""
        v, _ = _weighted(values, sample_weight, "sum")
        accumulate(self.total, array_module(v).sum(v))

    def _result(self, state: list[np.ndarray]) -> float:
        return float(state[0])


class Mean(Metric):
    """The (weighted) mean of the values (``tf.keras.metrics.Mean``).

    ``total += sum(values * w)``, ``count += sum(w)`` (the number of values
    without weights); the result is ``total / count`` (0 when ``count`` is 0).

    Example: ``m = Mean(); m.update_state(np.array([1.0, 3.0])); m.result()`` gives ``2.0``.
    """

    def __init__(self, name: str = "mean", dtype: DTypeLike | None = None) -> None:
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_weight("total")
        self.count = self.add_weight("count")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        """Add ``values`` (any shape) with optional weights."""
        v, w = _weighted(values, sample_weight, "mean")
        xp = array_module(v)
        accumulate(self.total, xp.sum(v))
        accumulate(self.count, np.float64(v.size) if w is None else xp.sum(w))

    def _result(self, state: list[np.ndarray]) -> float:
        total, count = float(state[0]), float(state[1])
        return total / count if count != 0 else 0.0


class MeanMetricWrapper(Mean):
    """The mean of ``fn(y_true, y_pred, **kwargs)`` over all examples seen."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        dtype: DTypeLike | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name or str(getattr(fn, "__name__", "mean_metric_wrapper")), dtype=dtype
        )
        self._fn = fn
        self._fn_kwargs = kwargs

    # Keras's MeanMetricWrapper is a Mean too, updated with (y_true, y_pred)
    def update_state(  # type: ignore[override]
        self, y_true: Any, y_pred: Any, sample_weight: Any = None
    ) -> None:
        """Add the per-example values of ``fn`` for this batch."""
        y_pred = plain_value(y_pred)
        y_true = array_module(y_pred).asarray(plain_value(y_true))
        super().update_state(self._fn(y_true, y_pred, **self._fn_kwargs), sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._fn_kwargs}


# -- matching functions ---------------------------------------------------------------------------
def same_rank(y_true: Any, y_pred: Any) -> tuple[Any, Any]:
    """Add or drop a trailing size-1 axis of ``y_true`` to match ``y_pred``'s rank."""
    xp = array_module(y_pred)
    t, p = xp.asarray(plain_value(y_true)), plain_value(y_pred)
    if t.ndim == p.ndim - 1 and p.shape[-1] == 1:
        t = xp.expand_dims(t, -1)
    elif t.ndim == p.ndim + 1 and t.shape[-1] == 1:
        t = t[..., 0]
    return t, p


def accuracy(y_true: Any, y_pred: Any) -> Any:
    """1.0 where ``y_true == y_pred`` elementwise (``y_pred`` cast to ``y_true``'s dtype).

    Example: ``accuracy(np.array([1, 2]), np.array([1, 3]))`` is ``array([1., 0.])``.
    """
    t, p = same_rank(y_true, y_pred)
    if p.dtype != t.dtype:
        p = p.astype(t.dtype)
    return (t == p).astype(np.float64)


def binary_accuracy(y_true: Any, y_pred: Any, threshold: float = 0.5) -> Any:
    """Per example: the fraction of ``(y_pred > threshold) == y_true`` over the last axis.

    A 1-D ``y_pred`` is one prediction per example.

    Example: ``binary_accuracy(np.array([[1], [0]]), np.array([[0.7], [0.6]]))`` is
    ``array([1., 0.])``.
    """
    t, p = same_rank(y_true, y_pred)
    xp = array_module(p)
    matches = (t.astype(np.float64) == (p > threshold).astype(np.float64)).astype(np.float64)
    return matches if matches.ndim <= 1 else xp.mean(matches, axis=-1)


def categorical_accuracy(y_true: Any, y_pred: Any) -> Any:
    """1.0 where ``argmax(y_true) == argmax(y_pred)`` over the last axis.

    Example: ``categorical_accuracy(np.array([[0, 1]]), np.array([[0.3, 0.7]]))`` is
    ``array([1.])``.
    """
    p = plain_value(y_pred)
    xp = array_module(p)
    t = xp.asarray(plain_value(y_true))
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(
            f"categorical_accuracy: y_true has shape {tuple(t.shape)} but y_pred has shape "
            f"{tuple(p.shape)}; use sparse_categorical_accuracy for integer class ids"
        )
    return (xp.argmax(t, axis=-1) == xp.argmax(p, axis=-1)).astype(np.float64)


def sparse_categorical_accuracy(y_true: Any, y_pred: Any) -> Any:
    """1.0 where the integer class id ``y_true`` (shape ``(B,)`` or ``(B, 1)``) is the argmax.

    Example: ``sparse_categorical_accuracy(np.array([1, 0]), np.array([[0.3, 0.7],
    [0.2, 0.8]]))`` is ``array([1., 0.])``.
    """
    p = plain_value(y_pred)
    xp = array_module(p)
    t = xp.asarray(plain_value(y_true))
    if t.ndim == p.ndim and t.shape[-1] == 1:
        t = t[..., 0]
    if tuple(t.shape) != tuple(p.shape[:-1]):
        raise ValueError(
            f"sparse_categorical_accuracy: y_true has shape {tuple(t.shape)} but y_pred has "
            f"shape {tuple(p.shape)}; expected class ids of shape {tuple(p.shape[:-1])}"
        )
    return (xp.argmax(p, axis=-1).astype(t.dtype) == t).astype(np.float64)


def top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5) -> Any:
    """1.0 where the class of the one-hot ``y_true`` is among the ``k`` largest predictions.

    Ties at the boundary count as in the top ``k`` (``tf.math.in_top_k``): the
    target is in when fewer than ``k`` classes score strictly higher.

    Example: ``top_k_categorical_accuracy(np.array([[0, 0, 1]]), np.array([[0.5, 0.3, 0.2]]),
    k=2)`` is ``array([0.])``.
    """
    p = plain_value(y_pred)
    xp = array_module(p)
    t = xp.asarray(plain_value(y_true))
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(
            f"top_k_categorical_accuracy: y_true has shape {tuple(t.shape)} but y_pred has shape "
            f"{tuple(p.shape)}; use sparse_top_k_categorical_accuracy for integer class ids"
        )
    return _in_top_k(p, xp.argmax(t, axis=-1), k)


def sparse_top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5) -> Any:
    """1.0 where the integer class id ``y_true`` is among the ``k`` largest predictions.

    Example: ``sparse_top_k_categorical_accuracy(np.array([1]), np.array([[0.5, 0.3, 0.2]]),
    k=2)`` is ``array([1.])``.
    """
    p = plain_value(y_pred)
    xp = array_module(p)
    t = xp.asarray(plain_value(y_true))
    if t.ndim == p.ndim and t.shape[-1] == 1:
        t = t[..., 0]
    return _in_top_k(p, t.astype(np.int64), k)


def _in_top_k(p: Any, target: Any, k: int) -> Any:
    xp = array_module(p)
    score = xp.take_along_axis(p, xp.expand_dims(target, -1), axis=-1)
    higher = xp.sum(p > score, axis=-1)
    return (higher < int(k)).astype(np.float64)


class Accuracy(MeanMetricWrapper):
    """How often predictions equal labels exactly (``tf.keras.metrics.Accuracy``).

    Example: ``Accuracy()(np.array([1, 2, 3, 4]), np.array([0, 2, 3, 4]))`` gives ``0.75``.
    """

    def __init__(self, name: str = "accuracy", dtype: DTypeLike | None = None) -> None:
        super().__init__(accuracy, name=name, dtype=dtype)


class BinaryAccuracy(MeanMetricWrapper):
    """How often ``y_pred > threshold`` matches binary labels (``tf.keras.metrics.BinaryAccuracy``).

    Example: ``BinaryAccuracy()(np.array([[1], [0]]), np.array([[0.9], [0.7]]))`` gives ``0.5``.
    """

    def __init__(
        self, name: str = "binary_accuracy", dtype: DTypeLike | None = None, threshold: float = 0.5
    ) -> None:
        super().__init__(binary_accuracy, name=name, dtype=dtype, threshold=threshold)
        self.threshold = threshold


class CategoricalAccuracy(MeanMetricWrapper):
    """How often the argmax of one-hot labels and predictions agree.

    Example: ``CategoricalAccuracy()(onehot, probs)``.
    """

    def __init__(self, name: str = "categorical_accuracy", dtype: DTypeLike | None = None) -> None:
        super().__init__(categorical_accuracy, name=name, dtype=dtype)


class SparseCategoricalAccuracy(MeanMetricWrapper):
    """How often integer class ids equal the argmax of the predictions.

    Example: ``SparseCategoricalAccuracy()(np.array([1]), np.array([[0.2, 0.8]]))`` gives ``1.0``.
    """

    def __init__(
        self, name: str = "sparse_categorical_accuracy", dtype: DTypeLike | None = None
    ) -> None:
        super().__init__(sparse_categorical_accuracy, name=name, dtype=dtype)


class TopKCategoricalAccuracy(MeanMetricWrapper):
    """How often the one-hot target is among the ``k`` largest predictions
    (``keras.metrics.TopKCategoricalAccuracy``, ``k=5``).

    Example: ``TopKCategoricalAccuracy(k=2)(onehot, probs)``.
    """

    def __init__(
        self, k: int = 5, name: str = "top_k_categorical_accuracy", dtype: DTypeLike | None = None
    ) -> None:
        super().__init__(top_k_categorical_accuracy, name=name, dtype=dtype, k=int(k))
        self.k = int(k)


class SparseTopKCategoricalAccuracy(MeanMetricWrapper):
    """How often the integer class id is among the ``k`` largest predictions
    (``keras.metrics.SparseTopKCategoricalAccuracy``, ``k=5``).

    Example: ``SparseTopKCategoricalAccuracy(k=3)(labels, probs)``.
    """

    def __init__(
        self,
        k: int = 5,
        name: str = "sparse_top_k_categorical_accuracy",
        dtype: DTypeLike | None = None,
    ) -> None:
        super().__init__(sparse_top_k_categorical_accuracy, name=name, dtype=dtype, k=int(k))
        self.k = int(k)


# -- lookup and batched results --------------------------------------------------------------------
_CLASSES: dict[str, type[Metric]] = {
    c.__name__: c
    for c in (Mean, Sum, Accuracy, BinaryAccuracy, CategoricalAccuracy, SparseCategoricalAccuracy,
              TopKCategoricalAccuracy, SparseTopKCategoricalAccuracy)  # fmt: skip
}


# Metric classes defined in modules that build on this one (hpcdist.nn.confusion_metrics:
# Precision, Recall, AUC), registered by them when imported (hpcdist.nn imports them).
_REGISTERED: dict[str, type[Metric]] = {}


def register_metric_class(cls: type[Metric]) -> type[Metric]:
    """Make ``cls`` known to :func:`get` and as ``metrics.<name>`` (a class decorator).

    Example: ``@register_metric_class`` above ``class Precision(Metric): ...``.
    """
    _REGISTERED[cls.__name__] = cls
    return cls


def _classes() -> dict[str, type[Metric]]:
    """Every metric class by name, the registered ones (confusion metrics) too."""
    return {**_CLASSES, **_REGISTERED}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "binary_accuracy": binary_accuracy,
    "categorical_accuracy": categorical_accuracy,
    "sparse_categorical_accuracy": sparse_categorical_accuracy,
    "binary_crossentropy": losses_mod.binary_crossentropy,
    "bce": losses_mod.binary_crossentropy,
    "categorical_crossentropy": losses_mod.categorical_crossentropy,
    "sparse_categorical_crossentropy": losses_mod.sparse_categorical_crossentropy,
    "mean_squared_error": losses_mod.mean_squared_error,
    "mse": losses_mod.mean_squared_error,
    "mean_absolute_error": losses_mod.mean_absolute_error,
    "mae": losses_mod.mean_absolute_error,
}


def _loss_kind(loss: Any) -> str | None:
    """``"binary"``, ``"sparse"``, ``"categorical"`` or ``None`` for a loss of any form."""
    if isinstance(loss, str):
        try:
            loss = losses_mod.get(loss)
        except ValueError:
            return None
    kinds = (
        ("binary", losses_mod.BinaryCrossentropy, losses_mod.binary_crossentropy),
        (
            "sparse",
            losses_mod.SparseCategoricalCrossentropy,
            losses_mod.sparse_categorical_crossentropy,
        ),
        ("categorical", losses_mod.CategoricalCrossentropy, losses_mod.categorical_crossentropy),
    )
    for kind, cls, fn in kinds:
        if isinstance(loss, cls) or loss is fn or getattr(loss, "fn", None) is fn:
            return kind
    return None


def _accuracy_for(name: str, loss: Any, output_shape: Any) -> Metric:
    kind = _loss_kind(loss)
    last = tuple(output_shape)[-1] if output_shape is not None and len(output_shape) else None
    if kind == "binary" or last == 1:
        return BinaryAccuracy(name=name)
    if kind == "sparse":
        return SparseCategoricalAccuracy(name=name)
    if kind == "categorical":
        return CategoricalAccuracy(name=name)
    return Accuracy(name=name)


def get(identifier: Any, loss: Any = None, output_shape: Any = None) -> Metric:
    """A metric from a name, a :class:`Metric` (returned as is), a class or a function.

    ``"accuracy"``/``"acc"`` picks :class:`BinaryAccuracy` for a binary
    cross-entropy ``loss`` or an ``output_shape`` whose last dimension is 1,
    :class:`SparseCategoricalAccuracy` for sparse categorical cross-entropy,
    :class:`CategoricalAccuracy` for categorical cross-entropy, else
    :class:`Accuracy`. Other names: the class names and their snake_case
    forms, and the loss function names (a mean of the per-example loss). A
    function ``fn(y_true, y_pred)`` becomes a :class:`MeanMetricWrapper`.

    Example: ``get("accuracy", loss="sparse_categorical_crossentropy")`` is a
    ``SparseCategoricalAccuracy`` named ``"accuracy"``.
    """
    if isinstance(identifier, Metric):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Metric):
        return identifier()
    if isinstance(identifier, str):
        key = identifier.strip()
        if key.lower() in ("accuracy", "acc") and key != "Accuracy":
            return _accuracy_for(key, loss, output_shape)
        classes = _classes()
        if key in classes:
            return classes[key]()
        by_snake = {_snake(n): c for n, c in classes.items()}
        by_snake["auc"] = classes["AUC"]
        by_snake.pop("a_u_c")
        if key in by_snake:
            return by_snake[key]()
        if key in _FUNCTIONS:
            return MeanMetricWrapper(_FUNCTIONS[key], name=key)
        raise ValueError(
            f"unknown metric {identifier!r}; expected 'accuracy', one of "
            f"{', '.join(sorted({*by_snake, *_FUNCTIONS}))}, a Metric or a function"
        )
    if callable(identifier):
        return MeanMetricWrapper(identifier, name=getattr(identifier, "__name__", None))
    raise TypeError(
        f"cannot interpret {identifier!r} as a metric; pass a name such as 'accuracy', a "
        "hpcdist.nn.metrics.Metric or a function"
    )


def results(metrics: Sequence[Metric]) -> list[float]:
    """``result()`` of each metric, with ONE batched reduction of all their variables.

    In the cross-replica context the sync-on-read variables of all metrics are
    summed over replicas and workers together (per strategy), a collective
    under ``MultiWorkerMirroredStrategy``: every worker must call it with the
    same metrics in the same order. Plain (no strategy) metrics need no
    reduction; inside ``strategy.run`` each replica gets its local results.

    Example: ``logs = dict(zip(names, results([loss_tracker, accuracy])))``.
    """
    metrics = list(metrics)
    state: dict[int, np.ndarray] = {}
    groups: dict[int, tuple[Any, list[Variable]]] = {}
    seen: set[int] = set()
    for m in metrics:
        if not isinstance(m, Metric):
            raise TypeError(f"results() needs hpcdist.nn.metrics.Metric objects, got {m!r}")
        for var in m._variables:
            if id(var) in seen:
                continue
            seen.add(id(var))
            if _needs_reduction(var):
                strategy = var.distribute_strategy
                groups.setdefault(id(strategy), (strategy, []))[1].append(var)
            else:
                state[id(var)] = _local_value(var)
    for strategy, variables in groups.values():
        reduced = strategy.extended.reduce_leaves(ReduceOp.SUM, variables)
        for var, value in zip(variables, reduced, strict=True):
            state[id(var)] = to_host(value)
    return [m._result([state[id(v)] for v in m._variables]) for m in metrics]


def __getattr__(name: str) -> Any:
    """``metrics.Precision``, ``metrics.Recall``, ``metrics.AUC`` (defined in
    :mod:`hpcdist.nn.confusion_metrics`, which imports this module and registers them)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
