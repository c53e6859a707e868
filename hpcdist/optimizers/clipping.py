"""Gradient clipping: ``clip_by_global_norm`` (as ``tf.clip_by_global_norm``) and helpers.

The helpers work on 1-D contiguous flat buffers, NumPy (the Numba kernels of
:mod:`hpcdist.kernels.optim`) or CuPy (the CUDA kernels of
:mod:`hpcdist.kernels.optim_cuda`, imported on first use).

Example:
    >>> import numpy as np
    >>> clipped, norm = clip_by_global_norm([np.array([3.0]), np.array([4.0])], 1.0)
    >>> norm, clipped
    (5.0, [array([0.6]), array([0.8])])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray
from hpcdist.kernels import optim as cpu_kernels


def kernels_for(x: Any) -> ModuleType:
    """The kernel module for the array ``x``: :mod:`~hpcdist.kernels.optim` or its CUDA twin.

    Example: ``kernels_for(np.ones(2)).sgd`` is the CPU SGD update.
    """
    if array_module(x) is np:
        return cpu_kernels
    from hpcdist.kernels import optim_cuda  # lazy: optional GPU dependency (numba.cuda)

    return optim_cuda


def global_scale(norm: float, clip_norm: float) -> float:
    """The factor ``clip_norm / max(norm, clip_norm)``; NaN when ``norm`` is not finite (as TF).

    Example: ``global_scale(5.0, 1.0) == 0.2`` and ``global_scale(0.5, 1.0) == 1.0``.
    """
    if not math.isfinite(norm):
        return math.nan
    return clip_norm / max(norm, clip_norm)


def check_clip(name: str, value: Any) -> float | None:
    """``value`` as a non-negative float, or ``None``; a clear error otherwise."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or None, got {value!r}") from None
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _sum_squares(x: Any) -> float:
    """Sum of squares of any array in float64 (contiguous float buffers use the kernels)."""
    xp = array_module(x)
    flat = x.reshape(-1)
    if flat.dtype in (np.float32, np.float64) and flat.flags.c_contiguous:
        return kernels_for(flat).sum_squares(flat)
    f = flat.astype(np.float64)
    return float(xp.dot(f, f))


def clip_by_global_norm(arrays: Sequence[Any], clip_norm: float) -> tuple[list[Any], float]:
    """Scale all arrays by ``clip_norm / max(global_norm, clip_norm)`` (``tf.clip_by_global_norm``).

    ``global_norm = sqrt(sum of the squared L2 norms of all arrays)``, computed
    in float64. ``None`` entries are kept as ``None`` and ignored. Returns new
    arrays (the inputs are not changed) of the inputs' dtypes and the global
    norm as a float. A non-finite global norm makes every result NaN, as in TF.
    """
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Sequence):
        raise TypeError(
            f"clip_by_global_norm expects a list of arrays, got {type(arrays).__name__}"
        )
    c = check_clip("clip_norm", clip_norm)
    if c is None:
        raise ValueError("clip_norm must be a number >= 0, got None")
    items = [None if a is None else asarray(a) for a in arrays]
    for i, a in enumerate(items):
        if a is not None and a.dtype.kind not in "fiu":
            raise TypeError(f"clip_by_global_norm: array {i} has dtype {a.dtype}; expected numbers")
    norm = math.sqrt(sum(_sum_squares(a) for a in items if a is not None))
    factor = global_scale(norm, c)
    out: list[Any] = []
    for a in items:
        if a is None:
            out.append(None)
            continue
        dtype = a.dtype if a.dtype.kind == "f" else np.dtype(np.float64)
        out.append((a * dtype.type(factor)).astype(dtype, copy=False))
    return out, norm
