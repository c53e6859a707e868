"""A small streaming input pipeline with tf.data's semantics: ``Dataset`` and its nodes.

A dataset is a linear chain of nodes. Each node keeps its upstream node in
``_input`` (``None`` for sources), makes a fresh generator of its elements with
``_iter()`` and can be re-attached to another upstream with ``_with_input``;
the distribution layer rewrites pipelines with these three. Elements are
nested tuples and dicts of NumPy arrays (NumPy scalars for 0-d values).
Nothing materialises the whole input: slices are taken lazily, ``batch`` and
``shuffle`` hold only their buffers, files are read one at a time.

Fast paths. When a ``batch`` reads, through ``shuffle``, ``take``, ``skip``,
``shard``, ``repeat`` or ``with_options`` only, from ``from_tensor_slices`` or
``range``, the order of the elements is computed over integer indices and each
batch is gathered at once (``np.take`` on the source arrays); a ``batch`` right
after a file reader cuts batches out of whole files. Both give exactly the
elements, in exactly the order, of the element-by-element path.

Shuffle order. ``shuffle(B, seed)`` follows TF's buffer algorithm. The buffer
is filled with the first ``B`` elements; then, for each further element, a slot
``j`` is drawn uniformly from ``0..B-1``, the element in slot ``j`` is produced
and the new element takes its place. The slots are drawn in chunks,
``rng.integers(0, B, size=65536)``, a new chunk when the previous one is
used up. When the input ends, the ``m`` elements left in the buffer are
produced in the order ``rng.permutation(m)`` of their slots. So with ``B`` at
least the dataset size the order is ``rng.permutation(n)``. The generator is
``np.random.default_rng(seed)`` for the first iteration of a node, then
``default_rng((seed, epoch))`` for its epoch-th (0-based) iteration when
``reshuffle_each_iteration`` is true; ``seed=None`` draws fresh entropy.

Layout. This module holds the constants, the switches tests flip
(``_FAST_PATHS``, ``_SHUFFLE_CHUNK``, ``_PREFETCH_AUTOTUNE``, ``_JOIN_TIMEOUT_S``; the
other modules read them from here at run time) and the ``Dataset`` base class with
its public API. The nodes live in ``source_nodes``, ``transform_nodes`` and
``passthrough_nodes``, which build on this module and register each node class
here (:func:`register_node`; ``Dataset``'s methods create nodes by name, and the
node classes stay importable from here); element helpers and ``TensorSpec`` are in
``structure``, seeded randomness and the vectorised shuffle in ``shuffle``.

Example:
    >>> ds = Dataset.range(8).batch(3)
    >>> [b.tolist() for b in ds]
    [[0, 1, 2], [3, 4, 5], [6, 7]]
    >>> [int(x) for x in Dataset.range(10).shard(3, 1)]
    [1, 4, 7]
    >>> ds.cardinality()
    3
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import is_cupy
from hpcdist.data.options import Options
from hpcdist.data.shuffle import EpochCounter
from hpcdist.data.sources import (
    Hdf5Reader,
    NpyReader,
    NpzReader,
    check_paths,
    glob_files,
)
from hpcdist.data.structure import TensorSpec, map_structure
from hpcdist.errors import NotRegisteredError

if TYPE_CHECKING:  # the node classes, for annotations (at run time: _node and __getattr__)
    from hpcdist.data.passthrough_nodes import (
        PrefetchDataset,
        RepeatDataset,
        ShardDataset,
        SkipDataset,
        TakeDataset,
    )
    from hpcdist.data.source_nodes import (
        FileListDataset,
        GeneratorDataset,
        IndexedSource,
        RangeDataset,
        TensorDataset,
        TensorSliceDataset,
    )
    from hpcdist.data.transform_nodes import (
        BatchDataset,
        FileReaderDataset,
        FilterDataset,
        MapDataset,
        ShuffleDataset,
        UnbatchDataset,
    )

log = logging.getLogger("hpcdist.data")

#: ``cardinality()`` of an infinite dataset (``repeat()``).
INFINITE = -1
#: ``cardinality()`` when it cannot be known without iterating (``filter``, generators, files).
UNKNOWN = -2
#: Let hpcdist choose (``map(num_parallel_calls=AUTOTUNE)``, ``prefetch(AUTOTUNE)``).
AUTOTUNE = -1

_FAST_PATHS = True  # tests switch this off to compare with the element-by-element path
_SHUFFLE_CHUNK = 1 << 16  # slot draws per call of rng.integers (part of the shuffle order)
_PREFETCH_AUTOTUNE = 2  # batches buffered by prefetch(AUTOTUNE)
_JOIN_TIMEOUT_S = 10.0  # how long closing a prefetch iterator waits for its thread


# -- the node registry ---------------------------------------------------------------------
# The node modules (the module docstring's Layout lists them) subclass Dataset, so this
# module cannot import them; each registers itself with @register_node when its module is
# imported (hpcdist.data imports them all), and Dataset's methods build nodes by name.
_Node = TypeVar("_Node", bound="Dataset")
_NODES: dict[str, type[Dataset]] = {}


def register_node(cls: type[_Node]) -> type[_Node]:
    """Make a node class known to :class:`Dataset`'s methods and importable from this module.

    Example: ``@register_node`` above ``class BatchDataset(Dataset): ...``.
    """
    _NODES[cls.__name__] = cls
    return cls


def _node(name: str) -> Any:
    """The registered node class called ``name``."""
    try:
        return _NODES[name]
    except KeyError:
        raise NotRegisteredError(
            f"the dataset node {name} is not registered; expected hpcdist.data to be imported "
            "(it imports every node module)"
        ) from None


def __getattr__(name: str) -> Any:
    """The node classes, importable from here as before (``dataset.BatchDataset``)."""
    if name in _NODES:
        return _NODES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------- Dataset


class Dataset:
    """A streaming dataset: a chain of nodes, iterated with ``for x in dataset``.

    Build one with ``from_tensor_slices``, ``from_tensors``, ``range``,
    ``from_generator``, ``list_files`` or ``from_files`` and chain
    transformations (``batch``, ``shuffle``, ``map`` ...); each returns a new
    dataset and leaves the old one unchanged. Subclasses implement ``_iter``
    (and ``_compute_element_spec`` / ``cardinality`` where the input's are wrong).

    Example:
        >>> ds = Dataset.from_tensor_slices({"x": np.arange(4.0), "y": np.arange(4)})
        >>> [b["y"].tolist() for b in ds.batch(2)]
        [[0, 1], [2, 3]]
    """

    _epochs: EpochCounter  # on the nodes that draw a new order each iteration

    #: Whether producing this node's elements may wait outside the GIL (on I/O, threads or
    #: processes), so that a reading-ahead thread has a wait to fill (see
    #: :mod:`hpcdist.data.distributed`). ``True`` unless a node says otherwise, so a node
    #: type hpcdist does not know is read ahead; the in-memory nodes set ``False``.
    releases_gil: ClassVar[bool] = True

    def __init__(self, input: Dataset | None = None) -> None:
        if input is not None and not isinstance(input, Dataset):
            raise TypeError(
                f"{type(self).__name__}: input is a {type(input).__name__}; expected a Dataset"
            )
        self._input = input
        self._spec_cache: Any = None

    # ---- node protocol
    def _iter(self) -> Generator[Any, None, None]:
        """A fresh generator of this node's elements (one epoch)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _iter")

    def __iter__(self) -> Iterator[Any]:
        return self._iter()

    def _waits_outside_gil(self) -> bool:
        """Whether this node, as configured, may wait outside the GIL (``releases_gil``)."""
        return self.releases_gil

    def _with_input(self, new_input: Dataset) -> Dataset:
        """A copy of this node (same parameters and options) reading from ``new_input``.

        Copies share the node's iteration counter, so ``reshuffle_each_iteration``
        keeps going through pipelines that are rebuilt every epoch.
        """
        if self._input is None:
            raise TypeError(
                f"{type(self).__name__} is a source and has no input to replace; "
                "only transformation nodes can be re-attached with _with_input"
            )
        if not isinstance(new_input, Dataset):
            raise TypeError(f"_with_input got a {type(new_input).__name__}; expected a Dataset")
        new = copy.copy(self)
        new._input = new_input
        new._spec_cache = None
        return new

    def _detached(self) -> Dataset:
        """A copy of the whole chain with fresh iteration counters (for peeking at elements)."""
        new = copy.copy(self)
        if isinstance(getattr(new, "_epochs", None), EpochCounter):
            new._epochs = EpochCounter()
        if self._input is not None:
            new._input = self._input._detached()
        return new

    def _index_source(self) -> IndexedSource | None:
        """The source whose rows the index stream of this node addresses (None: no fast path)."""
        return None

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        """The row indices of the source, in this node's element order, as blocks."""
        raise NotImplementedError

    def _fast_stream(self) -> Iterator[range | np.ndarray] | None:
        if not _FAST_PATHS or self._index_source() is None:
            return None
        return self._index_stream()

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        nodes = []
        node: Dataset | None = self
        while node is not None:
            nodes.append(f"{type(node).__name__}({node._describe()})")
            node = node._input
        return " -> ".join(reversed(nodes))

    # ---- properties
    @property
    def element_spec(self) -> Any:
        """The nested structure of ``TensorSpec`` of one element.

        Example:
            >>> Dataset.range(3).batch(2).element_spec
            TensorSpec(shape=(None,), dtype=dtype('int64'))
        """
        if getattr(self, "_spec_cache", None) is None:
            self._spec_cache = self._compute_element_spec()
        return self._spec_cache

    def _compute_element_spec(self) -> Any:
        if self._input is None:
            raise NotImplementedError(f"{type(self).__name__} does not define its element_spec")
        return self._input.element_spec

    def cardinality(self) -> int:
        """The number of elements; ``INFINITE`` (-1) or ``UNKNOWN`` (-2) where TF gives those.

        Example: ``Dataset.range(10).batch(3).cardinality() == 4``.
        """
        return UNKNOWN

    def __len__(self) -> int:
        n = self.cardinality()
        if n == INFINITE:
            raise TypeError("The dataset is infinite; len() needs a finite dataset")
        if n < 0:
            raise TypeError(
                "The dataset length is unknown (it filters, reads files or a generator); "
                "iterate it to count, or use cardinality()"
            )
        if n > sys.maxsize:  # len() must fit a C ssize_t; Python would raise OverflowError
            raise TypeError(
                f"The dataset has {n} elements, more than len() can return ({sys.maxsize}); "
                "use cardinality()"
            )
        return n

    def __bool__(self) -> bool:
        return True

    def options(self) -> Options:
        """The options of this dataset, merged along the chain (a later ``with_options`` wins).

        Example: ``ds.options().distribute.auto_shard_policy``.
        """
        chain = []
        node: Dataset | None = self
        while node is not None:
            chain.append(node)
            node = node._input
        merged = Options()
        for node in reversed(chain):
            if isinstance(node, _node("_OptionsDataset")):
                merged = merged.merge(node._options)
        return merged

    def with_options(self, options: Options) -> Dataset:
        """This dataset with ``options`` merged over the options it already has.

        Example:
            >>> from hpcdist.data.options import AutoShardPolicy
            >>> o = Options()
            >>> o.distribute.auto_shard_policy = AutoShardPolicy.DATA
            >>> Dataset.range(4).with_options(o).options().distribute.auto_shard_policy.name
            'DATA'
        """
        return _node("_OptionsDataset")(self, options)

    # ---- sources
    @staticmethod
    def from_tensor_slices(tensors: Any) -> TensorSliceDataset:
        """One element per row (first dimension) of the arrays in ``tensors``.

        ``tensors`` is an array, or a nest of tuples and dicts of arrays; a list
        is one array (``[1, 2, 3]`` gives three scalars). The arrays are not copied.

        Example:
            >>> [(int(a), str(b)) for a, b in Dataset.from_tensor_slices(([1, 2], ["a", "b"]))]
            [(1, 'a'), (2, 'b')]
        """
        return _node("TensorSliceDataset")(tensors)

    @staticmethod
    def from_tensors(tensors: Any) -> TensorDataset:
        """A dataset of one element, ``tensors`` itself (converted to arrays, not copied).

        Example:
            >>> [x.tolist() for x in Dataset.from_tensors([1, 2, 3])]
            [[1, 2, 3]]
        """
        return _node("TensorDataset")(tensors)

    @staticmethod
    def range(*args: int, output_type: DTypeLike = np.int64) -> RangeDataset:
        """``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step)`` as int64 scalars.

        Example:
            >>> [int(x) for x in Dataset.range(5, 1, -2)]
            [5, 3]
        """
        return _node("RangeDataset")(*args, output_type=output_type)

    @staticmethod
    def from_generator(
        generator: Callable[..., Iterable[Any]],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
        output_signature: Any = None,
    ) -> GeneratorDataset:
        """Elements from ``generator()`` (called again for every iteration).

        ``output_signature`` (a nest of ``TensorSpec``), or ``output_types`` with
        ``output_shapes``, converts and checks every element; without them the
        first element defines ``element_spec``. TF's positional order is kept
        (``output_types`` second); a nest of ``TensorSpec`` given second is taken
        as ``output_signature``.

        Example:
            >>> def gen():
            ...     yield from ([1, 2], [3, 4])
            >>> ds = Dataset.from_generator(gen, output_signature=TensorSpec((2,), "int32"))
            >>> [x.dtype.name for x in ds]
            ['int32', 'int32']
        """
        return _node("GeneratorDataset")(
            generator, output_types, output_shapes, args, output_signature
        )

    @staticmethod
    def list_files(
        file_pattern: str | os.PathLike | Sequence[str | os.PathLike],
        shuffle: bool | None = None,
        seed: int | None = None,
    ) -> FileListDataset:
        """The file names matching a glob pattern (sorted; shuffled each iteration by default).

        As in TF, ``shuffle=None`` means ``True``: pass ``shuffle=False`` or a
        ``seed`` for a reproducible order (every worker must see the same order
        for FILE sharding). No match raises ``ValueError``.

        Example: ``Dataset.list_files("data/*.npy", shuffle=False).read_npy()``.
        """
        shuffle = True if shuffle is None else bool(shuffle)
        return _node("FileListDataset")(glob_files(file_pattern), shuffle=shuffle, seed=seed)

    @staticmethod
    def from_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> FileListDataset:
        """A dataset of the given file names, in the given order (each must exist).

        Example: ``Dataset.from_files(["a.npz", "b.npz"]).read_npz(["x", "y"])``.
        """
        return _node("FileListDataset")(check_paths(paths), shuffle=False)

    # ---- transformations
    def batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> BatchDataset:
        """Stack ``batch_size`` consecutive elements; the short last batch is kept unless dropped.

        ``num_parallel_calls`` and ``deterministic`` are accepted for TF compatibility
        (batches are always built in order).

        Example:
            >>> [b.tolist() for b in Dataset.range(7).batch(3, drop_remainder=True)]
            [[0, 1, 2], [3, 4, 5]]
        """
        return _node("BatchDataset")(self, batch_size, drop_remainder)

    def unbatch(self) -> UnbatchDataset:
        """Split every element into its rows (the inverse of ``batch``).

        Example:
            >>> [int(x) for x in Dataset.range(5).batch(2).unbatch()]
            [0, 1, 2, 3, 4]
        """
        return _node("UnbatchDataset")(self)

    def shuffle(
        self,
        buffer_size: int,
        seed: int | None = None,
        reshuffle_each_iteration: bool | None = None,
    ) -> ShuffleDataset:
        """Shuffle with a buffer of ``buffer_size`` elements (TF's algorithm, module docstring).

        Example:
            >>> order = [int(x) for x in Dataset.range(5).shuffle(5, seed=1)]
            >>> order == np.random.default_rng(1).permutation(5).tolist()
            True
        """
        return _node("ShuffleDataset")(self, buffer_size, seed, reshuffle_each_iteration)

    def repeat(self, count: int | None = None) -> RepeatDataset:
        """Repeat the dataset ``count`` times (``None`` or -1: forever).

        Example:
            >>> [int(x) for x in Dataset.range(2).repeat(2)]
            [0, 1, 0, 1]
        """
        return _node("RepeatDataset")(self, count)

    def map(
        self,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> MapDataset:
        """Apply ``map_func`` to every element (``map_func(*x)`` when ``x`` is a tuple).

        ``num_parallel_calls`` > 1 or ``AUTOTUNE`` runs it in a thread pool; the
        output order is the input order either way. Like TF's tracing,
        ``element_spec`` calls ``map_func`` on zero-filled example inputs (or, if
        that fails, on the first element of a private copy of the pipeline).

        Example:
            >>> [int(x) for x in Dataset.range(3).map(lambda x: x * 2)]
            [0, 2, 4]
        """
        return _node("MapDataset")(self, map_func, num_parallel_calls, deterministic)

    def filter(self, predicate: Callable[..., Any]) -> FilterDataset:
        """Keep the elements for which ``predicate`` returns true.

        Example:
            >>> [int(x) for x in Dataset.range(6).filter(lambda x: x % 2 == 0)]
            [0, 2, 4]
        """
        return _node("FilterDataset")(self, predicate)

    def take(self, count: int) -> TakeDataset:
        """The first ``count`` elements (-1: all).

        Example:
            >>> [int(x) for x in Dataset.range(10).take(3)]
            [0, 1, 2]
        """
        return _node("TakeDataset")(self, count)

    def skip(self, count: int) -> SkipDataset:
        """All but the first ``count`` elements (-1: skip everything).

        Example:
            >>> [int(x) for x in Dataset.range(5).skip(3)]
            [3, 4]
        """
        return _node("SkipDataset")(self, count)

    def shard(self, num_shards: int, index: int) -> ShardDataset:
        """The elements ``i`` with ``i % num_shards == index``.

        Example:
            >>> [int(x) for x in Dataset.range(10).shard(3, 0)]
            [0, 3, 6, 9]
        """
        return _node("ShardDataset")(self, num_shards, index)

    def prefetch(self, buffer_size: int) -> PrefetchDataset:
        """Produce up to ``buffer_size`` elements ahead in a background thread.

        Example:
            >>> [int(x) for x in Dataset.range(3).prefetch(2)]
            [0, 1, 2]
        """
        return _node("PrefetchDataset")(self, buffer_size)

    def read_npy(self) -> FileReaderDataset:
        """Read each ``.npy`` file named by this dataset; yield its rows (memory-mapped).

        Example: ``Dataset.list_files("x-*.npy", shuffle=False).read_npy().batch(32)``.
        """
        return _node("FileReaderDataset")(self, NpyReader())

    def read_npz(self, keys: str | Sequence[str] | None = None) -> FileReaderDataset:
        """Read each ``.npz`` archive named by this dataset; yield its rows.

        ``keys=None``: dict rows keyed by array name; a list: tuples in that order;
        one name: that array's rows.

        Example: ``Dataset.from_files(paths).read_npz(["x", "y"])`` yields ``(x, y)``.
        """
        return _node("FileReaderDataset")(self, NpzReader(keys))

    def read_hdf5(self, keys: str | Sequence[str]) -> FileReaderDataset:
        """Read the HDF5 datasets ``keys`` of each file named by this dataset (needs h5py).

        Example: ``Dataset.from_files(paths).read_hdf5(["images", "labels"])``.
        """
        return _node("FileReaderDataset")(self, Hdf5Reader(keys))

    def apply(self, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
        """``transformation_func(self)``, for chaining reusable transformations.

        Example: ``ds.apply(lambda d: d.batch(2))``.
        """
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise TypeError(
                f"apply: the transformation returned {type(result).__name__}; expected a Dataset"
            )
        return result

    def as_numpy_iterator(self) -> Iterator[Any]:
        """An iterator of the elements as NumPy values (CuPy arrays are copied to the host).

        Example:
            >>> list(Dataset.from_tensor_slices([1, 2]).as_numpy_iterator())
            [np.int64(1), np.int64(2)]
        """
        for element in self._iter():
            yield map_structure(lambda v: v.get() if is_cupy(v) else v, element)


def _counters(dataset: Any) -> list[EpochCounter]:
    """The iteration counters of ``dataset``'s chain, from the last node to the source."""
    found: list[EpochCounter] = []
    node = dataset
    while isinstance(node, Dataset):
        counter = getattr(node, "_epochs", None)
        if isinstance(counter, EpochCounter) and all(c is not counter for c in found):
            found.append(counter)
        node = node._input
    return found


def iteration_counts(dataset: Any) -> list[int]:
    """How many iterations each counting node of ``dataset`` has started (shuffles, file lists).

    With :func:`set_iteration_counts` it lets a checkpoint put a pipeline back
    where it was, so that the next iteration reshuffles exactly as it would have.
    Anything that is not a ``Dataset`` has no counters (``[]``).

    Example:
        >>> ds = Dataset.range(4).shuffle(4, seed=1)
        >>> _ = list(ds); iteration_counts(ds)
        [1]
    """
    return [c.count for c in _counters(dataset)]


def set_iteration_counts(dataset: Any, counts: Sequence[int]) -> None:
    """Set the counters :func:`iteration_counts` reported (same pipeline, same order).

    Example:
        >>> ds = Dataset.range(4).shuffle(4, seed=1)
        >>> first, second = [int(x) for x in ds], [int(x) for x in ds]
        >>> set_iteration_counts(ds, [1]); [int(x) for x in ds] == second
        True
    """
    counters = _counters(dataset)
    counts = [int(c) for c in counts]
    if len(counts) != len(counters) or any(c < 0 for c in counts):
        raise ValueError(
            f"the pipeline has {len(counters)} counting nodes (shuffle, list_files) but the "
            f"saved iteration counts are {counts}; restore into the same input pipeline"
        )
    for counter, n in zip(counters, counts, strict=True):
        counter.set(n)


def set_iteration_count(dataset: Any, n: int) -> None:
    """Make the next iteration of ``dataset`` behave as its ``n``-th (0-based) one.

    Every counting node gets ``n``: right for pipelines that iterate each node
    once per epoch (no ``repeat`` above a ``shuffle``), as ``Model.fit``'s own
    dataset does. Use :func:`set_iteration_counts` for an exact copy of a state.

    Example:
        >>> ds = Dataset.range(5).shuffle(5, seed=3)
        >>> epochs = [[int(x) for x in ds] for _ in range(3)]
        >>> set_iteration_count(ds, 2); [int(x) for x in ds] == epochs[2]
        True
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n is {n!r}; expected an int >= 0 (the 0-based iteration index)")
    for counter in _counters(dataset):
        counter.set(n)


__all__ = [
    "AUTOTUNE",
    "INFINITE",
    "UNKNOWN",
    "TensorSpec",
    "Dataset",
    "TensorSliceDataset",
    "TensorDataset",
    "RangeDataset",
    "GeneratorDataset",
    "FileListDataset",
    "FileReaderDataset",
    "BatchDataset",
    "UnbatchDataset",
    "ShuffleDataset",
    "RepeatDataset",
    "MapDataset",
    "FilterDataset",
    "TakeDataset",
    "SkipDataset",
    "ShardDataset",
    "PrefetchDataset",
    "iteration_counts",
    "set_iteration_counts",
    "set_iteration_count",
]
