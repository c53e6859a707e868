"""``fit`` with BackupAndRestore under MultiWorkerMirroredStrategy, preempted by a signal.

Usage: ``preempt_fit.py WORKDIR [--signal NAME --signal-after K --signal-rank R]
[--save-freq epoch|N] [--seed S]``

Trains 3 epochs of 6 global batches (shuffled: fit's seed is fixed to ``S``, so
that separate runs can be compared). With ``--signal``, rank ``R`` sends itself
the signal after its ``K``-th batch; fit then saves at the next step on every
rank and exits with ``PREEMPTION_EXIT_CODE``. Each rank prints ``rank R first
batch E B`` (the first batch this run trains). A run that completes writes
``WORKDIR/final-rank<R>.npy`` (weights and optimizer slots, flattened).
"""

from __future__ import annotations

import argparse
import os
import signal

import numpy as np

import hpcdist as hd
from hpcdist.callbacks import Callback
from hpcdist.callbacks.backup import BackupAndRestore
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import SparseCategoricalCrossentropy
from hpcdist.nn.training import Trainer


class Watch(Callback):
    def __init__(self, rank: int, signum: int | None, after: int) -> None:
        super().__init__()
        self.rank, self.signum, self.after = rank, signum, after
        self.epoch, self.seen = 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == 0:
            print(f"rank {self.rank} first batch {self.epoch} {batch}", flush=True)
        self.seen += 1
        if self.signum is not None and self.seen == self.after:
            os.kill(os.getpid(), self.signum)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--signal", default=None)
    parser.add_argument("--signal-after", type=int, default=-1)
    parser.add_argument("--signal-rank", type=int, default=1)
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    backend.set_floatx("float64")
    Trainer._shuffle_seed = lambda self: args.seed  # what a new run draws, fixed for comparisons
    strategy = hd.MultiWorkerMirroredStrategy()
    rank = hd.runtime.world().rank
    rng = np.random.default_rng(11)
    with strategy.scope():
        model = Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(3)])
        model.compile(optimizer="adam", loss=SparseCategoricalCrossentropy(from_logits=True))
    model.set_weights([rng.normal(size=w.shape) * 0.5 for w in model.get_weights()])
    data = np.random.default_rng(5)
    x = data.normal(size=(44, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    signum = getattr(signal, args.signal) if args.signal else None
    backup = BackupAndRestore(os.path.join(args.workdir, "backup"), save_freq=save_freq)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=3,
        verbose=0,
        callbacks=[
            backup,
            Watch(rank, signum if rank == args.signal_rank else None, args.signal_after),
        ],
    )
    weights = [np.asarray(w).ravel() for w in model.get_weights()]
    slots = [np.asarray(v.numpy()).ravel() for v in model.optimizer.variables()]
    np.save(os.path.join(args.workdir, f"final-rank{rank}.npy"), np.concatenate(weights + slots))
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
