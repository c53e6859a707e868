"""A worker dies under the real ParameterServerStrategy (mpirun --with-ft ulfm -n 5).

Chief, 1 ps, 3 workers. Each closure adds 1 to a counter on the ps and returns
its argument squared; worker 1 SIGKILLs itself in its second closure, before it
touches the counter. The chief must fetch every result, the ps must keep
serving the survivors, the counter must be exactly the number of closures that
finished, and every surviving rank (the ps too) ends with status 0.
"""

from __future__ import annotations

import os
import signal
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

strategy = ParameterServerStrategy(MPIClusterResolver(jobs={"chief": 1, "ps": 1, "worker": 3}))
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    counter = hd.Variable(np.int64(0), name="finished")
ran = [0]


def work(x):
    ran[0] += 1
    if experimental_get_current_worker_index() == 1 and ran[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    counter.assign_add(np.int64(1))
    return np.int64(x * x)


rvs = [coordinator.schedule(work, args=(x,)) for x in range(24)]
coordinator.join()
results = [int(v) for v in coordinator.fetch(rvs)]
if strategy.cluster_resolver.task_type == "chief":
    deadline = time.monotonic() + 10
    while int(counter.numpy()) < 24 and time.monotonic() < deadline:
        time.sleep(0.01)
    report("RESULTS", results)
    report("COUNTER", int(counter.numpy()))
    report("ALIVE", coordinator._alive)
