"""Sequential's compile/fit/evaluate/predict in one process, alone and on 2 logical devices."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy


@pytest.fixture
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def build() -> Sequential:
    return Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(3)])


def compiled(model: Sequential, optimizer: str = "adam") -> Sequential:
    model.compile(
        optimizer=optimizer,
        loss=SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_fit_on_two_logical_devices_matches_one_device(float64):
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x, y = data(23)  # batches of 8, 8, 7: the last one splits 4 + 3
    with strategy.scope():
        model = compiled(build())
    reference = compiled(build())
    reference.set_weights(model.get_weights())
    h = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    r = reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    np.testing.assert_allclose(h.history["loss"], r.history["loss"], rtol=1e-10)
    np.testing.assert_allclose(h.history["accuracy"], r.history["accuracy"], rtol=1e-12)
    # The replicas' copies stay identical.
    for v in model.trainable_variables:
        np.testing.assert_array_equal(v.values[0].raw_value(), v.values[1].raw_value())


def test_fit_learns_and_reports_validation(float64):
    x, y = data(400, seed=1)
    model = compiled(build(), optimizer=hd.optimizers.Adam(0.05))
    history = model.fit(x, y, batch_size=32, epochs=15, validation_split=0.25, verbose=0)
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.8
    assert history.epoch == list(range(15))
    loss, accuracy = model.evaluate(x[300:], y[300:], verbose=0)
    assert loss == pytest.approx(history.history["val_loss"][-1])
    assert accuracy == pytest.approx(history.history["val_accuracy"][-1])


def test_fit_epoch_loss_is_the_mean_over_examples(float64):
    x, y = data(10, seed=2)
    model = compiled(build(), optimizer=hd.optimizers.SGD(learning_rate=0.0))
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    logits = model.predict(x)
    per_example = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)(
        y, logits
    )
    assert history.history["loss"][0] == pytest.approx(float(np.mean(per_example)))
    assert history.history["accuracy"][0] == pytest.approx(np.mean(logits.argmax(1) == y))


def test_predict_keeps_the_input_order_on_two_devices(float64):
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x, _ = data(13, seed=3)
    with strategy.scope():
        model = build()
    reference = build()
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(model.predict(x, batch_size=4), reference(x), rtol=1e-12)


def test_fit_with_a_dataset_and_steps_per_epoch(float64):
    x, y = data(64, seed=4)
    ds = hd.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    model = compiled(build())
    history = model.fit(ds, epochs=3, steps_per_epoch=2, verbose=0)
    assert len(history.history["loss"]) == 3
    assert int(model.optimizer.iterations.numpy()) == 6


def test_fit_warns_and_stops_when_the_data_runs_out(float64):
    x, y = data(32, seed=5)
    ds = hd.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = compiled(build())
    with pytest.warns(UserWarning, match="ran out of data"):
        model.fit(ds, epochs=3, steps_per_epoch=3, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_sample_weights_weigh_the_loss(float64):
    x, y = data(12, seed=6)
    model = compiled(build(), optimizer=hd.optimizers.SGD(learning_rate=0.0))
    w = np.linspace(0.0, 2.0, len(x))
    got = model.evaluate(x, y, sample_weight=w, batch_size=5, verbose=0, return_dict=True)
    per_example = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)(
        y, model.predict(x)
    )
    # Keras: the weighted losses are summed and divided by the number of examples.
    assert got["loss"] == pytest.approx(float(np.sum(per_example * w) / len(x)))


def test_early_stopping_stops_fit(float64):
    x, y = data(64, seed=7)
    model = compiled(build(), optimizer=hd.optimizers.SGD(learning_rate=0.0))
    stop = hd.callbacks.EarlyStopping(monitor="loss", patience=1)
    # shuffle=False: a shuffled epoch sums the same batch losses in another order, which
    # can move the mean by one ulp and count as an improvement.
    history = model.fit(
        x, y, batch_size=16, epochs=10, callbacks=[stop], shuffle=False, verbose=0
    )
    assert len(history.history["loss"]) == 2  # no improvement with a zero learning rate


def test_the_progress_bar_prints_epochs(float64, capsys):
    x, y = data(32, seed=8)
    model = compiled(build())
    model.fit(x, y, batch_size=16, epochs=2, verbose=2)
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out and "loss:" in out


def test_errors_are_clear():
    x, y = data(8)
    model = build()
    with pytest.raises(RuntimeError, match="compile"):
        model.fit(x, y)
    compiled(model)
    ds = hd.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.raises(ValueError, match="y must be None"):
        model.fit(ds, y)
    with pytest.raises(ValueError, match="different numbers of rows"):
        model.fit(x, y[:5])
    with pytest.raises(TypeError, match="unsupported argument"):
        model.compile(optimizer="adam", loss="mse", loss_weights=[1.0])


def test_a_sum_over_batch_loss_in_a_custom_loop_is_refused():
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    loss_object = SparseCategoricalCrossentropy(from_logits=True)
    x, y = data(4)

    def step(x, y):
        return loss_object(y, np.zeros((len(y), 3)))

    with pytest.raises(ValueError, match="Reduction.SUM"):
        strategy.run(step, args=(x, y))


def test_seed_example_runs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 10)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
    dataset = hd.data.Dataset.from_tensor_slices((x, y)).batch(32)
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = Sequential(
            [
                Dense(128, activation="relu", input_shape=(10,)),
                Dense(64, activation="relu"),
                Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(dataset, epochs=5, verbose=0)
    assert history.history["accuracy"][-1] > 0.9


def test_gradients_share_one_buffer_and_held_ones_never_change(float64):
    model = build()
    x, y = data(6, seed=9)
    grad_fn = hd.nn.value_and_grad(
        model, SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.SUM)
    )
    _, grads = grad_fn(x, y)
    base = grads[0].base
    assert base is not None and all(g.base is base for g in grads)
    assert base.size == sum(v.size for v in model.trainable_variables)
    kept = [g.copy() for g in grads]
    _, again = grad_fn(x[:3], y[:3])  # `grads` is still held: a new buffer is used
    assert again[0].base is not base
    for g, k in zip(grads, kept, strict=True):
        np.testing.assert_array_equal(g, k)
    del grads, again
    _, third = grad_fn(x, y)
    for g, k in zip(third, kept, strict=True):
        np.testing.assert_allclose(g, k, rtol=1e-12)


@pytest.mark.parametrize("clip", [{}, {"global_clipnorm": 0.1}, {"clipvalue": 0.01}])
def test_optimizer_reads_the_gradient_buffer_without_changing_it(float64, clip):
    x, y = data(8, seed=10)
    loss = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.SUM)
    a, b = build(), build()
    b.set_weights(a.get_weights())
    opt_a = hd.optimizers.SGD(learning_rate=0.1, momentum=0.9, **clip)
    opt_b = hd.optimizers.SGD(learning_rate=0.1, momentum=0.9, **clip)
    for _ in range(3):
        _, grads = hd.nn.value_and_grad(a, loss)(x, y)
        before = [g.copy() for g in grads]
        opt_a.apply_gradients(zip(grads, a.trainable_variables, strict=True))
        for g, k in zip(grads, before, strict=True):
            np.testing.assert_array_equal(g, k)  # clipping worked on the optimizer's copy
        _, grads_b = hd.nn.value_and_grad(b, loss)(x, y)
        copies = [np.array(g) for g in grads_b]  # separate arrays: the packing path
        opt_b.apply_gradients(zip(copies, b.trainable_variables, strict=True))
    for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(u, v)
