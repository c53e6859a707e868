"""``fit`` with the default progress display (``verbose=1``); steps take ~20 ms each.

Usage: ``fit_progress.py [MIN_INTERVAL_S]``: with an argument, a ``ProgressBar`` with that
``min_interval_s`` replaces the default one (so a short test shows progress lines).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import hpcdist as hd
from hpcdist.nn import Dense, Sequential


class Slow(hd.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)


def main() -> None:
    hd.utils.set_random_seed(0)
    x = np.random.normal(size=(400, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = Sequential([Dense(8, activation="relu", input_shape=(4,)), Dense(2)])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["acc"])
    callbacks = [Slow()]
    if len(sys.argv) > 1:
        callbacks.append(hd.callbacks.ProgressBar(min_interval_s=float(sys.argv[1])))
    model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks)


if __name__ == "__main__":
    main()
