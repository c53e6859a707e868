"""Fusion copies driven by precomputed tables: the hot path of a fused collective.

:func:`pack_pieces` copies the pieces of a bucket from the tensors into a
buffer in one compiled call. The tables (which tensor, from which byte, how
many bytes, to which byte) are built once per tensor list by
:mod:`hpcdist.collectives.fusion`, so they are trusted here: no checks per
call. :func:`address_of` is the cheapest way to get an array's data address
from Python (a compiled call; ``__array_interface__`` costs several times more).

Example:
    >>> import numpy as np
    >>> src = [np.arange(3, dtype=np.uint8), np.arange(10, 12, dtype=np.uint8)]
    >>> dst = np.zeros(5, np.uint8)
    >>> bases = np.array([address_of(a) for a in src], np.int64)
    >>> table = np.array([[0, 1], [0, 0], [3, 2], [0, 3]], np.int64)
    >>> pack_pieces(address_of(dst), bases, table[0], table[1], table[2], table[3])
    >>> dst.tolist()
    [0, 1, 2, 10, 11]
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hpcdist.kernels._llvm import memcpy

__all__ = ["address_of", "pack_pieces"]


@njit(nogil=True, cache=True)
def address_of(a: np.ndarray) -> int:
    """The address of ``a``'s first byte. Example: ``address_of(x) == x.ctypes.data``."""
    return a.ctypes.data


@njit(nogil=True, cache=True)
def pack_pieces(
    dst: int,
    bases: np.ndarray,
    tensor: np.ndarray,
    src: np.ndarray,
    nbytes: np.ndarray,
    offsets: np.ndarray,
) -> None:
    """For each piece ``i``: copy ``nbytes[i]`` bytes from ``bases[tensor[i]] + src[i]``
    to ``dst + offsets[i]`` (raw addresses; the caller guarantees the ranges).

    Example: see the module docstring.
    """
    for i in range(tensor.shape[0]):
        memcpy(dst + offsets[i], bases[tensor[i]] + src[i], nbytes[i])
