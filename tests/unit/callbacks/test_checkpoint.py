"""ModelCheckpoint: file names, best-only logic, save_freq by batches, chief-only writes."""

from __future__ import annotations

import logging
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.callbacks import CallbackList, ModelCheckpoint


class FakeModel:
    """Stand-in with the Model API that ModelCheckpoint uses."""

    def __init__(self, chief: bool = True) -> None:
        self.stop_training = False
        self.distribute_strategy = SimpleNamespace(
            extended=SimpleNamespace(should_checkpoint=chief)
        )
        self.w = np.zeros(3)
        self.saved: list[str] = []

    def get_weights(self):
        return [self.w.copy()]

    def set_weights(self, weights):
        self.w = np.array(weights[0], copy=True)

    def save_weights(self, path):
        with open(path, "wb") as f:  # exact name, no .npz appended
            np.savez(f, w=self.w)
        self.saved.append(os.path.basename(path))


def fit(ckpt, model, logs_per_epoch, steps=1, batch_logs=None):
    """Drive the hooks as fit does; the weights are set to the epoch number."""
    cbs = CallbackList([ckpt], model=model)
    cbs.on_train_begin()
    for epoch, logs in enumerate(logs_per_epoch):
        cbs.on_epoch_begin(epoch)
        for batch in range(steps):
            model.w[:] = epoch * 100 + batch
            cbs.on_train_batch_end(batch, batch_logs or {"loss": 1.0})
        model.w[:] = epoch
        cbs.on_epoch_end(epoch, logs)
    cbs.on_train_end()


def test_saves_every_epoch_with_1_based_epoch_and_log_keys(tmp_path):
    model = FakeModel()
    path = str(tmp_path / "w-{epoch:02d}-{val_loss:.3f}.npz")
    logs = [{"loss": 1.0, "val_loss": v} for v in (0.5, 0.75, 0.125)]
    fit(ModelCheckpoint(path, monitor="val_loss"), model, logs)
    assert sorted(os.listdir(tmp_path)) == ["w-01-0.500.npz", "w-02-0.750.npz", "w-03-0.125.npz"]
    for e, name in enumerate(sorted(os.listdir(tmp_path))):
        np.testing.assert_array_equal(np.load(tmp_path / name)["w"], np.full(3, e))


def test_creates_missing_directories(tmp_path):
    model = FakeModel()
    fit(ModelCheckpoint(str(tmp_path / "a" / "b" / "w.npz")), model, [{"val_loss": 1.0}])
    assert (tmp_path / "a" / "b" / "w.npz").exists()


def test_unknown_key_in_filepath_is_a_clear_error(tmp_path):
    ckpt = ModelCheckpoint(str(tmp_path / "w-{val_acc:.2f}.npz"))
    with pytest.raises(KeyError, match="val_acc.*available: epoch, loss"):
        fit(ckpt, FakeModel(), [{"loss": 1.0}])


def reference_best_epochs(values, mode, threshold=None):
    """Epochs (0-based) where the value strictly beats every earlier value and the threshold."""
    best = threshold if threshold is not None else (math.inf if mode == "min" else -math.inf)
    out = []
    for e, v in enumerate(values):
        if (v < best) if mode == "min" else (v > best):
            best = v
            out.append(e)
    return out, best


@pytest.mark.parametrize(
    ("monitor", "mode", "values", "expected"),
    [
        ("val_loss", "auto", [0.5, 0.6, 0.4, 0.4, 0.45, 0.1], [1, 3, 6]),
        ("val_accuracy", "auto", [0.5, 0.6, 0.4, 0.6, 0.7], [1, 2, 5]),
        ("loss", "max", [1.0, 2.0, 0.5], [1, 2]),
        ("val_auc", "min", [0.9, 0.8, 0.85], [1, 2]),
    ],
)
def test_save_best_only_min_and_max(tmp_path, monitor, mode, values, expected):
    model = FakeModel()
    ckpt = ModelCheckpoint(
        str(tmp_path / "w-{epoch}.npz"), monitor=monitor, mode=mode, save_best_only=True
    )
    fit(ckpt, model, [{monitor: v} for v in values])
    assert model.saved == [f"w-{e}.npz" for e in expected]
    ref_epochs, ref_best = reference_best_epochs(values, ckpt.mode)
    assert [e + 1 for e in ref_epochs] == expected and ckpt.best == ref_best


@settings(deadline=None, max_examples=40)
@given(
    values=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=12),
    mode=st.sampled_from(["min", "max"]),
    threshold=st.one_of(st.none(), st.floats(-5, 5)),
)
def test_save_best_only_matches_reference(tmp_path_factory, values, mode, threshold):
    model = FakeModel()
    root = tmp_path_factory.mktemp("ckpt")
    ckpt = ModelCheckpoint(
        str(root / "w-{epoch}.npz"),
        monitor="m",
        mode=mode,
        save_best_only=True,
        initial_value_threshold=threshold,
    )
    fit(ckpt, model, [{"m": v} for v in values])
    ref_epochs, ref_best = reference_best_epochs(values, mode, threshold)
    assert model.saved == [f"w-{e + 1}.npz" for e in ref_epochs]
    assert ckpt.best == ref_best
    for e in ref_epochs:  # the file holds the weights of that epoch
        np.testing.assert_array_equal(np.load(root / f"w-{e + 1}.npz")["w"], np.full(3, e))


def test_initial_value_threshold(tmp_path):
    model = FakeModel()
    ckpt = ModelCheckpoint(
        str(tmp_path / "w-{epoch}.npz"), save_best_only=True, initial_value_threshold=0.3
    )
    fit(ckpt, model, [{"val_loss": v} for v in (0.5, 0.4, 0.2, 0.3)])
    assert model.saved == ["w-3.npz"] and ckpt.best == 0.2


def test_save_best_only_without_the_monitor_warns_and_saves_nothing(tmp_path, caplog):
    model = FakeModel()
    ckpt = ModelCheckpoint(str(tmp_path / "w.npz"), save_best_only=True)
    with caplog.at_level(logging.WARNING, logger="hpcdist.callbacks"):
        fit(ckpt, model, [{"loss": 1.0}, {"loss": 0.5}])
    assert model.saved == [] and ckpt.best == math.inf
    assert "'val_loss'" in caplog.text and "skipping" in caplog.text


def test_save_freq_counts_batches_across_epochs(tmp_path):
    model = FakeModel()
    ckpt = ModelCheckpoint(str(tmp_path / "w-{epoch}-{batch}.npz"), save_freq=3)
    fit(ckpt, model, [{"val_loss": 1.0}] * 3, steps=5)
    # reference: a global batch counter g = 1, 2, ...; save when g % 3 == 0
    expected = []
    g = 0
    for epoch in range(3):
        for batch in range(5):
            g += 1
            if g % 3 == 0:
                expected.append((epoch, batch))
    assert model.saved == [f"w-{e + 1}-{b + 1}.npz" for e, b in expected]
    e, b = expected[0]
    np.testing.assert_array_equal(np.load(tmp_path / "w-1-3.npz")["w"], np.full(3, e * 100 + b))


def test_save_freq_with_save_best_only_uses_batch_logs(tmp_path):
    model = FakeModel()
    ckpt = ModelCheckpoint(
        str(tmp_path / "w-{epoch}-{batch}.npz"), monitor="loss", save_best_only=True, save_freq=2
    )
    cbs = CallbackList([ckpt], model=model)
    cbs.on_train_begin()
    cbs.on_epoch_begin(0)
    for b, loss in enumerate([5.0, 4.0, 3.0, 6.0, 1.0, 2.0]):
        cbs.on_train_batch_end(b, {"loss": loss})
    cbs.on_epoch_end(0, {"loss": 1.0})
    assert model.saved == ["w-1-2.npz", "w-1-6.npz"] and ckpt.best == 2.0


def test_non_chief_writes_nothing_but_tracks_the_same_best(tmp_path):
    values = [0.5, 0.4, 0.6, 0.1, 0.2]
    chief, other = FakeModel(True), FakeModel(False)
    c_dir, o_dir = tmp_path / "c", tmp_path / "o"
    c = ModelCheckpoint(str(c_dir / "w-{epoch}.npz"), save_best_only=True)
    o = ModelCheckpoint(str(o_dir / "w-{epoch}.npz"), save_best_only=True)
    fit(c, chief, [{"val_loss": v} for v in values])
    fit(o, other, [{"val_loss": v} for v in values])
    assert c.best == o.best == 0.1
    assert chief.saved == ["w-1.npz", "w-2.npz", "w-4.npz"]
    assert other.saved == [] and not o_dir.exists()
    o2 = ModelCheckpoint(str(o_dir / "w-{epoch}.npz"), save_freq=1)
    fit(o2, other, [{"val_loss": 1.0}], steps=3)
    assert other.saved == [] and not o_dir.exists()


def test_verbose_messages_on_chief_only(tmp_path, capsys):
    values = [{"val_loss": 0.5}, {"val_loss": 0.7}]
    fit(
        ModelCheckpoint(str(tmp_path / "w.npz"), save_best_only=True, verbose=1),
        FakeModel(),
        values,
    )
    out = capsys.readouterr().out
    assert "Epoch 00001: val_loss improved from inf to 0.50000, saving model to" in out
    assert "Epoch 00002: val_loss did not improve from 0.50000" in out
    fit(
        ModelCheckpoint(str(tmp_path / "w.npz"), save_best_only=True, verbose=1),
        FakeModel(chief=False),
        values,
    )
    assert capsys.readouterr().out == ""


def test_save_weights_only_false_is_a_clear_error():
    with pytest.raises(ValueError, match="only weights.*save_weights_only=True"):
        ModelCheckpoint("w.npz", save_weights_only=False)


@pytest.mark.parametrize("freq", ["batch", 0, -2, 1.5, True])
def test_bad_save_freq(freq):
    with pytest.raises(ValueError, match="'epoch' or a positive integer"):
        ModelCheckpoint("w.npz", save_freq=freq)


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        ModelCheckpoint("w.npz", mode="best")


def test_pathlike_filepath_and_config(tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "w.npz", monitor="val_accuracy")
    assert ckpt.filepath == str(tmp_path / "w.npz")
    cfg = ckpt.get_config()
    assert cfg["mode"] == "max" and cfg["save_weights_only"] is True
