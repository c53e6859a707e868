"""CheckpointManager: rotation, the state file, preserved checkpoints, falling back past damage."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint
from hpcdist.errors import CheckpointCorruptError


def names(paths):
    return [os.path.basename(p) for p in paths]


def on_disk(directory):
    return sorted(p for p in os.listdir(directory) if p != "checkpoint")


def test_max_to_keep_rotation_and_state_file(tmp_path):
    v = hd.Variable(0.0)
    manager = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    for step in range(1, 5):
        v.assign(float(step))
        assert names([manager.save()]) == [f"ckpt-{step}"]
    assert names(manager.checkpoints) == ["ckpt-3", "ckpt-4"]
    assert on_disk(tmp_path) == [
        "ckpt-3.data.npz",
        "ckpt-3.index.json",
        "ckpt-4.data.npz",
        "ckpt-4.index.json",
    ]
    state = json.loads((tmp_path / "checkpoint").read_text())
    assert state["model_checkpoint_path"] == "ckpt-4"
    assert state["all_model_checkpoint_paths"] == ["ckpt-3", "ckpt-4"]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-4")

    # a new manager (a restarted job) picks the state up and keeps rotating
    again = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=2)
    assert again.checkpoints == manager.checkpoints
    v.assign(-1.0)
    assert again.restore_or_initialize() == str(tmp_path / "ckpt-4")
    assert float(v) == 4.0 and again.checkpoint.save_counter == 4
    assert names([again.save()]) == ["ckpt-5"]
    assert names(again.checkpoints) == ["ckpt-4", "ckpt-5"]


def test_checkpoint_number_and_none_keeps_everything(tmp_path):
    manager = CheckpointManager(Checkpoint(v=hd.Variable(1.0)), str(tmp_path), max_to_keep=None)
    for n in (10, 20, 30):
        manager.save(checkpoint_number=n)
    assert names(manager.checkpoints) == ["ckpt-10", "ckpt-20", "ckpt-30"]
    assert manager.checkpoint.save_counter == 3  # incremented even with a number given
    manager.save(checkpoint_number=20)  # saving a number again moves it to the end
    assert names(manager.checkpoints) == ["ckpt-10", "ckpt-30", "ckpt-20"]


def test_keep_checkpoint_every_n_hours_preserves_outside_the_list(tmp_path, monkeypatch):
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    manager = CheckpointManager(
        Checkpoint(v=hd.Variable(1.0)),
        str(tmp_path),
        max_to_keep=1,
        keep_checkpoint_every_n_hours=1.0,
    )
    for minutes in (10, 40, 80, 90, 130, 200):
        clock[0] = 1_000_000.0 + 60 * minutes
        manager.save()
    # rotated out: ckpt-1 (10 min, < 1 h after the start: deleted), ckpt-2 (40 min: deleted),
    # ckpt-3 (80 min >= 1 h after the start: preserved), ckpt-4 (90: deleted),
    # ckpt-5 (130: only 50 min after ckpt-3: deleted); ckpt-6 is managed
    assert names(manager.checkpoints) == ["ckpt-6"]
    assert on_disk(tmp_path) == [
        "ckpt-3.data.npz",
        "ckpt-3.index.json",
        "ckpt-6.data.npz",
        "ckpt-6.index.json",
    ]
    state = json.loads((tmp_path / "checkpoint").read_text())
    assert state["last_preserved_timestamp"] == 1_000_000.0 + 60 * 80


def test_restore_or_initialize_falls_back_past_a_damaged_newest_checkpoint(tmp_path):
    v = hd.Variable(np.zeros(4))
    manager = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=3)
    for step in range(1, 4):
        v.assign(np.full(4, float(step)))
        manager.save()
    data = tmp_path / "ckpt-3.data.npz"
    raw = bytearray(data.read_bytes())
    raw[-30] ^= 0xFF
    data.write_bytes(bytes(raw))
    v.assign(np.zeros(4))
    fresh = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=3)
    with pytest.warns(RuntimeWarning, match=r"ckpt-3' is damaged .*ckpt-3\.data\.npz"):
        restored = fresh.restore_or_initialize()
    assert restored == str(tmp_path / "ckpt-2")
    assert v.numpy().tolist() == [2.0] * 4
    assert fresh.checkpoint.save_counter == 2


def test_an_incomplete_newest_checkpoint_is_skipped(tmp_path):
    v = hd.Variable(1.0)
    manager = CheckpointManager(Checkpoint(v=v), str(tmp_path))
    manager.save()
    v.assign(2.0)
    manager.save()
    os.unlink(tmp_path / "ckpt-2.index.json")  # as if killed before the manifest was written
    v.assign(0.0)
    with pytest.warns(RuntimeWarning, match="ckpt-2' is damaged"):
        assert manager.restore_or_initialize() == str(tmp_path / "ckpt-1")
    assert float(v) == 1.0


def test_every_checkpoint_damaged_raises_and_does_not_initialize(tmp_path):
    manager = CheckpointManager(Checkpoint(v=hd.Variable(1.0)), str(tmp_path))
    manager.save(), manager.save()
    for n in (1, 2):
        (tmp_path / f"ckpt-{n}.data.npz").write_bytes(b"garbage")
    called = []
    manager._init_fn = lambda: called.append(1)
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointCorruptError, match="every"):
        manager.restore_or_initialize()
    assert called == []


def test_init_fn_without_checkpoints(tmp_path):
    v = hd.Variable(0.0)
    manager = CheckpointManager(
        Checkpoint(v=v), str(tmp_path / "new"), init_fn=lambda: v.assign(42.0)
    )
    assert manager.restore_or_initialize() is None
    assert float(v) == 42.0
    assert latest_checkpoint(str(tmp_path / "new")) is None


def test_checkpoint_interval_with_step_counter(tmp_path):
    step = hd.Variable(np.int64(0))
    manager = CheckpointManager(
        Checkpoint(step=step), str(tmp_path), step_counter=step, checkpoint_interval=5
    )
    saved = []
    for s in range(12):
        step.assign(s)
        saved.append(manager.save() is not None)
    assert [s for s, ok in enumerate(saved) if ok] == [0, 5, 10]
    assert manager.save() is None  # step 11 again: too early
    step.assign(11)
    assert manager.save(check_interval=False) is not None
    assert manager.save(check_interval=False) is None  # the same step twice: never
    with pytest.raises(ValueError, match="step_counter"):
        CheckpointManager(Checkpoint(step=step), str(tmp_path), checkpoint_interval=5)
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(Checkpoint(step=step), str(tmp_path), max_to_keep=0)


def test_a_damaged_state_file_is_replaced_by_a_directory_scan(tmp_path):
    manager = CheckpointManager(Checkpoint(v=hd.Variable(1.0)), str(tmp_path))
    for _ in range(3):
        manager.save()
    (tmp_path / "checkpoint").write_text("{not json")
    with pytest.raises(CheckpointCorruptError, match="state file"):
        latest_checkpoint(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="looking for checkpoints by name"):
        again = CheckpointManager(Checkpoint(v=hd.Variable(0.0)), str(tmp_path))
    assert names(again.checkpoints) == ["ckpt-1", "ckpt-2", "ckpt-3"]


def test_checkpoint_save_updates_the_state_file(tmp_path):
    ckpt = Checkpoint(v=hd.Variable(1.0))
    ckpt.save(str(tmp_path / "run"))
    path = ckpt.save(str(tmp_path / "run"))
    assert latest_checkpoint(str(tmp_path)) == path == str(tmp_path / "run-2")
