"""The one place that tells NumPy arrays from CuPy arrays.

Everything else asks this module: :func:`array_module` gives ``numpy`` or
``cupy`` for an array, :func:`to_host` brings any array to NumPy and
:func:`to_device` places a copy on a CPU or GPU device. CuPy is imported only
when a CuPy array or a GPU device is met, so a CPU-only install never needs it.

Example:
    >>> import numpy as np
    >>> array_module(np.ones(2)).__name__
    'numpy'
    >>> to_device([1.0, 2.0], "CPU", 0)
    array([1., 2.])
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def is_array(x: Any) -> bool:
    """Whether ``x`` is a NumPy array, NumPy scalar or CuPy array.

    Example: ``is_array(np.float32(1))`` is ``True``, ``is_array(1.0)`` is ``False``.
    """
    return isinstance(x, (np.ndarray, np.generic)) or is_cupy(x)


def array_module(x: Any) -> ModuleType:
    """``cupy`` for a CuPy array, else ``numpy``.

    Example: ``xp = array_module(x); xp.zeros_like(x)``.
    """
    if is_cupy(x):
        import cupy

        return cupy
    return np


def asarray(x: Any) -> Any:
    """``x`` as an array: arrays are returned as they are, anything else through NumPy.

    Example: ``asarray(3.0)`` is a 0-d float64 array.
    """
    if is_cupy(x) or isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def to_host(x: Any) -> np.ndarray:
    """A NumPy view or copy of ``x`` (a device-to-host copy for CuPy arrays).

    Example: ``to_host(cupy.ones(3))`` is ``array([1., 1., 1.])``.
    """
    if is_cupy(x):
        return x.get()
    return np.asarray(x)


def device_of(x: Any) -> tuple[str, int]:
    """``("GPU", ordinal)`` for a CuPy array, ``("CPU", 0)`` for anything else.

    Example: ``device_of(np.ones(1)) == ("CPU", 0)``.
    """
    if is_cupy(x):
        return "GPU", int(x.device.id)
    return "CPU", 0


def to_device(x: Any, device_type: str, index: int = 0, copy: bool = True) -> Any:
    """``x`` on the device ``device_type:index`` (``"CPU"`` or ``"GPU"``).

    A CPU device gives a NumPy array, a GPU device a CuPy array on that GPU.
    With ``copy=True`` (the default) the result never shares memory with
    ``x``, so replicas never see each other's writes.

    Example: ``to_device(np.ones(2), "CPU")`` is a new NumPy array.
    """
    kind = device_type.upper()
    if kind == "CPU":
        host = to_host(x)
        return np.array(host, copy=True) if copy else host
    if kind == "GPU":
        import cupy

        with cupy.cuda.Device(index):
            if copy or not is_cupy(x) or int(x.device.id) != index:
                return cupy.array(x, copy=True)
            return x
    raise ValueError(f"device type is {device_type!r}; expected 'CPU' or 'GPU'")


def copy(x: Any) -> Any:
    """A copy of the array ``x`` on the device it is on.

    Example: ``copy(a) is not a`` and ``(copy(a) == a).all()``.
    """
    return array_module(x).array(x, copy=True)


def as_result(x: Any) -> Any:
    """A 0-d NumPy array as a NumPy scalar; anything else unchanged.

    Reductions of scalars then print as numbers (``3.0``, not ``array(3.)``).

    Example: ``as_result(np.asarray(3.0))`` is ``np.float64(3.0)``.
    """
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    return x
