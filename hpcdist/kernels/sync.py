"""Flags in shared memory: atomic load/store and bounded spin waits.

Ranks on one node signal each other through an ``int64`` flag array that lives
in shared memory (an MPI shared window, ``/dev/shm``). :func:`atomic_store`
publishes with *release* ordering (every write made before it is visible to a
reader that sees the flag), :func:`atomic_load` reads with *acquire* ordering.
:func:`wait_all` and :func:`wait_equal` spin on several flags for a bounded
number of rounds and return ``False`` when the rounds run out, so the Python
caller can yield the CPU, check a timeout and call again: nothing here blocks
forever. All functions are ``@njit``: call them from Python or from other
Numba code.

Example:
    >>> import numpy as np
    >>> flags = np.zeros(4, np.int64)
    >>> atomic_store(flags, 2, 7)
    >>> atomic_load(flags, 2)
    7
    >>> wait_all(flags, 0, 2, 2, 1, 10)  # flags[0] and flags[2] >= 1?
    False
    >>> atomic_store(flags, 0, 1)
    >>> wait_all(flags, 0, 2, 2, 1, 10)
    True
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hpcdist.kernels._llvm import load_acquire, pause_hint, store_release

__all__ = [
    "arrive_and_wait",
    "atomic_load",
    "atomic_store",
    "cpu_pause",
    "wait_all",
    "wait_equal",
]


@njit(nogil=True, cache=True)
def _check_index(flags: np.ndarray, index: int) -> None:
    if index < 0 or index >= flags.shape[0]:
        # exception arguments, not str(): string formatting costs seconds of compile time
        raise IndexError(
            "flag index outside the flag array; expected 0 <= index < len(flags), "
            "found (index, len(flags)) =",
            index,
            flags.shape[0],
        )


@njit(nogil=True, cache=True)
def atomic_store(flags: np.ndarray, index: int, value: int) -> None:
    """``flags[index] = value`` as an atomic store with release ordering.

    Writes made before the store are visible to any thread or process that
    reads ``value`` with :func:`atomic_load`.

    Example: ``atomic_store(flags, 0, 3)`` then ``atomic_load(flags, 0) == 3``.
    """
    _check_index(flags, index)
    store_release(flags, index, value)


@njit(nogil=True, cache=True)
def atomic_load(flags: np.ndarray, index: int) -> int:
    """``flags[index]`` read as an atomic load with acquire ordering.

    Example: ``atomic_load(np.array([5], np.int64), 0)`` is ``5``.
    """
    _check_index(flags, index)
    return load_acquire(flags, index)


@njit(nogil=True, cache=True)
def cpu_pause() -> None:
    """A spin-wait hint to the CPU (x86 ``pause``, ARM ``yield``; nothing elsewhere).

    Example: ``cpu_pause()`` returns after a few cycles.
    """
    pause_hint()


@njit(nogil=True, cache=True)
def _check_span(flags: np.ndarray, first: int, count: int, stride: int) -> None:
    if count < 0:
        raise ValueError("flag count is negative; expected count >= 0, found", count)
    if count > 0:
        last = first + (count - 1) * stride
        if first < 0 or first >= flags.shape[0] or last < 0 or last >= flags.shape[0]:
            raise IndexError(
                "the flags first + k*stride (k < count) leave the flag array; expected a span "
                "inside it, found (first, count, stride, len(flags)) =",
                first,
                count,
                stride,
                flags.shape[0],
            )


@njit(nogil=True, cache=True)
def wait_all(
    flags: np.ndarray, first: int, count: int, stride: int, target: int, spins: int
) -> bool:
    """Spin until ``flags[first + k*stride] >= target`` for every ``k < count``.

    Each round reads the flags not yet seen at ``target`` with acquire loads
    (a flag seen there is not read again in this call: meant for counters that
    only grow). Returns ``True`` once all are there,
    ``False`` after ``spins`` rounds (at least one check is always made).

    Example: ``wait_all(flags, 0, 3, 1, 5, 1000)`` waits for flags 0, 1, 2 to reach 5.
    """
    _check_span(flags, first, count, stride)
    k = 0
    rounds = 0
    while True:
        while k < count and load_acquire(flags, first + k * stride) >= target:
            k += 1
        if k == count:
            return True
        rounds += 1
        if rounds >= spins:
            return False
        # No CPU pause hint here: in virtual machines a spin of PAUSE
        # instructions triggers pause-loop exiting, and the hypervisor then
        # deschedules the waiting vCPU (measured here: a 2-rank flag ping
        # took 70 us with pause and 11 us without).


@njit(nogil=True, cache=True)
def wait_equal(
    flags: np.ndarray, first: int, count: int, stride: int, value: int, spins: int
) -> bool:
    """Spin until ``flags[first + k*stride] == value`` for every ``k < count``.

    As :func:`wait_all` with ``==``: a flag seen equal to ``value`` is not read
    again in this call. Returns ``False`` after ``spins`` rounds.

    Example: ``wait_equal(flags, 1, 2, 4, 0, 100)`` waits for flags 1 and 5 to be 0.
    """
    _check_span(flags, first, count, stride)
    k = 0
    rounds = 0
    while True:
        while k < count and load_acquire(flags, first + k * stride) == value:
            k += 1
        if k == count:
            return True
        rounds += 1
        if rounds >= spins:
            return False
        # No CPU pause hint here: in virtual machines a spin of PAUSE
        # instructions triggers pause-loop exiting, and the hypervisor then
        # deschedules the waiting vCPU (measured here: a 2-rank flag ping
        # took 70 us with pause and 11 us without).


@njit(nogil=True, cache=True)
def arrive_and_wait(
    flags: np.ndarray, rank: int, count: int, stride: int, seq: int, digest: int, spins: int
) -> int:
    """One node barrier in one call: publish ``digest`` and ``seq``, spin, compare digests.

    Rank ``k``'s line starts at ``flags[k * stride]``: word 0 is its barrier
    sequence number, words 1 and 2 the digests of odd and even barriers.
    This rank writes its digest, then stores ``seq`` (release), then spins up
    to ``spins`` rounds until every line's sequence number reached ``seq``.
    Returns 1 when all arrived with the same digest, -1 when all arrived but
    some digest differs, 0 when the rounds ran out (call :func:`wait_all`,
    then compare, to go on).

    Example: ``arrive_and_wait(flags, 0, 2, 8, 1, 123, 1000)`` on rank 0 of 2.
    """
    _check_span(flags, 0, count, stride)
    slot = 1 + (seq & 1)
    line = rank * stride
    flags[line + slot] = digest
    store_release(flags, line, seq)
    k = 0
    rounds = 0
    while True:
        while k < count and load_acquire(flags, k * stride) >= seq:
            k += 1
        if k == count:
            break
        rounds += 1
        if rounds >= spins:
            return 0
    for j in range(count):
        if flags[j * stride + slot] != digest:
            return -1
    return 1
