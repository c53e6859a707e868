"""BackupAndRestore: an interrupted, resumed fit ends with the weights of an uninterrupted one."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.callbacks import Callback
from hpcdist.callbacks.backup import BackupAndRestore, FitState
from hpcdist.checkpoint.preemption import PREEMPTION_EXIT_CODE
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import SparseCategoricalCrossentropy
from hpcdist.nn.training import Trainer


@pytest.fixture
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


@pytest.fixture
def seed(monkeypatch):
    """fit's shuffle seed, fixed so that two separate runs can be compared."""
    box = {"seed": 1234}
    monkeypatch.setattr(Trainer, "_shuffle_seed", lambda self: box["seed"])
    return box


def data(n: int = 44) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def model(weights=None) -> Sequential:
    m = Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(3)])
    m.compile(optimizer="adam", loss=SparseCategoricalCrossentropy(from_logits=True))
    if weights is not None:
        m.set_weights(weights)
    return m


class Interrupt(Callback):
    """Raises after ``after`` training batches (counted over all epochs): a crash."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.after:
            raise RuntimeError("interrupted")


class Signal(Callback):
    """Sends this process SIGUSR1 after ``after`` training batches: a preemption notice."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.after:
            os.kill(os.getpid(), signal.SIGUSR1)


class Batches(Callback):
    """Records (epoch, batch) of every trained batch."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch, self.seen = -1, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.epoch, batch))


FIT = {"batch_size": 8, "epochs": 4, "shuffle": True, "verbose": 0}  # 6 batches per epoch


def reference(init):
    m = model(init)
    m.fit(*data(), **FIT)
    return m.get_weights()


def assert_bitwise_equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "save_freq, crash_after, resumes_at",
    [
        ("epoch", 15, (2, 0)),  # crash in epoch 2 (batch 3): redo epoch 2 from its start
        (4, 15, (2, 0)),  # saved after batch 12 (end of epoch 1): epoch 2 from its start
        (5, 13, (1, 4)),  # saved after batch 10: epoch 1, batch 4 onwards
    ],
)
def test_a_resumed_fit_matches_an_uninterrupted_one(
    float64, seed, tmp_path, save_freq, crash_after, resumes_at
):
    init = model().get_weights()
    want = reference(init)
    backup = str(tmp_path / "backup")
    m = model(init)
    with pytest.raises(RuntimeError, match="interrupted"):
        m.fit(
            *data(), callbacks=[BackupAndRestore(backup, save_freq), Interrupt(crash_after)], **FIT
        )
    assert os.path.exists(os.path.join(backup, "checkpoint"))
    seed["seed"] = 999  # a new run draws a new seed: the backup's seed must win
    resumed = model()  # fresh weights: the backup's must win
    batches = Batches()
    resumed.fit(*data(), callbacks=[BackupAndRestore(backup, save_freq), batches], **FIT)
    assert batches.seen[0] == resumes_at
    assert len(batches.seen) == 24 - (resumes_at[0] * 6 + resumes_at[1])
    assert_bitwise_equal(resumed.get_weights(), want)
    assert not os.path.exists(backup)  # delete_checkpoint=True: removed after completion


def test_the_backup_is_kept_when_asked_and_other_files_never_deleted(float64, seed, tmp_path):
    kept = str(tmp_path / "kept")
    model().fit(*data(), callbacks=[BackupAndRestore(kept, delete_checkpoint=False)], **FIT)
    assert os.path.exists(os.path.join(kept, "checkpoint"))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("mine")
    model().fit(*data(), callbacks=[BackupAndRestore(str(shared), save_freq=2)], **FIT)
    assert os.listdir(shared) == ["notes.txt"]


def test_a_preemption_signal_saves_at_that_step_and_exits(float64, seed, tmp_path):
    init = model().get_weights()
    want = reference(init)
    backup = str(tmp_path / "backup")
    m = model(init)
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(SystemExit) as info:
        m.fit(*data(), callbacks=[BackupAndRestore(backup, save_freq=False), Signal(9)], **FIT)
    assert info.value.code == PREEMPTION_EXIT_CODE
    assert signal.getsignal(signal.SIGUSR1) == before  # fit put the previous handler back
    resumed = model()
    batches = Batches()
    resumed.fit(*data(), callbacks=[BackupAndRestore(backup, save_freq=False), batches], **FIT)
    assert batches.seen[0] == (1, 3)  # 9 batches were done: epoch 1, batch 3 onwards
    assert_bitwise_equal(resumed.get_weights(), want)


def test_steps_per_epoch_over_a_repeated_dataset(float64, tmp_path):
    x, y = data()
    ds = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(44, seed=5).batch(8).repeat()
    fit = {"epochs": 3, "steps_per_epoch": 4, "verbose": 0}
    init = model().get_weights()
    ref = model(init)
    ref.fit(ds, **fit)
    ds2 = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(44, seed=5).batch(8).repeat()
    backup = str(tmp_path / "backup")
    m = model(init)
    with pytest.raises(RuntimeError):
        m.fit(ds2, callbacks=[BackupAndRestore(backup, save_freq=3), Interrupt(8)], **fit)
    ds3 = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(44, seed=5).batch(8).repeat()
    resumed = model()
    batches = Batches()
    resumed.fit(ds3, callbacks=[BackupAndRestore(backup, save_freq=3), batches], **fit)
    assert batches.seen[0] == (1, 2)  # saved after 6 batches
    assert_bitwise_equal(resumed.get_weights(), ref.get_weights())


@pytest.mark.parametrize("bad", [0, -3, 1.5, "batch", True, None])
def test_bad_save_freq_is_refused(bad):
    with pytest.raises(ValueError, match="save_freq"):
        BackupAndRestore("/tmp/x", save_freq=bad)


def test_a_fit_state_from_elsewhere_is_refused():
    with pytest.raises(hd.errors.CheckpointError, match="fit state"):
        FitState()._restore_checkpoint_state({}, {"epoch": 1})


def test_two_backups_are_refused(float64, tmp_path):
    with pytest.raises(ValueError, match="one"):
        model().fit(
            *data(),
            callbacks=[
                BackupAndRestore(str(tmp_path / "a")),
                BackupAndRestore(str(tmp_path / "b")),
            ],
            **FIT,
        )
