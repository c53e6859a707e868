"""ClusterCoordinator on a chief and 2 workers (mpirun -n 3): every rank runs this program.

Each rank logs what its calls returned or raised; the test checks the chief's log
and that every worker's log is the same. Chief-only facts go to a separate report.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from _fake import FakeStrategy, report

from hpcdist.distribute.coordinator import (
    CLOSURE_QUEUE_MAX_SIZE,
    ClusterCoordinator,
    OutOfRangeError,
    experimental_get_current_worker_index,
)
from hpcdist.distribute.values import PerReplica

strategy = FakeStrategy()
roles = strategy.extended._roles
coordinator = ClusterCoordinator(strategy)
log: list = []
chief_facts: dict = {}
built_on: list = []


def outcome(call):
    """What a call gave, as JSON: ["ok", value] or ["raised", type name, message]."""
    try:
        return ["ok", call()]
    except Exception as e:
        return ["raised", type(e).__name__, str(e)]


def square(x):
    time.sleep(0.005)
    return {"x": np.int64(x * x), "worker": experimental_get_current_worker_index()}


# 1. results and their order; both workers work.
rvs = [coordinator.schedule(square, args=(x,)) for x in range(20)]
coordinator.join()
got = coordinator.fetch(rvs)
log.append(["squares", [int(g["x"]) for g in got]])
log.append(["workers used", sorted({g["worker"] for g in got})])
log.append(["rv.fetch", int(rvs[7].fetch()["x"]), int(rvs[7].get()["x"])])

# 2. done() before and after join.
log.append(["done with nothing scheduled", coordinator.done()])
slow = coordinator.schedule(lambda: time.sleep(0.3) or 1)
log.append(["done while running", coordinator.done()])
coordinator.join()
log.append(["done after join", coordinator.done(), slow.fetch()])


# 3. fetch of a structure, PerReplica results.
def structured():
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "s": "text", "n": None}


a = coordinator.schedule(structured)
b = coordinator.schedule(lambda: PerReplica((np.float32(1.5), np.float32(2.5))))
out = coordinator.fetch({"a": a, "b": [b, 5], "c": (None, "s")})
w = out["a"]["w"]
per = out["b"][0]
log.append(
    [
        "structure",
        w.dtype.name,
        list(w.shape),
        w.tolist(),
        out["a"]["s"],
        out["a"]["n"],
        type(per).__name__,
        [float(v) for v in per.values],
        out["b"][1],
        list(out["c"]),
    ]
)


# 4. an error surfaces once, at the next join, on every rank; the rest is cancelled.
def bad():
    raise ValueError("boom", 7)


first = coordinator.schedule(lambda: time.sleep(0.4) or "slow ok")
failing = coordinator.schedule(bad)
rest = [coordinator.schedule(square, args=(x,)) for x in range(6)]
try:
    coordinator.join()
    log.append(["join after error", "no error"])
except ValueError as e:
    log.append(["join after error", "ValueError", list(e.args), "boom" in e.remote_traceback])
log.append(["join again", outcome(coordinator.join)])
log.append(["first", outcome(first.fetch)])
log.append(["failing", outcome(failing.fetch)[:2]])
cancelled = [outcome(r.fetch)[1] for r in rest]
log.append(["rest", cancelled])
log.append(["after the error", int(coordinator.schedule(square, args=(3,)).fetch()["x"])])
log.append(["done", coordinator.done()])

# 5. a result that cannot be sent: MessageEncodeError (a TypeError) on the worker, raised on
# every rank.
coordinator.schedule(lambda: object())
res = outcome(coordinator.join)
log.append(["bad result", res[:2], "cannot return" in res[-1]])
try:
    coordinator.schedule(lambda: object())
    coordinator.join()
except TypeError as e:  # what code written for a plain TypeError catches
    log.append(["bad result is a TypeError", type(e).__name__])


# 6. per-worker datasets: each worker iterates its own shard, the chief never builds one.
def dataset_fn():
    built_on.append(roles.rank)
    w = experimental_get_current_worker_index()
    return [np.int64(100 * w + i) for i in range(5)]


per_worker = coordinator.create_per_worker_dataset(dataset_fn)
iterator = iter(per_worker)


def take(it):
    return [experimental_get_current_worker_index(), next(it)]


takes = coordinator.fetch([coordinator.schedule(take, args=(iterator,)) for _ in range(6)])
by_worker: dict = {}
for wk, v in takes:
    by_worker.setdefault(int(wk), []).append(int(v))
shards_ok = all(vs == [100 * wk + i for i in range(len(vs))] for wk, vs in by_worker.items())
log.append(["per-worker shards in order", shards_ok, sum(len(v) for v in by_worker.values())])
for _ in range(5 * len(roles.worker_ranks)):
    coordinator.schedule(take, args=(iterator,))
log.append(["exhausted", outcome(coordinator.join)[:2], OutOfRangeError.__name__])
again = iter(per_worker)  # a new epoch starts each worker's dataset again
restart = coordinator.fetch(coordinator.schedule(take, args=(again,)))
log.append(["new iterator restarts", int(restart[1]) == 100 * int(restart[0])])
chief_facts["dataset_fn calls on the chief"] = built_on.count(0)

# 7. more closures than the queue holds: schedule blocks, nothing is lost. The closures
# wait for a file the chief creates once its queue is full, so the queue fills however
# loaded the machine is (the test gives every rank the same fresh path).
release = Path(os.environ["COORDINATOR_TEST_RELEASE"])


def held(i):
    while not release.exists():
        time.sleep(0.002)
    return i


biggest = 0
many = []
for i in range(CLOSURE_QUEUE_MAX_SIZE + 50):
    many.append(coordinator.schedule(held, args=(i,)))
    if roles.chief_rank == roles.rank:
        biggest = max(biggest, len(coordinator._queue))
        if biggest >= CLOSURE_QUEUE_MAX_SIZE:
            release.touch()  # the next schedule would block: let the workers go
if roles.chief_rank == roles.rank:  # (the workers get here at once: schedule records there)
    release.touch()  # (if the queue never filled: the check below says so, nothing hangs)
coordinator.join()
log.append(["many", coordinator.fetch(many) == list(range(CLOSURE_QUEUE_MAX_SIZE + 50))])
chief_facts["largest queue"] = biggest

# 8. misuse, the same on every rank.
log.append(["worker index outside", outcome(experimental_get_current_worker_index)[:2]])
log.append(["schedule(3)", outcome(lambda: coordinator.schedule(3))[:2]])
log.append(
    ["RemoteValue argument", outcome(lambda: coordinator.schedule(len, args=(many[0],)))[:2]]
)
log.append(["same coordinator", ClusterCoordinator(strategy) is coordinator])

report("LOG", log)
if roles.rank == roles.chief_rank:
    report("CHIEF", chief_facts)
