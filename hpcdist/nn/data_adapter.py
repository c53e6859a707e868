"""What ``fit``, ``evaluate`` and ``predict`` accept as input, turned into one kind of dataset.

Keras takes NumPy arrays (``x``, ``y``, ``sample_weight``, ``batch_size``) or a
dataset of batches; both become a :class:`~hpcdist.data.dataset.Dataset` of
global batches here. Under a strategy the batch size is the *global* batch size,
as in Keras; the strategy splits each batch over its replicas.

Example:
    >>> import numpy as np
    >>> ds, steps = as_dataset(np.zeros((10, 2)), np.ones(10), batch_size=4)
    >>> steps, [tuple(b[0].shape) for b in ds]
    (3, [(4, 2), (4, 2), (2, 2)])
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from hpcdist.arrays import to_host
from hpcdist.data.dataset import Dataset
from hpcdist.data.distributed import DistributedDataset
from hpcdist.data.options import AutoShardPolicy, Options

#: Keras's default batch size when arrays are given without one.
DEFAULT_BATCH_SIZE = 32


def is_dataset(x: Any) -> bool:
    """Whether ``x`` is a dataset (plain or distributed) rather than arrays.

    Example: ``is_dataset(Dataset.range(3))`` is ``True``; ``is_dataset(np.zeros(3))`` is ``False``.
    """

    return isinstance(x, (Dataset, DistributedDataset))


def _num_rows(arrays: Any) -> int:
    rows = {int(np.shape(a)[0]) for a in _leaves(arrays) if np.ndim(a) > 0}
    if not rows:
        raise ValueError(
            "the inputs hold no arrays with rows (only scalars or empty lists); pass x and y "
            "as NumPy arrays with one row per example, e.g. fit(np.asarray(x), np.asarray(y))"
        )
    if len(rows) != 1:
        raise ValueError(
            f"the input arrays have different numbers of rows ({sorted(rows)}); x, y and "
            "sample_weight must have one row per example"
        )
    return rows.pop()


def _is_number_tree(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_number_tree(v) for v in value)
    return isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray)


def lists_to_arrays(value: Any, name: str) -> Any:
    """A (nested) Python list of numbers as a NumPy array; anything else unchanged.

    Keras accepts ``fit(x.tolist(), y.tolist())``; so does hpcdist. A list whose items
    are arrays stays a list (several inputs); a ragged list is refused with advice.

    Example:
        >>> lists_to_arrays([[1.0, 2.0], [3.0, 4.0]], "x").shape
        (2, 2)
    """
    if not (isinstance(value, (list, tuple)) and value and _is_number_tree(value)):
        return value
    try:
        array = np.asarray(value)
    except ValueError as e:  # rows of different lengths
        raise ValueError(
            f"{name} is a Python list whose rows have different lengths ({e}); pass a NumPy "
            f"array with one row per example (all rows the same shape)"
        ) from None
    if array.dtype == object:
        raise ValueError(
            f"{name} is a Python list that does not form a rectangular array; pass a NumPy array"
        )
    return array


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, dict):
        return [leaf for key in sorted(x) for leaf in _leaves(x[key])]
    return [x]


def as_dataset(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    batch_size: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
) -> tuple[Dataset, int | None]:
    """``(dataset of global batches, steps per pass or None when unknown)``.

    A dataset ``x`` must already be batched and carry ``(x, y[, sample_weight])``
    elements; then ``y``, ``sample_weight`` and ``batch_size`` must be ``None``.
    """
    if is_dataset(x):
        for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise ValueError(
                    f"{name} must be None when x is a dataset (got {name}={value!r}): the dataset "
                    "gives batches of (x, y) or (x, y, sample_weight) already"
                )
        steps = x.cardinality() if isinstance(x, Dataset) else -2
        return x, (int(steps) if steps >= 0 else None)
    if x is None:
        raise ValueError("x must be given: arrays (with y) or a dataset of (x, y) batches")
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    named = (("x", x), ("y", y), ("sample_weight", sample_weight))
    parts = tuple(_host(lists_to_arrays(p, k)) for k, p in named if p is not None)
    n = _num_rows(parts)
    ds: Dataset = Dataset.from_tensor_slices(parts if len(parts) > 1 else parts[0])
    if shuffle:
        ds = ds.shuffle(max(n, 1), seed=seed, reshuffle_each_iteration=True)
    # The arrays are in every worker's memory already: each worker keeps its part of each
    # global batch (DATA), which needs no files and is not a fallback worth a warning.
    options = Options()
    options.distribute.auto_shard_policy = AutoShardPolicy.DATA
    ds = ds.batch(int(batch_size)).with_options(options)
    return ds, -(-n // int(batch_size))


def _host(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)(_host(v) for v in x)
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items()}
    return to_host(x)


def split_validation(x: Any, y: Any, sample_weight: Any, fraction: float) -> tuple[tuple, tuple]:
    """Keras's ``validation_split``: the last ``fraction`` of the rows, taken before shuffling."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation_split must be in (0, 1), got {fraction!r}")
    if is_dataset(x):
        raise ValueError(
            "validation_split is only supported for array inputs; pass validation_data for datasets"
        )
    x, y, sample_weight = (
        lists_to_arrays(p, k) for k, p in (("x", x), ("y", y), ("sample_weight", sample_weight))
    )
    n = _num_rows(tuple(p for p in (x, y, sample_weight) if p is not None))
    cut = int(n * (1.0 - fraction))
    if cut == 0 or cut == n:
        raise ValueError(
            f"validation_split={fraction} leaves an empty training or validation set for {n} rows"
        )

    def take(a: Any, sl: slice) -> Any:
        return None if a is None else a[sl]

    train = tuple(take(a, slice(0, cut)) for a in (x, y, sample_weight))
    val = tuple(take(a, slice(cut, None)) for a in (x, y, sample_weight))
    return train, val


def unpack(batch: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one batch (Keras's ``unpack_x_y_sample_weight``).

    Example: ``unpack((x, y))`` is ``(x, y, None)``; ``unpack(x)`` is ``(x, None, None)``.
    """
    if isinstance(batch, tuple):
        if len(batch) == 1:
            return batch[0], None, None
        if len(batch) == 2:
            return batch[0], batch[1], None
        if len(batch) == 3:
            return batch
        raise ValueError(
            f"a batch must be x, (x,), (x, y) or (x, y, sample_weight); got a tuple of "
            f"{len(batch)} items"
        )
    return batch, None, None
