"""Normalization layers with explicit backward passes: BatchNormalization, LayerNormalization.

Both compute ``y = gamma * (x - mean) / sqrt(var + epsilon) + beta`` (Keras's
formula; ``var`` is the biased variance), over the batch (and every axis but
the feature axis) for :class:`BatchNormalization`, over the feature axes of
each example for :class:`LayerNormalization`.

Under a strategy, :class:`BatchNormalization` normalizes each replica's batch
with that replica's own statistics (as ``tf.keras`` under ``tf.distribute``).
With ``synchronized=True`` (Keras 3's argument) the batch statistics are
all-reduced over all replicas, forward (one allreduce of the counts, sums and
sums of squares) and backward (one allreduce of the two sums the gradient of
the input needs): the result is exactly one process's on the whole global
batch, up to the order of the sums. The moving statistics are sync-on-read
variables with MEAN aggregation: each replica updates its own copy; a read
outside ``strategy.run`` (saving, ``get_weights``) gives their mean.

Under a mixed-precision policy (as Keras) both take their input in the 16-bit
compute dtype, compute the statistics and the normalization in float32 (the
variables' dtype), and return the compute dtype; the gradients of ``gamma``
and ``beta`` are float32, the gradient of the input is in the compute dtype.

Example:
    >>> import numpy as np
    >>> bn = BatchNormalization(dtype="float64")
    >>> y = bn(np.array([[1.0], [3.0]]), training=True)
    >>> np.round(y.ravel(), 3), bn.moving_mean.numpy()  # (x - 2) / sqrt(1 + 1e-3)
    (array([-1.,  1.]), array([0.02]))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcdist.arrays import array_module
from hpcdist.distribute import context
from hpcdist.distribute.variables import Variable, VariableAggregation, VariableSynchronization
from hpcdist.nn import initializers as initializers_mod
from hpcdist.nn import mixed_precision
from hpcdist.nn import regularizers as regularizers_mod
from hpcdist.nn.layers import Layer, check_shape

__all__ = ["BatchNormalization", "LayerNormalization"]


def _axes(axis: Any, what: str) -> tuple[int, ...]:
    items = axis if isinstance(axis, (list, tuple)) else [axis]
    try:
        out = tuple(int(a) for a in items)
    except (TypeError, ValueError):
        raise TypeError(f"{what} axis is {axis!r}; expected an int or a list of ints") from None
    if not out:
        raise ValueError(f"{what} axis is {axis!r}; expected at least one axis")
    return out


def _resolve(axes: tuple[int, ...], ndim: int, what: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        b = a + ndim if a < 0 else a
        if not 0 < b < ndim:  # the batch axis is never a feature axis
            raise ValueError(
                f"{what}: axis {a} is invalid for inputs of rank {ndim} (axis 0 is the batch); "
                f"expected an axis in [1, {ndim - 1}] or [-{ndim - 1}, -1]"
            )
        out.append(b)
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: axis {list(axes)} names an axis twice")
    return tuple(sorted(out))


class _Normalization(Layer):
    """What both layers share: the axes, gamma and beta, the config."""

    def __init__(
        self,
        axis: Any,
        epsilon: float,
        center: bool,
        scale: bool,
        beta_initializer: initializers_mod.InitializerLike,
        gamma_initializer: initializers_mod.InitializerLike,
        beta_regularizer: regularizers_mod.RegularizerLike,
        gamma_regularizer: regularizers_mod.RegularizerLike,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.axis = axis if isinstance(axis, int) else list(_axes(axis, type(self).__name__))
        self._axes = _axes(axis, type(self).__name__)
        self.epsilon = float(epsilon)
        if not self.epsilon > 0:
            raise ValueError(f"{type(self).__name__} epsilon is {epsilon!r}; expected > 0")
        self.center = bool(center)
        self.scale = bool(scale)
        self.beta_initializer = initializers_mod.get(beta_initializer)
        self.gamma_initializer = initializers_mod.get(gamma_initializer)
        self.beta_regularizer = regularizers_mod.get(beta_regularizer)
        self.gamma_regularizer = regularizers_mod.get(gamma_regularizer)
        self.gamma: Variable | None = None
        self.beta: Variable | None = None

    def _feature_axes(self, input_shape: tuple) -> tuple[int, ...]:
        axes = _resolve(self._axes, len(input_shape), f"{type(self).__name__} {self.name!r}")
        if any(input_shape[a] is None for a in axes):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: the size of axis {list(self._axes)} must "
                f"be known; found input shape {tuple(input_shape)}"
            )
        return axes

    def _make_affine(self, param_shape: tuple) -> None:
        if self.scale:
            self.gamma = self.add_weight("gamma", param_shape, self.gamma_initializer,
                                         regularizer=self.gamma_regularizer)  # fmt: skip
        if self.center:
            self.beta = self.add_weight("beta", param_shape, self.beta_initializer,
                                        regularizer=self.beta_regularizer)  # fmt: skip

    def _widen(self, x: Any, xp: Any) -> Any:
        """``x`` autocast to the compute dtype, then in the variables' dtype for the math."""
        return self._autocast(x, xp).astype(self.dtype, copy=False)

    def _narrow(self, y: Any) -> Any:
        """``y`` in the compute dtype (what the layer returns)."""
        compute = mixed_precision.compute_array_dtype(self.compute_dtype, array_module(y))
        return y.astype(compute, copy=False)

    def _affine_grads(self, dy: Any, xhat: Any, axes: tuple[int, ...], shape: tuple) -> list:
        if not self._trainable:
            return []
        grads: list[Any] = []
        if self.gamma is not None:
            grads.append((dy * xhat).sum(axis=axes).reshape(shape))
        if self.beta is not None:
            grads.append(dy.sum(axis=axes).reshape(shape))
        return grads

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            axis=self.axis,
            epsilon=self.epsilon,
            center=self.center,
            scale=self.scale,
            beta_initializer=initializers_mod.serialize(self.beta_initializer),
            gamma_initializer=initializers_mod.serialize(self.gamma_initializer),
            beta_regularizer=regularizers_mod.serialize(self.beta_regularizer),
            gamma_regularizer=regularizers_mod.serialize(self.gamma_regularizer),
        )
        return config


class BatchNormalization(_Normalization):
    """Normalizes over the batch (``keras.layers.BatchNormalization``).

    In training (``training=True`` and a trainable layer) it uses the batch's
    mean and variance and updates ``moving_mean = momentum * moving_mean + (1 -
    momentum) * mean`` (and ``moving_variance`` alike); in inference, and always
    when ``trainable`` is false (as Keras 2.x+), it uses the moving statistics.
    ``axis`` is the feature axis (default ``-1``); statistics are over all
    other axes. Weights: ``gamma``, ``beta`` (trainable), ``moving_mean``,
    ``moving_variance``.

    ``synchronized=True``: under a strategy with several replicas, the batch
    statistics (and the sums in the backward pass) are all-reduced over all
    replicas, so the layer normalizes the global batch (a collective in
    training steps: every replica must run the layer). Without a strategy it
    changes nothing.

    Example: ``Sequential([Dense(64, input_shape=(10,)), BatchNormalization(synchronized=True),
    Activation("relu"), Dense(1)])``.
    """

    def __init__(
        self,
        axis: int = -1,
        momentum: float = 0.99,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        beta_initializer: initializers_mod.InitializerLike = "zeros",
        gamma_initializer: initializers_mod.InitializerLike = "ones",
        moving_mean_initializer: initializers_mod.InitializerLike = "zeros",
        moving_variance_initializer: initializers_mod.InitializerLike = "ones",
        beta_regularizer: regularizers_mod.RegularizerLike = None,
        gamma_regularizer: regularizers_mod.RegularizerLike = None,
        synchronized: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise TypeError(f"BatchNormalization axis is {axis!r}; expected one int (the features)")
        super().__init__(int(axis), epsilon, center, scale, beta_initializer, gamma_initializer,
                         beta_regularizer, gamma_regularizer, **kwargs)  # fmt: skip
        self.momentum = float(momentum)
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"BatchNormalization momentum is {momentum!r}; expected in [0, 1]")
        self.moving_mean_initializer = initializers_mod.get(moving_mean_initializer)
        self.moving_variance_initializer = initializers_mod.get(moving_variance_initializer)
        self.synchronized = bool(synchronized)

    def build(self, input_shape: tuple) -> None:
        (axis,) = self._feature_axes(input_shape)
        shape = (int(input_shape[axis]),)
        self._make_affine(shape)
        stats: dict[str, Any] = {
            "trainable": False,
            "synchronization": VariableSynchronization.ON_READ,
            "aggregation": VariableAggregation.MEAN,
        }
        self.moving_mean = self.add_weight("moving_mean", shape, self.moving_mean_initializer,
                                           **stats)  # fmt: skip
        self.moving_variance = self.add_weight(
            "moving_variance", shape, self.moving_variance_initializer, **stats
        )
        self.built = True

    def _layout(self, x: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(reduction axes, broadcast shape of the statistics)`` for the input ``x``."""
        (axis,) = _resolve(self._axes, x.ndim, f"BatchNormalization {self.name!r}")
        reduce = tuple(i for i in range(x.ndim) if i != axis)
        shape = tuple(x.shape[axis] if i == axis else 1 for i in range(x.ndim))
        return reduce, shape

    def _sync_context(self) -> Any:
        """The replica context to all-reduce in, or ``None`` (not synchronized, one replica)."""
        if not self.synchronized:
            return None
        ctx = context.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            return None
        return ctx

    def _batch_stats(self, x: Any, reduce: tuple[int, ...], ctx: Any) -> tuple[Any, Any, float]:
        """``(mean, variance, count)`` of this batch, or of all replicas' batches with ``ctx``."""
        xp = array_module(x)
        n_local = float(np.prod([x.shape[i] for i in reduce]))
        if ctx is None:
            if n_local == 0:
                return None, None, 0.0
            return xp.mean(x, axis=reduce), xp.var(x, axis=reduce), n_local
        x64 = x.astype(np.float64, copy=False)
        local = xp.concatenate([xp.asarray([n_local]), x64.sum(axis=reduce),
                                (x64 * x64).sum(axis=reduce)])  # fmt: skip
        total = ctx.all_reduce("sum", local)
        n = float(total[0])
        if n == 0:
            return None, None, 0.0
        c = (total.shape[0] - 1) // 2
        mean = total[1 : 1 + c] / n
        var = xp.maximum(total[1 + c :] / n - mean * mean, 0.0)
        return mean.astype(x.dtype), var.astype(x.dtype), n

    def _update_moving(self, mean: Any, var: Any) -> None:
        m = self.moving_mean.raw_value()
        keep, new = m.dtype.type(self.momentum), m.dtype.type(1.0 - self.momentum)
        self.moving_mean.assign(m * keep + mean.astype(m.dtype) * new)
        v = self.moving_variance.raw_value()
        self.moving_variance.assign(v * keep + var.astype(v.dtype) * new)

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        self._require_built()
        ref = self.moving_mean.raw_value()
        x = self._widen(x, array_module(ref))
        reduce, shape = self._layout(x)
        xp = array_module(x)
        ctx = self._sync_context()
        batch = bool(training) and self._trainable
        n = 0.0
        if batch:
            mean, var, n = self._batch_stats(x, reduce, ctx)
            if mean is None:  # no examples (anywhere): nothing to normalize or learn
                return self._narrow(x), ("empty", x.shape)
            self._update_moving(mean, var)
        else:
            mean, var = ref, self.moving_variance.raw_value()
        inv = (1.0 / xp.sqrt(var.astype(x.dtype) + x.dtype.type(self.epsilon))).reshape(shape)
        xhat = (x - mean.astype(x.dtype).reshape(shape)) * inv
        y = xhat
        if self.gamma is not None:
            y = y * self.gamma.raw_value().reshape(shape)
        if self.beta is not None:
            y = y + self.beta.raw_value().reshape(shape)
        return self._narrow(y), (xhat, inv, reduce, shape, batch, n, ctx)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        xp = array_module(self.moving_mean.raw_value())
        dy = self._widen(dy, xp)
        if isinstance(cache[0], str):  # "empty"
            # no examples on this replica (or, synchronized, on any: then no replica reduces)
            check_shape(f"BatchNormalization layer {self.name!r}", cache[1], dy.shape)
            grads = [xp.zeros(v.shape, dy.dtype) for v in self.trainable_weights]
            return self._narrow(dy), grads
        xhat, inv, reduce, shape, batch, n, ctx = cache
        check_shape(f"BatchNormalization layer {self.name!r}", xhat.shape, dy.shape)
        grads = self._affine_grads(dy, xhat, reduce, (-1,))
        gamma = self.gamma.raw_value().reshape(shape) if self.gamma is not None else 1.0
        if not batch:
            return self._narrow(dy * gamma * inv), grads
        sum_dy = dy.sum(axis=reduce)
        sum_dy_xhat = (dy * xhat).sum(axis=reduce)
        if ctx is not None:
            both = xp.concatenate([sum_dy, sum_dy_xhat]).astype(np.float64)
            total = ctx.all_reduce("sum", both)
            c = sum_dy.shape[0]
            sum_dy, sum_dy_xhat = total[:c].astype(dy.dtype), total[c:].astype(dy.dtype)
        scale = dy.dtype.type(1.0 / n)
        mean_dy = (sum_dy * scale).reshape(shape)
        mean_dy_xhat = (sum_dy_xhat * scale).reshape(shape)
        dx = gamma * inv * (dy - mean_dy - xhat * mean_dy_xhat)
        return self._narrow(dx), grads

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            momentum=self.momentum,
            moving_mean_initializer=initializers_mod.serialize(self.moving_mean_initializer),
            moving_variance_initializer=initializers_mod.serialize(
                self.moving_variance_initializer
            ),
            synchronized=self.synchronized,
        )
        return config


class LayerNormalization(_Normalization):
    """Normalizes each example over its feature axes (``keras.layers.LayerNormalization``).

    ``axis`` (default ``-1``, or a list) names the axes normalized together;
    ``gamma`` and ``beta`` have their shape. No batch statistics: nothing to
    synchronize between replicas.
    """

    def __init__(
        self,
        axis: Any = -1,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        beta_initializer: initializers_mod.InitializerLike = "zeros",
        gamma_initializer: initializers_mod.InitializerLike = "ones",
        beta_regularizer: regularizers_mod.RegularizerLike = None,
        gamma_regularizer: regularizers_mod.RegularizerLike = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(axis, epsilon, center, scale, beta_initializer, gamma_initializer,
                         beta_regularizer, gamma_regularizer, **kwargs)  # fmt: skip

    def build(self, input_shape: tuple) -> None:
        axes = self._feature_axes(input_shape)
        self._make_affine(tuple(int(input_shape[a]) for a in axes))
        self.built = True

    def _layout(self, x: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        axes = _resolve(self._axes, x.ndim, f"LayerNormalization {self.name!r}")
        others = tuple(i for i in range(x.ndim) if i not in axes)
        shape = tuple(x.shape[i] if i in axes else 1 for i in range(x.ndim))
        return axes, others, shape

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        self._require_built()
        weights = [w for w in (self.gamma, self.beta) if w is not None]
        x = self._widen(x, array_module(weights[0].raw_value()) if weights else None)
        axes, others, shape = self._layout(x)
        xp = array_module(x)
        mean = xp.mean(x, axis=axes, keepdims=True)
        var = xp.var(x, axis=axes, keepdims=True)
        inv = 1.0 / xp.sqrt(var + x.dtype.type(self.epsilon))
        xhat = (x - mean) * inv
        y = xhat
        if self.gamma is not None:
            y = y * self.gamma.raw_value().reshape(shape)
        if self.beta is not None:
            y = y + self.beta.raw_value().reshape(shape)
        return self._narrow(y), (xhat, inv, axes, others, shape)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        xhat, inv, axes, others, shape = cache
        dy = self._widen(dy, array_module(xhat))
        check_shape(f"LayerNormalization layer {self.name!r}", xhat.shape, dy.shape)
        param_shape = tuple(xhat.shape[a] for a in axes)
        grads = self._affine_grads(dy, xhat, others, param_shape)
        g = dy * self.gamma.raw_value().reshape(shape) if self.gamma is not None else dy
        xp = array_module(g)
        mean_g = xp.mean(g, axis=axes, keepdims=True)
        mean_gx = xp.mean(g * xhat, axis=axes, keepdims=True)
        return self._narrow(inv * (g - mean_g - xhat * mean_gx)), grads
