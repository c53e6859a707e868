"""A variable split into shards along axis 0 (``tf.distribute.ShardedVariable``).

``ShardedVariable(shards)`` puts shards that agree on dtype and trailing
dimensions end to end: it reads as their concatenation along axis 0, writes
by splitting a full value into per-shard pieces, and indexes rows by asking
only the shards that hold them. Shards are duck-typed variables (``.shape``,
``.dtype``, ``.name``, ``.value()``, ``.assign*``); a shard with a
``_gather_rows(local_rows)`` method (the parameter-server variable) is asked
for exactly the rows needed.

:func:`embedding_lookup` gathers rows of a table (a ShardedVariable, a
variable, an array or a list of shards laid out contiguously: TF's "div"
strategy) for ids of any shape.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> sv = ShardedVariable([hd.Variable(np.arange(6.0).reshape(3, 2)),
    ...                       hd.Variable(np.arange(6.0, 10.0).reshape(2, 2))], name="emb")
    >>> sv.shape, sv[3].tolist()
    ((5, 2), [6.0, 7.0])
    >>> embedding_lookup(sv, np.array([[4, 0]])).tolist()
    [[[8.0, 9.0], [0.0, 1.0]]]
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from hpcdist.arrays import array_module, asarray, to_host
from hpcdist.distribute.partitioners import shard_offsets
from hpcdist.distribute.variables import Variable

__all__ = ["ShardedVariable", "embedding_lookup"]


def _shard_value(shard: Any) -> Any:
    """The current value of a shard (a variable-like object or an array)."""
    value = getattr(shard, "value", None)
    if callable(value):
        return asarray(value())
    return asarray(shard)


def _describe(shard: Any, i: int) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of shard ``i``, with a clear error for things that are not arrays."""
    if hasattr(shard, "shape") and hasattr(shard, "dtype"):
        shape, dtype = tuple(int(d) for d in shard.shape), np.dtype(shard.dtype)
    else:
        try:
            arr = asarray(shard)
        except Exception as err:
            raise TypeError(
                f"shard {i} ({type(shard).__name__}) is neither a variable nor an array; "
                "expected objects with .shape, .dtype and .value()"
            ) from err
        shape, dtype = tuple(arr.shape), arr.dtype
    if not shape:
        raise ValueError(
            f"shard {i} is a scalar (shape ()); shards split a variable along axis 0, so "
            "each needs at least one dimension"
        )
    return shape, dtype


def _layout(shards: Sequence[Any]) -> tuple[list[int], tuple[int, ...], np.dtype]:
    """Rows per shard, the common trailing shape and dtype; ValueError if they disagree."""
    if not shards:
        raise ValueError("at least one shard is needed; got an empty list")
    described = [_describe(s, i) for i, s in enumerate(shards)]
    trailing, dtype = described[0][0][1:], described[0][1]
    for i, (shape, dt) in enumerate(described):
        if dt != dtype:
            raise ValueError(
                f"all shards must have the same dtype; shard 0 is {dtype}, shard {i} is {dt}"
            )
        if shape[1:] != trailing:
            raise ValueError(
                "all shards must have the same shape except along axis 0; shard 0 has "
                f"{described[0][0]}, shard {i} has {shape}"
            )
    return [shape[0] for shape, _ in described], trailing, dtype


def _as_ids(ids: Any, rows: int, *, wrap_negative: bool) -> np.ndarray:
    """``ids`` as a host int64 array, range-checked against ``rows``."""
    arr = to_host(asarray(ids))
    if arr.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers; got dtype {arr.dtype}. Cast them to int64.")
    arr = arr.astype(np.int64, copy=wrap_negative)
    low = -rows if wrap_negative else 0
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < low or hi >= rows:
            bad = lo if lo < low else hi
            raise IndexError(
                f"id {bad} is out of range for a table of {rows} rows; ids must be in "
                f"[{low}, {rows})"
            )
    if wrap_negative:
        arr[arr < 0] += rows
    return arr


def _take_rows(shard: Any, local_rows: np.ndarray) -> Any:
    """Rows ``local_rows`` of one shard: one remote gather, or a take on its value."""
    gather = getattr(shard, "_gather_rows", None)
    if gather is not None:
        return asarray(gather(local_rows))
    value = _shard_value(shard)
    xp = array_module(value)
    return xp.take(value, xp.asarray(local_rows), axis=0)


def _clip_rows(rows: Any, max_norm: float) -> Any:
    """Scale each row down to an L2 norm of at most ``max_norm`` (``tf.clip_by_norm``)."""
    if rows.dtype.kind != "f":
        raise TypeError(f"max_norm needs a floating-point table; this one is {rows.dtype}")
    xp = array_module(rows)
    axes = tuple(range(1, rows.ndim))
    norms = xp.sqrt(xp.sum(rows * rows, axis=axes, keepdims=True))
    return (rows * (max_norm / xp.maximum(norms, max_norm))).astype(rows.dtype, copy=False)


def _gather(
    shards: Sequence[Any],
    offsets: Sequence[int],
    trailing: tuple[int, ...],
    dtype: np.dtype,
    ids: np.ndarray,
    max_norm: float | None = None,
) -> Any:
    """Rows ``ids`` (checked, any shape) of the concatenated shards: ``ids.shape + trailing``.

    Each distinct row is fetched once, from the one shard that holds it, with
    one call per shard that holds any.
    """
    if len(shards) == 1 and getattr(shards[0], "_gather_rows", None) is None:
        value = _shard_value(shards[0])  # one local table: a plain take, no dedup needed
        xp = array_module(value)
        out = xp.take(value, xp.asarray(ids.reshape(-1)), axis=0)
        out = _clip_rows(out, max_norm) if max_norm is not None else out
        return out.reshape(tuple(ids.shape) + trailing)
    unique, inverse = np.unique(ids.reshape(-1), return_inverse=True)
    which = np.searchsorted(np.asarray(offsets), unique, side="right") - 1
    bounds = np.searchsorted(which, np.arange(len(shards) + 1))
    pieces = []
    for s, shard in enumerate(shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if hi == lo:
            continue
        piece = _take_rows(shard, unique[lo:hi] - offsets[s])
        if tuple(piece.shape) != (hi - lo,) + trailing:
            raise RuntimeError(
                f"shard {s} returned rows of shape {tuple(piece.shape)} for {hi - lo} ids; "
                f"expected {(hi - lo,) + trailing}"
            )
        pieces.append(piece)
    if not pieces:
        return np.empty(tuple(ids.shape) + trailing, dtype=dtype)
    xp = array_module(pieces[0])
    rows = xp.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]
    if max_norm is not None:
        rows = _clip_rows(rows, max_norm)
    out = xp.take(rows, xp.asarray(inverse.reshape(-1)), axis=0)  # faster than rows[inverse]
    return out.reshape(tuple(ids.shape) + trailing)


def _basic_index(x: Any) -> bool:
    return (
        x is Ellipsis
        or isinstance(x, slice)
        or (isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)))
    )


class ShardedVariable(NDArrayOperatorsMixin):
    """Shards along axis 0 that act as one variable (``tf.distribute.ShardedVariable``).

    Not an ``hpcdist.Variable`` (as in TF); reads concatenate the shards,
    writes split the value, row indexing reads only the shards it needs.

    Example:
        >>> import numpy as np, hpcdist as hd
        >>> sv = ShardedVariable([hd.Variable(np.zeros((2, 3))), hd.Variable(np.zeros((1, 3)))])
        >>> _ = sv.assign_add(np.ones((3, 3)))
        >>> sv.shape, [v.shape for v in sv.variables], float(np.sum(sv))
        ((3, 3), [(2, 3), (1, 3)], 9.0)
    """

    def __init__(self, variables: Sequence[Any], name: str | None = None) -> None:
        if isinstance(variables, (str, bytes)) or not isinstance(variables, Sequence):
            raise TypeError(
                f"variables must be a non-empty list of variables; got {type(variables).__name__}"
            )
        self._variables = list(variables)
        sizes, trailing, dtype = _layout(self._variables)
        self._sizes = sizes
        self._offsets = shard_offsets(sizes)
        self._trailing = trailing
        self._dtype = dtype
        if name is None:
            first = str(getattr(self._variables[0], "name", ""))
            name = first[: -len("/part_0")] if first.endswith("/part_0") else "ShardedVariable"
        self._name = name
        for v in self._variables:
            try:
                v._sharded_container = weakref.ref(self)
            except AttributeError:
                pass

    # -- description -------------------------------------------------------------------
    @property
    def variables(self) -> list[Any]:
        """The shards, in row order."""
        return list(self._variables)

    @property
    def name(self) -> str:
        """The name of the whole variable."""
        return self._name

    @property
    def shape(self) -> tuple[int, ...]:
        """The full shape: total rows, then the shards' common trailing dimensions."""
        return (self._offsets[-1],) + self._trailing

    @property
    def dtype(self) -> np.dtype:
        """The shards' common dtype."""
        return self._dtype

    @property
    def ndim(self) -> int:
        """The rank of the full value."""
        return 1 + len(self._trailing)

    @property
    def size(self) -> int:
        """The number of elements of the full value."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def trainable(self) -> bool:
        """Whether optimizers update it (the first shard's setting)."""
        return bool(getattr(self._variables[0], "trainable", True))

    def __len__(self) -> int:
        return self._offsets[-1]

    def __iter__(self) -> Any:
        """Iterates over the shards (as TF does)."""
        return iter(self._variables)

    def __repr__(self) -> str:
        return (
            f"<hpcdist.ShardedVariable {self._name!r} shape={self.shape} dtype={self._dtype} "
            f"shards={self._sizes}>"
        )

    __hash__ = object.__hash__

    # -- reading ---------------------------------------------------------------------------
    def value(self) -> Any:
        """The full value: the shards' values concatenated along axis 0."""
        values = [_shard_value(v) for v in self._variables]
        return array_module(values[0]).concatenate(values, axis=0)

    def read_value(self) -> Any:
        """The full value (same as :meth:`value`)."""
        return self.value()

    def raw_value(self) -> Any:
        """The shards joined into one array (the same as :meth:`value`)."""
        return self.value()

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the full value."""
        return np.array(to_host(self.value()), copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a ShardedVariable's value is a concatenation: it needs a copy")
        return np.asarray(to_host(self.value()), dtype=dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if any(isinstance(o, (ShardedVariable, Variable)) for o in kwargs.get("out", ())):
            raise TypeError("a ShardedVariable cannot be the output of an operation; use assign")
        inputs = tuple(
            x.value() if isinstance(x, (ShardedVariable, Variable)) else x for x in inputs
        )
        return getattr(ufunc, method)(*inputs, **kwargs)

    # `v += x` rebinds `v` to a new array (as for Variable); it does not update the shards.
    def __iadd__(self, other: Any) -> Any:
        return NotImplemented

    __isub__ = __imul__ = __itruediv__ = __iadd__

    def _lookup(self, ids: Any, max_norm: float | None = None) -> Any:
        """Rows ``ids`` (non-negative ints, any shape): ``ids.shape + shape[1:]``."""
        checked = _as_ids(ids, len(self), wrap_negative=False)
        return _gather(
            self._variables, self._offsets, self._trailing, self._dtype, checked, max_norm
        )

    def _row_index(self, first: Any) -> tuple[np.ndarray, bool] | None:
        """Global rows an index on axis 0 selects, and whether it drops the axis."""
        rows = len(self)
        if isinstance(first, numbers.Integral) and not isinstance(first, (bool, np.bool_)):
            r = int(first) + rows if int(first) < 0 else int(first)
            if not 0 <= r < rows:
                raise IndexError(f"index {int(first)} is out of bounds for axis 0 with size {rows}")
            return np.array([r], dtype=np.int64), True
        if isinstance(first, slice):
            return np.arange(*first.indices(rows), dtype=np.int64), False
        if isinstance(first, (list, np.ndarray)) or hasattr(first, "__cuda_array_interface__"):
            arr = to_host(asarray(first))
            if arr.dtype.kind in "iu":
                return _as_ids(arr, rows, wrap_negative=True), False
        return None

    def __getitem__(self, item: Any) -> Any:
        """Row indexing and slicing (axis 0) read only the shards holding those rows."""
        if isinstance(item, tuple):
            first, rest = (item[0], item[1:]) if item else (Ellipsis, ())
        else:
            first, rest = item, ()
        selected = self._row_index(first)
        if selected is None or not all(_basic_index(x) for x in rest):
            return self.value()[item]
        rows, scalar = selected
        out = self._lookup(rows)
        if scalar:
            return out[0][rest] if rest else out[0]
        return out[(slice(None),) * rows.ndim + rest] if rest else out

    # -- writing ----------------------------------------------------------------------------
    def _split(self, array: Any) -> list[Any]:
        """``array`` (full rows along axis 0) cut into one view per shard."""
        arr = asarray(array)
        if arr.ndim < 1 or arr.shape[0] != len(self):
            raise ValueError(
                f"cannot split an array of shape {tuple(arr.shape)} over the shards of "
                f"{self._name!r}: expected {len(self)} rows along axis 0"
            )
        o = self._offsets
        return [arr[o[i] : o[i + 1]] for i in range(len(self._variables))]

    def _write(self, method: str, value: Any, read_value: bool) -> Any:
        if isinstance(value, (ShardedVariable, Variable)):
            value = value.value()
        value = asarray(value)
        if tuple(value.shape) != self.shape:
            raise ValueError(
                f"cannot {method} a value of shape {tuple(value.shape)} to sharded variable "
                f"{self._name!r} of shape {self.shape}; shapes must match"
            )
        for shard, piece in zip(self._variables, self._split(value), strict=True):
            getattr(shard, method)(piece)
        return self if read_value else None

    def assign(
        self,
        value: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> ShardedVariable | None:
        """Set the full value (split along axis 0 over the shards); returns the variable."""
        return self._write("assign", value, read_value)

    def assign_add(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> ShardedVariable | None:
        """Add ``delta`` (full shape) shard by shard; returns the variable."""
        return self._write("assign_add", delta, read_value)

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> ShardedVariable | None:
        """Subtract ``delta`` (full shape) shard by shard; returns the variable."""
        return self._write("assign_sub", delta, read_value)

    def split(self, array: Any) -> list[Any]:
        """``array`` (full rows along axis 0) cut into one view per shard.

        Example: ``sv.split(np.zeros(sv.shape))`` gives one zero array per shard.
        """
        return self._split(array)

    def split_indexed_slices(self, slices: Any) -> list[tuple[int, np.ndarray, Any]]:
        """A sparse gradient's rows per shard: ``[(shard index, local rows int64, values)]``."""
        return self._split_indexed_slices(slices)

    def _split_indexed_slices(self, slices: Any) -> list[tuple[int, np.ndarray, Any]]:
        """A sparse gradient's rows per shard: ``[(shard index, local rows int64, values)]``.

        Only shards with at least one row appear; rows keep their order (and duplicates).
        """
        indices, values = getattr(slices, "indices", None), getattr(slices, "values", None)
        if indices is None or values is None:
            raise TypeError(f"expected an IndexedSlices; got {type(slices).__name__}")
        dense_shape = getattr(slices, "dense_shape", None)
        if dense_shape is not None and tuple(int(d) for d in dense_shape) != self.shape:
            raise ValueError(
                f"the IndexedSlices has dense_shape {tuple(dense_shape)}, but sharded variable "
                f"{self._name!r} has shape {self.shape}"
            )
        idx = _as_ids(indices, len(self), wrap_negative=False).reshape(-1)
        values = asarray(values)
        if tuple(values.shape) != (idx.size,) + self._trailing:
            raise ValueError(
                f"IndexedSlices values have shape {tuple(values.shape)}; expected "
                f"{(idx.size,) + self._trailing} for {idx.size} indices into {self.shape}"
            )
        which = np.searchsorted(np.asarray(self._offsets), idx, side="right") - 1
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(self._variables) + 1))
        xp = array_module(values)
        out = []
        for s in range(len(self._variables)):
            sel = order[bounds[s] : bounds[s + 1]]
            if sel.size:
                out.append((s, idx[sel] - self._offsets[s], values[xp.asarray(sel)]))
        return out


def embedding_lookup(params: Any, ids: Any, max_norm: float | None = None) -> Any:
    """Rows ``ids`` of the table ``params`` (``tf.nn.embedding_lookup``): ``ids.shape + row``.

    ``params`` is a :class:`ShardedVariable`, a variable, an array, or a list
    of shards holding contiguous rows ("div" strategy). Each distinct row is
    fetched once, from the shard that holds it. ``max_norm`` scales down each
    returned row whose L2 norm exceeds it.

    Example:
        >>> table = np.arange(8.0).reshape(4, 2)
        >>> embedding_lookup([table[:2], table[2:]], [3, 0, 3]).tolist()
        [[6.0, 7.0], [0.0, 1.0], [6.0, 7.0]]
        >>> embedding_lookup(np.array([[6.0, 8.0]]), [0], max_norm=5.0).tolist()
        [[3.0, 4.0]]
    """
    if max_norm is not None and (
        isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm > 0
    ):
        raise ValueError(f"max_norm must be a positive number or None; got {max_norm!r}")
    if isinstance(params, ShardedVariable):
        return params._lookup(ids, max_norm)
    if isinstance(params, (list, tuple)):
        shards = [s if hasattr(s, "shape") and hasattr(s, "dtype") else asarray(s) for s in params]
    else:
        shards = [params]
    sizes, trailing, dtype = _layout(shards)
    offsets = shard_offsets(sizes)
    checked = _as_ids(ids, offsets[-1], wrap_negative=False)
    return _gather(shards, offsets, trailing, dtype, checked, max_norm)
