"""``Traced``: an array that carries its gradient with respect to one leaf array.

There is no general autodiff in hpcdist. Losses need only one: the gradient
of a scalar loss with respect to the model's predictions. ``Traced.leaf(y_pred)``
marks the predictions; the losses of :mod:`hpcdist.nn.losses` return
``Traced`` values, and linear combinations of them (``+``, ``-``, ``*`` and
``/`` by constants, ``sum``, ``mean``) stay ``Traced``. A scalar's ``.grad``
is ``dL/dy_pred``, exact, in the dtype and shape of the leaf. Anything
nonlinear (``t * t``, ``np.exp(t)``, ``t ** 2``) raises ``TypeError``.

Internally each ``Traced`` holds a vector-Jacobian product: a function that
maps a cotangent of its value to a cotangent of the leaf.

Example:
    >>> import numpy as np
    >>> t = Traced.leaf(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> loss = (2.0 * t - 1.0).mean()
    >>> float(loss)
    4.0
    >>> loss.grad
    array([[0.5, 0.5],
           [0.5, 0.5]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray, is_cupy

_HOW = (
    "Only hpcdist.nn losses and linear combinations of them (+ and - of traced values, * and / "
    "by constants or arrays, sum, mean) are differentiable; use .value for the plain array."
)

_VJP = Callable[[Any], Any]


class _Leaf:
    """The identity of one leaf: its shape, dtype and array module."""

    __slots__ = ("shape", "dtype", "xp")

    def __init__(self, shape: tuple[int, ...], dtype: Any, xp: Any) -> None:
        self.shape = shape
        self.dtype = dtype
        self.xp = xp


def unbroadcast(ct: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``ct`` down to ``shape`` (the reverse of NumPy broadcasting).

    Example: ``unbroadcast(np.ones((3, 2)), (2,))`` is ``array([3., 3.])``.
    """
    if tuple(ct.shape) == tuple(shape):
        return ct
    xp = array_module(ct)
    extra = ct.ndim - len(shape)
    if extra > 0:
        ct = xp.sum(ct, axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and ct.shape[i] != 1)
    if axes:
        ct = xp.sum(ct, axis=axes, keepdims=True)
    return ct


def _broadcast(ct: Any, shape: tuple[int, ...]) -> Any:
    if tuple(ct.shape) == tuple(shape):
        return ct
    return array_module(ct).broadcast_to(ct, shape)


class Traced(np.lib.mixins.NDArrayOperatorsMixin):
    """An array value plus the map from its cotangent to the cotangent of one leaf.

    Make one with :meth:`leaf`; losses and linear operations make the others.

    Example: ``loss = hd.nn.losses.MeanSquaredError()(y, Traced.leaf(y_pred)); loss.grad``.
    """

    __array_priority__ = 1000  # CuPy defers its binary operators to ours
    __slots__ = ("_value", "_vjp", "_leaf", "_grad")

    def __init__(self, value: Any, vjp: _VJP, leaf: _Leaf) -> None:
        self._value = value
        self._vjp = vjp
        self._leaf = leaf
        self._grad = None

    @classmethod
    def leaf(cls, value: Any) -> Traced:
        """Mark ``value`` (NumPy or CuPy array) as the array gradients are taken against.

        Example: ``t = Traced.leaf(y_pred)``; ``t.value is y_pred``.
        """
        if isinstance(value, Traced):
            raise TypeError("Traced.leaf needs a plain array, got a Traced; pass its .value")
        value = asarray(value)
        return cls(
            value, lambda ct: ct, _Leaf(tuple(value.shape), value.dtype, array_module(value))
        )

    # -- plain attributes ---------------------------------------------------------------------
    @property
    def value(self) -> Any:
        """The plain array (NumPy or CuPy)."""
        return self._value

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value."""
        return tuple(self._value.shape)

    @property
    def ndim(self) -> int:
        """The rank of the value."""
        return int(self._value.ndim)

    @property
    def dtype(self) -> Any:
        """The dtype of the value."""
        return self._value.dtype

    @property
    def size(self) -> int:
        """The number of elements of the value."""
        return int(self._value.size)

    @property
    def grad(self) -> Any:
        """``d value / d leaf``: an array of the leaf's shape and dtype (scalars only).

        Example: ``Traced.leaf(np.ones(3)).sum().grad`` is ``array([1., 1., 1.])``.
        """
        if self.size != 1:
            raise TypeError(
                f".grad needs a scalar Traced, this one has shape {self.shape}; reduce it "
                "first, e.g. with .sum(), .mean(), a Loss with reduction SUM or "
                "SUM_OVER_BATCH_SIZE, or hpcdist.nn.compute_average_loss"
            )
        if self._grad is None:
            leaf = self._leaf
            xp = leaf.xp
            g = _broadcast(asarray(self._vjp(xp.ones(self.shape, dtype=self.dtype))), leaf.shape)
            writable = is_cupy(g) or g.flags.writeable
            if g.dtype != leaf.dtype or not writable or not g.flags.c_contiguous:
                g = xp.array(g, dtype=leaf.dtype, order="C", copy=True)
            self._grad = g
        return self._grad

    def __float__(self) -> float:
        if self.size != 1:
            raise TypeError(f"only a Traced of one element converts to float, shape {self.shape}")
        x = self._value
        return float((x.get() if is_cupy(x) else x).reshape(()))

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d Traced")
        return self.shape[0]

    __hash__ = object.__hash__

    # `t += x` rebinds `t` to `t + x` (a new Traced): never written in place.
    def __iadd__(self, other: Any) -> Any:
        return NotImplemented

    __isub__ = __imul__ = __itruediv__ = __iadd__

    def __repr__(self) -> str:
        return f"Traced(shape={self.shape}, dtype={self.dtype}, value={self._value!r})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(
            "a Traced cannot be converted to a plain array implicitly (its gradient would be "
            "lost); use .value for the plain array. " + _HOW
        )

    def __getitem__(self, item: Any) -> Any:
        raise TypeError(f"indexing a Traced is not differentiable here. {_HOW}")

    def __iter__(self) -> Any:
        raise TypeError(f"iterating over a Traced is not differentiable here. {_HOW}")

    # -- linear operations --------------------------------------------------------------------
    def _derive(self, value: Any, vjp: _VJP) -> Traced:
        return Traced(asarray(value), vjp, self._leaf)

    def _scaled(self, factor: Any, divide: bool) -> Traced:
        c = _constant(self._leaf.xp, factor)
        value = self._value / c if divide else self._value * c
        shape = self.shape

        def vjp(ct: Any) -> Any:
            return self._vjp(unbroadcast(ct / c if divide else ct * c, shape))

        return self._derive(value, vjp)

    def _plus(self, other: Any, sign: float, self_sign: float = 1.0) -> Traced:
        """``self_sign * self + sign * other``."""
        shape = self.shape
        if isinstance(other, Traced):
            if other._leaf is not self._leaf:
                raise TypeError(
                    "cannot combine Traced values of different leaves: a loss is "
                    "differentiated with respect to one array (the predictions). " + _HOW
                )
            value = self_sign * self._value + sign * other._value
            oshape = other.shape

            def vjp(ct: Any) -> Any:
                return self._vjp(unbroadcast(self_sign * ct, shape)) + other._vjp(
                    unbroadcast(sign * ct, oshape)
                )

            return self._derive(value, vjp)
        c = _constant(self._leaf.xp, other)
        value = self_sign * self._value + sign * c
        if self_sign == 1.0:
            return self._derive(value, lambda ct: self._vjp(unbroadcast(ct, shape)))
        return self._derive(value, lambda ct: self._vjp(unbroadcast(-ct, shape)))

    def sum(self, axis: Any = None, keepdims: bool = False, **kwargs: Any) -> Traced:
        """The sum over ``axis`` (all axes by default), still traced.

        Example: ``Traced.leaf(np.ones((2, 3))).sum(axis=1).value`` is ``array([3., 3.])``.
        """
        _no_extra("sum", kwargs)
        return self._reduce(axis, keepdims, mean=False)

    def mean(self, axis: Any = None, keepdims: bool = False, **kwargs: Any) -> Traced:
        """The mean over ``axis`` (all axes by default), still traced.

        Example: ``Traced.leaf(np.arange(4.0)).mean().value`` is ``array(1.5)``.
        """
        _no_extra("mean", kwargs)
        return self._reduce(axis, keepdims, mean=True)

    def _reduce(self, axis: Any, keepdims: bool, mean: bool) -> Traced:
        shape = self.shape
        ndim = len(shape)
        if axis is None:
            axes = tuple(range(ndim))
        else:
            raw = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
            if any(not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim for a in raw):
                raise ValueError(f"axis {axis} is out of range for a Traced of shape {shape}")
            axes = tuple(sorted({int(a) % ndim for a in raw}))
        xp = self._leaf.xp
        value = xp.sum(self._value, axis=axes, keepdims=keepdims)
        count = 1
        for a in axes:
            count *= shape[a]
        if mean:
            value = value / count if count else xp.full_like(value, xp.nan)
        kept = tuple(1 if i in axes else n for i, n in enumerate(shape))

        def vjp(ct: Any) -> Any:
            ct = xp.reshape(ct, kept)
            if mean and count:
                ct = ct / count
            return self._vjp(xp.broadcast_to(ct, shape))

        return self._derive(value, vjp)

    # -- NumPy protocols ----------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = getattr(ufunc, "__name__", str(ufunc))
        if method != "__call__" or kwargs:
            raise TypeError(f"np.{name}.{method} with {sorted(kwargs)} on a Traced: {_HOW}")
        traced = [isinstance(x, Traced) for x in inputs]
        if name in ("negative", "positive") and len(inputs) == 1:
            return self if name == "positive" else self._scaled(-1.0, divide=False)
        if name in ("add", "subtract") and len(inputs) == 2:
            a, b = inputs
            sign = 1.0 if name == "add" else -1.0
            if traced[0]:
                return a._plus(b, sign)
            return b._plus(a, 1.0, self_sign=sign)
        if name == "multiply" and len(inputs) == 2 and sum(traced) == 1:
            a, b = inputs
            return a._scaled(b, False) if traced[0] else b._scaled(a, False)
        if name in ("divide", "true_divide") and len(inputs) == 2 and traced == [True, False]:
            return inputs[0]._scaled(inputs[1], True)
        what = {
            "multiply": "a product of two Traced values is not linear",
            "divide": "dividing by a Traced value is not linear",
        }.get(name, f"np.{name} is not supported on a Traced")
        raise TypeError(f"{what}. {_HOW}")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in ("sum", "mean") and args and isinstance(args[0], Traced):
            kw = dict(kwargs)
            if len(args) > 1:
                kw["axis"] = args[1]
            if len(args) > 2:
                raise TypeError(f"np.{name} on a Traced accepts only axis and keepdims")
            return getattr(args[0], name)(**kw)
        if name in ("shape", "ndim", "size") and len(args) == 1 and not kwargs:
            return getattr(args[0], name)
        raise TypeError(f"np.{name} is not supported on a Traced. {_HOW}")


def _constant(xp: Any, c: Any) -> Any:
    """Python numbers stay as they are (weak dtypes: no float32 -> float64 promotion)."""
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return c
    if isinstance(c, Traced):
        raise TypeError(_HOW)
    return xp.asarray(c)


def _no_extra(name: str, kwargs: dict[str, Any]) -> None:
    extra = {k: v for k, v in kwargs.items() if not (k in ("dtype", "out") and v is None)}
    if extra:
        raise TypeError(
            f"Traced.{name} accepts only axis and keepdims, got {sorted(extra)}. {_HOW}"
        )


def from_last_axis(t: Any, value: Any, jac: Any) -> Any:
    """A ``Traced`` (or plain ``value``) for a function of ``t`` reduced over its last axis.

    ``value[...]`` depends only on ``t[..., :]``, with ``d value[i] / d t[i, j] = jac[i, j]``
    (``jac`` has the shape of ``t``). A plain ``t`` gives the plain ``value``.

    Example: ``from_last_axis(t, (t.value ** 2).sum(-1), 2 * t.value)`` for ``sum(t**2, -1)``.
    """
    if not isinstance(t, Traced):
        return value

    def vjp(ct: Any) -> Any:
        xp = array_module(jac)
        return t._vjp(xp.expand_dims(ct, -1) * jac)

    return t._derive(value, vjp)
