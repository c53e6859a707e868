"""Process-wide defaults of the training layer: the float dtype and the fuzz factor.

Example:
    >>> floatx()
    'float32'
    >>> epsilon()
    1e-07
"""

from __future__ import annotations

import numpy as np

_FLOAT_TYPES = ("float16", "float32", "float64")
_floatx = "float32"
_epsilon = 1e-7


def floatx() -> str:
    """The default float dtype of layers and weights (``"float32"`` unless changed).

    Example: ``np.zeros(3, dtype=floatx())``.
    """
    return _floatx


def set_floatx(value: str) -> None:
    """Set the default float dtype (``"float16"``, ``"float32"`` or ``"float64"``).

    Layers made afterwards use it; existing layers keep theirs.

    Example: ``set_floatx("float64")`` before building a model for gradient checks.
    """
    global _floatx
    try:
        name = np.dtype(value).name
    except TypeError:
        name = str(value)
    if name not in _FLOAT_TYPES:
        raise ValueError(f"floatx is {value!r}; expected one of {', '.join(_FLOAT_TYPES)}")
    _floatx = name


def epsilon() -> float:
    """The fuzz factor used to avoid division by zero (``1e-7``, Keras's value).

    Example: ``p = np.clip(p, epsilon(), 1 - epsilon())``.
    """
    return _epsilon


def set_epsilon(value: float) -> None:
    """Set the fuzz factor returned by :func:`epsilon`."""
    global _epsilon
    _epsilon = float(value)
