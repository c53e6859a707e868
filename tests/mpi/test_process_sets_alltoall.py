"""The collectives layer's process sets, alltoall and Adasum on NumPy arrays, on N ranks."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives import Collectives
from hpcdist.collectives.adasum import adasum_allreduce, adasum_reduce
from hpcdist.collectives.process_sets import ProcessSet
from hpcdist.errors import CollectiveMismatchError, ProcessSetError
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def engine() -> Collectives:
    return Collectives(world().comm.Dup())


def test_alltoall_uneven_splits(engine):
    r, n = engine.rank, engine.size
    splits = [(r + j) % 3 for j in range(n)]  # rank r sends (r + j) % 3 rows to rank j
    x = np.stack([np.arange(sum(splits)) + 100 * r, -np.arange(sum(splits))], axis=1)
    out, received = engine.alltoall(x.astype(np.int32), splits)
    assert received.tolist() == [(s + r) % 3 for s in range(n)]
    want = []
    for s in range(n):
        theirs = [(s + j) % 3 for j in range(n)]
        start = sum(theirs[:r])
        want.append(np.arange(start, start + theirs[r]) + 100 * s)
    np.testing.assert_array_equal(out[:, 0], np.concatenate(want))
    assert out.dtype == np.int32 and out.shape[1] == 2


def test_alltoall_wrong_on_one_rank_raises_everywhere(engine):
    bad = engine.rank == engine.size - 1
    with pytest.raises(CollectiveMismatchError, match=f"rank {engine.size - 1}"):
        engine.alltoall(np.zeros((engine.size, 2 if not bad else 3)))
    with pytest.raises(CollectiveMismatchError, match="splits"):
        engine.alltoall(np.zeros(engine.size), [1] * engine.size if not bad else [2] * engine.size)
    out, got = engine.alltoall(np.arange(engine.size, dtype=np.float64))  # still usable
    assert out.tolist() == [float(engine.rank)] * engine.size


def test_process_set_engine_and_outsiders():
    w = world()
    ps = ProcessSet(range(0, w.size, 2)).create()
    assert ps.included() == (w.rank % 2 == 0) and ps.size() == (w.size + 1) // 2
    if ps.included():
        got = ps.engine().allreduce([np.array([float(w.rank)])], "SUM")[0]
        assert got.tolist() == [float(sum(range(0, w.size, 2)))]
        assert ps.rank() == w.rank // 2
    else:
        assert ps.rank() == -1
        with pytest.raises(ProcessSetError, match="not in process set"):
            ps.engine()
    ps.free()
    with pytest.raises(ProcessSetError):
        ProcessSet([0, 0])
    with pytest.raises(ProcessSetError, match="subset"):
        ProcessSet([w.size]).create()


def test_adasum_allreduce_equals_the_tree_over_gathered_vectors(engine):
    rng = np.random.default_rng(engine.rank)
    mine = rng.standard_normal(5)
    everyone = [np.random.default_rng(r).standard_normal(5) for r in range(engine.size)]
    np.testing.assert_allclose(adasum_allreduce(engine, mine), adasum_reduce(everyone))
    with pytest.raises(TypeError, match="floating"):
        adasum_reduce([np.arange(3)])
