"""The ranks pass gradients of different shapes to one allreduce (a model built differently).

Usage: ``mpirun -n 2 python shape_mismatch.py``. The last rank's "gradient" has one
element more than the others'. With ``HPCDIST_TIMEOUT_SECONDS`` set (checked mode)
or not, every rank raises ``CollectiveMismatchError`` naming which ranks passed
which shape, and the uncaught error aborts the job: no hang, no corrupted sum.
"""

from __future__ import annotations

import numpy as np

import hpcdist as hd
from hpcdist.runtime import world


def main() -> None:
    rank, size = world().rank, world().size
    strategy = hd.MultiWorkerMirroredStrategy()
    # A few good steps first, so that the mismatch is not the first collective.
    for step in range(3):
        strategy.reduce(hd.ReduceOp.SUM, np.full(6, step, np.float32), axis=None)
    width = 7 if rank == size - 1 else 6
    grad = np.ones(width, np.float32)
    total = strategy.reduce(hd.ReduceOp.SUM, grad, axis=None)
    print(f"rank {rank}: reduced {total} (unexpected)", flush=True)


if __name__ == "__main__":
    main()
