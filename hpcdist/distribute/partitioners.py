"""Variable partitioners (``tf.distribute.experimental.partitioners``) and row layouts.

A partitioner decides into how many shards a variable is split along one
axis: called as ``partitioner(shape, dtype, axis=0)`` it returns one count per
axis, 1 everywhere except ``axis``. ``ParameterServerStrategy`` splits along
axis 0 and places the shards on the parameter servers in turn.

Rows are laid out contiguously ("div" strategy): :func:`shard_sizes` gives the
first ``rows % n`` shards one extra row, :func:`shard_offsets` the first row of
each shard.

Example:
    >>> FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
    [2, 1]
    >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)((6, 1), "float32")
    [2, 1]
    >>> MaxSizePartitioner(max_shard_bytes=4)((6, 1), "float32")
    [6, 1]
    >>> shard_sizes(13, 5), shard_offsets([3, 3, 3, 2, 2])
    ([3, 3, 3, 2, 2], [0, 3, 6, 9, 11, 13])
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

__all__ = [
    "Partitioner",
    "FixedShardsPartitioner",
    "MinSizePartitioner",
    "MaxSizePartitioner",
    "shard_sizes",
    "shard_offsets",
]


@overload
def _positive_int(value: Any, arg: str, *, allow_none: Literal[False] = ...) -> int: ...
@overload
def _positive_int(value: Any, arg: str, *, allow_none: bool) -> int | None: ...
def _positive_int(value: Any, arg: str, *, allow_none: bool = False) -> int | None:
    """``value`` as a positive ``int`` (``None`` passes where allowed), else ValueError."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{arg} must be a positive integer; got {value!r} ({type(value).__name__}). "
            f"Pass an int such as {arg}=2."
        )
    if int(value) < 1:
        raise ValueError(f"{arg} must be a positive integer (>= 1); got {int(value)}")
    return int(value)


def shard_sizes(rows: int, num_shards: int) -> list[int]:
    """Rows per shard when ``rows`` rows are split into ``num_shards`` contiguous shards.

    The first ``rows % num_shards`` shards get one extra row.

    Example:
        >>> shard_sizes(13, 5)
        [3, 3, 3, 2, 2]
    """
    n = _positive_int(num_shards, "num_shards")
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or rows < 0:
        raise ValueError(f"rows must be a non-negative integer; got {rows!r}")
    base, extra = divmod(int(rows), n)
    return [base + 1 if i < extra else base for i in range(n)]


def shard_offsets(sizes: Sequence[int]) -> list[int]:
    """Cumulative row offsets of shards of ``sizes`` rows: starts at 0, length ``len + 1``.

    Example:
        >>> shard_offsets([3, 3, 3, 2, 2])
        [0, 3, 6, 9, 11, 13]
    """
    out = [0]
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0:
            raise ValueError(f"shard sizes must be non-negative integers; got {list(sizes)!r}")
        out.append(out[-1] + int(s))
    return out


def _shape_axis(shape: Any, axis: int) -> tuple[tuple[int, ...], int]:
    """The shape as a tuple of ints and ``axis`` normalised; clear errors otherwise."""
    if hasattr(shape, "as_list"):  # a TensorShape-like object
        shape = shape.as_list()
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints; got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0:
            raise ValueError(
                f"shape must be fully defined with non-negative int dimensions; got {dims!r}"
            )
    dims = tuple(int(d) for d in dims)
    if not dims:
        raise ValueError(
            "cannot partition a scalar (shape ()); partitioners split a variable along an "
            "axis, so give it at least one dimension or create it without a partitioner"
        )
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int; got {axis!r}")
    if not -len(dims) <= axis < len(dims):
        raise ValueError(f"axis {axis} is out of range for shape {dims} of rank {len(dims)}")
    return dims, int(axis) % len(dims)


def _element_bytes(dtype: Any, bytes_per_string: int) -> int:
    """Bytes per element; strings and objects count ``bytes_per_string``."""
    dt = np.dtype(dtype)
    if dt.kind in "OUST":
        return bytes_per_string
    return dt.itemsize


class Partitioner:
    """Base class of partitioners: ``partitioner(shape, dtype, axis=0) -> list[int]``.

    A subclass implements :meth:`__call__`, returning the number of partitions
    of every axis (1 except on ``axis``).

    Example:
        >>> class Halves(Partitioner):
        ...     def __call__(self, shape, dtype, axis=0):
        ...         return [2 if i == axis else 1 for i in range(len(shape))]
        >>> Halves()((4, 3), "float32")
        [2, 1]
    """

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        """Partition ``shape`` (of ``dtype``) along ``axis``: one count per axis."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement __call__(shape, dtype, axis=0)"
        )

    def _result(self, dims: tuple[int, ...], axis: int, n: int) -> list[int]:
        out = [1] * len(dims)
        out[axis] = max(1, min(int(n), dims[axis]))
        return out


class FixedShardsPartitioner(Partitioner):
    """A fixed number of shards (fewer when the axis has fewer rows).

    Example:
        >>> FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
        [2, 1]
        >>> FixedShardsPartitioner(4)((3, 2), "float64")
        [3, 1]
    """

    def __init__(self, num_shards: int) -> None:
        self._num_shards = _positive_int(num_shards, "num_shards")

    @property
    def num_shards(self) -> int:
        """The number of shards asked for."""
        return self._num_shards

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        """``[.., min(num_shards, shape[axis]), ..]``."""
        dims, axis = _shape_axis(shape, axis)
        return self._result(dims, axis, self._num_shards)

    def __repr__(self) -> str:
        return f"FixedShardsPartitioner(num_shards={self._num_shards})"


def _rows_and_row_bytes(
    dims: tuple[int, ...], axis: int, dtype: Any, bytes_per_string: int
) -> tuple[int, int]:
    """The length of ``axis`` and the bytes of one slice along it."""
    row_bytes = math.prod(d for i, d in enumerate(dims) if i != axis)
    return dims[axis], row_bytes * _element_bytes(dtype, bytes_per_string)


class MinSizePartitioner(Partitioner):
    """As many shards as possible (at most ``max_shards``), each of at least ``min_shard_bytes``.

    Every shard, the smallest included, holds at least ``min_shard_bytes``
    whenever the whole variable does; a smaller variable is one shard.

    Example:
        >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)((6, 1), "float32")
        [2, 1]
        >>> MinSizePartitioner(min_shard_bytes=4, max_shards=10)((6, 1), "float32")
        [6, 1]
    """

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        self._min_shard_bytes = _positive_int(min_shard_bytes, "min_shard_bytes")
        self._max_shards = _positive_int(max_shards, "max_shards")
        self._bytes_per_string = _positive_int(bytes_per_string, "bytes_per_string")

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        """The partition counts of ``shape``; see the class docstring."""
        dims, axis = _shape_axis(shape, axis)
        rows, row_bytes = _rows_and_row_bytes(dims, axis, dtype, self._bytes_per_string)
        if rows == 0 or row_bytes == 0:
            return self._result(dims, axis, 1)
        rows_per_shard = -(-self._min_shard_bytes // row_bytes)  # ceil
        # The smallest of n shards has rows // n rows: n <= rows // rows_per_shard.
        return self._result(dims, axis, min(self._max_shards, rows // rows_per_shard))

    def __repr__(self) -> str:
        return (
            f"MinSizePartitioner(min_shard_bytes={self._min_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )


class MaxSizePartitioner(Partitioner):
    """As few shards as possible, each of at most ``max_shard_bytes``.

    A single row larger than ``max_shard_bytes`` makes one shard per row;
    ``max_shards`` (default no limit) takes precedence over the byte bound.

    Example:
        >>> MaxSizePartitioner(max_shard_bytes=4)((6, 1), "float32")
        [6, 1]
        >>> MaxSizePartitioner(max_shard_bytes=4, max_shards=2)((6, 1), "float32")
        [2, 1]
        >>> MaxSizePartitioner(max_shard_bytes=1024)((6, 1), "float32")
        [1, 1]
    """

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        self._max_shard_bytes = _positive_int(max_shard_bytes, "max_shard_bytes")
        self._max_shards = _positive_int(max_shards, "max_shards", allow_none=True)
        self._bytes_per_string = _positive_int(bytes_per_string, "bytes_per_string")

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        """The partition counts of ``shape``; see the class docstring."""
        dims, axis = _shape_axis(shape, axis)
        rows, row_bytes = _rows_and_row_bytes(dims, axis, dtype, self._bytes_per_string)
        if rows == 0 or row_bytes == 0:
            return self._result(dims, axis, 1)
        rows_per_shard = max(1, self._max_shard_bytes // row_bytes)
        n = -(-rows // rows_per_shard)  # ceil: the largest shard has ceil(rows / n) rows
        if self._max_shards is not None:
            n = min(n, self._max_shards)
        return self._result(dims, axis, n)

    def __repr__(self) -> str:
        return (
            f"MaxSizePartitioner(max_shard_bytes={self._max_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )
