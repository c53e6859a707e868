"""A custom training loop with PreemptionCheckpointHandler under MultiWorkerMirroredStrategy.

Usage: ``preempt_loop.py WORKDIR [--signal NAME --signal-at K --signal-rank R] [--default-exit]``

Trains ``STEPS`` steps of a small model (fixed initial weights, a seeded shuffled
dataset) with checkpoints in ``WORKDIR/ckpt``. With ``--signal``, rank ``R``
sends itself that signal during step ``K`` (0-based), as a batch system would.
Each rank prints ``rank R starts at step S`` after the handler restored, and
``rank R saved at step S`` in its exit function (which then exits with
``PREEMPTION_EXIT_CODE``; ``--default-exit`` uses the handler's default exit
instead). A run that completes writes ``WORKDIR/final-rank<R>.npy``: every
weight and optimizer slot, flattened.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import numpy as np

import hpcdist as hd
from hpcdist.checkpoint.checkpoint import Checkpoint
from hpcdist.checkpoint.preemption import (
    PREEMPTION_EXIT_CODE,
    PreemptionCheckpointHandler,
    TerminationConfig,
)
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import SparseCategoricalCrossentropy

STEPS = 20


def build(strategy):
    rng = np.random.default_rng(11)
    with strategy.scope():
        model = Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(3)])
        model.compile(optimizer="adam", loss=SparseCategoricalCrossentropy(from_logits=True))
    model.set_weights([rng.normal(size=w.shape) * 0.5 for w in model.get_weights()])
    return model


def dataset():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    options = hd.data.Options()
    options.distribute.auto_shard_policy = hd.data.AutoShardPolicy.DATA  # arrays: no files
    ds = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(40, seed=3).batch(8).repeat()
    return ds.with_options(options)


def state_vector(model) -> np.ndarray:
    parts = [np.asarray(w).ravel() for w in model.get_weights()]
    parts += [np.asarray(v.numpy()).ravel() for v in model.optimizer.variables()]
    return np.concatenate(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--signal", default=None)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--signal-rank", type=int, default=1)
    parser.add_argument("--default-exit", action="store_true")
    args = parser.parse_args()
    backend.set_floatx("float64")
    strategy = hd.MultiWorkerMirroredStrategy()
    rank = hd.runtime.world().rank
    model = build(strategy)
    iterator = iter(strategy.experimental_distribute_dataset(dataset()))
    ckpt = Checkpoint(model=model, optimizer=model.optimizer, iterator=iterator)
    holder = {}

    def exit_fn() -> None:
        print(f"rank {rank} saved at step {holder['h'].total_run_calls}", flush=True)
        sys.exit(PREEMPTION_EXIT_CODE)

    config = TerminationConfig(exit_fn=None if args.default_exit else exit_fn)
    handler = PreemptionCheckpointHandler(
        strategy.cluster_resolver, ckpt, os.path.join(args.workdir, "ckpt"), config
    )
    holder["h"] = handler
    print(f"rank {rank} starts at step {handler.total_run_calls}", flush=True)

    def train_step(i: int) -> None:
        strategy.run(model.train_step, args=(next(iterator),))
        if args.signal and i == args.signal_at and rank == args.signal_rank:
            os.kill(os.getpid(), getattr(signal, args.signal))

    for i in range(handler.total_run_calls, STEPS):
        handler.run(train_step, i)
    handler.close()
    np.save(os.path.join(args.workdir, f"final-rank{rank}.npy"), state_vector(model))
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
