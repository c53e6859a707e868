"""CSVLogger file contents, append mode and chief-only writes."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest

from hpcdist.callbacks import CallbackList, CSVLogger


class FakeModel:
    def __init__(self, chief: bool = True) -> None:
        self.stop_training = False
        self.distribute_strategy = SimpleNamespace(
            extended=SimpleNamespace(should_checkpoint=chief)
        )


def epoch_logs(e: int) -> dict:
    return {"loss": 1.0 / (e + 1), "val_loss": 2.0 / (e + 1), "accuracy": 0.25 * e}


def run(path, epochs, first=0, chief=True, **kw):
    logger = CSVLogger(path, **kw)
    cbs = CallbackList([logger], model=FakeModel(chief))
    cbs.on_train_begin()
    for e in range(first, first + epochs):
        cbs.on_epoch_begin(e)
        cbs.on_epoch_end(e, epoch_logs(e))
    cbs.on_train_end()
    return logger


def read(path, sep=","):
    with open(path, newline="") as f:
        return list(csv.reader(f, delimiter=sep))


def test_header_epoch_first_then_sorted_keys_and_one_row_per_epoch(tmp_path):
    path = tmp_path / "log.csv"
    run(path, 3)
    rows = read(path)
    assert rows[0] == ["epoch", "accuracy", "loss", "val_loss"]
    assert len(rows) == 4
    for e, row in enumerate(rows[1:]):
        ref = epoch_logs(e)
        assert int(row[0]) == e
        assert [float(v) for v in row[1:]] == [ref["accuracy"], ref["loss"], ref["val_loss"]]


def test_append_keeps_one_header_and_overwrite_replaces(tmp_path):
    path = tmp_path / "log.csv"
    run(path, 2)
    run(path, 2, first=2, append=True)
    rows = read(path)
    assert rows[0][0] == "epoch" and sum(r[0] == "epoch" for r in rows) == 1
    assert [int(r[0]) for r in rows[1:]] == [0, 1, 2, 3]
    run(path, 1)  # append=False: overwrite
    assert [r[0] for r in read(path)] == ["epoch", "0"]


def test_append_to_a_new_or_empty_file_writes_the_header(tmp_path):
    new = tmp_path / "sub" / "new.csv"
    run(new, 1, append=True)
    assert read(new)[0][0] == "epoch"
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    run(empty, 1, append=True)
    assert [r[0] for r in read(empty)] == ["epoch", "0"]


def test_rows_are_flushed_every_epoch(tmp_path):
    path = tmp_path / "log.csv"
    logger = CSVLogger(path)
    logger.set_model(FakeModel())
    logger.on_train_begin()
    logger.on_epoch_end(0, {"loss": 0.5})
    assert read(path) == [["epoch", "loss"], ["0", "0.5"]]  # before on_train_end
    logger.on_epoch_end(1, {"loss": 0.25})
    assert read(path)[-1] == ["1", "0.25"]
    logger.on_train_end()


def test_missing_keys_are_na_new_keys_ignored_sequences_and_numpy_values(tmp_path):
    path = tmp_path / "log.csv"
    logger = CSVLogger(path, separator=";")
    logger.set_model(FakeModel())
    logger.on_train_begin()
    logger.on_epoch_end(0, {"loss": np.float32(0.5), "lr": np.array(0.125), "w": [1, 2]})
    logger.on_epoch_end(1, {"loss": 0.25, "extra": 3.0})
    logger.on_train_end()
    assert read(path, sep=";") == [
        ["epoch", "loss", "lr", "w"],
        ["0", "0.5", "0.125", "[1, 2]"],
        ["1", "0.25", "NA", "NA"],
    ]


def test_non_chief_writes_nothing(tmp_path):
    path = tmp_path / "log.csv"
    run(path, 2, chief=False)
    run(path, 2, chief=False, append=True)
    assert not path.exists()


def test_invalid_separator():
    with pytest.raises(ValueError, match="one-character"):
        CSVLogger("x.csv", separator=", ")
