"""Seeded randomness and index streams: epoch generators, rechunking, the vectorised shuffle.

The fast paths compute the element order over integer row indices, carried as
blocks (``range`` or int64 arrays). ``shuffle_indices`` is TF's buffer shuffle
over such a stream; it gives exactly the order documented in
``hpcdist.data.dataset`` (and produced element by element by
``ShuffleDataset._iter_buffered``). Example:
``list(rechunk([range(5)], 2, False, len, lambda b, s, e: b[s:e], join_indices))``
gives ``[range(0, 2), range(2, 4), range(4, 5)]``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np


class EpochCounter:
    """How many iterations a node has started (shared by the copies ``_with_input`` makes)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            n = self._count
            self._count += 1
            return n

    @property
    def count(self) -> int:
        """The index the next iteration will get."""
        return self._count

    def set(self, n: int) -> None:
        """Make the next iteration the ``n``-th (0-based); used when resuming from a checkpoint."""
        with self._lock:
            self._count = n


def epoch_rng(seed: int | None, reshuffle: bool, counter: EpochCounter) -> np.random.Generator:
    """The generator of one iteration (see the module docstring for the rule)."""
    epoch = counter.next()
    if seed is None:
        return np.random.default_rng()
    if not reshuffle or epoch == 0:
        return np.random.default_rng(seed)
    return np.random.default_rng((seed, epoch))


def fixed_random_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1, np.uint32)[0])


def rechunk(
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


def index_array(block: range | np.ndarray) -> np.ndarray:
    if isinstance(block, range):
        return np.arange(block.start, block.stop, block.step, dtype=np.int64)
    return block


def join_indices(pieces: list[range | np.ndarray]) -> range | np.ndarray:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate([index_array(p) for p in pieces])


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
        return join_indices(pieces)


def shuffle_indices(
    blocks: Iterator[range | np.ndarray],
    buffer_size: int,
    rng: np.random.Generator,
    chunk: int,
) -> Iterator[np.ndarray]:
    """TF's buffer shuffle over a stream of indices, vectorised chunk by chunk.

    Gives exactly the order of the element-by-element algorithm in
    ``ShuffleDataset._iter_buffered`` with the same generator; ``chunk`` is the
    number of slot draws per ``rng.integers`` call (``hpcdist.data.dataset._SHUFFLE_CHUNK``).
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
    slots = np.array(index_array(first), dtype=np.int64)  # slot -> index held there
    while True:
        new = index_array(reader.read(chunk))
        c = len(new)
        if c == 0:
            break
        picks = rng.integers(0, buffer_size, size=chunk)[:c]
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
