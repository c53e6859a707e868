"""Distributed input on real ranks: sharding unions, reproducible shuffles, uneven ends.

Run under ``mpirun -n 2`` and ``-n 4``. Each rank is one worker of a
``MultiWorkerMirroredStrategy`` (with one or two CPU replicas); every rank
iterates the same number of steps (the end of data is agreed), then the
ranks compare what they saw with plain (pickling) mpi4py calls.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.data.dataset import Dataset
from hpcdist.data.distributed import (
    DistributedInputError,
    distribute_dataset,
    distribute_datasets_from_function,
)
from hpcdist.data.input_context import InputOptions
from hpcdist.data.options import AutoShardPolicy, Options
from hpcdist.distribute.values import PerReplica
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi(min_size=2)

_STRATEGIES: dict[int, hd.MultiWorkerMirroredStrategy] = {}


def strategy(replicas: int) -> hd.MultiWorkerMirroredStrategy:
    """One strategy per replica count, built once on every rank (construction is collective)."""
    if replicas not in _STRATEGIES:
        devices = [f"/cpu:{i}" for i in range(replicas)]
        _STRATEGIES[replicas] = hd.MultiWorkerMirroredStrategy(devices=devices)
    return _STRATEGIES[replicas]


def distribute(ds, replicas: int, **kwargs):
    ext = strategy(replicas).extended
    return distribute_dataset(
        ds,
        num_workers=ext._num_workers,
        worker_index=ext._worker_index,
        num_replicas_per_worker=ext._num_local_replicas,
        collectives=ext._collectives,
        devices=ext._devices,
        **kwargs,
    )


def from_function(fn, replicas: int, **kwargs):
    ext = strategy(replicas).extended
    return distribute_datasets_from_function(
        fn,
        num_workers=ext._num_workers,
        worker_index=ext._worker_index,
        num_replicas_per_worker=ext._num_local_replicas,
        collectives=ext._collectives,
        devices=ext._devices,
        **kwargs,
    )


def with_policy(ds: Dataset, policy: str) -> Dataset:
    options = Options()
    options.distribute.auto_shard_policy = policy
    return ds.with_options(options)


def values_of(x) -> list[np.ndarray]:
    return list(x.values) if isinstance(x, PerReplica) else [x]


def run_epoch(dist) -> tuple[list[int], list[list[int]]]:
    """Every element this rank saw, and the sub-batch sizes of each step."""
    seen, sizes = [], []
    for x in dist:
        vals = values_of(x)
        sizes.append([len(v) for v in vals])
        seen += [int(i) for v in vals for i in np.asarray(v).ravel()]
    return seen, sizes


def everyone(value):
    return world().comm.allgather(value)


@pytest.fixture(scope="module")
def shared_dir():
    """A directory all ranks see: made by rank 0, removed by it after the module."""
    comm = world().comm
    path = tempfile.mkdtemp(prefix="hpcdist-input-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    yield Path(path)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def write_files(directory: Path, name: str, rows: list[int]) -> list[str]:
    """Rank 0 writes ``rows[i]`` consecutive int64 values to file i; every rank waits."""
    comm = world().comm
    paths, start = [], 0
    for i, n in enumerate(rows):
        path = directory / f"{name}-{i:03d}.npy"
        if comm.Get_rank() == 0:
            np.save(path, np.arange(start, start + n, dtype=np.int64))
        paths.append(str(path))
        start += n
    comm.Barrier()
    return paths


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize(("n", "g"), [(103, 10), (40, 8), (5, 8)])
def test_data_union_is_the_dataset(replicas, n, g):
    ds = with_policy(Dataset.range(n).batch(g), "DATA")
    dist = distribute(ds, replicas)
    assert dist.auto_shard_policy is AutoShardPolicy.DATA
    seen, sizes = run_epoch(dist)
    all_seen = sum(everyone(seen), [])
    assert sorted(all_seen) == list(range(n))  # nothing lost, no duplicates
    all_sizes = everyone(sizes)
    steps = -(-n // g)
    assert {len(s) for s in all_sizes} == {steps}
    for i in range(steps):  # each step consumes one global batch over all replicas
        assert sum(sum(s[i]) for s in all_sizes) == min(g, n - i * g)
        flat = [k for s in all_sizes for k in s[i]]
        assert max(flat) - min(flat) <= 1


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("policy", ["FILE", "AUTO"])
def test_file_union_is_the_dataset_with_uneven_files(shared_dir, replicas, policy):
    size = world().size
    rows = [(7 * i) % 11 + 1 for i in range(2 * size + 1)]  # uneven files, uneven workers
    paths = write_files(shared_dir, f"uneven-{policy}-{replicas}", rows)
    ds = with_policy(Dataset.from_files(paths).read_npy().batch(5), policy)
    dist = distribute(ds, replicas)
    assert dist.auto_shard_policy is AutoShardPolicy.FILE
    seen, sizes = run_epoch(dist)
    assert len(set(everyone(len(sizes)))) == 1  # all ranks ended at the same step
    all_seen = sum(everyone(seen), [])
    assert sorted(all_seen) == list(range(sum(rows)))
    mine = sorted(i for p in paths[world().rank :: size] for i in np.load(p).tolist())
    assert sorted(seen) == mine  # this worker read its own files only


def test_auto_falls_back_to_data_with_fewer_files_than_workers(shared_dir):
    size = world().size
    paths = write_files(shared_dir, "few", [9] * (size - 1))
    dist = distribute(Dataset.from_files(paths).read_npy().batch(4), 2)
    assert dist.auto_shard_policy is AutoShardPolicy.DATA
    seen, _ = run_epoch(dist)
    assert sorted(sum(everyone(seen), [])) == list(range(9 * (size - 1)))


def test_file_policy_with_fewer_files_than_workers_raises_everywhere(shared_dir):
    size = world().size
    paths = write_files(shared_dir, "too-few", [3] * (size - 1))
    ds = with_policy(Dataset.from_files(paths).read_npy().batch(2), "FILE")
    with pytest.raises(ValueError, match=f"{size - 1} file\\(s\\) for {size} workers"):
        distribute(ds, 1)


def test_off_feeds_every_worker_everything():
    ds = with_policy(Dataset.range(30).batch(6), "OFF")
    seen, _ = run_epoch(distribute(ds, 2))
    assert sorted(seen) == list(range(30))


@pytest.mark.parametrize("replicas", [1, 2])
def test_seeded_shuffle_is_reproducible_and_partitions(replicas):
    def make():
        ds = Dataset.range(64).shuffle(64, seed=11).batch(8)
        return distribute(with_policy(ds, "DATA"), replicas)

    dist = make()
    epoch1, _ = run_epoch(dist)
    epoch2, _ = run_epoch(dist)
    for epoch in (epoch1, epoch2):
        assert sorted(sum(everyone(epoch), [])) == list(range(64))
    assert epoch1 != epoch2  # reshuffled each epoch
    again1, _ = run_epoch(make())
    assert again1 == epoch1  # same seed, same order on this rank


def test_seeded_file_shuffle_is_reproducible(shared_dir):
    size = world().size
    paths = write_files(shared_dir, "shuffled", [6] * (2 * size))

    def make():
        files = Dataset.list_files(str(shared_dir / "shuffled-*.npy"), shuffle=True, seed=3)
        return distribute(files.read_npy().shuffle(8, seed=4).batch(4), 1)

    first, _ = run_epoch(make())
    again, _ = run_epoch(make())
    assert first == again
    assert sorted(sum(everyone(first), [])) == list(range(6 * len(paths)))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("buffer_size", [0, 1])  # read in the caller's thread / ahead
def test_uneven_dataset_fn_does_not_hang_and_ends_together(replicas, generator, buffer_size):
    rank = world().rank

    def dataset_fn(ctx):
        assert ctx.input_pipeline_id == rank
        batch = ctx.get_per_replica_batch_size(2 * ctx.num_replicas_in_sync)
        ds = Dataset.range(batch * (rank + 1) * 3).batch(batch)
        return (b for b in ds) if generator else ds

    steps = 0
    nonempty = 0
    options = InputOptions(experimental_per_replica_buffer_size=buffer_size)
    it = iter(from_function(dataset_fn, replicas, options=options))
    assert it.reads_ahead is (buffer_size > 0)  # several workers: ahead unless told not to
    for x in it:
        steps += 1
        nonempty += sum(len(v) > 0 for v in values_of(x))
    size = world().size
    expected_steps = -(-(size * 3) // replicas)  # the last rank has the most batches
    assert everyone(steps) == [expected_steps] * size
    assert nonempty == (rank + 1) * 3


@pytest.mark.parametrize("buffer_size", [0, 1])  # read in the caller's thread / ahead
@pytest.mark.parametrize("num_parallel_calls", [None, 2])
def test_pipeline_error_on_one_rank_is_raised_on_every_rank(num_parallel_calls, buffer_size):
    rank = world().rank

    def check(batch):
        if rank == 1 and int(batch[0]) >= 20:
            raise KeyError("corrupt record on rank 1")
        return batch

    batches = Dataset.range(40).batch(4)
    ds = with_policy(batches.map(check, num_parallel_calls=num_parallel_calls), "DATA")
    expected = KeyError if rank == 1 else DistributedInputError
    options = InputOptions(experimental_per_replica_buffer_size=buffer_size)
    with pytest.raises(expected):
        run_epoch(distribute(ds, 1, options=options))
    world().comm.Barrier()


def test_strategy_run_on_distributed_batches():
    s = strategy(2)
    dist = distribute(Dataset.range(16).batch(8), 2)
    total = 0.0
    for x in dist:
        per_replica = s.run(lambda b: np.asarray(b, np.float64).sum(), args=(x,))
        total += float(s.reduce("SUM", per_replica, axis=None))
    assert total == float(sum(range(16)))
