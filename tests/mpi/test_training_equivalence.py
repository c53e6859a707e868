"""Training on N ranks with global batch G gives what one process gives with batch G.

Each rank trains the same model two ways: distributed (MultiWorkerMirroredStrategy,
each rank a worker, optionally with two logical devices per worker) and alone
(no strategy, the whole global batch), from the same initial weights, on the same
data. After k steps the parameters agree to 1e-5 relative (float64): the
distributed run differs only in the order of the floating-point sums.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy

pytestmark = pytest.mark.mpi(min_size=2)

FEATURES, CLASSES = 6, 3


@pytest.fixture(autouse=True)
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


def data(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)  # the same on every rank
    x = rng.normal(size=(n, FEATURES))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    return x, y


def build() -> Sequential:
    return Sequential(
        [
            Dense(16, activation="tanh", input_shape=(FEATURES,)),
            Dense(8, activation="relu"),
            Dense(CLASSES),
        ]
    )


def strategy_for(devices: int) -> hd.Strategy:
    if devices == 1:
        return hd.MultiWorkerMirroredStrategy()
    return hd.MultiWorkerMirroredStrategy(devices=[f"/cpu:{i}" for i in range(devices)])


def assert_same_weights(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-12)


def optimizer(name: str):
    if name == "sgd":
        return hd.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True)
    if name == "adamw":
        return hd.optimizers.AdamW(learning_rate=0.01, weight_decay=0.01)
    if name == "rmsprop":
        return hd.optimizers.RMSprop(learning_rate=0.01, centered=True, momentum=0.5)
    return hd.optimizers.Adam(learning_rate=0.01, global_clipnorm=0.5)


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw", "rmsprop"])
def test_custom_loop_matches_one_process(devices, opt):
    strategy = strategy_for(devices)
    global_batch = 4 * strategy.num_replicas_in_sync
    steps = 5
    x, y = data(global_batch * steps)
    with strategy.scope():
        model = build()
        optim = optimizer(opt)
        loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)

        def compute_loss(labels, logits):
            per_example = loss_object(labels, logits)
            return hd.nn.compute_average_loss(per_example, global_batch_size=global_batch)

    grad_fn = hd.nn.value_and_grad(model, compute_loss)

    def train_step(batch):
        loss, grads = grad_fn(*batch)
        optim.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    reference = build()
    reference.set_weights(model.get_weights())
    ref_optim = optimizer(opt)
    ref_grad = hd.nn.value_and_grad(reference, compute_loss)

    dist = strategy.experimental_distribute_dataset(
        hd.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    )
    losses = []
    for batch in dist:
        per_replica = strategy.run(train_step, args=(batch,))
        losses.append(float(strategy.reduce("sum", per_replica, axis=None)))
    ref_losses = []
    for i in range(steps):
        sl = slice(i * global_batch, (i + 1) * global_batch)
        loss, grads = ref_grad(x[sl], y[sl])
        ref_optim.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
        ref_losses.append(float(loss))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert_same_weights(model.get_weights(), reference.get_weights())
    assert int(optim.iterations.numpy()) == steps


@pytest.mark.parametrize("devices", [1, 2])
def test_fit_matches_one_process_with_a_short_last_batch(devices):
    strategy = strategy_for(devices)
    replicas = strategy.num_replicas_in_sync
    global_batch = 4 * replicas
    # The last batch has fewer examples than replicas: some replicas get nothing.
    n = 3 * global_batch + replicas - 1
    x, y = data(n, seed=2)
    with strategy.scope():
        model = build()
        model.compile(
            optimizer=hd.optimizers.Adam(0.01),
            loss=SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    reference = build()
    reference.set_weights(model.get_weights())
    reference.compile(
        optimizer=hd.optimizers.Adam(0.01),
        loss=SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(x, y, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)
    ref_history = reference.fit(x, y, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)
    assert_same_weights(model.get_weights(), reference.get_weights())
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(history.history[key], ref_history.history[key], rtol=1e-5)
    # Every worker sees the same logs (they were aggregated over all replicas).
    comm = hd.world().comm
    assert comm.allgather(history.history["loss"]) == [history.history["loss"]] * comm.size


def test_evaluate_and_predict_match_one_process():
    strategy = strategy_for(1)
    x, y = data(37, seed=3)
    w = np.linspace(0.5, 1.5, len(x))
    with strategy.scope():
        model = build()
        model.compile(
            optimizer="sgd",
            loss=SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    reference = build()
    reference.set_weights(model.get_weights())
    reference.compile(
        optimizer="sgd",
        loss=SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    got = model.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)
    want = reference.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)
    assert got.keys() == want.keys()
    for key in got:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10)
    np.testing.assert_allclose(
        model.predict(x, batch_size=8), reference.predict(x, batch_size=8), rtol=1e-12
    )


def test_shuffled_fit_sees_every_example_once_per_epoch():
    strategy = strategy_for(1)
    x, y = data(50, seed=4)
    labels = y.astype(np.float64) + np.arange(len(y)) / 1000.0  # every label differs
    with strategy.scope():
        model = Sequential([Dense(1, input_shape=(FEATURES,))])
        seen = hd.nn.metrics.MeanMetricWrapper(
            lambda y_true, y_pred: np.asarray(y_true, np.float64), name="mean_label"
        )
        model.compile(optimizer="adam", loss="mse", metrics=[seen])
    # shuffle=True: every worker must shuffle with the same seed, else the workers' parts
    # of a global batch overlap and some examples are never seen.
    history = model.fit(x, labels[:, None], batch_size=8, epochs=3, verbose=0)
    np.testing.assert_allclose(history.history["mean_label"], [labels.mean()] * 3, rtol=1e-12)
