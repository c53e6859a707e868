"""The issue's seed example with only the names changed: Keras ``fit`` inside a strategy scope.

Run it as ``mpirun -n 2 python examples/seed_keras_fit.py`` (or plain ``python``).
The data is synthetic: 10 features, the label says whether their sum is positive.
"""

from __future__ import annotations

import numpy as np

import hpcdist as hd
from hpcdist.nn import Dense, Sequential


def make_dataset(n: int = 2048, batch_size: int = 64, seed: int = 0) -> hd.data.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
    return hd.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=seed).batch(batch_size)


def main() -> None:
    strategy = hd.MultiWorkerMirroredStrategy()
    dataset = make_dataset()

    with strategy.scope():
        model = Sequential(
            [
                Dense(128, activation="relu", input_shape=(10,)),
                Dense(64, activation="relu"),
                Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(dataset, epochs=5, verbose=2)

    if strategy.extended.should_checkpoint:
        print(f"final accuracy: {history.history['accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()
