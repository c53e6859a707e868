"""Conformance checks of the tf.distribute semantics, for any strategy.

Each ``check_*`` takes a strategy and asserts what TF's API documentation
says, with expected values computed from the global replica ids, so the same
check runs in one process (2 logical CPU devices), under ``mpirun -n 2`` and
``-n 4`` (one replica per rank) and with 2 ranks x 2 logical devices.

Every input is a deterministic function of the global replica id, so each
worker can compute the expected result of all replicas on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd


def replica_ids(strategy) -> list[int]:
    """The global replica ids of this worker's replicas, in local order."""
    ext = strategy.extended
    k = ext._num_local_replicas
    return [ext._worker_index * k + i for i in range(k)]


def rid() -> int:
    return hd.get_replica_context().replica_id_in_sync_group


def batch_of(r: int, rows: int | None = None) -> np.ndarray:
    """Replica ``r``'s uneven batch: 4 rows on even replicas, 2 on odd ones."""
    n = (4 if r % 2 == 0 else 2) if rows is None else rows
    return np.arange(n * 3, dtype=np.float64).reshape(n, 3) + 100.0 * r


def all_batches(strategy, rows=None) -> list[np.ndarray]:
    return [
        batch_of(r, None if rows is None else rows(r)) for r in range(strategy.num_replicas_in_sync)
    ]


def local(strategy, value) -> tuple:
    return strategy.experimental_local_results(value)


# -- run and reduce ---------------------------------------------------------------------------


def check_run_gives_each_replica_its_id(strategy):
    result = strategy.run(lambda: np.float64(rid()))
    assert [float(x) for x in local(strategy, result)] == [float(r) for r in replica_ids(strategy)]
    if strategy.extended._num_local_replicas > 1:
        assert isinstance(result, hd.PerReplica)


def check_reduce_axis_none_each_op(strategy):
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda: np.float64(rid() + 1))
    assert strategy.reduce(hd.ReduceOp.SUM, per_replica, axis=None) == n * (n + 1) / 2
    assert strategy.reduce("MEAN", per_replica, axis=None) == (n + 1) / 2
    assert strategy.reduce("min", per_replica, axis=None) == 1
    assert strategy.reduce(hd.ReduceOp.MAX, per_replica, axis=None) == n


def check_reduce_arrays_keep_shape_and_dtype(strategy):
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda: np.full((2, 3), rid() + 1, dtype=np.float32))
    total = strategy.reduce("SUM", per_replica, axis=None)
    assert total.dtype == np.float32 and total.shape == (2, 3)
    np.testing.assert_array_equal(total, np.full((2, 3), n * (n + 1) / 2, np.float32))


def check_reduce_with_axis_sum_then_across(strategy):
    per_replica = strategy.run(lambda: batch_of(rid()))
    expected = np.concatenate(all_batches(strategy)).sum(axis=0)
    np.testing.assert_allclose(strategy.reduce("SUM", per_replica, axis=0), expected)


def check_mean_with_axis_uses_global_count(strategy):
    """Uneven batches (4 and 2 rows): the denominator is the total row count."""
    per_replica = strategy.run(lambda: batch_of(rid()))
    everything = np.concatenate(all_batches(strategy))
    np.testing.assert_allclose(
        strategy.reduce("MEAN", per_replica, axis=0), everything.mean(axis=0)
    )
    if strategy.num_replicas_in_sync == 2:
        # 6 elements split 4 + 2 have denominator 6, not 2 * mean-of-means.
        two = strategy.run(lambda: np.arange(4.0) if rid() == 0 else np.array([10.0, 20.0]))
        assert strategy.reduce("MEAN", two, axis=0) == pytest.approx((0 + 1 + 2 + 3 + 10 + 20) / 6)


def check_mean_with_axis_partial_batch(strategy):
    """The last replica gets no rows (a partial last batch)."""
    n = strategy.num_replicas_in_sync

    def rows(r):
        return 0 if r == n - 1 and n > 1 else 3

    per_replica = strategy.run(lambda: batch_of(rid(), rows(rid())))
    everything = np.concatenate(all_batches(strategy, rows))
    np.testing.assert_allclose(
        strategy.reduce("MEAN", per_replica, axis=0), everything.mean(axis=0)
    )
    np.testing.assert_allclose(strategy.reduce("SUM", per_replica, axis=0), everything.sum(axis=0))


def check_min_max_with_axis(strategy):
    per_replica = strategy.run(lambda: batch_of(rid()))
    everything = np.concatenate(all_batches(strategy))
    np.testing.assert_array_equal(strategy.reduce("MIN", per_replica, axis=0), everything.min(0))
    np.testing.assert_array_equal(strategy.reduce("MAX", per_replica, axis=0), everything.max(0))


def check_mean_of_integers_is_float64(strategy):
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda: np.int32(rid() + 1))
    mean = strategy.reduce("MEAN", per_replica, axis=None)
    assert mean.dtype == np.float64 and mean == (n + 1) / 2
    total = strategy.reduce("SUM", per_replica, axis=None)
    assert total.dtype == np.int32 and total == n * (n + 1) // 2


def check_gather_uneven_in_replica_order(strategy):
    per_replica = strategy.run(lambda: batch_of(rid()))
    np.testing.assert_array_equal(
        strategy.gather(per_replica, axis=0), np.concatenate(all_batches(strategy))
    )
    transposed = strategy.run(lambda: batch_of(rid()).T.copy())
    np.testing.assert_array_equal(
        strategy.gather(transposed, axis=1), np.concatenate(all_batches(strategy)).T
    )


# -- inside run: all_reduce, all_gather, merge_call -----------------------------------------------


def check_all_reduce_nested_structure(strategy):
    n = strategy.num_replicas_in_sync

    def fn():
        r = rid()
        ctx = hd.get_replica_context()
        value = {"a": np.float64(r), "b": [np.array([1.0, 2.0]) * (r + 1)], "c": np.int32(r + 1)}
        return ctx.all_reduce("SUM", value), ctx.all_reduce(hd.ReduceOp.MEAN, value)

    total = n * (n + 1) / 2
    for summed, mean in local(strategy, strategy.run(fn)):
        assert summed["a"] == n * (n - 1) / 2
        np.testing.assert_array_equal(summed["b"][0], [total, 2 * total])
        assert summed["c"] == total and summed["c"].dtype == np.int32
        assert mean["a"] == (n - 1) / 2
        np.testing.assert_allclose(mean["b"][0], [total / n, 2 * total / n])
        assert mean["c"].dtype == np.float64 and mean["c"] == (n + 1) / 2


def check_all_reduce_min_max_and_python_numbers(strategy):
    n = strategy.num_replicas_in_sync

    def fn():
        ctx = hd.get_replica_context()
        return (
            ctx.all_reduce("MIN", np.float64(rid())),
            ctx.all_reduce("MAX", np.float64(rid())),
            ctx.all_reduce("SUM", 1.0),
        )

    for lo, hi, ones in local(strategy, strategy.run(fn)):
        assert (lo, hi, ones) == (0, n - 1, n)


def check_all_gather_uneven_shapes(strategy):
    def fn():
        ctx = hd.get_replica_context()
        return ctx.all_gather(batch_of(rid()), axis=0), ctx.all_gather([batch_of(rid()).T], axis=1)

    everything = np.concatenate(all_batches(strategy))
    for rows, (cols,) in local(strategy, strategy.run(fn)):
        np.testing.assert_array_equal(rows, everything)
        np.testing.assert_array_equal(cols, everything.T)


def check_merge_call_runs_once_in_cross_replica_context(strategy):
    n = strategy.num_replicas_in_sync
    calls = []

    def merge_fn(s, value):
        calls.append(hd.in_cross_replica_context())
        assert s is strategy
        return s.reduce("SUM", value, axis=None)

    def fn():
        return hd.get_replica_context().merge_call(merge_fn, args=(np.float64(rid() + 1),))

    result = strategy.run(fn)
    assert calls == [True]
    # The merge result is one object given to every replica, so run returns it as it is.
    assert not isinstance(result, hd.PerReplica) and float(result) == n * (n + 1) / 2


def check_contexts(strategy):
    assert not hd.has_strategy() and not hd.in_cross_replica_context()
    with strategy.scope():
        assert hd.get_strategy() is strategy and hd.has_strategy()
        assert hd.in_cross_replica_context() and hd.get_replica_context() is None

        def fn():
            ctx = hd.get_replica_context()
            return (
                hd.in_cross_replica_context(),
                ctx.num_replicas_in_sync,
                ctx.replica_id_in_sync_group,
                hd.get_strategy() is strategy,
            )

        seen = local(strategy, strategy.run(fn))
    n = strategy.num_replicas_in_sync
    assert [s[2] for s in seen] == replica_ids(strategy)
    assert all(s[0] is False and s[1] == n and s[3] for s in seen)


def check_cross_replica_methods_fail_inside_run(strategy):
    for call in (
        lambda: strategy.run(lambda: None),
        lambda: strategy.reduce("SUM", 1.0, axis=None),
        lambda: strategy.gather(np.ones(1), axis=0),
    ):
        with pytest.raises(RuntimeError, match="cross-replica context"):
            strategy.run(call)


# -- variables --------------------------------------------------------------------------------


def make_var(strategy, value=1.0, **kwargs):
    with strategy.scope():
        return hd.Variable(value, **kwargs)


def values_of(var) -> list[float]:
    return [float(c.numpy()) for c in var.values]


def check_mirrored_variable_aggregations(strategy):
    n = strategy.num_replicas_in_sync
    k = strategy.extended._num_local_replicas
    cases = {
        "SUM": 1 + n * (n + 1) / 2,
        "MEAN": 1 + (n + 1) / 2,
        "ONLY_FIRST_REPLICA": 1 + 1,
    }
    for aggregation, expected in cases.items():
        v = make_var(strategy, 1.0, aggregation=aggregation)
        assert isinstance(v, hd.MirroredVariable)
        strategy.run(lambda v=v: v.assign_add(np.float64(rid() + 1)))
        assert values_of(v) == [expected] * k, aggregation
        strategy.run(lambda v=v: v.assign_sub(np.float64(rid() + 1)))
        assert values_of(v) == [1.0] * k, aggregation
    summed = make_var(strategy, 0.0, aggregation="SUM")
    strategy.run(lambda: summed.assign(np.float64(rid() + 5)))
    assert values_of(summed) == [sum(r + 5 for r in range(n))] * k


def check_mirrored_variable_none_aggregation_errors_in_replica_context(strategy):
    v = make_var(strategy, 1.0)
    assert v.aggregation is hd.VariableAggregation.NONE
    with pytest.raises(ValueError, match="aggregation"):
        strategy.run(lambda: v.assign_add(1.0))
    assert values_of(v) == [1.0] * strategy.extended._num_local_replicas
    v.assign(3.0)  # cross-replica context: fine
    v.assign_add(1.0)
    assert values_of(v) == [4.0] * strategy.extended._num_local_replicas
    reads = local(strategy, strategy.run(lambda: v.read_value()))
    assert [float(x) for x in reads] == [4.0] * strategy.extended._num_local_replicas


def check_sync_on_read_variable_aggregations(strategy):
    n = strategy.num_replicas_in_sync
    k = strategy.extended._num_local_replicas
    expected = {"SUM": n * (n + 1) / 2, "MEAN": (n + 1) / 2, "ONLY_FIRST_REPLICA": 1.0}
    for aggregation, value in expected.items():
        v = make_var(strategy, 0.0, synchronization="ON_READ", aggregation=aggregation)
        assert isinstance(v, hd.SyncOnReadVariable) and not v.trainable
        locals_ = local(
            strategy,
            strategy.run(lambda v=v: (v.assign_add(np.float64(rid() + 1)), v.read_value())[1]),
        )
        assert [float(x) for x in locals_] == [r + 1.0 for r in replica_ids(strategy)]
        assert float(v.read_value()) == value, aggregation
        v.assign(10.0)
        assert float(v.numpy()) == 10.0
        per_copy = 10.0 / n if aggregation == "SUM" else 10.0
        assert values_of(v) == [per_copy] * k
    none = make_var(strategy, 0.0, synchronization="ON_READ")
    with pytest.raises(ValueError, match="NONE"):
        none.read_value()
    summed = make_var(strategy, 0.0, synchronization="ON_READ", aggregation="SUM")
    with pytest.raises(ValueError, match="SUM"):
        summed.assign_add(1.0)


def check_initial_values_from_worker_zero(strategy):
    """Each worker seeds differently; every variable starts from worker 0's value."""
    worker = strategy.extended._worker_index
    v = make_var(strategy, lambda: np.random.default_rng(worker).normal(size=3))
    first = np.random.default_rng(0).normal(size=3)
    for component in v.values:
        np.testing.assert_array_equal(component.numpy(), first)


def check_seed_usage(strategy):
    """The example of docs/strategies/index.md (once the README's): a variable, run, reduce."""
    with strategy.scope():
        x = hd.Variable(1.0)

    def fn():
        return x * 2.0

    per_replica = strategy.run(fn)
    total = strategy.reduce(hd.ReduceOp.SUM, per_replica, axis=None)
    assert total == 2.0 * strategy.num_replicas_in_sync


# -- input ---------------------------------------------------------------------------------------


def check_distribute_dataset_splits_each_global_batch(strategy):
    """Global batches of G = 2n + 1 elements: replica g gets sub-batch g, sizes differ by <= 1."""
    from hpcdist.data import Dataset

    n = strategy.num_replicas_in_sync
    g = 2 * n + 1
    sizes = [g // n + (1 if i < g % n else 0) for i in range(n)]
    starts = np.cumsum([0, *sizes])
    dist = strategy.experimental_distribute_dataset(Dataset.range(3 * g).batch(g))
    steps = 0
    for step, batch in enumerate(dist):
        doubled = strategy.run(lambda x: x * 2, args=(batch,))
        for r, got, twice in zip(
            replica_ids(strategy), local(strategy, batch), local(strategy, doubled), strict=True
        ):
            expected = np.arange(starts[r], starts[r + 1]) + step * g
            np.testing.assert_array_equal(got, expected)
            np.testing.assert_array_equal(twice, 2 * expected)
        steps += 1
    assert steps == 3
    if n == 2 and strategy.extended._num_local_replicas == 2:
        # TF's documented example: range(4).batch(2) over 2 replicas.
        dist = strategy.experimental_distribute_dataset(Dataset.range(4).batch(2))
        got = [[a.tolist() for a in local(strategy, b)] for b in dist]
        assert got == [[[0], [1]], [[2], [3]]]


def check_datasets_from_function_cover_everything_once(strategy):
    """Each input pipeline reads its shard; gathered over replicas, every element comes once."""
    from hpcdist.data import Dataset

    n = strategy.num_replicas_in_sync

    def dataset_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(2 * n)
        data = Dataset.range(8 * n).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return data.batch(per_replica)

    seen = [
        strategy.gather(b, axis=0) for b in strategy.distribute_datasets_from_function(dataset_fn)
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(8 * n))


CHECKS = [value for name, value in sorted(globals().items()) if name.startswith("check_")]
