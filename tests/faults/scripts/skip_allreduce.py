"""One rank skips one allreduce of a custom training loop (MultiWorkerMirroredStrategy).

Usage: ``mpirun -n 2 python skip_allreduce.py [then]``, ``then`` being

* ``finish`` (default): after the loop every rank just ends. The others wait in their
  last allreduce, which the skipping rank never joins: ``CollectiveTimeoutError``
  naming that rank (``HPCDIST_TIMEOUT_SECONDS`` must be set);
* ``summary``: after the loop every rank reduces a summary of another shape, which
  the skipping rank reaches one collective early: ``CollectiveMismatchError`` on
  every rank, naming who passed what.

Either error is uncaught and aborts the job: no hang. The skipping rank (the last
one) prints ``SKIP rank R skips step S``.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcdist as hd
from hpcdist.runtime import world

STEPS = 8
SKIPPED_STEP = 3


def main() -> None:
    then = sys.argv[1] if len(sys.argv) > 1 else "finish"
    rank, size = world().rank, world().size
    skipper = size - 1
    strategy = hd.MultiWorkerMirroredStrategy()
    weights = np.zeros(10, np.float32)
    for step in range(STEPS):
        grad = np.full(10, rank + step, np.float32)
        if rank == skipper and step == SKIPPED_STEP:
            print(f"SKIP rank {rank} skips step {step}", flush=True)
            continue
        total = strategy.reduce(hd.ReduceOp.SUM, grad, axis=None)
        weights -= 0.01 * np.asarray(total)
    if then == "summary":
        summary = strategy.reduce(hd.ReduceOp.MAX, np.array([weights.sum(), 1.0]), axis=None)
        print(f"rank {rank}: summary {summary} (unexpected)", flush=True)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
