"""Distributed datasets in one process: TF's examples, sharding per simulated worker,
partial and empty batches, the end-of-data agreement (workers as threads), prefetch."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcdist as hd
from hpcdist.data.autoshard import apply_autoshard, chain_of
from hpcdist.data.dataset import Dataset, ShardDataset, TensorSpec
from hpcdist.data.distributed import (
    DistributedInputError,
    Optional,
    OptionalValue,
    _sub_batch_steps,
    distribute_dataset,
    distribute_datasets_from_function,
    worker_batches,
)
from hpcdist.data.input_context import InputOptions
from hpcdist.data.options import AutoShardPolicy, Options
from hpcdist.data.rebatch import rebatch_steps
from hpcdist.distribute.values import PerReplica


def with_policy(ds: Dataset, policy: str) -> Dataset:
    options = Options()
    options.distribute.auto_shard_policy = policy
    return ds.with_options(options)


def local(x) -> list:
    """The local replicas' values of one step, as lists."""
    values = x.values if isinstance(x, PerReplica) else (x,)
    return [np.asarray(v).tolist() for v in values]


def ints(x) -> list[int]:
    values = x.values if isinstance(x, PerReplica) else (x,)
    return [int(i) for v in values for i in np.asarray(v).ravel()]


@pytest.fixture
def npy_files(tmp_path) -> Callable[[list[int]], list[str]]:
    """Write files with the given row counts; rows are consecutive ints over all files."""

    def write(rows: list[int]) -> list[str]:
        paths, start = [], 0
        for i, n in enumerate(rows):
            path = tmp_path / f"part-{i:03d}.npy"
            np.save(path, np.arange(start, start + n, dtype=np.int64))
            paths.append(str(path))
            start += n
        return paths

    return write


# -- TF's documented examples ------------------------------------------------------------


def test_tf_example_range4_batch2_over_two_replicas():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ext = s.extended
    dist = distribute_dataset(
        Dataset.range(4).batch(2), num_replicas_per_worker=2, devices=ext._devices
    )
    steps = list(dist)
    assert [local(x) for x in steps] == [[[0], [1]], [[2], [3]]]
    results = [s.run(lambda x: x * 2, args=(x,)) for x in steps]
    assert [local(r) for r in results] == [[[0], [2]], [[4], [6]]]


def test_element_spec_is_per_replica_with_unknown_batch():
    ds = Dataset.from_tensors((np.array([1.0], np.float32), np.array([2], np.int32)))
    dist = distribute_dataset(ds.repeat(100).batch(16), num_replicas_per_worker=2)
    x_spec, y_spec = dist.element_spec
    assert isinstance(x_spec, PerReplica) and len(x_spec.values) == 2
    assert x_spec.values[0].shape == (None, 1) and x_spec.values[0].dtype == np.float32
    assert y_spec.values[1].shape == (None, 1) and y_spec.values[1].dtype == np.int32
    one = distribute_dataset(ds.batch(4, drop_remainder=True))
    assert one.element_spec[0].shape == (None, 1)


def test_one_replica_gets_the_plain_batches():
    batches = list(distribute_dataset(Dataset.range(5).batch(2)))
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4]]


def test_dataset_without_batch_raises_value_error():
    with pytest.raises(ValueError, match="not batched"):
        distribute_dataset(Dataset.range(4), num_replicas_per_worker=2)


def test_per_replica_options_are_for_datasets_from_function_only():
    options = InputOptions(experimental_replication_mode="PER_REPLICA")
    with pytest.raises(NotImplementedError, match="distribute_datasets_from_function"):
        distribute_dataset(Dataset.range(4).batch(2), options=options)


# -- partial and empty batches -------------------------------------------------------------


def test_partial_last_batch_is_split_evenly_and_the_rest_get_empty_batches():
    dist = distribute_dataset(Dataset.range(6).batch(4), num_replicas_per_worker=4)
    first, last = list(dist)
    assert local(first) == [[0], [1], [2], [3]]
    assert local(last) == [[4], [5], [], []]
    for empty in last.values[2:]:
        assert empty.shape == (0,) and empty.dtype == np.int64


def test_global_batch_smaller_than_replica_count():
    (step,) = distribute_dataset(Dataset.range(3).batch(3), num_replicas_per_worker=4)
    assert local(step) == [[0], [1], [2], []]


def test_empty_batches_of_nested_elements_keep_dtype_and_shape():
    features = np.arange(10, dtype=np.float32).reshape(5, 2)
    ds = Dataset.from_tensor_slices({"x": features, "y": np.arange(5, dtype=np.int8)})
    steps = list(distribute_dataset(ds.batch(3), num_replicas_per_worker=3))
    assert len(steps) == 2
    last = steps[1]
    assert [v.shape for v in last["x"].values] == [(1, 2), (1, 2), (0, 2)]
    assert last["x"].values[2].dtype == np.float32 and last["y"].values[2].dtype == np.int8


def test_transformations_after_batch_keep_global_batch_meaning():
    ds = Dataset.range(12).batch(4).map(lambda b: b - b.min()).take(2)
    assert [local(x) for x in distribute_dataset(ds, num_replicas_per_worker=2)] == [
        [[0, 1], [2, 3]],
        [[0, 1], [2, 3]],
    ]


def test_uneven_split_g7_over_two_replicas():
    steps = list(distribute_dataset(Dataset.range(14).batch(7), num_replicas_per_worker=2))
    assert [local(x) for x in steps] == [
        [[0, 1, 2, 3], [4, 5, 6]],
        [[7, 8, 9, 10], [11, 12, 13]],
    ]


# -- sharding per simulated worker (no MPI: worker_batches) -------------------------------


def union(ds, w_count: int, r: int, policy=None) -> tuple[list[int], list[list]]:
    """All elements every simulated worker sees in one epoch, and each worker's steps.

    ``ds`` is a Dataset or a function making one: each worker builds its own, as each
    MPI rank does (a shuffle's epoch counter lives in its dataset object).
    """
    seen, per_worker = [], []
    for w in range(w_count):
        dataset = ds() if callable(ds) and not isinstance(ds, Dataset) else ds
        steps = list(worker_batches(dataset, w_count, w, r, policy))
        assert all(len(step) == r for step in steps)
        per_worker.append(steps)
        seen += [int(v) for step in steps for sub in step for v in np.asarray(sub).ravel()]
    return sorted(seen), per_worker


@pytest.mark.parametrize(("w_count", "r", "n", "g"), [(2, 1, 20, 4), (2, 2, 23, 7), (4, 2, 50, 9)])
def test_data_sharding_union_is_the_dataset(w_count, r, n, g):
    ds = with_policy(Dataset.range(n).batch(g), "DATA")
    seen, per_worker = union(ds, w_count, r)
    assert seen == list(range(n))
    steps = {len(s) for s in per_worker}
    assert steps == {-(-n // g)}  # every worker: one step per global batch
    for i in range(len(per_worker[0])):  # each step: a whole global batch over all replicas
        total = sum(len(sub) for w in range(w_count) for sub in per_worker[w][i])
        assert total == min(g, n - i * g)


def test_data_sharding_of_g7_w2_r2_follows_tf_sizes():
    ds = with_policy(Dataset.range(7).batch(7), "DATA")
    _, (w0, w1) = union(ds, 2, 2)
    assert [[len(b) for b in step] for step in w0] == [[2, 2]]
    assert [[len(b) for b in step] for step in w1] == [[2, 1]]


@pytest.mark.parametrize(("w_count", "r"), [(2, 1), (2, 2), (3, 2), (4, 1)])
def test_file_sharding_union_is_the_dataset(npy_files, w_count, r):
    paths = npy_files([5, 9, 1, 12, 7])
    ds = Dataset.from_files(paths).read_npy().batch(4)
    seen, per_worker = union(ds, w_count, r, policy="FILE")
    assert seen == list(range(34))
    for w, steps in enumerate(per_worker):  # worker w read files w, w+W, ...
        mine = sorted(int(v) for step in steps for sub in step for v in sub)
        expected = [i for f in paths[w::w_count] for i in np.load(f).tolist()]
        assert mine == sorted(expected)


def test_file_sharding_each_step_consumes_one_global_batch(npy_files):
    paths = npy_files([7, 7])  # TF's example: two files of 7, G=7, W=2, R=2
    ds = Dataset.from_files(paths).read_npy().batch(7)
    _, (w0, w1) = union(ds, 2, 2, policy="FILE")
    assert [local_sizes(s) for s in w0] == [[2, 2], [2, 1]]
    assert [local_sizes(s) for s in w1] == [[2, 1], [2, 2]]
    assert [[b.tolist() for b in s] for s in w0] == [[[0, 1], [2, 3]], [[4, 5], [6]]]
    assert [[b.tolist() for b in s] for s in w1] == [[[7, 8], [9]], [[10, 11], [12, 13]]]


def local_sizes(step) -> list[int]:
    return [len(b) for b in step]


def test_file_sharding_inserts_shard_right_after_the_file_source(npy_files):
    ds = Dataset.from_files(npy_files([2, 2, 2])).read_npy().map(lambda x: x + 1).batch(2)
    plan = apply_autoshard(ds, num_workers=2, worker_index=1, policy="FILE")
    nodes = chain_of(plan.dataset)
    assert isinstance(nodes[1], ShardDataset)
    assert [type(n).__name__ for n in nodes[2:]] == [type(n).__name__ for n in chain_of(ds)[1:]]


def test_off_and_hint_give_every_worker_everything():
    ds = Dataset.range(10).batch(4)
    for policy in ("OFF", "HINT"):
        _, per_worker = union(with_policy(ds, policy), 2, 1)
        for steps in per_worker:
            assert sorted(int(v) for s in steps for b in s for v in b) == list(range(10))


def test_one_worker_shards_nothing(npy_files):
    ds = with_policy(Dataset.from_files(npy_files([3, 4])).read_npy().batch(3), "FILE")
    seen, _ = union(ds, 1, 2)
    assert seen == list(range(7))


def test_auto_chooses_file_with_enough_files_and_data_otherwise(npy_files, caplog):
    files = Dataset.from_files(npy_files([3, 3, 3])).read_npy().batch(2)
    with caplog.at_level(logging.INFO, logger="hpcdist"):
        assert apply_autoshard(files, 2, 0).policy is AutoShardPolicy.FILE
        assert apply_autoshard(files, 4, 0).policy is AutoShardPolicy.DATA
        assert apply_autoshard(Dataset.range(8).batch(2), 2, 0).policy is AutoShardPolicy.DATA
    messages = [r.getMessage() for r in caplog.records]
    assert "AUTO chose FILE" in messages[0] and caplog.records[0].levelno == logging.INFO
    # Every worker reading the same files is real redundant work: a warning.
    assert "fell back to DATA because the pipeline reads 3 file(s), fewer than" in messages[1]
    assert "WHOLE input" in messages[1] and caplog.records[1].levelno == logging.WARNING
    # Input in memory: DATA is the only sensible policy, so one INFO line.
    assert "AUTO uses DATA for input that does not come from files" in messages[2]
    assert "(RangeDataset -> BatchDataset)" in messages[2] and "\n" not in messages[2]
    assert caplog.records[2].levelno == logging.INFO


def test_each_dataset_logs_its_choice_once(caplog):
    ds = Dataset.range(8).batch(2)
    with caplog.at_level(logging.INFO, logger="hpcdist"):
        for _ in range(3):
            apply_autoshard(ds, 2, 0)
        apply_autoshard(Dataset.range(8).batch(2), 2, 0)  # another dataset
    assert len(caplog.records) == 2


def test_a_seed_from_set_random_seed_counts_as_a_seed(caplog):
    from hpcdist.utils import seeding

    with caplog.at_level(logging.INFO, logger="hpcdist"):
        apply_autoshard(Dataset.range(8).shuffle(8).batch(2), 2, 0)
        hd_seed = seeding._seed
        try:
            seeding.set_random_seed(3)
            apply_autoshard(Dataset.range(8).shuffle(8).batch(2), 2, 0)
        finally:
            seeding._seed = hd_seed
    first, second = caplog.records
    assert first.levelno == logging.WARNING and "shuffle() without a seed" in first.getMessage()
    assert second.levelno == logging.INFO and "WARNING" not in second.getMessage()


def test_a_global_batch_below_the_replica_count_warns_once(caplog):
    from hpcdist.data import small_batch

    small_batch._warned.clear()
    with caplog.at_level(logging.WARNING, logger="hpcdist"):
        for _ in range(2):
            distribute_dataset(
                Dataset.range(8).batch(1), num_workers=2, worker_index=0,
                collectives=FakeGroup(2).rank(0),
            )  # fmt: skip
        distribute_dataset(
            Dataset.range(8).batch(2), num_workers=2, worker_index=0,
            collectives=FakeGroup(2).rank(0),
        )  # fmt: skip
    warned = [r.getMessage() for r in caplog.records if "replicas in sync" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "global batch size 1 is smaller than the 2 replicas" in warned[0]
    assert "1 replica(s) get an empty batch in every step" in warned[0]
    assert not small_batch.warn_if_batch_below_replicas(1, 4, 1)  # only worker 0 speaks


def test_explicit_data_policy_is_info_not_a_warning(caplog):
    with caplog.at_level(logging.INFO, logger="hpcdist"):
        plan = apply_autoshard(Dataset.range(8).batch(2), 2, 0, AutoShardPolicy.DATA)
    assert plan.policy is AutoShardPolicy.DATA
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "auto_shard_policy is DATA" in caplog.records[0].getMessage()


def test_decision_is_logged_once_by_worker_zero_only(caplog):
    ds = Dataset.range(8).batch(2)
    with caplog.at_level(logging.INFO, logger="hpcdist"):
        distribute_dataset(ds, num_workers=2, worker_index=1, collectives=FakeGroup(2).rank(1))
        assert caplog.records == []
        distribute_dataset(ds, num_workers=2, worker_index=0, collectives=FakeGroup(2).rank(0))
    assert len(caplog.records) == 1


def test_file_policy_errors_are_clear(npy_files):
    with pytest.raises(ValueError, match="3 file\\(s\\) for 4 workers"):
        apply_autoshard(Dataset.from_files(npy_files([1, 1, 1])).read_npy().batch(2), 4, 0, "FILE")
    with pytest.raises(ValueError, match="does not start from files"):
        apply_autoshard(Dataset.range(4).batch(2), 2, 0, "FILE")


def test_data_sharding_with_seeded_shuffle_partitions_and_repeats():
    def ds():
        return with_policy(Dataset.range(40).shuffle(40, seed=3).batch(6), "DATA")

    seen, first = union(ds, 2, 2)
    assert seen == list(range(40))
    _, again = union(ds, 2, 2)
    ordered = [[b.tolist() for s in steps for b in s] for steps in first]
    assert ordered == [[b.tolist() for s in steps for b in s] for steps in again]


def test_unseeded_shuffle_under_sharding_warns(caplog):
    ds = Dataset.range(10).shuffle(10).batch(2)
    with caplog.at_level(logging.WARNING, logger="hpcdist"):
        apply_autoshard(ds, 2, 0)
    assert "shuffle() without a seed" in caplog.text and "give it a seed" in caplog.text


# -- end-of-data agreement: workers as threads --------------------------------------------


class FakeGroup:
    """An in-process stand-in for the collectives of ``size`` workers (one thread each)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=20)
        self._slots: list = [None] * size
        self.calls = [0] * size

    def rank(self, rank: int) -> FakeRank:
        return FakeRank(self, rank)


class FakeRank:
    def __init__(self, group: FakeGroup, rank: int) -> None:
        self.group, self.rank_id, self.size = group, rank, group.size

    def allreduce(self, tensors, op):
        assert str(op).upper().endswith("MAX") and len(tensors) == 1
        g = self.group
        g.calls[self.rank_id] += 1
        g._slots[self.rank_id] = np.asarray(tensors[0])
        g._barrier.wait()
        result = np.max(np.stack(g._slots), axis=0)
        g._barrier.wait()
        return [result]


def run_workers(size: int, work: Callable[[int, FakeRank], object]) -> list:
    """``work(rank, collectives)`` on ``size`` threads; results or raised errors by rank."""
    group = FakeGroup(size)
    results: list = [None] * size

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank, group.rank(rank))
        except BaseException as error:  # noqa: BLE001 - checked by the test
            results[rank] = error

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a simulated worker hung"
    return results


def test_uneven_workers_end_together_with_empty_batches():
    def work(rank: int, coll: FakeRank) -> list:
        def dataset_fn(ctx):
            assert (ctx.num_input_pipelines, ctx.input_pipeline_id) == (3, rank)
            assert ctx.num_replicas_in_sync == 6
            return [np.full((2, 3), 10 * rank + i, np.float32) for i in range(2 * rank + 1)]

        dist = distribute_datasets_from_function(
            dataset_fn,
            num_workers=3,
            worker_index=rank,
            num_replicas_per_worker=2,
            collectives=coll,
        )
        return [[v.shape[0] for v in x.values] for x in dist]

    results = run_workers(3, work)
    # worker 0 has 1 batch, worker 1 has 3, worker 2 has 5: three steps everywhere.
    assert results[0] == [[2, 0], [0, 0], [0, 0]]
    assert results[1] == [[2, 2], [2, 0], [0, 0]]
    assert results[2] == [[2, 2], [2, 2], [2, 0]]


def test_uneven_file_shards_end_together(npy_files):
    paths = npy_files([12, 2])  # worker 0 has 3 global batches of 4, worker 1 one partial

    def work(rank: int, coll: FakeRank) -> tuple[int, list[int]]:
        ds = with_policy(Dataset.from_files(paths).read_npy().batch(4), "FILE")
        dist = distribute_dataset(
            ds, num_workers=2, worker_index=rank, num_replicas_per_worker=1, collectives=coll
        )
        seen, steps = [], 0
        for x in dist:
            steps += 1
            seen += ints(x)
        return steps, seen

    (s0, seen0), (s1, seen1) = run_workers(2, work)
    assert s0 == s1 == 6  # 3 global batches on worker 0 = 6 steps of R=1 sub-batches
    assert sorted(seen0 + seen1) == list(range(14))


def test_error_in_one_workers_pipeline_is_raised_on_every_worker():
    def work(rank: int, coll: FakeRank) -> list:
        def boom(x):
            if rank == 1 and int(x[0]) >= 4:
                raise KeyError("bad record")
            return x

        ds = with_policy(Dataset.range(12).batch(2).map(boom), "OFF")
        dist = distribute_dataset(ds, num_workers=2, worker_index=rank, collectives=coll)
        return [ints(x) for x in dist]

    r0, r1 = run_workers(2, work)
    assert isinstance(r0, DistributedInputError) and "another worker" in str(r0)
    assert isinstance(r1, KeyError)


def test_missing_batch_dimension_cannot_be_padded_and_every_worker_says_so():
    def work(rank: int, coll: FakeRank) -> list:
        dist = distribute_datasets_from_function(
            lambda ctx: [np.float64(i) for i in range(rank + 1)],
            num_workers=2,
            worker_index=rank,
            collectives=coll,
        )
        return [float(x) for x in dist]

    r0, r1 = run_workers(2, work)
    assert isinstance(r0, DistributedInputError) and isinstance(r1, DistributedInputError)
    assert "no batch dimension" in str(r0)


def test_after_the_end_no_more_collectives_and_optional_is_empty():
    def work(rank: int, coll: FakeRank) -> tuple:
        dist = distribute_dataset(
            Dataset.range(4).batch(2), num_workers=2, worker_index=rank, collectives=coll
        )
        it = iter(dist)
        first = it.get_next_as_optional()
        assert first.has_value()
        assert it.get_next_as_optional().has_value()
        end = it.get_next_as_optional()
        with pytest.raises(StopIteration):
            it.get_next()
        with pytest.raises(StopIteration):
            next(it)
        return ints(first.get_value()), end.has_value()

    group_calls = []

    def wrapped(rank, coll):
        out = work(rank, coll)
        group_calls.append(coll.group.calls[rank])
        return out

    (a, end0), (b, end1) = run_workers(2, wrapped)
    assert sorted(a + b) == [0, 1] and not end0 and not end1
    assert group_calls == [3, 3]  # two steps and the agreed end; none after


def test_workers_skip_steps_where_nobody_has_elements(npy_files):
    # Worker 0's 1-row partial batch splits into [1] and [] (two steps of R=1); worker 1
    # has no data. The step where every replica would be empty is skipped everywhere.
    paths = npy_files([1, 0])

    def work(rank: int, coll: FakeRank) -> list:
        ds = with_policy(Dataset.from_files(paths).read_npy().batch(4), "FILE")
        dist = distribute_dataset(ds, num_workers=2, worker_index=rank, collectives=coll)
        return [ints(x) for x in dist]

    assert run_workers(2, work) == [[[0]], [[]]]


# -- prefetch, iterators, epochs -----------------------------------------------------------


def parallel_map(ds: Dataset) -> Dataset:
    """``ds`` with a ``map`` in a thread pool: a stage the distributed input reads ahead of."""
    return ds.map(lambda x: x, num_parallel_calls=2)


def test_prefetch_thread_stops_at_the_end_on_close_and_when_collected():
    dist = distribute_dataset(parallel_map(Dataset.range(100).batch(2)), num_replicas_per_worker=2)
    it = iter(dist)
    thread = it._source.thread
    assert thread is not None and it.reads_ahead
    assert [v for x in it for v in ints(x)] == list(range(100))
    thread.join(timeout=5)
    assert not thread.is_alive()

    it = iter(dist)
    next(it)
    thread = it._source.thread
    it.close()
    assert not thread.is_alive()

    it = iter(dist)
    next(it)
    thread = it._source.thread
    del it
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_in_memory_pipelines_are_read_in_the_callers_thread(npy_files):
    x = np.arange(40.0).reshape(20, 2)
    in_memory = [
        Dataset.from_tensor_slices(x).shuffle(20, seed=1).batch(4),
        Dataset.range(10).repeat(2).map(lambda v: v * 2).filter(lambda v: v > 2).batch(4),
        Dataset.range(10).batch(2).prefetch(2),  # the dataset's own thread is enough
    ]
    for ds in in_memory:
        it = iter(distribute_dataset(ds, num_replicas_per_worker=2))
        assert not it.reads_ahead and it._source.thread is None, ds
        assert len(list(it)) > 0

    def gen():
        yield from range(6)

    reading = [
        Dataset.from_files(npy_files([5, 3])).read_npy().batch(4),  # file I/O
        parallel_map(Dataset.range(8).batch(4)),  # a thread pool
        Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64)).batch(4),
    ]
    for ds in reading:
        it = iter(distribute_dataset(ds))
        assert it.reads_ahead, ds
        assert sorted(ints(next(it))) == [0, 1, 2, 3]
        it.close()
        no_thread = InputOptions(experimental_per_replica_buffer_size=0)
        assert not iter(distribute_dataset(ds, options=no_thread)).reads_ahead


def test_nodes_declare_whether_they_wait_outside_the_gil():
    import hpcdist.data.passthrough_nodes as passthrough
    import hpcdist.data.source_nodes as sources
    import hpcdist.data.transform_nodes as transforms

    nodes = [
        cls
        for module in (passthrough, sources, transforms)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, Dataset) and cls.__module__ == module.__name__
    ]
    nodes.remove(sources.IndexedSource)  # the base of TensorSliceDataset and RangeDataset
    waiting = {c.__name__ for c in nodes if c.releases_gil}
    assert waiting == {"FileReaderDataset", "GeneratorDataset", "MapDataset"}
    assert len(nodes) - len(waiting) == 14  # the in-memory nodes say so themselves

    class Custom(Dataset):  # a node type hpcdist does not know: assumed to wait
        def _iter(self):
            yield from self._input._iter()

    assert Custom.releases_gil
    assert iter(distribute_dataset(Custom(Dataset.range(4)).batch(2))).reads_ahead

    class InMemory(Custom):
        releases_gil = False

    assert not iter(distribute_dataset(InMemory(Dataset.range(4)).batch(2))).reads_ahead


def test_read_ahead_for_dataset_fn_results_and_gpu_copies():
    batches = [np.arange(2) + 2 * i for i in range(3)]

    def reads_ahead(fn) -> bool:
        it = iter(distribute_datasets_from_function(fn))
        try:
            return it.reads_ahead
        finally:
            it.close()

    assert not reads_ahead(lambda ctx: batches)  # already in memory
    assert not reads_ahead(lambda ctx: Dataset.range(6).batch(2))
    assert reads_ahead(lambda ctx: (b for b in batches))  # opaque: may wait on I/O
    # Decided without iterating: copies to a GPU replica, and the end-of-data all-reduce
    # of several workers, overlap the pipeline's work.
    ds = Dataset.range(4).batch(2)
    assert distribute_dataset(ds, devices=["/gpu:0"])._read_ahead
    cpu_only = InputOptions(experimental_fetch_to_device=False)
    assert not distribute_dataset(ds, devices=["/gpu:0"], options=cpu_only)._read_ahead
    two = {"num_workers": 2, "collectives": FakeGroup(2).rank(0)}
    assert distribute_dataset(ds, **two)._read_ahead
    assert distribute_datasets_from_function(lambda ctx: batches, **two)._read_ahead
    no_thread = InputOptions(experimental_per_replica_buffer_size=0)
    assert not distribute_dataset(ds, options=no_thread, **two)._read_ahead


def test_prefetch_thread_reads_a_bounded_number_of_steps_ahead():
    produced = []

    def gen():
        for i in range(100):
            produced.append(i)
            yield np.array([i])

    options = InputOptions(experimental_per_replica_buffer_size=1)  # a buffer of 2 steps
    it = iter(distribute_datasets_from_function(lambda ctx: gen(), options=options))
    assert it.reads_ahead
    assert ints(next(it)) == [0]
    deadline = time.monotonic() + 5
    while len(produced) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    # 1 returned, then at most 2 * (n + 1) = 4 ahead: 1 left of those the caller took,
    # 2 in the buffer, 1 in the thread's hands
    assert 3 <= len(produced) <= 5
    assert [ints(x)[0] for x in it] == list(range(1, 100))  # the rest, in order


def test_errors_in_a_read_ahead_pipeline_come_after_the_steps_before_them():
    def gen():
        for i in range(7):
            if i == 5:
                raise ZeroDivisionError("bad record")
            yield np.array([i])

    it = iter(distribute_datasets_from_function(lambda ctx: gen()))
    assert it.reads_ahead
    assert [ints(next(it)) for _ in range(5)] == [[0], [1], [2], [3], [4]]
    with pytest.raises(ZeroDivisionError, match="bad record"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


@settings(deadline=None, max_examples=60)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    num_workers=st.integers(1, 3),
    r=st.integers(1, 3),
    data=st.data(),
    own=st.booleans(),
)
def test_cached_cuts_match_rebatch_steps(sizes, num_workers, r, data, own):
    w = data.draw(st.integers(0, num_workers - 1))
    start = np.cumsum([0, *sizes])
    batches = [np.arange(a, a + n).reshape(n, 1) for a, n in zip(start, sizes, strict=False)]
    mine = list(_sub_batch_steps(iter(batches), num_workers, r, w, own))
    reference = list(rebatch_steps(batches, num_workers, r, w, own_part_only=own))
    assert [[p.tolist() for p in step] for step in mine] == [
        [p.tolist() for p in step] for step in reference
    ]
    as_tuples = [(b, b[:, 0]) for b in batches]  # nested elements take the general path
    nested = list(_sub_batch_steps(iter(as_tuples), num_workers, r, w, own))
    assert [[p[1].tolist() for p in step] for step in nested] == [
        [p[:, 0].tolist() for p in step] for step in reference
    ]


def test_pipeline_errors_are_raised_by_get_next():
    def bad(x):
        if int(x[0]) == 4:
            raise ZeroDivisionError("bad batch")
        return x

    it = iter(distribute_dataset(Dataset.range(10).batch(2).map(bad)))
    assert ints(next(it)) == [0, 1] and ints(next(it)) == [2, 3]
    with pytest.raises(ZeroDivisionError, match="bad batch"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_buffer_size_zero_reads_in_the_callers_thread():
    options = InputOptions(experimental_per_replica_buffer_size=0)
    dist = distribute_dataset(Dataset.range(6).batch(3), options=options)
    it = iter(dist)
    assert it._source.thread is None
    assert [ints(x) for x in it] == [[0, 1, 2], [3, 4, 5]]


def test_each_iteration_is_a_new_epoch_with_reproducible_reshuffles():
    def make():
        return distribute_dataset(
            Dataset.range(20).shuffle(20, seed=5).batch(5), num_replicas_per_worker=2
        )

    dist = make()
    epoch1 = [ints(x) for x in dist]
    epoch2 = [ints(x) for x in dist]
    assert sorted(sum(epoch1, [])) == sorted(sum(epoch2, [])) == list(range(20))
    assert epoch1 != epoch2  # reshuffled each iteration
    other = make()
    assert [ints(x) for x in other] == epoch1 and [ints(x) for x in other] == epoch2


def test_optional_api():
    assert Optional is OptionalValue  # the TF name stays importable
    assert OptionalValue.from_value(3).get_value() == 3
    empty = Optional.empty(None)
    assert not empty.has_value()
    with pytest.raises(ValueError, match="has no value"):
        empty.get_value()


# -- distribute_datasets_from_function ----------------------------------------------------


def test_from_function_per_worker_takes_r_consecutive_elements():
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        batch = ctx.get_per_replica_batch_size(4)
        return Dataset.range(10).batch(batch)

    dist = distribute_datasets_from_function(dataset_fn, num_replicas_per_worker=2)
    assert [str(c) for c in contexts] == ["hpcdist.InputContext(input pipeline id 0, total: 1)"]
    assert contexts[0].num_replicas_in_sync == 2
    assert [local(x) for x in dist] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[8, 9], []],
    ]
    spec = dist.element_spec
    assert isinstance(spec, PerReplica) and spec.values[0].dtype == np.int64


def test_from_function_accepts_plain_iterables_and_generators():
    batches = [np.arange(3) + 3 * i for i in range(3)]
    dist = distribute_datasets_from_function(lambda ctx: batches)
    assert [ints(x) for x in dist] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [ints(x) for x in dist] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # re-iterable
    assert dist.element_spec is None

    gen = distribute_datasets_from_function(lambda ctx: (b for b in batches))
    assert len(list(gen)) == 3 and list(gen) == []  # a generator is consumed once

    with pytest.raises(TypeError, match="must return a Dataset or an iterable"):
        distribute_datasets_from_function(lambda ctx: 3)


def test_from_function_per_replica_calls_once_per_replica():
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return [np.full(2, ctx.input_pipeline_id)] * (ctx.input_pipeline_id + 1)

    options = InputOptions(experimental_replication_mode="PER_REPLICA")
    dist = distribute_datasets_from_function(
        dataset_fn, num_workers=1, num_replicas_per_worker=3, options=options
    )
    assert calls == [(3, 0, 3), (3, 1, 3), (3, 2, 3)]
    assert [local(x) for x in dist] == [
        [[0, 0], [1, 1], [2, 2]],
        [[], [1, 1], [2, 2]],
        [[], [], [2, 2]],
    ]


# -- argument checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": 2}, ValueError, "needs collectives"),
        ({"num_workers": 2, "worker_index": 2, "collectives": object()}, ValueError, "0 <= worker"),
        ({"num_replicas_per_worker": 2, "devices": ["/cpu:0"]}, ValueError, "1 devices were"),
        ({"num_workers": 2, "collectives": FakeGroup(3).rank(0)}, ValueError, "span 3 ranks"),
        ({"devices": [3]}, TypeError, "device string"),
        ({"num_replicas_per_worker": 0}, ValueError, "must be >= 1"),
    ],
)
def test_layout_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        distribute_dataset(Dataset.range(4).batch(2), **kwargs)


def test_devices_give_the_replica_count():
    dist = distribute_dataset(Dataset.range(4).batch(4), devices=["/cpu:0", "/cpu:1"])
    assert [local(x) for x in dist] == [[[0, 1], [2, 3]]]


def test_tensor_spec_is_the_datasets():
    dist = distribute_dataset(Dataset.range(4).batch(2))
    assert isinstance(dist.element_spec, TensorSpec) and dist.element_spec.shape == (None,)


def test_gpu_replicas_get_cupy_batches():
    cupy = pytest.importorskip("cupy")
    from hpcdist.distribute.devices import visible_gpu_count

    if visible_gpu_count() < 1:
        pytest.skip("needs a GPU")
    dist = distribute_dataset(Dataset.range(6).batch(4), devices=["/gpu:0"])
    first, last = list(dist)
    assert isinstance(first, cupy.ndarray) and first.get().tolist() == [0, 1, 2, 3]
    assert last.get().tolist() == [4, 5]
    host = distribute_dataset(
        Dataset.range(4).batch(4),
        devices=["/gpu:0"],
        options=InputOptions(experimental_fetch_to_device=False),
    )
    assert all(isinstance(x, np.ndarray) for x in host)
