"""Weight initializers with Keras's names and formulas; each returns a NumPy array.

``init(shape, dtype=None)`` draws an array (``dtype`` defaults to
:func:`hpcdist.nn.backend.floatx`). A ``seed`` makes an initializer
reproducible: two initializers made with the same seed draw the same sequence
of arrays (successive calls of one initializer differ, as in Keras 2.11+).
Without a seed the draws come from NumPy's global generator, so
``np.random.seed`` makes a program reproducible. Under a strategy the initial
values are broadcast from worker 0, so workers agree either way.

The lower-case names (``glorot_uniform``, ...) are aliases of the classes,
as in Keras; :func:`get` turns a name into an instance.

Example:
    >>> w = GlorotUniform(seed=0)((4, 2))
    >>> w.shape, w.dtype.name, bool(abs(w).max() <= (6 / (4 + 2)) ** 0.5)
    ((4, 2), 'float32', True)
    >>> get("zeros")((2,), "float64")
    array([0., 0.])
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.nn import backend

# Standard deviation of a standard normal truncated to [-2, 2]: dividing by it makes the
# truncated samples have the requested standard deviation.
_TRUNCATED_STD = 0.87962566103423978


def _dtype(dtype: DTypeLike | None) -> np.dtype:
    return np.dtype(backend.floatx() if dtype is None else dtype)


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"shape is {shape!r}; expected a tuple of ints such as (784, 128)"
        ) from None


def compute_fans(shape: tuple[int, ...]) -> tuple[float, float]:
    """``(fan_in, fan_out)`` of a weight shape, as Keras computes them.

    A kernel ``(in, out)`` gives ``(in, out)``; a convolution kernel
    ``(*receptive_field, in, out)`` multiplies both by the receptive field size.

    Example: ``compute_fans((3, 3, 16, 32)) == (144.0, 288.0)``.
    """
    shape = _shape(shape)
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    receptive = math.prod(shape[:-2])
    return float(shape[-2] * receptive), float(shape[-1] * receptive)


class Initializer:
    """Base class: ``init(shape, dtype=None) -> np.ndarray``.

    Example: subclass and define ``__call__(self, shape, dtype=None)``.
    """

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(shape, dtype)")

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (``type(init)(**init.get_config())`` is an equal one)."""
        return {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Initializer:
        """An initializer made from :meth:`get_config`'s dict."""
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class Zeros(Initializer):
    """All zeros.

    Example: ``Zeros()((2, 3))``.
    """

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        return np.zeros(_shape(shape), dtype=_dtype(dtype))


class Ones(Initializer):
    """All ones.

    Example: ``Ones()((3,))``.
    """

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        return np.ones(_shape(shape), dtype=_dtype(dtype))


class Constant(Initializer):
    """Every element equal to ``value``.

    Example: ``Constant(0.1)((3,))``.
    """

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        return np.full(_shape(shape), self.value, dtype=_dtype(dtype))

    def get_config(self) -> dict[str, Any]:
        return {"value": self.value}


class _Random(Initializer):
    """A random initializer: its own generator when seeded, NumPy's global one otherwise."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._rng = None if seed is None else np.random.default_rng(seed)

    def _normal(self, shape: tuple[int, ...]) -> np.ndarray:
        if self._rng is None:
            return np.asarray(np.random.standard_normal(shape), dtype=np.float64)
        return self._rng.standard_normal(shape)

    def _uniform(self, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
        if self._rng is None:
            return np.asarray(np.random.uniform(low, high, shape), dtype=np.float64)
        return self._rng.uniform(low, high, shape)

    def _truncated(self, shape: tuple[int, ...]) -> np.ndarray:
        """Standard normal samples redrawn until all lie in [-2, 2]."""
        out = self._normal(shape)
        bad = np.abs(out) > 2
        while bad.any():
            out[bad] = self._normal((int(bad.sum()),))
            bad = np.abs(out) > 2
        return out

    def get_config(self) -> dict[str, Any]:
        return {"seed": self.seed}


class RandomNormal(_Random):
    """Normal samples with ``mean`` and ``stddev``.

    Example: ``RandomNormal(stddev=0.01, seed=1)((3, 3))``.
    """

    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = None) -> None:
        super().__init__(seed)
        self.mean, self.stddev = mean, stddev

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        x = self._normal(_shape(shape)) * self.stddev + self.mean
        return x.astype(_dtype(dtype))

    def get_config(self) -> dict[str, Any]:
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


class RandomUniform(_Random):
    """Uniform samples in ``[minval, maxval)``.

    Example: ``RandomUniform(-1.0, 1.0, seed=1)((3,))``.
    """

    def __init__(
        self, minval: float = -0.05, maxval: float = 0.05, seed: int | None = None
    ) -> None:
        super().__init__(seed)
        self.minval, self.maxval = minval, maxval

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        return self._uniform(_shape(shape), self.minval, self.maxval).astype(_dtype(dtype))

    def get_config(self) -> dict[str, Any]:
        return {"minval": self.minval, "maxval": self.maxval, "seed": self.seed}


class TruncatedNormal(_Random):
    """Normal samples with ``mean`` and ``stddev``, redrawn when beyond two ``stddev``.

    Example: ``TruncatedNormal(stddev=0.02, seed=1)((3, 3))``.
    """

    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = None) -> None:
        super().__init__(seed)
        self.mean, self.stddev = mean, stddev

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        x = self._truncated(_shape(shape)) * self.stddev + self.mean
        return x.astype(_dtype(dtype))

    def get_config(self) -> dict[str, Any]:
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


class VarianceScaling(_Random):
    """Samples with variance ``scale / n``, ``n`` the fan in, fan out or their mean (``mode``).

    ``distribution``: ``"truncated_normal"`` (standard deviation
    ``sqrt(scale / n)`` after truncation at two standard deviations),
    ``"untruncated_normal"`` (or ``"normal"``), or ``"uniform"`` (in
    ``[-limit, limit]``, ``limit = sqrt(3 * scale / n)``).

    Example: ``VarianceScaling(2.0, "fan_in", "truncated_normal")`` is ``HeNormal()``.
    """

    _MODES = ("fan_in", "fan_out", "fan_avg")
    _DISTRIBUTIONS = ("truncated_normal", "untruncated_normal", "normal", "uniform")

    def __init__(
        self,
        scale: float = 1.0,
        mode: str = "fan_in",
        distribution: str = "truncated_normal",
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        if not scale > 0:
            raise ValueError(f"scale is {scale!r}; expected a positive number")
        if mode not in self._MODES:
            raise ValueError(f"mode is {mode!r}; expected one of {', '.join(self._MODES)}")
        if distribution not in self._DISTRIBUTIONS:
            raise ValueError(
                f"distribution is {distribution!r}; expected one of "
                f"{', '.join(self._DISTRIBUTIONS)}"
            )
        self.scale, self.mode, self.distribution = float(scale), mode, distribution

    def __call__(self, shape: Any, dtype: DTypeLike | None = None) -> np.ndarray:
        shape = _shape(shape)
        fan_in, fan_out = compute_fans(shape)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        variance = self.scale / max(1.0, n)
        if self.distribution == "uniform":
            limit = math.sqrt(3.0 * variance)
            x = self._uniform(shape, -limit, limit)
        elif self.distribution == "truncated_normal":
            x = self._truncated(shape) * (math.sqrt(variance) / _TRUNCATED_STD)
        else:
            x = self._normal(shape) * math.sqrt(variance)
        return x.astype(_dtype(dtype))

    def get_config(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "mode": self.mode,
            "distribution": self.distribution,
            "seed": self.seed,
        }


class _Preset(VarianceScaling):
    """A :class:`VarianceScaling` with fixed arguments (only ``seed`` is configurable)."""

    _ARGS: tuple[float, str, str] = (1.0, "fan_in", "truncated_normal")

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(*self._ARGS, seed=seed)

    def get_config(self) -> dict[str, Any]:
        return {"seed": self.seed}


class GlorotUniform(_Preset):
    """Uniform in ``[-limit, limit]``, ``limit = sqrt(6 / (fan_in + fan_out))`` (Xavier).

    Example: ``Dense(3, kernel_initializer=GlorotUniform(seed=0))``.
    """

    _ARGS = (1.0, "fan_avg", "uniform")


class GlorotNormal(_Preset):
    """Truncated normal with ``stddev = sqrt(2 / (fan_in + fan_out))``.

    Example: ``GlorotNormal(seed=0)((4, 4))``.
    """

    _ARGS = (1.0, "fan_avg", "truncated_normal")


class HeNormal(_Preset):
    """Truncated normal with ``stddev = sqrt(2 / fan_in)`` (for ReLU layers)."""

    _ARGS = (2.0, "fan_in", "truncated_normal")


class HeUniform(_Preset):
    """Uniform in ``[-limit, limit]``, ``limit = sqrt(6 / fan_in)``.

    Example: ``HeUniform(seed=0)((4, 4))``.
    """

    _ARGS = (2.0, "fan_in", "uniform")


class LecunNormal(_Preset):
    """Truncated normal with ``stddev = sqrt(1 / fan_in)`` (for SELU layers)."""

    _ARGS = (1.0, "fan_in", "truncated_normal")


class LecunUniform(_Preset):
    """Uniform in ``[-limit, limit]``, ``limit = sqrt(3 / fan_in)``.

    Example: ``LecunUniform(seed=0)((4, 4))``.
    """

    _ARGS = (1.0, "fan_in", "uniform")


# Keras's lower-case aliases of the classes.
#: Keras's lower-case name of :class:`Zeros`.
zeros = Zeros
#: Keras's lower-case name of :class:`Ones`.
ones = Ones
#: Keras's lower-case name of :class:`Constant`.
constant = Constant
#: Keras's lower-case name of :class:`RandomNormal`.
random_normal = RandomNormal
#: Keras's lower-case name of :class:`RandomUniform`.
random_uniform = RandomUniform
#: Keras's lower-case name of :class:`TruncatedNormal`.
truncated_normal = TruncatedNormal
#: Keras's lower-case name of :class:`VarianceScaling`.
variance_scaling = VarianceScaling
#: Keras's lower-case name of :class:`GlorotUniform`.
glorot_uniform = GlorotUniform
#: Keras's lower-case name of :class:`GlorotNormal`.
glorot_normal = GlorotNormal
#: Keras's lower-case name of :class:`HeNormal`.
he_normal = HeNormal
#: Keras's lower-case name of :class:`HeUniform`.
he_uniform = HeUniform
#: Keras's lower-case name of :class:`LecunNormal`.
lecun_normal = LecunNormal
#: Keras's lower-case name of :class:`LecunUniform`.
lecun_uniform = LecunUniform

_CLASSES: dict[str, type[Initializer]] = {
    cls.__name__: cls
    for cls in (
        Zeros, Ones, Constant, RandomNormal, RandomUniform, TruncatedNormal, VarianceScaling,
        GlorotUniform, GlorotNormal, HeNormal, HeUniform, LecunNormal, LecunUniform,
    )
}  # fmt: skip
_BY_NAME: dict[str, type[Initializer]] = {
    re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(): cls for name, cls in _CLASSES.items()
}
_BY_NAME["uniform"] = RandomUniform  # Keras's short names (Embedding's default)
_BY_NAME["normal"] = RandomNormal


#: What a layer's ``*_initializer`` argument takes (see :func:`get`).
InitializerLike: TypeAlias = (
    str | dict[str, Any] | Initializer | type[Initializer] | Callable[..., Any] | None
)


def get(identifier: InitializerLike) -> Initializer | Callable[..., Any] | None:
    """An initializer for a name, a config dict, a class, an instance or a callable.

    ``None`` gives ``None``. Names are the snake-case or class names
    (``"he_normal"``, ``"HeNormal"``).

    Example: ``get("glorot_uniform")((3, 2))``; ``get({"class_name": "Constant",
    "config": {"value": 2.0}})``.
    """
    if identifier is None:
        return None
    if isinstance(identifier, str):
        key = identifier.strip()
        cls = _CLASSES.get(key) or _BY_NAME.get(key.lower())
        if cls is None:
            raise ValueError(
                f"unknown initializer {identifier!r}; expected one of "
                f"{', '.join(sorted(_BY_NAME))}, or an Initializer"
            )
        return cls()
    if isinstance(identifier, dict):
        name = identifier.get("class_name")
        if name not in _CLASSES:
            raise ValueError(
                f"initializer config {identifier!r} has no known 'class_name'; expected one of "
                f"{', '.join(sorted(_CLASSES))}"
            )
        return _CLASSES[name].from_config(dict(identifier.get("config") or {}))
    if isinstance(identifier, type) and issubclass(identifier, Initializer):
        return identifier()
    if callable(identifier):
        return identifier
    raise TypeError(
        f"initializer is {identifier!r}; expected a name such as 'glorot_uniform', a config "
        "dict, an Initializer or a callable init(shape, dtype) -> array"
    )


def serialize(initializer: Any) -> Any:
    """``{"class_name", "config"}`` of an :class:`Initializer` (other callables as they are).

    Example: ``get(serialize(HeNormal(seed=3)))`` is an equal ``HeNormal``.
    """
    if isinstance(initializer, Initializer):
        return {"class_name": type(initializer).__name__, "config": initializer.get_config()}
    return initializer
