"""Asynchronous parameter-server training of the digits MLP (TF1 style: every worker trains).

Run it as ``mpirun -n 4 python examples/ps_train_digits.py`` (add ``--oversubscribe``
on a small machine): rank 0 is the parameter server, ranks 1-3 are workers
(``--num-ps`` changes the split). Every worker runs ``fit`` on its own third of
the training set; the variables live on the ps, each step pulls them once and
pushes the gradients, and the ps applies Adam as they arrive, so no worker
waits for another. When all workers are done, worker 0 evaluates the final
parameters on the test set and prints the accuracy, the global step, and the
staleness of the gradients (how many updates of other workers landed between
a worker's read of a variable and its update). Everyone exits with status 0.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpcdist as hd
from hpcdist.nn import Dense, Sequential
from hpcdist.nn.losses import SparseCategoricalCrossentropy


def load(seed: int) -> tuple[np.ndarray, ...]:
    """Digits as float32 pixels in [0, 1], split 80/20 into train and test (stratified)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-ps", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size of each worker")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args(argv)

    size = hd.runtime.world().size
    if size < args.num_ps + 1:
        print(f"needs at least {args.num_ps + 1} ranks (ps + workers), got {size}", file=sys.stderr)
        return 2
    jobs = {"ps": args.num_ps, "worker": size - args.num_ps}
    resolver = hd.cluster_resolver.MPIClusterResolver(jobs=jobs)
    strategy = hd.ParameterServerStrategy(resolver)  # the ps ranks serve here, then exit 0
    worker = strategy.cluster_resolver.task_id
    num_workers = jobs["worker"]
    lead = strategy.extended.should_checkpoint

    x_train, x_test, y_train, y_test = load(args.seed)
    np.random.seed(args.seed)  # worker 0's initial weights are the ones the ps keeps
    with strategy.scope():
        model = Sequential(
            [
                Dense(128, activation="relu", input_shape=(64,)),
                Dense(64, activation="relu"),
                Dense(10),
            ]
        )
        model.compile(
            optimizer=hd.optimizers.Adam(learning_rate=args.learning_rate),
            loss=SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        finished = hd.Variable(np.int64(0), name="workers_finished", trainable=False)
    if lead:
        print(
            f"digits: {len(x_train)} train / {len(x_test)} test examples, {jobs['ps']} ps, "
            f"{num_workers} workers, batch {args.batch_size} per worker"
        )
    start = time.perf_counter()
    model.fit(
        x_train[worker::num_workers],
        y_train[worker::num_workers],
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2 if lead else 0,
    )
    finished.assign_add(np.int64(1))
    if not lead:
        return 0
    while int(finished.numpy()) < num_workers:  # the others may still be pushing updates
        time.sleep(0.005)
    wall = time.perf_counter() - start
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    stats = [strategy.extended.ps_client.stats(i) for i in range(jobs["ps"])]
    count = sum(s["staleness_count"] for s in stats)
    mean = sum(s["staleness_sum"] for s in stats) / max(count, 1)
    print(f"global step: {int(model.optimizer.iterations.numpy())}")
    print(f"staleness: mean {mean:.2f}, max {max(s['staleness_max'] for s in stats)} updates")
    print(f"test loss: {loss:.4f}")
    print(f"test accuracy: {accuracy:.4f}")
    print(f"wall time: {wall:.2f} s")
    if accuracy < args.min_accuracy:
        print(
            f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
