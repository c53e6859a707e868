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
import itertools
import logging
import operator
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, is_cupy
from hpcdist.data.options import Options
from hpcdist.data.sources import (
    FileReader,
    Hdf5Reader,
    NpyReader,
    NpzReader,
    check_paths,
    glob_files,
    rows_of,
    to_path,
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


# --------------------------------------------------------------------------- element structures


def _map_structure(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` applied to every leaf of a nest of tuples (namedtuples) and dicts."""
    if isinstance(x, tuple):
        values = [_map_structure(fn, v) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else tuple(values)
    if isinstance(x, Mapping):
        return {k: _map_structure(fn, v) for k, v in x.items()}
    return fn(x)


def _flatten(x: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) pairs of a nest, e.g. ``[("[0]", a), ("[1]['y']", b)]``."""
    if isinstance(x, tuple):
        return [p for i, v in enumerate(x) for p in _flatten(v, f"{path}[{i}]")]
    if isinstance(x, Mapping):
        return [p for k, v in x.items() for p in _flatten(v, f"{path}[{k!r}]")]
    return [(path or "element", x)]


def _same_structure(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(_same_structure(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and set(a) == set(b)
            and all(_same_structure(a[k], b[k]) for k in a)
        )
    return True


def _to_leaf(v: Any) -> Any:
    """A NumPy array, NumPy scalar (0-d) or CuPy array for any value (lists become arrays)."""
    if isinstance(v, (np.ndarray, np.generic)) or is_cupy(v):
        return v
    a = np.asarray(v)
    return a[()] if a.ndim == 0 else a


def _normalize(x: Any) -> Any:
    return _map_structure(_to_leaf, x)


def _to_arrays(x: Any) -> Any:
    """Leaves as arrays (never copied): TF's conversion of nested inputs to tensors."""
    return _map_structure(
        lambda v: v if isinstance(v, np.ndarray) or is_cupy(v) else np.asarray(v), x
    )


def _row(a: Any, i: Any) -> Any:
    """Row ``i`` of ``a`` as a copy (a NumPy scalar for 1-d arrays)."""
    r = a[i]
    if isinstance(r, np.ndarray):
        return np.array(r)
    return r.copy() if is_cupy(r) else r


def _call(fn: Callable[..., Any], element: Any) -> Any:
    """TF's calling convention: a tuple element is spread over positional arguments."""
    return fn(*element) if isinstance(element, tuple) else fn(element)


def _stack(elements: list[Any], what: str = "batch") -> Any:
    first = elements[0]
    try:
        if isinstance(first, tuple):
            parts = [_stack([e[i] for e in elements], what) for i in range(len(first))]
            return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
        if isinstance(first, Mapping):
            return {k: _stack([e[k] for e in elements], what) for k in first}
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(
            f"{what}: the elements do not all have the same structure as the first one "
            f"({_structure_text(first)}); make every element the same nest of arrays"
        ) from err
    try:
        return array_module(first).stack(elements)
    except ValueError as err:
        shapes = sorted({tuple(np.shape(e)) for e in elements})
        raise ValueError(
            f"{what}: cannot stack elements of different shapes {shapes[:4]}; batch needs "
            "equal shapes, so map the elements to a common shape first"
        ) from err


def _structure_text(x: Any) -> str:
    return ", ".join(path for path, _ in _flatten(x))


def _num_rows(x: Any, what: str) -> int:
    sizes = {}
    for path, a in _flatten(x):
        shape = np.shape(a)
        if len(shape) == 0:
            raise ValueError(
                f"{what}: component {path} is a scalar; it needs a first dimension to be "
                "split into rows"
            )
        sizes[path] = shape[0]
    if len(set(sizes.values())) > 1:
        found = ", ".join(f"{p}: {n}" for p, n in sizes.items())
        raise ValueError(
            f"{what}: the components have different sizes in their first dimension ({found}); "
            "every component must have the same number of rows"
        )
    if not sizes:
        raise ValueError(f"{what}: the structure has no arrays; give at least one array")
    return next(iter(sizes.values()))


# ------------------------------------------------------------------------------------ TensorSpec


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one component of an element; ``None`` marks an unknown dimension.

    Example:
        >>> TensorSpec((None, 3), "float32")
        TensorSpec(shape=(None, 3), dtype=dtype('float32'))
        >>> TensorSpec((None, 3), "float32").is_compatible_with(np.zeros((5, 3), np.float32))
        True
    """

    shape: tuple[int | None, ...]
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self) -> None:
        try:
            shape = tuple(None if d is None else operator.index(d) for d in self.shape)
        except TypeError as err:
            raise TypeError(
                f"TensorSpec shape is {self.shape!r}; expected a sequence of ints or None"
            ) from err
        dtype = np.dtype(self.dtype)
        if dtype.kind in "US":  # strings: the length is not part of the type (TF's tf.string)
            dtype = np.dtype(dtype.kind)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    @classmethod
    def from_value(cls, value: Any) -> TensorSpec:
        """The spec of an array or scalar.

        Example: ``TensorSpec.from_value(np.int64(3)) == TensorSpec((), np.int64)``.
        """
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            value = np.asarray(value)
        return cls(tuple(value.shape), value.dtype)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether ``value`` (an array or a spec) has this dtype and a matching shape.

        Example: ``TensorSpec((None,), "int64").is_compatible_with(np.arange(4))`` is ``True``.
        """
        other = value if isinstance(value, TensorSpec) else TensorSpec.from_value(value)
        if other.dtype != self.dtype or len(other.shape) != len(self.shape):
            return False
        return all(
            a is None or b is None or a == b for a, b in zip(self.shape, other.shape, strict=True)
        )


def _spec_of(element: Any) -> Any:
    return _map_structure(TensorSpec.from_value, element)


def _unify_specs(a: Any, b: Any) -> Any:
    """The spec of two traced outputs: dimensions that differ become None."""
    if not _same_structure(a, b):
        raise _TraceFailed("the structure depends on the input shape")
    flat_b = iter([s for _, s in _flatten(b)])

    def unify(sa: TensorSpec) -> TensorSpec:
        sb = next(flat_b)
        if len(sa.shape) != len(sb.shape) or sa.dtype != sb.dtype:
            raise _TraceFailed("the rank or dtype depends on the input shape")
        return TensorSpec(
            tuple(x if x == y else None for x, y in zip(sa.shape, sb.shape, strict=True)), sa.dtype
        )

    return _map_structure(unify, a)


class _TraceFailed(Exception):
    pass


def _example_element(spec: Any, fill: int) -> Any:
    def zeros(s: TensorSpec) -> Any:
        a = np.zeros(tuple(fill if d is None else d for d in s.shape), dtype=s.dtype)
        return a[()] if a.ndim == 0 else a

    return _map_structure(zeros, spec)


# ------------------------------------------------------------------------------- small helpers


def _check_int(value: Any, what: str, name: str, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: {name} is {value!r}; expected an integer {hint}")
    if int(value) < minimum:
        raise ValueError(f"{what}: {name} is {int(value)}; expected {hint}")
    return int(value)


def _check_seed(seed: Any, what: str) -> int | None:
    if seed is None:
        return None
    return _check_int(seed, what, "seed", 0, "seed >= 0 (or None for a random order)")


class _EpochCounter:
    """How many iterations a node has started (shared by the copies ``_with_input`` makes)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            n = self._count
            self._count += 1
            return n


def _epoch_rng(seed: int | None, reshuffle: bool, counter: _EpochCounter) -> np.random.Generator:
    """The generator of one iteration (see the module docstring for the rule)."""
    epoch = counter.next()
    if seed is None:
        return np.random.default_rng()
    if not reshuffle or epoch == 0:
        return np.random.default_rng(seed)
    return np.random.default_rng((seed, epoch))


def _fixed_random_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1, np.uint32)[0])


def _rechunk(
    blocks: Iterable[Any],
    size: int,
    drop_remainder: bool,
    length: Callable[[Any], int],
    cut: Callable[[Any, int, int], Any],
    join: Callable[[list[Any]], Any],
) -> Iterator[Any]:
    """Cut a stream of blocks of rows into pieces of ``size`` rows (the last may be short)."""
    pending: list[Any] = []
    have = 0
    for block in blocks:
        n = length(block)
        pos = 0
        if have:
            piece = cut(block, 0, min(size - have, n))
            pending.append(piece)
            pos = length(piece)
            have += pos
            if have < size:
                continue
            yield join(pending)
            pending, have = [], 0
        while n - pos >= size:
            yield cut(block, pos, pos + size)
            pos += size
        if pos < n:
            pending, have = [cut(block, pos, n)], n - pos
    if have and not drop_remainder:
        yield join(pending)


def _index_array(block: range | np.ndarray) -> np.ndarray:
    if isinstance(block, range):
        return np.arange(block.start, block.stop, block.step, dtype=np.int64)
    return block


def _join_indices(pieces: list[range | np.ndarray]) -> range | np.ndarray:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate([_index_array(p) for p in pieces])


class _BlockReader:
    """Reads a stream of index blocks (ranges or int arrays) ``k`` indices at a time."""

    def __init__(self, blocks: Iterator[range | np.ndarray]) -> None:
        self._blocks = blocks
        self._block: range | np.ndarray = range(0)
        self._pos = 0

    def read(self, k: int) -> range | np.ndarray:
        """Up to ``k`` next indices (fewer only at the end of the stream)."""
        pieces = []
        while k > 0:
            if self._pos >= len(self._block):
                nxt = next(self._blocks, None)
                if nxt is None:
                    break
                self._block, self._pos = nxt, 0
                continue
            piece = self._block[self._pos : self._pos + k]
            self._pos += len(piece)
            k -= len(piece)
            pieces.append(piece)
        if not pieces:
            return range(0)
        return _join_indices(pieces)


def _shuffle_indices(
    blocks: Iterator[range | np.ndarray], buffer_size: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """TF's buffer shuffle over a stream of indices, vectorised chunk by chunk.

    Gives exactly the order of the element-by-element algorithm in
    ``ShuffleDataset._iter_buffered`` with the same generator.
    """
    reader = _BlockReader(blocks)
    first = reader.read(buffer_size)
    if len(first) < buffer_size:  # the whole input fits in the buffer
        if len(first):
            perm = rng.permutation(len(first))
            if isinstance(first, range):
                yield perm if first == range(len(first)) else first.start + perm * first.step
            else:
                yield first[perm]
        return
    slots = np.array(_index_array(first), dtype=np.int64)  # slot -> index held there
    while True:
        new = _index_array(reader.read(_SHUFFLE_CHUNK))
        c = len(new)
        if c == 0:
            break
        picks = rng.integers(0, buffer_size, size=_SHUFFLE_CHUNK)[:c]
        # Sort the steps by (slot, step): a slot picked again within this chunk gives the
        # element stored at its previous pick; a slot's first pick gives what it held before.
        shift = max(1, (c - 1).bit_length())
        key = (picks << shift) | np.arange(c)
        key.sort()
        slot_sorted = key >> shift
        step_sorted = key & ((1 << shift) - 1)
        same = slot_sorted[1:] == slot_sorted[:-1]
        before = slots[slot_sorted]
        stored = new[step_sorted]
        np.copyto(before[1:], stored[:-1], where=same)
        out = np.empty(c, np.int64)
        out[step_sorted] = before
        ends = np.flatnonzero(~same)  # the last pick of each slot (but the final one)
        slots[slot_sorted[ends]] = stored[ends]
        slots[slot_sorted[-1]] = stored[-1]
        yield out
    yield slots[rng.permutation(buffer_size)]


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

    def __init__(self, input: Dataset | None = None) -> None:
        if input is not None and not isinstance(input, Dataset):
            raise TypeError(
                f"{type(self).__name__}: input is a {type(input).__name__}; expected a Dataset"
            )
        self._input = input
        self._spec_cache: Any = None

    # ---- node protocol
    def _iter(self) -> Iterator[Any]:
        """A fresh generator of this node's elements (one epoch)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _iter")

    def __iter__(self) -> Iterator[Any]:
        return self._iter()

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
        if isinstance(getattr(new, "_epochs", None), _EpochCounter):
            new._epochs = _EpochCounter()
        if self._input is not None:
            new._input = self._input._detached()
        return new

    def _index_source(self) -> _IndexedSource | None:
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
            if isinstance(node, _OptionsDataset):
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
        return _OptionsDataset(self, options)

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
        return TensorSliceDataset(tensors)

    @staticmethod
    def from_tensors(tensors: Any) -> TensorDataset:
        """A dataset of one element, ``tensors`` itself (converted to arrays, not copied).

        Example:
            >>> [x.tolist() for x in Dataset.from_tensors([1, 2, 3])]
            [[1, 2, 3]]
        """
        return TensorDataset(tensors)

    @staticmethod
    def range(*args: int, output_type: Any = np.int64) -> RangeDataset:
        """``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step)`` as int64 scalars.

        Example:
            >>> [int(x) for x in Dataset.range(5, 1, -2)]
            [5, 3]
        """
        return RangeDataset(*args, output_type=output_type)

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
        return GeneratorDataset(generator, output_types, output_shapes, args, output_signature)

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
        return FileListDataset(glob_files(file_pattern), shuffle=shuffle, seed=seed)

    @staticmethod
    def from_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> FileListDataset:
        """A dataset of the given file names, in the given order (each must exist).

        Example: ``Dataset.from_files(["a.npz", "b.npz"]).read_npz(["x", "y"])``.
        """
        return FileListDataset(check_paths(paths), shuffle=False)

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
        return BatchDataset(self, batch_size, drop_remainder)

    def unbatch(self) -> UnbatchDataset:
        """Split every element into its rows (the inverse of ``batch``).

        Example:
            >>> [int(x) for x in Dataset.range(5).batch(2).unbatch()]
            [0, 1, 2, 3, 4]
        """
        return UnbatchDataset(self)

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
        return ShuffleDataset(self, buffer_size, seed, reshuffle_each_iteration)

    def repeat(self, count: int | None = None) -> RepeatDataset:
        """Repeat the dataset ``count`` times (``None`` or -1: forever).

        Example:
            >>> [int(x) for x in Dataset.range(2).repeat(2)]
            [0, 1, 0, 1]
        """
        return RepeatDataset(self, count)

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
        return MapDataset(self, map_func, num_parallel_calls, deterministic)

    def filter(self, predicate: Callable[..., Any]) -> FilterDataset:
        """Keep the elements for which ``predicate`` returns true.

        Example:
            >>> [int(x) for x in Dataset.range(6).filter(lambda x: x % 2 == 0)]
            [0, 2, 4]
        """
        return FilterDataset(self, predicate)

    def take(self, count: int) -> TakeDataset:
        """The first ``count`` elements (-1: all).

        Example:
            >>> [int(x) for x in Dataset.range(10).take(3)]
            [0, 1, 2]
        """
        return TakeDataset(self, count)

    def skip(self, count: int) -> SkipDataset:
        """All but the first ``count`` elements (-1: skip everything).

        Example:
            >>> [int(x) for x in Dataset.range(5).skip(3)]
            [3, 4]
        """
        return SkipDataset(self, count)

    def shard(self, num_shards: int, index: int) -> ShardDataset:
        """The elements ``i`` with ``i % num_shards == index``.

        Example:
            >>> [int(x) for x in Dataset.range(10).shard(3, 0)]
            [0, 3, 6, 9]
        """
        return ShardDataset(self, num_shards, index)

    def prefetch(self, buffer_size: int) -> PrefetchDataset:
        """Produce up to ``buffer_size`` elements ahead in a background thread.

        Example:
            >>> [int(x) for x in Dataset.range(3).prefetch(2)]
            [0, 1, 2]
        """
        return PrefetchDataset(self, buffer_size)

    def read_npy(self) -> FileReaderDataset:
        """Read each ``.npy`` file named by this dataset; yield its rows (memory-mapped).

        Example: ``Dataset.list_files("x-*.npy", shuffle=False).read_npy().batch(32)``.
        """
        return FileReaderDataset(self, NpyReader())

    def read_npz(self, keys: str | Sequence[str] | None = None) -> FileReaderDataset:
        """Read each ``.npz`` archive named by this dataset; yield its rows.

        ``keys=None``: dict rows keyed by array name; a list: tuples in that order;
        one name: that array's rows.

        Example: ``Dataset.from_files(paths).read_npz(["x", "y"])`` yields ``(x, y)``.
        """
        return FileReaderDataset(self, NpzReader(keys))

    def read_hdf5(self, keys: str | Sequence[str]) -> FileReaderDataset:
        """Read the HDF5 datasets ``keys`` of each file named by this dataset (needs h5py).

        Example: ``Dataset.from_files(paths).read_hdf5(["images", "labels"])``.
        """
        return FileReaderDataset(self, Hdf5Reader(keys))

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
            yield _map_structure(lambda v: v.get() if is_cupy(v) else v, element)


# --------------------------------------------------------------------------------------- sources


class _IndexedSource(Dataset):
    """A source whose rows can be addressed by index (the fast paths gather from it)."""

    def _num_rows(self) -> int:
        raise NotImplementedError

    def _take(self, rows: range | np.ndarray) -> Any:
        """The batch of the given rows (a copy)."""
        raise NotImplementedError

    def _index_source(self) -> _IndexedSource | None:
        return self

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        n = self._num_rows()
        if n:
            yield range(n)

    def cardinality(self) -> int:
        return self._num_rows()


class TensorSliceDataset(_IndexedSource):
    """The source of ``Dataset.from_tensor_slices``: row ``i`` of every array is element ``i``.

    Example:
        >>> ds = TensorSliceDataset({"a": np.zeros((3, 2))})
        >>> ds.cardinality(), ds.element_spec["a"].shape
        (3, (2,))
    """

    def __init__(self, tensors: Any) -> None:
        super().__init__(None)
        self._arrays = _to_arrays(tensors)
        self._n = _num_rows(self._arrays, "from_tensor_slices")

    def _num_rows(self) -> int:
        return self._n

    def _iter(self) -> Iterator[Any]:
        arrays = self._arrays
        if not isinstance(arrays, (tuple, Mapping)):
            for i in range(self._n):
                yield _row(arrays, i)
            return
        for i in range(self._n):
            yield _map_structure(lambda a, i=i: _row(a, i), arrays)

    def _take(self, rows: range | np.ndarray) -> Any:
        arrays = self._arrays
        if type(arrays) is np.ndarray and type(rows) is np.ndarray:  # the hot case
            return arrays.take(rows, axis=0)
        if isinstance(rows, range):
            sl = slice(rows.start, rows.stop, rows.step)
            return _map_structure(
                lambda a: a[sl].copy() if is_cupy(a) else np.array(a[sl]), self._arrays
            )

        def gather(a: Any) -> Any:
            if is_cupy(a):
                return a[array_module(a).asarray(rows)]
            return np.asarray(np.take(a, rows, axis=0))

        return _map_structure(gather, self._arrays)

    def _compute_element_spec(self) -> Any:
        return _map_structure(lambda a: TensorSpec(tuple(a.shape[1:]), a.dtype), self._arrays)

    def _describe(self) -> str:
        return f"rows={self._n}"


class TensorDataset(Dataset):
    """The source of ``Dataset.from_tensors``: one element.

    Example:
        >>> [x.shape for x in TensorDataset(np.zeros((2, 3)))]
        [(2, 3)]
    """

    def __init__(self, tensors: Any) -> None:
        super().__init__(None)
        self._value = _normalize(tensors)

    def _iter(self) -> Iterator[Any]:
        yield self._value

    def cardinality(self) -> int:
        return 1

    def _compute_element_spec(self) -> Any:
        return _spec_of(self._value)


class RangeDataset(_IndexedSource):
    """The source of ``Dataset.range``: NumPy int64 scalars (or ``output_type``).

    Example:
        >>> RangeDataset(2, 9, 3).cardinality()
        3
    """

    def __init__(self, *args: int, output_type: Any = np.int64) -> None:
        super().__init__(None)
        if not 1 <= len(args) <= 3:
            raise TypeError(
                f"range takes 1 to 3 arguments (stop | start, stop | start, stop, step); "
                f"got {len(args)}"
            )
        values = [_check_int(a, "range", "argument", -(2**63), "an integer") for a in args]
        if len(values) == 3 and values[2] == 0:
            raise ValueError("range: step is 0; expected a non-zero step")
        self._range = range(*values)
        self.output_type = np.dtype(output_type)

    def _num_rows(self) -> int:
        return len(self._range)

    def _iter(self) -> Iterator[Any]:
        make = self.output_type.type
        for v in self._range:
            yield make(v)

    def _take(self, rows: range | np.ndarray) -> Any:
        r = self._range
        return (r.start + _index_array(rows) * r.step).astype(self.output_type)

    def _compute_element_spec(self) -> Any:
        return TensorSpec((), self.output_type)

    def _describe(self) -> str:
        r = self._range
        return f"{r.start}, {r.stop}, {r.step}"


class GeneratorDataset(Dataset):
    """The source of ``Dataset.from_generator``: ``generator(*args)`` is called per iteration.

    Example:
        >>> ds = GeneratorDataset(lambda: iter([(1, 2.0)]))
        >>> ds.element_spec
        (TensorSpec(shape=(), dtype=dtype('int64')), TensorSpec(shape=(), dtype=dtype('float64')))
    """

    def __init__(
        self,
        generator: Callable[..., Iterable[Any]],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
        output_signature: Any = None,
    ) -> None:
        super().__init__(None)
        if not callable(generator):
            raise TypeError(
                f"from_generator: generator is a {type(generator).__name__}, not a callable; "
                "pass the generator function itself (from_generator(gen), not gen()) so that "
                "every iteration can start it again"
            )
        self.generator = generator
        self.args = tuple(args or ())
        self.output_signature = _signature(output_signature, output_types, output_shapes)

    def _iter(self) -> Iterator[Any]:
        signature = self.output_signature
        source = self.generator(*self.args)
        try:
            for i, element in enumerate(source):
                if signature is None:
                    yield _normalize(element)
                else:
                    yield _conform(element, signature, i)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _compute_element_spec(self) -> Any:
        signature = self.output_signature
        if signature is not None and not any(
            isinstance(s, _AnyShapeSpec) for _, s in _flatten(signature)
        ):
            return signature
        with closing(self._iter()) as it:
            first = next(it, None)
        if first is None:
            raise ValueError(
                "from_generator: the generator yields nothing, so element_spec cannot be "
                "inferred; pass output_signature"
            )
        return _spec_of(first)

    def _describe(self) -> str:
        return getattr(self.generator, "__name__", "generator")


def _signature(signature: Any, types: Any, shapes: Any) -> Any:
    """The signature as a nest of TensorSpec (``_AnyShapeSpec``: only the dtype is known)."""
    if signature is None and shapes is None and types is not None:
        leaves = [leaf for _, leaf in _flatten(types)]
        if leaves and all(isinstance(leaf, TensorSpec) for leaf in leaves):
            signature, types = types, None  # from_generator(gen, signature) given positionally
    if signature is not None:
        if types is not None or shapes is not None:
            raise TypeError(
                "from_generator: give output_signature, or output_types (with output_shapes), "
                "not both"
            )
        for path, leaf in _flatten(signature):
            if not isinstance(leaf, TensorSpec):
                raise TypeError(
                    f"from_generator: output_signature has {leaf!r} at {path}; expected a "
                    "TensorSpec (hpcdist.data.dataset.TensorSpec) for every component"
                )
        return signature
    if types is None:
        if shapes is not None:
            raise TypeError("from_generator: output_shapes needs output_types")
        return None
    if shapes is None:
        return _map_structure(lambda t: _AnyShapeSpec((), t), types)
    it = iter(_shapes_like(types, shapes))
    return _map_structure(lambda t: TensorSpec(next(it), t), types)


class _AnyShapeSpec(TensorSpec):
    """A dtype from ``output_types`` without ``output_shapes``: the shape is not checked."""


def _shapes_like(types: Any, shapes: Any) -> list[tuple[int | None, ...]]:
    """The shapes matched to the leaves of ``types`` (a shape is a tuple/list of dims)."""

    def is_shape(s: Any) -> bool:
        return isinstance(s, (list, tuple)) and all(d is None or isinstance(d, int) for d in s)

    out: list[tuple[int | None, ...]] = []

    def walk(t: Any, s: Any) -> None:
        if isinstance(t, (tuple, Mapping)):
            keys = list(t) if isinstance(t, Mapping) else range(len(t))
            try:
                for k in keys:
                    walk(t[k], s[k])
            except (KeyError, IndexError, TypeError) as err:
                raise TypeError(
                    f"from_generator: output_shapes {shapes!r} does not match the structure of "
                    f"output_types {types!r}"
                ) from err
            return
        if not is_shape(s):
            raise TypeError(f"from_generator: {s!r} in output_shapes is not a shape (ints/None)")
        out.append(tuple(s))

    walk(types, shapes)
    return out


def _conform(element: Any, signature: Any, index: int) -> Any:
    """``element`` converted to the signature's dtypes, its shapes checked."""
    if isinstance(signature, tuple) and isinstance(element, list):
        element = tuple(element)
    if not _same_structure(signature, element):
        raise TypeError(
            f"from_generator: element {index} has structure {_structure_text(element)!r}; "
            f"the output signature expects {_structure_text(signature)!r}"
        )
    specs = iter([s for _, s in _flatten(signature)])

    def convert(v: Any) -> Any:
        spec = next(specs)
        try:
            a = np.asarray(v, dtype=spec.dtype)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"from_generator: element {index} has {v!r}, which cannot be converted to "
                f"{spec.dtype}"
            ) from err
        if not isinstance(spec, _AnyShapeSpec) and not spec.is_compatible_with(a):
            raise ValueError(
                f"from_generator: element {index} has shape {a.shape}; the output signature "
                f"expects {spec.shape}"
            )
        return a[()] if a.ndim == 0 else a

    return _map_structure(convert, _pack_as(signature, element))


def _pack_as(signature: Any, element: Any) -> Any:
    if isinstance(signature, tuple):
        parts = [_pack_as(s, e) for s, e in zip(signature, element, strict=True)]
        return type(signature)(*parts) if hasattr(signature, "_fields") else tuple(parts)
    if isinstance(signature, Mapping):
        return {k: _pack_as(signature[k], element[k]) for k in signature}
    return element


class FileListDataset(Dataset):
    """File names (str): the source of ``list_files`` and ``from_files``.

    ``files`` is the sorted (``list_files``) or given (``from_files``) order;
    with ``shuffle`` every iteration yields them in a permutation drawn as for
    ``shuffle(len(files), seed)``.

    Example:
        >>> FileListDataset(("b.npy", "a.npy")).files
        ('b.npy', 'a.npy')
    """

    def __init__(
        self, files: Sequence[str], shuffle: bool = False, seed: int | None = None
    ) -> None:
        super().__init__(None)
        self.files = tuple(to_path(f, "FileListDataset") for f in files)
        self.shuffle = bool(shuffle)
        self.seed = _check_seed(seed, "list_files")
        self._epochs = _EpochCounter()

    def _iter(self) -> Iterator[str]:
        if not self.shuffle:
            yield from self.files
            return
        rng = _epoch_rng(self.seed, True, self._epochs)
        for i in rng.permutation(len(self.files)):
            yield self.files[i]

    def cardinality(self) -> int:
        return len(self.files)

    def _compute_element_spec(self) -> Any:
        return TensorSpec((), np.str_)

    def _describe(self) -> str:
        return f"files={len(self.files)}, shuffle={self.shuffle}, seed={self.seed}"


# ------------------------------------------------------------------------------- transformations


class BatchDataset(Dataset):
    """``batch``: ``batch_size`` consecutive elements stacked per component.

    Example:
        >>> b = BatchDataset(Dataset.range(5), 2, drop_remainder=False)
        >>> b.batch_size, b.drop_remainder, b.cardinality()
        (2, False, 3)
    """

    def __init__(self, input: Dataset, batch_size: int, drop_remainder: bool = False) -> None:
        super().__init__(input)
        self.batch_size = _check_int(
            batch_size, "batch", "batch_size", 1, "batch_size >= 1 (elements per batch)"
        )
        self.drop_remainder = bool(drop_remainder)

    def _iter(self) -> Iterator[Any]:
        size, drop = self.batch_size, self.drop_remainder
        stream = self._input._fast_stream()
        if stream is not None:
            source = self._input._index_source()
            assert source is not None
            pieces = _rechunk(stream, size, drop, len, lambda b, s, e: b[s:e], _join_indices)
            for rows in pieces:
                yield source._take(rows)
            return
        if _FAST_PATHS and isinstance(self._input, FileReaderDataset):
            yield from _rechunk(
                self._input._file_arrays(), size, drop, _block_rows, _cut_rows, _concat_rows
            )
            return
        with closing(self._input._iter()) as it:
            buffer: list[Any] = []
            for element in it:
                buffer.append(element)
                if len(buffer) == size:
                    yield _stack(buffer)
                    buffer = []
            if buffer and not drop:
                yield _stack(buffer)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        return n // self.batch_size if self.drop_remainder else -(-n // self.batch_size)

    def _compute_element_spec(self) -> Any:
        dim = self.batch_size if self.drop_remainder else None
        return _map_structure(
            lambda s: TensorSpec((dim, *s.shape), s.dtype), self._input.element_spec
        )

    def _describe(self) -> str:
        return f"batch_size={self.batch_size}, drop_remainder={self.drop_remainder}"


def _block_rows(block: Any) -> int:
    return int(np.shape(_flatten(block)[0][1])[0])


def _cut_rows(block: Any, start: int, stop: int) -> Any:
    return _map_structure(lambda a: np.array(a[start:stop]), block)


def _concat_rows(pieces: list[Any]) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    flat = [[leaf for _, leaf in _flatten(p)] for p in pieces]
    joined = iter([np.concatenate(parts) for parts in zip(*flat, strict=True)])
    return _map_structure(lambda _: next(joined), pieces[0])


class UnbatchDataset(Dataset):
    """``unbatch``: every row of every element becomes an element.

    Example:
        >>> [int(x) for x in UnbatchDataset(Dataset.from_tensors([1, 2]))]
        [1, 2]
    """

    def _iter(self) -> Iterator[Any]:
        with closing(self._input._iter()) as it:
            for element in it:
                n = _num_rows(element, "unbatch")
                for i in range(n):
                    yield _map_structure(lambda a, i=i: _row(a, i), element)

    def _compute_element_spec(self) -> Any:
        def drop_first(s: TensorSpec) -> TensorSpec:
            if not s.shape:
                raise ValueError("unbatch: the elements are scalars; there is nothing to unbatch")
            return TensorSpec(s.shape[1:], s.dtype)

        return _map_structure(drop_first, self._input.element_spec)


class ShuffleDataset(Dataset):
    """``shuffle``: TF's buffer shuffle (the exact order is in the module docstring).

    With a ``seed`` the order of each iteration is reproducible; with
    ``reshuffle_each_iteration`` (default) each iteration of the node has its
    own order, else every iteration repeats the first one.

    Example:
        >>> ds = ShuffleDataset(Dataset.range(6), 6, seed=0, reshuffle_each_iteration=True)
        >>> first, second = [int(x) for x in ds], [int(x) for x in ds]
        >>> sorted(first) == sorted(second) == list(range(6)), first != second
        (True, True)
    """

    def __init__(
        self,
        input: Dataset,
        buffer_size: int,
        seed: int | None = None,
        reshuffle_each_iteration: bool | None = None,
    ) -> None:
        super().__init__(input)
        self.buffer_size = _check_int(
            buffer_size, "shuffle", "buffer_size", 1, "buffer_size >= 1 (elements held)"
        )
        self.seed = _check_seed(seed, "shuffle")
        self.reshuffle_each_iteration = (
            True if reshuffle_each_iteration is None else bool(reshuffle_each_iteration)
        )
        if self.seed is None and not self.reshuffle_each_iteration:
            self._seed_used: int | None = _fixed_random_seed()  # same order every iteration
        else:
            self._seed_used = self.seed
        self._epochs = _EpochCounter()

    def _rng(self) -> np.random.Generator:
        return _epoch_rng(self._seed_used, self.reshuffle_each_iteration, self._epochs)

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        upstream = self._input._index_stream()
        yield from _shuffle_indices(upstream, self.buffer_size, self._rng())

    def _iter(self) -> Iterator[Any]:
        stream = self._fast_stream()
        if stream is None:
            yield from self._iter_buffered()
            return
        source = self._index_source()
        assert source is not None
        for block in stream:
            for start in range(0, len(block), 1024):
                batch = source._take(block[start : start + 1024])
                yield from _unstack(batch)

    def _iter_buffered(self) -> Iterator[Any]:
        """The element-by-element buffer algorithm (the definition of the order)."""
        size = self.buffer_size
        rng = self._rng()
        buffer: list[Any] = []
        picks = np.empty(0, np.int64)
        used = 0
        with closing(self._input._iter()) as it:
            for element in it:
                if len(buffer) < size:
                    buffer.append(element)
                    continue
                if used == len(picks):
                    picks, used = rng.integers(0, size, size=_SHUFFLE_CHUNK), 0
                slot = picks[used]
                used += 1
                out = buffer[slot]
                buffer[slot] = element
                yield out
        for slot in rng.permutation(len(buffer)):
            out, buffer[slot] = buffer[slot], None
            yield out

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _describe(self) -> str:
        return (
            f"buffer_size={self.buffer_size}, seed={self.seed}, "
            f"reshuffle_each_iteration={self.reshuffle_each_iteration}"
        )


def _unstack(batch: Any) -> Iterator[Any]:
    n = _block_rows(batch)
    if not isinstance(batch, (tuple, Mapping)):
        yield from (batch[i] if batch.ndim == 1 else batch[i].copy() for i in range(n))
        return
    for i in range(n):
        yield _map_structure(lambda a, i=i: a[i] if a.ndim == 1 else a[i].copy(), batch)


class RepeatDataset(Dataset):
    """``repeat``: the input ``count`` times (``None``/-1: forever; stops if an epoch is empty).

    Example:
        >>> RepeatDataset(Dataset.range(3), 2).cardinality()
        6
        >>> RepeatDataset(Dataset.range(3)).cardinality() == INFINITE
        True
    """

    def __init__(self, input: Dataset, count: int | None = None) -> None:
        super().__init__(input)
        self.count = (
            -1
            if count is None
            else _check_int(
                count, "repeat", "count", -1, "count >= 0, or -1/None to repeat forever"
            )
        )

    def _epochs_range(self) -> Iterable[int]:
        return itertools.count() if self.count < 0 else range(self.count)

    def _iter(self) -> Iterator[Any]:
        for _ in self._epochs_range():
            produced = False
            with closing(self._input._iter()) as it:
                for element in it:
                    produced = True
                    yield element
            if not produced:
                return

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        for _ in self._epochs_range():
            produced = False
            for block in self._input._index_stream():
                produced = produced or len(block) > 0
                yield block
            if not produced:
                return

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if self.count < 0:
            return 0 if n == 0 else INFINITE
        if self.count == 0:
            return 0
        return n if n < 0 else n * self.count

    def _describe(self) -> str:
        return f"count={self.count}"


class MapDataset(Dataset):
    """``map``: ``map_func`` applied to every element, in order (optionally in threads).

    Example:
        >>> [int(x) for x in MapDataset(Dataset.range(4), lambda x: x + 1, num_parallel_calls=2)]
        [1, 2, 3, 4]
    """

    def __init__(
        self,
        input: Dataset,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> None:
        super().__init__(input)
        if not callable(map_func):
            raise TypeError(f"map: map_func is a {type(map_func).__name__}; expected a callable")
        self.map_func = map_func
        if num_parallel_calls is not None and num_parallel_calls != AUTOTUNE:
            _check_int(
                num_parallel_calls,
                "map",
                "num_parallel_calls",
                1,
                "num_parallel_calls >= 1, AUTOTUNE (-1) or None",
            )
        self.num_parallel_calls = num_parallel_calls
        self.deterministic = deterministic

    def _threads(self) -> int:
        if self.num_parallel_calls == AUTOTUNE:
            return os.cpu_count() or 1
        return int(self.num_parallel_calls or 1)

    def _iter(self) -> Iterator[Any]:
        fn, threads = self.map_func, self._threads()
        with closing(self._input._iter()) as it:
            if threads <= 1:
                for element in it:
                    yield _normalize(_call(fn, element))
            else:
                yield from _parallel_map(it, fn, threads)

    def _compute_element_spec(self) -> Any:
        spec = self._input.element_spec
        try:
            with np.errstate(all="ignore"):
                first = _spec_of(_normalize(_call(self.map_func, _example_element(spec, 1))))
                if any(None in s.shape for _, s in _flatten(spec)):
                    second = _spec_of(_normalize(_call(self.map_func, _example_element(spec, 2))))
                    first = _unify_specs(first, second)
            return first
        except Exception:  # fall back to a real element
            log.debug("map: tracing %r with zeros failed; using the first element", self.map_func)
        with closing(self._detached()._iter()) as it:
            element = next(it, None)
        if element is None:
            raise ValueError(
                "map: cannot infer element_spec: the function fails on example inputs and the "
                "dataset is empty"
            )
        return _spec_of(element)

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _describe(self) -> str:
        name = getattr(self.map_func, "__name__", "fn")
        return f"{name}, num_parallel_calls={self.num_parallel_calls}"


def _parallel_map(it: Iterator[Any], fn: Callable[..., Any], threads: int) -> Iterator[Any]:
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hpcdist-map")
    pending: deque[Any] = deque()
    try:
        for element in it:
            pending.append(pool.submit(lambda x: _normalize(_call(fn, x)), element))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)


class FilterDataset(Dataset):
    """``filter``: the elements for which ``predicate`` is true (a scalar bool).

    Example:
        >>> FilterDataset(Dataset.range(4), lambda x: x > 1).cardinality() == UNKNOWN
        True
    """

    def __init__(self, input: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__(input)
        if not callable(predicate):
            raise TypeError(
                f"filter: predicate is a {type(predicate).__name__}; expected a callable"
            )
        self.predicate = predicate

    def _iter(self) -> Iterator[Any]:
        pred = self.predicate
        with closing(self._input._iter()) as it:
            for element in it:
                keep = _call(pred, element)
                if isinstance(keep, np.ndarray) and keep.ndim > 0:
                    raise TypeError(
                        f"filter: the predicate returned an array of shape {keep.shape}; it must "
                        "return one boolean per element (reduce it, e.g. with .all())"
                    )
                if keep:
                    yield element

    def cardinality(self) -> int:
        return UNKNOWN


class TakeDataset(Dataset):
    """``take``: the first ``count`` elements (-1: all).

    Example:
        >>> TakeDataset(Dataset.range(3), 5).cardinality()
        3
    """

    def __init__(self, input: Dataset, count: int) -> None:
        super().__init__(input)
        self.count = _check_int(count, "take", "count", -1, "count >= 0, or -1 for all")

    def _iter(self) -> Iterator[Any]:
        if self.count == 0:
            return
        with closing(self._input._iter()) as it:
            if self.count < 0:
                yield from it
                return
            for i, element in enumerate(it, 1):
                yield element
                if i >= self.count:
                    return

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        left = self.count
        if left == 0:
            return
        for block in self._input._index_stream():
            if left < 0:
                yield block
                continue
            piece = block[:left]
            left -= len(piece)
            yield piece
            if left == 0:
                return

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if self.count < 0:
            return n
        if n == INFINITE:
            return self.count
        return n if n == UNKNOWN else min(n, self.count)

    def _describe(self) -> str:
        return f"count={self.count}"


class SkipDataset(Dataset):
    """``skip``: all but the first ``count`` elements (-1: none).

    Example:
        >>> SkipDataset(Dataset.range(3), 5).cardinality()
        0
    """

    def __init__(self, input: Dataset, count: int) -> None:
        super().__init__(input)
        self.count = _check_int(count, "skip", "count", -1, "count >= 0, or -1 to skip all")

    def _iter(self) -> Iterator[Any]:
        with closing(self._input._iter()) as it:
            if self.count < 0:
                for _ in it:
                    pass
                return
            for _ in itertools.islice(it, self.count):
                pass
            yield from it

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        left = self.count
        for block in self._input._index_stream():
            if left < 0:
                continue
            if left >= len(block):
                left -= len(block)
                continue
            yield block[left:]
            left = 0

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        return 0 if self.count < 0 else max(0, n - self.count)

    def _describe(self) -> str:
        return f"count={self.count}"


class ShardDataset(Dataset):
    """``shard``: the elements ``i`` with ``i % num_shards == index``.

    Example:
        >>> s = ShardDataset(Dataset.range(10), 3, 1)
        >>> s.num_shards, s.index, s.cardinality()
        (3, 1, 3)
    """

    def __init__(self, input: Dataset, num_shards: int, index: int) -> None:
        super().__init__(input)
        self.num_shards = _check_int(
            num_shards, "shard", "num_shards", 1, "num_shards >= 1 (the number of shards)"
        )
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"shard: index is {index!r}; expected an integer")
        if not 0 <= int(index) < self.num_shards:
            raise ValueError(
                f"shard: index is {int(index)} but there are {self.num_shards} shards; "
                f"expected 0 <= index < num_shards ({self.num_shards})"
            )
        self.index = int(index)

    def _iter(self) -> Iterator[Any]:
        n, k = self.num_shards, self.index
        with closing(self._input._iter()) as it:
            for i, element in enumerate(it):
                if i % n == k:
                    yield element

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        n, k, pos = self.num_shards, self.index, 0
        for block in self._input._index_stream():
            piece = block[(k - pos) % n :: n]
            pos += len(block)
            if len(piece):
                yield piece

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        return n // self.num_shards + (1 if self.index < n % self.num_shards else 0)

    def _describe(self) -> str:
        return f"num_shards={self.num_shards}, index={self.index}"


class PrefetchDataset(Dataset):
    """``prefetch``: a background thread keeps up to ``buffer_size`` elements ready.

    Exceptions of the input are raised in the consumer; the thread stops when
    the iterator is exhausted, closed or garbage-collected. ``buffer_size=0``
    passes elements through without a thread.

    Example:
        >>> PrefetchDataset(Dataset.range(3), AUTOTUNE).cardinality()
        3
    """

    def __init__(self, input: Dataset, buffer_size: int) -> None:
        super().__init__(input)
        self.buffer_size = _check_int(
            buffer_size, "prefetch", "buffer_size", -1, "buffer_size >= 0 or AUTOTUNE (-1)"
        )

    def _iter(self) -> Iterator[Any]:
        size = _PREFETCH_AUTOTUNE if self.buffer_size == AUTOTUNE else self.buffer_size
        if size == 0:
            with closing(self._input._iter()) as it:
                yield from it
            return
        yield from _prefetched(self._input, size)

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _describe(self) -> str:
        return f"buffer_size={self.buffer_size}"


_ITEM, _END, _ERROR = 0, 1, 2


def _prefetched(source: Dataset, size: int) -> Iterator[Any]:
    """``source``'s elements produced ahead by a thread into a queue of ``size`` entries."""
    items: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(entry: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                items.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            with closing(source._iter()) as it:
                for element in it:
                    if not put((_ITEM, element)):
                        return
            put((_END, None))
        except BaseException as err:  # handed to the consumer
            put((_ERROR, err))

    thread = threading.Thread(target=produce, name="hpcdist-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = items.get()
            if kind == _ITEM:
                yield value
            elif kind == _END:
                return
            else:
                raise value
    finally:
        stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                items.get_nowait()
            except queue.Empty:
                break
        thread.join(_JOIN_TIMEOUT_S)
        if thread.is_alive():
            log.warning(
                "prefetch: the producer thread is still busy in the input after %.0f s",
                _JOIN_TIMEOUT_S,
            )


class _OptionsDataset(Dataset):
    """``with_options``: a pass-through node that carries ``Options``.

    Example:
        >>> _OptionsDataset(Dataset.range(2), Options(deterministic=True)).options().deterministic
        True
    """

    def __init__(self, input: Dataset, options: Options) -> None:
        super().__init__(input)
        if not isinstance(options, Options):
            raise TypeError(
                f"with_options got a {type(options).__name__}; expected a "
                "hpcdist.data.options.Options"
            )
        self._options = options.copy()

    def _iter(self) -> Iterator[Any]:
        with closing(self._input._iter()) as it:
            yield from it

    def _index_source(self) -> _IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        return self._input._index_stream()

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _describe(self) -> str:
        return repr(self._options)


class FileReaderDataset(Dataset):
    """Reads every file named by its input with ``reader`` and yields the files' rows.

    Made by ``read_npy``, ``read_npz`` and ``read_hdf5``; its ``_input`` is the
    dataset of file names, so sharding by file goes right before this node.

    Example:
        >>> FileReaderDataset(Dataset.from_files([]), NpyReader()).cardinality() == UNKNOWN
        True
    """

    def __init__(self, input: Dataset, reader: FileReader) -> None:
        super().__init__(input)
        if not isinstance(reader, FileReader):
            raise TypeError(
                f"FileReaderDataset: reader is a {type(reader).__name__}; expected a FileReader "
                "(NpyReader, NpzReader, Hdf5Reader)"
            )
        self.reader = reader

    def _file_arrays(self) -> Iterator[Any]:
        """The arrays of each file in turn (valid until the next file is opened)."""
        with closing(self._input._iter()) as names:
            for name in names:
                path = to_path(name, f"read_{self.reader.name}")
                with self.reader.open(path) as arrays:
                    rows_of(path, arrays)
                    yield arrays

    def _iter(self) -> Iterator[Any]:
        for arrays in self._file_arrays():
            n = _block_rows(arrays)
            if not isinstance(arrays, (tuple, Mapping)):
                for i in range(n):
                    yield _row(arrays, i)
                continue
            for i in range(n):
                yield _map_structure(lambda a, i=i: _row(a, i), arrays)

    def _compute_element_spec(self) -> Any:
        with closing(self._input._detached()._iter()) as names:
            first = next(names, None)
        if first is None:
            raise ValueError(
                f"read_{self.reader.name}: the dataset has no files, so element_spec is unknown"
            )
        path = to_path(first, f"read_{self.reader.name}")
        with self.reader.open(path) as arrays:
            rows_of(path, arrays)
            return _map_structure(lambda a: TensorSpec(tuple(a.shape[1:]), a.dtype), arrays)

    def cardinality(self) -> int:
        return UNKNOWN

    def _describe(self) -> str:
        return repr(self.reader)


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
]
