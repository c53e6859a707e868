"""A job for ``test_saving.py``: ``save`` (train 2 epochs, save, train 2 more) or ``load`` (load,
record, train 2 more), on however many ranks it is started with. Rank 0 writes what it saw to
``OUT/<stage>-<ranks>.npz``. BatchNormalization is synchronized, so the math does not depend on
the number of ranks (only the order of the sums does)."""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

import hpcdist as hd
from hpcdist.nn import BatchNormalization, Dense, Sequential, backend, losses, regularizers
from hpcdist.runtime import world


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4))
    y = np.tanh(x @ rng.normal(size=(4, 2)))
    return x, y


def build():
    return Sequential([
        Dense(6, activation="tanh", input_shape=(4,), kernel_regularizer=regularizers.l2(0.01)),
        BatchNormalization(synchronized=True, momentum=0.9),
        Dense(2),
    ])  # fmt: skip


def record(model, x, path):
    arrays = {"pred": model.predict(x), "iterations": np.int64(model.optimizer.iterations)}
    for i, v in enumerate(model.weights):
        arrays[f"w{i}"] = v.numpy()
    for i, v in enumerate(model.trainable_variables):
        for s in model.optimizer.get_slot_names():
            arrays[f"slot{i}_{s}"] = model.optimizer.get_slot(v, s).numpy()
    if world().rank == 0:
        np.savez(path, **arrays)


def main() -> None:
    mode, path, out = sys.argv[1:4]
    backend.set_floatx("float64")
    n = world().size
    strategy = hd.MultiWorkerMirroredStrategy() if n > 1 else None
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    x, y = data()

    def fit(model):
        return model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)

    if mode == "save":
        np.random.seed(1)
        with scope:
            model = build()
            model.compile(optimizer=hd.optimizers.Nadam(0.02), loss=losses.Huber(delta=0.5),
                          metrics=["mae"])  # fmt: skip
        fit(model)
        model.save(path)
        record(model, x, os.path.join(out, f"saved-{n}.npz"))
        fit(model)
        record(model, x, os.path.join(out, f"uninterrupted-{n}.npz"))
    else:
        with scope:
            model = hd.nn.load_model(path)
        record(model, x, os.path.join(out, f"loaded-{n}.npz"))
        fit(model)
        record(model, x, os.path.join(out, f"continued-{n}.npz"))


if __name__ == "__main__":
    main()
