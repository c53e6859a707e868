"""Transformation nodes that change elements: batch, unbatch, shuffle, map, filter, file reads.

``BatchDataset`` and ``ShuffleDataset`` take the fast paths described in
``hpcdist.data.dataset`` when they can; the module switches they read
(``_FAST_PATHS``, ``_SHUFFLE_CHUNK``) live in ``hpcdist.data.dataset`` and are
looked up there at iteration time. Example:
``[b.tolist() for b in BatchDataset(Dataset.range(5), 2)]`` gives ``[[0, 1], [2, 3], [4]]``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import numpy as np

import hpcdist.data.dataset as _ds
from hpcdist.data.dataset import AUTOTUNE, UNKNOWN, Dataset, register_node
from hpcdist.data.shuffle import (
    EpochCounter,
    epoch_rng,
    fixed_random_seed,
    join_indices,
    rechunk,
    shuffle_indices,
)
from hpcdist.data.source_nodes import IndexedSource
from hpcdist.data.sources import FileReader, rows_of, to_path
from hpcdist.data.structure import (
    TensorSpec,
    call_element,
    check_int,
    check_seed,
    count_rows,
    example_element,
    flatten_with_paths,
    map_structure,
    normalize_structure,
    row_of,
    spec_of,
    stack_elements,
    unify_specs,
)
from hpcdist.utils.seeding import get_random_seed, next_seed

log = logging.getLogger("hpcdist.data")

#: The most threads one ``map`` runs (``num_parallel_calls`` above it uses this many).
MAX_MAP_THREADS = 256


# ------------------------------------------------------------------------------- transformations


@register_node
class BatchDataset(Dataset):
    """``batch``: ``batch_size`` consecutive elements stacked per component.

    Example:
        >>> b = BatchDataset(Dataset.range(5), 2, drop_remainder=False)
        >>> b.batch_size, b.drop_remainder, b.cardinality()
        (2, False, 3)
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # works on elements in memory, in the caller's thread

    def __init__(self, input: Dataset, batch_size: int, drop_remainder: bool = False) -> None:
        super().__init__(input)
        self.batch_size = check_int(
            batch_size, "batch", "batch_size", 1, "batch_size >= 1 (elements per batch)"
        )
        self.drop_remainder = bool(drop_remainder)

    def _iter(self) -> Generator[Any, None, None]:
        size, drop = self.batch_size, self.drop_remainder
        stream = self._input._fast_stream()
        if stream is not None:
            source = self._input._index_source()
            assert source is not None
            pieces = rechunk(stream, size, drop, len, lambda b, s, e: b[s:e], join_indices)
            for rows in pieces:
                yield source._take(rows)
            return
        if _ds._FAST_PATHS and isinstance(self._input, FileReaderDataset):
            yield from rechunk(
                self._input._file_arrays(), size, drop, _block_rows, _cut_rows, _concat_rows
            )
            return
        with closing(self._input._iter()) as it:
            buffer: list[Any] = []
            for element in it:
                buffer.append(element)
                if len(buffer) == size:
                    yield stack_elements(buffer)
                    buffer = []
            if buffer and not drop:
                yield stack_elements(buffer)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        return n // self.batch_size if self.drop_remainder else -(-n // self.batch_size)

    def _compute_element_spec(self) -> Any:
        dim = self.batch_size if self.drop_remainder else None
        return map_structure(
            lambda s: TensorSpec((dim, *s.shape), s.dtype), self._input.element_spec
        )

    def _describe(self) -> str:
        return f"batch_size={self.batch_size}, drop_remainder={self.drop_remainder}"


def _block_rows(block: Any) -> int:
    return int(np.shape(flatten_with_paths(block)[0][1])[0])


def _cut_rows(block: Any, start: int, stop: int) -> Any:
    return map_structure(lambda a: np.array(a[start:stop]), block)


def _concat_rows(pieces: list[Any]) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    flat = [[leaf for _, leaf in flatten_with_paths(p)] for p in pieces]
    joined = iter([np.concatenate(parts) for parts in zip(*flat, strict=True)])
    return map_structure(lambda _: next(joined), pieces[0])


@register_node
class UnbatchDataset(Dataset):
    """``unbatch``: every row of every element becomes an element.

    Example:
        >>> [int(x) for x in UnbatchDataset(Dataset.from_tensors([1, 2]))]
        [1, 2]
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # works on elements in memory, in the caller's thread

    def _iter(self) -> Generator[Any, None, None]:
        with closing(self._input._iter()) as it:
            for element in it:
                n = count_rows(element, "unbatch")
                for i in range(n):
                    yield map_structure(functools.partial(row_of, i=i), element)

    def _compute_element_spec(self) -> Any:
        def drop_first(s: TensorSpec) -> TensorSpec:
            if not s.shape:
                raise ValueError("unbatch: the elements are scalars; there is nothing to unbatch")
            return TensorSpec(s.shape[1:], s.dtype)

        return map_structure(drop_first, self._input.element_spec)


@register_node
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

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # works on elements in memory, in the caller's thread

    def __init__(
        self,
        input: Dataset,
        buffer_size: int,
        seed: int | None = None,
        reshuffle_each_iteration: bool | None = None,
    ) -> None:
        super().__init__(input)
        self.buffer_size = check_int(
            buffer_size, "shuffle", "buffer_size", 1, "buffer_size >= 1 (elements held)"
        )
        self.seed = check_seed(seed, "shuffle")
        self.reshuffle_each_iteration = (
            True if reshuffle_each_iteration is None else bool(reshuffle_each_iteration)
        )
        self.seed_from_stream = self.seed is None and get_random_seed() is not None
        if self.seed_from_stream:
            self._seed_used: int | None = next_seed()  # the same on every worker
        elif self.seed is None and not self.reshuffle_each_iteration:
            self._seed_used = fixed_random_seed()  # same order every iteration
        else:
            self._seed_used = self.seed
        self._epochs = EpochCounter()

    def _rng(self) -> np.random.Generator:
        return epoch_rng(self._seed_used, self.reshuffle_each_iteration, self._epochs)

    def _index_source(self) -> IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        upstream = self._input._index_stream()
        yield from shuffle_indices(upstream, self.buffer_size, self._rng(), _ds._SHUFFLE_CHUNK)

    def _iter(self) -> Generator[Any, None, None]:
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
                    picks, used = rng.integers(0, size, size=_ds._SHUFFLE_CHUNK), 0
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


def _copy_row(a: Any, i: int) -> Any:
    """Row ``i`` of ``a``: a copy, a scalar for a 1-D array."""
    return a[i] if a.ndim == 1 else a[i].copy()


def _unstack(batch: Any) -> Iterator[Any]:
    n = _block_rows(batch)
    if not isinstance(batch, (tuple, Mapping)):
        yield from (batch[i] if batch.ndim == 1 else batch[i].copy() for i in range(n))
        return
    for i in range(n):
        yield map_structure(functools.partial(_copy_row, i=i), batch)


@register_node
class MapDataset(Dataset):
    """``map``: ``map_func`` applied to every element, in order (optionally in threads).

    Example:
        >>> [int(x) for x in MapDataset(Dataset.range(4), lambda x: x + 1, num_parallel_calls=2)]
        [1, 2, 3, 4]
    """

    _input: Dataset  # a transformation always has an input

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
            check_int(
                num_parallel_calls,
                "map",
                "num_parallel_calls",
                1,
                "num_parallel_calls >= 1, AUTOTUNE (-1) or None",
            )
        self.num_parallel_calls = num_parallel_calls
        self.deterministic = deterministic

    def _threads(self) -> int:
        """Threads of the pool: ``num_parallel_calls`` (cores for AUTOTUNE), at most
        :data:`MAX_MAP_THREADS`; at most ``2 *`` that many elements are in flight."""
        if self.num_parallel_calls == AUTOTUNE:
            return min(os.cpu_count() or 1, MAX_MAP_THREADS)
        return min(int(self.num_parallel_calls or 1), MAX_MAP_THREADS)

    def _waits_outside_gil(self) -> bool:
        """A thread pool (``num_parallel_calls`` > 1) waits on its threads; one thread does not."""
        return self._threads() > 1

    def _iter(self) -> Generator[Any, None, None]:
        fn, threads = self.map_func, self._threads()
        with closing(self._input._iter()) as it:
            if threads <= 1:
                for element in it:
                    yield normalize_structure(call_element(fn, element))
            else:
                yield from _parallel_map(it, fn, threads)

    def _compute_element_spec(self) -> Any:
        spec = self._input.element_spec
        try:
            with np.errstate(all="ignore"):
                fn = self.map_func
                first = spec_of(normalize_structure(call_element(fn, example_element(spec, 1))))
                if any(None in s.shape for _, s in flatten_with_paths(spec)):
                    again = call_element(fn, example_element(spec, 2))
                    second = spec_of(normalize_structure(again))
                    first = unify_specs(first, second)
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
        return spec_of(element)

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
            pending.append(pool.submit(lambda x: normalize_structure(call_element(fn, x)), element))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)


@register_node
class FilterDataset(Dataset):
    """``filter``: the elements for which ``predicate`` is true (a scalar bool).

    Example:
        >>> FilterDataset(Dataset.range(4), lambda x: x > 1).cardinality() == UNKNOWN
        True
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # works on elements in memory, in the caller's thread

    def __init__(self, input: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__(input)
        if not callable(predicate):
            raise TypeError(
                f"filter: predicate is a {type(predicate).__name__}; expected a callable"
            )
        self.predicate = predicate

    def _iter(self) -> Generator[Any, None, None]:
        pred = self.predicate
        with closing(self._input._iter()) as it:
            for element in it:
                keep = call_element(pred, element)
                if isinstance(keep, np.ndarray) and keep.ndim > 0:
                    raise TypeError(
                        f"filter: the predicate returned an array of shape {keep.shape}; it must "
                        "return one boolean per element (reduce it, e.g. with .all())"
                    )
                if keep:
                    yield element

    def cardinality(self) -> int:
        return UNKNOWN


@register_node
class FileReaderDataset(Dataset):
    """Reads every file named by its input with ``reader`` and yields the files' rows.

    Made by ``read_npy``, ``read_npz`` and ``read_hdf5``; its ``_input`` is the
    dataset of file names, so sharding by file goes right before this node.

    Example:
        >>> from hpcdist.data.sources import NpyReader
        >>> FileReaderDataset(Dataset.from_files([]), NpyReader()).cardinality() == UNKNOWN
        True
    """

    _input: Dataset  # a transformation always has an input

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

    def _iter(self) -> Generator[Any, None, None]:
        for arrays in self._file_arrays():
            n = _block_rows(arrays)
            if not isinstance(arrays, (tuple, Mapping)):
                for i in range(n):
                    yield row_of(arrays, i)
                continue
            for i in range(n):
                yield map_structure(functools.partial(row_of, i=i), arrays)

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
            return map_structure(lambda a: TensorSpec(tuple(a.shape[1:]), a.dtype), arrays)

    def cardinality(self) -> int:
        return UNKNOWN

    def _describe(self) -> str:
        return repr(self.reader)
