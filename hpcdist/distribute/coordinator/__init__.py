"""TF2-style parameter-server training over MPI: ``ClusterCoordinator`` on the chief.

``ClusterCoordinator(strategy)`` schedules functions on the worker ranks of a
``ParameterServerStrategy``; every rank runs the same program (see
:mod:`.cluster_coordinator`). ``RemoteValue`` is a scheduled function's future
result; ``PerWorkerValues`` holds one value per worker.

Example: ``coordinator = ClusterCoordinator(strategy)``;
``rv = coordinator.schedule(step_fn, args=(iter(per_worker_dataset),))``;
``coordinator.join()``; ``rv.fetch()``.
"""

from hpcdist.distribute.coordinator.cluster_coordinator import (
    CLOSURE_QUEUE_MAX_SIZE,
    ClusterCoordinator,
    experimental_get_current_worker_index,
)
from hpcdist.distribute.coordinator.follower import WorkerCoordinator
from hpcdist.distribute.coordinator.remote_value import (
    CancelledError,
    OutOfRangeError,
    PerWorkerDataset,
    PerWorkerIterator,
    PerWorkerValue,
    PerWorkerValues,
    ProgramsDivergedError,
    RemoteError,
    RemoteValue,
    UnavailableError,
)

__all__ = [
    "CLOSURE_QUEUE_MAX_SIZE",
    "CancelledError",
    "ClusterCoordinator",
    "OutOfRangeError",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "PerWorkerValue",
    "PerWorkerValues",
    "ProgramsDivergedError",
    "RemoteError",
    "RemoteValue",
    "UnavailableError",
    "WorkerCoordinator",
    "experimental_get_current_worker_index",
]
