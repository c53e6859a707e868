"""hpcdist.tensorflow on several ranks: N ranks on 1/N of each global batch == 1 process on it."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hpcdist.tensorflow as hdtf  # noqa: E402
from hpcdist.runtime import world  # noqa: E402

pytestmark = pytest.mark.mpi
GLOBAL_BATCH, STEPS = 24, 4


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="tanh", dtype="float64"),
        keras.layers.Dense(3, dtype="float64"),
    ])


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.normal(size=(STEPS * GLOBAL_BATCH, 5)), rng.normal(size=(STEPS * GLOBAL_BATCH, 3))


def _local(a: np.ndarray, rank: int, size: int) -> np.ndarray:
    per = GLOBAL_BATCH // size
    return np.concatenate([a[s * GLOBAL_BATCH + rank * per:][:per] for s in range(STEPS)])


def _loop(model, x, y, batch, distributed):
    opt = keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        if distributed:
            tape = hdtf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for s in range(STEPS):
        step(tf.constant(x[s * batch:(s + 1) * batch]), tf.constant(y[s * batch:(s + 1) * batch]))


def _same(a: keras.Model, b: keras.Model) -> None:
    for p, q in zip(a.get_weights(), b.get_weights(), strict=True):
        assert np.allclose(p, q, rtol=0, atol=1e-9), np.abs(p - q).max()


def test_custom_loop_equivalence() -> None:
    w = world()
    x, y = _data()
    reference = _model(0)
    _loop(reference, x, y, GLOBAL_BATCH, False)
    model = _model(w.rank)
    hdtf.broadcast_variables(model.variables, root=0)
    _loop(model, _local(x, w.rank, w.size), _local(y, w.rank, w.size),
          GLOBAL_BATCH // w.size, True)
    _same(model, reference)


def test_keras_fit_equivalence() -> None:
    w = world()
    x, y = _data()
    reference = _model(0)
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    model = _model(w.rank)
    model.compile(optimizer=hdtf.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="mse")
    model.fit(_local(x, w.rank, w.size), _local(y, w.rank, w.size),
              batch_size=GLOBAL_BATCH // w.size, epochs=1, shuffle=False, verbose=0,
              callbacks=[hdtf.BroadcastVariablesCallback(root=0)])
    _same(model, reference)
