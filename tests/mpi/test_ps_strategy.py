"""ParameterServerStrategy end to end: roles, placement, exact counts, async optimizer updates.

Run under ``mpirun -n 2`` and ``-n 4``: the first ranks are ps tasks, the rest
workers. Each test builds its own strategy (collective); on the ps ranks the
constructor serves until every worker has shut down, then returns
(``exit_after_serving=False``) and the test checks what the server reports.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.distribute.partitioners import FixedShardsPartitioner
from hpcdist.distribute.ps.strategy import ParameterServerStrategy, get_or_create_global_step
from hpcdist.distribute.ps.variable import PSVariable
from hpcdist.distribute.sharded_variable import ShardedVariable, embedding_lookup
from hpcdist.errors import ClusterConfigError
from hpcdist.optimizers import SGD

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def make(num_ps: int = 1, **kwargs):
    """``(strategy, workers_comm)``: the strategy and a communicator of the workers (or None)."""
    comm = world()
    jobs = {"ps": num_ps, "worker": comm.Get_size() - num_ps}
    resolver = MPIClusterResolver(jobs=jobs)
    is_ps = resolver.task_type == "ps"
    workers = comm.Split(1 if is_ps else 0, comm.Get_rank())
    strategy = ParameterServerStrategy(resolver, exit_after_serving=False, **kwargs)
    if is_ps:
        workers.Free()
        return strategy, None
    return strategy, workers


def until(done, seconds: float = 10.0) -> None:
    """Wait for ``done()``: other workers' requests sent before a barrier may still be in flight
    to the ps (MPI orders messages per sender, not across senders); none is ever lost."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_roles_placement_and_clean_shutdown():
    num_ps = 2 if world().Get_size() >= 4 else 1
    strategy, workers = make(num_ps)
    if workers is None:
        assert strategy.is_ps and strategy.served is not None
        return
    assert strategy.num_replicas_in_sync == 1
    assert strategy.extended.parameter_devices == tuple(
        f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(num_ps)
    )
    with strategy.scope():
        vs = [hd.Variable(np.float32(i), name=f"v{i}") for i in range(4)]
    assert all(isinstance(v, PSVariable) for v in vs)
    assert [v.device for v in vs] == [
        f"/job:ps/replica:0/task:{i % num_ps}/device:CPU:0" for i in range(4)
    ]
    assert [float(v.numpy()) for v in vs] == [0.0, 1.0, 2.0, 3.0]
    workers.Barrier()
    strategy.shutdown()
    strategy.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        with strategy.scope():
            hd.Variable(1.0)
    workers.Free()


def test_initial_value_is_the_initializers_and_counts_are_exact():
    strategy, workers = make()
    if workers is None:
        return
    rank = world().Get_rank()
    with strategy.scope():
        v = hd.Variable(np.full(3, float(rank)), name="init")
        count = hd.Variable(np.int64(0), name="count")
        step = get_or_create_global_step()
    assert get_or_create_global_step(strategy) is step
    first_worker = world().Get_size() - workers.Get_size()
    np.testing.assert_array_equal(v.numpy(), np.full(3, float(first_worker)))
    for _ in range(1000):
        count.assign_add(np.int64(1))
        step.assign_add(np.int64(1))
    workers.Barrier()  # every worker's adds were sent before the barrier, in order
    n = workers.Get_size()
    until(lambda: int(count.numpy()) >= n * 1000 and int(step.numpy()) >= n * 1000)
    assert int(count.numpy()) == n * 1000
    assert int(step.numpy()) == n * 1000
    workers.Barrier()
    strategy.shutdown()
    workers.Free()


def test_async_sgd_updates_from_every_worker_are_applied():
    strategy, workers = make()
    if workers is None:
        return
    with strategy.scope():
        w = hd.Variable(np.zeros((3, 2)), name="w")
        b = hd.Variable(np.zeros(2), name="b")
        opt = SGD(learning_rate=0.5)
    steps = 7
    for _ in range(steps):
        strategy.run(
            lambda: opt.apply_gradients([(np.ones((3, 2)), w), (np.full(2, 2.0), b)])
        )
    workers.Barrier()
    n = workers.Get_size()
    expected_iterations = n * steps
    until(lambda: float(b.numpy()[0]) <= -1.0 * n * steps)
    np.testing.assert_array_equal(w.numpy(), np.full((3, 2), -0.5 * n * steps))
    np.testing.assert_array_equal(b.numpy(), np.full(2, -1.0 * n * steps))
    assert int(opt.iterations.numpy()) == expected_iterations
    stats = strategy.extended._client.stats(0)
    assert stats["applies"] >= n * steps
    workers.Barrier()
    strategy.shutdown()
    workers.Free()


def test_sharded_variable_lookup_and_sparse_update():
    num_ps = 2 if world().Get_size() >= 4 else 1
    strategy, workers = make(num_ps, variable_partitioner=FixedShardsPartitioner(3))
    if workers is None:
        return
    table = np.arange(26, dtype=np.float64).reshape(13, 2)
    with strategy.scope():
        emb = hd.Variable(table, name="emb")
        opt = SGD(learning_rate=1.0)
    assert isinstance(emb, ShardedVariable)
    assert [s.shape for s in emb.variables] == [(5, 2), (4, 2), (4, 2)]
    assert [s.name for s in emb.variables] == ["emb/part_0", "emb/part_1", "emb/part_2"]
    np.testing.assert_array_equal(emb.numpy(), table)
    ids = np.array([[0, 12], [5, 5]])
    np.testing.assert_array_equal(embedding_lookup(emb, ids), table[ids])
    workers.Barrier()
    if workers.Get_rank() == 0:  # one worker updates rows 5 (twice) and 12 sparsely
        from hpcdist.distribute.indexed_slices import IndexedSlices

        grad = IndexedSlices(np.ones((3, 2)), np.array([5, 12, 5]), (13, 2))
        opt.apply_gradients([(grad, emb)])
    workers.Barrier()
    expected = table.copy()
    expected[5] -= 2.0
    expected[12] -= 1.0
    until(lambda: np.array_equal(emb.numpy(), expected))
    np.testing.assert_array_equal(emb.numpy(), expected)
    workers.Barrier()
    strategy.shutdown()
    workers.Free()


def test_local_replicas_are_synchronous_inside_a_worker():
    strategy, workers = make(devices=["/cpu:0", "/cpu:1"])
    if workers is None:
        return
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        v = hd.Variable(np.zeros(2), name="v")
        total = hd.Variable(0.0, name="total", aggregation="sum")
        opt = SGD(learning_rate=1.0)

    def step():
        ctx = hd.get_replica_context()
        seen = v.numpy().copy()
        opt.apply_gradients([(np.full(2, ctx.replica_id_in_sync_group + 1.0), v)])
        total.assign_add(1.0)
        return seen

    out = strategy.run(step)
    a, b = strategy.experimental_local_results(out)
    np.testing.assert_array_equal(a, b)  # both replicas saw the same pulled value
    workers.Barrier()
    n = workers.Get_size()
    until(lambda: float(total.numpy()) >= 2.0 * n and float(v.numpy()[0]) <= -3.0 * n)
    np.testing.assert_array_equal(v.numpy(), np.full(2, -3.0 * n))  # one push per worker
    assert float(total.numpy()) == 2.0 * n  # SUM of two replicas' writes, sent once
    workers.Barrier()
    strategy.shutdown()
    workers.Free()


@pytest.mark.parametrize(
    "jobs, message",
    [
        (lambda n: {"worker": n}, "no rank is a 'ps' task"),
        (lambda n: {"ps": n}, "no rank is a 'worker' task"),
    ],
)
def test_bad_layouts_raise_on_every_rank(jobs, message):
    n = world().Get_size()
    with pytest.raises(ClusterConfigError, match=message):
        ParameterServerStrategy(MPIClusterResolver(jobs=jobs(n)), exit_after_serving=False)
