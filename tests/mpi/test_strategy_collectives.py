"""The Strategy API's collectives give the engine's bits, in reused buffers, never clobbered.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4``.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.collectives import Collectives
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

SIZES = [1, 1024, 1 << 18, (5 << 20) // 4]  # float32 elements: 4 B, 4 KiB, 1 MiB, 5 MiB


@pytest.fixture(scope="module")
def strategy():
    return hd.MultiWorkerMirroredStrategy()


@pytest.fixture(scope="module")
def engine():
    c = Collectives(mpi().COMM_WORLD)
    yield c
    c.close()


def _value(rank: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.standard_normal(n).astype(np.float32)


def _same_bits(a, b) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MIN", "MAX"])
@pytest.mark.parametrize("n", SIZES)
def test_strategy_paths_give_the_engine_bits(strategy, engine, op, n):
    x = _value(strategy.extended._worker_index, n)
    (want,) = engine.allreduce([x], op)
    want = want.copy()
    per_replica = strategy.experimental_distribute_values_from_function(lambda ctx: x)
    _same_bits(strategy.reduce(op, per_replica, axis=None), want)

    def step(v):
        return hd.get_replica_context().all_reduce(op, v)

    _same_bits(strategy.run(step, args=(x,)), want)
    ext = strategy.extended
    _same_bits(ext.reduce_to(op, per_replica, destinations="/cpu:0"), want)
    batch = ext.batch_reduce_to(op, [(per_replica, "/cpu:0"), (per_replica, "/cpu:0")])
    _same_bits(batch[0], want)
    _same_bits(batch[1], want)


def test_strategy_reduce_passes_the_replica_value_to_the_engine_in_place(strategy, monkeypatch):
    """One local replica: the engine gets the caller's array itself (no copy on the way)."""
    engine = strategy.extended._collectives
    seen = []
    real = engine.allreduce

    def spy(tensors, op, options=None, **kw):
        seen.extend(tensors)
        return real(tensors, op, options, **kw)

    monkeypatch.setattr(engine, "allreduce", spy)
    x = _value(0, 1 << 16)
    per_replica = strategy.experimental_distribute_values_from_function(lambda ctx: x)
    strategy.reduce("SUM", per_replica, axis=None)
    strategy.run(lambda v: hd.get_replica_context().all_reduce("SUM", [v, v]), args=(x,))
    assert len(seen) == 3 and all(t is x for t in seen)


@pytest.mark.parametrize("n", SIZES)
def test_a_held_result_is_never_overwritten_and_a_dropped_one_is_reused(strategy, n):
    rank = strategy.extended._worker_index
    a, b = _value(rank, n, seed=1), _value(rank, n, seed=2)
    pa = strategy.experimental_distribute_values_from_function(lambda ctx: a)
    pb = strategy.experimental_distribute_values_from_function(lambda ctx: b)
    first = strategy.reduce("SUM", pa, axis=None)
    kept = first.copy()
    second = strategy.reduce("SUM", pb, axis=None)  # same layout: the buffer is still held
    assert not np.shares_memory(first, second)
    _same_bits(first, kept)
    third = strategy.run(lambda v: hd.get_replica_context().all_reduce("SUM", v), args=(a,))
    _same_bits(first, kept)
    _same_bits(third, kept)
    # Reuse: the pool hands back the very buffer object it kept (a weak reference proves
    # it is the same object, so a fresh allocation at a recycled address cannot pass).
    fourth = strategy.reduce("SUM", pb, axis=None)
    buffer = weakref.ref(_owner(fourth))
    want = fourth.copy()
    del second, third, fourth  # nothing outside the pool holds the last buffer now
    assert buffer() is not None, "the pool let go of the buffer it should keep for reuse"
    fifth = strategy.reduce("SUM", pb, axis=None)
    assert _owner(fifth) is buffer(), "a dropped result buffer was not reused"
    _same_bits(fifth, want)
    _same_bits(first, kept)


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (the end of its ``base`` chain)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def test_two_local_replicas_keep_held_results_too():
    s = hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:1"])
    workers = s.extended._num_workers

    def value(ctx, seed):
        return np.full(1000, float(seed * 100 + ctx.replica_id_in_sync_group), np.float64)

    pa = s.experimental_distribute_values_from_function(lambda ctx: value(ctx, 1))
    pb = s.experimental_distribute_values_from_function(lambda ctx: value(ctx, 2))
    first = s.reduce("SUM", pa, axis=None)
    second = s.reduce("SUM", pb, axis=None)
    replicas = 2 * workers
    ids = replicas * (replicas - 1) / 2
    np.testing.assert_array_equal(first, np.full(1000, 100.0 * replicas + ids))
    np.testing.assert_array_equal(second, np.full(1000, 200.0 * replicas + ids))
    mean = s.reduce("MEAN", pa, axis=None)
    np.testing.assert_allclose(mean, np.full(1000, 100.0 + ids / replicas))


def test_gather_paths_give_the_engine_bits_and_read_the_value_in_place(strategy, engine,
                                                                       monkeypatch):
    rank = strategy.extended._worker_index
    x = _value(rank, 1000 * (rank + 1)).reshape(-1, 10)
    want = engine.allgather(x, axis=0).copy()
    per_replica = strategy.experimental_distribute_values_from_function(lambda ctx: x)
    seen = []
    own = strategy.extended._collectives
    real = own.allgather_list

    def spy(tensors, axis=0, options=None):
        seen.append(list(tensors))
        return real(tensors, axis=axis, options=options)

    monkeypatch.setattr(own, "allgather_list", spy)
    _same_bits(strategy.gather(per_replica, axis=0), want)
    got = strategy.run(lambda v: hd.get_replica_context().all_gather(v, axis=0), args=(x,))
    _same_bits(got, want)
    assert len(seen) == 2 and all(len(t) == 1 and t[0] is x for t in seen)


@pytest.mark.parametrize("axis", [0, 1])
def test_all_gather_of_many_leaves_is_one_engine_call_with_pooled_results(
    strategy, engine, monkeypatch, axis
):
    rank = strategy.extended._worker_index
    leaves = [
        _value(rank, 6 * (rank + 1), seed=3).reshape(-1, 3) if axis == 0
        else _value(rank, 6 * (rank + 1), seed=3).reshape(3, -1),
        np.arange(4 * (rank + 2), dtype=np.int64).reshape(-1, 2) if axis == 0
        else np.arange(4 * (rank + 2), dtype=np.int64).reshape(2, -1),
        np.full((2, 2), rank, np.float64),
    ]
    want = [engine.allgather(x, axis=axis).copy() for x in leaves]
    own = strategy.extended._collectives
    calls = {"list": 0, "one": 0}
    real_list, real_one = own.allgather_list, own.allgather

    def spy_list(tensors, axis=0, options=None):
        calls["list"] += 1
        return real_list(tensors, axis=axis, options=options)

    def spy_one(tensor, axis=0, options=None):
        calls["one"] += 1
        return real_one(tensor, axis=axis, options=options)

    monkeypatch.setattr(own, "allgather_list", spy_list)
    monkeypatch.setattr(own, "allgather", spy_one)

    def gather(v):
        return hd.get_replica_context().all_gather(v, axis=axis)

    first = strategy.run(gather, args=(leaves,))
    assert calls == {"list": 1, "one": 0}
    for got, w in zip(first, want, strict=True):
        _same_bits(got, w)
    kept = [f.copy() for f in first]
    others = [x + 1 for x in leaves]
    second = strategy.run(gather, args=(others,))  # same shapes: the first buffer is held
    for f, k in zip(first, kept, strict=True):
        _same_bits(f, k)
    assert not any(np.shares_memory(f, g) for f, g in zip(first, second, strict=True))
    for got, x in zip(second, others, strict=True):
        _same_bits(got, engine.allgather(x, axis=axis))
    if axis == 0:  # results are views of the pooled buffer: a dropped one is reused
        address = second[0].ctypes.data
        del second, got  # (got: a view of the last result)
        third = strategy.run(gather, args=(others,))
        assert third[0].ctypes.data == address
    for f, k in zip(first, kept, strict=True):
        _same_bits(f, k)
    gathered = strategy.gather(
        strategy.experimental_distribute_values_from_function(lambda ctx: leaves[0]), axis=axis
    )
    _same_bits(gathered, want[0])
