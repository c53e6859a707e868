"""ClusterCoordinator with the real ParameterServerStrategy (mpirun -n 4: chief, ps, 2 workers).

Closures update a variable on the ps and read per-worker datasets built with
``strategy.distribute_datasets_from_function``; the chief checks the count.
"""

from __future__ import annotations

import time

import numpy as np
from _fake import report

import hpcdist as hd
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.distribute.coordinator import (
    ClusterCoordinator,
    experimental_get_current_worker_index,
)
from hpcdist.distribute.ps.strategy import ParameterServerStrategy

strategy = ParameterServerStrategy(MPIClusterResolver(jobs={"chief": 1, "ps": 1, "worker": 2}))
coordinator = ClusterCoordinator(strategy)  # the ps rank never gets here: it served and exited
with strategy.scope():
    counter = hd.Variable(np.zeros(2))


def step():
    counter.assign_add(np.array([1.0, 2.0]))
    return experimental_get_current_worker_index()


rvs = [coordinator.schedule(step) for _ in range(20)]
coordinator.join()
workers = sorted(set(coordinator.fetch(rvs)))


def dataset_fn():
    w = experimental_get_current_worker_index()
    return strategy.distribute_datasets_from_function(
        lambda ctx: [np.full(2, 10 * w + i, np.int64) for i in range(3)]
    )


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


def read(it):
    batch = next(it)
    out = strategy.run(lambda x: x * 2, args=(batch,))
    return [experimental_get_current_worker_index(), strategy.experimental_local_results(out)[0]]


got = coordinator.fetch([coordinator.schedule(read, args=(iterator,)) for _ in range(4)])
per_worker: dict = {}
for w, value in got:
    per_worker.setdefault(int(w), []).append(value.tolist())
shards_ok = all(
    vs == [[2 * (10 * w + i)] * 2 for i in range(len(vs))] for w, vs in per_worker.items()
)
deadline = time.monotonic() + 10  # updates from the workers reach the ps asynchronously
while counter.numpy()[1] < 40 and time.monotonic() < deadline:
    time.sleep(0.01)
reads = sum(len(v) for v in per_worker.values())
facts = {"workers": workers, "counter": counter.numpy().tolist(), "shards_ok": shards_ok}
report("PS", {**facts, "reads": reads})
