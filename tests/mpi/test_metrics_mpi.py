"""Metrics under MultiWorkerMirroredStrategy: each rank's data, one batched reduction.

Run under ``mpirun -n 2`` and ``-n 4``. Every rank updates its metrics with its
own batches (different sizes on different ranks); ``results()`` on every rank
must equal the metrics over the data of all ranks, computed locally with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn.metrics import Mean, results
from hpcdist.runtime import world
from tests.unit.nn.test_metrics import make_batches, make_metrics, reference, update

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]

_STRATEGIES: dict[int, hd.MultiWorkerMirroredStrategy] = {}


def strategy_with(local: int) -> hd.MultiWorkerMirroredStrategy:
    """One strategy per number of local replicas for the whole run (construction is collective)."""
    if local not in _STRATEGIES:
        devices = None if local == 1 else [f"/cpu:{i}" for i in range(local)]
        _STRATEGIES[local] = hd.MultiWorkerMirroredStrategy(devices=devices)
    return _STRATEGIES[local]


@pytest.mark.parametrize("local", [1, 2])
def test_results_equal_the_metrics_of_all_ranks_data(local, monkeypatch):
    strategy = strategy_with(local)
    rank, size = world().rank, world().size
    n_replicas = strategy.num_replicas_in_sync
    assert n_replicas == local * size
    with strategy.scope():
        ms = make_metrics()
    batches = {r: make_batches(100 + r) for r in range(n_replicas)}  # every replica's data
    extra = {w: make_batches(500 + w, n_batches=1) for w in range(size)}  # cross-replica updates
    for step in range(3):
        batch = strategy.experimental_distribute_values_from_function(
            lambda ctx, s=step: batches[ctx.replica_id_in_sync_group][s]
        )
        strategy.run(lambda b: update(ms, b), args=(batch,))
    update(ms, extra[rank][0])  # cross-replica context: this worker's own data

    calls = []
    collectives = strategy.extended._collectives
    original = collectives.allreduce

    def counting(tensors, *args, **kwargs):
        calls.append(len(tensors))
        return original(tensors, *args, **kwargs)

    monkeypatch.setattr(collectives, "allreduce", counting)
    got = results(ms)
    assert calls == [sum(len(m.variables) for m in ms)]  # ONE batched collective
    monkeypatch.setattr(collectives, "allreduce", original)

    union = [b for r in range(n_replicas) for b in batches[r]] + [extra[w][0] for w in range(size)]
    np.testing.assert_allclose(got, reference(union), rtol=1e-12)
    np.testing.assert_allclose([m.result() for m in ms], got, rtol=1e-12)  # one by one
    everyone = world().comm.allgather(got)
    assert all(np.array_equal(everyone[0], g) for g in everyone)

    for m in ms:
        m.reset_state()
    assert results(ms) == [0.0] * len(ms)


def test_uneven_counts_give_the_exact_global_mean():
    strategy = strategy_with(1)
    rank, size = world().rank, world().size
    with strategy.scope():
        m = Mean()
    values = np.arange(rank * 3, dtype=np.float64)  # rank 0 has no data at all
    strategy.run(m.update_state, args=(values,))
    everything = np.concatenate([np.arange(r * 3, dtype=np.float64) for r in range(size)])
    assert m.result() == pytest.approx(everything.mean(), rel=1e-15)
