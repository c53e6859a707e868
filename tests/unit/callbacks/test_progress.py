"""ProgressBar output, captured from its stream."""

from __future__ import annotations

import io
import re
import sys
from types import SimpleNamespace

import pytest

from hpcdist.callbacks import CallbackList, ProgressBar
from hpcdist.callbacks.progress import format_value

TIME = r"\d+\.\ds"


class FakeModel:
    def __init__(self, chief: bool = True) -> None:
        self.stop_training = False
        self.distribute_strategy = SimpleNamespace(
            extended=SimpleNamespace(should_checkpoint=chief)
        )


def fit(cbs, epochs=2, steps=3, val=True):
    """Drive the hooks as fit does, validation run included (it must stay silent)."""
    cbs.on_train_begin()
    for epoch in range(epochs):
        cbs.on_epoch_begin(epoch)
        for batch in range(steps):
            cbs.on_train_batch_begin(batch)
            cbs.on_train_batch_end(batch, {"loss": 0.123456 + batch, "accuracy": 0.97})
        logs = {"loss": 0.5 - 0.1 * epoch, "accuracy": 0.97}
        if val:
            cbs.on_test_begin()
            cbs.on_test_batch_end(0, {"loss": 9.0})
            cbs.on_test_end({"loss": 9.0})
            logs |= {"val_loss": 1e-4, "val_accuracy": 1.0}
        cbs.on_epoch_end(epoch, logs)
    cbs.on_train_end()


def make(verbose, chief=True, use_tqdm=None, epochs=2, steps=3, loop_verbose=None, live=None):
    out = io.StringIO()
    bar = ProgressBar(verbose=verbose, stream=out, use_tqdm=use_tqdm, live=live)
    params = {"epochs": epochs, "steps": steps}
    if loop_verbose is not None:
        params["verbose"] = loop_verbose
    cbs = CallbackList([bar], model=FakeModel(chief), **params)
    return bar, cbs, out


def final_lines(text: str) -> list[str]:
    """The visible lines: for each line, what follows the last carriage return."""
    return [line.split("\r")[-1] for line in text.split("\n") if line.split("\r")[-1]]


EXPECTED = [
    rf"Epoch 1/2 - 3 steps - {TIME} - loss: 0\.5000 - accuracy: 0\.9700 - "
    r"val_loss: 1\.0000e-04 - val_accuracy: 1\.0000",
    rf"Epoch 2/2 - 3 steps - {TIME} - loss: 0\.4000 - accuracy: 0\.9700 - "
    r"val_loss: 1\.0000e-04 - val_accuracy: 1\.0000",
]


def test_verbose_2_prints_exactly_one_line_per_epoch():
    _, cbs, out = make(verbose=2)
    fit(cbs)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2
    for line, pattern in zip(lines, EXPECTED, strict=True):
        assert re.fullmatch(pattern, line), line


def test_verbose_0_prints_nothing():
    _, cbs, out = make(verbose=0)
    fit(cbs)
    assert out.getvalue() == ""


@pytest.mark.parametrize("verbose", [1, 2])
def test_non_chief_prints_nothing(verbose):
    bar, cbs, out = make(verbose=verbose, chief=False)
    fit(cbs)
    cbs.on_test_begin()
    cbs.on_test_end({"loss": 1.0})
    assert out.getvalue() == ""
    assert bar._bar is None


def test_verbose_1_with_tqdm_shows_bar_postfix_and_summary_lines():
    pytest.importorskip("tqdm")
    bar, cbs, out = make(verbose=1, live=True)
    cbs.on_train_begin()
    cbs.on_epoch_begin(0)
    cbs.on_train_batch_end(0, {"loss": 0.123456, "accuracy": 0.97, "outputs": [1, 2]})
    assert bar._bar is not None and bar._bar.total == 3 and bar._bar.n == 1
    bar._bar.refresh()  # tqdm throttles display; force one to read the postfix
    shown = out.getvalue().split("\r")[-1]
    assert "Epoch 1/2" in shown and "1/3" in shown
    assert "loss=0.1235, accuracy=0.97" in shown  # 4 significant digits
    assert "outputs" not in shown
    cbs.on_train_batch_end(2, {"loss": 0.2})  # jumps straight to 3 steps
    assert bar._bar.n == 3
    cbs.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.97, "val_loss": 1e-4, "val_accuracy": 1.0})
    assert bar._bar is None
    lines = final_lines(out.getvalue())
    assert re.fullmatch(EXPECTED[0], lines[-1]), lines[-1]
    cbs.on_train_end()


def test_verbose_1_with_tqdm_full_fit_ends_with_the_summary_lines():
    pytest.importorskip("tqdm")
    _, cbs, out = make(verbose=1, live=True)
    fit(cbs)
    lines = final_lines(out.getvalue())
    summary = [ln for ln in lines if ln.startswith("Epoch") and " - " in ln]
    assert len(summary) == 2
    for line, pattern in zip(summary, EXPECTED, strict=True):
        assert re.fullmatch(pattern, line), line
    assert out.getvalue().endswith("\n")


def test_unknown_steps_gives_a_bar_without_total():
    pytest.importorskip("tqdm")
    bar, cbs, out = make(verbose=1, steps=None, live=True)
    cbs.on_train_begin()
    cbs.on_epoch_begin(0)
    cbs.on_train_batch_end(0, {"loss": 1.0})
    assert bar._bar.total is None and bar._bar.n == 1
    cbs.on_epoch_end(0, {"loss": 1.0})
    assert re.fullmatch(
        rf"Epoch 1/2 - 1 step - {TIME} - loss: 1\.0000", final_lines(out.getvalue())[-1]
    )


@pytest.mark.parametrize("how", ["missing", "disabled"])
def test_without_tqdm_verbose_1_prints_plain_lines(monkeypatch, how):
    if how == "missing":
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
        bar, cbs, out = make(verbose=1)
    else:
        bar, cbs, out = make(verbose=1, use_tqdm=False)
    fit(cbs)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2
    for line, pattern in zip(lines, EXPECTED, strict=True):
        assert re.fullmatch(pattern, line), line


def test_verbose_follows_the_loop_params_and_default_stream_is_stdout(capsys):
    cbs = CallbackList(add_progbar=True, model=FakeModel(), verbose=2, epochs=2, steps=3)
    fit(cbs)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and re.fullmatch(EXPECTED[1], lines[1])
    cbs = CallbackList(add_progbar=True, model=FakeModel(), verbose=0, epochs=2, steps=3)
    fit(cbs)
    assert capsys.readouterr().out == ""
    # an explicit verbose wins over the loop's
    _, cbs, out = make(verbose=2, loop_verbose=0)
    fit(cbs, epochs=1)
    assert len(out.getvalue().splitlines()) == 1


def test_evaluate_and_predict_on_their_own_print_a_line():
    _, cbs, out = make(verbose=2, steps=2)
    cbs.on_test_begin()
    for b in range(2):
        cbs.on_test_batch_end(b, {"loss": 0.3})
    cbs.on_test_end({"loss": 0.25, "accuracy": 0.5})
    cbs.on_predict_begin()
    for b in range(2):
        cbs.on_predict_batch_end(b, {"outputs": [[1.0]]})
    cbs.on_predict_end()
    lines = out.getvalue().splitlines()
    assert re.fullmatch(
        rf"Evaluate - 2 steps - {TIME} - loss: 0\.2500 - accuracy: 0\.5000", lines[0]
    )
    assert re.fullmatch(rf"Predict - 2 steps - {TIME}", lines[1])
    assert len(lines) == 2


def test_epochs_unknown_and_elapsed_time():
    _, cbs, out = make(verbose=2, epochs=None)
    cbs.on_epoch_begin(4)
    cbs.on_epoch_end(4, {"loss": 2.0})
    assert re.fullmatch(rf"Epoch 5 - 0 steps - {TIME} - loss: 2\.0000\n", out.getvalue())


def test_number_formats():
    assert format_value(0.97) == "0.9700"
    assert format_value(123.456789) == "123.4568"
    assert format_value(0.001) == "1.0000e-03"
    assert format_value(-2e-5) == "-2.0000e-05"


def test_invalid_verbose():
    with pytest.raises(ValueError, match="expected 0"):
        ProgressBar(verbose=3)
