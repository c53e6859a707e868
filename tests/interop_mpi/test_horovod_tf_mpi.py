"""hpcdist.horovod.tensorflow and .keras on several ranks: the collectives, the tape
(equal to the gradient of the global batch), Keras fit with the optimizer and the
callbacks (weights equal on every rank, metrics averaged, the warm-up schedule)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # an installed extra here; skipped only without it
import keras  # noqa: E402

import hpcdist.horovod.tensorflow as hvd  # noqa: E402
import hpcdist.horovod.tensorflow.keras as hvdk  # noqa: E402
from hpcdist.errors import HorovodMismatchError  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()
    yield


def test_collectives_eager_and_in_tf_function():
    r, n = hvd.rank(), hvd.size()
    x = tf.constant([1.0 + r, 2.0])
    assert hvd.allreduce(x, op=hvd.Sum).numpy().tolist() == [n + n * (n - 1) / 2, 2.0 * n]
    assert hvd.allreduce(x).numpy().tolist() == pytest.approx([1 + (n - 1) / 2, 2.0])
    assert hvd.allreduce(tf.constant([7, 8]), op=hvd.Max).numpy().tolist() == [7, 8]
    got = hvd.allreduce(x, compression=hvd.Compression.fp16, op=hvd.Sum)
    assert got.dtype == tf.float32
    assert hvd.allgather(tf.fill([r + 1, 2], r)).shape[0] == n * (n + 1) // 2
    assert hvd.broadcast(tf.constant([r]), root_rank=n - 1).numpy().tolist() == [n - 1]

    @tf.function
    def graph(v):
        return hvd.allreduce(v, op=hvd.Sum), hvd.broadcast(v, 0)

    s, b = graph(x)
    assert s.numpy().tolist() == [n + n * (n - 1) / 2, 2.0 * n] and b.numpy().tolist() == [1, 2]
    with pytest.raises(HorovodMismatchError):
        hvd.allreduce(tf.ones([3 if r == n - 1 else 2]))


def _model():
    keras.utils.set_random_seed(hvd.rank() + 1)  # different starts: the broadcast must fix
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def test_broadcast_variables_and_tape_equal_the_global_batch():
    model = _model()
    hvd.broadcast_variables(model.variables, root_rank=0)
    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * hvd.size(), 4)).astype("float32")
    y = rng.standard_normal((4 * hvd.size(), 1)).astype("float32")
    mine = slice(4 * hvd.rank(), 4 * hvd.rank() + 4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[mine]) - y[mine]) ** 2)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((ref(x) - y) ** 2)
    want = tape.gradient(loss, ref.trainable_variables)
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


def test_keras_fit_with_optimizer_and_callbacks():
    model = _model()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((16, 4)).astype("float32")
    y = rng.standard_normal((16, 1)).astype("float32")
    warm = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    hist = model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[
        hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
        hvdk.callbacks.MetricAverageCallback(), warm])
    weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    gathered = hvd.allgather(tf.constant(weights[None, :])).numpy()
    assert np.allclose(gathered, gathered[0])  # every rank trained the same model
    losses = hvd.allgather(tf.constant([hist.history["loss"][-1]])).numpy()
    assert np.allclose(losses, losses[0])  # averaged over the ranks
    n = hvd.size()
    assert warm.multiplier(0) == pytest.approx(1 / n) and warm.multiplier(2) == 1.0
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.1 * (1 + (n - 1) / 2) / n)
    with pytest.raises(ValueError, match="Average"):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum)
