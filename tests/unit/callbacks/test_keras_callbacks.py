"""LearningRateScheduler, ReduceLROnPlateau, TerminateOnNaN and LambdaCallback: Keras's
documented behaviour, with a real model and fit where it matters."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.callbacks import (
    CallbackList,
    LambdaCallback,
    LearningRateScheduler,
    ReduceLROnPlateau,
    TerminateOnNaN,
)
from hpcdist.nn import Dense, Sequential


def model_and_data(lr=0.1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, 3))
    y = x @ np.array([[1.0], [-1.0], [2.0]])
    model = Sequential([Dense(1, input_shape=(3,), dtype="float64")])
    model.compile(optimizer=hd.optimizers.SGD(lr), loss="mse")
    return model, x, y


def test_learning_rate_scheduler_sets_the_rate_each_epoch():
    model, x, y = model_and_data()
    rates = []
    spy = LambdaCallback(on_epoch_begin=lambda e, logs: rates.append(model.optimizer.learning_rate))
    sched = LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch > 0 else lr)
    history = model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[sched, spy])
    assert rates == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    # the schedule of the epoch alone (Keras's one-argument form)
    model2, _, _ = model_and_data()
    by_epoch = LearningRateScheduler(lambda e: 0.3 / (e + 1))
    model2.fit(x, y, epochs=3, verbose=0, callbacks=[by_epoch])
    assert model2.optimizer.learning_rate == pytest.approx(0.1)


def test_learning_rate_scheduler_matches_training_with_those_rates():
    """fit with a schedule == fits of one epoch each at the scheduled rate."""
    model, x, y = model_and_data()
    init = model.get_weights()
    schedule = [0.1, 0.02, 0.05]
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False,
              callbacks=[LearningRateScheduler(lambda e, lr: schedule[e])])  # fmt: skip
    by_hand, _, _ = model_and_data()
    by_hand.set_weights(init)
    for lr in schedule:
        by_hand.optimizer.learning_rate = lr
        by_hand.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), by_hand.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_learning_rate_scheduler_errors_and_verbose(capsys):
    model, x, y = model_and_data()
    with pytest.raises(ValueError, match="must be a float"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[LearningRateScheduler(lambda e, lr: "x")])
    with pytest.raises(ValueError, match="finite"):
        model.fit(x, y, epochs=1, verbose=0,
                  callbacks=[LearningRateScheduler(lambda e, lr: float("nan"))])  # fmt: skip
    with pytest.raises(TypeError, match="callable"):
        LearningRateScheduler(0.1)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[LearningRateScheduler(lambda e, lr: 0.2, 1)])
    assert "Epoch 1: LearningRateScheduler setting learning rate to 0.2." in capsys.readouterr().out


class Opt:
    def __init__(self, lr):
        self.learning_rate = lr


class Fake:
    distribute_strategy = None

    def __init__(self, lr=1.0):
        self.optimizer = Opt(lr)
        self.stop_training = False


def run_plateau(cb, values, lr=1.0, key="val_loss"):
    model = Fake(lr)
    cbs = CallbackList([cb], model=model)
    cbs.on_train_begin()
    rates = []
    for epoch, v in enumerate(values):
        logs = {key: v}
        cbs.on_epoch_end(epoch, logs)
        rates.append(model.optimizer.learning_rate)
        assert "learning_rate" in logs
    return rates


def test_reduce_lr_on_plateau_patience_factor_min_lr():
    cb = ReduceLROnPlateau(factor=0.5, patience=2, min_lr=0.2)
    rates = run_plateau(cb, [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95])
    # improvements at epochs 0, 1; then 2 epochs without -> halve, twice, then min_lr
    assert rates == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.2])


def test_reduce_lr_on_plateau_min_delta_cooldown_and_max_mode():
    cb = ReduceLROnPlateau(factor=0.1, patience=1, min_delta=0.05, cooldown=2)
    # 0.97 does not beat 1.0 by more than min_delta: no improvement. Keras counts the cooldown
    # down at the start of each epoch's check, so the epoch that ends it counts again.
    rates = run_plateau(cb, [1.0, 0.97, 0.97, 0.97, 0.97, 0.97])
    assert rates == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.01, 0.001])
    acc = ReduceLROnPlateau(monitor="val_accuracy", factor=0.5, patience=1)
    assert acc.mode == "max"
    assert run_plateau(acc, [0.5, 0.6, 0.55], key="val_accuracy") == pytest.approx([1, 1, 0.5])
    with pytest.raises(ValueError, match="factor >= 1.0"):
        ReduceLROnPlateau(factor=1.5)


def test_reduce_lr_on_plateau_missing_monitor_warns(caplog):
    with caplog.at_level("WARNING", logger="hpcdist.callbacks"):
        rates = run_plateau(ReduceLROnPlateau(patience=0), [1.0, 2.0], key="loss")
    assert rates == [1.0, 1.0] and "val_loss" in caplog.text


def test_reduce_lr_on_plateau_in_fit():
    model, x, y = model_and_data(lr=0.0)  # no learning: the loss never improves
    model.optimizer.learning_rate = 1e-12
    cb = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1)
    history = model.fit(x, y, epochs=4, verbose=0, callbacks=[cb])
    assert history.history["learning_rate"][0] == pytest.approx(1e-12)
    assert model.optimizer.learning_rate < 1e-12


def test_terminate_on_nan_stops_at_the_first_bad_batch(capsys):
    model, x, y = model_and_data()
    y = y.copy()
    y[17] = np.nan  # batch 2 of 8-example batches
    batches = []
    spy = LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False,
                        callbacks=[TerminateOnNaN(), spy])  # fmt: skip
    assert batches == [0, 1, 2] and np.isnan(history.history["loss"][0])
    assert "Batch 2: Invalid loss, terminating training" in capsys.readouterr().out
    assert len(history.history["loss"]) == 1


def test_lambda_callback_hooks():
    calls = []
    cb = LambdaCallback(
        on_train_begin=lambda logs: calls.append("begin"),
        on_epoch_end=lambda epoch, logs: calls.append(("epoch", epoch, round(logs["loss"], 6))),
        on_batch_end=lambda batch, logs: calls.append(("batch", batch)),
        on_train_end=lambda logs: calls.append("end"),
    )
    model, x, y = model_and_data()
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    calls.clear()
    model, x, y = model_and_data()
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    losses = [round(v, 6) for v in history.history["loss"]]
    assert calls == ["begin", ("batch", 0), ("batch", 1), ("epoch", 0, losses[0]),
                     ("batch", 0), ("batch", 1), ("epoch", 1, losses[1]), "end"]  # fmt: skip
    with pytest.raises(TypeError, match="not a callback hook"):
        LambdaCallback(on_epoch_ending=print)
    with pytest.raises(TypeError, match="must be callable"):
        LambdaCallback(on_epoch_end=3)
