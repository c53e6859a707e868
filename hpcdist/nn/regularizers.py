"""Weight regularizers with Keras's names and formulas: ``l1``, ``l2``, ``l1_l2``.

A regularizer maps a weight ``w`` to a penalty added to the loss, and (as
hpcdist has no automatic differentiation) gives its gradient:

* ``L1(l1=0.01)``: ``l1 * sum(|w|)``, gradient ``l1 * sign(w)`` (0 at 0, as TF);
* ``L2(l2=0.01)``: ``l2 * sum(w**2)``, gradient ``2 * l2 * w``;
* ``L1L2(l1=0.0, l2=0.0)``: the sum of both (``l1_l2()`` defaults to 0.01 each).

Layers take them as ``kernel_regularizer=`` / ``bias_regularizer=`` (or
``add_weight(..., regularizer=...)``); ``layer.losses`` / ``model.losses``
hold the current penalties. ``fit`` and ``evaluate`` add them to the loss, as
Keras; under a strategy each replica adds ``penalty / num_replicas_in_sync``
(:func:`hpcdist.nn.scale_regularization_loss`), so the summed gradients are
those of one process. :func:`hpcdist.nn.value_and_grad` adds them the same way.

Example:
    >>> import numpy as np
    >>> reg = get("l2")
    >>> float(reg(np.array([1.0, -2.0])))  # 0.01 * (1 + 4)
    0.05
    >>> reg.gradient(np.array([1.0, -2.0]))
    array([ 0.02, -0.04])
    >>> float(l1_l2(l1=0.1, l2=0.0)(np.array([1.0, -2.0])))
    0.30000000000000004
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from hpcdist.arrays import array_module, asarray

__all__ = ["L1", "L1L2", "L2", "Regularizer", "get", "l1", "l1_l2", "l2", "serialize"]


def _factor(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"regularization factor {name} must be a number, got {value!r}") from None
    if not (v >= 0 and np.isfinite(v)):
        raise ValueError(
            f"regularization factor {name} must be a finite number >= 0, got {value!r}"
        )
    return v


class Regularizer:
    """Base class: ``reg(w)`` is the penalty (a 0-d array), ``reg.gradient(w)`` its gradient.

    Subclasses define both. Custom regularizers need ``gradient`` too (there is
    no automatic differentiation).

    Example: ``class Half(Regularizer): __call__ = lambda s, w: 0.5 * (w**2).sum();
    gradient = lambda s, w: w``.
    """

    def __call__(self, x: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(x)")

    def gradient(self, x: Any) -> Any:
        """The gradient of the penalty with respect to ``x`` (same shape and dtype)."""
        raise NotImplementedError(f"{type(self).__name__} must define gradient(x)")

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments."""
        return {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Regularizer:
        """A regularizer made from :meth:`get_config`'s dict."""
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class L1L2(Regularizer):
    """``l1 * sum(|x|) + l2 * sum(x**2)`` (``keras.regularizers.L1L2``)."""

    def __init__(self, l1: float = 0.0, l2: float = 0.0) -> None:
        self.l1 = _factor("l1", l1)
        self.l2 = _factor("l2", l2)

    def __call__(self, x: Any) -> Any:
        x = asarray(x)
        xp = array_module(x)
        total = xp.zeros((), dtype=x.dtype)
        if self.l1:
            total = total + x.dtype.type(self.l1) * xp.sum(xp.abs(x))
        if self.l2:
            total = total + x.dtype.type(self.l2) * xp.sum(x * x)
        return total

    def gradient(self, x: Any) -> Any:
        x = asarray(x)
        xp = array_module(x)
        g = xp.zeros_like(x)
        if self.l1:
            g = g + x.dtype.type(self.l1) * xp.sign(x)
        if self.l2:
            g = g + x.dtype.type(2.0 * self.l2) * x
        return g

    def get_config(self) -> dict[str, Any]:
        return {"l1": self.l1, "l2": self.l2}


class L1(L1L2):
    """``l1 * sum(|x|)`` (``keras.regularizers.L1``; default ``l1=0.01``).

    Example: ``Dense(8, kernel_regularizer=L1(1e-4))``.
    """

    def __init__(self, l1: float = 0.01) -> None:
        super().__init__(l1=l1, l2=0.0)

    def get_config(self) -> dict[str, Any]:
        return {"l1": self.l1}


class L2(L1L2):
    """``l2 * sum(x**2)`` (``keras.regularizers.L2``; default ``l2=0.01``).

    Example: ``Dense(8, kernel_regularizer=L2(1e-4))``.
    """

    def __init__(self, l2: float = 0.01) -> None:
        super().__init__(l1=0.0, l2=l2)

    def get_config(self) -> dict[str, Any]:
        return {"l2": self.l2}


def l1(l1: float = 0.01) -> L1:
    """``L1(l1)``. Example: ``kernel_regularizer=l1(0.001)``."""
    return L1(l1)


def l2(l2: float = 0.01) -> L2:
    """``L2(l2)``. Example: ``kernel_regularizer=l2(0.001)``."""
    return L2(l2)


def l1_l2(l1: float = 0.01, l2: float = 0.01) -> L1L2:
    """``L1L2(l1, l2)`` with Keras's defaults of 0.01 each. Example: ``l1_l2(1e-5, 1e-4)``."""
    return L1L2(l1=l1, l2=l2)


_CLASSES: dict[str, type[Regularizer]] = {"L1": L1, "L2": L2, "L1L2": L1L2}
_BY_NAME = {"l1": L1, "l2": L2, "l1_l2": lambda: l1_l2(), "l1l2": lambda: l1_l2()}


#: What a layer's ``*_regularizer`` argument takes (see :func:`get`).
RegularizerLike: TypeAlias = str | dict[str, Any] | Regularizer | None


def get(identifier: RegularizerLike) -> Regularizer | None:
    """A regularizer from ``None``, a name (``"l1"``, ``"l2"``, ``"l1_l2"``), a config dict or
    a :class:`Regularizer` (returned as it is).

    Example: ``get("l2").l2 == 0.01``; ``get({"class_name": "L1", "config": {"l1": 0.1}})``.
    """
    if identifier is None or isinstance(identifier, Regularizer):
        return identifier
    if isinstance(identifier, str):
        make = _BY_NAME.get(identifier.strip().lower())
        if make is None:
            raise ValueError(
                f"unknown regularizer {identifier!r}; expected one of "
                f"{', '.join(sorted(_BY_NAME))}, a config dict or a Regularizer"
            )
        return make()
    if isinstance(identifier, dict):
        cls = _CLASSES.get(str(identifier.get("class_name")))
        if cls is None:
            raise ValueError(
                f"regularizer config {identifier!r} has no known 'class_name'; expected one of "
                f"{', '.join(sorted(_CLASSES))}"
            )
        return cls.from_config(dict(identifier.get("config") or {}))
    raise TypeError(
        f"cannot interpret {identifier!r} as a regularizer; pass 'l1', 'l2', 'l1_l2', a config "
        "dict or an hpcdist.nn.regularizers.Regularizer (with __call__ and gradient)"
    )


def serialize(regularizer: Regularizer | None) -> dict[str, Any] | None:
    """``{"class_name", "config"}`` of a regularizer (``None`` stays ``None``).

    Example: ``get(serialize(L2(0.1))).l2 == 0.1``.
    """
    if regularizer is None:
        return None
    return {"class_name": type(regularizer).__name__, "config": regularizer.get_config()}
