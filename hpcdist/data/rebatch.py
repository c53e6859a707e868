"""Rebatching: split each global batch into one sub-batch per replica, TF's way.

A dataset batched by the global batch size ``G`` is fed to ``N = W * R``
replicas (``W`` workers with ``R`` replicas each). Each global batch is cut
into ``N`` consecutive sub-batches whose sizes differ by at most one: the
first ``G % N`` get ``G // N + 1`` elements, the others ``G // N``. Worker
``w`` sees this list rotated left by ``w * R`` (:func:`batch_sizes_for_worker`),
so that whichever way the workers read their data, every step consumes
exactly ``G`` elements over all replicas.

A partial last batch of ``b < G`` elements is split by the same rule with
``b`` in place of ``G``; replicas left with nothing get an *empty* batch
(first dimension 0, the right dtype and trailing shape). (TF's rebatch fills
the full-batch sizes in order instead: ``b = 3`` over sizes ``[2, 2, 2, 2]``
gives ``[2, 1, 0, 0]`` there and ``[1, 1, 1, 0]`` here, so that sizes always
differ by at most one.)

The split happens on the elements of the finished pipeline (as TF's rebatch
does), so transformations after ``.batch()`` (``map``, ``take``, ``repeat``...)
keep their meaning on global batches.

Example:
    >>> batch_sizes_for_worker(7, 2, 2, 0), batch_sizes_for_worker(7, 2, 2, 1)
    ([2, 2, 2, 1], [2, 1, 2, 2])
    >>> import numpy as np
    >>> [s.tolist() for s in split_batch(np.arange(5), [2, 2, 1])]
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from hpcdist.data.transform_nodes import BatchDataset
from hpcdist.distribute import nest
from hpcdist.distribute.input_context import check_count

#: The most replicas (``num_workers * num_replicas_per_worker``) a global batch is split over.
MAX_REPLICAS = 10_000_000


def batch_sizes_for_worker(
    global_batch_size: int, num_workers: int, num_replicas_per_worker: int, worker_index: int
) -> list[int]:
    """The ``W * R`` sub-batch sizes worker ``worker_index`` cuts each global batch into.

    The sizes of the global list differ by at most one (the larger ones
    first) and sum to ``global_batch_size``; worker ``w``'s list is that list
    rotated left by ``w * R``. Its first ``R`` entries are what its replicas
    get at a step when every worker reads the same global batch (DATA
    sharding); read in turns of ``R`` over ``W`` steps, the lists of all
    workers together consume ``global_batch_size`` elements per step.

    Example:
        >>> batch_sizes_for_worker(7, 2, 2, 1)
        [2, 1, 2, 2]
        >>> batch_sizes_for_worker(3, 1, 4, 0)
        [1, 1, 1, 0]
    """
    g = check_count("global_batch_size", global_batch_size, 0)
    w_count = check_count("num_workers", num_workers, 1)
    r = check_count("num_replicas_per_worker", num_replicas_per_worker, 1)
    w = check_count("worker_index", worker_index, 0)
    if w >= w_count:
        raise ValueError(
            f"worker_index is {w} but there are {w_count} workers; expected "
            f"0 <= worker_index < {w_count}"
        )
    if w_count * r > MAX_REPLICAS:
        raise ValueError(
            f"num_workers * num_replicas_per_worker is {w_count} * {r} = {w_count * r} "
            f"replicas, more than {MAX_REPLICAS:,}; check the arguments for a typo"
        )
    return _sizes(g, w_count, r, w)


def _sizes(g: int, w_count: int, r: int, w: int) -> list[int]:
    """:func:`batch_sizes_for_worker` without the argument checks."""
    n = w_count * r
    base, extra = divmod(g, n)
    sizes = [base + 1] * extra + [base] * (n - extra)
    shift = w * r
    return sizes[shift:] + sizes[:shift]


def find_global_batch_size(dataset: Any) -> int:
    """The batch size of the last ``.batch()`` in ``dataset``'s chain.

    Raises ``ValueError`` (as TF does) when the pipeline has no ``.batch()``:
    ``experimental_distribute_dataset`` splits global batches, so it needs them.

    Example: ``find_global_batch_size(Dataset.range(8).batch(4).map(f))`` is ``4``.
    """

    node, names = dataset, []
    while node is not None:
        if isinstance(node, BatchDataset):
            return int(node.batch_size)
        names.append(type(node).__name__)
        node = getattr(node, "_input", None)
    chain = " -> ".join(reversed(names)) or type(dataset).__name__
    raise ValueError(
        "experimental_distribute_dataset splits global batches over the replicas, but this "
        f"dataset is not batched: no .batch() in its pipeline ({chain}). Batch it by the "
        "global batch size first, e.g. dataset.batch(64), or use "
        "distribute_datasets_from_function to build per-replica batches yourself"
    )


def batch_dim(element: Any) -> int:
    """The size of the first (batch) dimension shared by every array of ``element``.

    Example:
        >>> batch_dim({"x": np.zeros((3, 2)), "y": np.zeros(3)})
        3
    """
    sizes = set()
    for leaf in nest.flatten(element):
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) == 0:
            raise ValueError(
                f"cannot split a batch whose element has a leaf without a batch dimension "
                f"({type(leaf).__name__} {leaf!r:.80}); every leaf of a batched dataset's "
                "element must be an array of rank >= 1 (keep .batch() the batching step and "
                "do not unbatch or reduce away the batch dimension afterwards)"
            )
        sizes.add(int(shape[0]))
    if len(sizes) != 1:
        raise ValueError(
            f"the leaves of a batch have different first dimensions {sorted(sizes)}; every "
            "array of a batched element must have the same batch size"
        )
    return sizes.pop()


def split_batch(element: Any, sizes: Sequence[int]) -> list[Any]:
    """``element`` cut along its first axis into consecutive pieces of ``sizes``.

    The pieces are views (no copy). ``sum(sizes)`` must equal the batch size.

    Example:
        >>> a, b = split_batch((np.arange(3), np.arange(3) * 10), [2, 1])
        >>> a[1].tolist(), b[0].tolist()
        ([0, 10], [2])
    """
    b = batch_dim(element)
    sizes = [check_count("a sub-batch size", s, 0) for s in sizes]
    if sum(sizes) != b:
        shown = sizes if len(sizes) <= 20 else [*sizes[:20], "..."]
        raise ValueError(
            f"sub-batch sizes {shown} (sum {sum(sizes)}) do not add up to the batch size {b}; "
            f"give sizes that add up to {b}"
        )
    return _slices(element, 0, sizes)


def _slices(element: Any, start: int, sizes: Sequence[int]) -> list[Any]:
    """Consecutive views of ``element`` from row ``start``, one per size."""
    bounds = []
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    if isinstance(element, np.ndarray):  # the common case, without the nest round trip
        return [element[lo:hi] for lo, hi in bounds]
    leaves = nest.flatten(element)
    return [nest.pack_sequence_as(element, [x[lo:hi] for x in leaves]) for lo, hi in bounds]


def empty_like_batch(element: Any) -> Any:
    """A batch shaped like ``element`` with nothing in it (first dimension 0).

    NumPy leaves become new empty arrays (holding no reference to
    ``element``); other array types (CuPy, PyTorch) are sliced ``[:0]``.

    Example:
        >>> empty_like_batch({"x": np.ones((3, 2), np.float32)})["x"].shape
        (0, 2)
    """

    def empty(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray) and leaf.ndim >= 1:
            return np.empty((0, *leaf.shape[1:]), leaf.dtype)
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) == 0:
            raise ValueError(
                f"cannot make an empty batch like {type(leaf).__name__} {leaf!r:.80}: it has "
                "no batch dimension"
            )
        return leaf[:0]

    return nest.map_structure(empty, element)


def empty_from_spec(spec: Any) -> Any:
    """An empty batch for an element spec (a nested ``TensorSpec`` structure).

    Unknown trailing dimensions become 0.

    Example: ``empty_from_spec(TensorSpec((None, 3), np.dtype("float32"))).shape == (0, 3)``.
    """

    def empty(s: Any) -> Any:
        shape = tuple(getattr(s, "shape", ()))
        if len(shape) == 0:
            raise ValueError(f"cannot make an empty batch for the unbatched spec {s!r}")
        return np.empty((0, *(0 if d is None else int(d) for d in shape[1:])), s.dtype)

    return nest.map_structure(empty, spec)


def worker_sub_batches(
    element: Any,
    num_workers: int,
    num_replicas_per_worker: int,
    worker_index: int,
    *,
    own_part_only: bool,
) -> list[Any]:
    """The sub-batches worker ``worker_index`` takes from one global batch ``element``.

    With ``own_part_only`` (DATA sharding: every worker reads every global
    batch) these are the worker's ``R`` sub-batches of it, global sub-batches
    ``w * R .. w * R + R - 1``. Otherwise (FILE sharding, no sharding, one
    worker) all ``W * R`` sub-batches in the worker's rotated order; its
    replicas take them ``R`` at a time.

    Example:
        >>> [s.tolist() for s in worker_sub_batches(np.arange(7), 2, 2, 1, own_part_only=True)]
        [[4, 5], [6]]
    """
    b = element.shape[0] if isinstance(element, np.ndarray) and element.ndim else batch_dim(element)
    w_count, r, w = num_workers, num_replicas_per_worker, worker_index
    if own_part_only:
        global_sizes = _sizes(b, w_count, r, 0)
        sizes = global_sizes[w * r : (w + 1) * r]
        start = sum(global_sizes[: w * r])
    else:
        sizes, start = _sizes(b, w_count, r, w), 0
    if len(sizes) == 1 and sizes[0] == b:
        return [element]
    return _slices(element, start, sizes)


def rebatch_steps(
    elements: Iterable[Any],
    num_workers: int,
    num_replicas_per_worker: int,
    worker_index: int,
    *,
    own_part_only: bool,
) -> Iterator[list[Any]]:
    """The rebatch node: global batches in, one list of ``R`` sub-batches per step out.

    With ``own_part_only`` each global batch gives one step (DATA sharding);
    otherwise it gives ``W`` steps of ``R`` sub-batches each, in the worker's
    rotated order (FILE sharding, no sharding, or one worker: then ``W = 1``
    and one global batch is one step).

    Example:
        >>> steps = rebatch_steps([np.arange(4)], 1, 2, 0, own_part_only=False)
        >>> [[s.tolist() for s in step] for step in steps]
        [[[0, 1], [2, 3]]]
    """
    batch_sizes_for_worker(0, num_workers, num_replicas_per_worker, worker_index)  # checks
    r = num_replicas_per_worker
    for element in elements:
        pieces = worker_sub_batches(
            element, num_workers, r, worker_index, own_part_only=own_part_only
        )
        for i in range(0, len(pieces), r):
            yield pieces[i : i + r]


__all__ = [
    "batch_dim",
    "batch_sizes_for_worker",
    "empty_from_spec",
    "empty_like_batch",
    "find_global_batch_size",
    "rebatch_steps",
    "split_batch",
    "worker_sub_batches",
]
