"""Programs that diverge are caught (mpirun -n 3): a different function, then a different call.

1. The chief schedules ``on_chief``, the workers ``on_workers``: the worker that gets
   RUN 0 refuses it; ``join`` raises ProgramsDivergedError on every rank.
2. The chief calls ``join``, the workers ``done``: each worker raises
   ProgramsDivergedError; the chief's join returns. Every rank still ends cleanly.
"""

from __future__ import annotations

from _fake import FakeStrategy, report

from hpcdist.distribute.coordinator import ClusterCoordinator, ProgramsDivergedError

strategy = FakeStrategy()
roles = strategy.extended._roles
coordinator = ClusterCoordinator(strategy)
chief = roles.rank == roles.chief_rank
log = []


def on_chief():
    return 1


def on_workers():
    return 2


coordinator.schedule(on_chief if chief else on_workers)
try:
    coordinator.join()
    log.append(["different function", "no error"])
except ProgramsDivergedError as e:
    log.append(["different function", "ProgramsDivergedError", str(e)])

try:
    if chief:
        coordinator.join()
    else:
        coordinator.done()
    log.append(["different call", "no error"])
except ProgramsDivergedError as e:
    log.append(["different call", "ProgramsDivergedError", str(e)])
report("LOG", log)
