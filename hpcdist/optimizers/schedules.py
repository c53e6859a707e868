"""Learning-rate schedules (``keras.optimizers.schedules``): ``schedule(step) -> float``.

An optimizer given a schedule calls it with its ``iterations`` before the
step's increment (0 on the first step), as Keras does. Steps may be ints,
floats, 0-d arrays or variables.

Example:
    >>> s = ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    >>> s(0), s(10), round(s(5), 6)
    (0.1, 0.05, 0.070711)
    >>> PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])(15)
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Constant",
    "CosineDecay",
    "ExponentialDecay",
    "LearningRateSchedule",
    "LinearWarmup",
    "PiecewiseConstantDecay",
    "deserialize",
    "serialize",
]


def _step(step: Any) -> float:
    try:
        return float(step)
    except (TypeError, ValueError):
        raise TypeError(
            f"a schedule's step must be a number (or a 0-d array or variable), got {step!r}"
        ) from None


def _number(
    name: str, value: Any, *, positive: bool = False, minimum: float | None = None
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "__float__")
    ):
        raise TypeError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if positive and not v > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if minimum is not None and not v >= minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return v


class LearningRateSchedule:
    """Base class: subclasses implement ``__call__(step) -> float`` and ``get_config``.

    Example: ``class Halve(LearningRateSchedule): __call__ = lambda self, step: 0.1 / 2**step``.
    """

    def __call__(self, step: Any) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(step)")

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (JSON-compatible)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_config()")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LearningRateSchedule:
        """A schedule from :meth:`get_config`'s output.

        Example: ``ExponentialDecay.from_config(s.get_config())``.
        """
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class Constant(LearningRateSchedule):
    """The same learning rate at every step.

    Example: ``Constant(0.01)(1000) == 0.01``.
    """

    def __init__(self, learning_rate: float) -> None:
        self.learning_rate = _number("learning_rate", learning_rate, minimum=0.0)

    def __call__(self, step: Any) -> float:
        _step(step)
        return self.learning_rate

    def get_config(self) -> dict[str, Any]:
        return {"learning_rate": self.learning_rate}


class ExponentialDecay(LearningRateSchedule):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)`` (floored if staircase).

    Example: ``ExponentialDecay(0.1, 100, 0.96, staircase=True)(150) == 0.1 * 0.96``.
    """

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        decay_rate: float,
        staircase: bool = False,
        name: str | None = None,
    ) -> None:
        self.initial_learning_rate = _number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = _number("decay_steps", decay_steps, positive=True)
        self.decay_rate = _number("decay_rate", decay_rate)
        self.staircase = bool(staircase)
        self.name = name

    def __call__(self, step: Any) -> float:
        p = _step(step) / self.decay_steps
        if self.staircase:
            p = math.floor(p)
        return self.initial_learning_rate * self.decay_rate**p

    def get_config(self) -> dict[str, Any]:
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "name": self.name,
        }


class CosineDecay(LearningRateSchedule):
    """Cosine decay from the initial (or warm-up target) rate to ``alpha`` times it, with warm-up.

    Without ``warmup_target``: ``lr(step) = initial * ((1 - alpha) * 0.5 * (1 + cos(pi *
    min(step, decay_steps) / decay_steps)) + alpha)``. With it, the rate rises
    linearly from ``initial_learning_rate`` to ``warmup_target`` over
    ``warmup_steps`` steps, then decays from ``warmup_target`` over
    ``decay_steps`` more steps.

    Example: ``CosineDecay(0.0, 1000, warmup_target=0.1, warmup_steps=100)(50) == 0.05``.
    """

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        alpha: float = 0.0,
        name: str | None = None,
        warmup_target: float | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.initial_learning_rate = _number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = _number("decay_steps", decay_steps, positive=True)
        self.alpha = _number("alpha", alpha)
        self.name = name
        self.warmup_target = (
            None if warmup_target is None else _number("warmup_target", warmup_target)
        )
        self.warmup_steps = _number("warmup_steps", warmup_steps, minimum=0.0)
        if self.warmup_target is not None and self.warmup_steps == 0:
            raise ValueError(
                "CosineDecay: warmup_target is set but warmup_steps is 0; give warmup_steps > 0 "
                "or leave warmup_target as None"
            )

    def _decay(self, step: float, rate: float) -> float:
        fraction = step / self.decay_steps
        cosine = 0.5 * (1.0 + math.cos(math.pi * fraction))
        return rate * ((1.0 - self.alpha) * cosine + self.alpha)

    def __call__(self, step: Any) -> float:
        s = _step(step)
        if self.warmup_target is None:
            return self._decay(min(s, self.decay_steps), self.initial_learning_rate)
        s = min(s, self.decay_steps + self.warmup_steps)
        if s < self.warmup_steps:
            delta = self.warmup_target - self.initial_learning_rate
            return self.initial_learning_rate + delta * (s / self.warmup_steps)
        return self._decay(s - self.warmup_steps, self.warmup_target)

    def get_config(self) -> dict[str, Any]:
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "alpha": self.alpha,
            "name": self.name,
            "warmup_target": self.warmup_target,
            "warmup_steps": self.warmup_steps,
        }


class LinearWarmup(LearningRateSchedule):
    """A linear ramp from ``initial_learning_rate`` to ``after(0)``, then ``after(step - warmup)``.

    ``after`` is a schedule or a constant learning rate.

    Example: ``LinearWarmup(ExponentialDecay(0.1, 10, 0.5), warmup_steps=5)(0) == 0.0``.
    """

    def __init__(
        self,
        after: LearningRateSchedule | float | Callable[[Any], float],
        warmup_steps: int,
        initial_learning_rate: float = 0.0,
    ) -> None:
        if isinstance(after, dict):
            after = deserialize(after)
        if not callable(after):
            after = Constant(after)
        self.after = after
        self.warmup_steps = _number("warmup_steps", warmup_steps, minimum=0.0)
        self.initial_learning_rate = _number("initial_learning_rate", initial_learning_rate)

    def __call__(self, step: Any) -> float:
        s = _step(step)
        if s < self.warmup_steps:
            target = float(self.after(0))
            fraction = s / self.warmup_steps
            return self.initial_learning_rate + (target - self.initial_learning_rate) * fraction
        return float(self.after(s - self.warmup_steps))

    def get_config(self) -> dict[str, Any]:
        return {
            "after": serialize(self.after),
            "warmup_steps": self.warmup_steps,
            "initial_learning_rate": self.initial_learning_rate,
        }


class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[0]`` up to and including ``boundaries[0]``, ``values[1]`` up to ``boundaries[1]``...

    Example: ``PiecewiseConstantDecay([100], [1.0, 0.5])(100) == 1.0`` and ``(101) == 0.5``.
    """

    def __init__(
        self, boundaries: Sequence[float], values: Sequence[float], name: str | None = None
    ) -> None:
        boundaries = [_number("boundaries[i]", b) for b in boundaries]
        values = [_number("values[i]", v) for v in values]
        if len(values) != len(boundaries) + 1:
            raise ValueError(
                f"PiecewiseConstantDecay: got {len(boundaries)} boundaries and {len(values)} "
                "values; the length of values must be one more than the length of boundaries"
            )
        if any(b2 < b1 for b1, b2 in zip(boundaries, boundaries[1:], strict=False)):
            raise ValueError(f"PiecewiseConstantDecay: boundaries {boundaries} must be increasing")
        self.boundaries = boundaries
        self.values = values
        self.name = name

    def __call__(self, step: Any) -> float:
        s = _step(step)
        for b, v in zip(self.boundaries, self.values, strict=False):
            if s <= b:
                return v
        return self.values[-1]

    def get_config(self) -> dict[str, Any]:
        return {"boundaries": self.boundaries, "values": self.values, "name": self.name}


_CLASSES = {
    c.__name__: c
    for c in (Constant, ExponentialDecay, CosineDecay, LinearWarmup, PiecewiseConstantDecay)
}


def serialize(schedule: Any) -> Any:
    """``{"class_name": ..., "config": ...}`` for a schedule; numbers are returned as they are.

    Example: ``serialize(Constant(0.1)) == {"class_name": "Constant", "config": {...}}``.
    """
    if isinstance(schedule, LearningRateSchedule):
        return {"class_name": type(schedule).__name__, "config": schedule.get_config()}
    if isinstance(schedule, (int, float)):
        return float(schedule)
    raise TypeError(f"cannot serialize {schedule!r}: expected a LearningRateSchedule or a number")


def deserialize(config: Any) -> Any:
    """The schedule (or number) :func:`serialize` describes.

    Example: ``deserialize(serialize(s))`` is a copy of ``s``.
    """
    if isinstance(config, (int, float)):
        return float(config)
    if not (isinstance(config, dict) and "class_name" in config):
        raise TypeError(
            f"cannot deserialize {config!r}: expected a number or a dict with 'class_name' "
            "and 'config'"
        )
    cls = _CLASSES.get(config["class_name"])
    if cls is None:
        raise ValueError(
            f"unknown learning rate schedule {config['class_name']!r}; expected one of "
            f"{sorted(_CLASSES)}"
        )
    return cls.from_config(dict(config.get("config", {})))
