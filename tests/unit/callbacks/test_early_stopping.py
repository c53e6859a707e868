"""EarlyStopping: patience, min_delta, baseline, restore_best_weights, start_from_epoch."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.callbacks import CallbackList, EarlyStopping


class FakeModel:
    """Stand-in with the Model API that EarlyStopping uses."""

    def __init__(self, chief: bool = True) -> None:
        self.stop_training = False
        self.distribute_strategy = SimpleNamespace(
            extended=SimpleNamespace(should_checkpoint=chief)
        )
        self.w = [np.zeros(2), np.zeros(3)]
        self.set_calls = 0

    def get_weights(self):
        return [a.copy() for a in self.w]

    def set_weights(self, weights):
        self.w = [np.array(a, copy=True) for a in weights]
        self.set_calls += 1


def fit(es, values, model=None, key="val_loss", epochs=None):
    """Drive the hooks as fit does; weights are set to the epoch number. Returns epochs run."""
    model = model or FakeModel()
    cbs = CallbackList([es], model=model)
    cbs.on_train_begin()
    ran = 0
    for epoch, v in enumerate(values[: epochs or len(values)]):
        cbs.on_epoch_begin(epoch)
        for a in model.w:
            a[:] = epoch  # "training" changes the weights
        ran += 1
        cbs.on_epoch_end(epoch, {"loss": 1.0, key: v} if v is not None else {"loss": 1.0})
        if model.stop_training:
            break
    cbs.on_train_end()
    return ran, model


def reference_stop(values, patience, mode):
    """Epoch at which training stops (or None) for baseline=None, min_delta=0.

    Stop at the first epoch e > 0 that is no improvement while e - (last improving epoch)
    >= patience. An epoch improves when it strictly beats all earlier values.
    """
    best, last = None, 0
    for e, v in enumerate(values):
        better = best is None or (v < best if mode == "min" else v > best)
        if better:
            best, last = v, e
        elif e > 0 and e - last >= patience:
            return e, last
    return None, last


@settings(deadline=None, max_examples=60)
@given(
    values=st.lists(st.integers(0, 6).map(float), min_size=1, max_size=15),
    patience=st.integers(0, 4),
    mode=st.sampled_from(["min", "max"]),
)
def test_patience_matches_reference(values, patience, mode):
    es = EarlyStopping(monitor="m", patience=patience, mode=mode, restore_best_weights=True)
    ran, model = fit(es, values, key="m")
    stop, best_epoch = reference_stop(values, patience, mode)
    if stop is None:
        assert not model.stop_training and es.stopped_epoch == 0 and ran == len(values)
        assert model.set_calls == 0  # as tf.keras 2: no restore when not stopped early
    else:
        assert model.stop_training and es.stopped_epoch == stop and ran == stop + 1
        assert model.set_calls == 1
        for a in model.w:  # restored to the weights of the best epoch
            np.testing.assert_array_equal(a, best_epoch)
    assert es.best_epoch == best_epoch
    assert es.best == (min if mode == "min" else max)(values[:ran])


def test_patience_examples():
    es = EarlyStopping(monitor="loss", patience=0)
    assert fit(es, [1.0, 0.9, 0.95, 0.5], key="loss")[0] == 3 and es.stopped_epoch == 2
    es = EarlyStopping(monitor="loss", patience=2)
    assert fit(es, [1.0, 0.9, 0.95, 0.94, 0.1], key="loss")[0] == 4 and es.stopped_epoch == 3
    es = EarlyStopping(patience=3)
    assert fit(es, [1.0, 0.9, 0.8, 0.7])[0] == 4 and es.stopped_epoch == 0


def test_min_delta_sign_follows_the_mode():
    # min mode: 0.95 is only 0.05 below 1.0: not an improvement with min_delta=0.1
    es = EarlyStopping(monitor="val_loss", min_delta=0.1, patience=1)
    assert es.min_delta == -0.1
    fit(es, [1.0, 0.95, 0.5])
    assert es.stopped_epoch == 1 and es.best == 1.0
    es = EarlyStopping(monitor="val_loss", min_delta=-0.1, patience=1)  # sign is ignored
    fit(es, [1.0, 0.85, 0.8])
    assert es.stopped_epoch == 2 and es.best == 0.85
    # max mode (auto from the name): gains must exceed 0.1
    es = EarlyStopping(monitor="val_accuracy", min_delta=0.1, patience=1)
    assert es.min_delta == 0.1
    fit(es, [0.5, 0.55, 0.9], key="val_accuracy")
    assert es.stopped_epoch == 1 and es.best == 0.5
    es = EarlyStopping(monitor="val_accuracy", min_delta=0.1, patience=1)
    fit(es, [0.5, 0.65, 0.8, 0.85], key="val_accuracy")
    assert es.stopped_epoch == 3 and es.best == 0.8


def test_baseline():
    # no epoch beats the baseline: training runs for `patience` epochs (Keras docs)
    es = EarlyStopping(monitor="val_loss", patience=2, baseline=0.5, restore_best_weights=True)
    ran, model = fit(es, [0.8, 0.9, 0.85, 0.1])
    assert es.stopped_epoch == 1 and ran == 2 and es.best == 0.8 and es.best_epoch == 0
    for a in model.w:
        np.testing.assert_array_equal(a, 0)
    # improvements that do not beat the baseline do not reset the wait counter
    es = EarlyStopping(monitor="val_loss", patience=2, baseline=0.5)
    fit(es, [0.8, 0.7, 0.75])
    assert es.stopped_epoch == 2 and es.wait == 3
    # beating the baseline resets it
    es = EarlyStopping(monitor="val_loss", patience=2, baseline=0.5)
    fit(es, [0.8, 0.4, 0.45, 0.42, 0.46])
    assert es.stopped_epoch == 3 and es.best == 0.4
    # max mode baseline
    es = EarlyStopping(monitor="val_accuracy", patience=1, baseline=0.9)
    fit(es, [0.5, 0.6, 0.55, 0.95], key="val_accuracy")
    assert es.stopped_epoch == 2 and es.best == 0.6
    # as Keras: an epoch that improves on the best value never stops training, even when
    # the wait counter (not reset below the baseline) has passed the patience
    es = EarlyStopping(monitor="val_accuracy", patience=1, baseline=0.9)
    ran, _ = fit(es, [0.5, 0.6, 0.7], key="val_accuracy")
    assert ran == 3 and es.stopped_epoch == 0 and es.wait == 3


def test_restore_best_weights_on_every_rank_and_same_decision():
    values = [0.5, 0.3, 0.4, 0.35, 0.6]
    results = []
    for chief in (True, False):
        es = EarlyStopping(patience=2, restore_best_weights=True)
        ran, model = fit(es, values, model=FakeModel(chief))
        results.append((es.stopped_epoch, es.best, es.best_epoch, ran, model.set_calls))
        for a in model.w:
            np.testing.assert_array_equal(a, 1)  # epoch 1 had the best val_loss
    assert results[0] == results[1] == (3, 0.3, 1, 4, 1)


def test_restore_weights_of_first_epoch_when_nothing_improves():
    es = EarlyStopping(patience=1, baseline=0.1, restore_best_weights=True)
    _, model = fit(es, [0.5, 0.6])
    assert es.stopped_epoch == 1
    for a in model.w:
        np.testing.assert_array_equal(a, 0)


def test_no_restore_without_the_flag():
    es = EarlyStopping(patience=0)
    _, model = fit(es, [0.5, 0.6])
    assert es.stopped_epoch == 1 and model.set_calls == 0
    for a in model.w:
        np.testing.assert_array_equal(a, 1)


def test_start_from_epoch():
    values = [0.1, 0.9, 0.8, 0.85, 0.7]
    es = EarlyStopping(patience=1)
    fit(es, values)
    assert es.stopped_epoch == 1
    es = EarlyStopping(patience=1, start_from_epoch=1)
    fit(es, values)
    assert es.stopped_epoch == 3 and es.best == 0.8 and es.best_epoch == 2


def test_missing_monitor_warns_and_never_stops(caplog):
    es = EarlyStopping(monitor="val_loss", patience=0)
    with caplog.at_level(logging.WARNING, logger="hpcdist.callbacks"):
        ran, model = fit(es, [None] * 4)
    assert ran == 4 and not model.stop_training and es.stopped_epoch == 0
    assert "'val_loss'" in caplog.text and "loss" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hpcdist.callbacks"):
        fit(EarlyStopping(), [None], model=FakeModel(chief=False))
    assert caplog.text == ""  # non-chief workers stay quiet


def test_reuse_resets_state():
    es = EarlyStopping(patience=0)
    fit(es, [0.5, 0.6])
    assert es.stopped_epoch == 1
    ran, _ = fit(es, [0.9, 0.8, 0.7])
    assert ran == 3 and es.stopped_epoch == 0 and es.best == 0.7


def test_verbose_messages(capsys):
    fit(EarlyStopping(patience=1, verbose=1, restore_best_weights=True), [0.5, 0.3, 0.4, 0.5])
    out = capsys.readouterr().out
    assert "Restoring model weights from the end of the best epoch: 2." in out
    assert "Epoch 3: early stopping" in out
    fit(
        EarlyStopping(patience=1, verbose=1, restore_best_weights=True),
        [0.5, 0.3, 0.4],
        model=FakeModel(chief=False),
    )
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"patience": -1}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"start_from_epoch": -1}, "start_from_epoch"),
        ({"mode": "up"}, "mode"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EarlyStopping(**kwargs)
