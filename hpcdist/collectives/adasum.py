"""Adasum: the adaptive summation of gradients (Maleki et al.), as one more reduction.

Two vectors ``a`` and ``b`` combine as

    adasum(a, b) = (1 - a·b / (2 |a|²)) a + (1 - a·b / (2 |b|²)) b

so orthogonal vectors add and equal vectors average. Ranks combine in a
binary tree: pairs (0, 1), (2, 3), ... first, then the pairs' results, and
so on (an odd one out passes up unchanged). Dot products and norms are
taken in float64. :func:`adasum_allreduce` gathers every rank's array with
one engine ``allgather`` and folds the tree on each rank, so every rank
gets bitwise the same result (memory: ``size`` copies of the array).

Example:
    >>> import numpy as np
    >>> adasum_reduce([np.array([1.0, 0.0]), np.array([0.0, 2.0])]).tolist()
    [1.0, 2.0]
    >>> adasum_reduce([np.array([3.0, 3.0]), np.array([3.0, 3.0])]).tolist()
    [3.0, 3.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot = float(a64 @ b64)
    na, nb = float(a64 @ a64), float(b64 @ b64)
    ca = 1.0 - dot / (2.0 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else 1.0
    return (ca * a64 + cb * b64).reshape(a.shape)


def adasum_reduce(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The Adasum of ``arrays`` (in rank order) by the binary tree of the module doc."""
    if not arrays:
        raise ValueError("adasum_reduce needs at least one array")
    dtype = np.asarray(arrays[0]).dtype
    if dtype.kind not in "f":
        raise TypeError(f"Adasum reduces floating arrays; got {dtype}. Use SUM or MEAN instead")
    level = [np.asarray(a, dtype=np.float64) for a in arrays]
    while len(level) > 1:
        nxt = [_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].astype(dtype)


def adasum_allreduce(engine: Any, array: np.ndarray) -> np.ndarray:
    """The Adasum of every rank's ``array`` over ``engine``'s ranks (same on every rank).

    ``engine`` is a :class:`~hpcdist.collectives.Collectives`.
    """
    x = np.ascontiguousarray(array)
    if x.dtype.kind != "f":
        raise TypeError(f"Adasum reduces floating arrays; got {x.dtype}. Use SUM or MEAN instead")
    gathered = engine.allgather(x.reshape(1, *x.shape))
    return adasum_reduce(list(gathered))
