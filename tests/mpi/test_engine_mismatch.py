"""Ranks that disagree about a collective get an error on every rank, for every implementation.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4`` by
``make test``. One rank (the first or the last) passes another tensor list (shape,
same-size shape, dtype, same-size dtype, count, order) or another op than the others.
Every rank must raise :class:`~hpcdist.errors.CollectiveMismatchError` naming the ranks
on each side, never hang or return corrupted data, and the engine must work afterwards:

* ``first-call``: neither list was used before on this engine;
* ``after-a-cached-call``: every rank ran the others' list once (a cached layout on
  every rank), then one rank passes a new list;
* ``both-lists-cached``: every rank ran both lists once, so each rank has a cached
  layout for what it passes and nothing new is built anywhere.

``test_collectives.py`` covers the message format and the other operations on the
default path; here the cases run for each implementation.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.errors import CollectiveMismatchError
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

IMPLEMENTATIONS = ["AUTO", "MPI", "SHM", "HIERARCHICAL"]
KINDS = ["shape", "same-size-shape", "dtype", "same-size-dtype", "count", "order", "op"]
WHEN = ["first-call", "after-a-cached-call", "both-lists-cached"]

# Every test uses lengths no other test uses, so "first-call" really is the first one.
_fresh = itertools.count()

Call = tuple[list[np.ndarray], str]  # (tensors, op) one rank passes


@pytest.fixture(scope="module")
def c() -> Collectives:
    return Collectives(mpi().COMM_WORLD)


def _length() -> int:
    """An odd length >= 3 that no earlier test of this module used (the same on every rank)."""
    return 3 + 2 * next(_fresh)


def _calls(kind: str, k: int, rank: int) -> tuple[Call, Call]:
    """(what the agreeing ranks pass, what the odd rank passes) as rank ``rank`` builds them."""
    a = np.full((2, k), rank + 1, np.float32)
    b = np.arange(3, dtype=np.int64) * (rank + 1)
    usual: Call = ([a, b], "SUM")
    odd: Call = {
        "shape": ([np.full((2, k + 1), rank + 1, np.float32), b], "SUM"),
        "same-size-shape": ([a.reshape(k, 2), b], "SUM"),
        "dtype": ([a.astype(np.float64), b], "SUM"),
        "same-size-dtype": ([a.astype(np.int32), b], "SUM"),
        "count": ([a, b, a + 1], "SUM"),
        "order": ([b, a], "SUM"),
        "op": ([a, b], "MAX"),
    }[kind]
    return usual, odd


def _check_call(c: Collectives, call: Callable[[int], Call], opts: CommunicationOptions) -> None:
    """Every rank passes ``call(its rank)``; the results equal the reference of all ranks."""
    tensors, op = call(c.rank)
    out = c.allreduce(tensors, op, opts)
    assert len(out) == len(tensors)
    combine = np.maximum if ReduceOp.from_any(op) is ReduceOp.MAX else np.add
    for i, got in enumerate(out):
        want = functools.reduce(combine, [call(r)[0][i] for r in range(c.size)])
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        np.testing.assert_array_equal(got, want)


def _named_groups(message: str) -> list[set[int]]:
    """The sets of ranks a message names: ``rank 3`` gives {3}, ``ranks 0-2, 5`` {0, 1, 2, 5}."""
    groups = []
    for found in re.finditer(r"\branks? (\d+(?:\s*[-,]\s*\d+)*)", message):
        ranks: set[int] = set()
        for part in found.group(1).split(","):
            low, _, high = part.strip().partition("-")
            ranks.update(range(int(low), int(high or low) + 1))
        groups.append(ranks)
    return groups


def _assert_names_both_sides(message: str, odd: int, size: int) -> None:
    groups = _named_groups(message)
    others = set(range(size)) - {odd}
    assert any(odd in g and not g & others for g in groups), (odd, groups, message)
    named_others = set().union(*(g for g in groups if odd not in g))
    assert others <= named_others, (others, groups, message)


def _expect_mismatch_everywhere(call: Callable[[], object], odd: int, size: int) -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        call()
    _assert_names_both_sides(str(info.value), odd, size)


@pytest.mark.parametrize("odd", ["first", "last"])
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_allreduce_disagreement_raises_on_every_rank(c, implementation, kind, when, odd):
    opts = CommunicationOptions(implementation=implementation)
    odd_rank = 0 if odd == "first" else c.size - 1
    k = _length()

    def usual(rank: int) -> Call:
        return _calls(kind, k, rank)[0]

    def other(rank: int) -> Call:
        return _calls(kind, k, rank)[1]

    if when != "first-call":
        _check_call(c, usual, opts)
    if when == "both-lists-cached":
        _check_call(c, other, opts)
    tensors, op = (other if c.rank == odd_rank else usual)(c.rank)
    _expect_mismatch_everywhere(lambda: c.allreduce(tensors, op, opts), odd_rank, c.size)
    # Nothing is left half-done and no cached layout is spoiled: both lists work.
    _check_call(c, usual, opts)
    _check_call(c, other, opts)


@pytest.mark.parametrize("kind", ["rows", "dtype", "op"])
@pytest.mark.parametrize("when", ["first-call", "after-a-cached-call"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_disagreement_raises_on_every_rank(c, implementation, when, kind):
    opts = CommunicationOptions(implementation=implementation)
    odd_rank = c.size - 1
    k = _length()
    x = np.full((k, 2), c.rank + 1, np.float32)
    odd = {"rows": (x[:-1], "SUM"), "dtype": (x.astype(np.float64), "SUM"), "op": (x, "MAX")}
    if when != "first-call":
        c.reduce_scatter(x, "SUM", opts)
    tensor, op = odd[kind] if c.rank == odd_rank else (x, "SUM")
    _expect_mismatch_everywhere(lambda: c.reduce_scatter(tensor, op, opts), odd_rank, c.size)
    out = c.reduce_scatter(x, "SUM", opts)
    block = np.array_split(np.full((k, 2), sum(range(1, c.size + 1)), np.float32), c.size)
    np.testing.assert_array_equal(out, block[c.rank])
