"""Every rank raises the same error in ``fit`` (a bug in user code), at the same step.

Usage: ``fail_all.py``. Each rank prints ``FAIL rank R`` just before raising
``ValueError("bad value at step 5")`` from a callback.
"""

from __future__ import annotations

import numpy as np

import hpcdist as hd
from hpcdist.nn import Dense, Sequential
from hpcdist.runtime import world


class Fail(hd.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            print(f"FAIL rank {world().rank}", flush=True)
            raise ValueError("bad value at step 5")


def main() -> None:
    x = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = Sequential([Dense(8, activation="relu", input_shape=(4,)), Dense(2)])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[Fail()])
    print(f"rank {world().rank} finished (unexpected)", flush=True)


if __name__ == "__main__":
    main()
