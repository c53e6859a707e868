"""One rank sleeps for ever in the middle of ``model.fit`` (MultiWorkerMirroredStrategy).

Run with ``HPCDIST_TIMEOUT_SECONDS`` set: the other ranks wait in the next gradient
allreduce, warn after the stall threshold, then raise ``CollectiveTimeoutError``
naming the sleeping rank; the uncaught error aborts the whole job (non-zero exit).
Without a timeout the job would hang: that is the bug this guards against.

Usage: ``mpirun -n 2 python hang_sleep.py [SLEEPING_RANK] [BATCH]``. The sleeping rank
prints ``HANG rank R sleeping at <unix time>`` first.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import hpcdist as hd
from hpcdist.nn import Dense, Sequential
from hpcdist.runtime import world


class SleepForever(hd.callbacks.Callback):
    """On rank ``rank``, after batch ``batch`` of the first epoch: sleep and never come back."""

    def __init__(self, rank: int, batch: int) -> None:
        super().__init__()
        self.rank, self.batch = rank, batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch and world().rank == self.rank:
            print(f"HANG rank {self.rank} sleeping at {time.time():.3f}", flush=True)
            while True:
                time.sleep(3600)


def main() -> None:
    size = world().size
    sleeper = int(sys.argv[1]) % size if len(sys.argv) > 1 else size - 1
    at_batch = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.int64)
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(2)])
        model.compile(
            optimizer="sgd",
            loss=hd.nn.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[SleepForever(sleeper, at_batch)])
    print(f"rank {world().rank}: fit finished (unexpected)", flush=True)


if __name__ == "__main__":
    main()
