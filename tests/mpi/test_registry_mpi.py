"""The algorithm registry on real ranks: AUTO's picks, a test-only algorithm, equal bits.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4``.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, choice, registry
from hpcdist.collectives.algorithms.mpi import ALGORITHM as MPI_ALGORITHM
from hpcdist.runtime import mpi, world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]


class _Marked:
    """A test-only algorithm: AUTO calls of exactly three float64 values; runs as ``mpi``."""

    name = "test-only"

    def __init__(self) -> None:
        self.calls = 0

    def applies(self, where: registry.Where) -> bool:
        return where.auto and where.layout.shapes == ((3,),) and where.layout.nbytes == 24

    def allreduce(self, engine, items, layout, opts):
        self.calls += 1
        return MPI_ALGORITHM.allreduce(engine, items, layout, opts)


@pytest.fixture
def engine():
    c = Collectives(mpi().COMM_WORLD)
    yield c
    c.close()


def _digest_everywhere(comm, arrays) -> list[str]:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return comm.allgather(h.hexdigest())


def test_a_registered_algorithm_runs_only_where_it_applies(engine):
    marked = _Marked()
    registry.register(marked)
    try:
        x = np.arange(3, dtype=np.float64) + engine.rank
        (out,) = engine.allreduce([x], "SUM")
        assert marked.calls == 1 and engine.last_algorithm == "test-only"
        expected = np.arange(3.0) * engine.size + sum(range(engine.size))
        np.testing.assert_array_equal(out, expected)
        engine.allreduce([np.ones(4)], "SUM")  # another shape: not picked
        engine.allreduce([x], "SUM", CommunicationOptions(implementation="mpi"))  # not AUTO
        engine.allreduce([x.astype(np.float32)], "SUM")  # 12 bytes: not picked
        assert marked.calls == 1
        assert engine.last_algorithm != "test-only"
        (again,) = engine.allreduce([x], "SUM")
        assert marked.calls == 2
        np.testing.assert_array_equal(again, expected)
    finally:
        registry.unregister("test-only")
    engine.allreduce([x], "SUM")
    assert marked.calls == 2 and engine.last_algorithm != "test-only"


def test_register_refuses_duplicates_and_objects_without_the_protocol():
    with pytest.raises(ValueError, match="already registered"):
        registry.register(MPI_ALGORITHM)
    with pytest.raises(TypeError, match="applies"):
        registry.register(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="before"):
        registry.register(_Marked(), before="no-such")


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
@pytest.mark.parametrize("nbytes", [4, 4096, 1 << 20, 5 << 20, 40 << 20])
def test_every_algorithm_auto_picks_gives_every_rank_the_same_bits(engine, monkeypatch, op, nbytes):
    """AUTO with the MPI band on and off: same bits on every rank, and the same bits both ways."""
    rng = np.random.default_rng(7 + engine.rank)
    x = rng.standard_normal(nbytes // 4).astype(np.float32)
    results, picked = [], []
    for band in ("", "0:0"):
        monkeypatch.setenv("HPCDIST_MPI_BAND", band)
        (out,) = engine.allreduce([x], op)
        picked.append(engine.last_algorithm)
        assert len(set(_digest_everywhere(engine.comm, [out]))) == 1, (op, nbytes, picked)
        results.append(out.copy())
    np.testing.assert_array_equal(results[0].view(np.uint8), results[1].view(np.uint8))
    one_node = world().node_count == 1
    lo, hi = choice.MPI_BAND
    if one_node and engine.size == 2 and op != "MAX" and lo <= nbytes < hi:
        assert picked == ["mpi-direct", "shm"]
    if one_node and nbytes <= 4096:
        assert picked == ["small", "small"]


def test_ranks_on_different_algorithms_still_get_a_mismatch_error(engine):
    """One rank's call is small, the other's is in the MPI band: every rank raises."""
    from hpcdist.errors import CollectiveMismatchError

    n = 4 if engine.rank == 0 else choice.MPI_BAND[0] // 4
    with pytest.raises(CollectiveMismatchError, match="rank 0 passed"):
        engine.allreduce([np.ones(n, np.float32)], "SUM")
    (out,) = engine.allreduce([np.ones(2)], "SUM")  # the engine works on
    np.testing.assert_array_equal(out, [engine.size, engine.size])


class _Scatter:
    """A test-only algorithm with a reduce_scatter: float64 tensors of 10 rows, AUTO."""

    name = "test-scatter"

    def __init__(self) -> None:
        self.scatters = 0

    def applies(self, where: registry.Where) -> bool:
        return not where.device and where.auto and where.layout.shapes == ((10,),)

    def allreduce(self, engine, items, layout, opts):
        return MPI_ALGORITHM.allreduce(engine, items, layout, opts)

    def reduce_scatter(self, engine, items, layout, opts, bounds):
        self.scatters += 1
        return MPI_ALGORITHM.reduce_scatter(engine, items, layout, opts, bounds)


def test_reduce_scatter_walks_the_registry(engine):
    x = np.arange(10, dtype=np.float64) * (engine.rank + 1)
    factor = engine.size * (engine.size + 1) / 2
    blocks = np.array_split(np.arange(10.0) * factor, engine.size)
    plain = engine.reduce_scatter(x, "SUM")
    assert engine.last_algorithm in {"shm", "hierarchical", "mpi", "mpi-direct"}
    np.testing.assert_array_equal(plain, blocks[engine.rank])
    scatter = _Scatter()
    registry.register(scatter)
    try:
        got = engine.reduce_scatter(x, "SUM")
        assert scatter.scatters == 1 and engine.last_algorithm == "test-scatter"
        np.testing.assert_array_equal(got, blocks[engine.rank])
        engine.reduce_scatter(np.ones(12), "SUM")  # another shape: not picked
        assert scatter.scatters == 1 and engine.last_algorithm != "test-scatter"
        registry.unregister("test-scatter")
        registry.register(_Marked())  # no reduce_scatter: never asked about one
        engine.reduce_scatter(np.ones(3), "SUM")
        assert engine.last_algorithm != "test-only"
    finally:
        for name in ("test-scatter", "test-only"):
            if name in [a.name for a in registry.registered()]:
                registry.unregister(name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32"])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
@pytest.mark.parametrize("counts", [(4096,), (16384,), (3000, 1000, 1)], ids=str)
def test_one_bucket_shm_calls_give_the_bits_of_the_checked_plan(engine, dtype, op, counts):
    """Unchecked one-bucket calls the shared window folds whole (4 to 64 KiB) run
    ``small``'s routine inside ``shm``: the same bits as the checked calls, which run
    the node plan."""
    from hpcdist.arrays import BFLOAT16

    wire = BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(11 + engine.rank)
    xs = [(rng.standard_normal(n) * 1000).astype(wire) for n in counts]
    shm = CommunicationOptions(implementation="shm")
    checked = CommunicationOptions(implementation="shm", timeout_seconds=120)
    fast = engine.allreduce(xs, op, shm)
    if world().node_count == 1:
        assert engine.last_algorithm == "shm"
    elif world().size == world().node_count:  # (checked, unchecked MPI: other sum orders)
        pytest.skip("one rank per node: no shared window, so shm does not apply")
    planned = engine.allreduce(xs, op, checked)
    for a, b in zip(fast, planned, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    assert len(set(_digest_everywhere(engine.comm, fast))) == 1
