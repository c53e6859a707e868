"""Losses with Keras's formulas and reductions, differentiable through :class:`Traced`.

Per-example functions (``binary_crossentropy``, ``categorical_crossentropy``,
``sparse_categorical_crossentropy``, ``mean_squared_error``, ``mean_absolute_error``,
``huber``) give one loss per
example (the mean or sum over the last axis, as Keras). Loss classes apply
sample weights and a :class:`Reduction`. Given ``Traced.leaf(y_pred)`` they
return ``Traced`` values whose ``.grad`` is the exact derivative of the value
computed (zero where probabilities were clipped to ``[eps, 1 - eps]``).

As in Keras, a loss object with reduction ``AUTO`` or ``SUM_OVER_BATCH_SIZE``
called inside ``strategy.run`` of a strategy with several replicas raises
``ValueError``: each replica would divide by its own batch size. Use ``SUM``
or ``NONE`` with :func:`compute_average_loss`; the built-in training loop
marks its calls with :func:`builtin_loop`.

Formulas (TF-Keras 2.x, ``eps = backend.epsilon()``, ``c = clip(p, eps, 1 - eps)``):

* binary: ``-mean(t*log(c + eps) + (1-t)*log(1 - c + eps))``; logits ``x``:
  ``mean(max(x, 0) - x*t + log(1 + exp(-|x|)))``; label smoothing ``t*(1-s) + s/2``.
* categorical: ``-sum(t * log(clip(p / sum(p), eps, 1 - eps)))``; logits:
  ``-sum(t * log_softmax(x))``; label smoothing ``t*(1-s) + s/num_classes``.
* sparse categorical: ``-log_softmax(log(c))[label]`` (``= log(sum c) - log c[label]``);
  logits: ``-log_softmax(x)[label]``.
* mean squared error: ``mean((p - t)**2)``; mean absolute error: ``mean(|p - t|)``.
* Huber: with ``e = p - t``, ``q = min(|e|, delta)``: ``mean(0.5 * q**2 + delta * (|e| - q))``.

Example:
    >>> import numpy as np
    >>> bce = BinaryCrossentropy()
    >>> y_true = np.array([[0.0, 1.0], [0.0, 0.0]])
    >>> y_pred = np.array([[0.6, 0.4], [0.4, 0.6]])
    >>> round(float(bce(y_true, y_pred)), 3)
    0.815
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray
from hpcdist.distribute import context
from hpcdist.nn import backend
from hpcdist.nn.tape import Traced, from_last_axis


def _epsilon() -> float:
    return backend.epsilon()


# -- reductions and the distribution check ------------------------------------------------------
class Reduction:
    """How a loss object reduces per-example losses (``tf.keras.losses.Reduction``)."""

    AUTO = "auto"
    NONE = "none"
    SUM = "sum"
    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"

    @classmethod
    def all(cls) -> tuple[str, ...]:
        """The valid reduction names.

        Example: ``"sum" in Reduction.all()``.
        """
        return (cls.AUTO, cls.NONE, cls.SUM, cls.SUM_OVER_BATCH_SIZE)

    @classmethod
    def validate(cls, key: Any) -> None:
        """Raise ``ValueError`` unless ``key`` is a valid reduction."""
        if key not in cls.all():
            raise ValueError(
                f"invalid reduction {key!r}; expected one of {', '.join(map(repr, cls.all()))} "
                "(hpcdist.nn.losses.Reduction)"
            )


_local = threading.local()


@contextlib.contextmanager
def builtin_loop() -> Iterator[None]:
    """Mark loss calls on this thread as made by the built-in training loop.

    Inside it a loss object with reduction ``AUTO``/``SUM_OVER_BATCH_SIZE`` may be
    called in a multi-replica ``strategy.run`` (the loop rescales it itself).

    Example: ``with builtin_loop(): per_example = loss_obj(y, y_pred)``.
    """
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _in_builtin_loop() -> bool:
    return getattr(_local, "depth", 0) > 0


def _num_replicas_here() -> int:
    """``num_replicas_in_sync`` of the current replica context (1 in cross-replica context)."""
    ctx = context.get_replica_context()
    return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def _check_distribution(reduction: str) -> None:
    if reduction not in (Reduction.AUTO, Reduction.SUM_OVER_BATCH_SIZE) or _in_builtin_loop():
        return
    ctx = context.get_replica_context()
    if ctx is None or ctx.strategy is context.default_strategy():
        return
    if ctx.num_replicas_in_sync > 1:
        raise ValueError(
            f"a loss with reduction {reduction!r} was called inside strategy.run with "
            f"{ctx.num_replicas_in_sync} replicas: each replica would divide by its own batch "
            "size. Use reduction=hpcdist.nn.losses.Reduction.SUM or Reduction.NONE and divide "
            "by the global batch size with hpcdist.nn.compute_average_loss(per_example_loss, "
            "global_batch_size=...). (Losses given to Model.compile are fine: fit handles them.)"
        )


# -- helpers -------------------------------------------------------------------------------------
def _pred(y_pred: Any) -> tuple[Any, Any]:
    """``(plain float array, xp)`` of the predictions (a Traced or an array)."""
    p = y_pred.value if isinstance(y_pred, Traced) else asarray(y_pred)
    xp = array_module(p)
    if not xp.issubdtype(p.dtype, xp.floating):
        p = p.astype(backend.floatx())
    if p.ndim == 0:
        raise ValueError("y_pred must have rank >= 1 (a batch of predictions), got a scalar")
    if isinstance(y_pred, Traced) and p is not y_pred.value:
        raise TypeError(f"a traced y_pred must be a float array, got {y_pred.dtype}")
    return p, xp


def _true_like(y_true: Any, p: Any, xp: Any, what: str) -> Any:
    """``y_true`` in ``p``'s dtype and shape (a trailing size-1 axis added or dropped)."""
    if isinstance(y_true, Traced):
        raise TypeError("y_true must be a plain array, not a Traced; pass the labels")
    t = xp.asarray(y_true)
    if t.ndim == p.ndim - 1 and p.shape[-1] == 1:
        t = xp.expand_dims(t, -1)
    elif t.ndim == p.ndim + 1 and t.shape[-1] == 1:
        t = t[..., 0]
    if tuple(t.shape) != tuple(p.shape):
        hint = (
            "; integer class labels need SparseCategoricalCrossentropy"
            if what == "categorical_crossentropy" and t.ndim == p.ndim - 1
            else ""
        )
        raise ValueError(
            f"{what}: y_true has shape {tuple(t.shape)} but y_pred has shape "
            f"{tuple(p.shape)}; they must match{hint}"
        )
    return t.astype(p.dtype, copy=False)


def _sigmoid(x: Any, xp: Any) -> Any:
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _log_softmax(x: Any, xp: Any) -> Any:
    z = x - xp.max(x, axis=-1, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))


def _clip_mask(p: Any, xp: Any) -> tuple[Any, Any]:
    """``(clip(p, eps, 1 - eps), 1 where the clip passes the gradient else 0)``."""
    eps = p.dtype.type(_epsilon())
    lo, hi = eps, p.dtype.type(1) - eps
    return xp.clip(p, lo, hi), ((p >= lo) & (p <= hi)).astype(p.dtype)


# -- per-example functions -----------------------------------------------------------------------
def binary_crossentropy(
    y_true: Any, y_pred: Any, from_logits: bool = False, label_smoothing: float = 0.0
) -> Any:
    """Per-example binary cross-entropy: the mean over the last axis (Keras formula).

    Example: ``binary_crossentropy(np.array([[1.0]]), np.array([[0.9]]))`` is about
    ``array([0.10536])``.
    """
    p, xp = _pred(y_pred)
    t = _true_like(y_true, p, xp, "binary_crossentropy")
    if label_smoothing:
        t = t * (1 - label_smoothing) + 0.5 * label_smoothing
    n = p.shape[-1]
    need = isinstance(y_pred, Traced)
    if from_logits:
        elem = xp.maximum(p, 0) - p * t + xp.log1p(xp.exp(-xp.abs(p)))
        d = _sigmoid(p, xp) - t if need else None
    else:
        eps = p.dtype.type(_epsilon())
        c, mask = _clip_mask(p, xp)
        elem = -(t * xp.log(c + eps) + (1 - t) * xp.log(1 - c + eps))
        d = mask * ((1 - t) / (1 - c + eps) - t / (c + eps)) if need else None
    value = xp.mean(elem, axis=-1)
    return from_last_axis(y_pred, value, d / p.dtype.type(n) if need else None)


def categorical_crossentropy(
    y_true: Any, y_pred: Any, from_logits: bool = False, label_smoothing: float = 0.0
) -> Any:
    """Per-example categorical cross-entropy of one-hot (or soft) labels (Keras formula).

    From probabilities, ``y_pred`` is first divided by its sum over the last axis.

    Example: ``categorical_crossentropy(np.array([[0, 1.0]]), np.array([[0.2, 0.8]]))``
    is about ``array([0.22314])``.
    """
    p, xp = _pred(y_pred)
    t = _true_like(y_true, p, xp, "categorical_crossentropy")
    if label_smoothing:
        t = t * (1 - label_smoothing) + label_smoothing / p.shape[-1]
    need = isinstance(y_pred, Traced)
    if from_logits:
        logp = _log_softmax(p, xp)
        value = -xp.sum(t * logp, axis=-1)
        jac = xp.exp(logp) * xp.sum(t, axis=-1, keepdims=True) - t if need else None
        return from_last_axis(y_pred, value, jac)
    s = xp.sum(p, axis=-1, keepdims=True)
    q = p / s
    c, mask = _clip_mask(q, xp)
    value = -xp.sum(t * xp.log(c), axis=-1)
    if not need:
        return value
    g = -mask * t / c  # d value / d q
    jac = (g - xp.sum(g * q, axis=-1, keepdims=True)) / s
    return from_last_axis(y_pred, value, jac)


def _labels(y_true: Any, p: Any, xp: Any) -> Any:
    if isinstance(y_true, Traced):
        raise TypeError("y_true must be a plain array of class ids, not a Traced")
    lab = xp.asarray(y_true)
    if lab.ndim == p.ndim and lab.shape[-1] == 1:
        lab = lab[..., 0]
    if tuple(lab.shape) != tuple(p.shape[:-1]):
        raise ValueError(
            f"sparse_categorical_crossentropy: y_true has shape {tuple(xp.asarray(y_true).shape)}"
            f" but y_pred has shape {tuple(p.shape)}; expected class ids of shape "
            f"{tuple(p.shape[:-1])} (or {(*p.shape[:-1], 1)}). One-hot labels need "
            "CategoricalCrossentropy"
        )
    if xp.issubdtype(lab.dtype, xp.floating):
        ints = lab.astype(np.int64)
        if lab.size and bool(xp.any(ints != lab)):
            raise ValueError("sparse_categorical_crossentropy: y_true has non-integer class ids")
        lab = ints
    elif not xp.issubdtype(lab.dtype, xp.integer):
        raise TypeError(f"y_true must hold integer class ids, got dtype {lab.dtype}")
    n = p.shape[-1]
    if lab.size and bool(xp.any((lab < 0) | (lab >= n))):
        raise ValueError(
            f"sparse_categorical_crossentropy: class ids must be in [0, {n}) for y_pred with {n} "
            f"classes; got values from {int(lab.min())} to {int(lab.max())}"
        )
    return lab.astype(np.int64, copy=False)


def sparse_categorical_crossentropy(y_true: Any, y_pred: Any, from_logits: bool = False) -> Any:
    """Per-example cross-entropy of integer class ids (shape ``(B,)`` or ``(B, 1)``).

    Example: ``sparse_categorical_crossentropy(np.array([1]), np.array([[0.2, 0.8]]))``
    is about ``array([0.22314])``.
    """
    p, xp = _pred(y_pred)
    lab = _labels(y_true, p, xp)
    need = isinstance(y_pred, Traced)
    if from_logits:
        logp = _log_softmax(p, xp)
    else:
        c, mask = _clip_mask(p, xp)
        logp = _log_softmax(xp.log(c), xp)
    idx = xp.expand_dims(lab, -1)
    value = -xp.take_along_axis(logp, idx, axis=-1)[..., 0]
    if not need:
        return value
    onehot = (xp.arange(p.shape[-1]) == idx).astype(p.dtype)
    if from_logits:
        jac = xp.exp(logp) - onehot
    else:  # value = log(sum c) - log c[label]
        jac = mask * (1 / xp.sum(c, axis=-1, keepdims=True) - onehot / c)
    return from_last_axis(y_pred, value, jac)


def mean_squared_error(y_true: Any, y_pred: Any) -> Any:
    """Per-example mean squared error over the last axis.

    Example: ``mean_squared_error(np.array([[0.0, 1.0]]), np.array([[1.0, 1.0]]))`` is
    ``array([0.5])``.
    """
    p, xp = _pred(y_pred)
    t = _true_like(y_true, p, xp, "mean_squared_error")
    diff = p - t
    value = xp.mean(diff * diff, axis=-1)
    jac = diff * p.dtype.type(2.0 / p.shape[-1]) if isinstance(y_pred, Traced) else None
    return from_last_axis(y_pred, value, jac)


def mean_absolute_error(y_true: Any, y_pred: Any) -> Any:
    """Per-example mean absolute error over the last axis (gradient ``sign(p - t) / n``).

    Example: ``mean_absolute_error(np.array([[0.0, 1.0]]), np.array([[1.0, 3.0]]))`` is
    ``array([1.5])``.
    """
    p, xp = _pred(y_pred)
    t = _true_like(y_true, p, xp, "mean_absolute_error")
    diff = p - t
    value = xp.mean(xp.abs(diff), axis=-1)
    jac = xp.sign(diff) * p.dtype.type(1.0 / p.shape[-1]) if isinstance(y_pred, Traced) else None
    return from_last_axis(y_pred, value, jac)


def huber(y_true: Any, y_pred: Any, delta: float = 1.0) -> Any:
    """Per-example Huber loss over the last axis: quadratic for ``|p - t| <= delta``, linear
    beyond (gradient ``clip(p - t, -delta, delta) / n``).

    Example: ``huber(np.array([[0.0, 0.0]]), np.array([[0.5, 3.0]]))`` is
    ``array([1.3125])`` (``(0.125 + 2.5) / 2``).
    """
    p, xp = _pred(y_pred)
    t = _true_like(y_true, p, xp, "huber")
    d = p.dtype.type(delta)
    diff = p - t
    err = xp.abs(diff)
    quad = xp.minimum(err, d)
    value = xp.mean(p.dtype.type(0.5) * quad * quad + d * (err - quad), axis=-1)
    need = isinstance(y_pred, Traced)
    jac = xp.clip(diff, -d, d) * p.dtype.type(1.0 / p.shape[-1]) if need else None
    return from_last_axis(y_pred, value, jac)


#: Keras's short names of :func:`mean_absolute_error`.
mae = MAE = mean_absolute_error
#: Keras's short names of :func:`mean_squared_error`.
mse = MSE = mean_squared_error
#: Keras's short names of :func:`binary_crossentropy`.
bce = BCE = binary_crossentropy


# -- weighting and reducing ----------------------------------------------------------------------
def _value(x: Any) -> Any:
    return x.value if isinstance(x, Traced) else asarray(x)


def _weights_for(losses: Any, sample_weight: Any) -> Any:
    """``sample_weight`` in the losses' dtype, its rank matched to theirs (Keras rules)."""
    v = _value(losses)
    xp = array_module(v)
    if isinstance(sample_weight, Traced):
        raise TypeError("sample_weight must be a plain array, not a Traced")
    w = xp.asarray(sample_weight)
    if xp.issubdtype(v.dtype, xp.floating):
        w = w.astype(v.dtype, copy=False)
    if w.ndim > 0:
        if w.ndim == v.ndim + 1 and w.shape[-1] == 1:
            w = w[..., 0]
        elif w.ndim == v.ndim - 1:
            w = xp.expand_dims(w, -1)
    try:
        np.broadcast_shapes(tuple(w.shape), tuple(v.shape))
    except ValueError:
        raise ValueError(
            f"sample_weight of shape {tuple(xp.asarray(sample_weight).shape)} does not broadcast "
            f"to the per-example losses of shape {tuple(v.shape)}; give one weight per example"
        ) from None
    return w


def compute_weighted_loss(losses: Any, sample_weight: Any = None, reduction: str = "auto") -> Any:
    """Weight per-example ``losses`` and reduce them (Keras ``compute_weighted_loss``).

    ``NONE`` gives the weighted losses, ``SUM`` their sum, ``SUM_OVER_BATCH_SIZE``
    (and ``AUTO``) the sum divided by the number of elements (not by the sum of weights).

    Example: ``compute_weighted_loss(np.array([1.0, 3.0]), np.array([1.0, 0.0]))`` is
    ``array(0.5)``.
    """
    Reduction.validate(reduction)
    weighted = losses if sample_weight is None else losses * _weights_for(losses, sample_weight)
    if not isinstance(weighted, Traced):
        weighted = asarray(weighted)
    if reduction == Reduction.NONE:
        return weighted
    total = weighted.sum()
    if reduction == Reduction.SUM:
        return _as_result(total)
    n = int(np.prod(weighted.shape))
    return _as_result(total / n if n else total * 0)


def _as_result(x: Any) -> Any:
    """A ``Traced`` as it is, anything else as an array (0-d arrays stay arrays)."""
    return x if isinstance(x, Traced) else asarray(x)


def compute_average_loss(
    per_example_loss: Any, global_batch_size: int | None = None, sample_weight: Any = None
) -> Any:
    """``sum(per_example_loss * sample_weight) / global_batch_size`` (``tf.nn`` semantics).

    The default global batch size is ``per_example_loss.shape[0]`` times
    ``num_replicas_in_sync`` of the current replica context (1 outside
    ``strategy.run``). A zero global batch size gives 0. Accepts ``Traced``.

    Example: ``compute_average_loss(np.array([1.0, 2.0, 3.0]), global_batch_size=6)`` is
    ``array(1.)``.
    """
    if not isinstance(per_example_loss, Traced):
        per_example_loss = asarray(per_example_loss)
    if per_example_loss.ndim == 0:
        raise ValueError(
            "compute_average_loss needs per-example losses of rank >= 1 (one per example), "
            "got a scalar; use a loss with reduction NONE, or divide a summed loss yourself"
        )
    if global_batch_size is None:
        global_batch_size = per_example_loss.shape[0] * _num_replicas_here()
    else:
        g = global_batch_size
        if isinstance(g, (np.ndarray, np.generic)) and g.ndim == 0:
            g = g.item()
        if isinstance(g, bool) or not isinstance(g, numbers.Integral):
            raise TypeError(
                f"global_batch_size must be an integer, got {global_batch_size!r} "
                f"({type(global_batch_size).__name__})"
            )
        if g < 0:
            raise ValueError(f"global_batch_size must be >= 0, got {g}")
        global_batch_size = int(g)
    total = compute_weighted_loss(per_example_loss, sample_weight, Reduction.SUM)
    return _as_result(total / global_batch_size if global_batch_size else total * 0)


def scale_regularization_loss(regularization_loss: Any) -> Any:
    """``sum(regularization_loss) / num_replicas_in_sync`` (``tf.nn`` semantics).

    ``regularization_loss`` is an array, a ``Traced`` or a list of them.

    Example: ``scale_regularization_loss([np.float64(1.0), np.float64(3.0)])`` is
    ``array(4.)`` outside ``strategy.run``.
    """
    items = (
        list(regularization_loss)
        if isinstance(regularization_loss, (list, tuple))
        else [regularization_loss]
    )
    if not items:
        raise ValueError("scale_regularization_loss needs at least one loss, got an empty list")
    total: Any = 0.0
    for item in items:
        if isinstance(item, Traced):
            term = item.sum()
        else:
            item = asarray(item)
            term = array_module(item).sum(item)
        total = term + total if isinstance(term, Traced) else total + term
    return _as_result(total / _num_replicas_here())


# -- loss objects ----------------------------------------------------------------------------
class Loss:
    """Base class of loss objects: ``loss(y_true, y_pred, sample_weight=None)``.

    Subclasses implement ``call(y_true, y_pred)`` (per-example losses); ``__call__``
    weights and reduces them with ``reduction``.

    Example: ``class Half(Loss): call = lambda self, t, p: 0.5 * mean_squared_error(t, p)``.
    """

    def __init__(self, reduction: str = Reduction.AUTO, name: str | None = None) -> None:
        Reduction.validate(reduction)
        self.reduction = reduction
        self.name = name or type(self).__name__

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """The per-example losses (implemented by subclasses)."""
        raise NotImplementedError(f"{type(self).__name__} must implement call(y_true, y_pred)")

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        reduction = self.reduction
        Reduction.validate(reduction)
        _check_distribution(reduction)
        losses = self.call(y_true, y_pred)
        return compute_weighted_loss(losses, sample_weight, reduction)

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments.

        Example: ``BinaryCrossentropy.from_config(loss.get_config())``.
        """
        return {"reduction": self.reduction, "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Loss:
        """A loss made from :meth:`get_config`'s output.

        Example: ``MeanSquaredError.from_config({"reduction": "sum", "name": "mse"})``.
        """
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} reduction={self.reduction!r}>"


class LossFunctionWrapper(Loss):
    """A loss object around a per-example function ``fn(y_true, y_pred, **kwargs)``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        reduction: str = Reduction.AUTO,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(reduction=reduction, name=name or getattr(fn, "__name__", None))
        self.fn = fn
        self._fn_kwargs = kwargs

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self.fn(y_true, y_pred, **self._fn_kwargs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._fn_kwargs}


class BinaryCrossentropy(LossFunctionWrapper):
    """Binary cross-entropy (``tf.keras.losses.BinaryCrossentropy``).

    Example: ``BinaryCrossentropy(from_logits=True)(y, Traced.leaf(logits)).grad``.
    """

    def __init__(
        self,
        from_logits: bool = False,
        label_smoothing: float = 0.0,
        reduction: str = Reduction.AUTO,
        name: str = "binary_crossentropy",
    ) -> None:
        super().__init__(
            binary_crossentropy,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
            label_smoothing=label_smoothing,
        )
        self.from_logits = from_logits


class CategoricalCrossentropy(LossFunctionWrapper):
    """Categorical cross-entropy of one-hot labels (``tf.keras.losses.CategoricalCrossentropy``).

    Example: ``CategoricalCrossentropy(label_smoothing=0.1)(onehot, probs)``.
    """

    def __init__(
        self,
        from_logits: bool = False,
        label_smoothing: float = 0.0,
        reduction: str = Reduction.AUTO,
        name: str = "categorical_crossentropy",
    ) -> None:
        super().__init__(
            categorical_crossentropy,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
            label_smoothing=label_smoothing,
        )
        self.from_logits = from_logits


class SparseCategoricalCrossentropy(LossFunctionWrapper):
    """Cross-entropy of integer class ids (``tf.keras.losses.SparseCategoricalCrossentropy``).

    Example: ``SparseCategoricalCrossentropy(from_logits=True)(labels, logits)``.
    """

    def __init__(
        self,
        from_logits: bool = False,
        reduction: str = Reduction.AUTO,
        name: str = "sparse_categorical_crossentropy",
    ) -> None:
        super().__init__(
            sparse_categorical_crossentropy,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
        )
        self.from_logits = from_logits


class MeanSquaredError(LossFunctionWrapper):
    """Mean squared error (``tf.keras.losses.MeanSquaredError``).

    Example: ``MeanSquaredError(reduction="sum")(y, y_pred)``.
    """

    def __init__(self, reduction: str = Reduction.AUTO, name: str = "mean_squared_error") -> None:
        super().__init__(mean_squared_error, reduction=reduction, name=name)


class MeanAbsoluteError(LossFunctionWrapper):
    """Mean absolute error (``tf.keras.losses.MeanAbsoluteError``).

    Example: ``MeanAbsoluteError()(y, y_pred)``.
    """

    def __init__(self, reduction: str = Reduction.AUTO, name: str = "mean_absolute_error") -> None:
        super().__init__(mean_absolute_error, reduction=reduction, name=name)


class Huber(LossFunctionWrapper):
    """Huber loss (``tf.keras.losses.Huber``): squared error below ``delta``, linear above.

    Example: ``Huber(delta=0.5)(y, y_pred)``.
    """

    def __init__(
        self, delta: float = 1.0, reduction: str = Reduction.AUTO, name: str = "huber_loss"
    ) -> None:
        delta = float(delta)
        if not delta >= 0:
            raise ValueError(f"Huber delta is {delta!r}; expected a number >= 0")
        super().__init__(huber, reduction=reduction, name=name, delta=delta)
        self.delta = delta


_BY_NAME: dict[str, type[Loss]] = {
    "binary_crossentropy": BinaryCrossentropy,
    "bce": BinaryCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "cce": CategoricalCrossentropy,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError,
    "mae": MeanAbsoluteError,
    "huber": Huber,
    "huber_loss": Huber,
}
for _cls in (
    BinaryCrossentropy,
    CategoricalCrossentropy,
    SparseCategoricalCrossentropy,
    MeanSquaredError,
    MeanAbsoluteError,
    Huber,
):
    _BY_NAME[_cls.__name__.lower()] = _cls


def get(identifier: Any) -> Any:
    """A loss object from a name, a :class:`Loss` (returned as is) or a callable.

    Names: ``"binary_crossentropy"``/``"bce"``, ``"categorical_crossentropy"``,
    ``"sparse_categorical_crossentropy"``, ``"mean_squared_error"``/``"mse"``,
    ``"mean_absolute_error"``/``"mae"``, ``"huber"`` and the class names; a name gives a
    new object with the default arguments.

    Example: ``get("mse")`` is a ``MeanSquaredError``.
    """
    if identifier is None or isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.strip().lower())
        if cls is None:
            raise ValueError(
                f"unknown loss {identifier!r}; expected one of {', '.join(sorted(_BY_NAME))}, "
                "a hpcdist.nn.losses.Loss or a callable"
            )
        return cls()
    if isinstance(identifier, type) and issubclass(identifier, Loss):
        return identifier()
    if callable(identifier):
        return identifier
    raise TypeError(
        f"cannot interpret {identifier!r} as a loss; pass a name such as 'mse', a "
        "hpcdist.nn.losses.Loss or a callable"
    )
