"""The main job: an MLP on scikit-learn's digits, trained on every rank with Keras's ``fit``.

Run it as ``mpirun -n 2 python examples/train_digits.py`` (``make demo``), on 4
ranks with ``mpirun -n 4 --oversubscribe ...``, or as plain ``python`` on one.
The digits data ships with scikit-learn, so nothing is downloaded. Every rank is
one worker of a MultiWorkerMirroredStrategy: the global batch is split over the
workers and the gradients are summed in one fused allreduce per step. The chief
prints the progress bar, the per-epoch metrics, the test accuracy and the wall
time; ``--min-accuracy`` makes the run fail when the test accuracy is lower.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=1, help="0 silent, 1 bar, 2 epoch lines")
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    parser.add_argument(
        "--history", default=None, help="write the history and test figures (JSON) to this file"
    )
    args = parser.parse_args(argv)

    x_train, x_test, y_train, y_test = load(args.seed)
    # The initial weights, the shuffles and every other random draw, alike on every rank:
    # two runs print the same figures (on 1, 2 or 4 ranks alike, see docs/training.md).
    hd.utils.set_random_seed(args.seed)
    strategy = hd.MultiWorkerMirroredStrategy()
    chief = strategy.extended.should_checkpoint
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
    if chief:
        print(
            f"digits: {len(x_train)} train / {len(x_test)} test examples, "
            f"{strategy.num_replicas_in_sync} replicas, global batch {args.batch_size}"
        )
    start = time.perf_counter()
    history = model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=args.verbose,
    )
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    wall = time.perf_counter() - start
    if chief:
        print(f"test loss: {loss:.4f}")
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {wall:.2f} s")
        if args.history:
            figures = {**history.history, "test_loss": [loss], "test_accuracy": [accuracy]}
            with open(args.history, "w") as f:  # float.hex: every bit, for comparisons
                json.dump({k: [float(v).hex() for v in vs] for k, vs in figures.items()}, f)
    if accuracy < args.min_accuracy:
        print(
            f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
