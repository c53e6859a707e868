"""Pass-through transformation nodes: repeat, take, skip, shard, prefetch, with_options.

These nodes never change an element; they choose which elements go on, how
many times and when. All but ``prefetch`` also forward the index stream of the
fast paths. ``prefetch`` reads ``_PREFETCH_AUTOTUNE`` and ``_JOIN_TIMEOUT_S``
from ``hpcdist.data.dataset``. Example:
``[int(x) for x in TakeDataset(Dataset.range(9), 2)]`` gives ``[0, 1]``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from typing import Any

import numpy as np

import hpcdist.data.dataset as _ds
from hpcdist.data.dataset import AUTOTUNE, INFINITE, UNKNOWN, Dataset, register_node
from hpcdist.data.options import Options
from hpcdist.data.source_nodes import IndexedSource
from hpcdist.data.structure import check_int

log = logging.getLogger("hpcdist.data")


@register_node
class RepeatDataset(Dataset):
    """``repeat``: the input ``count`` times (``None``/-1: forever; stops if an epoch is empty).

    Example:
        >>> RepeatDataset(Dataset.range(3), 2).cardinality()
        6
        >>> RepeatDataset(Dataset.range(3)).cardinality() == INFINITE
        True
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # only passes its input's elements on; the input reports for itself

    def __init__(self, input: Dataset, count: int | None = None) -> None:
        super().__init__(input)
        self.count = (
            -1
            if count is None
            else check_int(
                count, "repeat", "count", -1, "count >= 0, or -1/None to repeat forever"
            )
        )

    def _epochs_range(self) -> Iterable[int]:
        return itertools.count() if self.count < 0 else range(self.count)

    def _iter(self) -> Generator[Any, None, None]:
        for _ in self._epochs_range():
            produced = False
            with closing(self._input._iter()) as it:
                for element in it:
                    produced = True
                    yield element
            if not produced:
                return

    def _index_source(self) -> IndexedSource | None:
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


@register_node
class TakeDataset(Dataset):
    """``take``: the first ``count`` elements (-1: all).

    Example:
        >>> TakeDataset(Dataset.range(3), 5).cardinality()
        3
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # only passes its input's elements on; the input reports for itself

    def __init__(self, input: Dataset, count: int) -> None:
        super().__init__(input)
        self.count = check_int(count, "take", "count", -1, "count >= 0, or -1 for all")

    def _iter(self) -> Generator[Any, None, None]:
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

    def _index_source(self) -> IndexedSource | None:
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


@register_node
class SkipDataset(Dataset):
    """``skip``: all but the first ``count`` elements (-1: none).

    Example:
        >>> SkipDataset(Dataset.range(3), 5).cardinality()
        0
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # only passes its input's elements on; the input reports for itself

    def __init__(self, input: Dataset, count: int) -> None:
        super().__init__(input)
        self.count = check_int(count, "skip", "count", -1, "count >= 0, or -1 to skip all")

    def _iter(self) -> Generator[Any, None, None]:
        with closing(self._input._iter()) as it:
            if self.count < 0:
                for _ in it:
                    pass
                return
            for _ in itertools.islice(it, self.count):
                pass
            yield from it

    def _index_source(self) -> IndexedSource | None:
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


@register_node
class ShardDataset(Dataset):
    """``shard``: the elements ``i`` with ``i % num_shards == index``.

    Example:
        >>> s = ShardDataset(Dataset.range(10), 3, 1)
        >>> s.num_shards, s.index, s.cardinality()
        (3, 1, 3)
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # only passes its input's elements on; the input reports for itself

    def __init__(self, input: Dataset, num_shards: int, index: int) -> None:
        super().__init__(input)
        self.num_shards = check_int(
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

    def _iter(self) -> Generator[Any, None, None]:
        n, k = self.num_shards, self.index
        with closing(self._input._iter()) as it:
            for i, element in enumerate(it):
                if i % n == k:
                    yield element

    def _index_source(self) -> IndexedSource | None:
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


@register_node
class PrefetchDataset(Dataset):
    """``prefetch``: a background thread keeps up to ``buffer_size`` elements ready.

    Exceptions of the input are raised in the consumer; the thread stops when
    the iterator is exhausted, closed or garbage-collected. ``buffer_size=0``
    passes elements through without a thread.

    Example:
        >>> PrefetchDataset(Dataset.range(3), AUTOTUNE).cardinality()
        3
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # has a thread of its own already

    def __init__(self, input: Dataset, buffer_size: int) -> None:
        super().__init__(input)
        self.buffer_size = check_int(
            buffer_size, "prefetch", "buffer_size", -1, "buffer_size >= 0 or AUTOTUNE (-1)"
        )

    def _iter(self) -> Generator[Any, None, None]:
        size = _ds._PREFETCH_AUTOTUNE if self.buffer_size == AUTOTUNE else self.buffer_size
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
        thread.join(_ds._JOIN_TIMEOUT_S)
        if thread.is_alive():
            log.warning(
                "prefetch: the producer thread is still busy in the input after %.0f s",
                _ds._JOIN_TIMEOUT_S,
            )


@register_node
class _OptionsDataset(Dataset):
    """``with_options``: a pass-through node that carries ``Options``.

    Example:
        >>> _OptionsDataset(Dataset.range(2), Options(deterministic=True)).options().deterministic
        True
    """

    _input: Dataset  # a transformation always has an input
    releases_gil = False  # only passes its input's elements on; the input reports for itself

    def __init__(self, input: Dataset, options: Options) -> None:
        super().__init__(input)
        if not isinstance(options, Options):
            raise TypeError(
                f"with_options got a {type(options).__name__}; expected a "
                "hpcdist.data.options.Options"
            )
        self._options = options.copy()

    def _iter(self) -> Generator[Any, None, None]:
        with closing(self._input._iter()) as it:
            yield from it

    def _index_source(self) -> IndexedSource | None:
        return self._input._index_source()

    def _index_stream(self) -> Iterator[range | np.ndarray]:
        return self._input._index_stream()

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _describe(self) -> str:
        return repr(self._options)
