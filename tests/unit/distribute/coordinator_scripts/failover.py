"""A worker dies and its closure runs elsewhere (mpirun --with-ft ulfm -n 4: chief + 3 workers).

Worker 2 SIGKILLs itself inside the third closure it runs. The chief must still fetch
exactly ``[x * x for x in range(30)]``; the surviving ranks end with status 0.
"""

from __future__ import annotations

import atexit
import os
import signal
import time

import numpy as np
from _fake import FakeStrategy, report

from hpcdist.distribute.coordinator import (
    ClusterCoordinator,
    experimental_get_current_worker_index,
)

strategy = FakeStrategy()
roles = strategy.extended._roles
# Registered before the coordinator's own exit handler, so it runs after it.
atexit.register(lambda: report("EXITED", roles.task_type))
coordinator = ClusterCoordinator(strategy)
ran = [0]


def work(x):
    ran[0] += 1
    if experimental_get_current_worker_index() == 2 and ran[0] == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
    return np.int64(x * x)


rvs = [coordinator.schedule(work, args=(x,)) for x in range(30)]
coordinator.join()
results = [int(v) for v in coordinator.fetch(rvs)]
if roles.rank == roles.chief_rank:
    report("RESULTS", results)
    report("ALIVE", coordinator._alive)
# A second round runs on the survivors only.
more = coordinator.fetch([coordinator.schedule(work, args=(x,)) for x in range(6)])
report("MORE", [int(v) for v in more])
