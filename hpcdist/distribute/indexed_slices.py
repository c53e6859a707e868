"""Sparse row gradients (``tf.IndexedSlices``).

``IndexedSlices(values, indices, dense_shape)`` stands for a dense array of
``dense_shape`` that is zero except at rows ``indices``, where it is
``values`` (a row listed twice counts twice). It is the gradient of an
embedding lookup with respect to the table: :func:`embedding_lookup_grad`.

Example:
    >>> import numpy as np
    >>> g = IndexedSlices(np.ones((3, 2)), np.array([0, 2, 0]), (4, 2))
    >>> g.to_dense()
    array([[2., 2.],
           [0., 0.],
           [1., 1.],
           [0., 0.]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray, is_cupy, to_host

__all__ = ["IndexedSlices", "embedding_lookup_grad"]


def _as_indices(indices: Any) -> Any:
    """``indices`` as a 1-D int64 array (NumPy or CuPy, as given)."""
    idx = asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(
            f"indices must be integers; got dtype {idx.dtype}. Cast them with .astype(np.int64)."
        )
    if idx.ndim != 1:
        raise ValueError(
            f"indices must be 1-D; got shape {tuple(idx.shape)}. Flatten them (and reshape "
            "values to (len(indices), ...)) first."
        )
    return idx.astype(np.int64, copy=False)


class IndexedSlices:
    """A sparse representation of a dense array by some of its rows (``tf.IndexedSlices``).

    ``values[i]`` is the slice at row ``indices[i]`` of a dense array of shape
    ``dense_shape``; duplicate indices add up.

    Example:
        >>> s = IndexedSlices(np.array([[1.0], [2.0]]), [3, 1], dense_shape=(4, 1))
        >>> s.indices.tolist(), s.dense_shape, s.to_dense().ravel().tolist()
        ([3, 1], (4, 1), [0.0, 2.0, 0.0, 1.0])
    """

    def __init__(self, values: Any, indices: Any, dense_shape: Sequence[int] | None = None):
        self._values = asarray(values)
        self._indices = _as_indices(indices)
        if self._values.ndim < 1 or self._values.shape[0] != self._indices.shape[0]:
            raise ValueError(
                f"values must have one slice per index: {self._indices.shape[0]} indices, but "
                f"values has shape {tuple(self._values.shape)}"
            )
        self._dense_shape: tuple[int, ...] | None = None
        if dense_shape is not None:
            dims = tuple(int(d) for d in to_host(asarray(dense_shape)).ravel().tolist())
            if len(dims) != self._values.ndim or dims[1:] != tuple(self._values.shape[1:]):
                raise ValueError(
                    f"dense_shape {dims} does not fit values of shape "
                    f"{tuple(self._values.shape)}: expected (rows,) + values.shape[1:]"
                )
            self._dense_shape = dims

    @property
    def values(self) -> Any:
        """The slices, shape ``(len(indices),) + dense_shape[1:]``."""
        return self._values

    @property
    def indices(self) -> Any:
        """The row of each slice (1-D int64)."""
        return self._indices

    @property
    def dense_shape(self) -> tuple[int, ...] | None:
        """The shape of the dense array this stands for (``None`` if unknown)."""
        return self._dense_shape

    @property
    def shape(self) -> tuple[int, ...] | None:
        """Same as :attr:`dense_shape`."""
        return self._dense_shape

    @property
    def dtype(self) -> Any:
        """The dtype of the values."""
        return self._values.dtype

    def _checked_indices(self) -> Any:
        rows = self._dense_shape[0]  # type: ignore[index]  # callers check it is known
        if self._indices.size:
            lo, hi = int(self._indices.min()), int(self._indices.max())
            if lo < 0 or hi >= rows:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"index {bad} is out of range for dense_shape {self._dense_shape} "
                    f"({rows} rows); indices must be in [0, {rows})"
                )
        return self._indices

    def to_dense(self) -> Any:
        """The dense array: zeros plus each slice added at its row (duplicates summed).

        Example: ``IndexedSlices(np.ones((2, 1)), [1, 1], (3, 1)).to_dense()`` is
        ``[[0.], [2.], [0.]]``.
        """
        if self._dense_shape is None:
            raise ValueError(
                "this IndexedSlices has no dense_shape, so its dense form is unknown; "
                "construct it with dense_shape=(rows, ...)"
            )
        idx = self._checked_indices()
        xp = array_module(self._values)
        out = xp.zeros(self._dense_shape, dtype=self._values.dtype)
        if is_cupy(out):
            import cupyx  # lazy: optional GPU dependency (CuPy)

            cupyx.scatter_add(out, xp.asarray(idx), self._values)
        else:
            np.add.at(out, to_host(idx), self._values)
        return out

    def deduplicate(self) -> IndexedSlices:
        """The same slices with each row once (sorted), duplicates summed.

        Example: ``IndexedSlices(np.ones((3, 1)), [2, 0, 2], (3, 1)).deduplicate()``
        has indices ``[0, 2]`` and values ``[[1.], [2.]]``.
        """
        xp = array_module(self._values)
        idx = xp.asarray(self._indices)
        unique, inverse = xp.unique(idx, return_inverse=True)
        inverse = inverse.ravel()
        out = xp.zeros((unique.shape[0],) + tuple(self._values.shape[1:]), self._values.dtype)
        if is_cupy(out):
            import cupyx  # lazy: optional GPU dependency (CuPy)

            cupyx.scatter_add(out, inverse, self._values)
        else:
            np.add.at(out, inverse, self._values)
        return IndexedSlices(out, unique, self._dense_shape)

    def __neg__(self) -> IndexedSlices:
        return IndexedSlices(-self._values, self._indices, self._dense_shape)

    def __repr__(self) -> str:
        return (
            f"IndexedSlices(indices shape={tuple(self._indices.shape)}, values "
            f"shape={tuple(self._values.shape)} dtype={self._values.dtype}, "
            f"dense_shape={self._dense_shape})"
        )


def embedding_lookup_grad(ids: Any, d_output: Any, num_rows: int) -> IndexedSlices:
    """The gradient of ``embedding_lookup(table, ids)`` w.r.t. a ``num_rows``-row table.

    ``d_output`` is the gradient of the lookup's result (shape
    ``ids.shape + table.shape[1:]``); the result has ``indices = ids.ravel()``
    and ``values = d_output`` reshaped to one row per id. A ``max_norm`` clip
    of the lookup is not differentiated through.

    Example:
        >>> g = embedding_lookup_grad(np.array([[1, 1]]), np.ones((1, 2, 3)), num_rows=4)
        >>> g.indices.tolist(), g.values.shape, g.dense_shape
        ([1, 1], (2, 3), (4, 3))
    """
    ids_arr = asarray(ids)
    if ids_arr.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers; got dtype {ids_arr.dtype}")
    grad = asarray(d_output)
    lead = tuple(ids_arr.shape)
    if tuple(grad.shape[: len(lead)]) != lead:
        raise ValueError(
            f"d_output of shape {tuple(grad.shape)} does not match ids of shape {lead}: "
            "expected ids.shape + table.shape[1:]"
        )
    trailing = tuple(grad.shape[len(lead) :])
    values = grad.reshape((int(ids_arr.size),) + trailing)
    return IndexedSlices(values, ids_arr.reshape(-1), (int(num_rows),) + trailing)
