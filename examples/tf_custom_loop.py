"""A Keras model on scikit-learn's digits in a TensorFlow custom loop, distributed with hpcdist.

Run it as ``mpirun -n 2 python examples/tf_custom_loop.py`` (or plain ``python``).
Each rank runs the forward and backward pass of its 1/N share of every global
batch under a ``tf.GradientTape``; ``hdtf.DistributedGradientTape`` averages
the gradients over the ranks through the hpcdist engine, and the optimizer
applies them identically everywhere. ``hdtf.broadcast_variables`` gives every
rank rank 0's start weights. ``--min-accuracy`` fails the run when lower.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hpcdist.tensorflow as hdtf  # noqa: E402
from hpcdist.runtime import world  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args(argv)

    w = world()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=args.seed, stratify=digits.target
    )
    keras.utils.set_random_seed(args.seed + w.rank)  # different until the broadcast
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.Adam(args.learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hdtf.broadcast_variables(model.variables, root=0)

    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hdtf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    local = args.batch_size // w.size
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(x_train))
        losses = []
        for first in range(0, len(order) - args.batch_size + 1, args.batch_size):
            mine = order[first + w.rank * local : first + (w.rank + 1) * local]
            losses.append(float(step(tf.constant(x_train[mine]), tf.constant(y_train[mine]))))
        if w.rank == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}")
    logits = model(tf.constant(x_test), training=False)
    accuracy = float(np.mean(np.argmax(logits.numpy(), 1) == y_test))
    if w.rank == 0:
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {time.perf_counter() - start:.2f} s")
    if accuracy < args.min_accuracy:
        print(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
