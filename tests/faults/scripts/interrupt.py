"""A rank is interrupted (or killed) by a real signal in the middle of training.

Usage: ``interrupt.py WHERE RANKS [--signal INT|KILL] [--workdir DIR]``

* ``WHERE``: ``fit`` (``model.fit``), ``loop`` (a custom loop of ``strategy.run``
  and ``strategy.reduce``) or ``checkpoint`` (the custom loop saving a
  ``Checkpoint`` every 5 steps; the signal arrives in the middle of writing
  the second one's data file, on the chief).
* ``RANKS``: ``0``, ``1``, ``last`` or ``all``: the ranks that get the signal.

The signalled ranks send it to themselves from a timer thread 0.3 s after
step 12, while the other ranks sleep 1.5 s before their next step, so the
signalled ranks receive the signal while they wait in a collective. With
``checkpoint``, the chief's second save (step 10) takes 1.5 s half way through
writing its data file: a signalled chief sends the signal there, other
signalled ranks 0.3 s after they entered the save. Each signalled rank prints ``SIGNAL rank R at
<unix time>`` first. ``checkpoint`` writes ``DIR/saved-<n>.npy`` (the weights
the n-th save holds) before each save. A run that is not ended by the signal
prints ``rank R finished (unexpected)``.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import numpy as np

import hpcdist as hd
from hpcdist.checkpoint import format as ckpt_format
from hpcdist.nn import Dense, Sequential
from hpcdist.runtime import world

SIGNAL_STEP = 12


def _signal_later(rank: int, signum: int, delay: float) -> None:
    print(f"SIGNAL rank {rank} at {time.time() + delay:.3f}", flush=True)
    threading.Timer(delay, lambda: os.kill(os.getpid(), signum)).start()


def _slow_next_data_write(rank: int, signum: int | None) -> None:
    """Make the chief's next checkpoint data file take 1.5 s, half written in between.

    With ``signum`` the chief sends itself the signal half way through.
    """
    original = ckpt_format.atomic_write_hashed

    def slow(path, write_fn):
        def half_then_wait(stream):
            stream.write(b"PK\x03\x04 half of a checkpoint")
            if signum is not None:
                print(f"SIGNAL rank {rank} at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signum)
            for _ in range(150):  # a signal's handler runs at the next bytecode
                time.sleep(0.01)
            write_fn(stream)

        ckpt_format.atomic_write_hashed = original
        return original(path, half_then_wait)

    ckpt_format.atomic_write_hashed = slow


class Interrupt(hd.callbacks.Callback):
    def __init__(self, signalled: bool, signum: int) -> None:
        super().__init__()
        self.signalled, self.signum, self.step = signalled, signum, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step == SIGNAL_STEP:
            if self.signalled:
                _signal_later(world().rank, self.signum, 0.3)
            else:
                time.sleep(1.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("where", choices=["fit", "loop", "checkpoint"])
    parser.add_argument("ranks", choices=["0", "1", "last", "all"])
    parser.add_argument("--signal", default="INT")
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args()
    w = world()
    rank, size = w.rank, w.size
    wanted = {"0": {0}, "1": {1}, "last": {size - 1}, "all": set(range(size))}[args.ranks]
    signalled = rank in wanted
    signum = getattr(signal, "SIG" + args.signal)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.int64)
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(2)])
        loss = hd.nn.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer="sgd", loss=loss)
    if args.where == "fit":
        model.fit(
            x, y, batch_size=16, epochs=100, verbose=0, callbacks=[Interrupt(signalled, signum)]
        )
    else:
        custom_loop(args, strategy, model, x, y, signalled, signum)
    print(f"rank {rank} finished (unexpected)", flush=True)


def custom_loop(args, strategy, model, x, y, signalled, signum) -> None:
    rank = world().rank
    batch = 16
    data = hd.data.Dataset.from_tensor_slices((x, y)).repeat(100).batch(batch)
    loss_object = hd.nn.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=hd.nn.losses.Reduction.NONE
    )

    def compute_loss(labels, logits):
        return hd.nn.compute_average_loss(loss_object(labels, logits), global_batch_size=batch)

    grad_fn = hd.nn.value_and_grad(model, compute_loss)

    def train_step(inputs):
        features, labels = inputs
        value, grads = grad_fn(features, labels)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    ckpt = hd.checkpoint.Checkpoint(model=model, optimizer=model.optimizer)
    prefix = os.path.join(args.workdir, "ckpt", "run")
    saves = 0
    for step, inputs in enumerate(strategy.experimental_distribute_dataset(data), start=1):
        per_replica = strategy.run(train_step, args=(inputs,))
        strategy.reduce(hd.ReduceOp.SUM, per_replica, axis=None)
        if args.where == "checkpoint" and step % 5 == 0:
            saves += 1
            if rank == 0:
                flat = np.concatenate([np.asarray(v).ravel() for v in model.get_weights()])
                np.save(os.path.join(args.workdir, f"saved-{saves}.npy"), flat)
            if saves == 2:
                if rank == 0:
                    _slow_next_data_write(rank, signum if signalled else None)
                elif signalled:  # the chief is writing by then: the others wait in the save
                    _signal_later(rank, signum, 0.3)
            ckpt.save(prefix)
        elif args.where == "loop" and step == SIGNAL_STEP:
            if signalled:
                _signal_later(rank, signum, 0.3)
            else:
                time.sleep(1.5)


if __name__ == "__main__":
    main()
